r"""Exponential, alpha, dual-exponential and delta synaptic kinetics, integrated exactly."""

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import as_float, check_less, check_positive, normalize_shape, zeros
from ._base import SynapseDynamics

__all__ = [
    "Exponential",
    "ExponentialState",
    "Alpha",
    "AlphaState",
    "DualExponential",
    "DualExponentialState",
    "Delta",
    "DeltaState",
]


def _zeros(owner: str, shape, like) -> Float[Array, "..."]:
    return zeros(normalize_shape(owner, shape), jnp.result_type(like))


def _arrivals(x, like) -> Float[Array, "..."]:
    return jnp.zeros((), like.dtype) if x is None else jnp.asarray(x, dtype=like.dtype)


class ExponentialState(eqx.Module):
    """State of `Exponential` kinetics: the synaptic variable of each postsynaptic neuron."""

    g: Float[Array, "*batch n"]  # synaptic variable (units of the weights)


class Exponential(SynapseDynamics):
    r"""Instantaneous rise, exponential decay: $K(t) = e^{-t/\tau}$.

    $$\frac{dg}{dt} = -\frac{g}{\tau} + \sum_k w_k \delta(t - t_k)$$

    Step: `g <- g exp(-dt / tau) + x`. Exact for spikes on the time grid.

    Args:
        tau: decay time constant [ms], > 0 (scalar or one per postsynaptic neuron).

    Units: `g` has the units of the weights (nA for current synapses, uS or nS for
    conductances, or dimensionless in units of a leak conductance).

    Example:
    ```python
    syn = nj.Exponential(tau=5.0)
    state, g = syn.step(syn.init_state(2), jnp.array([1.0, 0.0]), 0.1)   # g = [1, 0]
    ```
    """

    tau: Float[Array, "..."] = eqx.field(default=5.0, converter=as_float)

    def __check_init__(self):
        check_positive("Exponential", "tau", self.tau, "ms")

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> ExponentialState:
        """Zero state for `shape` postsynaptic neurons (batch dimensions first)."""
        return ExponentialState(g=_zeros("Exponential.init_state", shape, self.tau))

    def step(self, state: ExponentialState, x, dt: float):
        """Decay over `dt` ms, add the arriving weights `x`; return `(state, g)`."""
        g = state.g * jnp.exp(-dt / self.tau) + _arrivals(x, state.g)
        return ExponentialState(g=g), g


class AlphaState(eqx.Module):
    """State of `Alpha` kinetics: `g` and its auxiliary variable `h` per postsynaptic neuron."""

    g: Float[Array, "*batch n"]  # synaptic variable (units of the weights)
    h: Float[Array, "*batch n"]  # auxiliary variable [weight units / ms]


class Alpha(SynapseDynamics):
    r"""Alpha function: $K(t) = \frac{t}{\tau} e^{1 - t/\tau}$, peak 1 at $t = \tau$.

    $$\frac{dh}{dt} = -\frac{h}{\tau} + \frac{e}{\tau}\sum_k w_k \delta(t - t_k),\qquad
      \frac{dg}{dt} = -\frac{g}{\tau} + h$$

    Step (exact solution of the linear system over `dt`, both variables decaying with the
    same time constant): `g <- (g + dt h) exp(-dt/tau)`, `h <- h exp(-dt/tau) + (e/tau) x`.
    The time integral of the kernel is `e tau`.

    Args:
        tau: time to peak [ms], > 0.
    """

    tau: Float[Array, "..."] = eqx.field(default=5.0, converter=as_float)

    def __check_init__(self):
        check_positive("Alpha", "tau", self.tau, "ms")

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> AlphaState:
        """Zero state for `shape` postsynaptic neurons (batch dimensions first)."""
        z = _zeros("Alpha.init_state", shape, self.tau)
        return AlphaState(g=z, h=z)

    def step(self, state: AlphaState, x, dt: float):
        """Advance `(g, h)` exactly over `dt` ms, add the arriving weights `x` to `h` (times
        `e / tau`); return `(state, g)`."""
        decay = jnp.exp(-dt / self.tau)
        g = (state.g + dt * state.h) * decay
        h = state.h * decay + (math.e / self.tau) * _arrivals(x, state.g)
        return AlphaState(g=g, h=h), g


