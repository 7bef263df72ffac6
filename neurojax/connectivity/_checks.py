"""Eager argument checks shared by the connectivity builders.

Builders run on the host, outside `jit`: every check here inspects concrete values and raises
`TypeError` (wrong kind of value) or `ValueError` (right kind, bad value) with a message that
names the builder, the argument, the rule and the value received.
"""

import math
from typing import Any

import jax
import numpy as np

from .._system import available_bytes
from .._validation import _fmt, as_float, check_key, fmt_list

__all__ = [
    "MAX_SIZE",
    "check_key",
    "check_optional_key",
    "check_size",
    "check_count",
    "check_probability",
    "host_reals",
    "check_flag",
    "check_real",
    "check_positive_real",
    "check_positions",
    "check_box",
    "check_same_population",
    "check_conn_entries",
    "checked_conn",
    "csr_problem",
    "check_finite_weights",
]

# Indices are int32; sizes stay below 2**30 so that the samplers' intermediate sums of two
# positions (unsigned 32-bit) can never overflow.
MAX_SIZE = 2**30


def check_optional_key(owner: str, key: Any) -> jax.Array | None:
    return None if key is None else check_key(owner, key, eager=True)


def _int(owner: str, name: str, value: Any, rule: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {name} must be {rule}, got {value!r}")
    return int(value)


def check_size(owner: str, name: str, value: Any) -> int:
    """A population size: a positive Python or NumPy int, at most `MAX_SIZE`."""
    n = _int(owner, name, value, "a positive int")
    if n <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {n}")
    if n > MAX_SIZE:
        raise ValueError(f"{owner}: {name} must be <= 2**30 (int32 indices), got {n}")
    return n


def check_count(owner: str, name: str, value: Any) -> int:
    """A non-negative int (degrees, caps)."""
    k = _int(owner, name, value, "a non-negative int")
    if k < 0:
        raise ValueError(f"{owner}: {name} must be a non-negative int, got {k}")
    return k


def check_flag(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)


def host_reals(owner: str, name: str, value: Any) -> np.ndarray:
    """Real numbers as float64 on the host (type rules of `as_float`, without its rounding)."""
    try:
        as_float(value)
    except TypeError as err:
        raise TypeError(f"{owner}: {name}: {err}") from None
    # Python floats keep their exact value here (as_float would round them to float32, and a
    # message would then show 0.10000000149011612 for 0.1).
    return np.asarray(value, dtype=np.float64)


def check_real(owner: str, name: str, value: Any) -> float:
    """A finite real scalar, returned as a Python float."""
    arr = host_reals(owner, name, value)
    if arr.ndim != 0:
        raise ValueError(f"{owner}: {name} must be a scalar, got an array of shape {arr.shape}")
    x = float(arr)
    if not math.isfinite(x):
        raise ValueError(f"{owner}: {name} must be finite, got {_fmt(arr)}")
    return x


def check_positive_real(owner: str, name: str, value: Any, unit: str = "") -> float:
    x = check_real(owner, name, value)
    if not x > 0:
        raise ValueError(f"{owner}: {name} must be > 0{(' ' + unit) if unit else ''}, got {x!r}")
    return x


def check_probability(owner: str, name: str, value: Any) -> float:
    """A probability: a real scalar in [0, 1]."""
    arr = host_reals(owner, name, value)
    if arr.ndim != 0:
        raise ValueError(f"{owner}: {name} must be a scalar, got an array of shape {arr.shape}")
    x = float(arr)
    if not (0.0 <= x <= 1.0):
        raise ValueError(f"{owner}: {name} must be in [0, 1], got {x!r}")
    return x


def check_positions(owner: str, name: str, value: Any) -> jax.Array:
    """Positions of a population: a finite real array of shape (n, d), n >= 1, d >= 1.

    Returned with the default float dtype.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{owner}: {name} is a traced value; connectivity builders run eagerly, outside jit"
        )
    try:
        pos = as_float(value)
    except TypeError as err:
        raise TypeError(f"{owner}: {name}: {err}") from None
    if pos.ndim != 2 or pos.shape[0] == 0 or pos.shape[1] == 0:
        raise ValueError(
            f"{owner}: {name} must have shape (n, d) with n >= 1 and d >= 1, got shape {pos.shape}"
        )
    if pos.shape[0] > MAX_SIZE:
        raise ValueError(f"{owner}: {name} has {pos.shape[0]} rows, more than 2**30")
    host = np.asarray(pos)
    if not np.all(np.isfinite(host)):
        raise ValueError(f"{owner}: {name} must be finite, got non-finite entries")
    return pos


def check_box(owner: str, name: str, value: Any, d: int) -> np.ndarray | None:
    """A periodic box: `None`, or one positive length per dimension (a scalar means all)."""
    if value is None:
        return None
    box = host_reals(owner, name, value)
    if box.ndim == 0:
        box = np.full(d, float(box))
    if box.shape != (d,):
        raise ValueError(
            f"{owner}: {name} must be a scalar or have one length per dimension (shape ({d},)),"
            f" got shape {box.shape}"
        )
    if not np.all(np.isfinite(box)) or not np.all(box > 0):
        raise ValueError(f"{owner}: {name} lengths must be finite and > 0, got {_fmt(box)}")
    return box


def check_same_population(owner: str, n_pre: int, n_post: int) -> None:
    """`allow_self=False` only makes sense when pre and post are one population."""
    if n_pre != n_post:
        raise ValueError(
            f"{owner}: allow_self=False requires n_pre == n_post (one population), got"
            f" n_pre={n_pre} and n_post={n_post}"
        )


# Bytes a builder holds per synapse at its peak: the BCOO's two int32 indices and float32
# weight (12), plus the int64 column draws and row counts it builds them from.
_BYTES_PER_SYNAPSE = 24


def check_synapse_memory(owner: str, expected: float, how: str) -> None:
    """Refuse, before any sampling, a connectivity whose expected number of synapses cannot
    fit in the memory available (Linux `MemAvailable`; no check where it is unknown)."""
    need = expected * _BYTES_PER_SYNAPSE
    available = available_bytes(on_host=True)
    if available is not None and need > available:
        raise ValueError(
            f"{owner}: {how} = {expected:.4g} synapses expected, about {need / 1e9:.3g} GB "
            f"while building ({_BYTES_PER_SYNAPSE} bytes each), more than the "
            f"{available / 1e9:.3g} GB of memory available"
        )


# ----------------------------------------------------------------------------- stored synapses


def checked_conn(owner: str, conn: Any) -> Any:
    """`conn` (a 2-D BCOO) without JAX's padding entries, after `check_conn_entries`.

    JAX marks unused entries of a BCOO (after slicing, `sum_duplicates`, ...) with the index
    `(n_pre, n_post)` and a zero value; those carry no synapse and are removed. Any other
    index outside the shape is refused."""
    idx = np.asarray(conn.indices)
    data = np.asarray(conn.data)
    pad = None
    if idx.ndim == 2 and idx.shape[1:] == (2,) and idx.shape[0] and not _inside(idx, conn.shape):
        # padding lies outside the shape: looked for only when some index is
        pad = (idx == np.asarray(conn.shape)).all(axis=1) & (data == 0)
    if pad is not None and pad.any():
        from jax.experimental import sparse

        keep = np.flatnonzero(~pad)
        conn = sparse.BCOO((conn.data[keep], conn.indices[keep]), shape=conn.shape)
    check_conn_entries(owner, tuple(conn.shape), conn.indices, conn.data)
    return conn


def _inside(idx: np.ndarray, shape) -> bool:
    """Whether every row of the `(nnz, 2)` indices lies inside `shape` (four reductions, no
    temporary array)."""
    return all(
        int(idx[:, axis].min()) >= 0 and int(idx[:, axis].max()) < int(shape[axis])
        for axis in (0, 1)
    )


def check_conn_entries(owner: str, shape: tuple[int, int], indices: Any, data: Any) -> None:
    """Every synapse of a BCOO `(n_pre, n_post)` inside the shape, and every weight finite.

    A layout would otherwise drop an out-of-range entry (JAX's sparse and scatter operations
    do) or wrap a negative one, and compute with NaN weights: a silently wrong network.
    """
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != 2:
        raise ValueError(f"{owner}: conn.indices must have shape (nnz, 2), got {idx.shape}")
    if idx.shape[0] and not _inside(idx, shape):
        for axis, name, n in ((0, "presynaptic", shape[0]), (1, "postsynaptic", shape[1])):
            col = idx[:, axis]
            bad = (col < 0) | (col >= n)
            if bad.any():
                raise ValueError(
                    f"{owner}: conn has {int(bad.sum())} synapse(s) whose {name} index is "
                    f"outside [0, {n}) for shape {tuple(shape)}, e.g. {fmt_list(col[bad])} "
                    f"(first at entry {int(np.argmax(bad))}); indices must lie inside the shape"
                )
    w = np.asarray(data)
    if w.dtype.kind == "c":
        raise TypeError(f"{owner}: conn weights must be real, got dtype {w.dtype}")
    check_finite_weights(owner, "conn", "weight(s)", w)


def check_finite_weights(owner: str, name: str, field: str, w: np.ndarray) -> None:
    """Refuse NaN or infinite weights in the host array `w`, naming `name` and `field`."""
    # NaN propagates to the minimum and an infinity is the minimum or the maximum: two
    # reductions without a temporary, the detailed search only when one is not finite
    if w.dtype.kind == "f" and w.size and not (np.isfinite(w.min()) and np.isfinite(w.max())):
        bad = ~np.isfinite(w)
        raise ValueError(
            f"{owner}: {name} has {int(bad.sum())} non-finite {field} (NaN or inf), e.g. "
            f"{fmt_list(w[bad])} (first at entry {int(np.argmax(bad))}); weights must be finite"
        )


def csr_problem(indptr: np.ndarray, n_rows: int, nnz: int) -> str | None:
    """What is wrong with the compressed-row pointer `indptr` of `n_rows` rows over `nnz`
    synapses (None when nothing is)."""
    if indptr.shape != (n_rows + 1,):
        return f"has shape {indptr.shape}, expected ({n_rows + 1},)"
    if indptr.size and indptr[0] != 0:
        return f"starts at {int(indptr[0])}, expected 0"
    steps = np.diff(indptr.astype(np.int64))
    if (steps < 0).any():
        return f"decreases at row {int(np.argmax(steps < 0))}"
    if indptr.size and indptr[-1] != nnz:
        return f"ends at {int(indptr[-1])}, but there are {nnz} synapses"
    return None
