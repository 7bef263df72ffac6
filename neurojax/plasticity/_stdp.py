r"""Pair-based spike-timing-dependent plasticity with exponential traces.

Every synapse `i -> j` of a plastic projection changes its weight at two kinds of events:

- when a presynaptic spike **arrives** at the synapse (after the projection's delay), the
  weight is depressed by `a_minus * f_-(w) * y_j`, where `y_j` is the postsynaptic trace;
- when the postsynaptic neuron **spikes**, the weight is potentiated by
  `a_plus * f_+(w) * x_i`, where `x_i` is the trace of the presynaptic arrivals.

Traces decay exactly, `x <- x exp(-dt / tau_plus)` and `y <- y exp(-dt / tau_minus)` per step,
and grow by 1 at each event (`pairing="all_to_all"`: every earlier spike pairs with every later
one) or are reset to 1 (`pairing="nearest"`: only the most recent spike of the other side
counts). For one pair with `dt = t_post - t_pre` (the arrival time at the synapse) this gives
the window of Song, Miller and Abbott (2000):

$$\Delta w = a_+ e^{-\Delta t/\tau_+}\ (\Delta t \ge 0),\qquad
  \Delta w = -a_- e^{\Delta t/\tau_-}\ (\Delta t < 0).$$

A pre arrival and a post spike in the same step (`dt = 0`) count as pre before post: the
synapse is potentiated by `a_plus`.

`mode="additive"`: `f_+ = f_- = 1`, weights clipped to `[w_min, w_max]` after each event (hard
bounds). `mode="multiplicative"`: `f_+ = w_max - w`, `f_- = w - w_min` (soft bounds, van Rossum
et al. 2000), which keep the weight inside the bounds by themselves; the clip is kept for
rounding.
"""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._validation import as_float, check_choice, check_less, check_nonnegative, check_positive
from ._base import PairKernel, PlasticityRule, PlasticState

__all__ = ["STDP", "STDPState"]

_MODES = ("additive", "multiplicative")
_PAIRINGS = ("all_to_all", "nearest")


class STDPState(PlasticState):
    """The plastic state of a projection under `nj.STDP`: a `PlasticState` whose one
    presynaptic and one postsynaptic trace are also named `x` and `y`.

    Attributes:
        weights: current weights, `(*batch, nnz)` in the projection's CSR order.
        pre_traces: `(x,)`, the trace of the presynaptic arrivals, `(*batch, n_pre)`.
        post_traces: `(y,)`, the postsynaptic trace, `(*batch, n_post)`.
        history: presynaptic spikes of the last `d` steps for a delay of `d` steps,
            `(*batch, d, n_pre)`, or None without delay.
    """

    @property
    def x(self) -> Float[Array, "*batch n_pre"]:
        """The presynaptic trace, `pre_traces[0]`."""
        return self.pre_traces[0]

    @property
    def y(self) -> Float[Array, "*batch n_post"]:
        """The postsynaptic trace, `post_traces[0]`."""
        return self.post_traces[0]


