"""Synaptic plasticity: rules on sparse projections, their state, and weight statistics.

- `PlasticityRule`: the abstract base of a rule (traces, their decay, the weight change at a
  presynaptic arrival and at a postsynaptic spike, bounds, dense reference); subclass it to
  write a rule, used as `nj.Projection(..., plasticity=MyRule(...))`.
- `PlasticState`: a plastic projection's state (weights, traces, delay line).
- `STDP`: pair-based spike-timing-dependent plasticity (additive or multiplicative bounds,
  all-to-all or nearest pairing), the first concrete rule; `STDPState` its state.
- `PairKernel`: what a rule returns from `pair_kernel` to run in the compiled STDP kernel.
- `weight_stats`: mean, standard deviation, extremes and histogram of a set of weights.
"""

from ._base import PairKernel as PairKernel
from ._base import PlasticityRule as PlasticityRule
from ._base import PlasticState as PlasticState
from ._stats import weight_stats as weight_stats
from ._stdp import STDP as STDP
from ._stdp import STDPState as STDPState
