r"""Event-driven spike propagation over a compressed-row (CSR) layout.

**Layout.** A projection's synapses are stored sorted by presynaptic neuron: `indptr`
(`n_pre + 1`, int32), `indices` (postsynaptic neuron of each synapse, int32) and `weights`
(float), so a synapse costs 8 bytes (plus 1-4 bytes for a per-synapse delay). A padded
fan-out table (one row of `max_fan_out` entries per presynaptic neuron) wastes the difference
between each neuron's fan-out and the maximum: measured on `nj.connect.fixed_indegree` with
10^5 neurons and in-degree 100, the maximum fan-out is 143 for a mean of 100, so padding
would cost 11.4 instead of 8 bytes per synapse. The CSR arrays are therefore stored, and a
padded window is only formed, per step, for the neurons that spiked.

**One step** (pure-JAX path). The spiking neurons are compacted into a buffer of `B` slots,
each slot's fan-out window `indptr[i] : indptr[i] + max_fan_out` is gathered, and
`spike * weight` is scatter-added into the ring buffer at `(arrival slot, post)`. The cost
grows with spikes x maximum fan-out, not with the number of synapses.

**Never dropping a spike.** `B` is static for a run (the network's spike capacity, see
`nj.Network.fit_capacity`): the step has no `lax.switch` between buffer sizes and no loop
whose length depends on the data, which a GPU or TPU could only run by waiting on the host
every step, and which `vmap` would turn into "run every branch". A step in which a trial
emits more spikes than `B` reports how many it needed (`needed`); the network keeps the
largest such count in its state and `nj.simulate` reruns the chunk with a larger buffer, so no
spike is ever lost and the result does not depend on `B`: the delivered terms and their order
(ascending neuron, then row order) are the same for every buffer that holds the spikes.

**Compaction.** XLA:CPU pays a few microseconds per operation per step. `lax.top_k` over the
0/1 spike mask of each trial (in float32, its fast path) costs ~5 us for 4000 neurons, half
of a cumulative-sum compaction, which is used above `_TOPK_MAX` (trials x neurons), where
top-k's partial sort loses.

**Compiled CPU kernel.** The delivery is the kernel registry's entry `csr_deliver`
(`neurojax.kernels`): its reference is the pure-JAX path above, its CPU implementation one
call of a small C++ kernel through XLA's FFI for the whole delivery of a sending group (scan
of the spike vector, all its projections' rows; `neurojax/kernels/csr_deliver.cc`, FFI target
`nj_csr_deliver`). The kernel adds the same terms in the same order, so both give identical
results; the reference serves GPU/TPU, machines without a C++ compiler and
`nj.kernels.use("reference")`. Under `vmap` the vmapped axis becomes more trials of one call
on every path, as long as the step and the connectivity are shared (the weights may differ).
On the COBA benchmark the kernel makes a step 4.5x faster (0.089 s against 0.396 s for 1 s of
network activity, `benchmarks/RESULTS.md`).

**Gradients.** The delivered values are exactly `sum_pre spike[pre] * w[pre, post]`, the same
function the dense path computes (`_deliver_dense`); the entry's JVP differentiates that
function over all synapses (one segment-sum over the synapses, built only under differentiation), so
surrogate gradients reach every presynaptic neuron, not only those that spiked, and the
event-driven and dense paths give the same gradients.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..kernels import Example, Kernel, Sequential, call, register
from ..kernels._pallas import gpu_path, uniform_value
from ..kernels._pallas_deliver import EventSpec, deliver_gpu, deliver_tpu

__all__ = [
    "EventSpec",
    "EventArrays",
    "deliver",
    "arrival_slot",
    "capacity_for",
    "run_capped",
    "zero_after",
    "clear_slot",
    "zeros_after",
]

# Above this many (batch x presynaptic) neurons, compaction uses jnp.nonzero instead of top_k.
_TOPK_MAX = 1 << 17


class EventArrays(NamedTuple):
    """Device arrays of one projection's CSR layout."""

    indptr: jax.Array  # (n_pre + 1,) int32
    indices: jax.Array  # (nnz,) int32, postsynaptic neuron
    weights: jax.Array  # (nnz,) float
    delays: jax.Array | None  # (nnz,) integer delay in steps, or None


