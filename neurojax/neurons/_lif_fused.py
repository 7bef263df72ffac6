"""A whole `simulate` run of an uncoupled `LIF` population in one compiled CPU kernel, or
one Pallas Triton kernel on a GPU (the entry's `gpu` slot, `_lif_run_gpu`, which also records
state fields: on a GPU, and under `nj.kernels.interpret("gpu")`, `simulate` hands it runs that
record `v` or `refractory` too).

`nj.simulate` takes this path by itself, through `LIF.fused_run`, when it can give exactly the
numbers of its general `lax.scan` over `LIF.step`: the model is an `nj.LIF` (or a subclass
that keeps `LIF.step`) with an `nj.LIFState`, the input is `None` or
one constant float array, spikes are recorded with the default `nj.Record(spikes="raster")`
(the bool raster, or counts per window with `record_every > 1`), no state field is recorded, and
neither `check`, `checkpoint` nor `truncate_backprop` is asked for. The run is the kernel
`"lif_run"` of the registry (`neurojax.kernels`): on CPU, with the compiled library
available, one call of `nj_lif_run` (`neurojax/kernels/lif_run.cc`) runs all steps, neuron
block by neuron block, with each block's state in the L1 cache; elsewhere, and in
`nj.kernels.use("reference")`, its reference runs the same arithmetic as a pure-JAX scan.

Both paths compute the same operations in the same order (`LIF.step`, with the parameters
broadcast to the population and the loop-invariant `v_inf` and decay factor computed once),
so the final state and the recorded spikes are identical to the general path's; the tests compare
them bit for bit. One caveat, which the general path shares: under an outer `jax.jit` that
closes over the input or the parameters as constants, XLA may fold the loop-invariant
arithmetic at compile time (without the fused multiply-add it uses at run time, and with its
own `exp`), and it need not fold the same parts of the two programs, so they can then differ
in the last bit. `nj.simulate` itself passes model and input as traced arguments.

Derivatives go through the pure-JAX scan (the registry's JVP through the reference), so
`grad` of a loss on the final state is the general path's derivative, up to the rounding of
the tangent arithmetic; the surrogate does not enter, because the bool raster (or the
integer counts) carries no gradient and the reset is detached.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..kernels import _pallas, _pallas_run
from . import _lif
from ._base import input_current, refractory_clamped, refractory_next
from ._fused import eligible, scan_spikes, spikes_struct

__all__ = [
    "applies",
    "run",
    "lif_update",
    "LIF_RUN",
    "LIF_STEP_SPIKES",
    "lif_step_spikes_reference",
    "lif_step_spikes_gpu",
]


def applies(model: Any, state: Any, inputs: Any, **options: Any) -> bool:
    """Whether `simulate` can run this configuration through `run` with identical results."""
    if not isinstance(model, _lif.LIF) or type(state) is not _lif.LIFState:
        return False
    if type(model).step is not _lif.LIF.step:  # `run` reproduces `LIF.step`, not an override
        return False
    return eligible(
        (state.v, state.refractory),
        (model.tau_m, model.v_rest, model.v_reset, model.v_th, model.r_m, model.t_ref),
        inputs,
        recordable=FIELDS,
        **options,
    )


def run(
    model: "_lif.LIF",
    state: "_lif.LIFState",
    inputs: Any,
    dt: float,
    n_rec: int,
    record_every: int = 1,
    record: tuple[str, ...] | None = None,
):
    """Final state and recorded spikes of `n_rec * record_every` steps (see `applies`): the
    bool raster `(n_rec, *shape)` with `record_every=1`, else the spike counts of each window
    of `record_every` steps, in `simulate`'s count dtype; with `record` (field names), also
    `{name: (n_rec, *shape)}`, each field at the end of each window."""
    v = state.v
    dtype, shape = v.dtype, v.shape
    # The loop-invariant part of `LIF.step`, computed as it computes it.
    v_inf = model.v_rest + model.r_m * input_current(inputs, v)
    if model.method == "euler":
        c = dt / model.tau_m
    else:
        c = jnp.exp(-dt / model.tau_m)
    full = [
        jnp.broadcast_to(jnp.asarray(x, dtype), shape)
        for x in (v_inf, c, model.v_reset, model.v_th, model.t_ref)
    ]
    # `refractory_clamped` compares with 0.5 * dt and `refractory_next` subtracts dt, both
    # Python floats rounded to the state's dtype; the kernel takes the two rounded values.
    dts = jnp.asarray([dt, 0.5 * dt], dtype)
    v_new, r_new, spikes, *fields = kernels.call(
        LIF_RUN,
        v,
        state.refractory,
        *full,
        dts,
        n_rec=n_rec,
        every=record_every,
        euler=model.method == "euler",
        shape=shape,
        record=tuple(record or ()),
    )
    final = _lif.LIFState(v=v_new, refractory=r_new)
    if not record:
        return final, spikes
    return final, spikes, dict(zip(record, fields, strict=True))


# The kernel's arguments: the state (v, refractory), the loop invariants v_inf and c and the
# parameters v_reset, v_th, t_ref, all of the population's shape, then (dt, dt / 2). Static:
# n_rec, every, euler and `shape`, the population's shape. Leading axes in front of `shape`
# (vmap's, folded in by the batching rule) are independent runs, and the record puts them in
# front of time: spikes `(*lead, n_rec, *shape)`.


FIELDS = ("v", "refractory")


def _record_indices(record) -> tuple[int, ...]:
    if not isinstance(record, tuple) or any(f not in FIELDS for f in record):
        raise ValueError(f"lif_run: record must be a tuple of names in {FIELDS}, got {record!r}")
    return tuple(FIELDS.index(f) for f in record)


def lif_update(v, r, v_inf, c, v_reset, v_th, t_ref, dt, *, euler):
    """`LIF.step` on the precomputed `v_inf` and decay factor `c` (as `run` computes them),
    with the shared refractory helpers: the new `v`, the new refractory time and the spikes
    (bool). The reference, the GPU kernels' bodies and `lif_step_spikes` run exactly these
    operations."""
    clamped = refractory_clamped(r, dt)
    v_free = v + c * (v_inf - v) if euler else v_inf + (v - v_inf) * c
    v1 = jnp.where(clamped, v_reset, v_free)
    spike = (v1 - v_th) / (v_th - v_reset) >= 0
    v2 = jnp.where(spike, v_reset, v1)
    r2 = refractory_next(r, clamped, spike.astype(r.dtype), t_ref, dt)  # 0.0/1.0 spikes
    return v2, r2, spike


def _lif_run_jax(
    v, r, v_inf, c, v_reset, v_th, t_ref, dts, *, n_rec, every, euler, shape, record=()
):
    dt = dts[0]  # 0.5 * dt inside refractory_clamped is exact: it equals dts[1]

    def step(carry, _):
        v2, r2, spike = lif_update(*carry, v_inf, c, v_reset, v_th, t_ref, dt, euler=euler)
        return (v2, r2), spike

    lead = v.ndim - len(shape)
    if not record:
        (v, r), spikes = scan_spikes(step, (v, r), n_rec, every, v)
        return v, r, jnp.moveaxis(spikes, 0, lead) if lead else spikes
    which = _record_indices(record)

    def window(carry, _):
        carry, spikes = scan_spikes(step, carry, 1, every, carry[0])
        return carry, (spikes[0], tuple(carry[j] for j in which))

    (v, r), (spikes, fields) = lax.scan(window, (v, r), None, length=n_rec)
    return v, r, *(jnp.moveaxis(x, 0, lead) if lead else x for x in (spikes, *fields))


def _lif_run_cpu(
    v, r, v_inf, c, v_reset, v_th, t_ref, dts, *, n_rec, every, euler, shape, record=()
):
    del record  # `supports` sends a run that records fields to the reference
    lead = v.shape[: v.ndim - len(shape)]
    record = spikes_struct(n_rec, every, v)
    call = jax.ffi.ffi_call(
        "nj_lif_run",
        (
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(r.shape, r.dtype),
            jax.ShapeDtypeStruct((*lead, n_rec, *shape), record.dtype),
        ),
    )
    # The kernel runs v.size neurons as runs of `inner` neurons each, and writes each run's
    # record in front of time (`lif_run.cc`).
    return call(
        v,
        r,
        v_inf,
        c,
        v_reset,
        v_th,
        t_ref,
        dts,
        n_steps=n_rec * every,
        inner=math.prod(shape),
        euler=int(euler),
        every=every,
    )


def _lif_run_gpu(
    v,
    r,
    v_inf,
    c,
    v_reset,
    v_th,
    t_ref,
    dts,
    *,
    n_rec,
    every,
    euler,
    shape,
    record=(),
    block: int = 128,
    num_warps: int = 4,
):
    """The whole run as one Pallas Triton kernel (`neurojax.kernels._pallas_run`): one lane
    per neuron, every step in a loop inside the kernel with `v` and the refractory time in
    registers, `lif_update` traced in. The parameters are read once per run; `dt` is a
    scalar argument."""
    which = _record_indices(record)
    n = math.prod(shape)
    lead = v.shape[: v.ndim - len(shape)]
    rows = [jnp.reshape(x, (-1, n)) for x in (v, r, v_inf, c, v_reset, v_th, t_ref)]

    def update(st, ps):
        v_inf, c, v_reset, v_th, t_ref, dt = ps
        v2, r2, spike = lif_update(*st, v_inf, c, v_reset, v_th, t_ref, dt, euler=euler)
        return (v2, r2), spike

    (v2, r2), spikes, fields = _pallas_run.whole_run_gpu(
        update,
        rows[:2],
        (*rows[2:], dts[:1]),
        ("full",) * 5 + ("scalar",),
        n_rec=n_rec,
        every=every,
        record=which,
        spikes_dtype=spikes_struct(n_rec, every, v).dtype,
        block=block,
        num_warps=num_warps,
        name="nj_lif_run",
    )
    rec = [x.reshape(*lead, n_rec, *shape) for x in (spikes, *fields)]
    return v2.reshape(v.shape), r2.reshape(r.shape), *rec


def _examples():
    n = 37  # more than one block of the kernel, and a remainder
    v = jnp.linspace(-70.0, -56.0, n, dtype=jnp.float32)
    r = jnp.where(jnp.arange(n) % 5 == 0, 1.0, 0.0).astype(jnp.float32)
    v_inf = jnp.linspace(-60.0, -20.0, n, dtype=jnp.float32)
    decay = jnp.full((n,), math.exp(-0.1 / 10.0), jnp.float32)
    v_reset = jnp.full((n,), -70.0, jnp.float32)
    v_th = jnp.full((n,), -55.0, jnp.float32)
    t_ref = jnp.full((n,), 2.0, jnp.float32)
    dts = jnp.asarray([0.1, 0.05], jnp.float32)
    args = (v, r, v_inf, decay, v_reset, v_th, t_ref, dts)
    for every, euler in ((1, False), (7, True)):
        yield kernels.Example(
            args,
            dict(n_rec=14, every=every, euler=euler, shape=(n,)),
            grad_argnums=(0, 2),
            vmap_argnums=(0, 2),
            label=f"every{every}-{'euler' if euler else 'exact'}",
        )
    yield kernels.Example(
        args,
        dict(n_rec=5, every=3, euler=False, shape=(n,), record=("v", "refractory")),
        grad_argnums=(0, 2),
        vmap_argnums=(0, 2),
        label="every3-record",
    )


LIF_RUN = kernels.register(
    kernels.Kernel(
        name="lif_run",
        reference=_lif_run_jax,
        cpu=_lif_run_cpu,
        gpu=_lif_run_gpu,
        # The C++ kernel records spikes only: a run that records fields runs the reference.
        supports={"cpu": lambda *args, record=(), **static: not record},
        ffi_targets=(("nj_lif_run", "NjLifRun"),),
        # Neurons are independent: vmap's axis becomes more runs of one call.
        batching=kernels.Fold(trial=(0, 1, 2, 3, 4, 5, 6), shared=(7,)),
        rtol=0.0,
        atol=0.0,
        examples=_examples,
        doc="A whole run of an uncoupled LIF population (`LIF.fused_run`); bit-identical.",
    )
)


# ---------------------------------------------------------------- lif_step_spikes
#
# The registry entry `lif_step_spikes`: one step of a LIF population that also writes the
# step's spike list, and its Pallas Triton implementation for GPUs.
#
# Event-driven delivery (`csr_deliver`) starts from a list of the neurons that spiked. Built
# after the neuron update, that list costs a second pass over the population (a compaction:
# `jnp.nonzero`, a prefix sum or a partial sort). GeNN instead appends each spike to the list
# inside the neuron update itself, and so does this kernel: each program updates a block of
# neurons, counts its spikes, reserves that many entries of its trial's list with one atomic
# add on the trial's counter, and writes its spiking neurons' indices there (in ascending order
# within the block, at the offsets of an exclusive prefix sum of the block's spikes).
#
# **Arguments** (as `lif_run`'s, for one step): the state `v`, `refractory` and the step's
# `v_inf = v_rest + r_m i` and decay factor `c` (`exp(-dt / tau_m)`, or `dt / tau_m` with
# `euler`), `v_reset`, `v_th`, `t_ref`, all `(*trials, n)`, and `dts = (dt, dt / 2)`. Static:
# `euler` and `capacity` (the length of each trial's list; None: `n`).
#
# **Results**: `(v, refractory, spikes, index, count)`: the new state, the 0/1 spikes in `v`'s
# dtype, `index` `(*trials, capacity)` int32 the spiking neurons (entries past the count hold
# `n`) and `count` `(*trials,)` int32 the number of spikes of the step, which exceeds
# `capacity` when the list overflowed (the entries then hold `capacity` of the spikes and the
# caller decides what to do about the rest).
#
# **Order.** The reference lists the spikes in ascending order (lowest first under overflow).
# On a GPU the blocks reserve their entries in whatever order their atomics land, so the list
# holds the same set of neurons in block order, not sorted, and under overflow the `capacity`
# neurons kept are those of the first blocks to reserve; `v`, `refractory`, `spikes` and
# `count` are exact. Under interpret mode the grid runs in order, which reproduces the
# reference's list exactly.
#
# **In a network step.** The GPU delivery kernel `csr_deliver`
# (`neurojax.kernels._pallas_deliver.deliver_gpu`) needs no list: it reads the spike vector in
# tiles inside its own fixed grid and skips the tiles without a spike, so no compaction runs
# outside a kernel. This entry serves consumers that want the list itself (the spike count per
# step, an event-driven recorder) without a second pass over the population.
#
# The spikes carry no surrogate gradient (the derivative of the entry is that of its reference,
# whose threshold is a comparison): the entry is for simulation; training goes through
# `LIF.step`.


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
    v2, r2, spike = lif_update(v, r, v_inf, c, v_reset, v_th, t_ref, dts[0], euler=euler)
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
        v2, r2, spike = lif_update(
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


def _step_spikes_examples():
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
        yield kernels.Example(
            args,
            dict(euler=euler, capacity=capacity),
            grad_argnums=(0, 2),
            vmap_argnums=(0, 2),
            label=f"capacity{capacity}-{'euler' if euler else 'exact'}",
        )


LIF_STEP_SPIKES = kernels.register(
    kernels.Kernel(
        name="lif_step_spikes",
        reference=lif_step_spikes_reference,
        gpu=lif_step_spikes_gpu,
        # Neurons are independent: a vmapped axis becomes more trials of one call.
        batching=kernels.Fold(trial=(0, 1, 2, 3, 4, 5, 6), shared=(7,)),
        examples=_step_spikes_examples,
        doc="One LIF step that also appends the step's spikes to each trial's spike list.",
    )
)
