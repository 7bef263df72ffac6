"""A whole `simulate` run of an uncoupled `LIF` population in one compiled CPU kernel.

`nj.simulate` takes this path by itself, through `LIF.fused_run`, when it can give exactly the
numbers of its general `lax.scan` over `LIF.step`: the model is an `nj.LIF` (or a subclass
that keeps `LIF.step`) with an `nj.LIFState`, the input is `None` or
one constant float array, spikes are recorded with the default `spike_dtype="bool"` (the
bool raster, or counts per window with `record_every > 1`), no state field is recorded, and
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
from jax import lax

from .. import kernels
from ..kernels import _pallas_run
from . import _lif
from ._base import input_current, refractory_clamped, refractory_next
from ._fused import eligible, scan_spikes, spikes_struct

__all__ = ["applies", "run", "LIF_RUN"]


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
        **options,
    )


def run(
    model: "_lif.LIF",
    state: "_lif.LIFState",
    inputs: Any,
    dt: float,
    n_rec: int,
    record_every: int = 1,
):
    """Final state and recorded spikes of `n_rec * record_every` steps (see `applies`): the
    bool raster `(n_rec, *shape)` with `record_every=1`, else the spike counts of each window
    of `record_every` steps, in `simulate`'s count dtype."""
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
    v_new, r_new, spikes = kernels.call(
        LIF_RUN,
        v,
        state.refractory,
        *full,
        dts,
        n_rec=n_rec,
        every=record_every,
        euler=model.method == "euler",
        shape=shape,
    )
    return _lif.LIFState(v=v_new, refractory=r_new), spikes


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
