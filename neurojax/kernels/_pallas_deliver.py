r"""The accelerator implementations of the registry entry `csr_deliver` (event-driven delivery
of a group's spikes into its delay ring): a Pallas Triton kernel for GPUs and a dense
formulation for TPUs.

Both take exactly the arguments of the entry's reference
(`neurojax.network._propagation._deliver_reference`): the group's spikes `s`
`(*trials, n_source)`, the step index, the ring `(*trials, D, n_targets)`, one weight vector
per projection (`(nnz,)`, or `(*trials, nnz)` for per-trial weights), the CSR tables
`(indptr, indices, delays or None)` and the static `specs` and `fresh`; and the static
`capacity`: at most this many spikes per trial are delivered in a step, the lowest neuron
indices first (None: every neuron of the group).
"""

import jax
import jax.numpy as jnp
from jax import lax

from . import _pallas

__all__ = ["deliver_gpu", "deliver_tpu"]

_DENSE_MAX = 1 << 24  # largest dense (D, n_pre, n_post) weight tensor the TPU path builds


def _specs(specs):
    from ..network._propagation import EventSpec

    return tuple(EventSpec(*sp) for sp in specs)


def _capacity(capacity: int | None, n_source: int) -> int:
    if capacity is None:
        return n_source
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"csr_deliver: capacity must be None or an int >= 0, got {capacity!r}")
    return min(capacity, n_source)


def spike_list(s2: jax.Array, capacity: int, size: int) -> tuple[jax.Array, jax.Array]:
    """The indices of the spiking neurons of each trial of `s2` `(T, n)`, lowest first, in a
    list of `size >= capacity` entries padded with `n`, and how many of them to handle
    (at most `capacity`)."""
    n = s2.shape[-1]
    mask = s2 > 0
    idx = jax.vmap(lambda m: jnp.nonzero(m, size=size, fill_value=n)[0])(mask)
    count = jnp.minimum(jnp.sum(mask, axis=-1, dtype=jnp.int32), capacity)
    return idx.astype(jnp.int32), count.astype(jnp.int32)


