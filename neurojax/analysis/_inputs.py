"""Validation and conversion of the rasters, time steps and bin sizes given to `nj.analysis`.

Every check runs before any statistic is computed, so that a bad argument fails at once
with a message naming the function, the argument, the value received and what is allowed.
"""

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._simulate import Recording
from .._validation import check_dt, check_positive_int

__all__ = ["RASTER_SHAPE", "as_raster", "rasters", "rows_per_bin", "bin_counts", "finish", "label"]

RASTER_SHAPE = "(t, *batch, n)"


def _fmt(x: float) -> str:
    return f"{x:g}"


def as_raster(
    owner: str, name: str, x: Any, *, min_ndim: int = 2, max_ndim: int | None = None
) -> np.ndarray:
    """`x` as a NumPy raster of spikes or spike counts, time-major, checked.

    Accepted element types: bool, integers >= 0, and floats holding whole numbers >= 0 (the
    0.0/1.0 outputs of `simulate(..., record=nj.Record(spikes="float"))`). The array is not
    copied when it is already a NumPy array.
    """
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"{owner}: {name} is a traced value; nj.analysis runs on the host with NumPy "
            "after a simulation: call it outside jit/vmap/grad (for a differentiable rate "
            "inside a loss use nj.training.firing_rates)"
        )
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"{owner}: {name} must be an array of spikes, got {x!r}")
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(
            f"{owner}: {name} must hold spikes as bool, integer counts or 0/1 floats, got "
            f"dtype {a.dtype}"
        )
    if a.ndim < min_ndim or (max_ndim is not None and a.ndim > max_ndim):
        if max_ndim == min_ndim == 2:
            want, hint = "(t, n) (2 dimensions)", "; select one trial of a batch, e.g. spikes[:, 0]"
        elif max_ndim is None:
            want = f"{RASTER_SHAPE} (at least {min_ndim} dimensions)"
            hint = (
                "; a single neuron's train of shape (t,) is spikes[:, None]" if a.ndim == 1 else ""
            )
        else:
            want, hint = f"with {min_ndim} to {max_ndim} dimensions", ""
        raise ValueError(
            f"{owner}: {name} must be a time-major raster of shape {want}, got shape "
            f"{a.shape}{hint}"
        )
    if a.shape[0] == 0:
        raise ValueError(f"{owner}: {name} must have at least one time step, got shape {a.shape}")
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise ValueError(f"{owner}: {name} must hold spike counts >= 0, got a minimum of {a.min()}")
    if a.dtype.kind == "f" and a.size:
        bad = ~np.isfinite(a) | (a < 0) | (a != np.round(a))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{owner}: {name} must hold spikes as 0/1 or whole spike counts >= 0, got "
                f"{a[where].item()!r} at index {where}"
            )
    return a


