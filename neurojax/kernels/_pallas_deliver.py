r"""The accelerator implementations of the registry entry `csr_deliver` (event-driven delivery
of a group's spikes into its delay ring): a Pallas Triton kernel for GPUs and a dense
formulation for TPUs.

Both take exactly the arguments of the entry's reference
(`neurojax.network._propagation._deliver_reference`): the group's spikes `s`
`(*trials, n_source)`, the step index, the ring `(*trials, D, n_targets)`, one weight vector
per projection (`(nnz,)`, or `(*trials, nnz)` for per-trial weights), the CSR tables
`(indptr, indices, delays or None)` and the static `specs` and `fresh`; and the static
`capacity`. The TPU formulation delivers at most `capacity` spikes per trial in a step, the
lowest neuron indices first (None: every neuron of the group); the GPU kernel reads the whole
spike vector and delivers every spike (`capacity` is checked, as the CPU kernel ignores it).
The GPU kernel also takes one step index per trial (`(T,)`), which its batching rule passes
for a vmapped network step.

Neither imports anything from the network layer: `EventSpec` (the static layout of one
projection) is defined here and re-exported by `neurojax.network._propagation`, and the TPU
formulation's sparse path for projections too large to densify is the caller's function.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import _pallas

__all__ = ["EventSpec", "deliver_gpu", "deliver_tpu"]

_DENSE_MAX = 1 << 24  # largest dense (D, n_pre, n_post) weight tensor the TPU path builds


class EventSpec(NamedTuple):
    """Static description of one projection for the event-driven path (hashable): the
    delivery kernels' static argument, re-exported by `neurojax.network._propagation`.

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
    sorted_rows: bool = False  # every row lists its targets in ascending order (the CPU
    # kernel then splits a step's delivery by ring columns, `EventLayout.sorted_rows`)


def _specs(specs):
    return tuple(EventSpec(*sp) for sp in specs)


def _capacity(capacity: int | None, n_source: int) -> int:
    if capacity is None:
        return n_source
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"csr_deliver: capacity must be None or an int >= 0, got {capacity!r}")
    return min(capacity, n_source)


