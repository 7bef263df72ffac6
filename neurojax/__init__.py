"""neurojax: JAX-native, purely functional, differentiable spiking-neural-network simulation."""

from . import surrogate as surrogate
from .neurons import LIF as LIF
from .neurons import LIFState as LIFState
from .neurons import NeuronModel as NeuronModel

__version__ = "0.1.0"
from ._simulate import Recording as Recording
from ._simulate import simulate as simulate
from .neurons import Izhikevich as Izhikevich
from .neurons import IzhikevichState as IzhikevichState
from .neurons import AdEx as AdEx
from .neurons import AdExState as AdExState
from .neurons import HodgkinHuxley as HodgkinHuxley
from .neurons import HHState as HHState
from . import connectivity as connect
from . import synapses as synapses
from .synapses import Alpha as Alpha
from .synapses import ConductanceOutput as ConductanceOutput
from .synapses import CurrentOutput as CurrentOutput
from .synapses import Delta as Delta
from .synapses import DualExponential as DualExponential
from .synapses import Exponential as Exponential
from .synapses import GapJunction as GapJunction
