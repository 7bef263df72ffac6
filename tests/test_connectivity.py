"""nj.connect: sparse connectivity builders against exact distributions and brute force.

Statistical tests use fixed seeds, so they are deterministic; each states the p-value (or
sigma) threshold a correct sampler passes with high probability and a biased one fails.
Structural tests (brute-force predicates, exact degrees, stats) are exact comparisons.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.experimental import sparse
from scipy import stats as st

import neurojax as nj
from neurojax.connectivity import _sampling

C = nj.connect
KEY = jr.key(0)
# Per-seed p-value threshold for chi-square / KS tests: a correct sampler fails one such test
# with probability 1e-3; the biases these tests target give p-values below 1e-6.
P_MIN = 1e-3


def keys_of(conn):
    idx = np.asarray(conn.indices).astype(np.int64)
    return idx[:, 0] * conn.shape[1] + idx[:, 1]


def assert_contract(conn, shape, unique=True):
    """BCOO (n_pre, n_post), int32 indices sorted row-major, default-float data."""
    assert isinstance(conn, sparse.BCOO)
    assert conn.shape == shape
    assert conn.indices.dtype == jnp.int32 and conn.indices.shape[1] == 2
    assert conn.data.dtype == jnp.result_type(float)
    assert conn.data.shape == (conn.indices.shape[0],)
    assert conn.indices_sorted and conn.unique_indices == unique
    idx = np.asarray(conn.indices)
    assert np.all((idx >= 0) & (idx < np.array(shape)))
    k = keys_of(conn)
    assert np.all(np.diff(k) > 0) if unique else np.all(np.diff(k) >= 0)


def fan_out(conn):
    return np.bincount(np.asarray(conn.indices[:, 0]), minlength=conn.shape[0])


def fan_in(conn):
    return np.bincount(np.asarray(conn.indices[:, 1]), minlength=conn.shape[1])


def chi2_binomial(samples, n, p):
    """p-value of a chi-square goodness of fit of integer samples to Binomial(n, p).

    Adjacent values are pooled until every bin expects >= 5 counts.
    """
    samples = np.asarray(samples)
    expected = len(samples) * st.binom.pmf(np.arange(n + 1), n, p)
    observed = np.bincount(samples, minlength=n + 1).astype(float)
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected, observed):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 5:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e, acc_o = 0.0, 0.0
    bins_e[-1] += acc_e
    bins_o[-1] += acc_o
    return st.chisquare(bins_o, bins_e).pvalue


def subset_pearson_pvalue(counts, n_draws, k, n):
    """p-value of the counts of each value over `n_draws` uniform k-subsets of n values.

    Pearson's X = sum (c - E)^2 / E has covariance (k/n)(1 - k/n) n/(n - 1) (I - J/n) per
    draw, so X / ((1 - k/n) n/(n - 1)) is chi-square with n - 1 degrees of freedom.
    """
    e = n_draws * k / n
    x = np.sum((counts - e) ** 2) / e
    return st.chi2.sf(x / ((1 - k / n) * n / (n - 1)), n - 1)


# --------------------------------------------------------------------------- fixed_prob


@pytest.mark.parametrize("seed", range(4))
def test_fixed_prob_degrees_are_binomial(seed):
    conn = C.fixed_prob(jr.key(seed), 3000, 400, 0.05)
    assert_contract(conn, (3000, 400))
    # Out-degrees: 3000 i.i.d. Binomial(400, 0.05); in-degrees: 400 i.i.d. Binomial(3000, 0.05).
    assert chi2_binomial(fan_out(conn), 400, 0.05) > P_MIN
    assert chi2_binomial(fan_in(conn), 3000, 0.05) > P_MIN


@pytest.mark.parametrize("seed", range(3))
def test_fixed_prob_without_autapses_is_binomial_over_n_minus_1(seed):
    conn = C.fixed_prob(jr.key(10 + seed), 2000, 2000, 0.1, allow_self=False)
    assert_contract(conn, (2000, 2000))
    idx = np.asarray(conn.indices)
    assert not np.any(idx[:, 0] == idx[:, 1])
    assert chi2_binomial(fan_out(conn), 1999, 0.1) > P_MIN
    assert chi2_binomial(fan_in(conn), 1999, 0.1) > P_MIN


def test_fixed_prob_every_column_has_probability_p():
    # Column counts are independent Binomial(n_pre, p): sum of squared z-scores ~ chi2(n_post).
    # This catches a bias of the first columns (short gaps) or of the last ones (row ends).
    n_pre, n_post, p = 40_000, 50, 0.03
    c = fan_in(C.fixed_prob(jr.key(3), n_pre, n_post, p))
    z2 = (c - n_pre * p) ** 2 / (n_pre * p * (1 - p))
    assert st.chi2.sf(z2.sum(), n_post) > P_MIN


@pytest.mark.parametrize("exclude", [False, True])
def test_bernoulli_rows_extra_rounds_keep_the_distribution(exclude):
    # width=64 forces ~5 extra rounds per row (mean 400 entries): the continuation must be
    # seamless (binomial degrees, uniform columns, sorted rows, no excluded column).
    n_rows, m, p = 1500, 2000, 0.2
    ex = np.arange(n_rows, dtype=np.int64) if exclude else None
    counts, cols = _sampling.bernoulli_rows(jr.key(5), n_rows, m, p, ex, width=64)
    assert counts.sum() == cols.size
    rows = np.repeat(np.arange(n_rows), counts)
    assert np.all(np.diff(rows * m + cols) > 0)
    if exclude:
        assert not np.any(cols == rows)
    assert chi2_binomial(counts, m - int(exclude), p) > P_MIN
    col_counts = np.bincount(cols, minlength=m)
    if exclude:
        # Columns < n_rows lose one candidate row each.
        trials = np.where(np.arange(m) < n_rows, n_rows - 1, n_rows)
    else:
        trials = np.full(m, n_rows)
    z2 = (col_counts - trials * p) ** 2 / (trials * p * (1 - p))
    assert st.chi2.sf(z2.sum(), m) > P_MIN


def test_fixed_prob_edge_probabilities():
    assert C.fixed_prob(KEY, 7, 9, 0.0).nse == 0
    full = C.fixed_prob(KEY, 7, 9, 1.0)
    np.testing.assert_array_equal(np.asarray(full.todense()), np.ones((7, 9)))
    no_self = C.fixed_prob(KEY, 6, 6, 1.0, allow_self=False)
    np.testing.assert_array_equal(np.asarray(no_self.todense()), 1 - np.eye(6))


# ---------------------------------------------------------------------- fixed degrees


@pytest.mark.parametrize("builder", [C.fixed_indegree, C.fixed_outdegree])
@pytest.mark.parametrize(
    "n_pre, n_post, k, allow_self",
    [(300, 200, 40, True), (200, 300, 40, True), (150, 150, 149, False), (150, 150, 120, False)],
)
def test_fixed_degrees_are_exact(builder, n_pre, n_post, k, allow_self):
    conn = builder(jr.key(1), n_pre, n_post, k, allow_self=allow_self)
    assert_contract(conn, (n_pre, n_post), unique=True)
    degrees = fan_in(conn) if builder is C.fixed_indegree else fan_out(conn)
    np.testing.assert_array_equal(degrees, k)
    if not allow_self:
        idx = np.asarray(conn.indices)
        assert not np.any(idx[:, 0] == idx[:, 1])


@pytest.mark.parametrize("builder", [C.fixed_indegree, C.fixed_outdegree])
def test_fixed_degree_multapses_when_allowed(builder):
    # k larger than the population: only possible with multapses; degrees count duplicates.
    conn = builder(jr.key(2), 20, 20, 50, allow_self=False, allow_multapses=True)
    assert_contract(conn, (20, 20), unique=False)
    degrees = fan_in(conn) if builder is C.fixed_indegree else fan_out(conn)
    np.testing.assert_array_equal(degrees, 50)
    k = keys_of(conn)
    assert np.any(np.diff(k) == 0)
    idx = np.asarray(conn.indices)
    assert not np.any(idx[:, 0] == idx[:, 1])


@pytest.mark.parametrize("k, n", [(2, 6), (4, 6), (3, 7)])
def test_k_subsets_are_uniform(k, n):
    # Every one of the C(n, k) subsets must be equally likely; (4, 6) takes the complement path.
    rows = _sampling.sample_subsets(jr.key(7), 30_000, k, n, False, False)
    assert np.all(np.diff(rows, axis=1) > 0)
    code = (rows * n ** np.arange(k)).sum(axis=1)
    counts = np.unique(code, return_counts=True)[1]
    assert counts.size == math.comb(n, k)
    assert st.chisquare(counts).pvalue > P_MIN


@pytest.mark.parametrize("builder", [C.fixed_indegree, C.fixed_outdegree])
def test_fixed_degree_partners_are_uniform(builder):
    # Counts of each partner over 3000 uniform 25-subsets of 500: scaled Pearson ~ chi2(499).
    conn = (
        builder(jr.key(4), 500, 3000, 25)
        if builder is C.fixed_indegree
        else builder(jr.key(4), 3000, 500, 25)
    )
    partners = fan_out(conn) if builder is C.fixed_indegree else fan_in(conn)
    assert subset_pearson_pvalue(partners, 3000, 25, 500) > P_MIN


def test_no_autapse_shift_keeps_targets_uniform():
    # Without autapses row r draws among n - 1 values shifted past r: the offsets
    # (target - r) mod n must be uniform on 1..n-1 (scaled Pearson as above, n - 1 cells).
    n, k = 1000, 10
    conn = C.fixed_outdegree(jr.key(8), n, n, k, allow_self=False)
    idx = np.asarray(conn.indices)
    offsets = (idx[:, 1] - idx[:, 0]) % n
    assert offsets.min() >= 1
    counts = np.bincount(offsets, minlength=n)[1:]
    assert subset_pearson_pvalue(counts, n, k, n - 1) > P_MIN


# ------------------------------------------------------------------ deterministic builders


def test_all_to_all_one_to_one_from_dense():
    np.testing.assert_array_equal(np.asarray(C.all_to_all(3, 4).todense()), np.ones((3, 4)))
    a = C.all_to_all(4, 4, weight=2.0, allow_self=False)
    assert_contract(a, (4, 4))
    np.testing.assert_array_equal(np.asarray(a.todense()), 2 * (1 - np.eye(4)))
    o = C.one_to_one(5, weight=jnp.arange(5.0))
    np.testing.assert_array_equal(np.asarray(o.todense()), np.diag(np.arange(5.0)))
    m = np.array([[0.0, 0.5, 0.0], [1.5, 0.0, -2.0]])
    d = C.from_dense(m)
    assert_contract(d, (2, 3))
    np.testing.assert_array_equal(np.asarray(d.todense()), m)
    b = C.from_dense(m != 0)
    np.testing.assert_array_equal(np.asarray(b.data), [1.0, 1.0, 1.0])


def test_from_arrays_sorts_and_permutes_weights():
    pre, post = [2, 0, 1, 0], [0, 3, 0, 1]
    w = [0.4, 0.2, 0.3, 0.1]
    conn = C.from_arrays(pre, post, w, 3, 4)
    assert_contract(conn, (3, 4))
    np.testing.assert_array_equal(np.asarray(conn.indices), [[0, 1], [0, 3], [1, 0], [2, 0]])
    np.testing.assert_allclose(np.asarray(conn.data), [0.1, 0.2, 0.3, 0.4])
    dense = np.zeros((3, 4))
    dense[pre, post] = w
    np.testing.assert_allclose(np.asarray(conn.todense()), dense, rtol=1e-7)
    multi = C.from_arrays(
        np.array([1, 0, 1], np.uint16),
        np.array([1, 0, 1]),
        [5.0, 6.0, 7.0],
        2,
        2,
        allow_multapses=True,
    )
    assert_contract(multi, (2, 2), unique=False)
    np.testing.assert_array_equal(np.asarray(multi.data), [6.0, 5.0, 7.0])  # stable order
    assert C.from_arrays([], [], 1.0, 2, 2).nse == 0


# -------------------------------------------------------------------------------- block


def test_block_densities_and_per_block_weights():
    sizes_pre, sizes_post = [300, 200], [250, 150]
    p = np.array([[0.1, 0.4], [0.0, 0.8]])
    w = np.array([[1.0, 2.0], [-3.0, -4.0]])
    conn = C.block(jr.key(6), sizes_pre, sizes_post, p, weight=w)
    assert_contract(conn, (500, 400))
    dense = np.asarray(conn.todense())
    rp, rq = np.cumsum([0, *sizes_pre]), np.cumsum([0, *sizes_post])
    for a in range(2):
        for b in range(2):
            blk = dense[rp[a] : rp[a + 1], rq[b] : rq[b + 1]]
            n = blk.size
            count = np.count_nonzero(blk)
            # Binomial(n, p) count: within 5 standard deviations (exact 0 for p = 0).
            assert abs(count - n * p[a, b]) <= 5 * math.sqrt(n * p[a, b] * (1 - p[a, b]))
            assert np.all(blk[blk != 0] == w[a, b])


def test_block_without_autapses_across_misaligned_groups():
    # Pre groups [100, 400] and post groups [250, 250] cut the diagonal at different places.
    conn = C.block(jr.key(7), [100, 400], [250, 250], [[0.5, 0.5], [0.5, 0.5]], allow_self=False)
    idx = np.asarray(conn.indices)
    assert not np.any(idx[:, 0] == idx[:, 1])
    pairs = 500 * 499
    assert abs(conn.nse - 0.5 * pairs) <= 5 * math.sqrt(pairs * 0.25)
    assert chi2_binomial(fan_out(conn), 499, 0.5) > P_MIN


def test_block_single_probability_equals_fixed_prob_statistics():
    conn = C.block(jr.key(8), [1000], [400], 0.05)
    assert chi2_binomial(fan_out(conn), 400, 0.05) > P_MIN


# --------------------------------------------------------------------- spatial builders


def brute_pairs(pos_pre, pos_post, rule):
    a, b = np.asarray(pos_pre, np.float64), np.asarray(pos_post, np.float64)
    return rule(a[:, None, :], b[None, :, :])


def test_grid_and_random_positions():
    g = np.asarray(C.grid_positions((2, 3)))
    np.testing.assert_array_equal(g, [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]])
    g3 = np.asarray(C.lattice((2, 2, 3), spacing=(1.0, 2.0, 0.5)))
    assert g3.shape == (12, 3)
    np.testing.assert_allclose(g3[7], [1.0, 0.0, 0.5])  # unravel_index(7, (2,2,3)) = (1,0,1)
    r = np.asarray(C.random_positions(KEY, 1000, (2.0, 5.0)))
    assert r.shape == (1000, 2)
    assert np.all((r >= 0) & (r < [2.0, 5.0]))
    # Uniform along each axis: KS against U(0, extent).
    assert st.kstest(r[:, 1], st.uniform(0, 5).cdf).pvalue > P_MIN


@pytest.mark.parametrize("block_size", [4, 1024])
def test_from_predicate_equals_brute_force(block_size):
    pos_pre = C.grid_positions((7, 9))
    pos_post = C.grid_positions((6, 5), spacing=1.3) + 0.4

    # No squared distance lies within 0.02 of 6.0, so float32 and float64 agree exactly.
    def near(a, b, key):
        return jnp.sum((a - b) ** 2, axis=-1) <= 6.0

    conn = C.from_predicate(KEY, pos_pre, pos_post, near, block_size=block_size)
    assert_contract(conn, (63, 30))
    d2 = brute_pairs(pos_pre, pos_post, lambda a, b: np.sum((a - b) ** 2, -1))
    assert np.abs(d2 - 6.0).min() > 0.02
    ref = d2 <= 6.0
    np.testing.assert_array_equal(np.asarray(conn.todense()) != 0, ref)


def test_from_predicate_lattice_blocks_as_in_block_structured_models():
    # Neurons of a 12 x 12 lattice connect within their 4 x 4 tile or the adjacent tiles, never
    # to themselves: the block rule users of lattice simulators write as a Python predicate.
    pos = C.grid_positions((12, 12))

    def tiles(a, b, key):
        return jnp.all(jnp.abs(a // 4 - b // 4) <= 1, axis=-1) & jnp.any(a != b, axis=-1)

    conn = C.from_predicate(KEY, pos, pos, tiles, block_size=50)
    ref = brute_pairs(
        pos, pos, lambda a, b: np.all(np.abs(a // 4 - b // 4) <= 1, -1) & np.any(a != b, -1)
    )
    np.testing.assert_array_equal(np.asarray(conn.todense()) != 0, ref)


def test_from_predicate_max_per_post_caps_degrees_with_subsets():
    pos = C.grid_positions((10, 10))

    def near(a, b, key):
        return jnp.sum((a - b) ** 2, axis=-1) <= 8.0

    full = C.from_predicate(KEY, pos, pos, near, allow_self=False)
    capped = C.from_predicate(KEY, pos, pos, near, allow_self=False, max_per_post=5)
    assert_contract(capped, (100, 100))
    np.testing.assert_array_equal(fan_in(capped), np.minimum(fan_in(full), 5))
    assert np.all(np.isin(keys_of(capped), keys_of(full)))


def test_max_per_post_keeps_a_uniform_subset():
    # All 10 sources are accepted by every one of 3000 targets; each keeps 3 of them. Every one
    # of the C(10, 3) = 120 subsets must be equally likely (expected 25 each).
    pre, post = C.grid_positions((10, 1)), C.grid_positions((3000, 1))
    conn = C.from_predicate(
        jr.key(9), pre, post, lambda a, b, key: jnp.ones((), bool), max_per_post=3
    )
    np.testing.assert_array_equal(fan_in(conn), 3)
    idx = np.asarray(conn.indices)
    order = np.lexsort((idx[:, 0], idx[:, 1]))
    chosen = idx[order, 0].reshape(3000, 3)
    code = (chosen * 10 ** np.arange(3)).sum(axis=1)
    counts = np.unique(code, return_counts=True)[1]
    assert counts.size == 120
    assert st.chisquare(counts).pvalue > P_MIN


def test_from_predicate_randomness_uses_the_key():
    pos = C.grid_positions((30, 30))

    def coin(a, b, key):
        return jr.uniform(key, (a - b).shape[:-1]) < 0.3

    c1 = C.from_predicate(jr.key(1), pos, pos, coin, block_size=256)
    c2 = C.from_predicate(jr.key(1), pos, pos, coin, block_size=256)
    c3 = C.from_predicate(jr.key(2), pos, pos, coin, block_size=256)
    np.testing.assert_array_equal(np.asarray(c1.indices), np.asarray(c2.indices))
    assert not np.array_equal(keys_of(c1)[:100], keys_of(c3)[:100])
    n = 900 * 900
    assert abs(c1.nse - 0.3 * n) <= 5 * math.sqrt(n * 0.21)


def min_image_d2(a, b, box):
    d = a - b
    if box is not None:
        d = d - box * np.round(d / box)
    return np.sum(d * d, -1)


@pytest.mark.parametrize("periodic", [None, (9.0, 11.0)])
@pytest.mark.parametrize("radius", [1.0, 1.5, 2.3, 4.5])
def test_distance_connect_lattice_equals_brute_force(periodic, radius):
    pos = C.grid_positions((9, 11))
    conn = C.distance_connect(KEY, pos, pos, radius, periodic=periodic, allow_self=False)
    assert_contract(conn, (99, 99))
    box = None if periodic is None else np.array(periodic)
    ref = brute_pairs(pos, pos, lambda a, b: min_image_d2(a, b, box) <= radius**2)
    np.fill_diagonal(ref, False)
    np.testing.assert_array_equal(np.asarray(conn.todense()) != 0, ref)


@pytest.mark.parametrize(
    "box, radius",
    [((4.0, 5.0, 6.0), 1.7), ((3.0, 3.0, 8.0), 1.4), ((2.0, 2.5, 3.0), 2.2), (None, 1.1)],
)
def test_distance_connect_random_3d_equals_brute_force(box, radius):
    # Boxes with 1 or 2 cells per axis exercise the periodic neighbour lists without repeats.
    extent = (4.0, 5.0, 6.0) if box is None else box
    pre = C.random_positions(jr.key(11), 300, extent)
    post = C.random_positions(jr.key(12), 250, extent)
    conn = C.distance_connect(KEY, pre, post, radius, periodic=box)
    b = None if box is None else np.array(box)
    d2 = brute_pairs(pre, post, lambda x, y: min_image_d2(x, y, b))
    got = np.asarray(conn.todense()) != 0
    mismatch = got != (d2 <= radius**2)
    # float32 against float64 distances may only disagree at the radius itself.
    assert np.all(np.abs(d2[mismatch] - radius**2) < 1e-4)
    assert got.sum() > 1000


def test_distance_connect_probability_thins_candidates():
    pos = C.grid_positions((40, 40))
    full = C.distance_connect(KEY, pos, pos, 3.0, periodic=40.0)
    half = C.distance_connect(KEY, pos, pos, 3.0, p=0.5, periodic=40.0)
    assert np.all(np.isin(keys_of(half), keys_of(full)))
    n = full.nse
    assert abs(half.nse - 0.5 * n) <= 5 * math.sqrt(n * 0.25)


@pytest.mark.parametrize("cutoff", [None, 15.0])
def test_gaussian_connect_mean_degree_matches_integral(cutoff):
    # On a periodic 60 x 60 unit lattice the expected in-degree is p_max sum_v exp(-|v|^2/2s^2)
    # over nonzero lattice vectors; the sum equals the integral 2 pi s^2 up to exp(-2 pi^2 s^2)
    # (Poisson summation), so the target is p_max (2 pi s^2 - 1). Tolerance: 5 standard errors
    # of the mean degree. The cutoff of 6 sigma drops exp(-18) of the mass.
    side, p_max, sigma = 60, 0.4, 2.5
    pos = C.grid_positions((side, side))
    conn = C.gaussian_connect(
        jr.key(13), pos, pos, p_max, sigma, periodic=float(side), allow_self=False, cutoff=cutoff
    )
    expected = p_max * (2 * math.pi * sigma**2 - 1)
    k = np.arange(-side // 2, side // 2)
    profile = p_max * np.exp(-(k[:, None] ** 2 + k[None, :] ** 2) / (2 * sigma**2))
    var = np.sum(profile * (1 - profile)) - p_max * (1 - p_max)
    se = math.sqrt(var / side**2)
    assert abs(fan_in(conn).mean() - expected) <= 5 * se


# ------------------------------------------------------------------------------ weights


def test_weight_distributions_moments():
    # 2e5 samples each: means within 5 standard errors, stds within 5 standard errors of the
    # sample standard deviation (sigma / sqrt(2 N) for a normal; a looser 2 % for the others).
    n = 200_000
    cases = [
        (C.normal(0.5, 0.2), 0.5, 0.2),
        (
            C.lognormal(-1.0, 0.5),
            math.exp(-1.0 + 0.125),
            math.sqrt((math.exp(0.25) - 1) * math.exp(-2.0 + 0.25)),
        ),
        (C.uniform(-1.0, 3.0), 1.0, 4.0 / math.sqrt(12.0)),
        (C.uniform(-1.0, 3.0, nonnegative=True), 1.5, 3.0 / math.sqrt(12.0)),
    ]
    for i, (dist, mean, std) in enumerate(cases):
        w = np.asarray(dist.sample(jr.key(20 + i), (n,)), np.float64)
        assert abs(w.mean() - mean) <= 5 * std / math.sqrt(n)
        assert w.std() == pytest.approx(std, rel=0.02 if i else 5 / math.sqrt(2 * n))
    assert np.asarray(C.uniform(-1.0, 3.0, nonnegative=True).sample(KEY, (n,))).min() >= 0


@pytest.mark.parametrize("mean, std", [(0.2, 0.5), (-1.0, 0.5), (-3.0, 0.4)])
def test_nonnegative_normal_is_the_truncated_normal(mean, std):
    w = np.asarray(C.normal(mean, std, nonnegative=True).sample(jr.key(30), (50_000,)))
    assert w.min() >= 0
    ref = st.truncnorm(-mean / std, np.inf, loc=mean, scale=std)
    assert st.kstest(w, ref.cdf).pvalue > P_MIN


def test_distribution_sample_works_under_jit_and_weights_reach_the_bcoo():
    dist = C.normal(1.0, 0.1)
    a = jax.jit(lambda k: dist.sample(k, (5,)))(KEY)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(dist.sample(KEY, (5,))))
    conn = C.fixed_indegree(jr.key(3), 2000, 500, 100, weight=C.normal(0.5, 0.1))
    w = np.asarray(conn.data, np.float64)
    assert abs(w.mean() - 0.5) <= 5 * 0.1 / math.sqrt(w.size)
    plain = C.fixed_indegree(jr.key(3), 2000, 500, 100)
    # The structure does not depend on the weights (separate keys).
    np.testing.assert_array_equal(np.asarray(conn.indices), np.asarray(plain.indices))


def test_weight_arrays_and_callables_follow_row_major_order():
    base = C.fixed_prob(KEY, 50, 40, 0.2)
    idx = np.asarray(base.indices)
    code = idx[:, 0] * 1000.0 + idx[:, 1]
    by_callable = C.fixed_prob(
        KEY, 50, 40, 0.2, weight=lambda pre, post: (pre * 1000 + post).astype(jnp.float32)
    )
    np.testing.assert_array_equal(np.asarray(by_callable.data), code)
    by_array = C.fixed_prob(KEY, 50, 40, 0.2, weight=jnp.asarray(code))
    np.testing.assert_array_equal(np.asarray(by_array.data), code)
    pos = C.grid_positions((5, 5))
    dist_w = C.distance_connect(
        KEY, pos, pos, 1.5, weight=lambda i, j: jnp.linalg.norm(pos[i] - pos[j], axis=-1)
    )
    d = np.linalg.norm(
        np.asarray(pos)[np.asarray(dist_w.indices[:, 0])]
        - np.asarray(pos)[np.asarray(dist_w.indices[:, 1])],
        axis=-1,
    )
    np.testing.assert_allclose(np.asarray(dist_w.data), d, rtol=1e-6)


# -------------------------------------------------------------------------------- stats


def test_stats_on_hand_made_matrices():
    m = np.array([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 4.0, 0.0]])
    s = C.stats(C.from_dense(m))
    assert s == {
        "n_pre": 3,
        "n_post": 4,
        "n_synapses": 4,
        "sparsity": 4 / 12,
        "mean_fan_in": 1.0,
        "min_fan_in": 1,
        "max_fan_in": 1,
        "mean_fan_out": 4 / 3,
        "min_fan_out": 0,
        "max_fan_out": 2,
        "bytes": 4 * 2 * 4 + 4 * 4,
        "bytes_per_synapse": 12.0,
        "index_dtype": "int32",
        "weight_dtype": "float32",
    }
    # A hand-built BCOO with one padding entry (index == shape) and a multapse.
    data = jnp.array([1.0, 1.0, 1.0, 0.0])
    indices = jnp.array([[0, 1], [0, 1], [1, 0], [2, 2]], jnp.int32)
    s = C.stats(sparse.BCOO((data, indices), shape=(2, 2)))
    assert (s["n_synapses"], s["max_fan_in"], s["min_fan_out"], s["bytes"]) == (3, 2, 1, 48)
    assert s["sparsity"] == 0.75


def test_same_key_same_connectivity_float32_and_float64():
    builders = [
        lambda k: C.fixed_prob(k, 200, 150, 0.1, weight=C.normal(1.0, 0.2)),
        lambda k: C.fixed_indegree(k, 200, 150, 20, weight=C.lognormal(0.0, 0.3)),
        lambda k: C.fixed_outdegree(k, 200, 150, 20, weight=C.uniform(0.0, 1.0)),
        lambda k: C.block(k, [100, 100], [50, 100], [[0.1, 0.2], [0.3, 0.0]]),
        lambda k: C.distance_connect(
            k, C.grid_positions((12, 12)), C.grid_positions((12, 12)), 3.0, p=0.5
        ),
        lambda k: C.gaussian_connect(
            k, C.grid_positions((12, 12)), C.grid_positions((12, 12)), 0.5, 2.0
        ),
    ]
    for build in builders:
        a, b, c = build(jr.key(42)), build(jr.key(42)), build(jr.key(43))
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        assert not np.array_equal(keys_of(a)[:50], keys_of(c)[:50])
        with jax.enable_x64(True):
            d = build(jr.key(42))
            assert d.data.dtype == jnp.float64 and d.indices.dtype == jnp.int32
        # The structure is drawn in 32 bits either way: x64 changes only the weight dtype.
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(d.indices))


# ---------------------------------------------------------------------------- bad input

POS = C.grid_positions((3, 3))

BAD = [
    (
        "p-above-1",
        lambda: C.fixed_prob(KEY, 10, 10, 1.5),
        ValueError,
        r"fixed_prob: p must be in \[0, 1\], got 1\.5",
    ),
    (
        "p-negative",
        lambda: C.fixed_prob(KEY, 10, 10, -0.1),
        ValueError,
        r"fixed_prob: p must be in \[0, 1\], got -0\.1$",
    ),
    (
        "p-nan",
        lambda: C.fixed_prob(KEY, 10, 10, float("nan")),
        ValueError,
        r"fixed_prob: p must be in \[0, 1\], got nan",
    ),
    (
        "p-string",
        lambda: C.fixed_prob(KEY, 10, 10, "0.1"),
        TypeError,
        r"fixed_prob: p: .*got string '0\.1'",
    ),
    (
        "n-pre-zero",
        lambda: C.fixed_prob(KEY, 0, 10, 0.1),
        ValueError,
        r"fixed_prob: n_pre must be a positive int, got 0",
    ),
    (
        "n-post-float",
        lambda: C.fixed_prob(KEY, 10, 10.0, 0.1),
        TypeError,
        r"fixed_prob: n_post must be a positive int, got 10\.0",
    ),
    (
        "n-too-large",
        lambda: C.fixed_prob(KEY, 2**31, 10, 0.1),
        ValueError,
        r"fixed_prob: n_pre must be <= 2\*\*30 \(int32 indices\), got 2147483648",
    ),
    (
        "key-int",
        lambda: C.fixed_prob(0, 10, 10, 0.1),
        TypeError,
        r"fixed_prob: key must be a JAX PRNG key such as jax.random.key\(0\), got int 0",
    ),
    (
        "key-batch",
        lambda: C.fixed_prob(jr.split(KEY, 2), 10, 10, 0.1),
        ValueError,
        r"fixed_prob: key must be a single PRNG key, got a batch of keys of shape \(2,\)",
    ),
    (
        "key-traced",
        lambda: jax.jit(lambda k: C.fixed_prob(k, 10, 10, 0.1).data)(KEY),
        TypeError,
        r"fixed_prob: key is a traced value; .* outside jit/vmap",
    ),
    (
        "self-two-populations",
        lambda: C.fixed_prob(KEY, 10, 12, 0.1, allow_self=False),
        ValueError,
        r"fixed_prob: allow_self=False requires n_pre == n_post \(one population\), got n_pre=10 and n_post=12",
    ),
    (
        "allow-self-not-bool",
        lambda: C.fixed_prob(KEY, 10, 10, 0.1, allow_self=0),
        TypeError,
        r"fixed_prob: allow_self must be True or False, got 0",
    ),
    (
        "indegree-k-too-large",
        lambda: C.fixed_indegree(KEY, 10, 20, 11),
        ValueError,
        r"fixed_indegree: k must be <= n_pre = 10 without multapses, got 11",
    ),
    (
        "indegree-k-no-self",
        lambda: C.fixed_indegree(KEY, 10, 10, 10, allow_self=False),
        ValueError,
        r"fixed_indegree: k must be <= n_pre - 1 = 9 without autapses or multapses, got 10",
    ),
    (
        "outdegree-k-too-large",
        lambda: C.fixed_outdegree(KEY, 20, 10, 11),
        ValueError,
        r"fixed_outdegree: k must be <= n_post = 10 without multapses, got 11",
    ),
    (
        "k-negative",
        lambda: C.fixed_outdegree(KEY, 20, 10, -1),
        ValueError,
        r"fixed_outdegree: k must be a non-negative int, got -1",
    ),
    (
        "k-no-candidate",
        lambda: C.fixed_indegree(KEY, 1, 1, 2, allow_self=False, allow_multapses=True),
        ValueError,
        r"fixed_indegree: k must be 0 when there is no candidate partner \(n_pre = 1 and allow_self=False\), got 2",
    ),
    (
        "arrays-float-index",
        lambda: C.from_arrays([0.0, 1.0], [0, 1], 1.0, 2, 2),
        TypeError,
        r"from_arrays: pre must be an array of integers, got dtype float64",
    ),
    (
        "arrays-out-of-range",
        lambda: C.from_arrays([0, 1], [0, 5], 1.0, 2, 3),
        ValueError,
        r"from_arrays: post indices must be in \[0, n_post\) = \[0, 3\), got 5 at position 1 \(1 out of range\)",
    ),
    (
        "arrays-negative",
        lambda: C.from_arrays([-1, 1], [0, 1], 1.0, 2, 3),
        ValueError,
        r"from_arrays: pre indices must be in \[0, n_pre\) = \[0, 2\), got -1 at position 0",
    ),
    (
        "arrays-lengths",
        lambda: C.from_arrays([0, 1, 1], [0, 1], 1.0, 2, 2),
        ValueError,
        r"from_arrays: pre and post must have the same length, got 3 and 2",
    ),
    (
        "arrays-duplicate",
        lambda: C.from_arrays([0, 1, 0], [1, 1, 1], 1.0, 2, 2),
        ValueError,
        r"from_arrays: duplicate synapse \(pre=0, post=1\) appears 2 times \(1 repeated entries in all\); pass allow_multapses=True",
    ),
    (
        "arrays-2d",
        lambda: C.from_arrays([[0, 1]], [[0, 1]], 1.0, 2, 2),
        ValueError,
        r"from_arrays: pre must be one-dimensional, got shape \(1, 2\)",
    ),
    (
        "weights-length",
        lambda: C.from_arrays([0, 1], [0, 1], [1.0, 2.0, 3.0], 2, 2),
        ValueError,
        r"from_arrays: weight must be a scalar or have one value per synapse \(shape \(2,\), in row-major \(pre, post\) order\), got shape \(3,\)",
    ),
    (
        "weight-nan",
        lambda: C.all_to_all(2, 2, weight=float("nan")),
        ValueError,
        r"all_to_all: weight must be finite, got nan",
    ),
    (
        "weight-string",
        lambda: C.one_to_one(3, weight="1"),
        TypeError,
        r"one_to_one: weight must be a real scalar, an array, a callable or a distribution: .*string '1'",
    ),
    (
        "weight-callable-shape",
        lambda: C.one_to_one(3, weight=lambda i, j: jnp.ones(2)),
        ValueError,
        r"one_to_one: weight\(pre, post\) must return a scalar or an array of shape \(3,\) \(one weight per synapse\), got shape \(2,\)",
    ),
    (
        "distribution-no-key",
        lambda: C.all_to_all(2, 2, weight=C.normal(0.0, 1.0)),
        ValueError,
        r"all_to_all: weight is a Normal distribution, which needs a random key; pass key=",
    ),
    (
        "normal-std-negative",
        lambda: C.normal(0.0, -1.0),
        ValueError,
        r"normal: std must be >= 0, got -1\.0",
    ),
    (
        "normal-truncation-hopeless",
        lambda: C.normal(-20.0, 1.0, nonnegative=True),
        ValueError,
        r"normal: with nonnegative=True the distribution must keep some mass at w >= 0 \(mean / std >= -10\), got mean=-20\.0 and std=1\.0",
    ),
    (
        "lognormal-sigma-array",
        lambda: C.lognormal(0.0, jnp.ones(2)),
        ValueError,
        r"lognormal: sigma must be a scalar, got an array of shape \(2,\)",
    ),
    (
        "uniform-low-high",
        lambda: C.uniform(2.0, 1.0),
        ValueError,
        r"uniform: low must be < high, got low=2\.0 and high=1\.0",
    ),
    (
        "uniform-nonneg-high",
        lambda: C.uniform(-2.0, -1.0, nonnegative=True),
        ValueError,
        r"uniform: with nonnegative=True, high must be > 0, got -1\.0",
    ),
    (
        "dense-1d",
        lambda: C.from_dense([1.0, 0.0]),
        ValueError,
        r"from_dense: matrix must be 2-D with both sizes >= 1, got shape \(2,\)",
    ),
    (
        "dense-inf",
        lambda: C.from_dense([[1.0, np.inf]]),
        ValueError,
        r"from_dense: matrix must be finite",
    ),
    (
        "positions-1d",
        lambda: C.distance_connect(KEY, jnp.zeros(5), POS, 1.0),
        ValueError,
        r"distance_connect: pos_pre must have shape \(n, d\) with n >= 1 and d >= 1, got shape \(5,\)",
    ),
    (
        "positions-dims",
        lambda: C.distance_connect(KEY, POS, jnp.zeros((4, 3)), 1.0),
        ValueError,
        r"distance_connect: pos_pre and pos_post must have the same number of dimensions d, got 2 and 3",
    ),
    (
        "positions-nan",
        lambda: C.from_predicate(
            KEY, POS.at[0, 0].set(jnp.nan), POS, lambda a, b, k: a[..., 0] < b[..., 0]
        ),
        ValueError,
        r"from_predicate: pos_pre must be finite",
    ),
    (
        "radius-zero",
        lambda: C.distance_connect(KEY, POS, POS, 0.0),
        ValueError,
        r"distance_connect: radius must be > 0, got 0\.0",
    ),
    (
        "sigma-negative",
        lambda: C.gaussian_connect(KEY, POS, POS, 0.5, -1.0),
        ValueError,
        r"gaussian_connect: sigma must be > 0, got -1\.0",
    ),
    (
        "p-max-above-1",
        lambda: C.gaussian_connect(KEY, POS, POS, 2.0, 1.0),
        ValueError,
        r"gaussian_connect: p_max must be in \[0, 1\], got 2\.0",
    ),
    (
        "periodic-shape",
        lambda: C.distance_connect(KEY, POS, POS, 1.0, periodic=(3.0, 3.0, 3.0)),
        ValueError,
        r"distance_connect: periodic must be a scalar or have one length per dimension \(shape \(2,\)\), got shape \(3,\)",
    ),
    (
        "periodic-zero",
        lambda: C.distance_connect(KEY, POS, POS, 1.0, periodic=0.0),
        ValueError,
        r"distance_connect: periodic lengths must be finite and > 0, got \[0\., 0\.\]",
    ),
    (
        "max-per-post-zero",
        lambda: C.distance_connect(KEY, POS, POS, 1.0, max_per_post=0),
        ValueError,
        r"distance_connect: max_per_post must be a positive int or None, got 0",
    ),
    (
        "predicate-not-callable",
        lambda: C.from_predicate(KEY, POS, POS, 3),
        TypeError,
        r"from_predicate: fn must be callable as fn\(pos_i, pos_j, key\), got 3",
    ),
    (
        "predicate-float-output",
        lambda: C.from_predicate(KEY, POS, POS, lambda a, b, k: jnp.sum(a - b, -1)),
        TypeError,
        r"from_predicate: fn must return a boolean array broadcastable to \(9, 9\) when called with pos_i of shape \(9, 1, 2\) and pos_j of shape \(1, 9, 2\), got dtype float32 and shape \(9, 9\)",
    ),
    (
        "block-p-shape",
        lambda: C.block(KEY, [2, 3], [4], [0.1, 0.2, 0.3]),
        ValueError,
        r"block: p must be a scalar or have shape \(2, 1\) \(one probability per pair of groups\), got shape \(3,\)",
    ),
    (
        "block-p-range",
        lambda: C.block(KEY, [2, 3], [4], [[0.1], [1.2]]),
        ValueError,
        r"block: p must be in \[0, 1\], got \[1\.2\]",
    ),
    (
        "block-size-zero",
        lambda: C.block(KEY, [2, 0], [4], 0.1),
        ValueError,
        r"block: sizes_pre\[1\] must be a positive int, got 0",
    ),
    (
        "block-sizes-int",
        lambda: C.block(KEY, 5, [4], 0.1),
        TypeError,
        r"block: sizes_pre must be a sequence of positive ints, got 5",
    ),
    (
        "block-weight-shape",
        lambda: C.block(KEY, [2, 3], [4], 0.1, weight=np.ones((2, 2))),
        ValueError,
        r"block: a 2-D weight gives one value per block and must have shape \(2, 1\), got shape \(2, 2\)",
    ),
    (
        "grid-shape-int",
        lambda: C.grid_positions(5),
        TypeError,
        r"grid_positions: shape must be a non-empty tuple of positive ints, got 5",
    ),
    (
        "grid-spacing-negative",
        lambda: C.grid_positions((2, 2), spacing=-1.0),
        ValueError,
        r"grid_positions: spacing lengths must be finite and > 0, got \[-1\., -1\.\]",
    ),
    (
        "random-extent-scalar",
        lambda: C.random_positions(KEY, 5, 3.0),
        TypeError,
        r"random_positions: extent must be a sequence of box lengths, one per dimension",
    ),
    (
        "stats-dense",
        lambda: C.stats(np.eye(2)),
        TypeError,
        r"stats: conn must be a jax.experimental.sparse.BCOO, got ndarray",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_raise_with_a_clear_message(case):
    _, call, exc, pattern = case
    with pytest.raises(exc, match=pattern):
        call()


# -------------------------------------------------------------------------------- scale


@pytest.mark.slow
def test_fixed_indegree_scales_to_1e8_synapses():
    # 1e6 post neurons x k = 100 in a fresh process (peak RSS is per process), via the
    # benchmark script; exact in-degrees and 12 bytes per synapse are checked there.
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.connect_scale", "--only", "fixed_indegree"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    row = next(r for r in rows if r.get("builder") == "fixed_indegree")
    assert row["n_synapses"] == 10**8
    assert row["degrees_exact"] is True
    assert row["bytes_per_synapse"] == 12.0
    # Measured ~10 s and ~4 GiB on the 2-core CI machine; the bounds leave room for noise.
    assert row["build_s"] < 60
    assert row["peak_rss_gib"] < 8
