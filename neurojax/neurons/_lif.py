"""Leaky integrate-and-fire neuron with exact integration."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import (
    as_float,
    check_choice,
    check_finite,
    check_less,
    check_nonnegative,
    check_positive,
)
from ..surrogate import FastSigmoid, Surrogate, as_surrogate
from . import _lif_fused
from ._base import NeuronModel, full, input_current, refractory_clamped, refractory_next

__all__ = ["LIF", "LIFState"]

_METHODS = ("exact", "euler")


class LIFState(eqx.Module):
    """State of a `LIF` population."""

    v: Float[Array, "*batch n"]  # membrane potential [mV]
    refractory: Float[Array, "*batch n"]  # time left in the refractory period [ms]


class LIF(NeuronModel):
    r"""Leaky integrate-and-fire neuron.

    $$\tau_m \frac{dv}{dt} = -(v - v_{rest}) + r_m I$$

    **Integration** (`method`, static). `"exact"` (default): the input current is held
    constant over each step, so the membrane equation is integrated exactly:
    `v <- v_inf + (v - v_inf) exp(-dt / tau_m)` with `v_inf = v_rest + r_m I`; the result is
    independent of `dt` between spikes. `"euler"`: forward Euler,
    `v <- v + dt / tau_m (v_inf - v)`, the scheme of the published simulator comparisons on
    the Brette et al. (2007) networks (`nj.models.coba`); it needs `dt << tau_m`.

    **Order within a step.** (1) a neuron still refractory stays clamped at `v_reset` and
    its remaining refractory time shrinks by `dt`; (2) every other neuron integrates;
    (3) a neuron with `v >= v_th` emits a spike, is set to `v_reset` and becomes refractory
    for `t_ref` ms. A spike emitted by the step from `t` to `t + dt` is dated `t + dt`, and a
    refractory period lasts `round(t_ref / dt)` whole steps, after which integration resumes
    from `v_reset`. The interspike interval at constant drive is therefore
    `t_ref + tau_m ln((r_m I - (v_reset - v_rest)) / (r_m I - (v_th - v_rest)))` rounded up to
    the time grid.

    **Surrogate.** The spike is `H((v - v_th) / (v_th - v_reset))`; its gradient is the
    surrogate's pseudo-derivative of that dimensionless distance. The reset is detached (no
    gradient flows through it), so below threshold gradients are those of the exact dynamics.

    **Units.** time ms, voltage mV, current nA, resistance MOhm (so `r_m I` is in mV).

    Args:
        tau_m: membrane time constant [ms], > 0.
        v_rest: resting potential [mV].
        v_reset: reset potential [mV], < `v_th`.
        v_th: spike threshold [mV].
        r_m: membrane resistance [MOhm], > 0.
        t_ref: absolute refractory period [ms], >= 0.
        surrogate: a `neurojax.surrogate.Surrogate` or its name (default fast sigmoid).
        method: `"exact"` or `"euler"` (see Integration).

    Every parameter may be a scalar or an array broadcastable to the population (for example
    one value per neuron).

    Example:
    ```python
    import neurojax as nj
    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=2.0)
    state = lif.init_state(3)
    final, rec = nj.simulate(lif, state, 1.0, dt=0.1, n_steps=1000)
    rec.spikes.sum(axis=0)   # spikes per neuron in 100 ms at 1 nA: 15
    ```
    """

    tau_m: Float[Array, "..."] = eqx.field(default=10.0, converter=as_float)
    v_rest: Float[Array, "..."] = eqx.field(default=-65.0, converter=as_float)
    v_reset: Float[Array, "..."] = eqx.field(default=-65.0, converter=as_float)
    v_th: Float[Array, "..."] = eqx.field(default=-50.0, converter=as_float)
    r_m: Float[Array, "..."] = eqx.field(default=1.0, converter=as_float)
    t_ref: Float[Array, "..."] = eqx.field(default=0.0, converter=as_float)
    surrogate: Surrogate = eqx.field(default_factory=FastSigmoid, converter=as_surrogate)
    method: str = eqx.field(default="exact", static=True)

    def __check_init__(self):
        check_choice("LIF", "method", self.method, _METHODS)
        check_positive("LIF", "tau_m", self.tau_m, "ms")
        check_finite("LIF", "v_rest", self.v_rest)
        check_finite("LIF", "v_reset", self.v_reset)
        check_finite("LIF", "v_th", self.v_th)
        check_positive("LIF", "r_m", self.r_m, "MOhm")
        check_nonnegative("LIF", "t_ref", self.t_ref, "ms")
        check_less("LIF", "v_reset", self.v_reset, "v_th", self.v_th)

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> LIFState:
        """Rest state (`v = v_rest`, not refractory) for a population of `shape`.

        With a `key`, `v` is drawn uniformly in `[v_reset, v_th)` instead.
        """
        shape = self._shape(shape)
        if key is None:
            v = full(shape, self.v_rest)
        else:
            u = jr.uniform(key, shape, dtype=self.v_th.dtype)
            v = self.v_reset + u * (self.v_th - self.v_reset)
        return LIFState(v=v, refractory=full(shape, 0.0))

    def step(self, state: LIFState, current, dt: float):
        """Advance by `dt` ms under `current` [nA] held over the step; return `(state, spikes)`.

        Clamp refractory neurons, integrate the others (`method`), then spike, reset and
        start the refractory period, in the order of the class docstring. `spikes` is 0.0/1.0
        in the state's dtype, with the surrogate gradient.
        """
        i = input_current(current, state.v)
        v_inf = self.v_rest + self.r_m * i
        if self.method == "euler":
            v_free = state.v + (dt / self.tau_m) * (v_inf - state.v)
        else:
            v_free = v_inf + (state.v - v_inf) * jnp.exp(-dt / self.tau_m)
        clamped = refractory_clamped(state.refractory, dt)
        v = jnp.where(clamped, self.v_reset, v_free)
        s = self.surrogate((v - self.v_th) / (self.v_th - self.v_reset))
        # Detached reset: the surrogate gradient reaches the loss through the spike output,
        # not through the reset, so sub-threshold trajectories keep their exact gradient
        # (Zenke and Vogels 2021, Neural Comput 33:899, found detaching the reset helps).
        v = jnp.where(s > 0, self.v_reset, v)
        refractory = refractory_next(state.refractory, clamped, s, self.t_ref, dt)
        return LIFState(v=v, refractory=refractory), s

    def fused_run(
        self, state: LIFState, inputs: Any, dt: float, n_rec: int, record_every: int, **options
    ) -> tuple[LIFState, Any] | None:
        """The whole run in one call, for the runs that `neurojax.simulate` can hand over
        with identical results: an uncoupled population with no input or one constant float
        input, spikes recorded as the bool raster or as counts (with state fields on a GPU) and
        none of `check`, `checkpoint`, `truncate_backprop` (`NeuronModel.fused_run` gives the
        arguments). On CPU one compiled kernel runs all steps, neuron block by neuron block;
        elsewhere a pure-JAX scan of the same arithmetic. `None` for any other run."""
        if not _lif_fused.applies(self, state, inputs, record_every=record_every, **options):
            return None
        return _lif_fused.run(self, state, inputs, dt, n_rec, record_every, options["record"])