def arrival_slot(step: jax.Array, delay_steps, n_slots: int) -> jax.Array:
    """Ring slot read at the step where a spike emitted during `step` arrives.

    A spike emitted during step `k` (dated at its end) with a delay of `d` steps is read at the
    start of step `k + 1 + d`; step `k` reads slot `k mod D` before anything is written, so
    `D = max delay + 1` slots suffice.
    """
    if n_slots == 1:
        return jnp.zeros((), jnp.int32)
    return (step + 1 + delay_steps) % n_slots


def zero_after(x: jax.Array, dtype) -> jax.Array:
    """An exact zero of `dtype` per trial (`x.shape[:-1]`) that XLA can only compute once
    every entry of `x` exists.

    XLA updates a ring buffer in place only where it can see that every reader of the old
    contents runs first, and it sees data dependencies only (`lax.optimization_barrier` is
    removed before that analysis on CPU). Writes into a ring therefore take their zeros (or
    their spikes) through this value, computed from the spikes that the readers of the ring
    fed: the number of NaN entries, never below 0, capped at 0.
    """
    nan = jnp.sum(jnp.isnan(x), axis=-1, dtype=jnp.int32)
    return jnp.minimum(nan, 0).astype(dtype)


def _zero_for(ring: jax.Array, s: jax.Array) -> jax.Array:
    """`zero_after(s)` with the ring's batch axes `ring.shape[:-2]`."""
    zero = zero_after(s, ring.dtype)
    extra = zero.ndim - (ring.ndim - 2)
    if extra > 0:  # spikes with more batch axes than the ring
        zero = jnp.min(zero, axis=tuple(range(extra)))
    return zero[..., None, None]


def clear_slot(ring: jax.Array, step: jax.Array, s: jax.Array) -> jax.Array:
    """`ring` `(*batch, D, W)` with slot `step mod D` (the one read at the start of this
    step) set to zeros, written after the spikes `s` `(*batch, n)` exist (`zero_after`)."""
    row = jnp.broadcast_to(_zero_for(ring, s), ring.shape[:-2] + (1, ring.shape[-1]))
    return lax.dynamic_update_slice_in_dim(ring, row, step % ring.shape[-2], ring.ndim - 2)


def zeros_after(ring: jax.Array, s: jax.Array) -> jax.Array:
    """Zeros shaped like `ring`, computed after the spikes `s` exist (`zero_after`): the new
    contents of a one-slot ring, which XLA may then keep in the ring's own buffer."""
    return jnp.broadcast_to(_zero_for(ring, s), ring.shape)


def _compact(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """Per row of the float32 0/1 `mask` `(rows, n)`, the indices of its first `size` nonzero
    entries in ascending order `(rows, size)` and their validity."""
    n = mask.shape[-1]
    if mask.size <= _TOPK_MAX:
        # Ties among the ones break towards the lower index: ascending neuron order.
        vals, idx = lax.top_k(mask, size)
        return idx.astype(jnp.int32), vals > 0
    # A running count places each nonzero entry; entries past `size` fall off the end.
    pos = jnp.cumsum(mask > 0, axis=-1, dtype=jnp.int32) - 1
    pos = jnp.where(mask > 0, pos, size)
    rows = jnp.arange(mask.shape[0], dtype=jnp.int32)[:, None]
    src = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), mask.shape)
    idx = jnp.full((mask.shape[0], size), n, jnp.int32).at[rows, pos].set(src, mode="drop")
    # Padding entries point past the end: invalid, and clipped so that gathers stay in range.
    return jnp.minimum(idx, n - 1), idx < n


