"""Tests for the differentiable k-cap (`neurojax.assembly._soft`).

Independent references: a float64 NumPy/SciPy root solve (`brentq`) of the sigmoid
threshold, central finite differences of that solve in float64, a stable `argsort` for the
hard cap, and a direct SLSQP maximisation of the regularised problem for the Fenchel-Young
conjugate.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.optimize import brentq, minimize
from scipy.special import expit

from neurojax.assembly._soft import assembly_loss, kcap, kcap_st, soft_kcap, soft_overlap

EPS32 = float(np.finfo(np.float32).eps)


# ---------------------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------------------


def ref_tau(x, k, T):
    x = np.asarray(x, np.float64)
    f = lambda tau: expit((x - tau) / T).sum() - k  # noqa: E731
    return brentq(f, x.min() - 60 * T, x.max() + 60 * T, xtol=1e-14, rtol=1e-15, maxiter=500)


def ref_soft_kcap(x, k, T):
    x = np.asarray(x, np.float64)
    return expit((x - ref_tau(x, k, T)) / T)


def ref_kcap(x, k):
    x = np.asarray(x)
    order = np.argsort(-x, kind="stable")  # equal values keep increasing index order
    out = np.zeros(x.shape)
    out[order[:k]] = 1.0
    return out


def ref_conjugate(x, k, T):
    """max_y <x, y> - T sum(y log y + (1-y) log(1-y)) s.t. sum(y) = k, by SLSQP in float64."""
    x = np.asarray(x, np.float64)
    n = x.size

    def neg(y):
        return -(x @ y - T * np.sum(y * np.log(y) + (1 - y) * np.log1p(-y)))

    def neg_grad(y):
        return -(x - T * (np.log(y) - np.log1p(-y)))

    res = minimize(
        neg,
        np.full(n, k / n),
        jac=neg_grad,
        method="SLSQP",
        bounds=[(1e-13, 1 - 1e-13)] * n,
        constraints=[{"type": "eq", "fun": lambda y: y.sum() - k, "jac": lambda y: np.ones(n)}],
        options={"ftol": 1e-15, "maxiter": 500},
    )
    assert res.success, res.message
    return -res.fun


def rand(seed, shape, scale=1.0):
    return np.random.default_rng(seed).normal(0.0, scale, shape).astype(np.float32)


def central_diff(f, x, h):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


# ---------------------------------------------------------------------------------------
# soft_kcap
# ---------------------------------------------------------------------------------------

CASES = [(7, 1, 0.3, 0), (20, 5, 0.5, 1), (20, 5, 0.05, 2), (64, 10, 1.0, 3), (50, 49, 0.2, 4)]


@pytest.mark.parametrize("n,k,T,seed", CASES)
def test_soft_kcap_matches_float64_root_and_sums_to_k(n, k, T, seed):
    x = rand(seed, n, 2.0)
    y = np.asarray(soft_kcap(x, k, T))
    assert y.dtype == np.float32
    # float32 represents x - tau only to ~eps * max|x|; y = sigmoid((x - tau)/T) has slope
    # <= 1/(4T), so each entry may be off by ~eps max|x| / (4T), plus its own rounding eps.
    per_entry = EPS32 * (1.0 + np.abs(x).max() / (4 * T))
    np.testing.assert_allclose(y, ref_soft_kcap(x, k, T), rtol=0, atol=8 * per_entry)
    # The sum accumulates those errors over n entries (worst case, no cancellation).
    assert abs(y.astype(np.float64).sum() - k) <= 4 * n * per_entry


def test_soft_kcap_float64_matches_root_tightly():
    x = rand(10, 30, 2.0).astype(np.float64)
    with jax.enable_x64(True):
        y = soft_kcap(jnp.asarray(x), 6, 0.3)
        assert y.dtype == jnp.float64
        # 60 halvings in float64: agreement to a few ulps of x / T.
        np.testing.assert_allclose(np.asarray(y), ref_soft_kcap(x, 6, 0.3), rtol=0, atol=1e-13)
        assert abs(float(y.sum()) - 6) < 1e-12


def test_soft_kcap_is_monotone():
    x = rand(11, 25)
    y = np.asarray(soft_kcap(x, 7, 0.4))
    order = np.argsort(x)
    assert np.all(np.diff(y[order]) >= 0)  # same ranking as x
    j = 3
    x2 = x.copy()
    x2[j] += 0.5
    y2 = np.asarray(soft_kcap(x2, 7, 0.4))
    assert y2[j] > y[j] + 1e-3  # raising x_j raises y_j ...
    others = np.arange(25) != j
    assert np.all(y2[others] <= y[others] + 1e-7)  # ... and lowers (or keeps) the others


def test_soft_kcap_tends_to_hard_cap():
    x = rand(12, 40)
    k = 9
    srt = np.sort(x)[::-1]
    gap = srt[k - 1] - srt[k]
    assert gap > 1e-3  # the k-th and (k+1)-th values differ in this draw
    hard = ref_kcap(x, k)
    errs = [np.abs(np.asarray(soft_kcap(x, k, T)) - hard).max() for T in (1.0, 0.1, 0.01, 1e-4)]
    assert all(a > b for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 1e-6
    # hand-built: margin 0.5 and T = 0.01 would leave exp(-50) on either side of the cap, but
    # the float32 sum cannot see entries below its rounding (~n eps), so the threshold may
    # settle anywhere that keeps them that small.
    y = soft_kcap(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, 0.01)
    np.testing.assert_allclose(np.asarray(y), [0.0, 1.0, 0.0, 1.0], rtol=0, atol=4 * 4 * EPS32)


def test_soft_kcap_k_equals_n_is_exactly_one():
    x = jnp.array([0.5, -2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(soft_kcap(x, 3, 0.1)), [1.0, 1.0, 1.0])
    g = jax.grad(lambda x: soft_kcap(x, 3, 0.1) @ jnp.array([1.0, 2.0, 3.0]))(x)
    np.testing.assert_array_equal(np.asarray(g), [0.0, 0.0, 0.0])


def test_soft_kcap_tie_at_the_cap_shares_the_mass():
    # positions 1 and 2 tie for the single remaining slot after position 3
    y = np.asarray(soft_kcap(jnp.array([-5.0, 1.0, 1.0, 4.0]), 2, 1e-3))
    np.testing.assert_allclose(y, [0.0, 0.5, 0.5, 1.0], atol=1e-5)


@pytest.mark.parametrize("n,k,T,seed", [(9, 3, 0.5, 20), (16, 4, 0.2, 21)])
def test_soft_kcap_gradient_matches_float64_finite_differences(n, k, T, seed):
    x = rand(seed, n)
    w = rand(seed + 100, n)
    fd_x = central_diff(lambda v: w @ ref_soft_kcap(v, k, T), x, 1e-5)
    fd_T = (w @ ref_soft_kcap(x, k, T + 1e-6) - w @ ref_soft_kcap(x, k, T - 1e-6)) / 2e-6
    gx, gT = jax.grad(lambda x, T: soft_kcap(x, k, T) @ jnp.asarray(w), argnums=(0, 1))(
        jnp.asarray(x), jnp.float32(T)
    )
    # float32 gradients of O(1) quantities: a few 1e-6 relative to the largest component.
    scale = np.abs(fd_x).max()
    np.testing.assert_allclose(np.asarray(gx), fd_x, rtol=0, atol=2e-5 * scale)
    np.testing.assert_allclose(float(gT), fd_T, rtol=1e-4, atol=1e-5 * scale)
    # in float64 the implicit gradient agrees with the finite difference to its O(h^2) error
    with jax.enable_x64(True):
        gx64, gT64 = jax.grad(
            lambda x, T: soft_kcap(x, k, T) @ jnp.asarray(w, jnp.float64), argnums=(0, 1)
        )(jnp.asarray(x, jnp.float64), jnp.float64(T))
        np.testing.assert_allclose(np.asarray(gx64), fd_x, rtol=0, atol=1e-7 * scale)
        np.testing.assert_allclose(float(gT64), fd_T, rtol=0, atol=1e-6 * scale)


def test_soft_kcap_jacobian_is_analytic_in_both_modes():
    x = jnp.asarray(rand(30, 8))
    k, T = 3, 0.7
    y = ref_soft_kcap(np.asarray(x), k, T)
    s = y * (1 - y) / T
    expected = np.diag(s) - np.outer(s, s) / s.sum()
    jf = np.asarray(jax.jacfwd(soft_kcap)(x, k, T))
    jr = np.asarray(jax.jacrev(soft_kcap)(x, k, T))
    np.testing.assert_allclose(jf, expected, atol=2e-6)
    np.testing.assert_allclose(jr, expected, atol=2e-6)
    np.testing.assert_allclose(jr.sum(axis=0), 0.0, atol=1e-6)  # the sum stays k


def test_soft_kcap_vmap_and_batch_axes_equal_stacked_calls():
    xs = rand(40, (5, 12))
    Ts = np.array([0.1, 0.3, 0.5, 1.0, 2.0], np.float32)
    k = 4
    stacked = np.stack([np.asarray(soft_kcap(xs[i], k, Ts[i])) for i in range(5)])
    vm = jax.vmap(soft_kcap, in_axes=(0, None, 0))(jnp.asarray(xs), k, jnp.asarray(Ts))
    np.testing.assert_allclose(np.asarray(vm), stacked, rtol=0, atol=1e-6)
    same_T = np.stack([np.asarray(soft_kcap(xs[i], k, 0.3)) for i in range(5)])
    np.testing.assert_allclose(np.asarray(soft_kcap(xs, k, 0.3)), same_T, rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(soft_kcap(xs.reshape(5, 1, 12), k, 0.3)).reshape(5, 12), same_T, atol=1e-6
    )
    w = jnp.asarray(rand(41, 12))
    g = lambda x, T: jax.grad(lambda x: soft_kcap(x, k, T) @ w)(x)  # noqa: E731
    g_stacked = np.stack([np.asarray(g(jnp.asarray(xs[i]), Ts[i])) for i in range(5)])
    g_vm = jax.vmap(g)(jnp.asarray(xs), jnp.asarray(Ts))
    np.testing.assert_allclose(np.asarray(g_vm), g_stacked, rtol=0, atol=1e-6)


def test_soft_kcap_jit_equals_eager_and_temperature_does_not_recompile():
    x = jnp.asarray(rand(50, 15))
    f = jax.jit(soft_kcap, static_argnames="k")
    for T in (0.2, 0.7, 1.5):
        np.testing.assert_allclose(
            np.asarray(f(x, k=5, temperature=T)), np.asarray(soft_kcap(x, 5, T)), atol=1e-7
        )
    assert f._cache_size() == 1


# ---------------------------------------------------------------------------------------
# kcap and kcap_st
# ---------------------------------------------------------------------------------------


def test_kcap_ties_go_to_the_lower_index():
    x = jnp.array([1.0, 3.0, 3.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(kcap(x, 2)), [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(kcap(x, 4)), [0, 1, 1, 1, 1])
    np.testing.assert_array_equal(np.asarray(kcap(jnp.zeros(5), 3)), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(kcap(jnp.zeros(5), 5)), np.ones(5))


def test_kcap_matches_stable_argsort_with_many_ties():
    rng = np.random.default_rng(60)
    x = rng.integers(0, 5, size=(8, 30))  # heavy ties
    for k in (1, 7, 29):
        out = kcap(x.astype(np.float32), k)
        assert out.dtype == jnp.float32
        expected = np.stack([ref_kcap(row, k) for row in x])
        np.testing.assert_array_equal(np.asarray(out), expected)
        np.testing.assert_array_equal(np.asarray(out).sum(axis=-1), k)
        np.testing.assert_array_equal(np.asarray(kcap(x, k)), expected)  # int input, exact ranks
    expected = np.stack([ref_kcap(row, 7) for row in x])
    vm = jax.vmap(lambda r: kcap(r, 7))(jnp.asarray(x, jnp.float32))
    np.testing.assert_array_equal(np.asarray(vm), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(kcap, static_argnums=1)(x, 7)), expected)


def test_kcap_st_forward_is_hard_and_gradient_is_soft():
    x = jnp.asarray(rand(70, (3, 11)))
    k, T = 4, 0.5
    out = kcap_st(x, k, T)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(kcap(x, k)))
    w = jnp.asarray(rand(71, (3, 11)))
    g_st = jax.grad(lambda x, T: jnp.sum(kcap_st(x, k, T) * w), argnums=(0, 1))(x, jnp.float32(T))
    g_soft = jax.grad(lambda x, T: jnp.sum(soft_kcap(x, k, T) * w), argnums=(0, 1))(
        x, jnp.float32(T)
    )
    np.testing.assert_array_equal(np.asarray(g_st[0]), np.asarray(g_soft[0]))
    np.testing.assert_array_equal(np.asarray(g_st[1]), np.asarray(g_soft[1]))
    assert np.abs(np.asarray(g_st[0])).max() > 1e-3  # a gradient that is really there


# ---------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------


def test_soft_overlap_hand_example():
    y = jnp.array([0.2, 0.9, 0.5, 0.4])
    assert float(soft_overlap(y, jnp.array([1, 2]))) == pytest.approx(0.7, abs=1e-7)
    assert float(soft_overlap(y, jnp.array([False, True, True, False]))) == pytest.approx(
        0.7, abs=1e-7
    )
    assert float(soft_overlap(y, jnp.array([1.0, 0.0, 0.0, 1.0]))) == pytest.approx(0.3, abs=1e-7)
    assert float(soft_overlap(y, jnp.array([3]))) == pytest.approx(0.4, abs=1e-7)


def test_overlap_loss_equals_hand_computation():
    x = rand(80, 10)
    idx = np.array([0, 4, 7])
    y = ref_soft_kcap(x, 3, 0.4)
    expected = 1 - (y[0] + y[4] + y[7]) / 3
    assert float(assembly_loss(x, idx, 3, 0.4, kind="overlap")) == pytest.approx(expected, abs=2e-6)
    top = np.argsort(-x)[:3]
    assert float(assembly_loss(x, top, 3, 1e-4, kind="overlap")) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("n,k,T,seed", [(8, 3, 0.2, 91), (7, 1, 1.0, 92)])
def test_fenchel_young_value_matches_direct_conjugate(n, k, T, seed):
    x = rand(seed, n)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(n, k, replace=False))
    t = np.zeros(n)
    t[idx] = 1.0
    # Omega(t) = 0 for a 0/1 target
    expected = ref_conjugate(x, k, T) - x.astype(np.float64) @ t
    loss = float(assembly_loss(x, idx, k, T))
    # float32 loss of O(1) magnitude; SLSQP is accurate to ~1e-9 here.
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
    with jax.enable_x64(True):
        loss64 = float(assembly_loss(jnp.asarray(x, jnp.float64), idx, k, T))
    assert loss64 == pytest.approx(expected, rel=1e-7, abs=1e-8)
    # the indicator forms (float and bool) give the same loss as the index form
    assert float(assembly_loss(x, t.astype(np.float32), k, T)) == pytest.approx(loss, abs=1e-7)
    assert float(assembly_loss(x, t.astype(bool), k, T)) == pytest.approx(loss, abs=1e-7)


def test_fenchel_young_with_a_soft_target_includes_its_entropy():
    x, k, T = rand(93, 6), 2, 0.5
    t = np.array([0.3, 0.5, 0.2, 0.4, 0.3, 0.3])  # a point of the capped polytope
    omega_t = T * np.sum(t * np.log(t) + (1 - t) * np.log(1 - t))
    expected = ref_conjugate(x, k, T) - x.astype(np.float64) @ t + omega_t
    assert float(assembly_loss(x, t.astype(np.float32), k, T)) == pytest.approx(
        expected, rel=1e-5, abs=1e-6
    )
    # at the soft cap itself the loss vanishes (t = y is its own maximiser)
    y = soft_kcap(x, k, T)
    assert abs(float(assembly_loss(x, y, k, T))) < 1e-6


def test_fenchel_young_gradient_is_soft_cap_minus_target():
    x = jnp.asarray(rand(100, 9))
    idx = jnp.array([1, 5, 6])
    k, T = 3, 0.3
    t = np.zeros(9)
    t[[1, 5, 6]] = 1.0
    g = jax.grad(assembly_loss)(x, idx, k, T)
    np.testing.assert_allclose(np.asarray(g), np.asarray(soft_kcap(x, k, T)) - t, atol=1e-7)
    # central differences of the float64 loss value (itself checked against SLSQP above),
    # in x and in T; the custom rule never enters the finite differences.
    with jax.enable_x64(True):
        x64 = np.asarray(x, np.float64)
        loss = lambda v, T: float(assembly_loss(jnp.asarray(v), idx, k, T))  # noqa: E731
        fd_x = central_diff(lambda v: loss(v, T), x64, 1e-5)
        np.testing.assert_allclose(np.asarray(g), fd_x, atol=1e-6)
        gT = jax.grad(assembly_loss, argnums=3)(jnp.asarray(x64), idx, k, jnp.float64(T))
        fd_T = (loss(x64, T + 1e-6) - loss(x64, T - 1e-6)) / 2e-6
        assert float(gT) == pytest.approx(fd_T, rel=1e-6)
        y = ref_soft_kcap(x64, k, T)
        entropy = -np.sum(y * np.log(y) + (1 - y) * np.log1p(-y))
        assert float(gT) == pytest.approx(entropy, rel=1e-9)  # dL/dT = sum H(y) for 0/1 t


def test_fenchel_young_hessian_is_the_soft_cap_jacobian():
    x = jnp.asarray(rand(101, 6))
    h = jax.hessian(assembly_loss)(x, jnp.array([0, 2]), 2, 0.6)
    np.testing.assert_allclose(
        np.asarray(h), np.asarray(jax.jacrev(soft_kcap)(x, 2, 0.6)), atol=1e-6
    )


def test_losses_are_nonnegative_and_vmap_over_examples():
    xs = rand(110, (16, 12), 3.0)
    rng = np.random.default_rng(111)
    idx = np.stack([rng.choice(12, 4, replace=False) for _ in range(16)]).astype(np.int32)
    for T in (0.01, 0.3, 3.0):
        fy = jax.vmap(assembly_loss, in_axes=(0, 0, None, None))(xs, idx, 4, T)
        ov = jax.vmap(assembly_loss, in_axes=(0, 0, None, None, None))(xs, idx, 4, T, "overlap")
        assert np.all(np.asarray(fy) >= 0) and np.all(np.isfinite(np.asarray(fy)))
        assert np.all((np.asarray(ov) >= 0) & (np.asarray(ov) <= 1))
        single = [float(assembly_loss(xs[i], idx[i], 4, T)) for i in range(16)]
        np.testing.assert_allclose(np.asarray(fy), single, rtol=1e-6, atol=1e-7)
    assert float(assembly_loss(jnp.array([1.0, 2.0]), jnp.array([0, 1]), 2, 0.5)) == 0.0  # k == n


def test_fenchel_young_training_recovers_the_target_assembly():
    n, k, T = 40, 6, 0.2
    target = jnp.array([3, 11, 17, 22, 30, 38])
    x0 = jnp.asarray(rand(120, n))
    opt = optax.adam(0.05)

    @jax.jit
    def train(x):
        def step(carry, _):
            x, state = carry
            loss, g = jax.value_and_grad(assembly_loss)(x, target, k, T)
            upd, state = opt.update(g, state, x)
            return (optax.apply_updates(x, upd), state), loss

        (x, _), losses = jax.lax.scan(step, (x, opt.init(x)), None, length=300)
        return x, losses

    # optax's bias correction raises a weak float to an int32 step count, which the strict
    # promotion of this test session rejects; the promotion rule is not what is tested here.
    with jax.numpy_dtype_promotion("standard"):
        x, losses = train(x0)
    hard = np.zeros(n)
    hard[np.asarray(target)] = 1.0
    assert not np.array_equal(np.asarray(kcap(x0, k)), hard)
    np.testing.assert_array_equal(np.asarray(kcap(x, k)), hard)
    assert float(losses[-1]) < 0.05 * float(losses[0])


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------

X = np.arange(5, dtype=np.float32)


@pytest.mark.parametrize(
    "call,err,match",
    [
        (
            lambda: soft_kcap(X, 0, 1.0),
            ValueError,
            r"soft_kcap: k must satisfy 0 < k <= n = 5, got k = 0",
        ),
        (
            lambda: soft_kcap(X, 6, 1.0),
            ValueError,
            r"soft_kcap: k must satisfy 0 < k <= n = 5, got k = 6",
        ),
        (
            lambda: soft_kcap(X, 2.0, 1.0),
            TypeError,
            r"soft_kcap: k must be a Python int \(static\), got 2.0",
        ),
        (lambda: soft_kcap(X, True, 1.0), TypeError, r"soft_kcap: k must be a Python int"),
        (
            lambda: soft_kcap(X, 2, 0.0),
            ValueError,
            r"soft_kcap: temperature must be finite and > 0, got 0.0",
        ),
        (
            lambda: soft_kcap(X, 2, -1.0),
            ValueError,
            r"temperature must be finite and > 0, got -1.0",
        ),
        (
            lambda: soft_kcap(X, 2, float("nan")),
            ValueError,
            r"temperature must be finite and > 0, got nan",
        ),
        (
            lambda: soft_kcap(X, 2, jnp.ones(2)),
            ValueError,
            r"soft_kcap: temperature must be a scalar, got shape \(2,\)",
        ),
        (
            lambda: soft_kcap(jnp.float32(1.0), 1, 1.0),
            ValueError,
            r"soft_kcap: x must have at least 1 axis",
        ),
        (
            lambda: soft_kcap(jnp.array([1.0, -jnp.inf]), 1, 1.0),
            ValueError,
            r"soft_kcap: x must be finite",
        ),
        (
            lambda: soft_kcap(X > 1, 1, 1.0),
            TypeError,
            r"soft_kcap: x must be a real \(float or int\) array, got dtype bool",
        ),
        (lambda: kcap(X, 0), ValueError, r"kcap: k must satisfy 0 < k <= n = 5, got k = 0"),
        (lambda: kcap(jnp.float32(1.0), 1), ValueError, r"kcap: x must have at least 1 axis"),
        (lambda: kcap_st(X, 9, 1.0), ValueError, r"k must satisfy 0 < k <= n = 5, got k = 9"),
        (lambda: kcap_st(X, 2, 0.0), ValueError, r"temperature must be finite and > 0"),
        (
            lambda: assembly_loss(X, jnp.array([0, 1]), 2, 1.0, kind="l2"),
            ValueError,
            r"assembly_loss: kind must be one of \('fenchel_young', 'overlap'\), got 'l2'",
        ),
        (
            lambda: assembly_loss(X[None], jnp.array([0, 1]), 2, 1.0),
            ValueError,
            r"assembly_loss: x must have shape \(n,\), got shape \(1, 5\); batch with jax.vmap",
        ),
        (
            lambda: assembly_loss(X, jnp.array([0, 1, 2]), 2, 1.0),
            ValueError,
            r"assembly_loss: an integer target is an array of neuron indices and must have shape \(k,\) with k = 2, got shape \(3,\)",
        ),
        (
            lambda: assembly_loss(X, jnp.array([0, 5]), 2, 1.0),
            ValueError,
            r"assembly_loss: target indices must lie in \[0, n\) = \[0, 5\), got \[0, 5\]",
        ),
        (
            lambda: assembly_loss(X, jnp.array([-1, 2]), 2, 1.0),
            ValueError,
            r"target indices must lie in \[0, n\)",
        ),
        (
            lambda: assembly_loss(X, jnp.array([3, 3]), 2, 1.0),
            ValueError,
            r"assembly_loss: target indices must be distinct, got \[3, 3\]",
        ),
        (
            lambda: assembly_loss(X, jnp.array([1.0, 1.0, 1.0, 0.0, 0.0]), 2, 1.0),
            ValueError,
            r"assembly_loss: indicator target must sum to k = 2 .* got sum 3",
        ),
        (
            lambda: assembly_loss(X, jnp.array([2.0, 0.0, 0.0, 0.0, 0.0]), 2, 1.0),
            ValueError,
            r"assembly_loss: indicator target entries must lie in \[0, 1\]",
        ),
        (
            lambda: assembly_loss(X, jnp.ones(4), 2, 1.0),
            ValueError,
            r"assembly_loss: an indicator target must have shape \(n,\) = \(5,\), got shape \(4,\)",
        ),
        (
            lambda: assembly_loss(X, jnp.array([0, 1]), 0, 1.0),
            ValueError,
            r"assembly_loss: k must satisfy 0 < k <= n = 5, got k = 0",
        ),
        (
            lambda: assembly_loss(X, jnp.array([0, 1]), 2, -2.0),
            ValueError,
            r"assembly_loss: temperature must be finite and > 0, got -2.0",
        ),
        (
            lambda: assembly_loss(
                jnp.array([jnp.nan, 1.0, 2.0, 3.0, 4.0]), jnp.array([0, 1]), 2, 1.0
            ),
            ValueError,
            r"assembly_loss: x must be finite",
        ),
        (
            lambda: soft_overlap(jnp.ones((2, 5)), jnp.array([0])),
            ValueError,
            r"soft_overlap: y must have shape \(n,\), got shape \(2, 5\)",
        ),
        (
            lambda: soft_overlap(X, jnp.zeros(5)),
            ValueError,
            r"soft_overlap: indicator target must not be all zeros",
        ),
        (
            lambda: soft_overlap(X, jnp.arange(6)),
            ValueError,
            r"soft_overlap: target has 6 indices but there are only n = 5 neurons",
        ),
        (
            lambda: soft_overlap(X, jnp.array([1 + 0j, 0j, 0j, 0j, 0j])),
            TypeError,
            r"soft_overlap: target must be an int index array or a float/bool indicator",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_traced_temperature_is_not_checked_but_shapes_are():
    # under jit the value check is skipped (no host sync); a shape error is still raised
    f = jax.jit(lambda T: soft_kcap(X, 2, T))
    assert np.isfinite(np.asarray(f(0.5))).all()
    with pytest.raises(ValueError, match=r"temperature must be a scalar"):
        jax.jit(lambda T: soft_kcap(X, 2, T))(jnp.ones(3))