def _programs(programs: int | None, n_trials: int, n_tiles: int) -> int:
    """Programs per trial: `programs`, or about 1024 programs in the whole grid (several waves
    of a GPU's streaming multiprocessors), at least 1 and at most one per tile."""
    if programs is None:
        programs = -(-1024 // n_trials)
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"csr_deliver: programs must be None or an int >= 1, got {programs!r}")
    return max(1, min(programs, n_tiles))


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
    programs: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """Event-driven delivery as one Pallas Triton kernel for all projections of a group, with
    no spike list built outside it and no spike capacity.

    The grid is `(trial, P)`, `P` programs per trial (`programs`; default about 1024
    programs in the grid), fixed whatever the spike count. The group's neurons are cut into
    tiles of `block_spikes`; program `g` walks tiles `g, g + P, g + 2P, ...` in a loop inside
    the kernel: it loads the tile's spikes (one read of the spike vector in all), skips a
    tile without a spike (`lax.cond`: one load, no other work) and, for a tile with spikes,
    walks the CSR rows of its spiking neurons, `block_synapses` synapses of each row at a
    time over a static number of chunks (`ceil(max_fan_out / block_synapses)`), adding
    `s * w` into the ring at `(trial, arrival slot, target_offset + post)` with masked atomic
    adds. A burst costs more tiles with work, never a rerun: every spike is delivered
    (`capacity` is checked and otherwise unused, as by the CPU kernel, which also reads the
    whole spike vector). Weights that are concrete and all one value (a projection built with
    one weight) are a constant of the kernel, neither broadcast to an array nor read; a
    0-d weight (the network's GPU path passes one for such a projection) is one scalar read.
    Per-synapse delays give each synapse its own slot; per-trial weights
    are read at `trial * nnz + synapse`; `step` is one step index, or one per trial (`(T,)`,
    a vmapped network step's counter, folded in by the GPU batching rule).

    **Barriers.** None inside the kernel: programs only add into the ring, with atomics, and
    read nothing any program writes. The ring handed in (aliased with the output) is
    complete before the kernel starts: XLA orders the kernel after the operations that
    produce its inputs.

    The atomics add the same terms as the reference but in no fixed order, so float results
    agree with the reference to rounding, not to the bit.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    specs = _specs(specs)
    first = specs[0]
    n_source, n_slots, n_targets = first.n_source, first.n_slots, first.n_targets
    _capacity(capacity, n_source)  # checked; every spike is delivered
    base = jnp.zeros_like(ring) if fresh else ring
    used = [
        (sp, w, tb)
        for sp, w, tb in zip(specs, weights, tables, strict=True)
        if sp.max_fan_out > 0 and tb[1].shape[0] > 0
    ]
    if not used:
        return base
    interpret = _pallas.pallas_interpret()
    s2, lead = _pallas.flat_trials(s)
    n_trials = s2.shape[0]
    bs = _pallas.next_pow2(min(block_spikes, n_source))
    n_tiles = -(-n_source // bs)
    n_prog = _programs(programs, n_trials, n_tiles)
    rounds = -(-n_tiles // n_prog)
    steps = jnp.asarray(step, jnp.int32)
    if steps.ndim:  # one step per trial: the trial axes of `s`
        steps = jnp.broadcast_to(steps.reshape(steps.shape + (1,) * (len(lead) - steps.ndim)), lead)
    steps = jnp.broadcast_to(steps.reshape(-1), (n_trials,)) if steps.ndim else steps.reshape(1)
    per_trial_step = steps.shape[0] == n_trials

    inputs = [s2.astype(ring.dtype).reshape(-1), steps]
    layout = []
    for sp, w, (indptr, indices, delays) in used:
        nnz = indices.shape[0]
        per_trial = w.ndim > 1
        inputs += [indptr.astype(jnp.int32), indices.astype(jnp.int32)]
        # A weight known to be one value (concrete and uniform) is a constant of the kernel,
        # not an array broadcast and read from memory every step.
        const = _pallas.uniform_value(w)
        if const is None:
            inputs.append(w.astype(ring.dtype).reshape(-1))
        scalar = w.ndim == 0  # one weight for every synapse, read once
        if delays is not None:
            inputs.append(delays.astype(jnp.int32))
        bc = _pallas.next_pow2(min(block_synapses, sp.max_fan_out))
        n_chunks = -(-sp.max_fan_out // bc)
        layout.append((sp, nnz, per_trial, delays is not None, bc, n_chunks, const, scalar))
    ring_flat = base.reshape(-1)
    inputs.append(ring_flat)

    def deliver_tile(refs, t, now, i, v, live):
        pos = 2
        ring_ref = refs[-1]  # aliased with refs[-2], the ring handed in
        for sp, nnz, per_trial, has_delays, bc, n_chunks, const, scalar in layout:
            n_w = 0 if const is not None else 1
            indptr_ref, indices_ref = refs[pos : pos + 2]
            w_ref = refs[pos + 2] if const is None else None
            delay_ref = refs[pos + 2 + n_w] if has_delays else None
            pos += 2 + n_w + (1 if has_delays else 0)
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
                const=const,
                scalar=scalar,
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
                if const is not None:
                    w = jnp.full(jc.shape, const, ring_flat.dtype)
                elif scalar:
                    w = jnp.broadcast_to(w_ref[0], jc.shape)
                else:
                    w = w_ref[t * nnz + jc] if per_trial else w_ref[jc]
                _pallas.atomic_add(ring_ref, target, v[:, None] * w, ok, interpret)
                return carry

            lax.fori_loop(0, n_chunks, chunk, 0)

    def kernel(*refs):
        s_ref, step_ref = refs[:2]
        t = pl.program_id(0).astype(jnp.int32)
        g = pl.program_id(1).astype(jnp.int32)
        now = step_ref[t] if per_trial_step else step_ref[0]
        lane = jnp.arange(bs, dtype=jnp.int32)

        def tile(r, carry):
            i = (g + r * n_prog) * bs + lane
            inside = i < n_source
            at = t * n_source + jnp.minimum(i, n_source - 1)
            v = jnp.where(inside, s_ref[at], 0)
            live = inside & (v != 0)
            lax.cond(
                jnp.sum(live.astype(jnp.int32)) > 0,  # Triton has no reduce_or
                lambda: deliver_tile(refs, t, now, i, v, live),
                lambda: None,
            )
            return carry

        lax.fori_loop(0, rounds, tile, 0)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(ring_flat.shape, ring_flat.dtype),
        grid=(n_trials, n_prog),
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


def deliver_tpu(s, step, ring, weights, tables, *, specs, fresh, capacity=None, sparse=None):
    """Delivery as dense matrix products, for TPUs (plain XLA, no Pallas kernel).

    Mosaic has no atomic adds, and a TPU computes a matrix product on its matrix unit at a
    rate that a scatter cannot approach, so each projection's CSR rows are summed into dense
    weight matrices, one per arrival offset (`(D, n_pre, n_post)`, one slice for a
    homogeneous delay; per trial for per-trial weights), the group's spikes (at most
    `capacity` per trial, lowest indices first) are multiplied by them, and each product is
    added at its slot of the ring. A Pallas Mosaic kernel for the product would do what XLA's
    dot already does on the matrix unit, so none is written.

    A projection whose dense tensor would exceed `_DENSE_MAX` (2^24) entries (the full-scale
    microcircuit's largest is 77 169^2 floats per delay, 24 GB) goes through
    `sparse(spec, s2, step, weights, table, ring) -> ring`, the caller's sparse delivery
    (the network passes the reference's scatter); without one the call is refused with the
    projection and the size named, before anything runs out of memory.

    `step` is one step index or one per trial (`(T,)`: each trial adds at its own slots).
    """
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
    per_trial_step = now.ndim > 0  # one step per trial (a vmapped network step's counter)
    if per_trial_step:
        now = jnp.broadcast_to(now.reshape(-1), (n_trials,))
    for sp, w, (indptr, indices, delays) in zip(specs, weights, tables, strict=True):
        nnz = indices.shape[0]
        if nnz == 0:
            continue
        per_trial = w.ndim > 1
        n_offsets = n_slots if delays is not None else 1
        size = n_offsets * sp.n_pre * sp.n_post * (n_trials if per_trial else 1)
        if size > _DENSE_MAX:
            if sparse is None:
                raise ValueError(
                    f"csr_deliver (TPU): the dense weights of the projection into targets "
                    f"[{sp.target_offset}, {sp.target_offset + sp.n_post}) would hold {size} "
                    f"entries ({size * jnp.dtype(ring.dtype).itemsize / 2**30:.2f} GiB; "
                    f"{n_offsets} delay slot(s) x {sp.n_pre} x {sp.n_post}), above the limit "
                    f"of {_DENSE_MAX}; pass sparse= (the network passes its scatter)"
                )
            table = (indptr, indices, delays)
            if per_trial_step:
                w_t = w.reshape(n_trials, nnz) if per_trial else w
                out = jax.vmap(
                    lambda s_t, n_t, w_t, o_t, sp=sp, table=table: sparse(
                        sp, s_t[None], n_t, w_t, table, o_t[None]
                    )[0],
                    in_axes=(0, 0, 0 if per_trial else None, 0),
                )(s2, now, w_t, out)
            else:
                out = sparse(sp, s2, now, w, table, out)
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
        cols = sp.target_offset + jnp.arange(sp.n_post, dtype=jnp.int32)
        if n_slots == 1:
            slots = jnp.zeros((n_offsets,), jnp.int32)
        else:
            d = jnp.arange(n_offsets, dtype=jnp.int32) if delays is not None else sp.delay_steps
            if per_trial_step:  # (T, n_offsets): each trial's own arrival slots
                slots = (now[:, None] + 1 + jnp.broadcast_to(d, (n_offsets,))) % n_slots
                trial = jnp.arange(n_trials, dtype=jnp.int32)[:, None, None]
                out = out.at[trial, slots[:, :, None], cols[None, None, :]].add(got)
                continue
            slots = (now + 1 + d) % n_slots
            slots = jnp.broadcast_to(slots, (n_offsets,))
        out = out.at[:, slots[:, None], cols[None, :]].add(got)
    return out.reshape(ring.shape)