class DualExponentialState(eqx.Module):
    """State of `DualExponential` kinetics: its two components (`g = decay - rise`)."""

    decay: Float[Array, "*batch n"]  # slow component (units of the weights)
    rise: Float[Array, "*batch n"]  # fast component (units of the weights)


class DualExponential(SynapseDynamics):
    r"""Difference of exponentials, normalised to a peak of 1.

    $$K(t) = N \left(e^{-t/\tau_d} - e^{-t/\tau_r}\right),\quad
      t_{peak} = \frac{\tau_d \tau_r}{\tau_d - \tau_r}\ln\frac{\tau_d}{\tau_r},\quad
      N = \frac{1}{e^{-t_{peak}/\tau_d} - e^{-t_{peak}/\tau_r}}$$

    Two exponentially decaying components that both jump by `N x`; `g = decay - rise`.
    Exact on the grid. The time integral of the kernel is `N (tau_decay - tau_rise)`.

    Args:
        tau_rise: rise time constant [ms], > 0 and < `tau_decay` (for equal constants use
            `Alpha`).
        tau_decay: decay time constant [ms].
    """

    tau_rise: Float[Array, "..."] = eqx.field(default=1.0, converter=as_float)
    tau_decay: Float[Array, "..."] = eqx.field(default=5.0, converter=as_float)

    def __check_init__(self):
        check_positive("DualExponential", "tau_rise", self.tau_rise, "ms")
        check_positive("DualExponential", "tau_decay", self.tau_decay, "ms")
        check_less("DualExponential", "tau_rise", self.tau_rise, "tau_decay", self.tau_decay)

    @property
    def t_peak(self) -> Float[Array, "..."]:
        """Time of the kernel's peak [ms]."""
        r, d = self.tau_rise, self.tau_decay
        return d * r / (d - r) * jnp.log(d / r)

    @property
    def norm(self) -> Float[Array, "..."]:
        """The factor `N` that makes the kernel's peak 1."""
        tp = self.t_peak
        return 1.0 / (jnp.exp(-tp / self.tau_decay) - jnp.exp(-tp / self.tau_rise))

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> DualExponentialState:
        """Zero state for `shape` postsynaptic neurons (batch dimensions first)."""
        z = _zeros("DualExponential.init_state", shape, self.tau_rise)
        return DualExponentialState(decay=z, rise=z)

    def step(self, state: DualExponentialState, x, dt: float):
        """Decay both components over `dt` ms, add `norm * x` to each; return
        `(state, decay - rise)`."""
        jump = self.norm * _arrivals(x, state.decay)
        decay = state.decay * jnp.exp(-dt / self.tau_decay) + jump
        rise = state.rise * jnp.exp(-dt / self.tau_rise) + jump
        return DualExponentialState(decay=decay, rise=rise), decay - rise


class DeltaState(eqx.Module):
    """State of `Delta` kinetics: the arriving weight of the last step divided by `dt`."""

    g: Float[Array, "*batch n"]  # arriving weight spread over one step [weight units / ms]


class Delta(SynapseDynamics):
    r"""No kinetics: each spike acts during exactly one step.

    `g = x / dt`, so that the time integral of `g` over the step equals the weight: a current
    synapse of weight `w` [nA ms = pC] delivers the charge `w`. With `nj.LIF` (exact
    integration, input held over the step) a weight `w` therefore moves `v` by
    `r_m w (1 - exp(-dt/tau_m)) / dt`, which tends to the jump `r_m w / tau_m` of a true delta
    current as `dt -> 0`.
    """

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> DeltaState:
        """Zero state for `shape` postsynaptic neurons (batch dimensions first)."""
        return DeltaState(g=_zeros("Delta.init_state", shape, 0.0))

    def step(self, state: DeltaState, x, dt: float):
        """Return `(state, x / dt)`: the arriving weights spread over this one step."""
        g = _arrivals(x, state.g) / dt
        return DeltaState(g=jnp.broadcast_to(g, state.g.shape)), g
