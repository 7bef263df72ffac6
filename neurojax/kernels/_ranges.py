"""`out_of_range(x, lo, hi)`: whether an integer array holds a value outside `[lo, hi)`, as
one traced boolean: the run-start check of a network's postsynaptic indices and per-synapse
delays when the network reaches `nj.simulate` as traced arrays (passed into the caller's
`jit`), where the values cannot be read when the run is built.

On the CPU it is the compiled kernel `nj_out_of_range` (`ranges.cc`), which splits the array
over the kernels' threads; XLA's own reduction runs on one thread, and at the scale-0.1
microcircuit (30 million synapses) the check of a traced network cost 15-30 ms of every
call, serial, beside a network run spread over the threads. Elsewhere (and under
`nj.kernels.use("reference")`) it is the same test in `jax.numpy`.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._registry import Example, Kernel, call, register

__all__ = ["out_of_range", "OUT_OF_RANGE"]

_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")


def _reference(x: jax.Array, *, lo: int, hi: int) -> jax.Array:
    info = jnp.iinfo(x.dtype)
    below, above = lo > int(info.min), hi <= int(info.max)  # can a value cross each bound?
    if x.size == 0:
        return jnp.zeros((), bool)
    if lo >= hi:
        return jnp.ones((), bool)
    bad = jnp.zeros(x.shape, bool)
    # a bound outside the dtype's range cannot be crossed (and is not a value of the dtype)
    if below:
        bad = bad | (x < jnp.asarray(lo, x.dtype))
    if above:
        bad = bad | (x >= jnp.asarray(hi, x.dtype))
    return jnp.any(bad)


def _cpu(x: jax.Array, *, lo: int, hi: int) -> jax.Array:
    call_ = jax.ffi.ffi_call("nj_out_of_range", jax.ShapeDtypeStruct((), jnp.bool_))
    return call_(x, lo=np.int64(lo), hi=np.int64(hi))


def _supported(x: Any, *, lo: int, hi: int) -> bool:
    return str(x.dtype) in _DTYPES


def _examples():
    rng = np.random.default_rng(0)
    cases = (
        ("int32", 0, 7000, 300_000, None),
        ("int32", 0, 7000, 300_000, (123_456, 7000)),
        ("int32", 0, 7000, 300_000, (5, -1)),
        ("int8", 0, 200, 5_000, None),  # the upper bound beyond int8: only the lower counts
        ("int8", 1, 40, 5_000, (4_999, 0)),
        ("int16", -3, 3, 70_000, (69_999, 3)),
        ("uint8", 0, 256, 1_000, None),  # nothing can be outside
        ("uint16", 10, 10, 9, None),  # nothing is allowed
        ("uint32", 0, 2**32, 0, None),
    )
    for dtype, lo, hi, n, edit in cases:
        info = np.iinfo(dtype)
        a, b = max(lo, int(info.min)), min(hi, int(info.max) + 1)
        a, b = (a, b) if a < b else (int(info.min), int(info.max) + 1)
        x = rng.integers(a, b, n, endpoint=False)
        x = x.astype(dtype) if n else np.zeros(0, dtype)
        if edit is not None:
            x[edit[0]] = edit[1]
        label = f"{dtype}[{n}] in [{lo},{hi})"
        if edit is not None:
            label += f" x[{edit[0]}]={edit[1]}"
        yield Example((jnp.asarray(x),), {"lo": lo, "hi": hi}, label=label)


OUT_OF_RANGE = register(
    Kernel(
        "out_of_range",
        reference=_reference,
        cpu=_cpu,
        ffi_targets=(("nj_out_of_range", "NjOutOfRange"),),
        supports=_supported,
        examples=_examples,
        doc="Whether an integer array holds a value outside [lo, hi) (run-start checks).",
    )
)


def out_of_range(x: jax.Array, lo: int, hi: int) -> jax.Array:
    """A traced boolean: whether the integer array `x` holds a value outside `[lo, hi)`.

    Raises `TypeError` when `x` is not an integer array (the check reads indices and delays).
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"out_of_range: x must be an integer array, got dtype {x.dtype}")
    return call(OUT_OF_RANGE, x, lo=int(lo), hi=int(hi))
