"""Interfaces of synaptic kinetics and of how a synaptic variable becomes a current."""

import abc
from typing import Any

import equinox as eqx
from jaxtyping import Array, Float, Int, PRNGKeyArray

__all__ = ["SynapseDynamics", "SynapseOutput", "ShortTermRule"]


class SynapseDynamics(eqx.Module):
    """Kinetics of a linear synapse, summed per postsynaptic neuron.

    Linear kinetics superpose, so all synapses of one type onto a neuron share one state
    (as Brian2 and NEST do for linear synapses): the cost of a step grows with the number of
    postsynaptic neurons, never with the number of synapses.

    - `init_state(shape, *, key=None)`: the state for `shape` postsynaptic neurons (zero).
    - `step(state, x, dt) -> (state, g)`: `x` is the summed weight of the spikes that arrive
      during this step (per postsynaptic neuron); `g` is the synaptic variable after the step.
      Kinetics are integrated exactly, so `g` samples the synaptic kernel exactly at the grid
      points: a spike of weight `w` arriving in step `k` gives `g = w K(m dt)` after step
      `k + m` (`m >= 0`), where `K` is the kernel of the class, normalised to a peak of 1.

    In a network the new `g` drives the postsynaptic neuron from the next step on, so a spike
    acts after at least one step (the same order as Brian2's default schedule).
    """

    @abc.abstractmethod
    def init_state(self, shape: int | tuple[int, ...], *, key: PRNGKeyArray | None = None) -> Any:
        """The zero state for `shape` postsynaptic neurons."""

    @abc.abstractmethod
    def step(self, state: Any, x: Any, dt: float) -> tuple[Any, Float[Array, "..."]]:
        """Decay over `dt` ms, add the arriving weights `x`; return the state and `g`."""


class SynapseOutput(eqx.Module):
    """Turns a synaptic variable `g` into a current for the postsynaptic neuron."""

    @abc.abstractmethod
    def __call__(self, g: Float[Array, "..."], v: Float[Array, "..."]) -> Float[Array, "..."]:
        """The current given `g` and the postsynaptic membrane potential `v` [mV]."""


class ShortTermRule(eqx.Module):
    """Short-term plasticity of a projection's presynaptic side (`nj.Projection(...,
    short_term=rule)`): each spike delivers, instead of 1, a value the rule computes from a
    state per presynaptic neuron, carried through the delay to every synapse of the neuron.
    `nj.TsodyksMarkram` is one; a rule of your own subclasses this and implements:

    - `init_state(shape)`: the rested state for `shape` presynaptic neurons (batch axes
      first), a PyTree of arrays of that shape;
    - `release(state, spikes, step, dt) -> (state, release)`: the spikes `(*batch, n_pre)`
      emitted during step `step` (dated at its end), the new state and the value each
      neuron's synapses deliver (0 where it did not spike).

    and may override `check_size(owner, n_pre)`, which `nj.Projection` calls to refuse
    per-neuron parameters of another size (the default checks every 1-D array field).

    The network calls `release` once per step for the projection, in its step's order (see
    `neurojax.network._phases`), and keeps the state in `NetworkState.short_term`, so a rule
    runs under `jit`, `vmap` and `grad` like the rest of the network.

    Example:
    ```python
    class Halving(nj.synapses.ShortTermRule):
        \"\"\"Each spike releases the available fraction r and halves it; r recovers to 1
        with time constant tau_rec [ms].\"\"\"

        tau_rec: float = 50.0

        def init_state(self, shape):
            return jnp.ones(shape)

        def release(self, r, spikes, step, dt):
            r = 1.0 - (1.0 - r) * jnp.exp(-dt / self.tau_rec)
            out = spikes * r
            return r - 0.5 * out, out
    ```
    """

    @abc.abstractmethod
    def init_state(self, shape: int | tuple[int, ...]) -> Any:
        """The rested state for `shape` presynaptic neurons (batch axes first)."""

    @abc.abstractmethod
    def release(
        self, state: Any, spikes: Float[Array, "*batch n_pre"], step: Int[Array, ""], dt: float
    ) -> tuple[Any, Float[Array, "*batch n_pre"]]:
        """The new state and the value each presynaptic neuron's synapses deliver."""

    def check_size(self, owner: str, n_pre: int) -> None:
        """Raise `ValueError` unless every per-neuron (1-D array) parameter has `n_pre`
        entries."""
        for name, value in vars(self).items():
            if getattr(value, "ndim", 0) == 1 and value.shape[0] != n_pre:
                raise ValueError(
                    f"{owner}: short_term.{name} has {value.shape[0]} values but the "
                    f"presynaptic population has {n_pre} neurons (give a scalar or {n_pre})"
                )
