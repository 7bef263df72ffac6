r"""The registry entry `lif_step_spikes`: one step of a LIF population that also writes the
step's spike list, and its Pallas Triton implementation for GPUs.

Event-driven delivery (`csr_deliver`) starts from a list of the neurons that spiked. Built
after the neuron update, that list costs a second pass over the population (a compaction:
`jnp.nonzero`, a prefix sum or a partial sort). GeNN instead appends each spike to the list
inside the neuron update itself, and so does this kernel: each program updates a block of
neurons, counts its spikes, reserves that many entries of its trial's list with one atomic
add on the trial's counter, and writes its spiking neurons' indices there (in ascending order
within the block, at the offsets of an exclusive prefix sum of the block's spikes).

**Arguments** (as `lif_run`'s, for one step): the state `v`, `refractory` and the step's
`v_inf = v_rest + r_m i` and decay factor `c` (`exp(-dt / tau_m)`, or `dt / tau_m` with
`euler`), `v_reset`, `v_th`, `t_ref`, all `(*trials, n)`, and `dts = (dt, dt / 2)`. Static:
`euler` and `capacity` (the length of each trial's list; None: `n`).

**Results**: `(v, refractory, spikes, index, count)`: the new state, the 0/1 spikes in `v`'s
dtype, `index` `(*trials, capacity)` int32 the spiking neurons (entries past the count hold
`n`) and `count` `(*trials,)` int32 the number of spikes of the step, which exceeds
`capacity` when the list overflowed (the entries then hold `capacity` of the spikes and the
caller decides what to do about the rest).

**Order.** The reference lists the spikes in ascending order (lowest first under overflow).
On a GPU the blocks reserve their entries in whatever order their atomics land, so the list
holds the same set of neurons in block order, not sorted, and under overflow the `capacity`
neurons kept are those of the first blocks to reserve; `v`, `refractory`, `spikes` and
`count` are exact. Under interpret mode the grid runs in order, which reproduces the
reference's list exactly.

**In a network step.** The spike list replaces the compaction at the start of delivery: a
step calls `lif_step_spikes` for a group of LIF populations (its parameters broadcast to the
group, as `lif_run` takes them), then hands the list to the delivery (`index[:, :count]` are
the senders) instead of compacting `spikes`. The GPU delivery kernel `csr_deliver`
(`neurojax.kernels._pallas_deliver.deliver_gpu`) builds its own list with `jnp.nonzero`
today; feeding it this list is a change of the network step, not of either kernel.

The spikes carry no surrogate gradient (the derivative of the entry is that of its reference,
whose threshold is a comparison): the entry is for simulation; training goes through
`LIF.step`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from . import _pallas
from ._registry import Example, Fold, Kernel, register

__all__ = ["LIF_STEP_SPIKES", "lif_step_spikes_reference", "lif_step_spikes_gpu"]


def _update(v, r, v_inf, c, v_reset, v_th, t_ref, dt, *, euler):
    """`LIF.step` on precomputed `v_inf` and `c` (as `lif_run` computes it): the new `v`,
    the new refractory time and the spikes (bool). Shared by the reference and the kernel
    body, so both run the same operations."""
    from ..neurons._base import refractory_clamped, refractory_next

    clamped = refractory_clamped(r, dt)
    v_free = v + c * (v_inf - v) if euler else v_inf + (v - v_inf) * c
    v1 = jnp.where(clamped, v_reset, v_free)
    spike = (v1 - v_th) / (v_th - v_reset) >= 0
    v2 = jnp.where(spike, v_reset, v1)
    r2 = refractory_next(r, clamped, spike.astype(r.dtype), t_ref, dt)
    return v2, r2, spike


def _capacity(capacity, n: int) -> int:
    if capacity is None:
        return n
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"lif_step_spikes: capacity must be None or an int >= 1, got {capacity!r}")
    return capacity


def lif_step_spikes_reference(v, r, v_inf, c, v_reset, v_th, t_ref, dts, *, euler, capacity=None):
    """One LIF step and the spike list, in pure JAX (the entry's reference): the update,
    then `jnp.nonzero` per trial (ascending, the lowest `capacity` under overflow)."""
    n = v.shape[-1]
    cap = _capacity(capacity, n)
    v2, r2, spike = _update(v, r, v_inf, c, v_reset, v_th, t_ref, dts[0], euler=euler)
    flat = spike.reshape(-1, n)
    index = jax.vmap(lambda m: jnp.nonzero(m, size=cap, fill_value=n)[0])(flat).astype(jnp.int32)
    count = jnp.sum(flat, axis=-1, dtype=jnp.int32)
    lead = v.shape[:-1]
    return v2, r2, spike.astype(v.dtype), index.reshape(*lead, cap), count.reshape(lead)


def lif_step_spikes_gpu(
    v,
    r,
    v_inf,
    c,
    v_reset,
    v_th,
    t_ref,
    dts,
    *,
    euler,
    capacity=None,
    block: int = 256,
    num_warps: int = 4,
    num_stages: int = 1,
):
    """One LIF step and the spike list in one Pallas Triton kernel (module docstring).

    The grid is `(trial, block of `block` neurons)`; each program loads its block of the
    seven state and parameter arrays, applies the update, stores `v`, `refractory` and the
    spikes, then reserves its spikes' entries of the trial's list with one atomic add on the
    trial's counter and writes their indices (masked stores; entries past `capacity` are
    dropped, the counter still counts them).
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    interpret = _pallas.pallas_interpret()
    n = v.shape[-1]
    cap = _capacity(capacity, n)
    lead = v.shape[:-1]
    arrays = [
        jnp.broadcast_to(x, v.shape).reshape(-1, n) for x in (v, r, v_inf, c, v_reset, v_th, t_ref)
    ]
    n_trials = arrays[0].shape[0]
    bn = _pallas.next_pow2(min(block, n))
    n_blocks = -(-n // bn)
    index0 = jnp.full((n_trials * cap,), n, jnp.int32)
    count0 = jnp.zeros((n_trials,), jnp.int32)
    dts = jnp.asarray(dts).astype(v.dtype)

    def kernel(
        v_ref,
        r_ref,
        vi_ref,
        c_ref,
        vr_ref,
        vt_ref,
        tr_ref,
        dts_ref,
        _i0,
        _c0,
        v_out,
        r_out,
        s_out,
        index_ref,
        count_ref,
    ):
        t = pl.program_id(0).astype(jnp.int32)
        b = pl.program_id(1).astype(jnp.int32)
        v2, r2, spike = _update(
            v_ref[...],
            r_ref[...],
            vi_ref[...],
            c_ref[...],
            vr_ref[...],
            vt_ref[...],
            tr_ref[...],
            dts_ref[0],
            euler=euler,
        )
        v_out[...] = v2
        r_out[...] = r2
        s_out[...] = spike.astype(s_out.dtype)
        k = b * bn + jnp.arange(bn, dtype=jnp.int32)
        m = (spike & (k < n)).astype(jnp.int32)
        total = jnp.sum(m, dtype=jnp.int32)
        before = jnp.cumsum(m, dtype=jnp.int32) - m
        base = plgpu.atomic_add(count_ref, (t,), total)
        slot = base + before
        ok = (m > 0) & (slot < cap)
        at = t * cap + jnp.minimum(slot, cap - 1)
        if interpret:
            # Pallas's interpreted masked store also writes its masked lanes: aim them past the end.
            index_ref[jnp.where(ok, at, n_trials * cap)] = k
        else:
            plgpu.store(index_ref.at[at], k, mask=ok)

    blocked = pl.BlockSpec((None, bn), lambda t, b: (t, b))
    whole = pl.no_block_spec
    v2, r2, s2, index, count = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct(arrays[0].shape, v.dtype),
            jax.ShapeDtypeStruct(arrays[1].shape, r.dtype),
            jax.ShapeDtypeStruct(arrays[0].shape, v.dtype),
            jax.ShapeDtypeStruct(index0.shape, jnp.int32),
            jax.ShapeDtypeStruct(count0.shape, jnp.int32),
        ),
        grid=(n_trials, n_blocks),
        in_specs=[blocked] * 7 + [whole, whole, whole],
        out_specs=(blocked, blocked, blocked, whole, whole),
        input_output_aliases={8: 3, 9: 4},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="nj_lif_step_spikes",
    )(*arrays, dts, index0, count0)
    return (
        v2.reshape(v.shape),
        r2.reshape(r.shape),
        s2.reshape(v.shape),
        index.reshape(*lead, cap),
        count.reshape(lead),
    )


