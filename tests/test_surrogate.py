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


def _recurrent_rate_gradients(w_rec: float, steps: int = 2000):
    """What the gradients page's section "Surrogate gradients in recurrent networks" measures
    (`benchmarks/examples/surrogate_scale.py`, shortened to 200 ms): the mean rate of 200 LIF neurons
    driven above threshold, its least-squares slope in the input's scale over +-5 %, and the
    surrogate gradient (slope 25) without and with `truncate_backprop=50`."""
    n, dt = 200, 0.1
    lif = nj.LIF(
        tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=2.0, r_m=1.0,
        surrogate=nj.surrogate.FastSigmoid(25.0),
    )  # fmt: skip
    conn = nj.connect.fixed_prob(jax.random.key(1), n, n, 0.1, weight=w_rec)
    net = nj.Network(
        {"A": (lif, n)},
        [nj.Projection("A", "A", conn, synapse=nj.Exponential(5.0), method="dense")],
        dt=dt,
    )
    state = net.init_state()
    drive = jnp.asarray(np.random.default_rng(0).uniform(0.9, 1.5, n), jnp.float32)

    def rate(scale, trunc=None):
        _, rec = nj.simulate(
            net, state, {"A": scale * drive}, dt=dt, n_steps=steps,
            record=nj.Record(spikes="float"), gradient=nj.SurrogateGradient(truncate_backprop=trunc),
        )  # fmt: skip
        return rec.spikes["A"].sum() / (n * steps * dt * 1e-3)

    scales = np.linspace(0.95, 1.05, 21)
    rates = np.asarray(jax.jit(jax.vmap(rate))(jnp.asarray(scales, jnp.float32)))
    secant = float(np.polyfit(scales, rates, 1)[0])
    full = float(jax.jit(jax.grad(rate))(jnp.float32(1.0)))
    truncated = float(jax.jit(jax.grad(lambda s: rate(s, 50)))(jnp.float32(1.0)))
    return secant, full, truncated


@pytest.mark.parametrize("w_rec", [0.0, 0.05])
def test_recurrent_surrogate_gradient_scale_and_truncation(w_rec):
    # The page's claims: the untruncated surrogate gradient is several times the simulated
    # rate's slope without coupling and grows by orders of magnitude with recurrence, while
    # truncate_backprop=50 (5 ms) brings it within a small factor of that slope.
    secant, full, truncated = _recurrent_rate_gradients(w_rec)
    assert 50.0 < secant < 120.0  # Hz per unit of input scale (rates 23-34 Hz)
    if w_rec == 0.0:
        assert 5.0 < full / secant < 40.0
    else:
        assert not np.isfinite(full) or abs(full) / secant > 1e3
    assert 0.5 < truncated / secant < 4.0