def deliver_gpu(
    s,
    step,
    ring,
    weights,
    tables,
    *,
    specs,
    fresh,
    capacity=None,
    block_spikes: int = 16,
    block_synapses: int = 128,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """Event-driven delivery as one Pallas Triton kernel for all projections of a group.

    The spikes of each trial are first compacted into a list (`jnp.nonzero`, in XLA: at most
    `capacity`, lowest indices first). The kernel's grid is `(trial, block of
    block_spikes list entries)`; a program whose block lies past the trial's spike count
    returns at once. Each program walks the CSR rows of its spikes, `block_synapses`
    synapses of each row at a time over a static number of chunks
    (`ceil(max_fan_out / block_synapses)`), and adds `s * w` into the ring at
    `(trial, arrival slot, target_offset + post)` with masked atomic adds. Per-synapse delays
    give each synapse its own slot; per-trial weights are read at `trial * nnz + synapse`.

    The atomics add the same terms as the reference but in no fixed order, so float results
    agree with the reference to rounding, not to the bit.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    specs = _specs(specs)
    first = specs[0]
    n_source, n_slots, n_targets = first.n_source, first.n_slots, first.n_targets
    cap = _capacity(capacity, n_source)
    base = jnp.zeros_like(ring) if fresh else ring
    used = [
        (sp, w, tb)
        for sp, w, tb in zip(specs, weights, tables, strict=True)
        if sp.max_fan_out > 0 and tb[1].shape[0] > 0
    ]
    if cap == 0 or not used:
        return base
    interpret = _pallas.pallas_interpret()
    s2, _ = _pallas.flat_trials(s)
    n_trials = s2.shape[0]
    bs = _pallas.next_pow2(min(block_spikes, cap))
    n_blocks = -(-cap // bs)
    idx, count = spike_list(s2, cap, n_blocks * bs)
    vals = jnp.take_along_axis(s2, jnp.minimum(idx, n_source - 1), axis=1).astype(ring.dtype)
    step_arr = jnp.reshape(jnp.asarray(step, jnp.int32), (1,))

    inputs = [idx.reshape(-1), vals.reshape(-1), count, step_arr]
    layout = []
    for sp, w, (indptr, indices, delays) in used:
        nnz = indices.shape[0]
        per_trial = w.ndim > 1
        inputs += [indptr.astype(jnp.int32), indices.astype(jnp.int32)]
        inputs.append(w.astype(ring.dtype).reshape(-1))
        if delays is not None:
            inputs.append(delays.astype(jnp.int32))
        bc = _pallas.next_pow2(min(block_synapses, sp.max_fan_out))
        layout.append((sp, nnz, per_trial, delays is not None, bc, -(-sp.max_fan_out // bc)))
    ring_flat = base.reshape(-1)
    inputs.append(ring_flat)

    def kernel(*refs):
        idx_ref, val_ref, count_ref, step_ref = refs[:4]
        ring_ref = refs[-1]  # aliased with refs[-2], the ring handed in
        t = pl.program_id(0).astype(jnp.int32)
        b = pl.program_id(1).astype(jnp.int32)
        n = count_ref[t]

        @pl.when(b * bs < n)
        def _():
            at = t * (n_blocks * bs) + b * bs
            k = b * bs + jnp.arange(bs, dtype=jnp.int32)
            i = idx_ref[pl.ds(at, bs)]
            v = val_ref[pl.ds(at, bs)]
            live = k < n
            now = step_ref[0]
            pos = 4
            for sp, nnz, per_trial, has_delays, bc, n_chunks in layout:
                indptr_ref, indices_ref, w_ref = refs[pos : pos + 3]
                delay_ref = refs[pos + 3] if has_delays else None
                pos += 4 if has_delays else 3
                local = i - sp.pre_offset
                row_ok = live & (local >= 0) & (local < sp.n_pre)
                local = jnp.clip(local, 0, sp.n_pre - 1)
                start = indptr_ref[local]
                end = indptr_ref[local + 1]
                lane = jnp.arange(bc, dtype=jnp.int32)

                def chunk(
                    c,
                    carry,
                    sp=sp,
                    nnz=nnz,
                    per_trial=per_trial,
                    bc=bc,
                    lane=lane,
                    start=start,
                    end=end,
                    row_ok=row_ok,
                    delay_ref=delay_ref,
                    indices_ref=indices_ref,
                    w_ref=w_ref,
                ):
                    j = start[:, None] + c * bc + lane[None, :]
                    ok = row_ok[:, None] & (j < end[:, None])
                    jc = jnp.clip(j, 0, nnz - 1)
                    post = indices_ref[jc]
                    if n_slots == 1:
                        slot = jnp.zeros_like(jc)
                    else:
                        d = delay_ref[jc] if delay_ref is not None else sp.delay_steps
                        slot = lax.rem(now + 1 + d, jnp.int32(n_slots))
                    target = (t * n_slots + slot) * n_targets + sp.target_offset + post
                    w = w_ref[t * nnz + jc] if per_trial else w_ref[jc]
                    _pallas.atomic_add(ring_ref, target, v[:, None] * w, ok, interpret)
                    return carry

                lax.fori_loop(0, n_chunks, chunk, 0)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(ring_flat.shape, ring_flat.dtype),
        grid=(n_trials, n_blocks),
        input_output_aliases={len(inputs) - 1: 0},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="nj_csr_deliver",
    )(*inputs)
    return out.reshape(ring.shape)


def _keep_first(s2: jax.Array, cap: int) -> jax.Array:
    """`s2` `(T, n)` with only its first `cap` spikes of each trial (lowest indices)."""
    mask = s2 > 0
    rank = jnp.cumsum(mask, axis=-1, dtype=jnp.int32)
    return jnp.where(mask & (rank <= cap), s2, jnp.zeros_like(s2))


def deliver_tpu(s, step, ring, weights, tables, *, specs, fresh, capacity=None):
    """Delivery as dense matrix products, for TPUs (plain XLA, no Pallas kernel).

    Mosaic has no atomic adds, and a TPU computes a matrix product on its matrix unit at a
    rate that a scatter cannot approach, so each projection's CSR rows are summed into dense
    weight matrices, one per arrival offset (`(D, n_pre, n_post)`, one slice for a
    homogeneous delay; per trial for per-trial weights), the group's spikes (at most
    `capacity` per trial, lowest indices first) are multiplied by them, and each product is
    added at its slot of the ring. A Pallas Mosaic kernel for the product would do what XLA's
    dot already does on the matrix unit, so none is written. A projection whose dense tensor
    would exceed 2^24 entries goes through the reference's scatter instead.
    """
    from ..network._propagation import (
        EventArrays,
        _deliver_impl,
    )

    specs = _specs(specs)
    first = specs[0]
    n_source, n_slots, n_targets = first.n_source, first.n_slots, first.n_targets
    cap = _capacity(capacity, n_source)
    s2, _ = _pallas.flat_trials(s)
    if cap < n_source:
        s2 = _keep_first(s2, cap)
    n_trials = s2.shape[0]
    out = (jnp.zeros_like(ring) if fresh else ring).reshape(n_trials, n_slots, n_targets)
    now = jnp.asarray(step, jnp.int32)
    for sp, w, (indptr, indices, delays) in zip(specs, weights, tables, strict=True):
        nnz = indices.shape[0]
        if nnz == 0:
            continue
        per_trial = w.ndim > 1
        n_offsets = n_slots if delays is not None else 1
        size = n_offsets * sp.n_pre * sp.n_post * (n_trials if per_trial else 1)
        if size > _DENSE_MAX:
            arr = EventArrays(indptr, indices, w, delays)
            out = _deliver_impl((sp,), s2.astype(ring.dtype), now, (arr,), out, None)[0]
            continue
        counts = indptr[1:] - indptr[:-1]
        rows = jnp.repeat(jnp.arange(sp.n_pre, dtype=jnp.int32), counts, total_repeat_length=nnz)
        offs = delays.astype(jnp.int32) if delays is not None else jnp.zeros((nnz,), jnp.int32)
        wf = w.astype(ring.dtype)
        if per_trial:
            dense = jnp.zeros((n_trials, n_offsets, sp.n_pre, sp.n_post), ring.dtype)
            dense = dense.at[:, offs, rows, indices].add(wf.reshape(n_trials, nnz))
            pre = s2[:, sp.pre_offset : sp.pre_offset + sp.n_pre].astype(ring.dtype)
            got = jnp.einsum("tp,tdpq->tdq", pre, dense)
        else:
            dense = jnp.zeros((n_offsets, sp.n_pre, sp.n_post), ring.dtype)
            dense = dense.at[offs, rows, indices].add(wf)
            pre = s2[:, sp.pre_offset : sp.pre_offset + sp.n_pre].astype(ring.dtype)
            got = jnp.einsum("tp,dpq->tdq", pre, dense)
        if n_slots == 1:
            slots = jnp.zeros((n_offsets,), jnp.int32)
        else:
            d = jnp.arange(n_offsets, dtype=jnp.int32) if delays is not None else sp.delay_steps
            slots = (now + 1 + d) % n_slots
            slots = jnp.broadcast_to(slots, (n_offsets,))
        cols = sp.target_offset + jnp.arange(sp.n_post, dtype=jnp.int32)
        out = out.at[:, slots[:, None], cols[None, :]].add(got)
    return out.reshape(ring.shape)
