"""Spike nonlinearities with surrogate gradients.

A spike is the Heaviside step `H(x) = 1 if x >= 0 else 0` of a dimensionless distance to
threshold `x` (each neuron model documents how it scales its voltage into `x`). Its true
derivative is zero almost everywhere, which stops gradient-based learning; a surrogate keeps
the exact 0/1 forward value and replaces the derivative by a smooth pseudo-derivative
(Neftci, Mostafa and Zenke 2019, "Surrogate gradient learning in spiking neural networks").

Each surrogate is an `equinox.Module` whose hyperparameters are array leaves, so that a
change of value never recompiles, and the surrogate itself can be vmapped or differentiated
like any other parameter. The spike function is a single `jax.custom_jvp` shared by all
surrogates; the forward value never depends on the surrogate.

| class | lowercase function | pseudo-derivative `dH/dx` |
| --- | --- | --- |
| `FastSigmoid(slope=25)` | `fast_sigmoid` | `1 / (1 + slope |x|)^2` (Zenke and Ganguli 2018) |
| `Arctan(alpha=2)` | `arctan` | `(alpha / 2) / (1 + (pi alpha x / 2)^2)` (Fang et al. 2021) |
| `Triangular(width=1)` | `triangular` | `max(0, 1 - |x| / width) / width` (Bellec et al. 2018) |
| `Heaviside()` | `heaviside` | `1` (straight-through estimator, Bengio et al. 2013) |

Example:
```python
import jax, jax.numpy as jnp
import neurojax as nj
x = jnp.array([-0.5, 0.0, 0.5])
nj.surrogate.fast_sigmoid(x)                          # [0., 1., 1.]
jax.grad(lambda x: nj.surrogate.fast_sigmoid(x).sum())(x)
```
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from ._validation import as_float, check_positive

__all__ = [
    "Surrogate",
    "FastSigmoid",
    "Arctan",
    "Triangular",
    "Heaviside",
    "spike",
    "fast_sigmoid",
    "arctan",
    "triangular",
    "heaviside",
    "as_surrogate",
    "SURROGATES",
]


class Surrogate(eqx.Module):
    """Base class: the forward pass is the Heaviside step, the backward pass `derivative`."""

    @abc.abstractmethod
    def derivative(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """Pseudo-derivative of the step at `x` (dimensionless)."""

    def __call__(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        return spike(self, _as_float_array(x))


def _as_float_array(x) -> Float[Array, "..."]:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


@jax.custom_jvp
def spike(surrogate: Surrogate, x: Float[Array, "..."]) -> Float[Array, "..."]:
    """Heaviside step `x >= 0` as 0.0/1.0 in `x`'s dtype, differentiated with `surrogate`."""
    return (x >= 0).astype(x.dtype)


@spike.defjvp
def _spike_jvp(primals, tangents):
    surrogate, x = primals
    _, x_dot = tangents
    # The step does not depend on the surrogate's hyperparameters, so only x carries a tangent.
    return spike(surrogate, x), surrogate.derivative(x).astype(x.dtype) * x_dot


class FastSigmoid(Surrogate):
    """Derivative of the fast sigmoid `x / (1 + slope |x|)`: `1 / (1 + slope |x|)^2`."""

    slope: Float[Array, ""] = eqx.field(default=25.0, converter=as_float)

    def __check_init__(self):
        check_positive("FastSigmoid", "slope", self.slope)

    def derivative(self, x):
        """`1 / (1 + slope |x|)^2`."""
        return 1.0 / (1.0 + self.slope * jnp.abs(x)) ** 2


class Arctan(Surrogate):
    """Derivative of `arctan(pi alpha x / 2) / pi + 1/2`."""

    alpha: Float[Array, ""] = eqx.field(default=2.0, converter=as_float)

    def __check_init__(self):
        check_positive("Arctan", "alpha", self.alpha)

    def derivative(self, x):
        """`(alpha / 2) / (1 + (pi alpha x / 2)^2)`."""
        return (self.alpha / 2.0) / (1.0 + (jnp.pi / 2.0 * self.alpha * x) ** 2)


class Triangular(Surrogate):
    """Triangle of unit area and half-width `width` centred on the threshold."""

    width: Float[Array, ""] = eqx.field(default=1.0, converter=as_float)

    def __check_init__(self):
        check_positive("Triangular", "width", self.width)

    def derivative(self, x):
        """`max(0, 1 - |x| / width) / width`."""
        return jnp.maximum(0.0, 1.0 - jnp.abs(x) / self.width) / self.width


class Heaviside(Surrogate):
    """Straight-through estimator: the gradient passes through the step unchanged."""

    def derivative(self, x):
        """`1` everywhere."""
        return jnp.ones_like(x)


SURROGATES: dict[str, type[Surrogate]] = {
    "fast_sigmoid": FastSigmoid,
    "arctan": Arctan,
    "triangular": Triangular,
    "heaviside": Heaviside,
}
"""The surrogate classes by the names that `surrogate="..."` accepts (default settings)."""


def as_surrogate(s: "Surrogate | str") -> Surrogate:
    """Converter used by the neuron models' `surrogate=` field: a `Surrogate` or its name."""
    if isinstance(s, Surrogate):
        return s
    if isinstance(s, str) and s in SURROGATES:
        return SURROGATES[s]()
    raise ValueError(
        f"surrogate must be a neurojax.surrogate.Surrogate or one of {tuple(SURROGATES)}, got {s!r}"
    )


def fast_sigmoid(x: ArrayLike, slope: ArrayLike = 25.0) -> Float[Array, "..."]:
    """Spike `x >= 0` with the fast-sigmoid surrogate gradient."""
    return spike(FastSigmoid(slope), _as_float_array(x))


def arctan(x: ArrayLike, alpha: ArrayLike = 2.0) -> Float[Array, "..."]:
    """Spike `x >= 0` with the arctan surrogate gradient."""
    return spike(Arctan(alpha), _as_float_array(x))


def triangular(x: ArrayLike, width: ArrayLike = 1.0) -> Float[Array, "..."]:
    """Spike `x >= 0` with the triangular surrogate gradient."""
    return spike(Triangular(width), _as_float_array(x))


def heaviside(x: ArrayLike) -> Float[Array, "..."]:
    """Spike `x >= 0` with the straight-through gradient."""
    return spike(Heaviside(), _as_float_array(x))
