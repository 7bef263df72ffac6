"""Adaptive exponential integrate-and-fire neuron (Brette and Gerstner 2005)."""

import math

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import (
    _fmt,
    as_float,
    check_choice,
    check_finite,
    check_less,
    check_nonnegative,
    check_positive,
    is_concrete,
)
from ..surrogate import FastSigmoid, Surrogate, as_surrogate
from ._base import NeuronModel, full, input_current, refractory_clamped, refractory_next

__all__ = ["AdEx", "AdExState"]

_METHODS = ("rk4", "euler")

# nS * mV = pA; currents (I, w, b) are in nA, so pA terms are scaled by 1e-3 and nA terms
# by 1e3 where they meet.
_PA_PER_NA = 1e3


class AdExState(eqx.Module):
    """State of an `AdEx` population."""

    v: Float[Array, "*batch n"]  # membrane potential [mV]
    w: Float[Array, "*batch n"]  # adaptation current [nA]
    refractory: Float[Array, "*batch n"]  # time left in the refractory period [ms]


class AdEx(NeuronModel):
    r"""Adaptive exponential integrate-and-fire neuron (Brette and Gerstner 2005).

    $$C \frac{dv}{dt} = -g_L (v - E_L) + g_L \Delta_T \exp\left(\frac{v - V_T}{\Delta_T}\right)
    - w + I$$

    $$\tau_w \frac{dw}{dt} = a (v - E_L) - w$$

    and when $v \ge v_{peak}$: $v \leftarrow v_{reset}$, $w \leftarrow w + b$, and `v` is held
    at `v_reset` for `t_ref` ms.

    **Units.** capacitance `c_m` pF, conductances `g_l` and `a` nS, voltages mV, times ms,
    currents `I`, `w` and `b` nA. Since nS x mV = pA, the `v` equation is evaluated in pA
    (with `I - w` multiplied by 1e3) and divided by `C` in pF, which gives mV/ms; in the `w`
    equation `a (v - E_L)` in pA is multiplied by 1e-3 to give nA. The defaults are the
    regular-spiking fit of Brette and Gerstner (2005) (`tau_m = C / g_L = 9.37` ms).

    **Integration** (`method`, static):

    - `"rk4"` (default): classic fourth-order Runge-Kutta on `(v, w)` with the input held
      constant over the step. The exponential upswing makes the equations stiff in the last
      millivolts before a spike, where forward Euler lags; at the same `dt` RK4's spike
      times are about three times closer to the exact ones (see Accuracy).
    - `"euler"`: forward Euler, the scheme of many published simulations (for example
      Brian2's examples), cheaper per step.

    **Guard of the exponential.** Every evaluation of the right-hand side uses
    `min(v, v_peak)` in place of `v` (as NEST's `aeif_*` models do). Below `v_peak` this
    changes nothing; above it (only reached inside the step that crosses `v_peak`, for example
    by an RK4 stage) it keeps `exp` finite and keeps an overshooting stage from driving `w`
    through its `a (v - E_L)` term, and the gradient through the cap is finite (zero above the
    peak). The exponential at the cap, `exp((v_peak - V_T) / Delta_T)`, must itself be finite
    in the working dtype, which the constructor checks.

    **Order within a step.** (1) a neuron still refractory keeps `v = v_reset` while `w`
    integrates (with `v = v_reset` in its equation), and its remaining refractory time shrinks
    by `dt`; (2) every other neuron integrates `(v, w)`; (3) a neuron with `v >= v_peak`
    emits a spike, is set to `v_reset`, `w` grows by `b`, and it becomes refractory for
    `t_ref` ms (`round(t_ref / dt)` whole steps). A spike emitted by the step from `t` to
    `t + dt` is dated `t + dt`.

    **Surrogate.** The spike is `H((v - v_peak) / (v_peak - v_reset))`; reset and the jump of
    `w` are detached from the gradient (as in `LIF`), so the surrogate gradient reaches a loss
    through the spike output and between spikes gradients are those of the exact dynamics. The
    exponential upswing makes one step's derivative with respect to `v` large near the peak: for
    the default cell, the gradient of the spike count of 100 ms (10 spikes) with respect to a
    1.5 nA input, at `dt = 0.05`, measured about 160 with Euler and 2.5 with RK4 (`jax.grad` of
    `simulate(..., record=nj.Record(spikes="float"))[1].spikes.sum()`).

    **Accuracy.** A spike is registered, and the neuron reset, at the end of the step in
    which `v` crosses `v_peak`, so every spike lags the exact crossing by up to one step and
    the lags add up over a train. For the default cell at `I = 1 nA` (8 spikes in 200 ms),
    the largest spike-time error against an accurate solve is 0.83, 0.28 and 0.07 ms with
    RK4 at `dt` = 0.1, 0.05 and 0.01 ms, and 2.4, 1.3 and 0.35 ms with Euler. At equal cost
    (Euler with a four times smaller step) the two are comparable for spike timing; RK4 is
    the default because at a given `dt` its voltage and adaptation trajectories are far
    closer to the equations and its spike-time error is essentially the grid's alone.

    Args:
        c_m: membrane capacitance [pF], > 0.
        g_l: leak conductance [nS], > 0.
        e_l: leak reversal potential [mV].
        v_t: threshold slope-factor centre [mV].
        delta_t: slope factor [mV], > 0.
        tau_w: adaptation time constant [ms], > 0.
        a: subthreshold adaptation conductance [nS] (negative values are allowed).
        b: spike-triggered adaptation increment [nA].
        v_reset: reset potential [mV], < `v_peak`.
        v_peak: spike cutoff [mV].
        t_ref: absolute refractory period [ms], >= 0.
        method: `"rk4"` or `"euler"` (see Integration).
        surrogate: a `neurojax.surrogate.Surrogate` or its name (default fast sigmoid).

    Every parameter may be a scalar or an array broadcastable to the population.

    Example:
    ```python
    import neurojax as nj
    adex = nj.AdEx()                      # Brette and Gerstner (2005), regular spiking
    state = adex.init_state(1)
    final, rec = nj.simulate(adex, state, 1.0, dt=0.05, n_steps=4000)   # 1 nA for 200 ms
    rec.t[rec.spikes[:, 0]]   # 11.85, 25.45, 41.3, 59.9, 81.8, ... ms: ISIs lengthen
    ```

    References:
        R. Brette and W. Gerstner, "Adaptive exponential integrate-and-fire model as an
        effective description of neuronal activity", J. Neurophysiol. 94:3637 (2005).
        R. Naud, N. Marcille, C. Clopath and W. Gerstner, "Firing patterns in the adaptive
        exponential integrate-and-fire model", Biol. Cybern. 99:335 (2008).
    """

    c_m: Float[Array, "..."] = eqx.field(default=281.0, converter=as_float)
    g_l: Float[Array, "..."] = eqx.field(default=30.0, converter=as_float)
    e_l: Float[Array, "..."] = eqx.field(default=-70.6, converter=as_float)
    v_t: Float[Array, "..."] = eqx.field(default=-50.4, converter=as_float)
    delta_t: Float[Array, "..."] = eqx.field(default=2.0, converter=as_float)
    tau_w: Float[Array, "..."] = eqx.field(default=144.0, converter=as_float)
    a: Float[Array, "..."] = eqx.field(default=4.0, converter=as_float)
    b: Float[Array, "..."] = eqx.field(default=0.0805, converter=as_float)
    v_reset: Float[Array, "..."] = eqx.field(default=-70.6, converter=as_float)
    v_peak: Float[Array, "..."] = eqx.field(default=20.0, converter=as_float)
    t_ref: Float[Array, "..."] = eqx.field(default=0.0, converter=as_float)
    method: str = eqx.field(default="rk4", static=True)
    surrogate: Surrogate = eqx.field(default_factory=FastSigmoid, converter=as_surrogate)

    def __check_init__(self):
        check_choice("AdEx", "method", self.method, _METHODS)
        check_positive("AdEx", "c_m", self.c_m, "pF")
        check_positive("AdEx", "g_l", self.g_l, "nS")
        check_finite("AdEx", "e_l", self.e_l)
        check_finite("AdEx", "v_t", self.v_t)
        check_positive("AdEx", "delta_t", self.delta_t, "mV")
        check_positive("AdEx", "tau_w", self.tau_w, "ms")
        check_finite("AdEx", "a", self.a)
        check_finite("AdEx", "b", self.b)
        check_finite("AdEx", "v_reset", self.v_reset)
        check_finite("AdEx", "v_peak", self.v_peak)
        check_nonnegative("AdEx", "t_ref", self.t_ref, "ms")
        check_less("AdEx", "v_reset", self.v_reset, "v_peak", self.v_peak)
        self._check_exponent()

    def _check_exponent(self):
        if not all(is_concrete(x) for x in (self.v_peak, self.v_t, self.delta_t)):
            return
        dtype = jnp.result_type(self.v_peak, self.v_t, self.delta_t)
        # Leave a factor e^10 of headroom for the products with g_l, delta_t and dt / c_m.
        limit = math.log(float(jnp.finfo(dtype).max)) - 10.0
        x = np.asarray((self.v_peak - self.v_t) / self.delta_t)
        if np.any(x > limit):
            raise ValueError(
                f"AdEx: (v_peak - v_t) / delta_t must be <= {limit:.1f} so that the exponential"
                f" term stays finite in {jnp.dtype(dtype).name}, got {_fmt(x.max())}; lower"
                " v_peak, raise delta_t or enable float64"
            )

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> AdExState:
        """Rest state (`v = e_l`, `w = 0`, not refractory) for a population of `shape`.

        `w = 0` is the steady adaptation current at `v = e_l` for any `a`. With a `key`, `v`
        is drawn uniformly in `[v_reset, v_t)` instead (and `w = 0`).
        """
        shape = self._shape(shape)
        if key is None:
            v = full(shape, self.e_l)
        else:
            r = jr.uniform(key, shape, dtype=self.v_t.dtype)
            v = full(shape, self.v_reset + r * (self.v_t - self.v_reset))
        return AdExState(v=v, w=full(shape, 0.0), refractory=full(shape, 0.0))

    def _field(self, v, w, i, free):
        """Right-hand side `(dv/dt [mV/ms], dw/dt [nA/ms])`; `free` is 0 while clamped."""
        vc = jnp.minimum(v, self.v_peak)
        spike_current = self.g_l * self.delta_t * jnp.exp((vc - self.v_t) / self.delta_t)
        i_pa = spike_current - self.g_l * (vc - self.e_l) + _PA_PER_NA * (i - w)
        dv = free * i_pa / self.c_m
        dw = (self.a * (vc - self.e_l) / _PA_PER_NA - w) / self.tau_w
        return dv, dw

    def step(self, state: AdExState, current, dt: float):
        """Advance by `dt` ms under `current` [nA] held over the step; return `(state, spikes)`.

        Clamp refractory neurons (their `w` still integrates), integrate `(v, w)` with
        `method`, then spike where `v >= v_peak`, reset `v`, add `b` to `w` and start the
        refractory period, in the order of the class docstring.
        """
        i = input_current(current, state.v)
        # Remaining refractory time is compared with dt/2 so that t_ref is rounded to whole
        # steps instead of depending on the rounding of repeated float subtraction.
        clamped = refractory_clamped(state.refractory, dt)
        free = jnp.where(clamped, 0.0, 1.0).astype(state.v.dtype)
        v0 = jnp.where(clamped, self.v_reset, state.v)
        w0 = state.w
        if self.method == "euler":
            dv, dw = self._field(v0, w0, i, free)
            v, w = v0 + dt * dv, w0 + dt * dw
        else:
            k1v, k1w = self._field(v0, w0, i, free)
            k2v, k2w = self._field(v0 + 0.5 * dt * k1v, w0 + 0.5 * dt * k1w, i, free)
            k3v, k3w = self._field(v0 + 0.5 * dt * k2v, w0 + 0.5 * dt * k2w, i, free)
            k4v, k4w = self._field(v0 + dt * k3v, w0 + dt * k3w, i, free)
            v = v0 + dt / 6.0 * (k1v + 2.0 * k2v + 2.0 * k3v + k4v)
            w = w0 + dt / 6.0 * (k1w + 2.0 * k2w + 2.0 * k3w + k4w)
        s = self.surrogate((v - self.v_peak) / (self.v_peak - self.v_reset))
        # Detached reset (see LIF): a blend would leak the surrogate's pseudo-derivative into
        # v and w at every step, biasing sub-threshold gradients.
        fired = s > 0
        v = jnp.where(fired, self.v_reset, v)
        w = jnp.where(fired, w + self.b, w)
        refractory = refractory_next(state.refractory, clamped, s, self.t_ref, dt)
        return AdExState(v=v, w=w, refractory=refractory), s