def capacity_for(capacity: int | None, n: int) -> int:
    """The spike buffer of one trial for `n` neurons: `capacity` (None: all of them), at
    most `n` and at least 1."""
    return max(1, n if capacity is None else min(int(capacity), n))


def needed(count: jax.Array, size: int, n: int) -> jax.Array:
    """The buffer a step needed and did not have: `count` where it exceeds `size`, else 0
    (always 0 when the buffer holds all `n` neurons)."""
    if size >= n:
        return jnp.zeros(count.shape, jnp.int32)
    return jnp.where(count > size, count, 0).astype(jnp.int32)


def _window(spec, arr, step, s_rows, trial, idx, valid, oob):
    """Flat ring targets and values `s * w` of the fan-out windows of the spikes `idx` of
    the trials `trial` (`s_rows`: the spikes, one row per trial)."""
    local = idx - spec.pre_offset
    if spec.n_pre != spec.n_source:
        valid = valid & (local >= 0) & (local < spec.n_pre)
        local = jnp.clip(local, 0, spec.n_pre - 1)
    value = jnp.where(valid, s_rows[trial, idx], 0)
    bounds = arr.indptr[local[:, None] + jnp.arange(2, dtype=jnp.int32)]
    start = bounds[:, 0]
    count = jnp.where(valid, bounds[:, 1] - start, 0)
    j = jnp.arange(spec.max_fan_out, dtype=jnp.int32)
    ok = j[None, :] < count[:, None]
    pos = jnp.where(ok, start[:, None] + j[None, :], 0)
    post = arr.indices[pos]
    d = spec.delay_steps if arr.delays is None else arr.delays[pos].astype(jnp.int32)
    slot = arrival_slot(step, d, spec.n_slots)
    row = trial * spec.n_slots
    target = (row[:, None] + slot) * spec.n_targets + spec.target_offset + post
    target = jnp.where(ok, target, oob)  # out of range: dropped by the scatter
    if arr.weights.ndim == 0:  # one weight for every synapse (the GPU path's constant)
        w = jnp.broadcast_to(arr.weights, pos.shape)
    elif arr.weights.ndim == 1:
        w = arr.weights[pos]
    else:  # one weight vector per trial (plastic weights): (*batch, nnz)
        nnz = arr.weights.shape[-1]
        w = arr.weights.reshape(-1)[trial[:, None] * nnz + pos]
    contrib = value[:, None] * w
    return target.reshape(-1), contrib.reshape(-1)


def run_capped(mask, fn, carry, size: int):
    """Apply `fn(trial, idx, valid, carry) -> carry` once to the first `size` nonzero entries
    of each row (trial) of the 0/1 `mask` `(trials, n)`, in ascending order, and return the
    new carry with the buffer each trial needed beyond `size` (`needed`).

    One static buffer per run: no `lax.switch` and no loop whose length depends on the data,
    so a GPU or TPU runs the step without waiting on the host, and `vmap` batches it as one
    computation. Entries beyond `size` are left out; the caller reports `needed` so that the
    driver reruns with a larger buffer (see `nj.Network.fit_capacity`).
    """
    rows, n = mask.shape
    count = jnp.sum(mask > 0, axis=-1, dtype=jnp.int32)
    idx, valid = _compact(mask, size)
    trial = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32)[:, None], idx.shape)
    carry = fn(trial.reshape(-1), idx.reshape(-1), valid.reshape(-1), carry)
    return carry, needed(count, size, n)