def _examples():
    rng = np.random.default_rng(3)
    n = 300  # two blocks of the kernel, the second partial
    f32 = jnp.float32
    v = jnp.asarray(rng.uniform(-70.0, -54.0, (2, n)), f32)
    r = jnp.asarray(np.where(rng.random((2, n)) < 0.2, 1.0, 0.0), f32)
    v_inf = jnp.asarray(rng.uniform(-60.0, -20.0, (2, n)), f32)
    decay = jnp.full((2, n), np.exp(-0.1 / 10.0), f32)
    full = [jnp.full((2, n), x, f32) for x in (-70.0, -55.0, 2.0)]
    args = (v, r, v_inf, decay, *full, jnp.asarray([0.1, 0.05], f32))
    for capacity, euler in ((None, False), (16, True)):
        yield Example(
            args,
            dict(euler=euler, capacity=capacity),
            grad_argnums=(0, 2),
            vmap_argnums=(0, 2),
            label=f"capacity{capacity}-{'euler' if euler else 'exact'}",
        )


LIF_STEP_SPIKES = register(
    Kernel(
        name="lif_step_spikes",
        reference=lif_step_spikes_reference,
        gpu=lif_step_spikes_gpu,
        # Neurons are independent: a vmapped axis becomes more trials of one call.
        batching=Fold(trial=(0, 1, 2, 3, 4, 5, 6), shared=(7,)),
        examples=_examples,
        doc="One LIF step that also appends the step's spikes to each trial's spike list.",
    )
)
