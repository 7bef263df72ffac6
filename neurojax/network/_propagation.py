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

**Never dropping a spike.** `B` is picked per step with `lax.switch` from a few static sizes
(the smallest that holds this step's spike count), so quiet steps pay for a small buffer and
bursts for a large one. When more neurons spike than the largest size holds, a loop delivers
them in successive buffers of the largest size until none is left: every spike is delivered
whatever the activity, and the result does not depend on which buffer size was used.

**Compaction.** XLA:CPU pays a few microseconds per operation per step. `lax.top_k` over the
0/1 spike mask (in float32, its fast path) costs ~5 us for 4000 neurons, half of
`jnp.nonzero`, whose cumulative sum is slow on CPU; `nonzero` is used above `_TOPK_MAX`
neurons, where top-k's partial sort loses.

**Compiled CPU kernel.** On CPU the whole delivery of a sending group (scan of the spike
vector, all its projections' rows) is one call of a small C++ kernel through XLA's FFI
(`_csr_kernel.cc`, built on first use, see `_kernel`): it adds the same terms in the same
order, so both paths give identical results; the pure-JAX path serves GPU/TPU and machines
without a C++ compiler. On the COBA benchmark the kernel makes a step 4.5x faster (0.089 s
against 0.396 s for 1 s of network activity, `benchmarks/RESULTS.md`).

**Gradients.** The delivered values are exactly `sum_pre spike[pre] * w[pre, post]`, the same
function the dense path computes; `deliver` has a custom JVP that differentiates that function
over all synapses (one segment-sum over the synapses, built only under differentiation), so
surrogate gradients reach every presynaptic neuron, not only those that spiked, and the
event-driven and dense paths give the same gradients.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _kernel

__all__ = ["EventSpec", "EventArrays", "deliver", "buckets_for", "arrival_slot"]

# Above this many (batch x presynaptic) neurons, compaction uses jnp.nonzero instead of top_k.
_TOPK_MAX = 1 << 17
_BUCKETS = (16, 64, 256, 1024, 4096, 16384)


class EventSpec(NamedTuple):
    """Static description of one projection for the event-driven path (hashable).

    The spikes handed to `deliver` may be those of a group of populations concatenated along
    the neuron axis (`n_source` neurons); the projection's presynaptic population occupies
    `[pre_offset, pre_offset + n_pre)` of it.
    """

    n_source: int
    pre_offset: int
    n_pre: int
    n_post: int
    max_fan_out: int
    n_slots: int  # ring-buffer length D (max delay in steps + 1), shared by the group's ring
    delay_steps: int | None  # homogeneous delay in steps; None when per synapse
    n_targets: int  # width of the group's ring (sum of the projections' n_post)
    target_offset: int  # where this projection's postsynaptic neurons start in the ring


class EventArrays(NamedTuple):
    """Device arrays of one projection's CSR layout."""

    indptr: jax.Array  # (n_pre + 1,) int32
    indices: jax.Array  # (nnz,) int32, postsynaptic neuron
    weights: jax.Array  # (nnz,) float
    delays: jax.Array | None  # (nnz,) integer delay in steps, or None


def buckets_for(n_sources: int) -> tuple[int, ...]:
    """The static spike-buffer sizes for `n_sources` (batch x presynaptic) neurons."""
    sizes = sorted({min(b, n_sources) for b in _BUCKETS})
    return tuple(sizes)


def arrival_slot(step: jax.Array, delay_steps, n_slots: int) -> jax.Array:
    """Ring slot read at the step where a spike emitted during `step` arrives.

    A spike emitted during step `k` (dated at its end) with a delay of `d` steps is read at the
    start of step `k + 1 + d`; step `k` reads slot `k mod D` before anything is written, so
    `D = max delay + 1` slots suffice.
    """
    if n_slots == 1:
        return jnp.zeros((), jnp.int32)
    return (step + 1 + delay_steps) % n_slots


def _compact(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """Indices of up to `size` nonzero entries of the float32 0/1 `mask`, and their validity."""
    if mask.shape[0] <= _TOPK_MAX:
        vals, idx = lax.top_k(mask, size)
        return idx.astype(jnp.int32), vals > 0
    n = mask.shape[0]
    idx = jnp.nonzero(mask, size=size, fill_value=n)[0].astype(jnp.int32)
    # Padding entries point past the end: invalid, and clipped so that gathers stay in range.
    return jnp.minimum(idx, n - 1), idx < n


def _window(spec, arr, step, s_flat, idx, valid, oob):
    """Flat ring targets and values `s * w` of the fan-out windows of the spikes `idx`."""
    local = idx % spec.n_source - spec.pre_offset
    trial = idx // spec.n_source
    if spec.n_pre != spec.n_source:
        valid = valid & (local >= 0) & (local < spec.n_pre)
        local = jnp.clip(local, 0, spec.n_pre - 1)
    value = jnp.where(valid, s_flat[idx], 0)
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
    if arr.weights.ndim == 1:
        w = arr.weights[pos]
    else:  # one weight vector per trial (plastic weights): (*batch, nnz)
        nnz = arr.weights.shape[-1]
        w = arr.weights.reshape(-1)[trial[:, None] * nnz + pos]
    contrib = value[:, None] * w
    return target.reshape(-1), contrib.reshape(-1)


def run_bucketed(mask, fn, carry, *, loop_size: int | None = None):
    """Apply `fn(idx, valid, carry) -> carry` to the nonzero entries of the 0/1 `mask`.

    The entries are compacted into a buffer whose size is picked per step from
    `buckets_for(mask.size)`; when they exceed the largest buffer, `fn` runs on successive
    buffers until none is left, so every entry is seen exactly once, in ascending order.

    With `loop_size`, no buffer size is picked: `fn` runs on successive buffers of
    `loop_size` entries in a `while_loop`. Use it when `carry` is large (plastic weights):
    XLA copies the operand of every `lax.switch` branch that updates it, while a loop updates
    its carry in place.
    """
    n_src = mask.shape[0]

    def drain(c, size):
        # fn on successive buffers of `size` entries until every entry has been seen.
        def body(state):
            c_, left = state
            idx, valid = _compact(left, size)
            c_ = fn(idx, valid, c_)
            return c_, left.at[jnp.where(valid, idx, n_src)].set(0.0, mode="drop")

        return lax.while_loop(lambda st: jnp.any(st[1] > 0), body, (c, mask))[0]

    if loop_size is not None:
        return drain(carry, min(loop_size, n_src))
    sizes = buckets_for(n_src)

    def branch(size):
        def f(c):
            idx, valid = _compact(mask, size)
            return fn(idx, valid, c)

        return f

    count = jnp.sum(mask).astype(jnp.int32)
    which = jnp.sum(count > jnp.asarray(sizes, jnp.int32)).astype(jnp.int32)
    overflow = functools.partial(drain, size=sizes[-1])
    return lax.switch(which, [branch(b) for b in sizes] + [overflow], carry)


def _deliver_impl(specs, s, step, arrays, ring):
    s_flat = s.reshape(-1)
    mask = (s_flat > 0).astype(jnp.float32)
    flat = ring.reshape(-1)
    oob = flat.shape[0]

    def fn(idx, valid, flat_):
        parts = [
            _window(sp, arr, step, s_flat, idx, valid, oob)
            for sp, arr in zip(specs, arrays, strict=True)
        ]
        target = jnp.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        contrib = jnp.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        return flat_.at[target].add(contrib.astype(flat_.dtype), mode="drop")

    return run_bucketed(mask, fn, flat).reshape(ring.shape)


def _kernel_call(specs, fresh, per_synapse, weights_batched, s, step, ring, *buffers):
    """One call of the compiled kernel; the leading dimensions of `s` and `ring` are trials.

    `per_synapse[p]`: projection `p` has per-synapse delays; `weights_batched[p]`: its
    weights hold one row of nnz per trial.
    """
    call = jax.ffi.ffi_call(
        _kernel.TARGET,
        jax.ShapeDtypeStruct(ring.shape, ring.dtype),
        input_output_aliases={2: 0},
        vmap_method="sequential",
    )

    def attr(name, f=lambda x: x):
        return np.array([f(getattr(sp, name)) for sp in specs], np.int64)

    return call(
        s.astype(ring.dtype),
        jnp.asarray(step, jnp.int32),
        ring,
        *buffers,
        n_source=np.int64(specs[0].n_source),
        n_slots=np.int64(specs[0].n_slots),
        n_targets=np.int64(specs[0].n_targets),
        overwrite=np.int64(fresh),
        pre_offset=attr("pre_offset"),
        n_pre=attr("n_pre"),
        delay_steps=attr("delay_steps", lambda d: d or 0),
        target_offset=attr("target_offset"),
        per_synapse=np.array(per_synapse, np.int64),
        weights_batched=np.array(weights_batched, np.int64),
    )


def _deliver_kernel(specs, s, step, arrays, ring, fresh):
    """The same delivery through the compiled CPU kernel: one call for the whole group.

    The kernel treats every leading dimension of the spikes and the ring as trials. Under
    `vmap` (`nj.parallel.sweep`) the vmapped axis becomes one more trial dimension of a
    single call, as long as the step and the connectivity are shared by the batch (the
    weights may differ per trial); otherwise the trials are delivered one call each.
    """
    buffers = []
    for arr in arrays:
        delays = jnp.zeros((1,), jnp.int32) if arr.delays is None else arr.delays
        buffers += [arr.indptr, arr.indices, arr.weights.astype(ring.dtype).reshape(-1), delays]
    per_synapse = tuple(arr.delays is not None for arr in arrays)
    weights_batched = tuple(arr.weights.ndim > 1 for arr in arrays)
    call = functools.partial(_kernel_call, specs, fresh, per_synapse, weights_batched)

    @jax.custom_batching.custom_vmap
    def deliver(s, step, ring, *buffers):
        return call(s, step, ring, *buffers)

    @deliver.def_vmap
    def _batched(axis_size, in_batched, s, step, ring, *buffers):
        s_b, step_b, ring_b, *buf_b = in_batched
        shared = not step_b and not any(b for i, b in enumerate(buf_b) if i % 4 != 2)
        if not shared:  # one kernel call per trial of the vmapped axis
            axes = [0 if b else None for b in in_batched]
            return jax.vmap(call, in_axes=axes)(s, step, ring, *buffers), True
        trials = s.shape[1:-1] if s_b else s.shape[:-1]
        if not s_b:
            s = jnp.broadcast_to(s, (axis_size, *s.shape))
        if not ring_b:
            ring = jnp.broadcast_to(ring, (axis_size, *ring.shape))
        buffers, flags = list(buffers), []
        for p, was_batched in enumerate(weights_batched):
            w, w_b = buffers[4 * p + 2], buf_b[4 * p + 2]
            if w_b or was_batched:
                nnz = buffers[4 * p + 1].shape[0]
                if not w_b:  # (trials * nnz,): the same rows for every vmapped trial
                    w = jnp.broadcast_to(w, (axis_size, *w.shape))
                elif not was_batched:  # (V, nnz): the same row for every inner trial
                    w = jnp.broadcast_to(
                        w.reshape(axis_size, 1, nnz), (axis_size, math.prod(trials), nnz)
                    )
                buffers[4 * p + 2] = w.reshape(-1)
            flags.append(w_b or was_batched)
        out = _kernel_call(specs, fresh, per_synapse, tuple(flags), s, step, ring, *buffers)
        return out, True

    return deliver(s, step, ring, *buffers)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 5))
def _deliver(specs, s, step, arrays, ring, fresh):
    def jax_path(s, step, arrays, ring):
        return _deliver_impl(specs, s, step, arrays, jnp.zeros_like(ring) if fresh else ring)

    if _kernel.available():
        return lax.platform_dependent(
            s,
            step,
            arrays,
            ring,
            cpu=functools.partial(_deliver_kernel, specs, fresh=fresh),
            default=jax_path,
        )
    return jax_path(s, step, arrays, ring)


def _dense_equivalent(spec, arr, s, ds, dw, step, flat):
    """Add the tangent `sum_pre (ds w + s dw)` over every synapse into the flat ring `flat`."""
    nnz = arr.indices.shape[0]
    counts = arr.indptr[1:] - arr.indptr[:-1]
    rows = jnp.repeat(jnp.arange(spec.n_pre, dtype=jnp.int32), counts, total_repeat_length=nnz)
    rows = rows + spec.pre_offset
    contrib = ds[..., rows] * arr.weights + s[..., rows] * dw
    d = spec.delay_steps if arr.delays is None else arr.delays.astype(jnp.int32)
    slot = arrival_slot(step, d, spec.n_slots)
    target = slot * spec.n_targets + spec.target_offset + arr.indices
    return flat.at[..., target].add(contrib.astype(flat.dtype))


@_deliver.defjvp
def _deliver_jvp(specs, fresh, primals, tangents):
    s, step, arrays, ring = primals
    ds, _, darrays, dring = tangents
    out = _deliver(specs, s, step, arrays, ring, fresh)
    batch = s.shape[:-1]
    flat = (jnp.zeros_like(dring) if fresh else dring).reshape(batch + (-1,))
    for spec, arr, darr in zip(specs, arrays, darrays, strict=True):
        flat = _dense_equivalent(spec, arr, s, ds, darr.weights, step, flat)
    return out, flat.reshape(ring.shape)


def deliver(specs: tuple[EventSpec, ...], s, step, arrays, ring, *, fresh: bool = False):
    """Deliver the spikes `s` (`(*batch, n_source)`, 0/1) of a group of populations.

    Every projection in `specs`/`arrays` leaves one population of the group and owns the
    columns `[target_offset, target_offset + n_post)` of the group's ring buffer
    `(*batch, D, n_targets)`; `s * w` is added at the arrival slot of each synapse. The spikes
    are compacted once and scattered once for all of them. With `fresh=True` the content of
    `ring` is ignored and taken as zeros (a one-slot buffer that was just read), which spares
    the compiled kernel a fill.
    """
    return _deliver(tuple(specs), s, step, tuple(arrays), ring, bool(fresh))