def _clear_flat(flat, shape, step, s):
    """The flat ring `flat` (of a ring shaped `shape`) with slot `step mod D` of every trial
    zeroed, written after the spikes `s` (`zero_after`).

    One scatter of a row-wide window per trial, on the flat view: XLA fuses a
    `dynamic_update_slice` with the reshape next to it, and such a fusion no longer writes
    in place (the whole ring would be copied); a scatter stays an operation of its own."""
    n_slots, width = shape[-2:]
    trials = math.prod(shape[:-2])
    zero = zero_after(s, flat.dtype)
    extra = zero.ndim - (len(shape) - 2)
    if extra > 0:
        zero = jnp.min(zero, axis=tuple(range(extra)))
    rows = jnp.broadcast_to(zero.reshape(-1, 1), (trials, width))
    at = jnp.arange(trials, dtype=jnp.int32) * (n_slots * width) + (step % n_slots) * width
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,)
    )
    return lax.scatter(flat, at[:, None], rows, dims, indices_are_sorted=True, unique_indices=True)


def _deliver_impl(specs, s, step, arrays, ring, capacity, clear=False):
    n_source = s.shape[-1]
    s_rows = s.reshape(-1, n_source)
    mask = (s_rows > 0).astype(jnp.float32)
    flat = ring.reshape(-1)
    if clear and ring.shape[-2] > 1:
        flat = _clear_flat(flat, ring.shape, step, s)
    oob = flat.shape[0]

    def fn(trial, idx, valid, flat_):
        parts = [
            _window(sp, arr, step, s_rows, trial, idx, valid, oob)
            for sp, arr in zip(specs, arrays, strict=True)
        ]
        target = jnp.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        contrib = jnp.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        return flat_.at[target].add(contrib.astype(flat_.dtype), mode="drop")

    size = capacity_for(capacity, n_source)
    flat, need = run_capped(mask, fn, flat, size)
    return flat.reshape(ring.shape), need.reshape(s.shape[:-1])


def _start(s, step, ring, fresh: bool, clear: bool) -> jax.Array:
    """The ring a delivery adds into: zeros for a `fresh` one, slot `step mod D` zeroed
    with `clear`, else `ring` (the zeros written after the spikes `s`, see `zero_after`)."""
    if fresh:
        return zeros_after(ring, s)
    if clear and ring.shape[-2] > 1:
        return clear_slot(ring, step, s)
    return ring


def _deliver_reference(s, step, ring, weights, tables, *, specs, fresh, capacity=None, clear=False):
    """The pure-JAX delivery (the registry entry's reference): compaction of each trial's
    spikes into a buffer of `capacity` slots, fan-out windows, one scatter-add into the
    ring. Leading dimensions of `s` and `ring` are trials. Returns the ring and, per trial,
    the buffer the step needed beyond `capacity` (0 when every spike was delivered)."""
    specs = tuple(EventSpec(*sp) for sp in specs)
    arrays = tuple(EventArrays(t[0], t[1], w, t[2]) for w, t in zip(weights, tables, strict=True))
    if fresh:
        return _deliver_impl(specs, s, step, arrays, zeros_after(ring, s), capacity)
    return _deliver_impl(specs, s, step, arrays, ring, capacity, clear=clear)


