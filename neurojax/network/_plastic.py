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
(`neurojax.kernels`): its reference is the generic event path; on CPU a rule that is pair STDP
(its `pair_kernel()` is not None: `nj.STDP`, both modes and pairings) runs in the compiled
kernel `nj_stdp_update` of `neurojax/kernels/csr_deliver.cc`, and a rule of the trace-rule
family (its `trace_kernel()` is not None: `nj.TripletSTDP`, both pairings, and
`nj.VogelsSTDP`) in `nj_trace_update` of `neurojax/kernels/plastic_trace.cc` (weights and
traces updated in place, the same operations in the same order; values may differ in their
last bit where XLA fuses a multiply and an add into one multiply-add); every other rule, and
every rule on other platforms, runs on the pure-JAX event path. The neuromodulated rule
(`nj.RewardSTDP`) has its own entry, `modulated_update`, with the CPU kernel
`nj_reward_update` of `plastic_trace.cc`.

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
from ..plasticity import (
    STDP,
    PlasticityRule,
    PlasticState,
    RewardSTDP,
    STDPState,
    TripletSTDP,
    VogelsSTDP,
)
from ..plasticity._base import TRACE_KINDS, ModulatedRule, replace_state
from ..plasticity._reward import block_factors
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
    "modulated_update",
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
    """The update through a compiled CPU kernel, arrays updated in place: pair STDP
    (`pair_kernel()`) in `nj_stdp_update`, the trace rules (`trace_kernel()`) in
    `nj_trace_update`. The kernels treat the leading dimensions of the weights, traces and
    spikes as trials, and read every spike (they never need a buffer)."""
    if rule.pair_kernel() is None:
        return _trace_kernel_update(
            rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, sizes=sizes
        )
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


def _trace_kernel_update(
    rule, lay, w, pre_old, post_old, s_arr, s_post, pre_decay, post_decay, *, sizes
):
    """A trace rule (`trace_kernel()`) through `nj_trace_update`: its one or two traces per
    side as separate buffers, updated in place (a rule with one trace per side passes empty
    second ones)."""
    tk = rule.trace_kernel()
    dtype = w.dtype
    n_traces = len(pre_old)
    empty = jnp.zeros((0,), dtype)
    pre = tuple(t.astype(dtype) for t in pre_old) + (empty,) * (2 - n_traces)
    post = tuple(t.astype(dtype) for t in post_old) + (empty,) * (2 - n_traces)
    pre_d = tuple(pre_decay) + (jnp.zeros((), dtype),) * (2 - n_traces)
    post_d = tuple(post_decay) + (jnp.zeros((), dtype),) * (2 - n_traces)
    params = jnp.stack(
        [
            jnp.asarray(v).astype(dtype)
            for v in (tk.a_pre, tk.b_pre, tk.a_post, tk.b_post, tk.w_min, tk.w_max, *pre_d, *post_d)
        ]
    )
    outs = (w, *pre, *post)
    call = jax.ffi.ffi_call(
        TRACE_TARGET,
        tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in outs),
        input_output_aliases={i: i for i in range(5)},
        vmap_method="sequential",
    )
    w, p0, p1, q0, q1 = call(
        w,
        *pre,
        *post,
        s_arr.astype(dtype),
        s_post.astype(dtype),
        params,
        lay.indptr,
        lay.indices,
        lay.col_ptr,
        lay.col_syn,
        lay.col_pre,
        kind=np.int64(TRACE_KINDS.index(tk.kind)),
        n_pre=np.int64(sizes[0]),
        n_post=np.int64(sizes[1]),
        arr_stride=np.int64(s_arr.shape[-1]),
        arr_offset=np.int64(sizes[4]),
        post_stride=np.int64(s_post.shape[-1]),
        post_offset=np.int64(sizes[5]),
        nearest=np.int64(tk.nearest),
    )
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return w, (p0, p1)[:n_traces], (q0, q1)[:n_traces], (none, none)


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


