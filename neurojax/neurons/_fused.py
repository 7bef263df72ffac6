"""What the whole-run kernels of uncoupled populations share (`_lif_fused`, `_hh_fused`):
the `simulate` configurations they serve and the shape of the spike record they return.

Models reach them through `NeuronModel.fused_run`, which `simulate` calls with the
options of the run (`eligible`'s keyword arguments)."""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import kernels
from .._recording import count_dtype

__all__ = ["eligible", "spikes_struct", "scan_spikes"]


def eligible(
    fields: tuple[Any, ...],
    params: tuple[Any, ...],
    inputs: Any,
    *,
    kind: str,
    record: Any,
    spike_dtype: str | None,
    check: bool,
    checkpoint: bool,
    truncate_backprop: int | None,
    record_every: int = 1,
    recordable: tuple[str, ...] = (),
) -> bool:
    """Whether a fused run can serve this `simulate` call of a model whose state arrays are
    `fields` and whose parameters are `params`.

    It can when spikes are recorded (the bool raster, or counts with `record_every > 1`),
    with state fields only where `_records` allows (names in `recordable`, on a GPU), and
    none of `check`, `checkpoint`, `truncate_backprop` is asked for; the input is `None` or
    one constant float array (an integer or PyTree input goes through `input_current`'s
    cast, or its error, on the general path); the state arrays share one shape (not a scalar,
    not empty) and one dtype, float32 or float64; and every parameter and the input is an
    array of that dtype (mixed precision is left to the general path's promotions) that
    broadcasts to the state's shape.
    """
    del record_every  # every window length is served
    if spike_dtype != "bool" or kind not in ("none", "const"):
        return False
    if record is not None and not _records(record, recordable):
        return False
    if check or checkpoint or truncate_backprop is not None:
        return False
    v = fields[0]
    if not all(isinstance(x, jax.Array) for x in fields) or v.ndim == 0 or v.size == 0:
        return False
    dtype = v.dtype
    if dtype not in (jnp.float32, jnp.float64):
        return False
    if any(x.shape != v.shape or x.dtype != dtype for x in fields):
        return False
    if kind == "const":
        if not isinstance(inputs, jax.Array) or not jnp.issubdtype(inputs.dtype, jnp.floating):
            return False
        params += (inputs,)
    return all(
        isinstance(p, jax.Array) and p.dtype == dtype and _broadcasts(p.shape, v.shape)
        for p in params
    )


def _records(record: Any, recordable: tuple[str, ...]) -> bool:
    """Whether a fused run records the state fields `record`: names it can record, and only
    where its GPU kernel runs (a GPU backend, or `nj.kernels.interpret("gpu")`). The compiled
    CPU kernels record spikes only, so a CPU run that records fields keeps the general scan."""
    if not (isinstance(record, tuple) and record and set(record) <= set(recordable)):
        return False
    return jax.default_backend() in ("gpu", "cuda") or kernels.interpret_mode() == "gpu"


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return jnp.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def spikes_struct(n_rec: int, every: int, v: jax.Array) -> jax.ShapeDtypeStruct:
    """The recorded spikes of `n_rec` records of a population shaped like `v`: the bool
    raster (`every == 1`) or counts per window in `simulate`'s count dtype."""
    dtype = jnp.bool_ if every == 1 else count_dtype(every)
    return jax.ShapeDtypeStruct((n_rec, *v.shape), dtype)


def scan_spikes(step, carry: Any, n_rec: int, every: int, like: jax.Array) -> tuple[Any, jax.Array]:
    """Run `step(carry, None) -> (carry, spike)` for `n_rec * every` steps: the final carry and
    the record of `spikes_struct(n_rec, every, like)` (the bool raster, or counts per window of
    `every` steps), the record's time axis first. The pure-JAX references of the whole-run
    kernels share it."""
    if every == 1:
        return lax.scan(step, carry, None, length=n_rec)
    count_dtype = spikes_struct(n_rec, every, like).dtype

    def window(c, _):
        def inner(c_counts, _):
            c_, counts = c_counts
            c_, spike = step(c_, None)
            return (c_, counts + spike.astype(count_dtype)), None

        (c, counts), _ = lax.scan(
            inner, (c, jnp.zeros(like.shape, count_dtype)), None, length=every
        )
        return c, counts

    return lax.scan(window, carry, None, length=n_rec)
