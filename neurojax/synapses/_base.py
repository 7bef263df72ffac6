"""Interfaces of synaptic kinetics and of how a synaptic variable becomes a current."""

import abc
from typing import Any

import equinox as eqx
from jaxtyping import Array, Float, PRNGKeyArray

__all__ = ["SynapseDynamics", "SynapseOutput"]


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