def _cpu_kernel_supports(rule, *args, sizes, capacity=None):
    return rule.pair_kernel() is not None or rule.trace_kernel() is not None


def _plastic_examples():
    """Pair STDP (additive all-to-all and multiplicative nearest), triplet STDP (both
    pairings) and Vogels' rule on 9 -> 7 neurons, two trials, spikes read at offsets of wider
    vectors."""
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
    rules = [
        (f"{mode}-{pairing}", STDP(a_plus=0.05, a_minus=0.04, mode=mode, pairing=pairing))
        for mode, pairing in (("additive", "all_to_all"), ("multiplicative", "nearest"))
    ]
    rules += [
        (f"triplet-{pairing}", TripletSTDP(a2_plus=0.03, a3_plus=0.04, a2_minus=0.05,
                                           a3_minus=0.02, pairing=pairing))
        for pairing in ("all_to_all", "nearest")
    ]  # fmt: skip
    rules.append(("vogels", VogelsSTDP(eta=0.05, rho0=5.0, w_max=1.0)))
    for label, rule in rules:
        n_traces = rule.n_pre_traces
        args = (
            rule,
            lay,
            jnp.asarray(rng.uniform(0.2, 0.8, (*batch, int(mask.sum()))), f32),
            tuple(jnp.asarray(rng.uniform(0, 1, (*batch, n_pre)), f32) for _ in range(n_traces)),
            tuple(jnp.asarray(rng.uniform(0, 1, (*batch, n_post)), f32) for _ in range(n_traces)),
            jnp.asarray(rng.random((*batch, n_pre + 3)) < 0.5, f32),
            jnp.asarray(rng.random((*batch, n_post + 2)) < 0.5, f32),
            (jnp.asarray(0.9, f32), jnp.asarray(0.95, f32))[:n_traces],
            (jnp.asarray(0.8, f32), jnp.asarray(0.97, f32))[:n_traces],
        )
        yield Example(
            args,
            dict(sizes=sizes),
            grad_argnums=(0, 2, 3, 4, 5, 6),
            vmap_argnums=(2, 5, 6),
            label=label,
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
TRACE_TARGET = "nj_trace_update"
PLASTIC = register(
    Kernel(
        name="plastic_update",
        reference=_event_update,
        cpu=_kernel_update,
        gpu=_plastic_gpu,  # Pallas Triton kernels tracing the rule's on_pre / on_post
        ffi_targets=((STDP_TARGET, "NjStdpUpdate"), (TRACE_TARGET, "NjTraceUpdate")),
        supports={"cpu": _cpu_kernel_supports, "gpu": _plastic_gpu_supports},
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
# Neuromodulated rules (`nj.RewardSTDP`): per-synapse eligibility and lazy weight updates.
#
# A rule whose `modulator_name()` is not None writes its STDP events to a per-synapse
# eligibility and changes weights only through the neuromodulator `d` (one value per trial and
# step). A synapse is brought up to date when its presynaptic neuron emits or its spike
# arrives, or its postsynaptic neuron spikes (spikes x fan-out), and every synapse once per
# block of `rule.sweep_steps(dt)` steps; see `neurojax.plasticity._reward` for the arithmetic.


def _mod_window(ptr, local, valid, width):
    start = ptr[local]
    count = jnp.where(valid, ptr[local + 1] - start, 0)
    k = jnp.arange(width, dtype=jnp.int32)
    ok = k[None, :] < count[:, None]
    return jnp.where(ok, start[:, None] + k[None, :], 0), ok


def _mod_prepare(rule, x_old, y_old, s_arr, acc, d, dx, dy, phase):
    x = x_old * dx
    y = y_old * dy
    x_new = rule.update_pre_traces((x,), s_arr)[0]
    return x, y, x_new, acc + phase * d


def _mod_sweep(rule, w, elig, stamp, acc, gain, sweep, a_block):
    """Where `sweep` (the step that starts a block): every synapse brought up to date,
    `w <- clip(w + gain e (acc - stamp))`, its eligibility referred to the new block's start
    (`e * a_block`, `a_block = a^n_block`), stamps and the block's sum reset to 0."""

    def run(p):
        w, e, st, acc = p
        w_new = rule.clip(w + gain * e * (acc[..., None] - st)).astype(w.dtype)
        return w_new, e * a_block, jnp.zeros_like(st), jnp.zeros_like(acc)

    return jax.lax.cond(sweep, run, lambda p: p, (w, elig, stamp, acc))


def _modulated_event(static, rule, lay, w, elig, stamp, acc, x_old, y_old, s_emit, s_arr,
                     s_post, d, dx, dy, phase, a_end, gain, sweep, a_block):  # fmt: skip
    """The event path: the block's sweep where `sweep`, then catch-up and eligibility jumps
    over the CSR rows of the emitting or arriving presynaptic neurons, then over the CSC
    columns of the spiking postsynaptic ones. Leading dimensions are trials."""
    n_pre, n_post, max_out, max_in, capacity = static
    w, elig, stamp, acc = _mod_sweep(rule, w, elig, stamp, acc, gain, sweep, a_block)
    x, y, x_new, acc_new = _mod_prepare(rule, x_old, y_old, s_arr, acc, d, dx, dy, phase)
    batch, nnz = w.shape[:-1], w.shape[-1]
    carry = (w.reshape(-1), elig.reshape(-1), stamp.reshape(-1))
    oob = carry[0].shape[0]
    acc_f = jnp.broadcast_to(acc_new, batch).reshape(-1)
    arr_f, post_f = s_arr.reshape(-1), s_post.reshape(-1)
    xn_f, y_f = x_new.reshape(-1), y.reshape(-1)

    def update(at, ok, trial, jump, carry):
        wf, ef, sf = carry
        acc_v = jnp.broadcast_to(acc_f[trial][:, None], at.shape)
        w_v = rule.clip(wf[at] + gain * ef[at] * (acc_v - sf[at]))
        target = jnp.where(ok, at, oob)
        return (
            wf.at[target].set(w_v, mode="drop"),
            ef.at[target].set(ef[at] + jump / a_end, mode="drop"),
            sf.at[target].set(acc_v, mode="drop"),
        )

    def pre_side(trial, i, valid, carry):
        syn, ok = _mod_window(lay.indptr, i, valid, max_out)
        at = trial[:, None] * nnz + syn
        post_at = trial[:, None] * n_post + lay.indices[syn]
        s = arr_f[trial * n_pre + i][:, None]
        return update(at, ok, trial, rule.eligibility_pre(None, (y_f[post_at],), s), carry)

    def post_side(trial, j, valid, carry):
        pos, ok = _mod_window(lay.col_ptr, j, valid, max_in)
        at = trial[:, None] * nnz + lay.col_syn[pos]
        pre_at = trial[:, None] * n_pre + lay.col_pre[pos]
        s = post_f[trial * n_post + j][:, None]
        return update(at, ok, trial, rule.eligibility_post((xn_f[pre_at],), None, s), carry)

    need_pre = need_post = jnp.zeros(batch, jnp.int32)
    if max_out:
        touch = ((s_emit > 0) | (s_arr > 0)).astype(jnp.float32).reshape(-1, n_pre)
        carry, need_pre = run_capped(touch, pre_side, carry, capacity_for(capacity, n_pre))
    if max_in:
        mask = (s_post > 0).astype(jnp.float32).reshape(-1, n_post)
        carry, need_post = run_capped(mask, post_side, carry, capacity_for(capacity, n_post))
    w, elig, stamp = (c.reshape(w.shape) for c in carry)
    y_new = rule.update_post_traces((y,), s_post)[0]
    needed = (need_pre.reshape(batch), need_post.reshape(batch))
    return w, elig, stamp, acc_new, x_new, y_new, needed


def _modulated_dense(static, rule, lay, w, elig, stamp, acc, x_old, y_old, s_emit, s_arr,
                     s_post, d, dx, dy, phase, a_end, gain, sweep, a_block):  # fmt: skip
    """Every synapse at once: the same values as the event path (a synapse without an event
    keeps its weight and stamp), and the function whose derivative the update has."""
    n_pre = static[0]
    w, elig, stamp, acc = _mod_sweep(rule, w, elig, stamp, acc, gain, sweep, a_block)
    x, y, x_new, acc_new = _mod_prepare(rule, x_old, y_old, s_arr, acc, d, dx, dy, phase)
    pre_idx, post_idx = _rows(lay, n_pre), lay.indices
    touched = ((s_emit > 0) | (s_arr > 0))[..., pre_idx] | (s_post > 0)[..., post_idx]
    acc_v = jnp.broadcast_to(acc_new[..., None], w.shape)
    w_new = jnp.where(touched, rule.clip(w + gain * elig * (acc_v - stamp)), w)
    jump = rule.eligibility_pre(None, (y[..., post_idx],), s_arr[..., pre_idx])
    jump = jump + rule.eligibility_post((x_new[..., pre_idx],), None, s_post[..., post_idx])
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return (
        w_new,
        elig + jump / a_end,
        jnp.where(touched, acc_v, stamp),
        acc_new,
        x_new,
        rule.update_post_traces((y,), s_post)[0],
        (none, none),
    )


def _modulated_kernel(rule, lay, w, elig, stamp, acc, x_old, y_old, s_emit, s_arr, s_post, d,
                      dx, dy, phase, a_end, gain, sweep, a_block, *, static):  # fmt: skip
    """The step through the compiled CPU kernel `nj_reward_update` (`plastic_trace.cc`), the
    block's sweep included, arrays updated in place; it reads every spike (it never needs a
    buffer)."""
    n_pre, n_post = static[:2]
    dtype = w.dtype
    factors = (dx, dy, phase, a_end, gain, rule.a_plus, rule.a_minus, rule.w_min, rule.w_max)
    params = jnp.stack([jnp.asarray(v).astype(dtype) for v in (*factors, sweep, a_block)])
    acc = jnp.broadcast_to(acc, w.shape[:-1]).astype(dtype)
    d = jnp.broadcast_to(d, w.shape[:-1]).astype(dtype)
    outs = (w, elig, stamp, acc, x_old, y_old)
    call_ = jax.ffi.ffi_call(
        REWARD_TARGET,
        tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in outs),
        input_output_aliases={i: i for i in range(6)},
        vmap_method="sequential",
    )
    w, elig, stamp, acc, x, y = call_(
        *(a.astype(dtype) for a in outs),
        s_emit.astype(dtype),
        s_arr.astype(dtype),
        s_post.astype(dtype),
        d,
        params,
        lay.indptr,
        lay.indices,
        lay.col_ptr,
        lay.col_syn,
        lay.col_pre,
        n_pre=np.int64(n_pre),
        n_post=np.int64(n_post),
        nearest=np.int64(rule.pairing == "nearest"),
    )
    none = jnp.zeros(w.shape[:-1], jnp.int32)
    return w, elig, stamp, acc, x, y, (none, none)


def _modulated_kernel_supports(rule, *args, static):
    """The kernel runs `nj.RewardSTDP` itself (not a subclass that redefines its events)."""
    return type(rule) is RewardSTDP


def _modulated_examples():
    """`nj.RewardSTDP` (both pairings) on 9 -> 7 neurons, two trials, mid-block and at the
    start of a block (the sweep)."""
    rng = np.random.default_rng(3)
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
    nnz = int(mask.sum())
    static = (n_pre, n_post, int(mask.sum(1).max()), int(mask.sum(0).max()), None)
    f32 = jnp.float32

    def u(lo, hi, shape):
        return jnp.asarray(rng.uniform(lo, hi, shape), f32)

    def spikes(n):
        return jnp.asarray(rng.random((*batch, n)) < 0.5, f32)

    for pairing, sweep in (("all_to_all", False), ("nearest", True)):
        rule = RewardSTDP(a_plus=0.5, a_minus=0.6, tau_c=50.0, w_max=2.0, pairing=pairing)
        args = (
            rule,
            lay,
            u(0.2, 1.8, (*batch, nnz)),
            u(-0.5, 0.5, (*batch, nnz)),
            u(0.0, 0.3, (*batch, nnz)),
            u(0.3, 0.6, batch),
            u(0.0, 1.0, (*batch, n_pre)),
            u(0.0, 1.0, (*batch, n_post)),
            spikes(n_pre),
            spikes(n_pre),
            spikes(n_post),
            u(0.5, 1.5, batch),
            jnp.asarray(0.9, f32),
            jnp.asarray(0.85, f32),
            jnp.asarray(0.8, f32),
            jnp.asarray(0.75, f32),
            jnp.asarray(2.0, f32),
            jnp.asarray(sweep),
            jnp.asarray(0.6, f32),
        )
        yield Example(
            args,
            dict(static=static),
            grad_argnums=(0, 2, 3, 4, 5, 6, 7, 11),
            vmap_argnums=(2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
            label=f"{pairing}-sweep" if sweep else pairing,
        )


REWARD_TARGET = "nj_reward_update"
MODULATED = register(
    Kernel(
        name="modulated_update",
        reference=lambda *args, static: _modulated_event(static, *args),
        cpu=_modulated_kernel,
        ffi_targets=((REWARD_TARGET, "NjRewardUpdate"),),
        supports={"cpu": _modulated_kernel_supports},
        # weights, eligibilities, stamps, sums, traces, spikes and the modulator are trials;
        # the rule, layout and the step's factors are not.
        batching=Fold(trial=tuple(range(2, 12)), shared=(0, 1, 12, 13, 14, 15, 16, 17, 18)),
        differentiable=lambda *args, static: _modulated_dense(static, *args),
        # the kernel rounds a trace's decay and increment apart where XLA may fuse them
        rtol=1e-6,
        atol=1e-6,
        examples=_modulated_examples,
        doc="One step of a neuromodulated rule: lazy catch-up and eligibility on rows and columns.",
    )
)


def modulated_update(static, *args):
    """One step of a neuromodulated rule: `(w, eligibility, stamp, acc, x, y, needed)`.

    `static = (n_pre, n_post, max_fan_out, max_fan_in, capacity)`; `args` are `(rule, layout,
    w, eligibility, stamp, acc, x, y, s_emit, s_arr, s_post, d, decay_x, decay_y, phase,
    a_end, gain, sweep, a_block)` with the projection's own spike vectors; where `sweep` (a
    bool, the first step of a block) every synapse is first brought up to date and the block
    restarts (`a_block = a^n_block`). The kernel registry's entry
    `modulated_update`: its reference is the event path, `nj.RewardSTDP` runs on CPU in the
    compiled kernel `nj_reward_update`, and the derivative is the dense definition's (as for
    `plastic_update`)."""
    return call(MODULATED, *args, static=tuple(static))


def _modulated_step(proj, ps, s_emit, arrivals, s_post, history, k, dt, capacity, modulator):
    rule = proj.plasticity
    if modulator is None:
        raise ValueError(
            f"Network.step: the projection {proj.pre} -> {proj.post} has "
            f"{type(rule).__name__}, which reads the neuromodulator {rule.modulator_name()!r}; "
            f"give it as an input of the run (nj.simulate(..., inputs={{"
            f"{rule.modulator_name()!r}: d}}) with d of shape (n_steps,) or (n_steps, *batch)) "
            f"or of the network (nj.Network(..., inputs={{{rule.modulator_name()!r}: d}}))"
        )
    dtype = ps.weights.dtype
    d = jnp.asarray(modulator).astype(dtype)
    if d.ndim > ps.acc.ndim or d.shape != ps.acc.shape[ps.acc.ndim - d.ndim :]:
        raise ValueError(
            f"Network.step: the neuromodulator {rule.modulator_name()!r} must be a scalar or "
            f"one value per trial {ps.acc.shape} at each step, got shape {d.shape}"
        )
    d = jnp.broadcast_to(d, ps.acc.shape)
    a = rule.eligibility_decay(dt).astype(dtype)
    n_block = rule.sweep_steps(dt)
    # The sweep is part of the update (the kernel does it in place): a `lax.cond` around
    # the state here made XLA:CPU copy the weights, eligibilities and stamps at every step,
    # ten times the cost of the update itself on the COBA network.
    sweep = (k % n_block == 0) & (k > 0)
    phase, a_end = block_factors(rule, k, dt)
    gain = rule.eligibility_gain(dt)
    (dx,), (dy,) = rule.trace_decays(dt)
    lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
    static = (proj.n_pre, proj.n_post, proj.max_fan_out, proj.max_fan_in, capacity)
    if capacity is not None and capacity >= max(proj.n_pre, proj.n_post):
        static = static[:4] + (None,)
    cast = lambda v: jnp.asarray(v).astype(dtype)  # noqa: E731
    w, elig, stamp, acc, x, y, needed = modulated_update(
        static, rule, lay, ps.weights, ps.eligibility, ps.stamp, ps.acc, ps.pre_traces[0],
        ps.post_traces[0], s_emit, arrivals, s_post, d, cast(dx), cast(dy), cast(phase),
        cast(a_end), cast(gain), sweep, a**n_block,
    )  # fmt: skip
    new = replace_state(
        ps,
        weights=w,
        pre_traces=(x,),
        post_traces=(y,),
        history=history,
        eligibility=elig,
        stamp=stamp,
        acc=acc,
    )
    return new, needed


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
    tk = plasticity.trace_kernel()
    if tk is not None and plasticity.pair_kernel() is None:
        if tk.kind not in TRACE_KINDS:
            raise TypeError(
                f"{owner}: {type(plasticity).__name__}.trace_kernel() returns kind={tk.kind!r}; "
                f"the trace-rule kernel runs {TRACE_KINDS}"
            )
        want = 2 if tk.kind == "triplet" else 1
        if (plasticity.n_pre_traces, plasticity.n_post_traces) != (want, want):
            raise TypeError(
                f"{owner}: {type(plasticity).__name__}.trace_kernel() returns kind={tk.kind!r}, "
                f"which needs {want} presynaptic and {want} postsynaptic traces, got "
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
    modulator: Any = None,
) -> tuple[Any, tuple[jax.Array, jax.Array]]:
    """The plastic state after one step, and the spike buffers it needed beyond `capacity`
    (`(needed_pre, needed_post)` per trial; see `plastic_update`).

    `s_pre_group` and `s_post_group` are the spike vectors of the groups of populations that
    hold `proj.pre` and `proj.post`, which hold them at `pre_offset` and `post_offset`; `k` is
    the step index (for the delay history) and `dt` the step in ms. `modulator` is this step's
    value of the neuromodulator of a rule that reads one (`rule.modulator_name()`), else
    unused.
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
    if isinstance(rule, ModulatedRule):
        s_emit = s_group_pre[..., pre_offset : pre_offset + proj.n_pre]
        s_arr = arrivals[..., arr_offset : arr_offset + proj.n_pre]
        s_own_post = s_post[..., post_offset : post_offset + proj.n_post]
        return _modulated_step(
            proj, ps, s_emit, s_arr, s_own_post, history, k, dt, capacity, modulator
        )
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