def _deliver_cpu(s, step, ring, weights, tables, *, specs, fresh, capacity=None, clear=False):
    """The same delivery through the compiled CPU kernel: one call for the whole group.

    The kernel treats every leading dimension of the spikes and the ring as trials; a weight
    vector with leading dimensions holds one row of nnz per trial. It adds the same terms in
    the same order as the reference, so both give identical results. It reads the whole
    spike vector, so it never needs a larger buffer than it has (`capacity` is not used).
    The kernel zeroes the slot of `clear` itself, in place: XLA runs an update of the ring
    made just before an aliased call on a copy of the whole ring.
    """
    specs = tuple(EventSpec(*sp) for sp in specs)
    buffers = []
    for w, (indptr, indices, delays) in zip(weights, tables, strict=True):
        delays = jnp.zeros((1,), jnp.int32) if delays is None else delays
        if w.ndim == 0:  # one weight for every synapse (the GPU path's form)
            w = jnp.broadcast_to(w, indices.shape)
        buffers += [indptr, indices, w.astype(ring.dtype).reshape(-1), delays]
    call = jax.ffi.ffi_call(
        DELIVER_TARGET,
        jax.ShapeDtypeStruct(ring.shape, ring.dtype),
        input_output_aliases={2: 0},
        vmap_method="sequential",
    )

    def attr(name, f=lambda x: x):
        return np.array([f(getattr(sp, name)) for sp in specs], np.int64)

    ring = call(
        s.astype(ring.dtype),
        jnp.asarray(step, jnp.int32),
        ring,
        *buffers,
        n_source=np.int64(specs[0].n_source),
        n_slots=np.int64(specs[0].n_slots),
        n_targets=np.int64(specs[0].n_targets),
        overwrite=np.int64(fresh),
        clear=np.int64(clear and not fresh),
        pre_offset=attr("pre_offset"),
        n_pre=attr("n_pre"),
        delay_steps=attr("delay_steps", lambda d: d or 0),
        target_offset=attr("target_offset"),
        per_synapse=np.array([t[2] is not None for t in tables], np.int64),
        weights_batched=np.array([w.ndim > 1 for w in weights], np.int64),
        n_post=attr("n_post"),
        sorted_rows=attr("sorted_rows", int),
    )
    return ring, jnp.zeros(s.shape[:-1], jnp.int32)


def _deliver_batching(axis_size, in_batched, args, apply):
    """Fold a vmapped axis into the trials of one call (`nj.parallel.sweep`), as long as the
    step and the connectivity are shared by the batch; the weights may differ per trial.
    Otherwise one call per element of the vmapped axis."""
    if in_batched[1] or any(jax.tree.leaves(in_batched[4])):
        return Sequential()(axis_size, in_batched, args, apply)
    return _fold_trials(axis_size, in_batched, args, apply)


def _deliver_batching_trials(axis_size, in_batched, args, apply):
    """The GPU and TPU slots' rule: the vmapped axis always becomes trials of one call, a
    vmapped step index included (both take one step per trial: `jax.vmap` over full network
    states batches the step counter). Only connectivity that differs per element of the
    vmapped axis (different CSR tables) runs one call per element."""
    if any(jax.tree.leaves(in_batched[4])):
        return Sequential()(axis_size, in_batched, args, apply)
    return _fold_trials(axis_size, in_batched, args, apply)


def _fold_trials(axis_size, in_batched, args, apply):
    s, step, ring, weights, tables = args
    s_b, step_b, ring_b, w_b, _ = in_batched
    trials = s.shape[1:-1] if s_b else s.shape[:-1]
    if not s_b:
        s = jnp.broadcast_to(s, (axis_size, *s.shape))
    if not ring_b:
        ring = jnp.broadcast_to(ring, (axis_size, *ring.shape))
    if step_b or jnp.ndim(step):  # one step per trial, `(axis_size, *trials)`
        inner = jnp.shape(step)[1:] if step_b else jnp.shape(step)
        step = jnp.reshape(step, ((axis_size,) if step_b else (1,)) + inner)
        step = step.reshape(step.shape + (1,) * (len(trials) - len(inner)))
        step = jnp.broadcast_to(step, (axis_size, *trials))
    folded = []
    for w, batched in zip(weights, w_b, strict=True):
        per_trial = w.ndim - batched > 1  # one row per inner trial already
        if not batched and per_trial:  # the same rows for every vmapped trial
            w = jnp.broadcast_to(w, (axis_size, *w.shape))
        elif batched and not per_trial:  # one row per vmapped trial, shared by inner trials
            w = jnp.broadcast_to(w[:, None], (axis_size, math.prod(trials), w.shape[-1]))
        folded.append(w)
    out = apply(s, step, ring, tuple(folded), tables)
    return out, jax.tree.map(lambda _: True, out)


