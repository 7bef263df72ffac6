"""A whole `simulate` run of an uncoupled `LIF` population in one compiled CPU kernel.

`nj.simulate` takes this path by itself, through `LIF.fused_run`, when it can give exactly the
numbers of its general `lax.scan` over `LIF.step`: the model is an `nj.LIF` (or a subclass
that keeps `LIF.step`) with an `nj.LIFState`, the input is `None` or
one constant float array, spikes are recorded with the default `spike_dtype="bool"` (the
bool raster, or counts per window with `record_every > 1`), no state field is recorded, and
neither `check`, `checkpoint` nor `truncate_backprop` is asked for. On CPU, with the
compiled kernels available (`neurojax.network._kernel`), one call of `nj_lif_run`
(`_lif_kernel.cc`) then runs all steps, neuron block by neuron block, with each block's
state in the L1 cache; elsewhere the same arithmetic runs as a pure-JAX scan.

Both paths compute the same operations in the same order (`LIF.step`, with the parameters
broadcast to the population and the loop-invariant `v_inf` and decay factor computed once),
so the final state and the recorded spikes are identical to the general path's; the tests compare
them bit for bit. One caveat, which the general path shares: under an outer `jax.jit` that
closes over the input or the parameters as constants, XLA may fold the loop-invariant
arithmetic at compile time (without the fused multiply-add it uses at run time, and with its
own `exp`), and it need not fold the same parts of the two programs, so they can then differ
in the last bit. `nj.simulate` itself passes model and input as traced arguments.

Derivatives go through the pure-JAX scan (a custom JVP), so `grad` of a loss on the final
state is the general path's derivative, up to the rounding of the tangent arithmetic; the
surrogate does not enter, because the bool raster (or the integer counts) carries no
gradient and the reset is detached.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._base import input_current, refractory_clamped, refractory_next
from ._fused import eligible, spikes_struct
from ._lif import LIF, LIFState

__all__ = ["applies", "run"]


def applies(model: Any, state: Any, inputs: Any, **options: Any) -> bool:
    """Whether `simulate` can run this configuration through `run` with identical results."""
    if not isinstance(model, LIF) or type(state) is not LIFState:
        return False
    if type(model).step is not LIF.step:  # `run` reproduces `LIF.step`, not an override
        return False
    return eligible(
        (state.v, state.refractory),
        (model.tau_m, model.v_rest, model.v_reset, model.v_th, model.r_m, model.t_ref),
        inputs,
        **options,
    )


def run(
    model: LIF,
    state: LIFState,
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
    v_new, r_new, spikes = _lif_run(
        n_rec, record_every, model.method == "euler", v, state.refractory, *full, dts
    )
    return LIFState(v=v_new, refractory=r_new), spikes


def _lif_run_jax(n_rec, every, euler, v, r, v_inf, c, v_reset, v_th, t_ref, dts):
    dt = dts[0]  # 0.5 * dt inside refractory_clamped is exact: it equals dts[1]

    def step(carry, _):
        # `LIF.step` on the precomputed v_inf and c, with the shared refractory helpers.
        v, r = carry
        clamped = refractory_clamped(r, dt)
        v_free = v + c * (v_inf - v) if euler else v_inf + (v - v_inf) * c
        v1 = jnp.where(clamped, v_reset, v_free)
        spike = (v1 - v_th) / (v_th - v_reset) >= 0
        v2 = jnp.where(spike, v_reset, v1)
        r2 = refractory_next(r, clamped, spike.astype(r.dtype), t_ref, dt)  # 0.0/1.0 spikes
        return (v2, r2), spike

    if every == 1:
        (v, r), spikes = lax.scan(step, (v, r), None, length=n_rec)
        return v, r, spikes
    count_dtype = spikes_struct(n_rec, every, v).dtype

    def window(carry, _):
        def inner(c, _):
            vr, counts = c
            vr, spike = step(vr, None)
            return (vr, counts + spike.astype(count_dtype)), None

        (carry, counts), _ = lax.scan(
            inner, (carry, jnp.zeros(v.shape, count_dtype)), None, length=every
        )
        return carry, counts

    (v, r), spikes = lax.scan(window, (v, r), None, length=n_rec)
    return v, r, spikes


def _lif_run_kernel(n_rec, every, euler, v, r, v_inf, c, v_reset, v_th, t_ref, dts):
    from ..network import _kernel

    call = jax.ffi.ffi_call(
        _kernel.LIF_RUN_TARGET,
        (
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(r.shape, r.dtype),
            spikes_struct(n_rec, every, v),
        ),
        # Neurons are independent: under vmap every argument gets the batch axis and the
        # kernel treats it as more neurons, with the record's batch axis in front of time.
        vmap_method="broadcast_all",
    )
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
        inner=int(v.size),
        euler=int(euler),
        every=every,
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _lif_run(n_rec, every, euler, v, r, v_inf, c, v_reset, v_th, t_ref, dts):
    from ..network import _kernel

    args = (v, r, v_inf, c, v_reset, v_th, t_ref, dts)
    jax_path = functools.partial(_lif_run_jax, n_rec, every, euler)
    if _kernel.available():
        kernel_path = functools.partial(_lif_run_kernel, n_rec, every, euler)
        return lax.platform_dependent(*args, cpu=kernel_path, default=jax_path)
    return jax_path(*args)


@_lif_run.defjvp
def _lif_run_jvp(n_rec, every, euler, primals, tangents):
    # The tangents of the pure-JAX scan (reverse mode transposes them; the kernel is never
    # differentiated). The recorded spikes are booleans or integers: no tangent.
    _, (dv, dr, _) = jax.jvp(
        functools.partial(_lif_run_jax, n_rec, every, euler), primals, tangents
    )
    spikes_tangent = np.zeros((n_rec, *primals[0].shape), dtype=jax.dtypes.float0)
    return _lif_run(n_rec, every, euler, *primals), (dv, dr, spikes_tangent)
