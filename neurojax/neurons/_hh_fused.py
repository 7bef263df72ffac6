"""A whole `simulate` run of an uncoupled `HodgkinHuxley` population in one compiled CPU kernel.

On a GPU the entry's `gpu` slot (`_hh_run_gpu`) runs the whole run as one Pallas Triton kernel
with `HodgkinHuxley.step` traced in, and records state fields too (`simulate` hands it runs
that record `v`, `m`, `h` or `n` on a GPU and under `nj.kernels.interpret("gpu")`).

`nj.simulate` takes this path by itself, through `HodgkinHuxley.fused_run`, for an
`nj.HodgkinHuxley` (or a subclass that keeps its `step`) with an `nj.HHState`, with no
input or one constant float input, spikes recorded with the default
`nj.Record(spikes="raster")` (the bool raster, or counts per window with `record_every > 1`),
no state field recorded, and none of `check`, `checkpoint` or `truncate_backprop`. The run
is the kernel `"hh_run"` of the registry (`neurojax.kernels`). On CPU, with the compiled
library available, one call of `nj_hh_run` (`neurojax/kernels/hh_run.cc`) then runs all
steps: blocks of 256 neurons,
each block's state in the L1 cache and each neuron-step in registers, the blocks shared
between the threads of XLA's CPU thread pool. Elsewhere (GPU, TPU, no compiler,
`nj.kernels.use("reference")`, `NEUROJAX_CPU_KERNEL=0`) the run is the kernel's reference,
the general path's `lax.scan` over `HodgkinHuxley.step`, with identical numbers.

The kernel integrates the same equations with the same method, rate functions, update order
and spike test as `HodgkinHuxley.step`, but not with XLA's operations one for one: its own
vectorised single-precision `exp` (about 1 ulp), `exp(-(v + 65)/20)` as the fourth power of
`exp(-(v + 65)/80)`, and `dv/dt` multiplied by `1 / c_m`. Its results therefore agree with
the general path's to rounding, not to the bit. In float64 the two agree to about 1e-9. In
float32 both are within float32 accuracy of the float64 scheme: spike counts equal and spike
times within one step, and below threshold the voltage within 1e-3 mV (the tests bound
these; near a spike that one path dates a step later the voltages differ by as much as the
upstroke moves in a step, several mV). Their spike-time errors against a tight-tolerance
reference are the same (`benchmarks/RESULTS.md`). The run is deterministic and independent
of the number of threads, so chunked and unchunked runs are identical.

Derivatives go through the general path's scan (the registry's JVP through the
reference): `grad` of a loss on the final state is the general path's derivative at the
kernel's inputs. The recorded spikes are
booleans or integers and carry no gradient.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import kernels
from ..kernels import _pallas_run
from . import _hodgkin_huxley as _hh
from ._base import input_current
from ._fused import eligible, scan_spikes, spikes_struct

__all__ = ["applies", "run", "HH_RUN"]

_PARAMS = ("c_m", "g_na", "g_k", "g_l", "e_na", "e_k", "e_l", "v_spike")


def applies(model: Any, state: Any, inputs: Any, **options: Any) -> bool:
    """Whether `simulate` can run this configuration through `run`."""
    if not isinstance(model, _hh.HodgkinHuxley) or type(state) is not _hh.HHState:
        return False
    if type(model).step is not _hh.HodgkinHuxley.step:  # `run` integrates this `step`
        return False
    return eligible(
        (state.v, state.m, state.h, state.n),
        tuple(getattr(model, name) for name in _PARAMS),
        inputs,
        recordable=FIELDS,
        **options,
    )


def run(
    model: "_hh.HodgkinHuxley",
    state: "_hh.HHState",
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
    current = input_current(inputs, state.v)
    v, m, h, n, spikes, *fields = kernels.call(
        HH_RUN,
        state.v,
        state.m,
        state.h,
        state.n,
        current,
        *(getattr(model, name) for name in _PARAMS),
        n_rec=n_rec,
        every=record_every,
        dt=float(dt),
        method=model.method,
        shape=state.v.shape,
        record=tuple(record or ()),
    )
    final = _hh.HHState(v=v, m=m, h=h, n=n)
    if not record:
        return final, spikes
    return final, spikes, dict(zip(record, fields, strict=True))


# The kernel's arguments: the state (v, m, h, n), the input current and the parameters of
# `_PARAMS`, each in its own shape (broadcastable to the population's). Static: n_rec,
# every, dt, method and `shape`, the population's shape. Leading axes in front of `shape`
# (vmap's, added by the batching rule) are independent runs, and the record puts them in
# front of time: spikes `(*lead, n_rec, *shape)`.


FIELDS = ("v", "m", "h", "n")


def _record_indices(record) -> tuple[int, ...]:
    if not isinstance(record, tuple) or any(f not in FIELDS for f in record):
        raise ValueError(f"hh_run: record must be a tuple of names in {FIELDS}, got {record!r}")
    return tuple(FIELDS.index(f) for f in record)


def _hh_run_jax(v, m, h, n, current, *params, n_rec, every, dt, method, shape, record=()):
    """The general path: `lax.scan` over `HodgkinHuxley.step`, spikes as `simulate` keeps them
    (and the recorded fields at the end of each window)."""
    model = _hh.HodgkinHuxley(**dict(zip(_PARAMS, params, strict=True)), method=method)

    def step(st, _):
        st, out = model.step(st, current, dt)
        return st, out > 0

    state = _hh.HHState(v=v, m=m, h=h, n=n)
    lead = v.ndim - len(shape)
    if not record:
        state, spikes = scan_spikes(step, state, n_rec, every, v)
        spikes = jnp.moveaxis(spikes, 0, lead) if lead else spikes
        return state.v, state.m, state.h, state.n, spikes
    which = _record_indices(record)

    def window(st, _):
        st, spikes = scan_spikes(step, st, 1, every, v)
        return st, (spikes[0], tuple(getattr(st, FIELDS[j]) for j in which))

    state, (spikes, fields) = lax.scan(window, state, None, length=n_rec)
    rec = (jnp.moveaxis(x, 0, lead) if lead else x for x in (spikes, *fields))
    return state.v, state.m, state.h, state.n, *rec


def _hh_run_gpu(
    v,
    m,
    h,
    n,
    current,
    *params,
    n_rec,
    every,
    dt,
    method,
    shape,
    record=(),
    block: int = 128,
    num_warps: int = 4,
):
    """The whole run as one Pallas Triton kernel (`neurojax.kernels._pallas_run`), the seed's
    CuPy design: one lane per neuron, every step in a loop inside the kernel with the four
    state variables in registers, `HodgkinHuxley.step` itself traced in (the same method,
    rates and spike test as the reference). The input and each parameter keep their own
    layout: a scalar is a scalar argument, one value per neuron is shared by the trials, and
    only a parameter with trial axes (a vmapped one) is an array per trial."""
    which = _record_indices(record)
    size = math.prod(shape)
    lead = v.shape[: v.ndim - len(shape)]
    dtype = v.dtype
    kinds = tuple(_pallas_run.param_kind(jnp.asarray(p), lead, shape) for p in (current, *params))
    arrays = tuple(
        _pallas_run.as_kind(p, kind, lead, shape, dtype)
        for p, kind in zip((current, *params), kinds, strict=True)
    )

    def update(st, ps):
        model = _hh.HodgkinHuxley(**dict(zip(_PARAMS, ps[1:], strict=True)), method=method)
        new, out = model.step(_hh.HHState(*st), ps[0], dt)
        return (new.v, new.m, new.h, new.n), out > 0

    final, spikes, fields = _pallas_run.whole_run_gpu(
        update,
        [jnp.reshape(x, (-1, size)) for x in (v, m, h, n)],
        arrays,
        kinds,
        n_rec=n_rec,
        every=every,
        record=which,
        spikes_dtype=spikes_struct(n_rec, every, v).dtype,
        block=block,
        num_warps=num_warps,
        name="nj_hh_run",
    )
    rec = [x.reshape(*lead, n_rec, *shape) for x in (spikes, *fields)]
    return (*(x.reshape(v.shape) for x in final), *rec)


def _hh_run_cpu(v, m, h, n, current, *params, n_rec, every, dt, method, shape, record=()):
    del record  # `supports` sends a run that records fields to the reference
    dtype = v.dtype
    lead = v.shape[: v.ndim - len(shape)]
    full = [jnp.broadcast_to(jnp.asarray(p, dtype), v.shape) for p in (current, *params)]
    call = jax.ffi.ffi_call(
        "nj_hh_run",
        (
            *(jax.ShapeDtypeStruct(v.shape, dtype) for _ in range(4)),
            jax.ShapeDtypeStruct((*lead, n_rec, *shape), spikes_struct(n_rec, every, v).dtype),
        ),
    )
    # The kernel runs v.size neurons as runs of `inner` neurons each, and writes each run's
    # record in front of time (`hh_run.cc`).
    return call(
        v,
        m,
        h,
        n,
        *full,
        jnp.asarray([dt], dtype),
        n_steps=n_rec * every,
        inner=math.prod(shape),
        rk4=int(method == "rk4"),
        every=every,
    )


def _batching(axis_size, in_batched, args, apply):
    """Every run of the batch is more neurons of one call: the state gets the vmapped axis in
    front; an input or parameter that has it keeps it, aligned with the state's axes (its own
    shape broadcasts to the population's from the right), one that has not stays as it is."""
    ndim = args[0].ndim - int(bool(in_batched[0]))  # the state's dimensions, unbatched
    out = []
    for i, (x, batched) in enumerate(zip(args, in_batched, strict=True)):
        if i < 4:
            if not batched:
                x = jnp.broadcast_to(x, (axis_size, *x.shape))
        elif batched:
            x = jnp.reshape(x, (axis_size,) + (1,) * (ndim - (x.ndim - 1)) + x.shape[1:])
        out.append(x)
    results = apply(*out)
    return results, jax.tree.map(lambda _: True, results)


