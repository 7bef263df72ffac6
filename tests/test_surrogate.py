"""Surrogate spike functions: exact forward values, analytic pseudo-derivatives."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax import surrogate as sg

X = jnp.array([-2.0, -0.7, -0.1, 0.0, 0.05, 0.3, 1.5])

ANALYTIC = {
    "fast_sigmoid": (sg.FastSigmoid(slope=4.0), lambda x: 1.0 / (1.0 + 4.0 * np.abs(x)) ** 2),
    "arctan": (sg.Arctan(alpha=3.0), lambda x: 1.5 / (1.0 + (np.pi * 1.5 * x) ** 2)),
    "triangular": (
        sg.Triangular(width=0.5),
        lambda x: np.maximum(0.0, 1.0 - np.abs(x) / 0.5) / 0.5,
    ),
    "heaviside": (sg.Heaviside(), lambda x: np.ones_like(x)),
}


@pytest.mark.parametrize("name", list(ANALYTIC))
def test_forward_is_exact_step(name):
    s, _ = ANALYTIC[name]
    np.testing.assert_array_equal(np.asarray(s(X)), (np.asarray(X) >= 0).astype(np.float32))


@pytest.mark.parametrize("name", list(ANALYTIC))
def test_derivative_equals_analytic_form(name):
    s, deriv = ANALYTIC[name]
    g = jax.vmap(jax.grad(lambda x: s(x)))(X)
    np.testing.assert_allclose(np.asarray(g), deriv(np.asarray(X, np.float64)), rtol=1e-6)
    # Forward mode agrees with reverse mode.
    _, t = jax.jvp(s, (X,), (jnp.ones_like(X),))
    np.testing.assert_allclose(np.asarray(t), np.asarray(g), rtol=1e-6)


def test_lowercase_functions_and_names():
    np.testing.assert_allclose(
        np.asarray(jax.grad(lambda x: sg.fast_sigmoid(x, slope=4.0))(0.3)),
        1.0 / (1 + 1.2) ** 2,
        rtol=1e-6,
    )
    assert float(jax.grad(sg.heaviside)(-3.0)) == 1.0
    assert float(jax.grad(lambda x: sg.arctan(x, alpha=2.0))(0.0)) == pytest.approx(1.0)
    assert float(jax.grad(lambda x: sg.triangular(x, width=2.0))(1.0)) == pytest.approx(0.25)
    assert isinstance(nj.LIF(surrogate="arctan").surrogate, sg.Arctan)
    assert isinstance(nj.LIF().surrogate, sg.FastSigmoid)


def test_hyperparameters_are_leaves_not_closures():
    # A sweep over the slope runs in one vmapped call and gives each slope's derivative.
    slopes = jnp.array([1.0, 5.0, 25.0])

    def d(slope):
        return jax.grad(lambda x: sg.FastSigmoid(slope)(x))(0.2)

    np.testing.assert_allclose(
        np.asarray(jax.vmap(d)(slopes)), 1.0 / (1.0 + slopes * 0.2) ** 2, rtol=1e-6
    )
    # The step does not depend on the hyperparameter: its gradient is zero, not an error.
    g = jax.grad(lambda s: s(jnp.float32(0.2)))(sg.FastSigmoid(5.0))
    assert float(g.slope) == 0.0
    # Changing a value keeps the compiled function.
    traces = []

    @eqx.filter_jit
    def f(s, x):
        traces.append(1)
        return jax.grad(lambda y: s(y))(x)

    f(sg.FastSigmoid(1.0), jnp.float32(0.1))
    f(sg.FastSigmoid(3.0), jnp.float32(0.1))
    assert len(traces) == 1
