"""neurojax: JAX-native, purely functional, differentiable spiking-neural-network simulation.

The most used names are lifted here; the subpackages hold the rest:
`neurojax.neurons`, `neurojax.synapses`, `neurojax.connect` (sparse connectivity builders),
`neurojax.analysis` (rates, ISI statistics, synchrony, plots),
`neurojax.network` (projections, networks, spike sources), `neurojax.assembly` (assembly
calculus), `neurojax.training` (encoders, spiking layers, losses, optax loops), `neurojax.parallel`
(batched sweeps over devices), `neurojax.io` (checkpoints with `nj.save` / `nj.load`,
export of recordings), `neurojax.surrogate` and `neurojax.validation` (parameter conversion and
checks for writing a model).
"""

# Before anything imports jax.experimental.sparse: its SciPy-based solvers are loaded on
# first use, so `import neurojax` does not import SciPy (see _lazy_imports).
from . import _lazy_imports as _lazy_imports

# isort: split
from . import _threads as _threads
from . import analysis as analysis
from . import connectivity as connect  # noqa: F401  (SPEC name: nj.connect)
from . import io as io
from . import kernels as kernels
from . import models as models
from . import network as network
from . import neurons as neurons
from . import parallel as parallel
from . import plasticity as plasticity
from . import surrogate as surrogate
from . import synapses as synapses
from . import validation as validation
from ._compilation_cache import compilation_cache_dir as compilation_cache_dir
from ._compilation_cache import enable_compilation_cache as enable_compilation_cache
from ._options import EventPropGradient as EventPropGradient
from ._options import Execution as Execution
from ._options import Record as Record
from ._options import SurrogateGradient as SurrogateGradient
from ._simulate import Recording as Recording
from ._simulate import RunInfo as RunInfo
from ._simulate import SpikeTimes as SpikeTimes
from ._simulate import simulate as simulate
from ._threads import cpu_threads as cpu_threads
from ._threads import use_cpu_threads as use_cpu_threads
from .io import load as load
from .io import save as save
from .network import Network as Network
from .network import NetworkState as NetworkState
from .network import PoissonSource as PoissonSource
from .network import PoissonState as PoissonState
from .network import Projection as Projection
from .neurons import LIF as LIF
from .neurons import AdEx as AdEx
from .neurons import AdExState as AdExState
from .neurons import HHState as HHState
from .neurons import HodgkinHuxley as HodgkinHuxley
from .neurons import Izhikevich as Izhikevich
from .neurons import IzhikevichState as IzhikevichState
from .neurons import LIFState as LIFState
from .neurons import NeuronModel as NeuronModel
from .plasticity import STDP as STDP
from .plasticity import RewardSTDP as RewardSTDP
from .plasticity import TripletSTDP as TripletSTDP
from .plasticity import VogelsSTDP as VogelsSTDP
from .synapses import Alpha as Alpha
from .synapses import ConductanceOutput as ConductanceOutput
from .synapses import CurrentOutput as CurrentOutput
from .synapses import Delta as Delta
from .synapses import DualExponential as DualExponential
from .synapses import Exponential as Exponential
from .synapses import GapJunction as GapJunction
from .synapses import TsodyksMarkram as TsodyksMarkram

__version__ = "0.1.0"

# Imported on first use: a script that simulates a network needs neither the assembly calculus,
# nor the training loops (and optax), nor NIR, and importing them costs about 0.25 s.
_LAZY = ("assembly", "nir", "training")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'neurojax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# The kernel registry lists the kernels of the subpackages imported on first use too.
kernels._registry.add_provider(lambda: [__getattr__(name) for name in ("assembly", "training")])