def _examples():
    n = 300  # more than one block of the kernel
    hh = _hh.HodgkinHuxley()
    rest = hh.resting_state(n)
    # Below threshold: near a spike the kernel's rounding moves the upstroke (module docstring).
    v = rest.v + jnp.linspace(0.0, 2.0, n, dtype=rest.v.dtype)
    current = jnp.linspace(0.0, 1.0, n, dtype=v.dtype)
    params = tuple(getattr(hh, name) for name in _PARAMS)
    args = (v, rest.m, rest.h, rest.n, current, *params)
    for every, method in ((1, "rk4"), (10, "exp_euler")):
        yield kernels.Example(
            args,
            dict(n_rec=40, every=every, dt=0.01, method=method, shape=(n,)),
            grad_argnums=(0, 4),
            vmap_argnums=(0, 4),
            label=f"every{every}-{method}",
        )
    yield kernels.Example(
        args,
        dict(n_rec=8, every=5, dt=0.01, method="rk4", shape=(n,), record=("v", "n")),
        grad_argnums=(0, 4),
        vmap_argnums=(0, 4),
        label="every5-record",
    )


HH_RUN = kernels.register(
    kernels.Kernel(
        name="hh_run",
        reference=_hh_run_jax,
        cpu=_hh_run_cpu,
        gpu=_hh_run_gpu,
        # The C++ kernel records spikes only: a run that records fields runs the reference.
        supports={"cpu": lambda *args, record=(), **static: not record},
        ffi_targets=(("nj_hh_run", "NjHhRun"),),
        batching=_batching,
        # The kernel's own vectorised exp: equal to the scan to rounding (module docstring).
        rtol=1e-4,
        atol=1e-4,
        examples=_examples,
        doc="A whole run of an uncoupled Hodgkin-Huxley population (`fused_run`).",
    )
)
