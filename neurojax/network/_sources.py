"""Spike sources: populations that emit spikes without integrating an input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import as_float, check_nonnegative, default_float, normalize_shape
from ..neurons._base import check_broadcast

__all__ = ["PoissonSource", "PoissonState"]


class PoissonState(eqx.Module):
    """State of a `PoissonSource`: its PRNG key and the spikes of the last step."""

    key: PRNGKeyArray
    spikes: Float[Array, "*batch n"]


class PoissonSource(eqx.Module):
    r"""Independent Poisson spike trains at a given rate.

    In each step of `dt` ms every neuron spikes with probability `rate * dt / 1000`
    (a Bernoulli approximation of a Poisson process, exact in the limit `dt -> 0`; at most one
    spike per step). A step whose probability would exceed 1 is refused rather than clipped.

    The PRNG key lives in the state and is split once per step, so runs are reproducible and a
    batch of trials given different keys draws independent trains.

    Args:
        rate: firing rate [Hz], >= 0: a scalar or one value per neuron.

    Use it as a population of a `nj.Network` (`{"ext": (nj.PoissonSource(15.0), 1000)}`) and
    connect it with `nj.Projection`, or step it alone with `nj.simulate`.

    Example:
    ```python
    src = nj.PoissonSource(rate=20.0)
    state = src.init_state(100, key=jax.random.key(0))
    _, rec = nj.simulate(src, state, dt=0.1, n_steps=10000)   # 1 s: ~20 spikes per neuron
    ```
    """

    rate: Float[Array, "..."] = eqx.field(converter=as_float)
    max_rate: float = eqx.field(static=True)

    def __init__(self, rate: float = 10.0):
        self.rate = as_float(rate)
        check_nonnegative("PoissonSource", "rate", self.rate, "Hz")
        if isinstance(self.rate, jax.core.Tracer):
            self.max_rate = float("inf")
        else:
            self.max_rate = float(np.max(np.asarray(self.rate))) if self.rate.size else 0.0

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> PoissonState:
        """A state for `shape` sources (batch dimensions first); `key` is required."""
        shape = normalize_shape("PoissonSource.init_state", shape)
        check_broadcast(self, shape)
        if key is None:
            raise ValueError("PoissonSource.init_state: key is required (a jax.random.key)")
        return PoissonState(key=key, spikes=jnp.zeros(shape, default_float()))

    def check_dt(self, dt: float) -> None:
        """Raise when `rate * dt` would make a spike probability above 1."""
        if self.max_rate * dt > 1000.0:
            raise ValueError(
                f"PoissonSource: rate * dt must be <= 1000 (one spike per step at most), got "
                f"max rate {self.max_rate} Hz with dt={dt} ms; lower dt or the rate"
            )

    def step(self, state: PoissonState, current=None, dt: float = 0.1):
        """Draw this step's spikes; `current` is ignored (sources have no membrane)."""
        self.check_dt(dt)
        key, sub = jr.split(state.key)
        p = self.rate * (dt * 1e-3)
        u = jr.uniform(sub, state.spikes.shape, dtype=state.spikes.dtype)
        spikes = (u < p).astype(state.spikes.dtype)
        return PoissonState(key=key, spikes=spikes), spikes