def _dense_targets(spec, arr, step):
    """Presynaptic neuron (in the group's spike vector) and flat ring target of every synapse."""
    nnz = arr.indices.shape[0]
    counts = arr.indptr[1:] - arr.indptr[:-1]
    rows = jnp.repeat(jnp.arange(spec.n_pre, dtype=jnp.int32), counts, total_repeat_length=nnz)
    d = spec.delay_steps if arr.delays is None else arr.delays.astype(jnp.int32)
    slot = arrival_slot(step, d, spec.n_slots)
    return rows + spec.pre_offset, slot * spec.n_targets + spec.target_offset + arr.indices


def _dense_equivalent(spec, arr, s, ds, dw, step, flat):
    """Add the tangent `sum_pre (ds w + s dw)` over every synapse into the flat ring `flat`."""
    rows, target = _dense_targets(spec, arr, step)
    contrib = ds[..., rows] * arr.weights + s[..., rows] * dw
    return flat.at[..., target].add(contrib.astype(flat.dtype))


def _cleared(ring, step, fresh: bool, clear: bool) -> jax.Array:
    """`ring` as the delivery starts from it (zeros when `fresh`, slot `step mod D` zeroed
    with `clear`), for the functions of the derivative."""
    if fresh:
        return jnp.zeros_like(ring)
    if clear and ring.shape[-2] > 1:
        row = jnp.zeros(ring.shape[:-2] + (1, ring.shape[-1]), ring.dtype)
        return lax.dynamic_update_slice_in_dim(ring, row, step % ring.shape[-2], ring.ndim - 2)
    return ring


def _deliver_dense(s, step, ring, weights, tables, *, specs, fresh, capacity=None, clear=False):
    """The delivery computed over every synapse (`ring + sum_pre s w` at each arrival slot):
    the function whose derivative the delivery has."""
    specs = tuple(EventSpec(*sp) for sp in specs)
    batch = s.shape[:-1]
    flat = _cleared(ring, step, fresh, clear).reshape(batch + (-1,))
    for spec, w, (indptr, indices, delays) in zip(specs, weights, tables, strict=True):
        rows, target = _dense_targets(spec, EventArrays(indptr, indices, w, delays), step)
        flat = flat.at[..., target].add((s[..., rows] * w).astype(flat.dtype))
    return flat.reshape(ring.shape), jnp.zeros(batch, jnp.int32)


def _deliver_tangent(out, primals, tangents, *, specs, fresh, capacity=None, clear=False):
    """`d ring + sum_pre (ds w + s dw)` over every synapse: the derivative of the dense
    equivalent, so surrogate gradients reach every presynaptic neuron."""
    s, step, ring, weights, tables = primals
    ds, _, dring, dweights, _ = tangents
    specs = tuple(EventSpec(*sp) for sp in specs)
    batch = s.shape[:-1]
    flat = _cleared(dring, step, fresh, clear).reshape(batch + (-1,))
    for spec, w, dw, (indptr, indices, delays) in zip(
        specs, weights, dweights, tables, strict=True
    ):
        arr = EventArrays(indptr, indices, w, delays)
        flat = _dense_equivalent(spec, arr, s, ds, dw, step, flat)
    # The count of missing slots is an integer: its tangent is float0.
    return flat.reshape(ring.shape), np.zeros(batch, jax.dtypes.float0)


