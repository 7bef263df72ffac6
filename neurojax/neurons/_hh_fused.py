"""A whole `simulate` run of an uncoupled `HodgkinHuxley` population in one compiled CPU kernel.

`nj.simulate` takes this path by itself, through `HodgkinHuxley.fused_run`, for an
`nj.HodgkinHuxley` (or a subclass that keeps its `step`) with an `nj.HHState`, with no
input or one constant float input, spikes recorded with the default `spike_dtype="bool"` (the
bool raster, or counts per window with `record_every > 1`), no state field recorded, and
none of `check`, `checkpoint` or `truncate_backprop`. On CPU, with the compiled kernels
available (`neurojax.network._kernel`), one call of `nj_hh_run` (`_hh_kernel.cc`) then runs
all steps: blocks of 256 neurons, each block's state in the L1 cache and each neuron-step in
registers, the blocks shared between the threads of XLA's CPU thread pool. Elsewhere (GPU,
TPU, no compiler, `NEUROJAX_CPU_KERNEL=0`) the run is the general path's `lax.scan` over
`HodgkinHuxley.step`, with identical numbers.

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

Derivatives go through the general path's scan (a custom JVP): `grad` of a loss on the final
state is the general path's derivative at the kernel's inputs. The recorded spikes are
booleans or integers and carry no gradient.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._base import input_current
from ._fused import eligible, spikes_struct
from ._hodgkin_huxley import HHState, HodgkinHuxley

__all__ = ["applies", "run"]

_PARAMS = ("c_m", "g_na", "g_k", "g_l", "e_na", "e_k", "e_l", "v_spike")


def applies(model: Any, state: Any, inputs: Any, **options: Any) -> bool:
    """Whether `simulate` can run this configuration through `run`."""
    if not isinstance(model, HodgkinHuxley) or type(state) is not HHState:
        return False
    if type(model).step is not HodgkinHuxley.step:  # `run` integrates `HodgkinHuxley.step`
        return False
    return eligible(
        (state.v, state.m, state.h, state.n),
        tuple(getattr(model, name) for name in _PARAMS),
        inputs,
        **options,
    )


def run(
    model: HodgkinHuxley,
    state: HHState,
    inputs: Any,
    dt: float,
    n_rec: int,
    record_every: int = 1,
):
    """Final state and recorded spikes of `n_rec * record_every` steps (see `applies`): the
    bool raster `(n_rec, *shape)` with `record_every=1`, else the spike counts of each window
    of `record_every` steps, in `simulate`'s count dtype."""
    current = input_current(inputs, state.v)
    return _hh_run(n_rec, record_every, float(dt), model, state, current)


def _hh_run_jax(n_rec, every, dt, model, state, current):
    """The general path: `lax.scan` over `HodgkinHuxley.step`, spikes as `simulate` keeps them."""

    def step(st, _):
        st, out = model.step(st, current, dt)
        return st, out > 0

    if every == 1:
        return lax.scan(step, state, None, length=n_rec)
    count_dtype = spikes_struct(n_rec, every, state.v).dtype

    def window(st, _):
        def inner(c, _):
            st, counts = c
            st, spike = step(st, None)
            return (st, counts + spike.astype(count_dtype)), None

        (st, counts), _ = lax.scan(
            inner, (st, jnp.zeros(state.v.shape, count_dtype)), None, length=every
        )
        return st, counts

    return lax.scan(window, state, None, length=n_rec)


def _hh_run_kernel(n_rec, every, dt, model, state, current):
    from ..network import _kernel

    v = state.v
    dtype, shape = v.dtype, v.shape
    params = [current] + [getattr(model, name) for name in _PARAMS]
    full = [jnp.broadcast_to(jnp.asarray(p, dtype), shape) for p in params]
    call = jax.ffi.ffi_call(
        _kernel.HH_RUN_TARGET,
        (
            *(jax.ShapeDtypeStruct(shape, dtype) for _ in range(4)),
            spikes_struct(n_rec, every, v),
        ),
        # Neurons are independent: under vmap every argument gets the batch axis and the
        # kernel treats it as more neurons, with the record's batch axis in front of time.
        vmap_method="broadcast_all",
    )
    v, m, h, n, spikes = call(
        state.v,
        state.m,
        state.h,
        state.n,
        *full,
        jnp.asarray([dt], dtype),
        n_steps=n_rec * every,
        inner=int(v.size),
        rk4=int(model.method == "rk4"),
        every=every,
    )
    return HHState(v=v, m=m, h=h, n=n), spikes


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _hh_run(n_rec, every, dt, model, state, current):
    from ..network import _kernel

    jax_path = functools.partial(_hh_run_jax, n_rec, every, dt)
    if _kernel.available():
        kernel_path = functools.partial(_hh_run_kernel, n_rec, every, dt)
        return lax.platform_dependent(model, state, current, cpu=kernel_path, default=jax_path)
    return jax_path(model, state, current)


@_hh_run.defjvp
def _hh_run_jvp(n_rec, every, dt, primals, tangents):
    # The tangents of the general path's scan (reverse mode transposes them; the kernel is
    # never differentiated). The recorded spikes are booleans or integers: no tangent.
    _, (d_state, _) = jax.jvp(functools.partial(_hh_run_jax, n_rec, every, dt), primals, tangents)
    spikes_tangent = np.zeros((n_rec, *primals[1].v.shape), dtype=jax.dtypes.float0)
    return _hh_run(n_rec, every, dt, *primals), (d_state, spikes_tangent)