def rasters(
    owner: str,
    spikes: Any,
    dt: Any,
    record_every: Any,
    *,
    min_ndim: int = 2,
    max_ndim: int | None = None,
) -> tuple[dict[Any, np.ndarray], float, bool]:
    """Check `dt`, `record_every` and every raster; return `(rasters, row_ms, is_dict)`.

    A single raster is returned as `{None: raster}`. A `Recording` gives its `spikes`, after
    checking that `dt * record_every` is the spacing of its time axis.
    """
    dt = check_dt(owner, dt)
    record_every = check_positive_int(owner, "record_every", record_every)
    row_ms = dt * record_every
    if isinstance(spikes, Recording):
        t = np.asarray(spikes.t, np.float64)
        if t.ndim == 1 and t.size:
            spacing = float(t[1] - t[0]) if t.size > 1 else float(t[0])
            if not math.isclose(spacing, row_ms, rel_tol=1e-6):
                raise ValueError(
                    f"{owner}: the recording's rows are {_fmt(spacing)} ms apart but dt * "
                    f"record_every = {_fmt(dt)} * {record_every} = {_fmt(row_ms)} ms; pass the "
                    "simulation's dt and the record_every given to simulate"
                )
        spikes = spikes.spikes
    if isinstance(spikes, Mapping):
        if not spikes:
            raise ValueError(f"{owner}: spikes is an empty dict; give at least one population")
        out = {
            k: as_raster(owner, f"spikes[{k!r}]", v, min_ndim=min_ndim, max_ndim=max_ndim)
            for k, v in spikes.items()
        }
        return out, row_ms, True
    return (
        {None: as_raster(owner, "spikes", spikes, min_ndim=min_ndim, max_ndim=max_ndim)},
        (row_ms),
        False,
    )


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def rows_per_bin(
    owner: str,
    name: str,
    bin_ms: Any,
    row_ms: float,
    n_rows: int,
    *,
    min_bins: int = 1,
    label: str = "",
) -> int:
    """How many raster rows make one bin of `bin_ms` [ms]; `None` means one row per bin.

    A bin must be a whole multiple of the row duration `row_ms` and must divide the
    duration `n_rows * row_ms` into at least `min_bins` bins; a partial bin at the end is an
    error rather than silently dropped.
    """
    duration = n_rows * row_ms
    allowed_rows = [d for d in _divisors(n_rows) if n_rows // d >= min_bins]

    def allowed(value: float | None) -> str:
        if not allowed_rows:
            return (
                f"no bin size gives {min_bins} bins: the raster{label} has only {n_rows} "
                f"row(s) of {_fmt(row_ms)} ms"
            )
        text = (
            f"allowed: whole multiples of the row duration {_fmt(row_ms)} ms (dt * "
            f"record_every) that divide the duration {_fmt(duration)} ms"
        )
        if min_bins > 1:
            text += f" into at least {min_bins} bins"
        if value is not None:
            lo = [d for d in allowed_rows if d * row_ms <= value]
            hi = [d for d in allowed_rows if d * row_ms >= value]
            near = sorted({d * row_ms for d in lo[-1:] + hi[:1]})
            text += ", nearest " + " and ".join(f"{_fmt(v)} ms" for v in near)
        return text

    if bin_ms is None:
        m = 1
    else:
        if isinstance(bin_ms, bool) or not isinstance(
            bin_ms, (int, float, np.integer, np.floating)
        ):
            if isinstance(bin_ms, (np.ndarray, jax.Array)) and np.ndim(bin_ms) == 0:
                bin_ms = float(bin_ms)
            else:
                raise TypeError(f"{owner}: {name} must be a number of ms, got {bin_ms!r}")
        value = float(bin_ms)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{owner}: {name} must be finite and > 0 ms, got {bin_ms!r}")
        m = round(value / row_ms)
        if m < 1 or not math.isclose(m * row_ms, value, rel_tol=1e-9, abs_tol=0.0):
            raise ValueError(
                f"{owner}: {name}={_fmt(value)} ms is not a whole multiple of the row duration "
                f"{_fmt(row_ms)} ms of the raster{label}; {allowed(value)}"
            )
        if m > n_rows:
            raise ValueError(
                f"{owner}: {name}={_fmt(value)} ms exceeds the duration {_fmt(duration)} ms of "
                f"the raster{label} ({n_rows} rows of {_fmt(row_ms)} ms); {allowed(value)}"
            )
        if n_rows % m:
            raise ValueError(
                f"{owner}: {name}={_fmt(value)} ms does not divide the duration "
                f"{_fmt(duration)} ms of the raster{label} ({n_rows} rows of {_fmt(row_ms)} "
                f"ms); {allowed(value)}"
            )
    if n_rows // m < min_bins:
        shown = _fmt(m * row_ms)
        raise ValueError(
            f"{owner}: {name}={shown} ms gives {n_rows // m} bin(s) over the duration "
            f"{_fmt(duration)} ms of the raster{label}, but at least {min_bins} are needed for "
            f"a variance over bins; {allowed(m * row_ms)}"
        )
    return m


def bin_counts(raster: np.ndarray, m: int) -> np.ndarray:
    """Spike counts summed over consecutive groups of `m` rows: `(t // m, *rest)`."""
    dtype = np.float64 if raster.dtype.kind == "f" else np.int64
    if m == 1:
        return raster.astype(dtype)
    return raster.reshape((raster.shape[0] // m, m) + raster.shape[1:]).sum(axis=1, dtype=dtype)


def finish(results: dict[Any, Any], is_dict: bool) -> Any:
    """The dict of per-population results, or the single result."""
    return results if is_dict else results[None]


def label(key: Any) -> str:
    """` 'E'` for a population key, empty for a single raster (used inside messages)."""
    return "" if key is None else f" spikes[{key!r}]"