def _deliver_examples():
    """Two groups: two projections (one with per-synapse delays and per-trial weights) out of
    one group of seven neurons, two trials; one projection into a fresh one-slot ring."""
    rng = np.random.default_rng(0)
    f32 = jnp.float32

    def csr(n_pre, n_post, p):
        mask = rng.random((n_pre, n_post)) < p
        indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
        return jnp.asarray(indptr), jnp.asarray(np.nonzero(mask)[1].astype(np.int32))

    ip0, ix0 = csr(4, 3, 0.7)
    ip1, ix1 = csr(3, 2, 0.8)
    d1 = jnp.asarray(rng.integers(0, 3, ix1.shape[0]), jnp.int32)
    specs = (
        tuple(EventSpec(7, 0, 4, 3, int(np.diff(ip0).max()), 3, 1, 5, 0)),
        tuple(EventSpec(7, 4, 3, 2, int(np.diff(ip1).max()), 3, None, 5, 3)),
    )
    s = jnp.asarray(rng.random((2, 7)) < 0.6, f32)
    ring = jnp.asarray(rng.normal(size=(2, 3, 5)), f32)
    weights = (
        jnp.asarray(rng.uniform(0.1, 1.0, ix0.shape[0]), f32),
        jnp.asarray(rng.uniform(0.1, 1.0, (2, ix1.shape[0])), f32),
    )
    tables = ((ip0, ix0, None), (ip1, ix1, d1))
    step = jnp.asarray(4, jnp.int32)
    yield Example(
        (s, step, ring, weights, tables),
        dict(specs=specs, fresh=False),
        grad_argnums=(0, 2, 3),
        label="two-projections-delays",
    )
    ip2, ix2 = csr(6, 4, 0.5)
    spec = tuple(EventSpec(6, 0, 6, 4, int(np.diff(ip2).max()), 1, 0, 4, 0))
    yield Example(
        (
            jnp.asarray(rng.random(6) < 0.5, f32),
            jnp.asarray(0, jnp.int32),
            jnp.asarray(rng.normal(size=(1, 4)), f32),
            (jnp.asarray(rng.uniform(0.1, 1.0, ix2.shape[0]), f32),),
            ((ip2, ix2, None),),
        ),
        dict(specs=(spec,), fresh=True),
        grad_argnums=(0, 3),
        label="fresh-ring",
    )
    # The slot read this step (step mod D) zeroed before the spikes are added; one of the
    # delays (2 = D - 1) lands in it again.
    yield Example(
        (s, step, ring, weights, tables),
        dict(specs=specs, fresh=False, clear=True),
        grad_argnums=(0, 2, 3),
        label="clear-read-slot",
    )
    # A buffer smaller than the group that holds every trial's spikes: the same values.
    s3 = jnp.asarray([[1, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1]], f32)
    yield Example(
        (s3, step, ring, weights, tables),
        dict(specs=specs, fresh=False, capacity=2),
        grad_argnums=(0, 2, 3),
        label="capacity-below-group",
    )


def _start_trials(s, step, ring, clear: bool) -> jax.Array:
    """`_start` for the accelerator slots, whose `step` may be one index per trial (a folded
    vmapped step): each trial's read slot `step[trial] mod D` is zeroed with `clear`."""
    if not (clear and ring.shape[-2] > 1 and jnp.ndim(step)):
        return _start(s, step, ring, False, clear)
    slot = jnp.arange(ring.shape[-2], dtype=jnp.int32)
    here = slot == (jnp.asarray(step, jnp.int32) % ring.shape[-2])[..., None]
    return jnp.where(here[..., None], _zero_for(ring, s), ring)


def _deliver_gpu(s, step, ring, weights, tables, *, specs, fresh, capacity=None, clear=False):
    """The Pallas Triton delivery (`neurojax.kernels._pallas_deliver.deliver_gpu`): it reads
    the whole spike vector in tiles, so it delivers every spike and never needs a larger
    buffer. `step` is one index or one per trial (the GPU batching rule folds a vmapped
    network step's counter); with per-trial steps each trial clears its own slot."""
    ring = _start_trials(s, step, ring, clear and not fresh)
    out = deliver_gpu(s, step, ring, weights, tables, specs=specs, fresh=fresh, capacity=capacity)
    return out, jnp.zeros(s.shape[:-1], jnp.int32)


