"""Event-driven execution of plastic projections over the CSR/CSC layouts, for any
`nj.plasticity.PlasticityRule`.

On a presynaptic arrival the rule's `on_pre` runs over the fan-out of the arriving neurons
(CSR rows); on a postsynaptic spike its `on_post` runs over the fan-in of the spiking neurons
(CSC columns, built with the projection), so a step costs spikes x fan-out + spikes x fan-in,
never the number of synapses. The rule's traces decay by its `trace_decays` and take the
step's spikes through its `update_pre_traces` / `update_post_traces`, in the order documented
in `neurojax.plasticity._base`.

The update is defined by the rule's `dense_update` (every synapse at once); the event path
computes the same values touching only synapses with an event, and the derivative of
`plastic_update` is that of the dense definition (one pass over the synapses, only under
differentiation), so gradients reach every parameter, weight and spike exactly as through the
dense formula. The update is the kernel registry's entry `plastic_update`
(`neurojax.kernels`): its reference is the generic event path; a rule that is pair STDP (its
`pair_kernel()` is not None: `nj.STDP`, both modes and pairings) runs on CPU in the compiled
kernel of `neurojax/kernels/csr_deliver.cc` (FFI target `nj_stdp_update`; weights and
traces updated in place, the same operations in the same order; the traces may differ in
their last bit where XLA fuses a decay and an increment into one multiply-add); every other
rule, and every rule on other platforms, runs on the pure-JAX event path.

The execution lives here, beside the layouts it walks and the spike compaction it shares with
delivery (`run_capped`); the rules in `neurojax.plasticity` know nothing of the network, so
a new rule is written in `plasticity/` alone.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels import Example, Fold, Kernel, call, register
from ..kernels._pallas_plastic import plastic_gpu, plastic_gpu_supports
from ..plasticity import STDP, PlasticityRule, PlasticState, STDPState
from ..plasticity._base import replace_state
from ._propagation import capacity_for, run_capped

__all__ = [
    "PlasticLayout",
    "PlasticState",
    "STDPState",
    "plastic_update",
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


def _rows(lay: PlasticLayout, n_pre: int) -> jax.Array:
    nnz = lay.indices.shape[0]
    counts = lay.indptr[1:] - lay.indptr[:-1]
    return jnp.repeat(jnp.arange(n_pre, dtype=jnp.int32), counts, total_repeat_length=nnz)


def _own_spikes(sizes, s_arr, s_post):
    """The projection's own arrivals `(*batch, n_pre)` and postsynaptic spikes `(*batch, n_post)`
    out of the (possibly wider, group-wide) vectors handed to `plastic_update`."""
    n_pre, n_post, _, _, arr_offset, post_offset = sizes
    return (
        s_arr[..., arr_offset : arr_offset + n_pre],
        s_post[..., post_offset : post_offset + n_post],
    )


def _decayed(traces, decays):
    return tuple(t * d for t, d in zip(traces, decays, strict=True))


def _event_update(
    rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, *, sizes, capacity=None
):
    """The generic event path (the registry entry's reference): `rule.on_pre` over the CSR
    rows of the arrivals, then `rule.on_post` over the CSC columns of the postsynaptic
    spikes, each compacted into a buffer of `capacity` neurons per trial (None: all).
    Leading dimensions of the weights, traces and spikes are trials.

    Returns `(w, pre, post, (needed_pre, needed_post))`: the buffer each trial needed beyond
    `capacity` for its arrivals and its postsynaptic spikes (0 when it held them all)."""
    n_pre, n_post, max_out, max_in = sizes[:4]
    s_arr, s_post = _own_spikes(sizes, s_arr, s_post)
    nnz = w.shape[-1]
    pre = _decayed(pre_old, pre_decay)
    post = _decayed(post_old, post_decay)
    w_flat = w.reshape(-1)
    oob = w_flat.shape[0]
    batch = w.shape[:-1]
    a_flat = s_arr.reshape(-1)
    p_flat = s_post.reshape(-1)
    pre_new = rule.update_pre_traces(pre, s_arr)
    pre_flat = tuple(t.reshape(-1) for t in pre)
    pre_new_flat = tuple(t.reshape(-1) for t in pre_new)
    post_flat = tuple(t.reshape(-1) for t in post)

    def window(ptr, local, valid, width):
        # Positions ptr[r] .. ptr[r + 1] - 1 of each spiking row r, padded to `width`.
        start = ptr[local]
        count = jnp.where(valid, ptr[local + 1] - start, 0)
        k = jnp.arange(width, dtype=jnp.int32)
        ok = k[None, :] < count[:, None]
        return jnp.where(ok, start[:, None] + k[None, :], 0), ok

    def depress(trial, i, valid, wf):
        # (trial, presynaptic neuron) of the arrivals
        idx = trial * n_pre + i
        syn, ok = window(lay.indptr, i, valid, max_out)
        at = trial[:, None] * nnz + syn
        wv = wf[at]
        post_at = trial[:, None] * n_post + lay.indices[syn]
        s = a_flat[idx][:, None]
        new = rule.on_pre(
            wv,
            tuple(t[idx][:, None] for t in pre_flat),
            tuple(t[post_at] for t in post_flat),
            s,
        )
        return wf.at[jnp.where(ok, at, oob)].set(new, mode="drop")

    def potentiate(trial, j, valid, wf):
        # (trial, postsynaptic neuron) of the spikes
        idx = trial * n_post + j
        pos, ok = window(lay.col_ptr, j, valid, max_in)
        at = trial[:, None] * nnz + lay.col_syn[pos]
        wv = wf[at]
        pre_at = trial[:, None] * n_pre + lay.col_pre[pos]
        s = p_flat[idx][:, None]
        new = rule.on_post(
            wv,
            tuple(t[pre_at] for t in pre_new_flat),
            tuple(t[idx][:, None] for t in post_flat),
            s,
        )
        return wf.at[jnp.where(ok, at, oob)].set(new, mode="drop")

    none = jnp.zeros(batch, jnp.int32)
    need_pre = need_post = none
    if max_out:
        mask = (a_flat > 0).astype(jnp.float32).reshape(-1, n_pre)
        w_flat, need_pre = run_capped(mask, depress, w_flat, capacity_for(capacity, n_pre))
    if max_in:
        mask = (p_flat > 0).astype(jnp.float32).reshape(-1, n_post)
        w_flat, need_post = run_capped(mask, potentiate, w_flat, capacity_for(capacity, n_post))
    needed = (need_pre.reshape(batch), need_post.reshape(batch))
    return w_flat.reshape(w.shape), pre_new, rule.update_post_traces(post, s_post), needed


def _kernel_update(
    rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, *, sizes, capacity=None
):
    """The pair-STDP update through the compiled CPU kernel, arrays updated in place. The
    kernel treats the leading dimensions of the weights, traces and spikes as trials, and
    reads every spike (it never needs a buffer)."""
    pair = rule.pair_kernel()
    dtype = w.dtype
    params = jnp.stack(
        [pair.a_plus, pair.a_minus, pair.w_min, pair.w_max, pre_decay[0], post_decay[0]]
    ).astype(dtype)
    call = jax.ffi.ffi_call(
        STDP_TARGET,
        tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in (w, pre_old[0], post_old[0])),
        input_output_aliases={0: 0, 1: 1, 2: 2},
        vmap_method="sequential",
    )
    w, x, y = call(
        w,
        pre_old[0].astype(dtype),
        post_old[0].astype(dtype),
        s_arr.astype(dtype),
        s_post.astype(dtype),
        params,
        lay.indptr,
        lay.indices,
        lay.col_ptr,
        lay.col_syn,
        lay.col_pre,
        n_pre=np.int64(sizes[0]),
        n_post=np.int64(sizes[1]),
        arr_stride=np.int64(s_arr.shape[-1]),
        arr_offset=np.int64(sizes[4]),
        post_stride=np.int64(s_post.shape[-1]),
        post_offset=np.int64(sizes[5]),
        multiplicative=np.int64(pair.multiplicative),
        nearest=np.int64(pair.nearest),
    )
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return w, (x,), (y,), (none, none)


def _dense_step(
    rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, *, sizes, capacity=None
):
    """The step of every synapse at once through the rule's `dense_update`: the function
    whose derivative the update has."""
    s_arr, s_post = _own_spikes(sizes, s_arr, s_post)
    pre = _decayed(pre_old, pre_decay)
    post = _decayed(post_old, post_decay)
    w_new = rule.dense_update(w, pre, post, s_arr, s_post, _rows(lay, sizes[0]), lay.indices)
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return (
        w_new,
        rule.update_pre_traces(pre, s_arr),
        rule.update_post_traces(post, s_post),
        (none, none),
    )


def _pair_kernel_supports(rule, *args, sizes, capacity=None):
    return rule.pair_kernel() is not None


def _plastic_examples():
    """Pair STDP (additive all-to-all and multiplicative nearest) on 9 -> 7 neurons, two
    trials, spikes read at offsets of wider vectors."""
    rng = np.random.default_rng(1)
    n_pre, n_post, batch = 9, 7, (2,)
    mask = rng.random((n_pre, n_post)) < 0.5
    pre_of, post_of = np.nonzero(mask)
    order = np.argsort(post_of, kind="stable")
    lay = PlasticLayout(
        jnp.asarray(np.concatenate([[0], np.cumsum(mask.sum(1))]), jnp.int32),
        jnp.asarray(post_of, jnp.int32),
        jnp.asarray(np.concatenate([[0], np.cumsum(mask.sum(0))]), jnp.int32),
        jnp.asarray(order, jnp.int32),
        jnp.asarray(pre_of[order], jnp.int32),
    )
    sizes = (n_pre, n_post, int(mask.sum(1).max()), int(mask.sum(0).max()), 2, 1)
    f32 = jnp.float32
    for mode, pairing in (("additive", "all_to_all"), ("multiplicative", "nearest")):
        rule = STDP(a_plus=0.05, a_minus=0.04, w_max=1.0, mode=mode, pairing=pairing)
        args = (
            rule,
            lay,
            jnp.asarray(rng.uniform(0.2, 0.8, (*batch, int(mask.sum()))), f32),
            (jnp.asarray(rng.uniform(0, 1, (*batch, n_pre)), f32),),
            (jnp.asarray(rng.uniform(0, 1, (*batch, n_post)), f32),),
            jnp.asarray(rng.random((*batch, n_pre + 3)) < 0.5, f32),
            jnp.asarray(rng.random((*batch, n_post + 2)) < 0.5, f32),
            (jnp.asarray(0.9, f32),),
            (jnp.asarray(0.8, f32),),
        )
        yield Example(
            args,
            dict(sizes=sizes),
            grad_argnums=(0, 2, 3, 4, 5, 6),
            vmap_argnums=(2, 5, 6),
            label=f"{mode}-{pairing}",
        )


def _plastic_gpu(
    rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, *, sizes, capacity=None
):
    """The Pallas Triton update (`neurojax.kernels._pallas_plastic.plastic_gpu`): its grid
    covers every neuron, so it never needs a larger buffer (`capacity` unused)."""
    w, pre, post = plastic_gpu(
        rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, sizes=sizes
    )
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return w, pre, post, (none, none)


def _plastic_gpu_supports(rule, *args, sizes, capacity=None):
    return plastic_gpu_supports(rule, *args, sizes=sizes)


STDP_TARGET = "nj_stdp_update"
PLASTIC = register(
    Kernel(
        name="plastic_update",
        reference=_event_update,
        cpu=_kernel_update,
        gpu=_plastic_gpu,  # Pallas Triton kernels tracing the rule's on_pre / on_post
        ffi_targets=((STDP_TARGET, "NjStdpUpdate"),),
        supports={"cpu": _pair_kernel_supports, "gpu": _plastic_gpu_supports},
        # weights, traces and spikes are trials; a vmapped rule, layout or decay is not.
        batching=Fold(trial=(2, 3, 4, 5, 6), shared=(0, 1, 7, 8)),
        differentiable=_dense_step,
        # the kernel rounds a trace's decay and increment apart where XLA may fuse them
        rtol=1e-6,
        atol=1e-6,
        examples=_plastic_examples,
        doc="One step of a plastic projection: the rule's events on CSR rows and CSC columns.",
    )
)


def _check_offsets(owner, sizes, s_arr, s_post, arr_offset, post_offset):
    n_pre, n_post = int(sizes[0]), int(sizes[1])
    for name, off, n, vec in (
        ("arr_offset", arr_offset, n_pre, s_arr),
        ("post_offset", post_offset, n_post, s_post),
    ):
        if off < 0 or off + n > vec.shape[-1]:
            raise ValueError(
                f"{owner}: {name}={off} with {n} neurons does not fit in spike vectors of "
                f"length {vec.shape[-1]}"
            )
    return (*(int(v) for v in sizes), int(arr_offset), int(post_offset))


def plastic_update(
    rule: PlasticityRule,
    lay: PlasticLayout,
    sizes,
    w,
    pre,
    post,
    s_arr,
    s_post,
    pre_decay,
    post_decay,
    *,
    arr_offset: int = 0,
    post_offset: int = 0,
    capacity: int | None = None,
):
    """Weights and traces after one step of `rule`: `(w, pre, post, needed)`.

    `pre`, `post` are the tuples of the rule's traces at the previous step; each decays by
    its factor in `pre_decay`, `post_decay` and takes this step's arrivals `s_arr` and
    postsynaptic spikes `s_post`. `sizes` is the static `(n_pre, n_post, max_fan_out,
    max_fan_in)`.

    The spike vectors may be wider than the projection: the arrivals are
    `s_arr[..., arr_offset : arr_offset + n_pre]` and the postsynaptic spikes
    `s_post[..., post_offset : post_offset + n_post]`. A network hands over the spikes of the
    whole group of populations stepped together, which the compiled kernel reads in place
    (the same vector as the delivery kernel), so the group's spikes are computed once a step.

    The pure-JAX path reads at most `capacity` arriving and `capacity` postsynaptic neurons
    per trial (None: all); `needed = (needed_pre, needed_post)` is, per trial, the buffer it
    needed beyond that (0 when it held them all; see `neurojax.network._propagation`).
    """
    key = _check_offsets("plastic_update", sizes, s_arr, s_post, arr_offset, post_offset)
    if capacity is not None and capacity >= max(key[0], key[1]):
        capacity = None
    return call(
        PLASTIC,
        rule,
        lay,
        w,
        tuple(pre),
        tuple(post),
        s_arr,
        s_post,
        tuple(pre_decay),
        tuple(post_decay),
        sizes=key,
        capacity=capacity,
    )


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
    """`plastic_update` of a rule with one presynaptic trace `x` and one postsynaptic trace
    `y` (pair STDP): `(w, x, y)` after one step."""
    key = _check_offsets("stdp_update", sizes, s_arr, s_post, arr_offset, post_offset)
    w, (x,), (y,), _ = call(
        PLASTIC, rule, lay, w, (x,), (y,), s_arr, s_post, (decay_x,), (decay_y,), sizes=key
    )
    return w, x, y


# ---------------------------------------------------------------------------------------------
# What a network needs from a plastic projection. `Network` (and `Projection`'s constructor)
# call these and nothing else of this module, so the rules' execution can change here alone.


def check_rule(owner: str, plasticity: Any) -> None:
    """Raise `TypeError` unless `plasticity` is None or a rule a projection can execute."""
    if plasticity is None:
        return
    if not isinstance(plasticity, PlasticityRule):
        raise TypeError(
            f"{owner}: plasticity must be None or nj.STDP(...) or another "
            f"nj.plasticity.PlasticityRule, got {plasticity!r}"
        )
    for name in ("n_pre_traces", "n_post_traces"):
        n = getattr(plasticity, name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(
                f"{owner}: {type(plasticity).__name__}.{name} must be an int >= 0, got {n!r}"
            )
    if plasticity.pair_kernel() is not None and (
        plasticity.n_pre_traces,
        plasticity.n_post_traces,
    ) != (1, 1):
        raise TypeError(
            f"{owner}: {type(plasticity).__name__}.pair_kernel() returns kernel parameters, "
            "which needs exactly one presynaptic and one postsynaptic trace, got "
            f"n_pre_traces={plasticity.n_pre_traces}, n_post_traces={plasticity.n_post_traces}"
        )


def check_initial_weights(owner: str, plasticity: Any, weights: jax.Array) -> None:
    """Raise `ValueError` when the initial weights lie outside the rule's bounds."""
    w = np.asarray(weights)
    lo, hi = float(plasticity.w_min), float(plasticity.w_max)
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(
            f"{owner}: initial weights must lie within the {type(plasticity).__name__} bounds "
            f"[w_min, w_max] = [{lo}, {hi}], got weights in [{w.min()}, {w.max()}]"
        )


def plastic_init(proj: Any, batch: tuple[int, ...], delay_steps: int | None, dtype: Any) -> Any:
    """The initial plastic state of projection `proj` for a batch of trials."""
    return proj.plasticity.init_state(
        proj.weights, proj.n_pre, proj.n_post, batch, delay_steps, dtype
    )


def plastic_weights(ps: Any) -> jax.Array:
    """The current weights `(*batch, nnz)` (CSR order) held by a plastic state."""
    return ps.weights


def plastic_step(
    proj: Any,
    ps: Any,
    s_pre_group,
    pre_offset: int,
    s_post_group,
    post_offset: int,
    k,
    dt: float,
    capacity: int | None = None,
) -> tuple[Any, tuple[jax.Array, jax.Array]]:
    """The plastic state after one step, and the spike buffers it needed beyond `capacity`
    (`(needed_pre, needed_post)` per trial; see `plastic_update`).

    `s_pre_group` and `s_post_group` are the spike vectors of the groups of populations that
    hold `proj.pre` and `proj.post`, which hold them at `pre_offset` and `post_offset`; `k` is
    the step index (for the delay history) and `dt` the step in ms.
    """
    rule = proj.plasticity
    dtype = ps.weights.dtype
    s_group_pre = s_pre_group.astype(dtype)
    s_post = s_post_group.astype(dtype)
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
    pre_decay, post_decay = rule.trace_decays(dt)
    lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
    sizes = (proj.n_pre, proj.n_post, proj.max_fan_out, proj.max_fan_in)
    w, pre, post, needed = plastic_update(
        rule,
        lay,
        sizes,
        ps.weights,
        ps.pre_traces,
        ps.post_traces,
        arrivals,
        s_post,
        tuple(jnp.asarray(f).astype(t.dtype) for f, t in zip(pre_decay, ps.pre_traces)),
        tuple(jnp.asarray(f).astype(t.dtype) for f, t in zip(post_decay, ps.post_traces)),
        arr_offset=arr_offset,
        post_offset=post_offset,
        capacity=capacity,
    )
    new = replace_state(ps, weights=w, pre_traces=pre, post_traces=post, history=history)
    return new, needed