class STDP(PlasticityRule):
    """Trace-based pair STDP, used as `nj.Projection(..., plasticity=nj.STDP(...))`.

    The first concrete `PlasticityRule`: one presynaptic trace `x` and one postsynaptic
    trace `y`, depression on an arrival (`on_pre`), potentiation on a postsynaptic spike
    (`on_post`). On CPU it runs in the compiled pair-STDP kernel (`pair_kernel`).

    Args:
        a_plus: potentiation amplitude (weight units), >= 0.
        a_minus: depression amplitude (weight units), >= 0.
        tau_plus: time constant of the presynaptic trace [ms], > 0.
        tau_minus: time constant of the postsynaptic trace [ms], > 0.
        w_min: lower weight bound, `< w_max`.
        w_max: upper weight bound.
        mode: `"additive"` (hard bounds) or `"multiplicative"` (soft bounds).
        pairing: `"all_to_all"` (traces accumulate) or `"nearest"` (traces reset to 1).

    All numeric parameters are array leaves: they can be swept with `jax.vmap` and
    differentiated with `jax.grad` without recompiling.

    Example:
    ```python
    stdp = nj.STDP(a_plus=0.005, a_minus=0.00525, tau_plus=20.0, tau_minus=20.0, w_max=0.01)
    proj = nj.Projection("inputs", "cell", conn, synapse=nj.Exponential(5.0), plasticity=stdp)
    ```
    """

    a_plus: Float[Array, ""] = eqx.field(default=0.01, converter=as_float)
    a_minus: Float[Array, ""] = eqx.field(default=0.0105, converter=as_float)
    tau_plus: Float[Array, ""] = eqx.field(default=20.0, converter=as_float)
    tau_minus: Float[Array, ""] = eqx.field(default=20.0, converter=as_float)
    w_min: Float[Array, ""] = eqx.field(default=0.0, converter=as_float)
    w_max: Float[Array, ""] = eqx.field(default=1.0, converter=as_float)
    mode: str = eqx.field(default="additive", static=True)
    pairing: str = eqx.field(default="all_to_all", static=True)

    n_pre_traces: ClassVar[int] = 1
    n_post_traces: ClassVar[int] = 1
    state_class: ClassVar[type[PlasticState]] = STDPState

    def __check_init__(self):
        check_choice("STDP", "mode", self.mode, _MODES)
        check_choice("STDP", "pairing", self.pairing, _PAIRINGS)
        check_nonnegative("STDP", "a_plus", self.a_plus)
        check_nonnegative("STDP", "a_minus", self.a_minus)
        check_positive("STDP", "tau_plus", self.tau_plus, "ms")
        check_positive("STDP", "tau_minus", self.tau_minus, "ms")
        check_less("STDP", "w_min", self.w_min, "w_max", self.w_max)
        for name in ("a_plus", "a_minus", "tau_plus", "tau_minus", "w_min", "w_max"):
            if getattr(self, name).ndim:
                raise ValueError(
                    f"STDP: {name} must be a scalar, got shape {getattr(self, name).shape}"
                )

    def f_plus(self, w):
        """Weight dependence of potentiation."""
        return jnp.ones_like(w) if self.mode == "additive" else self.w_max - w

    def f_minus(self, w):
        """Weight dependence of depression."""
        return jnp.ones_like(w) if self.mode == "additive" else w - self.w_min

    def trace(self, trace, spikes):
        """Trace after this step's events (the trace is already decayed to the step's end)."""
        if self.pairing == "nearest":
            return jnp.where(spikes > 0, jnp.ones_like(trace), trace)
        return trace + spikes

    def decays(self, dt: float):
        """Per-step decay factors of the presynaptic and postsynaptic traces."""
        return jnp.exp(-dt / self.tau_plus), jnp.exp(-dt / self.tau_minus)

    def trace_decays(self, dt: float):
        """`((exp(-dt / tau_plus),), (exp(-dt / tau_minus),))`: the decay of `x` and `y`."""
        decay_x, decay_y = self.decays(dt)
        return (decay_x,), (decay_y,)

    def update_pre_traces(self, traces, spikes):
        """`x` after this step's arrivals: +1 per arrival, or set to 1 (`nearest`)."""
        return (self.trace(traces[0], spikes),)

    def update_post_traces(self, traces, spikes):
        """`y` after this step's postsynaptic spikes: +1 per spike, or set to 1 (`nearest`)."""
        return (self.trace(traces[0], spikes),)

    def on_pre(self, w, pre, post, s):
        """Depression on an arrival: `w - a_minus f_-(w) y`, clipped to the bounds."""
        return self.clip(w - self.a_minus * self.f_minus(w) * post[0] * s)

    def on_post(self, w, pre, post, s):
        """Potentiation on a postsynaptic spike: `w + a_plus f_+(w) x`, clipped to the
        bounds (`x` includes this step's arrivals)."""
        return self.clip(w + self.a_plus * self.f_plus(w) * pre[0] * s)

    def pair_kernel(self) -> PairKernel | None:
        """This rule's parameters for the compiled pair-STDP kernel. A subclass that
        redefines an event or trace method gets None (the generic event path), so the kernel
        never runs a rule it does not implement."""
        for name in _KERNEL_METHODS:
            if getattr(type(self), name) is not getattr(STDP, name):
                return None
        return PairKernel(
            a_plus=self.a_plus,
            a_minus=self.a_minus,
            w_min=self.w_min,
            w_max=self.w_max,
            multiplicative=self.mode == "multiplicative",
            nearest=self.pairing == "nearest",
        )


_KERNEL_METHODS = (
    "f_plus",
    "f_minus",
    "clip",
    "trace",
    "decays",
    "trace_decays",
    "update_pre_traces",
    "update_post_traces",
    "on_pre",
    "on_post",
    "dense_update",
)
