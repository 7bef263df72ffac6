r"""Synaptic weights: scalars, per-synapse arrays, callables and random distributions.

Every builder takes a `weight` argument, resolved here into one value per synapse (the BCOO
`data`, in the default float dtype) in the builder's output order, which is row-major:
sorted by presynaptic index, then postsynaptic index. `weight` may be

- a real scalar: every synapse gets it;
- an array of length `n_synapses`, in that output order. The order is only known once the
  structure exists, so either build first with `weight=1.0` and read `conn.indices`
  (`conn.indices[:, 0]` pre, `conn.indices[:, 1]` post), or pass a callable;
- a callable `weight(pre, post) -> array`, called once with the int32 index arrays of all
  synapses in output order; it returns one weight per synapse (or a scalar);
- a `Distribution` (`normal`, `lognormal`, `uniform`), sampled i.i.d. with a key derived
  from the builder's key (so the structure is the same whatever the weights are).
"""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax.scipy.special import ndtr, ndtri
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import (
    as_float,
    check_finite,
    check_less,
    check_nonnegative,
    default_float,
    is_concrete,
)

__all__ = [
    "Distribution",
    "Normal",
    "LogNormal",
    "Uniform",
    "normal",
    "lognormal",
    "uniform",
    "resolve_weights",
]

# Below this standardised mean, a normal restricted to w >= 0 keeps less than ~8e-24 of its
# mass: float32 cannot represent that tail, so such a request is refused rather than faked.
_MIN_TRUNCATED_Z = -10.0


def _scalar(owner: str, name: str, value: Any) -> None:
    if value.ndim != 0:
        raise ValueError(f"{owner}: {name} must be a scalar, got an array of shape {value.shape}")


class Distribution(eqx.Module):
    """A distribution of synaptic weights: `sample(key, shape)` draws i.i.d. values.

    Samples have the default float dtype (float32, or float64 with x64 enabled) and `sample`
    works under `jit` and `vmap`.
    """

    @abc.abstractmethod
    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
        """Draw an array of `shape` i.i.d. weights."""


class Normal(Distribution):
    r"""Normal weights $w \sim \mathcal{N}(\mu, \sigma^2)$.

    With `nonnegative=True` the weights follow the normal **conditioned on** $w \ge 0$ (a
    truncated normal), sampled exactly by inverting its CDF,
    $w = \mu - \sigma\,\Phi^{-1}\!\big(U\,\Phi(\mu/\sigma)\big)$ with $U$ uniform; nothing is
    clipped, and the mean of the result is larger than $\mu$:
    $\mu + \sigma\,\varphi(\mu/\sigma)/\Phi(\mu/\sigma)$. A distribution that keeps almost no
    mass at $w \ge 0$ ($\mu/\sigma < -10$) is refused.

    Args:
        mean: $\mu$, same unit as the weights.
        std: $\sigma \ge 0$.
        nonnegative: restrict to $w \ge 0$ as described above.
    """

    mean: Float[Array, ""] = eqx.field(converter=as_float)
    std: Float[Array, ""] = eqx.field(converter=as_float)
    nonnegative: bool = eqx.field(default=False, static=True)

    def __check_init__(self):
        _scalar("normal", "mean", self.mean)
        _scalar("normal", "std", self.std)
        check_finite("normal", "mean", self.mean)
        check_nonnegative("normal", "std", self.std)
        if not isinstance(self.nonnegative, bool):
            raise TypeError(f"normal: nonnegative must be True or False, got {self.nonnegative!r}")
        if self.nonnegative and is_concrete(self.mean) and is_concrete(self.std):
            mean, std = float(self.mean), float(self.std)
            if (std == 0 and mean < 0) or (std > 0 and mean / std < _MIN_TRUNCATED_Z):
                raise ValueError(
                    "normal: with nonnegative=True the distribution must keep some mass at w >= 0"
                    f" (mean / std >= {_MIN_TRUNCATED_Z:g}), got mean={mean!r} and std={std!r}"
                )

    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
        """Draw an array of `shape` i.i.d. weights (truncated to `w >= 0` if `nonnegative`)."""
        dtype = self.mean.dtype
        if not self.nonnegative:
            return self.mean + self.std * jr.normal(key, shape, dtype)
        # U in (0, 1]: U = 0 would map to w = +inf.
        u = 1.0 - jr.uniform(key, shape, dtype)
        safe_std = jnp.where(self.std > 0, self.std, 1.0)
        b = jnp.where(self.std > 0, self.mean / safe_std, jnp.inf)
        w = self.mean - self.std * ndtri(u * ndtr(b))
        # The inverse CDF lands on w >= 0 up to rounding; a rounding residue below zero (a few
        # ulps, never a genuine draw) is mapped to +0 to keep the documented guarantee.
        return jnp.where(w < 0, jnp.zeros((), dtype), w)