def _deliver_tpu(s, step, ring, weights, tables, *, specs, fresh, capacity=None, clear=False):
    """The dense TPU delivery: a matrix product costs the same whatever the spike count, so
    it delivers every spike (`capacity` unused) and never needs a larger buffer. `step` may
    be one index per trial, as for the GPU slot."""
    ring = _start_trials(s, step, ring, clear and not fresh)
    out = deliver_tpu(
        s, step, ring, weights, tables, specs=specs, fresh=fresh, capacity=None, sparse=_sparse
    )
    return out, jnp.zeros(s.shape[:-1], jnp.int32)


def _sparse(spec, s2, step, weights, table, ring):
    """The reference's scatter for one projection: the TPU slot's path for a projection
    whose dense weight tensor would not fit."""
    arr = EventArrays(table[0], table[1], weights, table[2])
    return _deliver_impl((spec,), s2.astype(ring.dtype), step, (arr,), ring, None)[0]


DELIVER_TARGET = "nj_csr_deliver"
DELIVER = register(
    Kernel(
        name="csr_deliver",
        reference=_deliver_reference,
        cpu=_deliver_cpu,
        gpu=_deliver_gpu,  # Pallas Triton: spike list, CSR rows, atomic adds
        tpu=_deliver_tpu,  # dense products per delay (XLA; Mosaic has no atomics)
        ffi_targets=((DELIVER_TARGET, "NjCsrDeliver"),),
        batching={
            "cpu": _deliver_batching,
            "gpu": _deliver_batching_trials,
            "tpu": _deliver_batching_trials,
        },
        differentiable=_deliver_dense,
        jvp=_deliver_tangent,
        examples=_deliver_examples,
        doc="Event-driven delivery of a group's spikes into its ring buffer (CSR rows).",
    )
)


def deliver(
    specs: tuple[EventSpec, ...],
    s,
    step,
    arrays,
    ring,
    *,
    fresh: bool = False,
    capacity: int | None = None,
    clear: bool = False,
):
    """Deliver the spikes `s` (`(*batch, n_source)`, 0/1) of a group of populations.

    Every projection in `specs`/`arrays` leaves one population of the group and owns the
    columns `[target_offset, target_offset + n_post)` of the group's ring buffer
    `(*batch, D, n_targets)`; `s * w` is added at the arrival slot of each synapse. The spikes
    are compacted once and scattered once for all of them. With `fresh=True` the content of
    `ring` is ignored and taken as zeros (a one-slot buffer that was just read), which spares
    the compiled kernel a fill. With `clear=True` slot `step mod D` (the one read at the
    start of this step) is zeroed first; the compiled kernel does it in place.

    The pure-JAX path compacts at most `capacity` spikes per trial (None: `n_source`, all
    of them) and returns, with the ring, the buffer each trial needed beyond it (`needed`,
    shape `batch`, 0 when every spike was delivered); an implementation that reads the whole
    spike vector (the CPU kernel) always returns 0.
    """
    weights = tuple(arr.weights for arr in arrays)
    tables = tuple((arr.indptr, arr.indices, arr.delays) for arr in arrays)
    gpu = gpu_path()
    if gpu:  # a projection of one weight passes it as one number (see `deliver_gpu`)
        weights = tuple(_one_weight(w) for w in weights)
    frozen = tuple(tuple(sp) for sp in specs)
    cap = None if capacity is None else capacity_for(capacity, specs[0].n_source)
    if cap is not None and cap >= specs[0].n_source:
        cap = None
    clear = bool(clear) and not fresh and specs[0].n_slots > 1
    out = call(
        DELIVER,
        s,
        step,
        ring,
        weights,
        tables,
        specs=frozen,
        fresh=bool(fresh),
        capacity=cap,
        clear=clear,
    )
    # The GPU slot reads the whole spike vector and never needs a larger buffer: its zero
    # is left out, so the network's peak is not updated with it every step.
    return out[0] if gpu else out


def _one_weight(w):
    """`w` as a 0-d array when it is concrete and of one value, else `w`."""
    value = uniform_value(w)
    return w if value is None else jnp.asarray(value, w.dtype)
