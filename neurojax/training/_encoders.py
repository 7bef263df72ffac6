"""Spike encoders: turn static features into time-major input sequences.

Every encoder returns an array of shape `(n_steps, *x.shape)` (time first, as every input
and recording in neurojax) in the default float dtype, ready to be multiplied by a layer's
weights or passed to `neurojax.simulate` as a time series.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._validation import check_positive_int, default_float, is_concrete

__all__ = ["rate_encode", "poisson_encode", "latency_encode", "current_encode"]


def _features(owner: str, x: ArrayLike) -> Float[Array, "..."]:
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{owner}: x must be an array of real numbers, got {x!r}")
    arr = x if isinstance(x, jax.Array) else np.asarray(x)
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise TypeError(f"{owner}: x must hold real numbers, got dtype {arr.dtype}")
    return jnp.asarray(arr, dtype=default_float())


def _check_range(owner: str, name: str, x: Float[Array, "..."], lo: float, hi: float, hint=""):
    """Raise eagerly for concrete values outside [lo, hi]; under jit, raise via error_if."""
    if is_concrete(x):
        a = np.asarray(x)
        bad = ~((a >= lo) & (a <= hi))
        if bad.any():
            raise ValueError(
                f"{owner}: {name} must lie in [{lo:g}, {hi:g}]{hint}; got {bad.sum()} values "
                f"outside it (min {np.nanmin(a):g}, max {np.nanmax(a):g})"
            )
    return x


def _key(owner: str, key) -> PRNGKeyArray:
    if key is None:
        raise ValueError(f"{owner}: key is required (a jax.random key), got None")
    return key


def rate_encode(
    x: ArrayLike, n_steps: int, *, key: PRNGKeyArray, gain: float = 1.0
) -> Float[Array, "t ..."]:
    """Bernoulli rate code: a feature `x` in [0, 1] spikes at each step with probability `gain * x`.

    Independent draws per step and feature, so the spike count of a feature over `n_steps`
    steps is Binomial(`n_steps`, `gain * x`).

    Args:
        x: features in [0, 1] (any shape, for example `(batch, n_in)`).
        n_steps: number of time steps (positive int).
        key: a `jax.random` key (keyword-only).
        gain: scale of the spike probability, in (0, 1]; `gain * x` is the probability.

    Returns:
        0.0/1.0 spikes of shape `(n_steps, *x.shape)`.

    Example:
    ```python
    spikes = nj.training.rate_encode(jnp.array([0.0, 0.5, 1.0]), 100, key=jr.key(0))
    spikes.sum(0)    # about [0, 50, 100]
    ```
    """
    owner = "rate_encode"
    x = _check_range(owner, "x", _features(owner, x), 0.0, 1.0, " (scale features first)")
    n_steps = check_positive_int(owner, "n_steps", n_steps)
    if not (isinstance(gain, (int, float)) and 0.0 < gain <= 1.0):
        raise ValueError(f"{owner}: gain must be a number in (0, 1], got {gain!r}")
    u = jr.uniform(_key(owner, key), (n_steps,) + x.shape, dtype=x.dtype)
    return (u < gain * x).astype(x.dtype)


def poisson_encode(
    rates: ArrayLike, n_steps: int, *, dt: float, key: PRNGKeyArray
) -> Float[Array, "t ..."]:
    """Poisson spike trains at given rates [Hz], sampled on a time grid of step `dt` [ms].

    Each step a neuron spikes with probability `rate * dt / 1000` (at most one spike per
    step). A rate whose probability would exceed 1 is rejected rather than clipped.

    Args:
        rates: firing rates [Hz], >= 0, any shape.
        n_steps: number of steps (positive int).
        dt: time step [ms], > 0.
        key: a `jax.random` key (keyword-only).

    Returns:
        0.0/1.0 spikes of shape `(n_steps, *rates.shape)`.
    """
    owner = "poisson_encode"
    rates = _features(owner, rates)
    n_steps = check_positive_int(owner, "n_steps", n_steps)
    if not (isinstance(dt, (int, float)) and dt > 0 and np.isfinite(dt)):
        raise ValueError(f"{owner}: dt must be a positive number of ms, got {dt!r}")
    _check_range(
        owner, "rates", rates, 0.0, 1000.0 / dt, f" Hz (at most one spike per step of {dt:g} ms)"
    )
    u = jr.uniform(_key(owner, key), (n_steps,) + rates.shape, dtype=rates.dtype)
    return (u < rates * (dt / 1000.0)).astype(rates.dtype)


def latency_encode(
    x: ArrayLike,
    n_steps: int,
    *,
    tau: float | None = None,
    threshold: float = 0.01,
) -> Float[Array, "t ..."]:
    """Time-to-first-spike code: each feature spikes once, stronger features earlier.

    Linear code (`tau=None`, default): a feature `x` in [0, 1] spikes at step
    `round((1 - x) * (n_steps - 1))`, so `x = 1` fires at the first step and `x = 0` at the
    last. RC code (`tau` in steps): the feature is the input current of a leaky integrator
    (unit time constant `tau`, threshold `threshold`) charging from rest, which crosses at
    `t = tau * ln(x / (x - threshold))`; features at or below `threshold` never fire, and
    crossing times after the last step are not emitted.

    Args:
        x: features in [0, 1], any shape.
        n_steps: number of steps (positive int).
        tau: time constant [steps] of the RC code, > 0, or `None` for the linear code.
        threshold: features <= `threshold` do not spike (both codes); in [0, 1).

    Returns:
        0.0/1.0 spikes of shape `(n_steps, *x.shape)`, at most one spike per feature.
    """
    owner = "latency_encode"
    x = _check_range(owner, "x", _features(owner, x), 0.0, 1.0, " (scale features first)")
    n_steps = check_positive_int(owner, "n_steps", n_steps)
    if not (isinstance(threshold, (int, float)) and 0.0 <= threshold < 1.0):
        raise ValueError(f"{owner}: threshold must be a number in [0, 1), got {threshold!r}")
    if tau is None:
        t = jnp.round((1.0 - x) * (n_steps - 1))
    else:
        if not (isinstance(tau, (int, float)) and tau > 0 and np.isfinite(tau)):
            raise ValueError(f"{owner}: tau must be a positive number of steps, got {tau!r}")
        safe = jnp.where(x > threshold, x, 1.0)
        t = jnp.round(tau * jnp.log(safe / (safe - threshold)))
    fires = (x > threshold) & (t <= n_steps - 1)
    steps = jnp.arange(n_steps, dtype=x.dtype).reshape((n_steps,) + (1,) * x.ndim)
    return ((steps == t) & fires).astype(x.dtype)


def current_encode(x: ArrayLike, n_steps: int, *, gain: float = 1.0) -> Float[Array, "t ..."]:
    """Direct (current) code: the features, times `gain`, repeated at every step.

    The first layer then integrates the analogue values as input currents; this is the
    usual code for static data such as images (no sampling noise).

    Args:
        x: features, any shape and any finite values.
        n_steps: number of steps (positive int).
        gain: factor applied to `x`.

    Returns:
        An array of shape `(n_steps, *x.shape)`.
    """
    owner = "current_encode"
    x = _features(owner, x)
    n_steps = check_positive_int(owner, "n_steps", n_steps)
    if not (isinstance(gain, (int, float)) and np.isfinite(gain)):
        raise ValueError(f"{owner}: gain must be a finite number, got {gain!r}")
    if is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        raise ValueError(f"{owner}: x must be finite, got non-finite values")
    return jnp.broadcast_to(gain * x, (n_steps,) + x.shape)
