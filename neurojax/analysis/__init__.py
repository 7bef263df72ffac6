"""Analysis of recordings: spike-train statistics and matplotlib plots.

- Statistics of time-major rasters `(t, *batch, n)` (bool or counts, a `Recording`, or a
  dict of populations), computed on the host with NumPy: `firing_rates`,
  `time_binned_rates`, `population_rate`, `isi`, `cv_isi`, `fano_factor`, `synchrony`
  (Golomb's chi, over bins of `bin_ms`: the time scale at which coincidences count), `psth`;
  results `BinnedRate` and `CVResult`.
- Plots that return their matplotlib Axes and draw into `ax=` when given: `raster`,
  `voltage_traces`, `rate_histogram`, `weight_histogram`, `fi_curve`, `assembly_overlap`.
  Rasters and `voltage_traces` take a network recording's per-population dicts
  (`rec.spikes`, `rec.v`) as they are.
"""

from ._plots import assembly_overlap as assembly_overlap
from ._plots import fi_curve as fi_curve
from ._plots import raster as raster
from ._plots import rate_histogram as rate_histogram
from ._plots import voltage_traces as voltage_traces
from ._plots import weight_histogram as weight_histogram
from ._stats import BinnedRate as BinnedRate
from ._stats import CVResult as CVResult
from ._stats import cv_isi as cv_isi
from ._stats import fano_factor as fano_factor
from ._stats import firing_rates as firing_rates
from ._stats import isi as isi
from ._stats import population_rate as population_rate
from ._stats import psth as psth
from ._stats import synchrony as synchrony
from ._stats import time_binned_rates as time_binned_rates
