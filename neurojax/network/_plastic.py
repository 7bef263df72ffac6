"""Event-driven weight updates of plastic projections (STDP) over the CSR/CSC layouts.

Depression touches the fan-out of the presynaptic spikes that arrive this step (CSR rows),
potentiation the fan-in of the postsynaptic spikes (CSC columns, built with the projection),
so a step costs spikes x fan-out + spikes x fan-in, never the number of synapses.

The update is defined by `STDP.dense_update` (every synapse at once); the event path computes
the same values touching only synapses with an event, and `stdp_update` has a custom JVP that
differentiates the dense definition (one pass over the synapses, only under differentiation),
so gradients reach every parameter, weight and spike exactly as through the dense formula.
On CPU the event path runs in the compiled kernel of `_csr_kernel.cc` (weights and traces
updated in place, the same operations in the same order; the traces may differ in their last
bit where XLA fuses a decay and an increment into one multiply-add); the pure-JAX path serves
other platforms.
"""

import functools
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _kernel
from ._propagation import run_bucketed

__all__ = [
    "PlasticLayout",
    "STDPState",
    "stdp_update",
    "check_rule",
    "check_initial_weights",
    "plastic_init",
    "plastic_step",
    "plastic_weights",
]


class PlasticLayout(NamedTuple):
    """CSR rows and CSC columns of one projection (synapse ids index the CSR order)."""

    indptr: jax.Array  # (n_pre + 1,) int32
    indices: jax.Array  # (nnz,) int32: postsynaptic neuron of each synapse
    col_ptr: jax.Array  # (n_post + 1,) int32
    col_syn: jax.Array  # (nnz,) int32: synapse ids sorted by postsynaptic neuron
    col_pre: jax.Array  # (nnz,) int32: presynaptic neuron of col_syn


class STDPState(eqx.Module):
    """Plastic state of one projection.

    Attributes:
        weights: current weights, `(*batch, nnz)` in the projection's CSR order.
        x: presynaptic trace of the arrivals at the synapses, `(*batch, n_pre)`.
        y: postsynaptic trace, `(*batch, n_post)`.
        history: presynaptic spikes of the last `d` steps for a delay of `d` steps,
            `(*batch, d, n_pre)`, or None without delay.
    """

    weights: jax.Array
    x: jax.Array
    y: jax.Array
    history: jax.Array | None


def _rows(lay: PlasticLayout, n_pre: int) -> jax.Array:
    nnz = lay.indices.shape[0]
    counts = lay.indptr[1:] - lay.indptr[:-1]
    return jnp.repeat(jnp.arange(n_pre, dtype=jnp.int32), counts, total_repeat_length=nnz)


def _own_spikes(sizes, s_arr, s_post):
    """The projection's own arrivals `(*batch, n_pre)` and postsynaptic spikes `(*batch, n_post)`
    out of the (possibly wider, group-wide) vectors handed to `stdp_update`."""
    n_pre, n_post, _, _, arr_offset, post_offset = sizes
    return (
        s_arr[..., arr_offset : arr_offset + n_pre],
        s_post[..., post_offset : post_offset + n_post],
    )


def _event_update(sizes, rule, lay, w, x_old, y_old, s_arr, s_post, decay_x, decay_y):
    n_pre, n_post, max_out, max_in = sizes[:4]
    s_arr, s_post = _own_spikes(sizes, s_arr, s_post)
    nnz = w.shape[-1]
    x = x_old * decay_x
    y = y_old * decay_y
    w_flat = w.reshape(-1)
    oob = w_flat.shape[0]
    y_flat = y.reshape(-1)
    a_flat = s_arr.reshape(-1)
    x_new = rule.trace(x, s_arr)
    x_flat = x_new.reshape(-1)
    p_flat = s_post.reshape(-1)

    def window(ptr, local, valid, width):
        # Positions ptr[r] .. ptr[r + 1] - 1 of each spiking row r, padded to `width`.
        start = ptr[local]
        count = jnp.where(valid, ptr[local + 1] - start, 0)
        k = jnp.arange(width, dtype=jnp.int32)
        ok = k[None, :] < count[:, None]
        return jnp.where(ok, start[:, None] + k[None, :], 0), ok

    def depress(idx, valid, wf):
        trial, i = idx // n_pre, idx % n_pre
        syn, ok = window(lay.indptr, i, valid, max_out)
        at = trial[:, None] * nnz + syn
        wv = wf[at]
        post = trial[:, None] * n_post + lay.indices[syn]
        s = a_flat[idx][:, None]
        new = rule.clip(wv - rule.a_minus * rule.f_minus(wv) * y_flat[post] * s)
        return wf.at[jnp.where(ok, at, oob)].set(new, mode="drop")

    def potentiate(idx, valid, wf):
        trial, j = idx // n_post, idx % n_post
        pos, ok = window(lay.col_ptr, j, valid, max_in)
        at = trial[:, None] * nnz + lay.col_syn[pos]
        wv = wf[at]
        pre = trial[:, None] * n_pre + lay.col_pre[pos]
        s = p_flat[idx][:, None]
        new = rule.clip(wv + rule.a_plus * rule.f_plus(wv) * x_flat[pre] * s)
        return wf.at[jnp.where(ok, at, oob)].set(new, mode="drop")

    # A loop over buffers of 64 spikes keeps the weights in place (see run_bucketed).
    if max_out:
        w_flat = run_bucketed((a_flat > 0).astype(jnp.float32), depress, w_flat, loop_size=64)
    if max_in:
        w_flat = run_bucketed((p_flat > 0).astype(jnp.float32), potentiate, w_flat, loop_size=64)
    return w_flat.reshape(w.shape), x_new, rule.trace(y, s_post)