class LogNormal(Distribution):
    r"""Log-normal weights $w = \exp(\mu + \sigma Z)$, $Z \sim \mathcal{N}(0, 1)$.

    `mean` and `sigma` are those of $\log w$ (NumPy's convention); the weights have mean
    $\exp(\mu + \sigma^2/2)$ and variance $(e^{\sigma^2} - 1)\,e^{2\mu + \sigma^2}$. To get
    weights of mean $m$ and standard deviation $s$, use
    $\sigma^2 = \log(1 + s^2/m^2)$ and $\mu = \log m - \sigma^2/2$. Always positive.
    """

    mean: Float[Array, ""] = eqx.field(converter=as_float)
    sigma: Float[Array, ""] = eqx.field(converter=as_float)

    def __check_init__(self):
        _scalar("lognormal", "mean", self.mean)
        _scalar("lognormal", "sigma", self.sigma)
        check_finite("lognormal", "mean", self.mean)
        check_nonnegative("lognormal", "sigma", self.sigma)

    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
        """Draw an array of `shape` i.i.d. positive weights."""
        return jnp.exp(self.mean + self.sigma * jr.normal(key, shape, self.mean.dtype))


class Uniform(Distribution):
    r"""Uniform weights on $[\text{low}, \text{high})$.

    With `nonnegative=True` the weights follow the uniform conditioned on $w \ge 0$, which is
    the uniform on $[\max(\text{low}, 0), \text{high})$; `high` must then be > 0.
    """

    low: Float[Array, ""] = eqx.field(converter=as_float)
    high: Float[Array, ""] = eqx.field(converter=as_float)
    nonnegative: bool = eqx.field(default=False, static=True)

    def __check_init__(self):
        _scalar("uniform", "low", self.low)
        _scalar("uniform", "high", self.high)
        check_finite("uniform", "low", self.low)
        check_finite("uniform", "high", self.high)
        check_less("uniform", "low", self.low, "high", self.high)
        if not isinstance(self.nonnegative, bool):
            raise TypeError(f"uniform: nonnegative must be True or False, got {self.nonnegative!r}")
        if self.nonnegative and is_concrete(self.high) and not float(self.high) > 0:
            raise ValueError(
                f"uniform: with nonnegative=True, high must be > 0, got {float(self.high)!r}"
            )

    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
        """Draw an array of `shape` i.i.d. weights in `[low, high)` (`[max(low, 0), high)` if
        `nonnegative`)."""
        low = jnp.maximum(self.low, 0.0) if self.nonnegative else self.low
        return jr.uniform(key, shape, self.low.dtype, minval=low, maxval=self.high)


def normal(mean: Any, std: Any, *, nonnegative: bool = False) -> Normal:
    """Normal weight distribution (see `Normal`)."""
    return Normal(mean, std, nonnegative)


def lognormal(mean: Any, sigma: Any) -> LogNormal:
    """Log-normal weight distribution; `mean`, `sigma` are those of log w (see `LogNormal`)."""
    return LogNormal(mean, sigma)


def uniform(low: Any, high: Any, *, nonnegative: bool = False) -> Uniform:
    """Uniform weight distribution on [low, high) (see `Uniform`)."""
    return Uniform(low, high, nonnegative)


def resolve_weights(
    owner: str,
    weight: Any,
    key: jax.Array | None,
    pre: np.ndarray,
    post: np.ndarray,
) -> jax.Array:
    """One weight per synapse, in the order of `pre`/`post` (the builder's output order).

    `key` is the builder's weight key; it is only needed (and only used) for distributions.
    """
    nnz = int(pre.shape[0])
    if isinstance(weight, Distribution):
        if key is None:
            raise ValueError(
                f"{owner}: weight is a {type(weight).__name__} distribution, which needs a random"
                " key; pass key=jax.random.key(...)"
            )
        return weight.sample(key, (nnz,)).astype(default_float())
    if callable(weight) and not isinstance(weight, (jax.Array, np.ndarray)):
        w = weight(jnp.asarray(pre), jnp.asarray(post))
        try:
            w = as_float(w)
        except TypeError as err:
            raise TypeError(f"{owner}: weight(pre, post) returned a bad value: {err}") from None
        if w.shape not in ((), (nnz,)):
            raise ValueError(
                f"{owner}: weight(pre, post) must return a scalar or an array of shape"
                f" ({nnz},) (one weight per synapse), got shape {w.shape}"
            )
    else:
        try:
            w = as_float(weight)
        except TypeError as err:
            raise TypeError(
                f"{owner}: weight must be a real scalar, an array, a callable or a distribution:"
                f" {err}"
            ) from None
        if w.shape not in ((), (nnz,)):
            raise ValueError(
                f"{owner}: weight must be a scalar or have one value per synapse (shape"
                f" ({nnz},), in row-major (pre, post) order), got shape {w.shape}"
            )
    check_finite(owner, "weight", w)
    if w.ndim == 0 and is_concrete(w):
        # Filled on the host: jnp.full would compile a program for every nnz.
        return jax.device_put(np.full((nnz,), np.asarray(w)))
    return jnp.full((nnz,), w) if w.ndim == 0 else w
