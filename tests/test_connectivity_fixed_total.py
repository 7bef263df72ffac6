"""`nj.connect.fixed_total_number` against the multinomial expectation of its rule."""

import jax
import numpy as np
import pytest
from scipy import stats

import neurojax as nj


def _pairs(conn):
    idx = np.asarray(conn.indices)
    return idx[:, 0], idx[:, 1]


def test_exact_count_shape_and_order():
    conn = nj.connect.fixed_total_number(jax.random.key(0), 300, 200, 12345, weight=0.5)
    pre, post = _pairs(conn)
    assert conn.shape == (300, 200) and conn.nse == 12345
    assert conn.indices.dtype == np.int32 and np.all(np.asarray(conn.data) == np.float32(0.5))
    key = pre.astype(np.int64) * 200 + post
    assert np.all(np.diff(key) >= 0)  # row-major, duplicates adjacent
    assert pre.min() >= 0 and pre.max() < 300 and post.min() >= 0 and post.max() < 200


def test_degrees_follow_the_multinomial():
    # Each synapse picks pre and post uniformly: in-degree ~ Binomial(n, 1/n_post), and the
    # vector of in-degrees is multinomial (a chi-square test of uniformity over posts).
    n_pre, n_post, n = 400, 250, 200_000
    conn = nj.connect.fixed_total_number(jax.random.key(3), n_pre, n_post, n)
    pre, post = _pairs(conn)
    k_in = np.bincount(post, minlength=n_post)
    k_out = np.bincount(pre, minlength=n_pre)
    assert k_in.sum() == n and k_out.sum() == n
    # mean exact; variance n p (1 - p) within its sampling error (~ sqrt(2/(n_post-1)) rel.)
    p = 1 / n_post
    assert k_in.var(ddof=1) == pytest.approx(n * p * (1 - p), rel=4 * np.sqrt(2 / n_post))
    p = 1 / n_pre
    assert k_out.var(ddof=1) == pytest.approx(n * p * (1 - p), rel=4 * np.sqrt(2 / n_pre))
    for counts in (k_in, k_out):
        chi2 = stats.chisquare(counts).pvalue
        assert chi2 > 1e-4
    # multapses: pairs carrying >= 2 synapses, expected n_pairs * P(Binomial(n, q) >= 2)
    q = 1 / (n_pre * n_post)
    key = pre.astype(np.int64) * n_post + post
    _, mult = np.unique(key, return_counts=True)
    expected = n_pre * n_post * stats.binom.sf(1, n, q)
    assert (mult >= 2).sum() == pytest.approx(expected, rel=4 / np.sqrt(expected))


def test_no_autapses_and_no_multapses():
    conn = nj.connect.fixed_total_number(jax.random.key(1), 50, 50, 2000, allow_self=False)
    pre, post = _pairs(conn)
    assert not np.any(pre == post)
    conn = nj.connect.fixed_total_number(
        jax.random.key(2), 30, 40, 1000, allow_self=True, allow_multapses=False
    )
    pre, post = _pairs(conn)
    key = pre.astype(np.int64) * 40 + post
    assert conn.nse == 1000 and np.unique(key).size == 1000
    assert np.all(np.diff(key) > 0)


def test_without_multapses_every_subset_is_uniform():
    # 2 synapses among the 6 pairs of a 2 x 3 grid: each pair is in the subset with
    # probability 2/6, whatever the pair (frequencies over 300 keys, chi-square).
    hits = np.zeros(6)
    for s in range(300):
        conn = nj.connect.fixed_total_number(jax.random.key(s), 2, 3, 2, allow_multapses=False)
        pre, post = _pairs(conn)
        assert np.unique(pre * 3 + post).size == 2
        hits[pre * 3 + post] += 1
    assert hits.sum() == 600
    assert stats.chisquare(hits).pvalue > 1e-4


