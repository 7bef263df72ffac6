"""Synaptic plasticity: rules on sparse projections, their state, and weight statistics.

- `PlasticityRule`: the abstract base of a rule (traces, their decay, the weight change at a
  presynaptic arrival and at a postsynaptic spike, bounds, dense reference); subclass it to
  write a rule, used as `nj.Projection(..., plasticity=MyRule(...))`.
- `PlasticState`: a plastic projection's state (weights, traces, delay line).
- `STDP`: pair-based spike-timing-dependent plasticity (additive or multiplicative bounds,
  all-to-all or nearest pairing), the first concrete rule; `STDPState` its state.
- `TripletSTDP`: triplet STDP of Pfister and Gerstner (2006), all-to-all or nearest-spike,
  with the paper's parameter sets (`TripletSTDP.preset`); `TripletSTDPState` its state.
- `VogelsSTDP`: inhibitory STDP with a target rate (Vogels et al. 2011).
- `RewardSTDP`: reward-modulated STDP with eligibility traces (Izhikevich 2007), gated by a
  neuromodulator given as an input of the network; `RewardSTDPState` its state.
- `PairKernel`: what a rule returns from `pair_kernel` to run in the compiled STDP kernel.
- `TraceKernel`: what a rule returns from `trace_kernel` to run in the compiled trace-rule
  kernel (`TripletSTDP`, `VogelsSTDP`).
- `weight_stats`: mean, standard deviation, extremes and histogram of a set of weights.
"""

from ._base import ModulatedRule as ModulatedRule
from ._base import PairKernel as PairKernel
from ._base import PlasticityRule as PlasticityRule
from ._base import PlasticState as PlasticState
from ._base import TraceKernel as TraceKernel
from ._reward import RewardSTDP as RewardSTDP
from ._reward import RewardSTDPState as RewardSTDPState
from ._stats import weight_stats as weight_stats
from ._stdp import STDP as STDP
from ._stdp import STDPState as STDPState
from ._triplet import TRIPLET_PRESETS as TRIPLET_PRESETS
from ._triplet import TripletSTDP as TripletSTDP
from ._triplet import TripletSTDPState as TripletSTDPState
from ._vogels import VogelsSTDP as VogelsSTDP
