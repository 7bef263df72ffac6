"""Synaptic plasticity: trace-based STDP on sparse projections, and weight statistics.

- `STDP`: pair-based spike-timing-dependent plasticity (additive or multiplicative bounds,
  all-to-all or nearest pairing), used as `nj.Projection(..., plasticity=nj.STDP(...))`.
- `weight_stats`: mean, standard deviation, extremes and histogram of a set of weights.
"""

from ._stats import weight_stats as weight_stats
from ._stdp import STDP as STDP