def test_reproducible_and_weights_from_distribution():
    a = nj.connect.fixed_total_number(jax.random.key(7), 100, 80, 3000)
    b = nj.connect.fixed_total_number(
        jax.random.key(7), 100, 80, 3000, weight=nj.connect.normal(1.0, 0.1)
    )
    assert np.array_equal(np.asarray(a.indices), np.asarray(b.indices))
    w = np.asarray(b.data)
    assert w.mean() == pytest.approx(1.0, abs=4 * 0.1 / np.sqrt(3000))
    assert w.std() == pytest.approx(0.1, rel=0.1)
    conn = nj.connect.fixed_total_number(jax.random.key(7), 100, 80, 0)
    assert conn.nse == 0 and conn.shape == (100, 80)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_pre=2, n_post=3, n=7, allow_multapses=False), r"n must be <= 6"),
        (dict(n_pre=2, n_post=3, n=1, allow_self=False), r"n_pre == n_post|same population"),
        (dict(n_pre=1, n_post=1, n=1, allow_self=False), r"no candidate pair"),
        (dict(n_pre=4, n_post=4, n=-1), r"n must be a non-negative int"),
        (dict(n_pre=0, n_post=4, n=1), r"n_pre must be a positive int"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nj.connect.fixed_total_number(jax.random.key(0), **kwargs)


def test_bad_types_are_refused():
    with pytest.raises(TypeError, match="fixed_total_number: n must be"):
        nj.connect.fixed_total_number(jax.random.key(0), 4, 4, 2.5)
    with pytest.raises(TypeError, match="fixed_total_number: allow_multapses must be True"):
        nj.connect.fixed_total_number(jax.random.key(0), 4, 4, 2, allow_multapses=1)
    with pytest.raises(TypeError, match="fixed_total_number: key must be a JAX PRNG key"):
        nj.connect.fixed_total_number(0, 4, 4, 2)


@pytest.mark.parametrize(("n_pre", "n_post", "n"), [(1, 1, 5), (7, 3, 0), (300, 200, 700_000)])
def test_sorted_pairs_equal_a_lexicographic_sort(n_pre, n_post, n):
    """The division-free decoding of the sorted keys gives the pairs sorted by (pre, post),
    as NumPy's lexsort orders them (more synapses than one decoding block)."""
    from neurojax.connectivity._fixed_total import _sorted_pairs

    rng = np.random.default_rng(n)
    pre = rng.integers(0, n_pre, n, dtype=np.int32)
    post = rng.integers(0, n_post, n, dtype=np.int32)
    order = np.lexsort((post, pre))
    want = np.stack([pre[order], post[order]], axis=1)
    got = _sorted_pairs(pre, post, n_pre, n_post)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("n_pre", "n_post", "n"), [(50_000, 60_000, 300_000), (3, 2**30, 1000)])
def test_sorted_pairs_with_int64_keys_equal_a_lexicographic_sort(n_pre, n_post, n):
    """Beyond 2**31 candidate pairs the keys are int64; the same order as NumPy's lexsort."""
    from neurojax.connectivity._fixed_total import _sorted_pairs

    rng = np.random.default_rng(n)
    pre = rng.integers(0, n_pre, n, dtype=np.int32)
    post = rng.integers(0, n_post, n, dtype=np.int32)
    order = np.lexsort((post, pre))
    want = np.stack([pre[order], post[order]], axis=1)
    np.testing.assert_array_equal(_sorted_pairs(pre.copy(), post, n_pre, n_post), want)


@pytest.mark.parametrize(
    ("n_pre", "n_post", "n", "allow_self"),
    [
        (300, 200, 700_000, True),  # more synapses than one decoding block
        (5000, 4, 20, True),  # most rows empty
        (40, 40, 9000, False),  # no autapses
        (7, 3, 0, True),
        (70_000, 40_000, 500_000, True),  # int64 keys
    ],
)
def test_compressed_rows_equal_the_sorted_pairs(n_pre, n_post, n, allow_self):
    """`fixed_total_csr` (the microcircuit's direct build) gives exactly the synapses of
    `fixed_total_pairs` for the same key: row pointers from the pairs' rows, the same columns."""
    from neurojax.connectivity._fixed_total import fixed_total_csr, fixed_total_pairs

    key = jax.random.key(n + n_pre)
    pairs = fixed_total_pairs(key, n_pre, n_post, n, allow_self, True)
    indptr, indices = fixed_total_csr(key, n_pre, n_post, n, allow_self)
    want_ptr = np.concatenate([[0], np.cumsum(np.bincount(pairs[:, 0], minlength=n_pre))])
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    np.testing.assert_array_equal(indptr, want_ptr)
    np.testing.assert_array_equal(indices, pairs[:, 1])
    if not allow_self:
        rows = np.repeat(np.arange(n_pre), np.diff(indptr))
        assert not np.any(rows == indices)
