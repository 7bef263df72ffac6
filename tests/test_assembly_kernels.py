"""The compiled CPU kernels of the assembly calculus against the pure-JAX path and NumPy.

On CPU a projection step runs its input sum, its synapse update (first-time winners and the
Hebbian factor), its draw of the new winners' inputs and its k-cap in the kernels of
`neurojax/kernels/assembly.cc`; other platforms run the pure-JAX code. Each kernel is
checked here against that code and against a NumPy loop written from the definition, under
`vmap` and `grad`, and whole projections are run through both paths.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import neurojax as nj
from neurojax.assembly import _brain, _synapses
from neurojax.kernels import _build

# Kernel calls trace every platform's implementation (tests/conftest.py).
pytestmark = pytest.mark.cross_platform

A = nj.assembly
_PROBE = (jnp.zeros(2, jnp.float32), jnp.zeros(1, jnp.float32))  # any top-k input


@pytest.fixture
def kernel():
    # The tests below also call the FFI functions directly: register every target first.
    targets = tuple(t for k in nj.kernels.registry().values() for t in k.ffi_targets)
    if nj.kernels.mode() != "auto" or not _build.register_targets(targets):
        pytest.skip("the compiled CPU kernels could not be built here")


def _weights(rng, r, c, integer=False):
    if integer:
        return rng.integers(0, 3, (r, c)).astype(np.float32)
    # Hebbian-like weights: 0 or a power of 1.05, so sums are inexact in float32.
    w = (rng.random((r, c)) < 0.3) * 1.05 ** rng.integers(0, 60, (r, c))
    return w.astype(np.float32)


def _rows(rng, r, k, pad=2):
    rows = rng.choice(r, k, replace=False).astype(np.int32)
    rows[rng.choice(k, pad, replace=False)] = -1
    return rows


# -- input sum --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,k", [((50, 37), 9), ((400, 1000), 150), ((2536, 2536), 317)])
def test_dense_inputs_kernel_matches_numpy_and_jax(kernel, shape, k):
    rng = np.random.default_rng(k)
    w = _weights(rng, *shape)
    rows = _rows(rng, shape[0], k)
    limit = shape[1] // 2
    ref = w[rows[rows >= 0]].astype(np.float64).sum(axis=0)
    ref[limit:] = 0.0
    got = np.asarray(_synapses._rowsum_kernel(jnp.asarray(w), jnp.asarray(rows), limit))
    pure = np.asarray(_synapses._rowsum_jax(jnp.asarray(w), jnp.asarray(rows), limit))
    # float32 sums in list order (kernel) and in XLA's order: both within float32 rounding.
    np.testing.assert_allclose(got, ref, rtol=2e-6)
    np.testing.assert_allclose(pure, ref, rtol=2e-6)
    assert np.all(got[limit:] == 0.0)
    # Integer weights sum exactly, in any order: the two paths agree bit for bit.
    wi = jnp.asarray(_weights(rng, *shape, integer=True))
    np.testing.assert_array_equal(
        _synapses._rowsum_kernel(wi, jnp.asarray(rows), shape[1]),
        _synapses._rowsum_jax(wi, jnp.asarray(rows), shape[1]),
    )


def test_dense_inputs_under_vmap_and_grad(kernel):
    rng = np.random.default_rng(1)
    ws = jnp.asarray(np.stack([_weights(rng, 60, 40, integer=True) for _ in range(3)]))
    rows = jnp.asarray(np.stack([_rows(rng, 60, 12) for _ in range(3)]))
    limits = jnp.asarray([40, 17, 0], jnp.int32)
    want = np.stack([_synapses._rowsum_jax(ws[b], rows[b], limits[b]) for b in range(3)])
    # Batched weights: one kernel call for the batch; shared weights: one call per entry.
    got = jax.jit(jax.vmap(_synapses.dense_inputs))(ws, rows, limits)
    np.testing.assert_array_equal(got, want)
    shared = jax.vmap(_synapses.dense_inputs, in_axes=(None, 0, None))(ws[0], rows, 40)
    np.testing.assert_array_equal(
        shared, np.stack([_synapses._rowsum_jax(ws[0], rows[b], 40) for b in range(3)])
    )
    # The gradient is the pure-JAX one: d sum(c * x) / dW[r] = c on the summed rows.
    c = jnp.asarray(rng.normal(size=40).astype(np.float32))
    g = jax.grad(lambda w: jnp.sum(c * _synapses.dense_inputs(w, rows[0], 30)))(ws[0])
    g_ref = jax.grad(lambda w: jnp.sum(c * _synapses._rowsum_jax(w, rows[0], 30)))(ws[0])
    np.testing.assert_array_equal(g, g_ref)
    on = np.asarray(rows[0])[np.asarray(rows[0]) >= 0]
    np.testing.assert_array_equal(np.asarray(g)[on, :30], np.broadcast_to(c[:30], (on.size, 30)))
    assert np.all(np.asarray(g)[:, 30:] == 0.0)


# -- synapse update ----------------------------------------------------------------------------


def _update_case(rng, n_src=300, n_tgt=280, k=40, width=12, n_new=15):
    w = _weights(rng, n_src, n_tgt)
    # Valid source rows with -1 gaps between them: the update counts only the valid ones.
    src_rows = np.full(k, -1, np.int32)
    n_src_win = k - 3
    src_rows[np.sort(rng.choice(k, n_src_win, replace=False))] = rng.choice(
        n_src, n_src_win, replace=False
    )
    cols = np.full(k, n_tgt, np.int32)
    first = int(rng.integers(0, n_tgt - n_new))
    cols[rng.choice(k, n_new, replace=False)] = first + np.arange(n_new)
    start, count = 7, n_src_win
    chosen = rng.integers(0, start + count + 5, (k, width)).astype(np.int32)
    heb_rows = _rows(rng, n_src, k, pad=4)
    heb_cols = _rows(rng, n_tgt, k, pad=5)
    factor = np.float32(1.0 + rng.random())
    return w, (src_rows, cols, chosen, start, count), (heb_rows, heb_cols, factor)


def _update_numpy(w, created, hebb):
    """The definition, one synapse at a time."""
    w = w.copy()
    src_rows, cols, chosen, start, count = created
    for i, c in enumerate(cols):
        if not 0 <= c < w.shape[1]:
            continue
        for r in src_rows[src_rows >= 0]:
            w[r, c] = 0.0
        valid = src_rows[src_rows >= 0]
        for t in chosen[i]:
            if 0 <= t - start < count:
                w[valid[t - start], c] = 1.0
    if hebb is not None:
        rows, tcols, factor = hebb
        for r in rows[rows >= 0]:
            for c in tcols[tcols >= 0]:
                w[r, c] = np.float32(w[r, c] * factor)
    return w


@pytest.mark.parametrize("plastic", [True, False])
def test_dense_update_kernel_equals_definition_and_jax_exactly(kernel, plastic):
    rng = np.random.default_rng(2)
    w, created, hebb = _update_case(rng)
    hebb = hebb if plastic else None
    want = _update_numpy(w, created, hebb)
    args = (jnp.asarray(w), tuple(map(jnp.asarray, created)))
    hebb_j = None if hebb is None else tuple(map(jnp.asarray, hebb))
    got = jax.jit(_synapses.dense_update)(*args, hebb_j)
    assert not np.array_equal(want, w)
    np.testing.assert_array_equal(got, want)
    i32 = [jnp.asarray(a, jnp.int32) for a in created]
    h = hebb_j if plastic else (jnp.zeros(0, jnp.int32), jnp.zeros(0, jnp.int32), 1.0)
    pure = _synapses._update_jax(
        plastic,
        args[0],
        *i32,
        jnp.asarray(h[0], jnp.int32),
        jnp.asarray(h[1], jnp.int32),
        jnp.asarray(h[2], jnp.float32),
    )
    np.testing.assert_array_equal(pure, want)


def test_dense_update_under_vmap_and_grad(kernel):
    rng = np.random.default_rng(3)
    cases = [_update_case(rng) for _ in range(3)]
    ws = jnp.asarray(np.stack([c[0] for c in cases]))
    created = tuple(jnp.asarray(np.stack([c[1][j] for c in cases])) for j in range(5))
    hebb = tuple(jnp.asarray(np.stack([c[2][j] for c in cases])) for j in range(3))
    got = jax.jit(jax.vmap(_synapses.dense_update))(ws, created, hebb)
    for b, (w, cr, hb) in enumerate(cases):
        np.testing.assert_array_equal(got[b], _update_numpy(w, cr, hb))
    # Gradient: the created synapses are constants, the others scale by the factor.
    w, cr, hb = cases[0]
    c = jnp.asarray(rng.normal(size=w.shape).astype(np.float32))
    cr_j, hb_j = tuple(map(jnp.asarray, cr)), tuple(map(jnp.asarray, hb))
    g = jax.grad(lambda w: jnp.sum(c * _synapses.dense_update(w, cr_j, hb_j)))(jnp.asarray(w))
    probe = _update_numpy(np.ones_like(w), cr, hb)  # factor where scaled, 0 where created
    created_mask = _update_numpy(np.full_like(w, 7.0), cr, None) != 7.0
    expect = np.where(created_mask, 0.0, np.where(probe != 1.0, hb[2], 1.0)) * np.asarray(c)
    np.testing.assert_allclose(g, expect, rtol=1e-6)


def _rows_summed_after_update(rng, hebb, n_src, k):
    """Rows to sum after an update: half of them rows the Hebbian factor scales (as in a
    converged projection), the rest other rows, in a shuffled order, with padding."""
    scaled = hebb[0][hebb[0] >= 0]
    others = np.setdiff1d(np.arange(n_src), scaled)
    rows = np.concatenate([scaled[: k // 2], rng.choice(others, k - k // 2, replace=False)])
    rng.shuffle(rows)
    rows[rng.choice(k, 3, replace=False)] = -1
    return rows.astype(np.int32)


@pytest.mark.parametrize("plastic", [True, False])
def test_dense_update_inputs_equals_update_then_sum_exactly(kernel, plastic):
    """One kernel for the update and the next input sum gives both results of the two
    separate operations bit for bit, limits below and above the scaled width included."""
    rng = np.random.default_rng(5)
    for limit in (0, 17, 200, 10_000):
        w, created, hebb = _update_case(rng)
        hebb_j = tuple(map(jnp.asarray, hebb)) if plastic else None
        created_j = tuple(map(jnp.asarray, created))
        rows = jnp.asarray(_rows_summed_after_update(rng, hebb, w.shape[0], 60))
        want_w = _synapses.dense_update(jnp.asarray(w), created_j, hebb_j)
        want_x = _synapses.dense_inputs(want_w, rows, limit)
        got_w, got_x = jax.jit(_synapses.dense_update_inputs)(
            jnp.asarray(w), created_j, hebb_j, rows, limit
        )
        np.testing.assert_array_equal(got_w, want_w)
        np.testing.assert_array_equal(got_x, want_x)
        assert np.any(got_x != 0.0) == (limit > 0)
        # The pure-JAX path: the same weights, and the sum within float32 rounding.
        with nj.kernels.use("reference"):
            pure_w, pure_x = _synapses.dense_update_inputs(
                jnp.asarray(w), created_j, hebb_j, rows, limit
            )
        np.testing.assert_array_equal(pure_w, want_w)
        np.testing.assert_allclose(pure_x, want_x, rtol=2e-6)


def test_dense_update_inputs_under_vmap_and_grad(kernel):
    rng = np.random.default_rng(6)
    cases = [_update_case(rng) for _ in range(3)]
    rows = np.stack([_rows_summed_after_update(rng, c[2], c[0].shape[0], 40) for c in cases])
    ws = jnp.asarray(np.stack([c[0] for c in cases]))
    created = tuple(jnp.asarray(np.stack([c[1][j] for c in cases])) for j in range(5))
    hebb = tuple(jnp.asarray(np.stack([c[2][j] for c in cases])) for j in range(3))
    limits = jnp.asarray([30, 150, 500], jnp.int32)
    got_w, got_x = jax.jit(jax.vmap(_synapses.dense_update_inputs))(
        ws, created, hebb, jnp.asarray(rows), limits
    )
    # Shared weights and update, a batch of row lists: the matrix is updated once per entry.
    shared = jax.vmap(_synapses.dense_update_inputs, in_axes=(None, None, None, 0, None))
    one = tuple(a[0] for a in created), tuple(a[0] for a in hebb)
    sh_w, sh_x = jax.jit(shared)(ws[0], *one, jnp.asarray(rows), limits[0])
    for b, (w, cr, hb) in enumerate(cases):
        want = _update_numpy(w, cr, hb)
        np.testing.assert_array_equal(got_w[b], want)
        np.testing.assert_array_equal(got_x[b], _synapses.dense_inputs(want, rows[b], limits[b]))
        np.testing.assert_array_equal(sh_w[b], _update_numpy(cases[0][0], cases[0][1], cases[0][2]))
        np.testing.assert_array_equal(sh_x[b], _synapses.dense_inputs(sh_w[b], rows[b], limits[0]))
    # Gradient through both results against the two separate operations.
    w, cr, hb = cases[0]
    cr_j, hb_j = tuple(map(jnp.asarray, cr)), tuple(map(jnp.asarray, hb))
    c = jnp.asarray(rng.normal(size=w.shape).astype(np.float32))
    r0 = jnp.asarray(rows[0])

    def separate(w):
        w = _synapses.dense_update(w, cr_j, hb_j)
        return jnp.sum(c * w) + jnp.sum(_synapses.dense_inputs(w, r0, 200) ** 2)

    def fused(w):
        w, x = _synapses.dense_update_inputs(w, cr_j, hb_j, r0, 200)
        return jnp.sum(c * w) + jnp.sum(x**2)

    g_sep, g_fused = jax.grad(separate)(jnp.asarray(w)), jax.grad(fused)(jnp.asarray(w))
    assert np.any(np.asarray(g_fused) != np.asarray(c))
    np.testing.assert_allclose(g_fused, g_sep, rtol=1e-6)


# -- Floyd's draw of the new winners' inputs --------------------------------------------------


def test_floyd_kernel_equals_jax_and_draws_distinct_items(kernel):
    rng = np.random.default_rng(4)
    for _ in range(6):
        rows, width = int(rng.integers(1, 400)), int(rng.integers(1, 60))
        total = int(rng.integers(width, 3000))
        m = np.where(rng.random(rows) < 0.6, rng.integers(0, width + 1, rows), 0).astype(np.int32)
        slot = np.where(m > 0, np.cumsum(m > 0) - 1, 0).astype(np.int32)
        words = rng.integers(0, 2**32, (rows, width), dtype=np.uint64).astype(np.uint32)
        args = (jnp.asarray(words), jnp.asarray(slot), jnp.asarray(m), jnp.int32(total))
        got = np.asarray(jax.jit(_brain._floyd_kernel)(*args))
        np.testing.assert_array_equal(got, _brain._floyd_words(*args))
        for r in range(rows):
            kept = got[r, : m[r]]
            assert len(set(kept.tolist())) == m[r] and np.all((kept >= 0) & (kept < total))
            assert np.all(got[r, m[r] :] == total)
    batch = jax.vmap(_brain._floyd_kernel, in_axes=(0, None, None, None))(
        jnp.stack([args[0], args[0][::-1]]), *args[1:]
    )
    np.testing.assert_array_equal(batch[0], got)
    np.testing.assert_array_equal(batch[1], _brain._floyd_words(args[0][::-1], *args[1:]))


@pytest.mark.parametrize("path", ["kernel", "jax"])
def test_choose_inputs_draws_uniform_subsets(path):
    """2 of 5 items, 20000 rows: each of the 10 pairs 2000 times up to chance (chi-square);
    then rows with and without draws mixed, one with draws alone (the smallest bucket)."""
    if path == "kernel" and not nj.kernels.implementations(
        nj.kernels.registry()["assembly_top_k"], *_PROBE, k=1
    ):
        pytest.skip("the compiled CPU kernels could not be built here")
    with nj.kernels.use("auto" if path == "kernel" else "reference"):
        _check_choose_inputs_draws_uniform_subsets()


def _check_choose_inputs_draws_uniform_subsets():
    m = jnp.full((20_000,), 2, jnp.int32)
    chosen = np.asarray(_brain._choose_inputs(jax.random.key(5), m, jnp.int32(5), 4, 5)[0])
    assert np.all(chosen[:, 2:] == 5)
    pairs = np.sort(chosen[:, :2], axis=1)
    counts = np.bincount(pairs[:, 0] * 5 + pairs[:, 1], minlength=25)
    observed = counts[[a * 5 + b for a in range(5) for b in range(a + 1, 5)]]
    assert observed.sum() == 20_000
    assert stats.chisquare(observed).pvalue > 1e-4
    m = jnp.zeros((300,), jnp.int32).at[jnp.asarray([3, 150, 299])].set(jnp.asarray([4, 0, 6]))
    ranges = [(0, 5), (5, 30), (30, 41)]
    chosen, counts = _brain._choose_inputs(
        jax.random.key(6), m, jnp.int32(40), 8, 40, ranges=ranges
    )
    chosen = np.asarray(chosen)
    for r, m_r in enumerate(np.asarray(m)):
        assert len(set(chosen[r, :m_r].tolist())) == m_r and np.all(chosen[r, m_r:] == 40)
    for (lo, hi), count in zip(ranges, counts, strict=True):
        np.testing.assert_array_equal(count, ((chosen >= lo) & (chosen < hi)).sum(axis=1))
    single = jnp.zeros((300,), jnp.int32).at[10].set(40)  # all 40 items: a permutation
    chosen = _brain._choose_inputs(jax.random.key(7), single, jnp.int32(40), 40, 40)[0]
    assert sorted(np.asarray(chosen)[10].tolist()) == list(range(40))
    # No row draws: all padding, and the counts are those of the padding.
    chosen, counts = _brain._choose_inputs(
        jax.random.key(8), jnp.zeros((300,), jnp.int32), jnp.int32(40), 8, 40, ranges=ranges
    )
    assert np.all(np.asarray(chosen) == 40)
    np.testing.assert_array_equal(counts[0], 0)
    np.testing.assert_array_equal(counts[2], 8)


# -- k-cap ------------------------------------------------------------------------------------


def test_top_k_kernel_equals_lax_top_k_with_ties(kernel):
    rng = np.random.default_rng(6)
    # float32 selects by radix over the values' order bits, float64 by comparisons: values
    # of both signs over many exponents, ties, and rows with fewer than k finite entries.
    for dtype in (np.float32, np.float64):
        for trial in range(40):
            n = int(rng.integers(1, 3000))
            k = int(rng.integers(1, n + 1)) if trial % 5 else n
            if trial % 4 == 1:
                x = rng.integers(0, 4, n).astype(dtype)  # many ties
            elif trial % 4 == 2:
                x = (rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
            elif trial % 4 == 3:
                x = rng.integers(-3, 3, n) * 1.05 ** rng.integers(0, 40, n)
                x = x.astype(dtype)  # Hebbian-like sums, ties between near values
            else:
                x = rng.random(n).astype(dtype)
            if trial % 3 == 0:
                x[rng.random(n) < (0.5 if trial % 2 else 0.97)] = -np.inf
            want = jax.lax.top_k(jnp.asarray(x), k)
            cut = int(rng.integers(0, n + 1))  # the kernel reads [x1, x2] as one row
            got = _brain._top_k_kernel(jnp.asarray(x[:cut]), jnp.asarray(x[cut:]), k)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    xs = jnp.asarray(rng.integers(0, 3, (4, 50)).astype(np.float32))
    np.testing.assert_array_equal(
        jax.vmap(lambda x: _brain._top_k(x[:30], 7, x[30:])[1])(xs), jax.lax.top_k(xs, 7)[1]
    )
    # The values' tangent is the input tangent at the winners.
    jac = jax.jacfwd(lambda x: _brain._top_k(x[:20], 3, x[20:])[0])(xs[0])
    idx = np.asarray(jax.lax.top_k(xs[0], 3)[1])
    np.testing.assert_array_equal(jac, np.eye(50, dtype=np.float32)[idx])


def test_sparse_cap_kernel_equals_pure_jax(kernel):
    """The sparse k-cap with its bookkeeping (labels of first-time winners, their inputs,
    columns and word slots, the counts and the overlap) against the pure-JAX path: ties
    between support and candidates, partial and empty supports, fixed areas, winner lists
    padded with -1, and under vmap."""
    rng = np.random.default_rng(11)
    cap, k = 300, 40
    cases = []
    for trial in range(30):
        w = int(rng.integers(0, cap + 1))
        x = rng.integers(0, 12, cap).astype(np.float32)
        x[w:] = -np.inf
        cand = np.sort(rng.integers(0, 14, k))[::-1].astype(np.float32)
        old = rng.choice(max(w, k), k, replace=False).astype(np.int32)
        old[rng.random(k) < (0.3 if trial % 3 == 0 else 0.0)] = -1
        fixed = trial % 5 == 4
        cases.append((x, cand, np.int32(w), np.bool_(fixed), old))
        args = [jnp.asarray(a) for a in cases[-1]]
        got = _brain._sparse_cap_kernel(*args)
        want = _brain._sparse_cap_jax(*args)
        for g, e in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, e)
        # Definition of the counts.
        win, m, cols, slot, info = (np.asarray(v) for v in got)
        new = (cols < cap) if not fixed else np.zeros(k, bool)
        assert info[0] == new.sum() and info[1] == (m > 0).sum() and info[3] == m.max()
        assert info[2] == len(set(win[win >= 0].tolist()) & set(old[old >= 0].tolist()))
        if not fixed:
            np.testing.assert_array_equal(win[new], w + np.arange(new.sum()))
    batch = [jnp.asarray(np.stack(a)) for a in zip(*cases[:6])]
    got = jax.vmap(_brain._sparse_cap)(*batch)
    want = jax.vmap(_brain._sparse_cap_jax)(*batch)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, e)


# -- random words ------------------------------------------------------------------------------


def test_random_words_kernel_equals_jax_random_bits(kernel):
    """The Threefry kernel draws the words of `jax.random.bits` exactly (every size parity,
    batched keys under vmap); other key types go to `jax.random.bits` itself."""
    assert jax.config.jax_threefry_partitionable
    for seed in (0, 1, 2**31 + 5):
        key = jax.random.key(seed)
        for n in (1, 2, 3, 321, 4099):
            got = jax.jit(lambda k, n=n: _brain._random_words(k, n))(key)
            want = jax.random.bits(key, (n,), jnp.uint32)
            assert got.dtype == jnp.uint32
            np.testing.assert_array_equal(got, want)
    keys = jax.random.split(jax.random.key(3), 6)
    np.testing.assert_array_equal(
        jax.vmap(lambda k: _brain._random_words(k, 9))(keys),
        jax.vmap(lambda k: jax.random.bits(k, (9,), jnp.uint32))(keys),
    )
    rbg = jax.random.key(4, impl="rbg")
    np.testing.assert_array_equal(
        _brain._random_words(rbg, 10), jax.random.bits(rbg, (10,), jnp.uint32)
    )


def test_a_brain_with_an_rbg_key_projects():
    brain = A.Brain(
        areas={"A": (5_000, 50)},
        stimuli={"s": 50},
        p=0.05,
        beta=0.1,
        key=jax.random.key(1, impl="rbg"),
    )
    _, trace = _run(brain, 20)
    assert int(trace.overlap["A"][-1]) == 50
    assert 50 < int(trace.support["A"][-1]) < 400


# -- whole projections through both paths -----------------------------------------------------


def _run(brain, steps):
    state = brain.project(brain.init_state(), stimuli={"s": ["A"]})
    return brain.project_rounds(state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=steps)


@pytest.mark.parametrize("mode", ["sparse", "explicit"])
def test_projection_is_identical_through_kernels_and_pure_jax(kernel, mode):
    """With beta = 0 every weight is an integer, so every sum is exact and both paths must
    give the same brain bit for bit: winners, supports and every synapse (the first-time
    winners' synapses included). With beta > 0 one step from identical states (the stimulus
    step, whose inputs are integers) must also give identical weights."""
    n = 20_000 if mode == "sparse" else 3_000

    def brain(beta, seed):
        return A.Brain(
            areas={"A": (n, 60)},
            stimuli={"s": 60},
            p=0.05,
            beta=beta,
            mode=mode,
            key=jax.random.key(seed),
        )

    static, plastic = brain(0.0, 7), brain(0.1, 8)
    fin_k, tr_k = _run(static, 30)
    one_k = plastic.project(plastic.init_state(), stimuli={"s": ["A"]}, areas={})
    two_k = plastic.project(one_k, stimuli={"s": ["A"]}, areas={"A": ["A"]})
    with nj.kernels.use("reference"):
        fin_j, tr_j = _run(static, 30)
        one_j = plastic.project(plastic.init_state(), stimuli={"s": ["A"]}, areas={})
        two_j = plastic.project(one_k, stimuli={"s": ["A"]}, areas={"A": ["A"]})
    assert int(tr_k.support["A"][-1]) > 60 and int(tr_k.new_winners["A"][1]) > 0
    for field in ("winners", "support", "new_winners", "overlap"):
        np.testing.assert_array_equal(getattr(tr_k, field)["A"], getattr(tr_j, field)["A"])
    np.testing.assert_array_equal(fin_k.weights[("A", "A")], fin_j.weights[("A", "A")])
    np.testing.assert_array_equal(
        fin_k.stimulus_weights[("s", "A")], fin_j.stimulus_weights[("s", "A")]
    )
    np.testing.assert_array_equal(one_k.winners["A"], one_j.winners["A"])
    np.testing.assert_array_equal(two_k.winners["A"], two_j.winners["A"])
    np.testing.assert_array_equal(two_k.weights[("A", "A")], two_j.weights[("A", "A")])


@pytest.mark.parametrize("mode", ["sparse", "explicit"])
@pytest.mark.parametrize("plasticity", [True, False])
def test_project_rounds_equals_a_loop_of_project(mode, plasticity):
    """`project_rounds` computes each step's dense input sums at the end of the step before
    (`dense_update_inputs`); `project` computes them in the step. With beta > 0 (inexact
    float32 sums) and three areas (one fed by a source area that is not a target, one
    fixed), every step of the two must give the same brain bit for bit."""
    n = 4_000 if mode == "sparse" else 600
    brain = A.Brain(
        areas={"A": (n, 30), "B": (n, 30), "C": (n, 25)},
        stimuli={"s": 30, "u": 20},
        p=0.05,
        beta={"A": 0.07, "B": 0.07, "C": 0.07, ("A", "B"): 0.2},
        mode=mode,
        key=jax.random.key(11),
    )
    state = brain.init_state()
    state = brain.project(state, stimuli={"s": ["A"], "u": ["C"]})
    state = brain.project(state, stimuli={"s": ["A"], "u": ["C"]}, areas={"A": ["B"]})
    state = brain.fix(state, "C")
    route = {"stimuli": {"s": ["A"]}, "areas": {"A": ["A", "B"], "B": ["B"], "C": ["B"]}}
    loop = state
    overlaps = []
    for _ in range(6):
        nxt = brain.project(loop, **route, plasticity=plasticity)
        overlaps.append(int(A.overlap(nxt.winners["B"], loop.winners["B"])))
        loop = nxt
    fin, trace = brain.project_rounds(state, **route, steps=6, plasticity=plasticity)
    assert int(trace.support["B"][-1]) > 30
    np.testing.assert_array_equal(trace.overlap["B"], overlaps)
    for a in ("A", "B", "C"):
        np.testing.assert_array_equal(fin.winners[a], loop.winners[a])
        np.testing.assert_array_equal(fin.support[a], loop.support[a])
    for pair, w in loop.weights.items():
        np.testing.assert_array_equal(fin.weights[pair], w, err_msg=str(pair))
    for pair, w in loop.stimulus_weights.items():
        np.testing.assert_array_equal(fin.stimulus_weights[pair], w, err_msg=str(pair))
    np.testing.assert_array_equal(fin.winners["C"], state.winners["C"])


def test_trace_overlap_equals_overlap():
    """`project_rounds` counts the overlap through a mask over the support; `overlap` sorts."""
    rng = np.random.default_rng(9)
    # Labels below a sparse capacity (the mask) and below an explicit area's n > 2**16 (sort).
    for size in (1024, 100_000):
        for _ in range(20):
            a, b = (rng.choice(size, 50, replace=False).astype(np.int32) for _ in range(2))
            b[:25] = a[rng.choice(50, 25, replace=False)]
            a[rng.random(50) < 0.1] = -1
            b[rng.random(50) < 0.1] = -1
            got = _brain._overlap_labels(jnp.asarray(a), jnp.asarray(b), size)
            assert int(got) == int(A.overlap(jnp.asarray(a), jnp.asarray(b)))
            assert int(got) == len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist()))


@pytest.mark.slow
def test_float64_brain_runs_the_kernels_and_matches_pure_jax(kernel):
    """Under x64 the weights are float64 and the kernels take their float64 branch."""
    with jax.enable_x64(True):
        brain = A.Brain(
            areas={"A": (20_000, 60)}, stimuli={"s": 60}, p=0.05, beta=0.0, key=jax.random.key(7)
        )
        fin_k, tr_k = _run(brain, 20)
        with nj.kernels.use("reference"):
            fin_j, tr_j = _run(brain, 20)
    assert fin_k.weights[("A", "A")].dtype == jnp.float64
    assert int(tr_k.support["A"][-1]) > 60
    np.testing.assert_array_equal(tr_k.winners["A"], tr_j.winners["A"])
    np.testing.assert_array_equal(fin_k.weights[("A", "A")], fin_j.weights[("A", "A")])