def _kernel_update(sizes, rule, lay, w, x_old, y_old, s_arr, s_post, decay_x, decay_y):
    """The same update through the compiled CPU kernel, arrays updated in place."""
    dtype = w.dtype
    params = jnp.stack(
        [rule.a_plus, rule.a_minus, rule.w_min, rule.w_max, decay_x, decay_y]
    ).astype(dtype)
    attrs = dict(
        n_pre=np.int64(sizes[0]),
        n_post=np.int64(sizes[1]),
        arr_stride=np.int64(s_arr.shape[-1]),
        arr_offset=np.int64(sizes[4]),
        post_stride=np.int64(s_post.shape[-1]),
        post_offset=np.int64(sizes[5]),
        multiplicative=np.int64(rule.mode == "multiplicative"),
        nearest=np.int64(rule.pairing == "nearest"),
    )

    def raw(*args):
        call = jax.ffi.ffi_call(
            _kernel.STDP_TARGET,
            tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in args[:3]),
            input_output_aliases={0: 0, 1: 1, 2: 2},
            vmap_method="sequential",
        )
        return call(*args, **attrs)

    # The kernel treats the leading dimensions of the weights, traces and spikes as trials.
    # Under vmap with shared rule parameters and layout, the vmapped axis becomes more
    # trials of one call; otherwise (a sweep over a_plus, say) one call per trial.
    @jax.custom_batching.custom_vmap
    def update(*args):
        return raw(*args)

    @update.def_vmap
    def _batched(axis_size, in_batched, *args):
        if any(in_batched[5:]):
            axes = [0 if b else None for b in in_batched]
            return jax.vmap(raw, in_axes=axes)(*args), (True, True, True)
        per_trial = [
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args[:5], in_batched[:5], strict=True)
        ]
        return raw(*per_trial, *args[5:]), (True, True, True)

    return update(
        w,
        x_old.astype(dtype),
        y_old.astype(dtype),
        s_arr.astype(dtype),
        s_post.astype(dtype),
        params,
        lay.indptr,
        lay.indices,
        lay.col_ptr,
        lay.col_syn,
        lay.col_pre,
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _update(sizes, rule, lay, w, x_old, y_old, s_arr, s_post, decay_x, decay_y):
    args = (rule, lay, w, x_old, y_old, s_arr, s_post, decay_x, decay_y)
    if _kernel.available():
        return jax.lax.platform_dependent(
            *args,
            cpu=functools.partial(_kernel_update, sizes),
            default=functools.partial(_event_update, sizes),
        )
    return _event_update(sizes, *args)


@_update.defjvp
def _update_jvp(sizes, primals, tangents):
    rule, lay, w, x_old, y_old, s_arr, s_post, decay_x, decay_y = primals
    d_rule, _, dw, dx, dy, ds_arr, ds_post, d_dx, d_dy = tangents
    out = _update(sizes, *primals)
    rows = _rows(lay, sizes[0])

    def dense(rule_, w_, x_, y_, sa_, sp_, ddx, ddy):
        sa_, sp_ = _own_spikes(sizes, sa_, sp_)
        x_ = x_ * ddx
        y_ = y_ * ddy
        w_new = rule_.dense_update(w_, x_, y_, sa_, sp_, rows, lay.indices)
        return w_new, rule_.trace(x_, sa_), rule_.trace(y_, sp_)

    _, t_out = jax.jvp(
        dense,
        (rule, w, x_old, y_old, s_arr, s_post, decay_x, decay_y),
        (d_rule, dw, dx, dy, ds_arr, ds_post, d_dx, d_dy),
    )
    return out, t_out


def stdp_update(
    rule,
    lay: PlasticLayout,
    sizes,
    w,
    x,
    y,
    s_arr,
    s_post,
    decay_x,
    decay_y,
    *,
    arr_offset: int = 0,
    post_offset: int = 0,
):
    """Weights and traces after one step: `(w, x, y)`.

    `x`, `y` are the traces of the previous step; they decay by `decay_x`, `decay_y` and
    take this step's arrivals `s_arr` and postsynaptic spikes `s_post`. `sizes` is the static
    `(n_pre, n_post, max_fan_out, max_fan_in)`.

    The spike vectors may be wider than the projection: the arrivals are
    `s_arr[..., arr_offset : arr_offset + n_pre]` and the postsynaptic spikes
    `s_post[..., post_offset : post_offset + n_post]`. A network hands over the spikes of the
    whole group of populations stepped together, which the compiled kernel reads in place
    (the same vector as the delivery kernel), so the group's spikes are computed once a step.
    """
    n_pre, n_post = int(sizes[0]), int(sizes[1])
    for name, off, n, vec in (
        ("arr_offset", arr_offset, n_pre, s_arr),
        ("post_offset", post_offset, n_post, s_post),
    ):
        if off < 0 or off + n > vec.shape[-1]:
            raise ValueError(
                f"stdp_update: {name}={off} with {n} neurons does not fit in spike vectors of "
                f"length {vec.shape[-1]}"
            )
    key = (*(int(v) for v in sizes), int(arr_offset), int(post_offset))
    return _update(key, rule, lay, w, x, y, s_arr, s_post, decay_x, decay_y)


# ---------------------------------------------------------------------------------------------
# What a network needs from a plastic projection. `Network` (and `Projection`'s constructor)
# call these and nothing else of this module, so the rules' execution can change here alone.


def check_rule(owner: str, plasticity: Any) -> None:
    """Raise `TypeError` unless `plasticity` is a rule a projection can execute."""
    from ..plasticity import STDP

    if plasticity is not None and not isinstance(plasticity, STDP):
        raise TypeError(f"{owner}: plasticity must be None or nj.STDP(...), got {plasticity!r}")


def check_initial_weights(owner: str, plasticity: Any, weights: jax.Array) -> None:
    """Raise `ValueError` when the initial weights lie outside the rule's bounds."""
    w = np.asarray(weights)
    lo, hi = float(plasticity.w_min), float(plasticity.w_max)
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(
            f"{owner}: initial weights must lie within the STDP bounds [{lo}, {hi}], got weights "
            f"in [{w.min()}, {w.max()}]"
        )


def plastic_init(proj: Any, batch: tuple[int, ...], delay_steps: int | None, dtype: Any) -> Any:
    """The initial plastic state of projection `proj` for a batch of trials."""
    d = delay_steps or 0
    return STDPState(
        weights=jnp.broadcast_to(proj.weights.astype(dtype), batch + proj.weights.shape),
        x=jnp.zeros(batch + (proj.n_pre,), dtype),
        y=jnp.zeros(batch + (proj.n_post,), dtype),
        history=jnp.zeros(batch + (d, proj.n_pre), dtype) if d else None,
    )


def plastic_weights(ps: Any) -> jax.Array:
    """The current weights `(*batch, nnz)` (CSR order) held by a plastic state."""
    return ps.weights


def plastic_step(
    proj: Any, ps: Any, s_pre_group, pre_offset: int, s_post_group, post_offset: int, k, dt: float
) -> Any:
    """The plastic state after one step.

    `s_pre_group` and `s_post_group` are the spike vectors of the groups of populations that
    hold `proj.pre` and `proj.post`, which hold them at `pre_offset` and `post_offset`; `k` is
    the step index (for the delay history) and `dt` the step in ms.
    """
    rule = proj.plasticity
    s_group_pre = s_pre_group.astype(ps.x.dtype)
    s_post = s_post_group.astype(ps.y.dtype)
    history = ps.history
    if history is None:
        arrivals, arr_offset = s_group_pre, pre_offset
    else:  # spikes emitted d steps ago reach the synapses at the end of this step
        s_pre = s_group_pre[..., pre_offset : pre_offset + proj.n_pre]
        d = history.shape[-2]
        slot = k % d
        arrivals = jax.lax.dynamic_index_in_dim(history, slot, history.ndim - 2, keepdims=False)
        arr_offset = 0
        history = jax.lax.dynamic_update_index_in_dim(history, s_pre, slot, history.ndim - 2)
    decay_x, decay_y = rule.decays(dt)
    lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
    sizes = (proj.n_pre, proj.n_post, proj.max_fan_out, proj.max_fan_in)
    w, x, y = stdp_update(
        rule,
        lay,
        sizes,
        ps.weights,
        ps.x,
        ps.y,
        arrivals,
        s_post,
        decay_x.astype(ps.x.dtype),
        decay_y.astype(ps.y.dtype),
        arr_offset=arr_offset,
        post_offset=post_offset,
    )
    return STDPState(weights=w, x=x, y=y, history=history)
