"""Spike-train statistics of recorded rasters: rates, ISI variability, Fano factor,
synchrony and peri-stimulus time histograms.

Conventions shared by every function of this module:

- **Rasters** are time-major, shape `(t, *batch, n)` as `nj.simulate` records them: bool
  spikes, or spike counts per row (integers, or floats holding whole numbers). A
  `Recording` may be passed in place of its `spikes`; a dict `{population: raster}` gives a
  dict of results, one per population.
- **Time.** `dt` [ms] is the simulation step and `record_every` the value given to
  `simulate` (default 1): one row of the raster lasts `dt * record_every` ms, and with
  `record_every > 1` it holds the spike counts of that window, so that a count of 2 is two
  spikes. Row `i` covers `[i, i + 1) * dt * record_every` ms; a spike is dated at the end of
  its row, `(i + 1) * dt * record_every` ms, like `Recording.t`.
- **Bins** (`bin_ms`, `window_ms`) are whole multiples of the row duration that divide the
  duration of the raster; anything else is an error that lists the nearest allowed sizes
  (a partial last bin is never dropped silently).
- Computation is on the host, with NumPy in float64, after the simulation; results are
  NumPy arrays. Inside a loss, use the differentiable `nj.training.firing_rates`.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from jaxtyping import ArrayLike, Bool, Float, Int

from .._simulate import Recording
from ._inputs import RASTER_SHAPE, bin_counts, finish, label, rasters, rows_per_bin

__all__ = [
    "BinnedRate",
    "CVResult",
    "firing_rates",
    "time_binned_rates",
    "population_rate",
    "isi",
    "cv_isi",
    "fano_factor",
    "synchrony",
    "psth",
]

# A raster, a dict of rasters by population, or a Recording (see the module docstring).
_Spikes = ArrayLike | Mapping[str, ArrayLike] | Recording


class BinnedRate(NamedTuple):
    """A rate in time bins.

    Attributes:
        rate: firing rate [Hz] in each bin, time first: `(n_bins, ...)`.
        edges: bin edges [ms], `(n_bins + 1,)`, from 0 to the duration of the raster.
        centres: bin centres [ms], `(n_bins,)`.
    """

    rate: Float[np.ndarray, "n_bins ..."]
    edges: Float[np.ndarray, " n_bins_plus_1"]
    centres: Float[np.ndarray, " n_bins"]


class CVResult(NamedTuple):
    """Coefficient of variation of inter-spike intervals, per neuron.

    Attributes:
        cv: `std(ISI) / mean(ISI)` (population standard deviation, `ddof=0`), shape
            `(*batch, n)`; NaN where the neuron did not qualify.
        qualified: `(*batch, n)` bool, True where the neuron fired at least `min_spikes`
            spikes, so that `cv` is defined there.
        n_spikes: `(*batch, n)` spike count of each neuron.
    """

    cv: Float[np.ndarray, "*batch n"]
    qualified: Bool[np.ndarray, "*batch n"]
    n_spikes: Int[np.ndarray, "*batch n"]


def _binned(rate: np.ndarray, m: int, row_ms: float) -> BinnedRate:
    edges = np.arange(rate.shape[0] + 1, dtype=np.float64) * (m * row_ms)
    return BinnedRate(rate, edges, 0.5 * (edges[:-1] + edges[1:]))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """`num / den`, NaN where `den == 0` (without a division warning)."""
    num = np.asarray(num, np.float64)
    den = np.asarray(den, np.float64)
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def firing_rates(
    spikes: _Spikes, *, dt: float, record_every: int = 1
) -> Float[np.ndarray, "*batch n"] | dict[str, Float[np.ndarray, "*batch n"]]:
    """Mean firing rate of each neuron over the whole raster [Hz].

    `rate = (number of spikes) / (t * dt * record_every / 1000)`, counts included (a row
    holding 2 counts as two spikes).

    Args:
        spikes: raster `(t, *batch, n)` (bool or counts), a `Recording`, or a dict
            `{population: raster}`.
        dt: simulation step [ms].
        record_every: steps per raster row, as given to `simulate` (positive int).

    Returns:
        `(*batch, n)` rates [Hz] (a dict of them for a dict of populations).

    Example:
    ```python
    spikes = np.zeros((1000, 2), bool); spikes[::10, 0] = True   # 100 spikes in 100 ms
    nj.analysis.firing_rates(spikes, dt=0.1)                      # [1000., 0.]
    ```
    """
    data, row_ms, is_dict = rasters("firing_rates", spikes, dt, record_every)
    seconds = {k: r.shape[0] * row_ms / 1000.0 for k, r in data.items()}
    return finish(
        {k: r.sum(axis=0, dtype=np.float64) / seconds[k] for k, r in data.items()}, is_dict
    )


def time_binned_rates(
    spikes: _Spikes, *, dt: float, bin_ms: float | None = None, record_every: int = 1
) -> BinnedRate | dict[str, BinnedRate]:
    """Firing rate of each neuron in consecutive time bins [Hz].

    `rate[b, ..., i] = (spikes of neuron i in bin b) / (bin_ms / 1000)`.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        bin_ms: bin width [ms]: a whole multiple of `dt * record_every` that divides the
            duration; `None` (default) uses one row per bin.
        record_every: steps per raster row, as given to `simulate`.

    Returns:
        `BinnedRate(rate, edges, centres)` with `rate` of shape `(n_bins, *batch, n)` [Hz].

    Example:
    ```python
    r = nj.analysis.time_binned_rates(rec.spikes, dt=0.1, bin_ms=10.0)
    r.rate.shape, r.centres[:2]        # (n_bins, n), [5., 15.]
    ```
    """
    owner = "time_binned_rates"
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    ms = {
        k: rows_per_bin(owner, "bin_ms", bin_ms, row_ms, r.shape[0], label=label(k))
        for k, r in data.items()
    }
    out = {}
    for k, r in data.items():
        counts = bin_counts(r, ms[k]).astype(np.float64)
        out[k] = _binned(counts / (ms[k] * row_ms / 1000.0), ms[k], row_ms)
    return finish(out, is_dict)


def population_rate(
    spikes: _Spikes, *, dt: float, bin_ms: float | None = None, record_every: int = 1
) -> BinnedRate | dict[str, BinnedRate]:
    """Population firing rate in consecutive time bins: the mean over neurons [Hz].

    `rate[b, ...] = (spikes of all n neurons in bin b) / (n * bin_ms / 1000)`.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`
            (one population rate each).
        dt: simulation step [ms].
        bin_ms: bin width [ms]: a whole multiple of `dt * record_every` that divides the
            duration; `None` (default) uses one row per bin.
        record_every: steps per raster row, as given to `simulate`.

    Returns:
        `BinnedRate(rate, edges, centres)` with `rate` of shape `(n_bins, *batch)` [Hz].

    Example:
    ```python
    spikes = np.zeros((100, 4), bool); spikes[5, :2] = True  # 2 of 4 neurons in [0.5, 0.6) ms
    nj.analysis.population_rate(spikes, dt=0.1, bin_ms=1.0).rate  # [500., 0., ..., 0.]
    ```
    """
    owner = "population_rate"
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    ms = {
        k: rows_per_bin(owner, "bin_ms", bin_ms, row_ms, r.shape[0], label=label(k))
        for k, r in data.items()
    }
    out = {}
    for k, r in data.items():
        counts = bin_counts(r, ms[k]).astype(np.float64)
        n = r.shape[-1]
        rate = _ratio(counts.sum(axis=-1), np.float64(n * ms[k] * row_ms / 1000.0))
        out[k] = _binned(rate, ms[k], row_ms)
    return finish(out, is_dict)


def _check_single_spikes(owner: str, key: Any, r: np.ndarray) -> None:
    if r.dtype.kind != "b" and r.size and r.max() > 1:
        where = tuple(int(i) for i in np.argwhere(r > 1)[0])
        neuron = f"neuron {where[1]}" if len(where) == 2 else f"index {where[1:]} of (*batch, n)"
        raise ValueError(
            f"{owner}: spikes{label(key)} holds {r[where].item()!r} spikes in one row (row "
            f"{where[0]}, {neuron}); the times of spikes within a row are unknown, so their "
            "intervals are undefined. Record with record_every=1 (or a window short enough to "
            "hold at most one spike) for ISI statistics"
        )


def _intervals(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ISIs in rows, the flat neuron index of each, and each neuron's spike count."""
    flat = r.reshape(r.shape[0], -1)
    col, row = np.nonzero(flat.T)
    same = col[1:] == col[:-1]
    d_rows = (row[1:] - row[:-1])[same]
    d_col = col[1:][same]
    n_spikes = np.bincount(col, minlength=flat.shape[1])
    return d_rows, d_col, n_spikes


def _nest(items: list, shape: tuple[int, ...]) -> list:
    if len(shape) <= 1:
        return items
    step = int(np.prod(shape[1:]))
    return [_nest(items[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def isi(spikes: _Spikes, *, dt: float, record_every: int = 1, pad: float | None = None) -> Any:
    """Inter-spike intervals of each neuron [ms].

    The intervals between consecutive spikes of a neuron, `(row_{j+1} - row_j) * dt *
    record_every`. A neuron with fewer than 2 spikes has none.

    **Counts.** The times of several spikes inside one row are unknown, so a raster holding
    a count > 1 in some row (possible with `record_every > 1`) is rejected with a
    `ValueError` rather than inventing intervals (coincident spikes would add zero-length
    intervals and bias every ISI statistic). Counts of 0 and 1 are fine; the intervals are
    then known to a resolution of `dt * record_every`.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        record_every: steps per raster row, as given to `simulate`.
        pad: `None` (default) returns lists; a number returns one padded array instead.

    Returns:
        With `pad=None`, a list of `n` 1-D float arrays [ms] (nested lists of shape
        `(*batch, n)` for a batched raster). With a number, an array of shape
        `(*batch, n, max_intervals)` filled with `pad` after each neuron's intervals.

    Example:
    ```python
    spikes = np.zeros((100, 1), bool); spikes[[9, 29, 59], 0] = True
    nj.analysis.isi(spikes, dt=0.1)              # [array([2., 3.])]
    ```
    """
    owner = "isi"
    if pad is not None and (
        isinstance(pad, bool) or not isinstance(pad, (int, float, np.integer, np.floating))
    ):
        raise TypeError(f"{owner}: pad must be None or a number (e.g. np.nan), got {pad!r}")
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    for k, r in data.items():
        _check_single_spikes(owner, k, r)
    out = {}
    for k, r in data.items():
        d_rows, d_col, _ = _intervals(r)
        n_cols = int(np.prod(r.shape[1:]))
        n_int = np.bincount(d_col, minlength=n_cols)
        ms = d_rows.astype(np.float64) * row_ms
        if pad is None:
            out[k] = _nest(np.split(ms, np.cumsum(n_int)[:-1]), r.shape[1:])
        else:
            width = int(n_int.max()) if n_cols else 0
            padded = np.full((n_cols, width), float(pad))
            starts = np.concatenate([[0], np.cumsum(n_int)[:-1]])
            padded[d_col, np.arange(ms.size) - starts[d_col]] = ms
            out[k] = padded.reshape(r.shape[1:] + (width,))
    return finish(out, is_dict)


def cv_isi(
    spikes: _Spikes, *, dt: float, min_spikes: int = 3, record_every: int = 1
) -> CVResult | dict[str, CVResult]:
    """Coefficient of variation of each neuron's inter-spike intervals.

    `CV = std(ISI) / mean(ISI)` with the population standard deviation (`ddof=0`, the
    convention of Brian2 and Elephant): 0 for a perfectly regular train, 1 for a Poisson
    process (exponential intervals). Only neurons with at least `min_spikes` spikes
    (`min_spikes - 1` intervals) get a value; the others get NaN, and `qualified` says which
    neurons count, so that averaging `cv[qualified]` drops nothing silently. Rows with a
    count > 1 are rejected as in `isi`.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms] (the CV does not depend on it, but the raster is checked
            against a `Recording`'s time axis with it).
        min_spikes: spikes needed for a CV, an int >= 2 (default 3: at least 2 intervals).
        record_every: steps per raster row, as given to `simulate`.

    Returns:
        `CVResult(cv, qualified, n_spikes)`, each of shape `(*batch, n)`.

    Example:
    ```python
    res = nj.analysis.cv_isi(rec.spikes, dt=0.1)
    res.cv[res.qualified].mean(), res.qualified.sum()   # mean CV and how many neurons
    ```
    """
    owner = "cv_isi"
    if isinstance(min_spikes, bool) or not isinstance(min_spikes, (int, np.integer)):
        raise TypeError(f"{owner}: min_spikes must be an int >= 2, got {min_spikes!r}")
    if min_spikes < 2:
        raise ValueError(
            f"{owner}: min_spikes must be >= 2 (a CV needs at least one interval), got {min_spikes}"
        )
    data, _, is_dict = rasters(owner, spikes, dt, record_every)
    for k, r in data.items():
        _check_single_spikes(owner, k, r)
    out = {}
    for k, r in data.items():
        d_rows, d_col, n_spikes = _intervals(r)
        n_cols = n_spikes.size
        # In rows (integers): a regular train gives identical intervals, so its CV is exactly 0.
        d = d_rows.astype(np.float64)
        n_int = np.bincount(d_col, minlength=n_cols).astype(np.float64)
        mean = _ratio(np.bincount(d_col, weights=d, minlength=n_cols), n_int)
        dev = d - mean[d_col]
        var = _ratio(np.bincount(d_col, weights=dev * dev, minlength=n_cols), n_int)
        qualified = n_spikes >= min_spikes
        cv = np.where(qualified, _ratio(np.sqrt(np.where(qualified, var, 0.0)), mean), np.nan)
        shape = r.shape[1:]
        out[k] = CVResult(cv.reshape(shape), qualified.reshape(shape), n_spikes.reshape(shape))
    return finish(out, is_dict)


def fano_factor(
    spikes: _Spikes,
    *,
    dt: float,
    window_ms: float,
    record_every: int = 1,
    pooled: bool = False,
) -> Any:
    """Fano factor of spike counts in consecutive windows: `var(count) / mean(count)`.

    The raster is cut into windows of `window_ms`; the variance (`ddof=0`) and mean are
    taken over windows. 1 for a Poisson process at any window size; 0 for a regular train
    whose period divides `window_ms` (every window then holds the same count). With `W`
    windows the `ddof=0` estimate of a Poisson process averages `(W - 1) / W`.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        window_ms: counting window [ms]: a whole multiple of `dt * record_every` that
            divides the duration into at least 2 windows.
        record_every: steps per raster row, as given to `simulate`.
        pooled: `False` (default): one value per neuron; `True`: the Fano factor of the
            population count (all `n` neurons' spikes summed in each window), which
            correlations between neurons raise above the single-neuron values.

    Returns:
        `(*batch, n)` per neuron, or `(*batch,)` with `pooled=True`; NaN where the mean count
        is 0 (no spike at all).

    Example:
    ```python
    nj.analysis.fano_factor(rec.spikes, dt=0.1, window_ms=50.0)    # one value per neuron
    ```
    """
    owner = "fano_factor"
    if not isinstance(pooled, bool):
        raise TypeError(f"{owner}: pooled must be a bool, got {pooled!r}")
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    ms = {
        k: rows_per_bin(
            owner, "window_ms", window_ms, row_ms, r.shape[0], min_bins=2, label=label(k)
        )
        for k, r in data.items()
    }
    out = {}
    for k, r in data.items():
        counts = bin_counts(r, ms[k]).astype(np.float64)
        if pooled:
            counts = counts.sum(axis=-1)
        out[k] = _ratio(counts.var(axis=0), counts.mean(axis=0))[()]
    return finish(out, is_dict)


def synchrony(spikes: _Spikes, *, dt: float, bin_ms: float, record_every: int = 1) -> Any:
    """Golomb's synchrony measure `chi` of binned spike trains.

    With `x_i(b)` the spike count of neuron `i` in bin `b` and `X(b) = mean_i x_i(b)` the
    population average,

    `chi^2 = var_b(X) / mean_i(var_b(x_i))`,

    and `chi = sqrt(chi^2)` (variances over bins, `ddof=0`). `chi = 1` when all neurons
    have identical binned activity (full synchrony); for `N` independent neurons `chi^2`
    is about `1/N`, so `chi` scales as `1/sqrt(N)`. Golomb defines `chi` on any activity
    trace (often the membrane potential); on spike trains it depends on `bin_ms`, the time
    scale at which coincidences count.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        bin_ms: bin width [ms]: a whole multiple of `dt * record_every` that divides the
            duration into at least 2 bins.
        record_every: steps per raster row, as given to `simulate`.

    Returns:
        `chi` of shape `(*batch,)` (a NumPy scalar for a `(t, n)` raster); NaN when no neuron's
        count varies over bins (for example a silent population).

    Example:
    ```python
    nj.analysis.synchrony(rec.spikes, dt=0.1, bin_ms=2.0)
    ```

    References:
        Golomb D (2007) Neuronal synchrony measures. Scholarpedia 2(1):1347.
        doi:10.4249/scholarpedia.1347
    """
    owner = "synchrony"
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    ms = {
        k: rows_per_bin(owner, "bin_ms", bin_ms, row_ms, r.shape[0], min_bins=2, label=label(k))
        for k, r in data.items()
    }
    out = {}
    for k, r in data.items():
        x = bin_counts(r, ms[k]).astype(np.float64)
        var_population = x.mean(axis=-1).var(axis=0)
        var_single = x.var(axis=0).mean(axis=-1)
        out[k] = np.sqrt(_ratio(var_population, var_single))[()]
    return finish(out, is_dict)


def psth(
    spikes: _Spikes,
    *,
    dt: float,
    bin_ms: float,
    trial_axis: int = 1,
    record_every: int = 1,
) -> BinnedRate | dict[str, BinnedRate]:
    """Peri-stimulus time histogram: the rate in each time bin averaged over trials [Hz].

    Each trial's raster is aligned to the stimulus at time 0 (its first row).
    `rate[b, ..., i] = mean over trials of (spikes of neuron i in bin b) / (bin_ms / 1000)`.
    Average `rate` over its last axis for the PSTH of a whole population.

    Args:
        spikes: raster `(t, *batch, n)` with the trials on `trial_axis` (a batch of trials
            from a batched `simulate`), a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        bin_ms: bin width [ms]: a whole multiple of `dt * record_every` that divides the
            duration.
        trial_axis: the axis of the raster that holds the trials, one of the batch axes
            (not 0, time, nor the last, neurons); default 1.
        record_every: steps per raster row, as given to `simulate`.

    Returns:
        `BinnedRate(rate, edges, centres)` with `rate` of shape `(n_bins, *other, n)` [Hz],
        the trial axis averaged out.

    Example:
    ```python
    # 20 trials of 10 neurons: spikes of shape (t, 20, 10)
    p = nj.analysis.psth(spikes, dt=0.1, bin_ms=5.0)
    p.rate.mean(axis=-1)     # population PSTH [Hz], one value per 5 ms bin
    ```
    """
    owner = "psth"
    if isinstance(trial_axis, bool) or not isinstance(trial_axis, (int, np.integer)):
        raise TypeError(f"{owner}: trial_axis must be an int, got {trial_axis!r}")
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every)
    axes = {}
    for k, r in data.items():
        if r.ndim < 3:
            raise ValueError(
                f"{owner}: spikes{label(k)} must have a trial axis, shape (t, trials, n) or "
                f"{RASTER_SHAPE}, got shape {r.shape}; a single trial is spikes[:, None]"
            )
        axis = int(trial_axis) + (r.ndim if trial_axis < 0 else 0)
        if not 1 <= axis <= r.ndim - 2:
            raise ValueError(
                f"{owner}: trial_axis must be a batch axis of spikes{label(k)} of shape "
                f"{r.shape}: one of {list(range(1, r.ndim - 1))} (or "
                f"{list(range(1 - r.ndim, -1))}), not time (0) or neurons (last); got "
                f"{trial_axis}"
            )
        axes[k] = axis
    ms = {
        k: rows_per_bin(owner, "bin_ms", bin_ms, row_ms, r.shape[0], label=label(k))
        for k, r in data.items()
    }
    out = {}
    for k, r in data.items():
        counts = bin_counts(r, ms[k]).astype(np.float64)
        rate = counts.mean(axis=axes[k]) / (ms[k] * row_ms / 1000.0)
        out[k] = _binned(rate, ms[k], row_ms)
    return finish(out, is_dict)
