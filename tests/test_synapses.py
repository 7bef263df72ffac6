"""Synaptic kinetics against their analytic kernels; outputs; gap junctions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import neurojax as nj
from neurojax import synapses as S


def kernel_exponential(t, tau):
    return np.exp(-t / tau)


def kernel_alpha(t, tau):
    return t / tau * np.exp(1.0 - t / tau)


def kernel_dual(t, tr, td):
    tp = td * tr / (td - tr) * np.log(td / tr)
    norm = 1.0 / (np.exp(-tp / td) - np.exp(-tp / tr))
    return norm * (np.exp(-t / td) - np.exp(-t / tr))


KINETICS = [
    ("exponential", lambda: S.Exponential(tau=3.0), lambda t: kernel_exponential(t, 3.0), 3.0),
    ("alpha", lambda: S.Alpha(tau=2.0), lambda t: kernel_alpha(t, 2.0), math.e * 2.0),
    (
        "dual",
        lambda: S.DualExponential(tau_rise=0.5, tau_decay=4.0),
        lambda t: kernel_dual(t, 0.5, 4.0),
        None,
    ),
]


def run(syn, arrivals, dt):
    """g after each step for a time-major array of arrivals (n_steps, n)."""
    _, rec = nj.simulate(
        syn, syn.init_state(arrivals.shape[1]), arrivals, dt=dt, record=lambda state, g: g
    )
    return np.asarray(rec.values)


@pytest.mark.parametrize("name, make, kernel, integral", KINETICS, ids=[k[0] for k in KINETICS])
def test_kernel_is_sampled_exactly_on_the_grid(name, make, kernel, integral):
    # Exact integration: after a unit spike in step 0, step m holds K(m dt) to float64 rounding.
    with jax.enable_x64(True):
        syn = make()
        dt, n = 0.1, 200
        x = np.zeros((n, 1))
        x[0, 0] = 1.0
        g = run(syn, jnp.asarray(x), dt)[:, 0]
        np.testing.assert_allclose(g, kernel(np.arange(n) * dt), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, make, kernel, integral", KINETICS, ids=[k[0] for k in KINETICS])
def test_superposition_and_weights(name, make, kernel, integral):
    with jax.enable_x64(True):
        syn = make()
        dt, n = 0.1, 300
        x = np.zeros((n, 2))
        x[0, 0], x[40, 0] = 2.0, -0.5  # two spikes of different weights onto neuron 0
        x[10, 1] = 1.0
        g = run(syn, jnp.asarray(x), dt)
        t = np.arange(n) * dt
        k = lambda s: np.where(t >= s, kernel(np.maximum(t - s, 0.0)), 0.0)  # noqa: E731
        np.testing.assert_allclose(g[:, 0], 2.0 * k(0.0) - 0.5 * k(4.0), atol=1e-12)
        np.testing.assert_allclose(g[:, 1], k(1.0), atol=1e-12)


def test_peaks_are_normalised_to_one():
    tr, td = 0.5, 4.0
    dual = S.DualExponential(tau_rise=tr, tau_decay=td)
    t = np.linspace(0, 20, 200_001)
    # Independent check of the peak: maximise the kernel numerically.
    k = np.exp(-t / td) - np.exp(-t / tr)
    assert float(dual.t_peak) == pytest.approx(t[np.argmax(k)], abs=1e-3)
    assert float(dual.norm) == pytest.approx(1.0 / k.max(), rel=1e-6)
    assert kernel_alpha(2.0, 2.0) == pytest.approx(1.0)


@pytest.mark.parametrize("name, make, kernel, integral", KINETICS, ids=[k[0] for k in KINETICS])
def test_time_integral_of_the_kernel(name, make, kernel, integral):
    syn = make()
    if integral is None:  # dual exponential: N (tau_d - tau_r)
        integral = float(syn.norm) * (4.0 - 0.5)
    dt, n = 0.01, 6000
    x = jnp.zeros((n, 1)).at[0, 0].set(1.0)
    g = run(syn, x, dt)[:, 0]
    # Rectangle rule on a smooth kernel with a jump at 0: error about dt/2 * K(0) <= 0.005,
    # i.e. < 0.1 % of these integrals.
    assert g.sum() * dt == pytest.approx(integral, rel=2e-3)


def test_delta_acts_during_one_step():
    d = S.Delta()
    x = jnp.zeros((5, 2)).at[1, 0].set(3.0)
    _, rec = nj.simulate(d, d.init_state(2), x, dt=0.5, record=("g",))
    expected = np.zeros((5, 2))
    expected[1, 0] = 6.0  # 3 / 0.5: the integral over the step is the weight
    np.testing.assert_array_equal(np.asarray(rec.g), expected)


def test_kinetics_under_jit_vmap_and_grad():
    # vmap over a sweep of time constants equals separate runs; gradients of g with respect to
    # tau match finite differences (float64).
    taus = jnp.array([1.0, 2.0, 5.0])

    def g_after(tau, n=30):
        syn = S.Exponential(tau=tau)
        state = syn.init_state(1)
        state, _ = syn.step(state, 1.0, 0.1)
        for _ in range(n):
            state, g = syn.step(state, 0.0, 0.1)
        return g[0]

    np.testing.assert_allclose(
        np.asarray(jax.vmap(g_after)(taus)), [float(g_after(t)) for t in taus], rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(jax.vmap(g_after)(taus)), np.exp(-3.0 / np.asarray(taus)), rtol=1e-5
    )
    with jax.enable_x64(True):
        check_grads(lambda t: g_after(t), (jnp.float64(2.0),), order=1, modes=["rev", "fwd"])
        alpha = lambda t: S.Alpha(tau=t).step(S.Alpha(tau=t).init_state(1), 1.0, 0.1)[0].h[0]  # noqa: E731
        check_grads(alpha, (jnp.float64(2.0),), order=1, modes=["rev"])


def test_outputs():
    g = jnp.array([0.5, 2.0])
    v = jnp.array([-70.0, -50.0])
    np.testing.assert_array_equal(np.asarray(S.CurrentOutput()(g, v)), [0.5, 2.0])
    np.testing.assert_allclose(np.asarray(S.ConductanceOutput(e_rev=-80.0)(g, v)), [-5.0, -60.0])
    np.testing.assert_allclose(
        np.asarray(S.ConductanceOutput(e_rev=jnp.array([0.0, -80.0]))(g, v)), [35.0, -60.0]
    )


def _random_pairs(n, m, seed):
    rng = np.random.default_rng(seed)
    pairs = set()
    while len(pairs) < m:
        i, j = rng.integers(0, n, 2)
        if i < j:
            pairs.add((int(i), int(j)))
    pre, post = np.array(sorted(pairs)).T
    return pre, post, rng.uniform(0.5, 2.0, m)


def test_gap_junction_equals_dense_laplacian():
    n = 30
    pre, post, w = _random_pairs(n, 60, 0)
    conn = nj.connect.from_arrays(jnp.asarray(pre), jnp.asarray(post), jnp.asarray(w), n, n)
    gap = S.GapJunction(conn, g=0.3)
    c = np.zeros((n, n))
    c[pre, post] = w
    c = c + c.T
    v = np.random.default_rng(1).normal(-65, 5, (4, n))  # a batch of voltage vectors
    # Independent reference: I_i = g sum_j c_ij (v_j - v_i) with a dense matrix in float64.
    expected = 0.3 * (v @ c - v * c.sum(1))
    np.testing.assert_allclose(
        np.asarray(gap.current(jnp.asarray(v, jnp.float32))), expected, rtol=1e-4, atol=1e-3
    )
    # Currents only move charge between neurons.
    assert abs(float(gap.current(jnp.asarray(v[0], jnp.float32)).sum())) < 1e-3
    np.testing.assert_allclose(np.asarray(gap.dense()), 0.3 * c, rtol=1e-6)


def test_gap_junction_synchronises_two_passive_neurons():
    # Two identical passive LIF neurons coupled by g: the voltage difference d obeys
    # tau dd/dt = -(1 + 2 r_m g) d, so d(t) = d0 exp(-(1 + 2 r_m g) t / tau). The coupling
    # current is held over each step (explicit), an O(dt) error: 1 % at dt = 0.01 ms.
    tau, r_m, g = 10.0, 2.0, 0.25
    lif = nj.LIF(tau_m=tau, r_m=r_m, v_rest=-65.0, v_th=0.0, v_reset=-80.0)
    conn = nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 2, 2)
    gap = S.GapJunction(conn, g=g)
    state = lif.init_state(2)
    state = nj.LIFState(v=jnp.array([-60.0, -70.0]), refractory=state.refractory)

    @jax.jit
    def run(state):
        def body(st, _):
            st, _ = lif.step(st, gap(st.v), 0.01)
            return st, st.v[0] - st.v[1]

        return jax.lax.scan(body, state, None, length=500)[1]

    d = np.asarray(run(state))
    t = 0.01 * np.arange(1, 501)
    np.testing.assert_allclose(d, 10.0 * np.exp(-(1 + 2 * r_m * g) * t / tau), rtol=1e-2)


def test_gap_junction_gradient_and_vmap():
    conn = nj.connect.from_arrays(jnp.array([0, 1]), jnp.array([1, 2]), jnp.array([1.0, 2.0]), 3, 3)
    gap = S.GapJunction(conn, g=0.5)
    v = jnp.array([-60.0, -65.0, -70.0])
    # dI/dv is the (negative) Laplacian: column sums of the Jacobian vanish.
    jac = np.asarray(jax.jacobian(gap.current)(v))
    np.testing.assert_allclose(jac, 0.5 * np.array([[-1, 1, 0], [1, -3, 2], [0, 2, -2]]), atol=1e-6)
    batched = jax.vmap(gap.current)(jnp.stack([v, v + 1.0]))
    np.testing.assert_allclose(np.asarray(batched[0]), np.asarray(batched[1]), atol=1e-5)


BAD = [
    (lambda: S.Exponential(tau=0.0), ValueError, r"Exponential: tau must be > 0 ms, got 0.0"),
    (lambda: S.Alpha(tau=-1.0), ValueError, r"Alpha: tau must be > 0 ms, got -1.0"),
    (
        lambda: S.DualExponential(tau_rise=2.0, tau_decay=1.0),
        ValueError,
        r"DualExponential: tau_rise must be < tau_decay, got tau_rise=2.0 and tau_decay=1.0",
    ),
    (
        lambda: S.DualExponential(tau_rise=0.0),
        ValueError,
        r"DualExponential: tau_rise must be > 0 ms",
    ),
    (
        lambda: S.ConductanceOutput(e_rev=float("nan")),
        ValueError,
        r"ConductanceOutput: e_rev must be finite, got nan",
    ),
    (
        lambda: S.GapJunction(np.eye(3), g=1.0),
        TypeError,
        r"GapJunction: conn must be a jax.experimental.sparse.BCOO",
    ),
    (
        lambda: S.GapJunction(nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 2, 3)),
        ValueError,
        r"GapJunction: conn must have shape \(n, n\), got \(2, 3\)",
    ),
    (
        lambda: S.GapJunction(nj.connect.from_arrays(jnp.array([1]), jnp.array([1]), 1.0, 3, 3)),
        ValueError,
        r"GapJunction: conn couples a neuron to itself \(index 1\)",
    ),
    (
        lambda: S.GapJunction(
            nj.connect.from_arrays(jnp.array([0, 1]), jnp.array([1, 0]), 1.0, 2, 2)
        ),
        ValueError,
        r"GapJunction: the pair \(0, 1\) is stored more than once",
    ),
    (
        lambda: S.GapJunction(
            nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 2, 2), g=-1.0
        ),
        ValueError,
        r"GapJunction: g must be >= 0, got -1.0",
    ),
]


@pytest.mark.parametrize("make, exc, match", BAD)
def test_bad_parameters(make, exc, match):
    with pytest.raises(exc, match=match):
        make()
