"""Spike sources: populations that emit spikes without integrating an input."""

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import as_float, check_nonnegative, default_float, normalize_shape
from ..neurons._base import check_broadcast

__all__ = ["SpikeSource", "PoissonSource", "PoissonState"]


class SpikeSource(eqx.Module):
    r"""A population that emits spikes without integrating an input.

    A network steps a spike source like a neuron model but hands it no current, lets no
    projection target it, and makes its state from a PRNG key (`Network.init_state` refuses
    to start one without a key). `nj.parallel.shard_network` steps each device's block of it
    with `step_block`.

    A subclass implements:

    - `init_state(shape, *, key)`: the state for `shape` sources (batch dimensions first);
    - `step(state, current, dt) -> (state, spikes)`: this step's 0/1 spikes (`current` is
      ignored);
    - `step_block(state, dt, *, size, padded_size, block, axis_name)`: the same step on one
      device of a sharded network, which holds the sources
      `[d * block, (d + 1) * block)` of a population of `size` sources padded to
      `padded_size` (`d = lax.axis_index(axis_name)`); per-source leaves of `state` have
      `block` entries and its spikes must be those of the unsharded `step`, whatever the
      number of devices;

    and may override `check_dt(dt)`, which raises when `dt` does not suit the source
    (called once before a sharded run, and by `step`), and `max_spikes_per_step`, the most
    spikes one source emits in one step (default 1: 0/1 spikes). A source that emits counts
    says how many it can, and `nj.simulate` then records its counts instead of booleans.

    Example:
    ```python
    class Regular(nj.network.SpikeSource):
        # Every source spikes once every `period` steps, all in phase.
        period: int = eqx.field(static=True)

        def init_state(self, shape, *, key=None):
            return jnp.zeros(shape, jnp.int32)

        def step(self, state, current=None, dt=0.1):
            return state + 1, (state % self.period == 0).astype(jnp.float32)

        def step_block(self, state, dt, *, size, padded_size, block, axis_name):
            return self.step(state, None, dt)

    net = nj.Network(
        {"clock": (Regular(100), 10), "E": (nj.LIF(), 10)},
        [nj.Projection("clock", "E", nj.connect.one_to_one(10, weight=200.0))],
    )
    _, rec = nj.simulate(net, net.init_state(jax.random.key(0)), dt=0.1, n_steps=1000)
    rec.spikes["E"].sum()   # 100: each clock spike makes its target fire
    ```
    """

    max_spikes_per_step: ClassVar[int] = 1

    @abc.abstractmethod
    def init_state(self, shape: int | tuple[int, ...], *, key: PRNGKeyArray | None = None) -> Any:
        """A state for `shape` sources, batch dimensions first."""

    @abc.abstractmethod
    def step(self, state: Any, current: Any = None, dt: float = 0.1) -> tuple[Any, Any]:
        """This step's state and 0/1 spikes; `current` is ignored."""

    @abc.abstractmethod
    def step_block(
        self, state: Any, dt: float, *, size: int, padded_size: int, block: int, axis_name: Any
    ) -> tuple[Any, Any]:
        """One device's block of `step` inside `nj.parallel.shard_network` (see above)."""

    def check_dt(self, dt: float) -> None:
        """Raise `ValueError` when `dt` [ms] does not suit the source (by default any does)."""


class PoissonState(eqx.Module):
    """State of a `PoissonSource`: its PRNG key and the spikes of the last step."""

    key: PRNGKeyArray
    spikes: Float[Array, "*batch n"]


class PoissonSource(SpikeSource):
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

    def step_block(
        self,
        state: PoissonState,
        dt: float,
        *,
        size: int,
        padded_size: int,
        block: int,
        axis_name: Any,
    ) -> tuple[PoissonState, Float[Array, " block"]]:
        """One device's block of `step`: the uniform numbers of the whole population are
        drawn from the (replicated) key and the device keeps its block, so the spikes are
        those of the unsharded run on any number of devices (padding sources never spike)."""
        key, sub = jr.split(state.key)
        u = jr.uniform(sub, (size,), dtype=state.spikes.dtype)
        if padded_size > size:
            u = jnp.concatenate([u, jnp.ones((padded_size - size,), u.dtype)])
        start = lax.axis_index(axis_name).astype(jnp.int32) * block
        u = lax.dynamic_slice_in_dim(u, start, block)
        p = self.rate * (dt * 1e-3)
        spikes = (u < p).astype(state.spikes.dtype)
        return PoissonState(key=key, spikes=spikes), spikes
