"""The interface every neuron model implements."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import default_float, normalize_shape

__all__ = [
    "NeuronModel",
    "input_current",
    "check_broadcast",
    "refractory_clamped",
    "refractory_next",
]


class NeuronModel(eqx.Module):
    """A population of point neurons with a pure, explicit-state update.

    Subclasses hold their parameters as array leaves (scalars, or arrays broadcastable to the
    population such as one value per neuron) and implement:

    - `init_state(shape, *, key=None)`: the state PyTree for a population of `shape`
      (an int `n` or a tuple `(*batch, n)`); it has at least a field `v` [mV];
    - `step(state, current, dt) -> (state, spikes)`: advance by `dt` ms under an input
      `current` that is held constant over the step and broadcastable to the state's shape
      (`None` means no input). `spikes` is 0.0/1.0 in the state's dtype and carries the
      surrogate gradient of the model's `surrogate` field.

    `step` performs no validation: it is the hot loop. Shapes and `dt` are checked once by
    `neurojax.simulate`, parameters by the constructor.
    """

    @abc.abstractmethod
    def init_state(self, shape: int | tuple[int, ...], *, key: PRNGKeyArray | None = None) -> Any:
        """A state for a population of `shape`, batch dimensions first."""

    @abc.abstractmethod
    def step(self, state: Any, current: Any, dt: float) -> tuple[Any, Float[Array, "..."]]:
        """Advance `state` by `dt` ms; return the new state and the 0/1 spikes."""

    def _shape(self, shape: Any) -> tuple[int, ...]:
        shape = normalize_shape(f"{type(self).__name__}.init_state", shape)
        check_broadcast(self, shape)
        return shape


def input_current(current: Any, like: Float[Array, "..."]) -> Float[Array, "..."]:
    """The step input as an array of `like`'s dtype; `None` means zero input."""
    if current is None:
        return jnp.zeros((), like.dtype)
    return jnp.asarray(current, dtype=like.dtype)


def check_broadcast(model: eqx.Module, shape: tuple[int, ...]) -> None:
    """Raise if a parameter array cannot broadcast to a population of `shape`."""
    for name, value in vars(model).items():
        if not isinstance(value, jax.Array) or value.ndim == 0:
            continue
        try:
            out = jnp.broadcast_shapes(value.shape, shape)
        except ValueError:
            out = None
        if out != shape:
            raise ValueError(
                f"{type(model).__name__}: parameter {name} has shape {value.shape}, which does not"
                f" broadcast to the population shape {shape} (per-neuron parameters need shape"
                " (n,) matching the last state axis)"
            )


def full(shape: tuple[int, ...], value: Any) -> Float[Array, "..."]:
    """An array of `shape` and the default float dtype filled with (broadcast) `value`."""
    return jnp.broadcast_to(jnp.asarray(value, default_float()), shape)


def refractory_clamped(refractory: Float[Array, "..."], dt: float) -> Float[Array, "..."]:
    """Whether a neuron with `refractory` ms left stays clamped during this step.

    Compared with `dt / 2` so that a refractory period lasts `round(t_ref / dt)` whole steps
    rather than depending on the rounding of repeated float subtraction.
    """
    return refractory > 0.5 * dt


def refractory_next(
    refractory: Float[Array, "..."],
    clamped: Float[Array, "..."],
    spikes: Float[Array, "..."],
    t_ref: Float[Array, "..."],
    dt: float,
) -> Float[Array, "..."]:
    """Refractory time left after the step: `t_ref` after a spike, else counted down by `dt`."""
    return jnp.where(spikes > 0, t_ref, jnp.where(clamped, refractory - dt, 0.0))
