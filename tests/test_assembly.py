"""Assembly calculus: the Brain, its two modes, the operations and the reference assertions.

References used here: SciPy's binomial quantile and truncated normal (the sampling
formulas), a NumPy loop over the same dense synapses (explicit mode, exactly), dense
matrices built from the fan-out lists (fan-out storage, exactly), and the published
reference-code assertions of REFERENCE.md ("Assembly calculus").
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import neurojax as nj
from neurojax.assembly import _sampling, _synapses

A = nj.assembly


def _brain(**kw):
    base = dict(areas={"A": (20_000, 100)}, stimuli={"s": 100}, p=0.05, beta=0.05)
    base.update(kw)
    return A.Brain(**base, key=jax.random.key(kw.pop("seed", 0)))


# -- sampling -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "total,p,n,k",
    [
        (634, 0.01, 100_000, 317),
        (2000, 0.001, 10**6, 1000),
        (317, 0.05, 100_000, 317),
        (50, 0.3, 1000, 10),
    ],
)
def test_binom_ppf_matches_scipy(total, p, n, k):
    table = _sampling.binom_tail_table(total, p, k / n)
    rng = np.random.default_rng(0)
    for trials in [0, 1, total // 3, total]:
        for w in rng.integers(0, n - 2 * k, 20):
            tail = k / (n - w)
            got = int(_sampling.binom_ppf(table, jnp.int32(trials), jnp.log(jnp.float32(tail))))
            want = stats.binom.ppf((n - w - k) / (n - w), trials, p)
            assert got == max(int(want), 0), (trials, w)


@pytest.mark.parametrize("lower,upper", [(-1.0, 2.0), (0.5, 40.0), (3.2, 50.0), (6.0, 30.0)])
def test_truncated_normal_matches_scipy_moments(lower, upper):
    z = _sampling.truncated_normal(
        jax.random.key(1), jnp.float32(lower), jnp.float32(upper), (200_000,)
    )
    z = np.asarray(z, np.float64)
    ref = stats.truncnorm(lower, upper)
    assert z.min() >= lower and z.max() <= upper
    # 200k samples: the standard error of the mean is sd/447; 5 standard errors.
    assert abs(z.mean() - ref.mean()) < 5 * ref.std() / np.sqrt(z.size)
    assert abs(z.std() / ref.std() - 1) < 0.02
    assert stats.kstest(z, ref.cdf).pvalue > 1e-3


def test_candidates_follow_reference_formula():
    """Rounded mu + sd * TruncNormal((alpha - mu)/sd, (total - mu)/sd), as the reference."""
    total, p, n, k, w = 634, 0.01, 100_000, 317, 1000
    table = _sampling.binom_tail_table(total, p, k / n)
    keys = jax.random.split(jax.random.key(3), 200)
    x = jax.vmap(
        lambda kk: _sampling.sample_candidates(kk, table, jnp.int32(total), n, k, jnp.int32(w), p)
    )(keys)
    x = np.asarray(x).ravel()
    alpha = stats.binom.ppf((n - w - k) / (n - w), total, p)
    mu, sd = total * p, np.sqrt(total * p * (1 - p))
    ref = np.round(
        mu
        + sd
        * stats.truncnorm((alpha - mu) / sd, (total - mu) / sd).rvs(
            x.size, random_state=np.random.default_rng(0)
        )
    )
    assert x.min() >= np.round(alpha - 0.5)
    assert abs(x.mean() - ref.mean()) < 5 * ref.std() / np.sqrt(x.size) * np.sqrt(2)
    vals = np.arange(x.min(), x.max() + 1)
    f_got = np.array([(x == v).mean() for v in vals])
    f_ref = np.array([(ref == v).mean() for v in vals])
    assert np.max(np.abs(f_got - f_ref)) < 0.01


def test_fanout_rows_are_bernoulli():
    n_src, n_tgt, p = 2000, 3000, 0.02
    fo = _synapses.random_fanout(jax.random.key(0), n_src, n_tgt, p)
    t = np.asarray(fo.targets)
    valid = t < n_tgt
    counts = valid.sum(1)
    # Row counts ~ Binomial(n_tgt, p): mean 60, sd 7.7; 2000 rows.
    assert abs(counts.mean() - n_tgt * p) < 5 * np.sqrt(n_tgt * p * (1 - p) / n_src)
    assert abs(counts.var() / (n_tgt * p * (1 - p)) - 1) < 0.15
    # Increasing, distinct targets within a row; padding only at the end.
    for r in range(0, n_src, 97):
        row = t[r][valid[r]]
        assert np.all(np.diff(row) > 0) and np.all(~valid[r][counts[r] :])
    # Column marginals uniform: every target gets ~n_src * p synapses.
    col = np.bincount(t[valid], minlength=n_tgt)
    assert stats.chisquare(col).pvalue > 1e-4
    assert np.all(np.asarray(fo.weights)[~valid] == 0) and np.all(
        np.asarray(fo.weights)[valid] == 1
    )


# -- construction errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(areas={"A": (100, 0)}), r"needs 0 < k <= n, got n=100, k=0"),
        (dict(areas={"A": (100, 101)}, mode="explicit"), r"needs 0 < k <= n"),
        (dict(areas={"A": (100, 2.5)}), r"pair of ints"),
        (dict(areas={}), r"areas must be a non-empty mapping"),
        (dict(p=1.5), r"p must be a number in \(0, 1\), got 1.5"),
        (dict(p=0), r"p must be a number in \(0, 1\)"),
        (dict(beta=-1.0), r"beta must be finite and > -1, got -1.0"),
        (dict(beta={"B": 0.1}), r"beta key 'B' is not an area"),
        (dict(beta={("x", "A"): 0.1}), r"beta key \('x', 'A'\) must be \(source, target\)"),
        (dict(stimuli={"s": 0}), r"stimuli\['s'\] must be an int >= 1, got 0"),
        (dict(stimuli={"A": 5}), r"'A' is both an area and a stimulus"),
        (dict(mode="lazy"), r"mode must be one of \('sparse', 'explicit'\), got 'lazy'"),
        (dict(capacity=50), r"capacity of area 'A' must be an int with k <= capacity <= n - k"),
        (dict(capacity=19_950), r"capacity of area 'A' must be"),
        (dict(capacity={"B": 500}), r"capacity names unknown areas \['B'\]"),
        (dict(mode="explicit", capacity=500), r"capacity applies to sparse mode only"),
        (dict(storage="fanout"), r"storage applies to explicit mode only"),
        (dict(mode="explicit", storage="csr"), r"storage must be one of"),
        (dict(areas={"A": (150, 100)}), r"sparse mode needs n >= 2k"),
    ],
)
def test_brain_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        _brain(**kw)


def test_brain_requires_key():
    with pytest.raises(ValueError, match="key is required"):
        A.Brain(areas={"A": (1000, 10)}, key=None)


def test_beta_overrides_resolve():
    b = A.Brain(
        areas={"A": (1000, 10), "B": (1000, 10)},
        stimuli={"s": 10},
        p=0.1,
        beta={"B": 0.2, ("A", "B"): 0.3, ("s", "A"): 0.0},
        key=jax.random.key(0),
    )
    assert float(b.beta[("s", "A")]) == 0.0
    assert float(b.beta[("A", "A")]) == pytest.approx(0.05)
    assert float(b.beta[("A", "B")]) == pytest.approx(0.3)
    assert float(b.beta[("B", "B")]) == pytest.approx(0.2)
    assert float(b.beta[("s", "B")]) == pytest.approx(0.2)


def test_project_rejects_bad_routing():
    b = _brain()
    s = b.init_state()
    with pytest.raises(ValueError, match="unknown stimulus 'x' in stimuli"):
        b.project(s, stimuli={"x": ["A"]})
    with pytest.raises(ValueError, match=r"unknown area 'B'"):
        b.project(s, stimuli={"s": ["B"]})
    with pytest.raises(ValueError, match="nothing to project"):
        b.project(s)
    with pytest.raises(ValueError, match="names area 'A' twice"):
        b.project(s, stimuli={"s": ["A", "A"]})
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        b.project_rounds(s, stimuli={"s": ["A"]}, steps=0)


def test_projecting_from_an_empty_area_raises_under_jit():
    b = _brain()
    s = b.init_state()
    with pytest.raises(Exception, match="area 'A' has no assembly yet"):
        jax.block_until_ready(b.project(s, areas={"A": ["A"]}))


def test_support_overflow_raises_under_jit_naming_area_and_capacity():
    b = _brain(capacity=100)
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    assert int(s.support["A"]) == 100
    msg = r"support of area 'A' would exceed its capacity 100.*capacity=\{'A': 200\}"
    with pytest.raises(Exception, match=msg):
        jax.block_until_ready(
            jax.jit(lambda s: b.project(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}))(s)
        )
    # Also when a compiled program keeps only part of the result: the trace's winners, or
    # the final stimulus weights (a program that keeps only the synapse matrices drops the
    # check, see `Brain._error_if`).
    rounds = functools.partial(b.project_rounds, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=3)
    for keep in (lambda out: out[1].winners["A"], lambda out: out[0].stimulus_weights[("s", "A")]):
        with pytest.raises(Exception, match="would exceed its capacity 100"):
            jax.block_until_ready(jax.jit(lambda s, keep=keep: keep(rounds(s)))(s))
    # Under vmap as well (a batch of brains, one check after the run).
    states = jax.vmap(b.init_state)(jax.random.split(jax.random.key(3), 2))
    run = jax.vmap(lambda s: rounds(b.project(s, stimuli={"s": ["A"]}))[1].support["A"])
    with pytest.raises(Exception, match="would exceed its capacity 100"):
        jax.block_until_ready(run(states))


def test_eager_projection_grows_the_capacity_with_identical_results():
    small, large = _brain(capacity=100), _brain(capacity=1000)

    def run(b):
        s = b.project(b.init_state(), stimuli={"s": ["A"]})
        s = b.project(s, stimuli={"s": ["A"]}, areas={"A": ["A"]})
        s, tr = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=8)
        return s, tr

    s_small, tr_small = run(small)
    s_large, tr_large = run(large)
    assert int(tr_large.support["A"][-1]) > 200  # the small one had to grow twice
    cap = small.capacity(s_small, "A")
    assert int(tr_small.support["A"][-1]) <= cap < 1000
    assert large.capacity(s_large, "A") == 1000
    for a, b in zip(jax.tree.leaves(tr_small), jax.tree.leaves(tr_large)):
        np.testing.assert_array_equal(a, b)
    sup = int(s_large.support["A"])
    np.testing.assert_array_equal(s_small.winners["A"], s_large.winners["A"])
    np.testing.assert_array_equal(
        s_small.weights[("A", "A")][:sup, :sup], s_large.weights[("A", "A")][:sup, :sup]
    )
    np.testing.assert_array_equal(
        s_small.stimulus_weights[("s", "A")][:sup], s_large.stimulus_weights[("s", "A")][:sup]
    )
    assert int(s_small.overflow["A"]) == 0 and int(s_small.faults["A"]) == 0
    # The grown state goes on like the large one, in the same Brain.
    s_small, _ = small.project_rounds(s_small, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=2)
    s_large, _ = large.project_rounds(s_large, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=2)
    np.testing.assert_array_equal(s_small.winners["A"], s_large.winners["A"])


def test_init_state_does_not_depend_on_the_capacity():
    small, large = _brain(capacity=100), _brain(capacity=300)
    s, big = small.init_state(), large.init_state()
    np.testing.assert_array_equal(s.weights[("A", "A")], big.weights[("A", "A")][:100, :100])
    np.testing.assert_array_equal(
        s.stimulus_weights[("s", "A")], big.stimulus_weights[("s", "A")][:100]
    )
    grown = small.grow_capacity(s, 300)
    for a, b in zip(jax.tree.leaves(grown), jax.tree.leaves(big)):
        np.testing.assert_array_equal(
            jax.random.key_data(a) if a.dtype == big.key.dtype else a,
            jax.random.key_data(b) if b.dtype == big.key.dtype else b,
        )
    with pytest.raises(ValueError, match=r"capacity of area 'A' must be an int with k <= "):
        small.grow_capacity(s, 19_950)


# -- explicit mode against a NumPy loop -----------------------------------------------------


def _numpy_explicit(stim, w_aa, k, beta, steps):
    """Explicit-mode dynamics written directly: stimulus + recurrence, stable top-k."""
    stim, w_aa = stim.astype(np.float64).copy(), w_aa.astype(np.float64).copy()
    winners = None
    history = []
    for _ in range(steps):
        x = stim.copy()
        if winners is not None:
            x += w_aa[winners].sum(0)
        new = np.argsort(-x, kind="stable")[:k]
        stim[new] *= 1 + beta
        if winners is not None:
            w_aa[np.ix_(winners, new)] *= 1 + beta
        winners = new
        history.append(new)
    return history, stim, w_aa


def test_explicit_mode_matches_numpy_loop_exactly():
    b = A.Brain(
        areas={"A": (300, 20)},
        stimuli={"s": 20},
        p=0.1,
        beta=0.1,
        mode="explicit",
        key=jax.random.key(4),
    )
    s0 = b.init_state()
    stim0, w0 = np.asarray(s0.stimulus_weights[("s", "A")]), np.asarray(s0.weights[("A", "A")])
    s = b.project(s0, stimuli={"s": ["A"]})
    s, trace = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=7)
    hist, stim, w = _numpy_explicit(stim0, w0, 20, 0.1, 8)
    got = np.asarray(trace.winners["A"])
    for t in range(7):
        assert sorted(got[t]) == sorted(hist[t + 1])
    np.testing.assert_allclose(np.asarray(s.stimulus_weights[("s", "A")]), stim, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(s.weights[("A", "A")]), w, rtol=1e-6)
    fired = set(np.concatenate(hist).tolist())
    assert int(s.support["A"]) == len(fired)
    assert int(trace.support["A"][-1]) == len(fired)


def test_kcap_breaks_ties_toward_lower_index_and_always_fires_k():
    b = A.Brain(
        areas={"A": (8, 3)},
        stimuli={"s": 4},
        p=0.5,
        beta=0.0,
        mode="explicit",
        key=jax.random.key(0),
    )
    s = b.init_state()
    stim = jnp.array([1.0, 2.0, 2.0, 0.0, 2.0, 2.0, 0.0, 0.0])
    s = eqx.tree_at(lambda t: t.stimulus_weights, s, {("s", "A"): stim})
    s = b.project(s, stimuli={"s": ["A"]})
    assert np.asarray(s.winners["A"]).tolist() == [1, 2, 4]
    zero = eqx.tree_at(lambda t: t.stimulus_weights, s, {("s", "A"): jnp.zeros(8)})
    s2 = b.project(zero, stimuli={"s": ["A"]})
    assert np.asarray(s2.winners["A"]).tolist() == [0, 1, 2]


def test_fanout_storage_matches_dense_storage_exactly():
    kw = dict(
        areas={"A": (400, 20), "B": (300, 15)},
        stimuli={"s": 20},
        p=0.1,
        beta=0.07,
        mode="explicit",
        key=jax.random.key(2),
    )
    bf = A.Brain(**kw, storage="fanout")
    bd = A.Brain(**kw, storage="dense")
    sf = bf.init_state()

    def dense(fo):
        m = np.zeros((fo.targets.shape[0], fo.n_tgt + 1), np.float32)
        rows = np.repeat(np.arange(fo.targets.shape[0]), fo.targets.shape[1])
        m[rows, np.asarray(fo.targets).ravel()] = np.asarray(fo.weights).ravel()
        return jnp.asarray(m[:, :-1])

    sd = eqx.tree_at(
        lambda t: t.weights, bd.init_state(), {key: dense(v) for key, v in sf.weights.items()}
    )
    sd = eqx.tree_at(lambda t: t.stimulus_weights, sd, sf.stimulus_weights)
    route = dict(stimuli={"s": ["A"]}, areas={"A": ["A", "B"], "B": ["B", "A"]})
    for st, br in ((sf, bf), (sd, bd)):
        st = br.project(st, stimuli={"s": ["A"]})
        st = br.project(st, stimuli={"s": ["A"]}, areas={"A": ["A", "B"]})
        st, _ = br.project_rounds(st, **route, steps=5)
        if br is bf:
            f_state = st
        else:
            d_state = st
    for area in ("A", "B"):
        assert (
            np.asarray(f_state.winners[area]).tolist() == np.asarray(d_state.winners[area]).tolist()
        )
    for key in f_state.weights:
        np.testing.assert_allclose(dense(f_state.weights[key]), d_state.weights[key], rtol=1e-6)


def test_fixed_area_keeps_its_winners_and_still_learns():
    b = A.Brain(
        areas={"A": (300, 20)},
        stimuli={"s": 20},
        p=0.1,
        beta=0.1,
        mode="explicit",
        key=jax.random.key(4),
    )
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    with pytest.raises(Exception, match="area 'A' has no assembly to fix"):
        jax.block_until_ready(b.fix(b.init_state(), "A"))
    s = b.fix(s, "A")
    before = np.asarray(s.winners["A"])
    w_before = np.asarray(s.weights[("A", "A")])
    s2 = b.project(s, areas={"A": ["A"]})
    assert np.asarray(s2.winners["A"]).tolist() == before.tolist()
    w_after = np.asarray(s2.weights[("A", "A")])
    block = np.ix_(before, before)
    np.testing.assert_allclose(w_after[block], w_before[block] * 1.1, rtol=1e-6)
    s3 = b.project(b.unfix(s2, "A"), areas={"A": ["A"]})
    assert int(s3.step) == 3


def test_plasticity_off_leaves_weights_unchanged():
    b = _brain()
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    s = b.project(s, stimuli={"s": ["A"]}, areas={"A": ["A"]})
    w = int(s.support["A"])
    s2 = b.project(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, plasticity=False)
    s3 = b.project(s, stimuli={"s": ["A"]}, areas={"A": ["A"]})
    # Synapses among the old support are untouched without plasticity, and change with it.
    np.testing.assert_array_equal(
        s2.stimulus_weights[("s", "A")][:w], s.stimulus_weights[("s", "A")][:w]
    )
    np.testing.assert_array_equal(s2.weights[("A", "A")][:w, :w], s.weights[("A", "A")][:w, :w])
    assert not np.array_equal(s3.weights[("A", "A")][:w, :w], s.weights[("A", "A")][:w, :w])


# -- sparse mode: synapse creation and the k-cap --------------------------------------------


def test_sparse_new_synapses_reproduce_the_drawn_inputs():
    """After a step, the synapses of the first-time winners (with the Hebbian factor divided
    out) add up, from the previous winners, to an input that beats every non-winner of the
    old support: the input split created the synapses consistently with the k-cap."""
    beta = 0.05
    b = _brain(beta=beta)
    s1 = b.project(b.init_state(), stimuli={"s": ["A"]})
    s2 = b.project(s1, stimuli={"s": ["A"]}, areas={"A": ["A"]})
    w_old, w_new = int(s1.support["A"]), int(s2.support["A"])
    assert w_new - w_old == int(s2.new_winners["A"]) > 0
    x = np.asarray(
        b.input_currents(
            eqx.tree_at(lambda t: t.winners, s2, s1.winners),
            stimuli={"s": ["A"]},
            areas={"A": ["A"]},
        )["A"],
        np.float64,
    )
    winners = np.asarray(s2.winners["A"])
    x_pre = x.copy()
    x_pre[winners] /= 1 + beta
    new = np.arange(w_old, w_new)
    assert np.all(np.isin(new, winners))
    # First-time inputs are integers (counts of unit synapses) at or above the binomial
    # threshold, and the k-cap holds: every winner >= every loser of the old support.
    np.testing.assert_allclose(x_pre[new], np.round(x_pre[new]), atol=1e-4)
    losers = np.setdiff1d(np.arange(w_old), winners)
    assert x_pre[winners].min() >= x_pre[losers].max() - 1e-4
    # Stimulus part of a new neuron's input never exceeds the stimulus size.
    stim = np.asarray(s2.stimulus_weights[("s", "A")])[new] / (1 + beta)
    assert np.all(stim <= 100) and np.all(stim >= 0)


def test_new_winner_labels_are_contiguous_and_support_counts_them():
    b = _brain()
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    assert sorted(np.asarray(s.winners["A"]).tolist()) == list(range(100))
    s, tr = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=10)
    sup = np.asarray(tr.support["A"])
    nw = np.asarray(tr.new_winners["A"])
    np.testing.assert_array_equal(np.diff(np.concatenate([[100], sup])), nw)
    assert np.asarray(s.winners["A"]).max() < sup[-1]
    assert len(set(np.asarray(s.winners["A"]).tolist())) == 100


def test_overlap_counts_shared_neurons():
    a = jnp.array([3, 1, 7, -1])
    b = jnp.array([7, 2, 3, 9, -1])
    assert int(A.overlap(a, b)) == 2
    assert int(A.overlap(jnp.array([-1, -1]), jnp.array([-1, 5]))) == 0
    stacked = A.overlap(jnp.array([[1, 2], [3, 4]]), jnp.array([[2, 5], [3, 4]]))
    assert np.asarray(stacked).tolist() == [1, 2]
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.choice(50, 10, replace=False), rng.choice(50, 12, replace=False)
        assert int(A.overlap(jnp.asarray(x), jnp.asarray(y))) == len(set(x) & set(y))


def test_convergence_step():
    assert np.asarray(A.convergence_step(jnp.array([5, 3, 0, 1, 0, 0]))).tolist() == 5
    assert np.asarray(A.convergence_step(jnp.array([[0, 0], [1, 2]]))).tolist() == [1, 3]


# -- transformations ------------------------------------------------------------------------


def _run(brain, key, steps=12):
    s = brain.init_state(key)
    s = brain.project(s, stimuli={"s": ["A"]})
    s, tr = brain.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=steps)
    return s.winners["A"], tr.support["A"]


def test_vmap_over_seeds_equals_single_runs_and_jit_equals_eager():
    # Bit equality needs a fixed summation order: the input currents are scatter-adds, which
    # a GPU runs with atomic adds in no fixed order (a last-bit difference flips k-cap ties),
    # so this comparison runs on the CPU device of any machine.
    with jax.default_device(jax.devices("cpu")[0]):
        b = _brain()
        keys = jax.random.split(jax.random.key(9), 3)
        win_b, sup_b = jax.jit(jax.vmap(lambda kk: _run(b, kk)))(keys)
        for i in range(3):
            win, sup = _run(b, keys[i])
            np.testing.assert_array_equal(win_b[i], win)
            np.testing.assert_array_equal(sup_b[i], sup)
    assert len({int(x) for x in sup_b[:, -1]}) > 1  # independent brains differ


def test_gradient_of_input_currents_wrt_weights_matches_finite_difference():
    b = A.Brain(
        areas={"A": (200, 10)}, stimuli={"s": 10}, p=0.1, mode="explicit", key=jax.random.key(1)
    )
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    proj = jnp.linspace(-1.0, 1.0, 200)

    def f(w_stim, w_aa):
        st = eqx.tree_at(
            lambda t: (t.stimulus_weights, t.weights), s, ({("s", "A"): w_stim}, {("A", "A"): w_aa})
        )
        x = b.input_currents(st, stimuli={"s": ["A"]}, areas={"A": ["A"]})["A"]
        return jnp.sum(jnp.tanh(x / 10.0) * proj)

    w_stim, w_aa = s.stimulus_weights[("s", "A")], s.weights[("A", "A")]
    g_stim, g_aa = jax.grad(f, argnums=(0, 1))(w_stim, w_aa)
    eps = 1e-2
    for i in (0, 57, 199):
        e = jnp.zeros(200).at[i].set(eps)
        fd = (f(w_stim + e, w_aa) - f(w_stim - e, w_aa)) / (2 * eps)
        assert float(g_stim[i]) == pytest.approx(float(fd), rel=2e-2, abs=1e-5)
    winners = np.asarray(s.winners["A"])
    # Only rows of firing neurons carry gradient.
    rows = np.abs(np.asarray(g_aa)).sum(1) > 0
    assert set(np.nonzero(rows)[0]) <= set(winners.tolist())


# -- operations -----------------------------------------------------------------------------


def test_project_until_stable_stops_at_convergence():
    b = _brain()
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    s_stable, steps = A.project_until_stable(
        b, s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, max_steps=60
    )
    _, tr = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=int(steps))
    ov = np.asarray(tr.overlap["A"])
    assert ov[-1] == 100 and np.all(ov[:-1] < 100) and int(steps) < 60
    np.testing.assert_array_equal(s_stable.winners["A"], tr.winners["A"][-1])


def _two_assemblies(n=100_000, k=100, p=0.05, beta=0.1, steps=10, seed=0):
    b = A.Brain(
        areas={"A": (n, k), "B": (n, k), "C": (n, k)},
        stimuli={"sa": k, "sb": k},
        p=p,
        beta=beta,
        key=jax.random.key(seed),
    )
    s = b.project(b.init_state(), stimuli={"sa": ["A"], "sb": ["B"]})
    s, _ = b.project_rounds(
        s, stimuli={"sa": ["A"], "sb": ["B"]}, areas={"A": ["A"], "B": ["B"]}, steps=steps - 1
    )
    return b, s


@pytest.mark.slow
def test_merge_forms_a_stable_assembly_linked_to_both_parents():
    b, s = _two_assemblies()
    s, tr = A.merge(b, s, "sa", "A", "sb", "B", "C", steps=30)
    assert int(tr.new_winners["C"][-1]) == 0 and int(tr.overlap["C"][-1]) >= 95
    # C's assembly alone (no stimulus) drives A and B back to (most of) their assemblies.
    a_win, b_win = s.winners["A"], s.winners["B"]
    back = b.project(s, areas={"C": ["A", "B"]}, plasticity=False)
    assert int(A.overlap(back.winners["A"], a_win)) >= 70
    assert int(A.overlap(back.winners["B"], b_win)) >= 70


@pytest.mark.slow
def test_association_increases_overlap_of_projections():
    """Reference `association_grand_sim`: after A and B fire together into C, the C-assemblies
    that A alone and B alone evoke overlap far above chance (k^2/n = 0.1 neurons here)."""
    b, s = _two_assemblies()
    s, _ = b.project_rounds(s, stimuli={"sa": ["A"]}, areas={"A": ["A", "C"]}, steps=1)
    s, _ = b.project_rounds(s, stimuli={"sa": ["A"]}, areas={"A": ["A", "C"], "C": ["C"]}, steps=9)
    s, _ = b.project_rounds(s, stimuli={"sb": ["B"]}, areas={"B": ["B", "C"]}, steps=1)
    s, _ = b.project_rounds(s, stimuli={"sb": ["B"]}, areas={"B": ["B", "C"], "C": ["C"]}, steps=9)

    def evoked_overlap(st):
        ca = b.project(
            b.project(st, stimuli={"sa": ["A"]}), areas={"A": ["C"]}, plasticity=False
        ).winners["C"]
        cb = b.project(
            b.project(st, stimuli={"sb": ["B"]}), areas={"B": ["C"]}, plasticity=False
        ).winners["C"]
        return int(A.overlap(ca, cb))

    before = evoked_overlap(s)
    s, tr = A.associate(b, s, "sa", "A", "sb", "B", "C", steps=10)
    after = evoked_overlap(s)
    assert after >= before + 5 and after >= 8


def test_reciprocal_projection_lets_b_restore_a():
    b, s = _two_assemblies(steps=10)
    a_win = s.winners["A"]
    s, tr = A.reciprocal_project(b, s, "sa", "A", "B", steps=15)
    assert int(tr.new_winners["B"][-1]) <= 2
    a_win = s.winners["A"]
    back = b.project(s, areas={"B": ["A"]}, plasticity=False)
    # Chance overlap is k^2/n = 0.1; the link B -> A restores most of A.
    assert int(A.overlap(back.winners["A"], a_win)) >= 50


def test_operations_validate_arguments():
    b, s = _two_assemblies(n=2000, k=20, steps=2)
    with pytest.raises(ValueError, match="areas must be distinct"):
        A.merge(b, s, "sa", "A", "sb", "A", "C")
    with pytest.raises(ValueError, match=r"fraction must be a number in \(0, 1\], got 1.5"):
        A.pattern_complete(b, s, "A", 1.5, key=jax.random.key(0))
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        A.reciprocal_project(b, s, "sa", "A", "B", steps=0)
    with pytest.raises(ValueError, match="labels must be a 1-d integer array of at most k=20"):
        b.set_winners(s, "A", jnp.arange(21))
    with pytest.raises(Exception, match="labels of area 'A' must be distinct"):
        jax.block_until_ready(b.set_winners(s, "A", jnp.array([1, 1])))


# -- reference assertions (REFERENCE.md) ----------------------------------------------------


@pytest.mark.slow
def test_reference_projection_converges_at_one_million_neurons():
    b = A.Brain(
        areas={"A": (10**6, 1000)}, stimuli={"s": 1000}, p=0.001, beta=0.05, key=jax.random.key(0)
    )
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    s, tr = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=24)
    win = np.asarray(tr.winners["A"])
    # Steps 24 and 25 of the reference are rows 22 and 23 here (step 1 was the first project).
    # The projection converges: its support stops growing (no neuron that never won before
    # joins, for the last 5 steps), and the winners settle on one assembly or swap a
    # few (at most 5 of 1000) among those of the support (which a seed gives depends on the
    # synapses it draws).
    assert np.all(np.asarray(tr.new_winners["A"])[-5:] == 0)
    for i in range(18, 23):
        assert len(set(win[i].tolist()) & set(win[i + 1].tolist())) >= 1000 - 5


@pytest.mark.slow
def test_reference_pattern_completion():
    b = A.Brain(
        areas={"A": (100_000, 317)}, stimuli={"s": 317}, p=0.05, beta=0.05, key=jax.random.key(0)
    )
    s = b.project(b.init_state(), stimuli={"s": ["A"]})
    s, _ = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=24)
    recovered = []
    for seed in range(3):
        done, _ = A.pattern_complete(b, s, "A", 0.5, 5, key=jax.random.key(seed))
        recovered.append(int(A.overlap(done.winners["A"], s.winners["A"])))
    assert min(recovered) >= 300, recovered


@pytest.mark.slow
def test_reference_support_after_100_steps_over_seeds():
    b = A.Brain(
        areas={"A": (100_000, 317)}, stimuli={"s": 317}, p=0.01, beta=0.05, key=jax.random.key(0)
    )

    def run(key):
        s = b.project(b.init_state(key), stimuli={"s": ["A"]})
        _, tr = b.project_rounds(s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=99)
        return tr.support["A"], tr.new_winners["A"], tr.overlap["A"]

    sup, new, ov = jax.jit(jax.vmap(run))(jax.random.split(jax.random.key(11), 8))
    sup, new, ov = np.asarray(sup), np.asarray(new), np.asarray(ov)
    conv = np.asarray(A.convergence_step(new)) + 1  # + 1: the first step was separate
    assert np.all(conv <= 25), conv
    # Most brains end with the same winners at consecutive steps; about one in eight settles
    # into a 2-cycle that swaps a few neurons (also seen with the reference algorithm).
    assert np.sum(ov[:, -1] == 317) >= 6 and np.all(ov[:, -1] >= 310), ov[:, -1]
    # Published: 1262 +- 27 (seeded reruns of the reference). Our own 16-seed spread is
    # about 45; the mean of 8 seeds is then known to +-16 (1 s.e.), and is checked
    # against the band widened by 3 standard errors.
    final = sup[:, -1]
    assert 1262 - 27 - 3 * 16 <= final.mean() <= 1262 + 27 + 3 * 16, final
    assert 4 * 317 * 0.8 <= final.mean() <= 4 * 317 * 1.2


@pytest.mark.slow
def test_explicit_and_sparse_modes_agree_at_large_n():
    """With n >> k the binomial-tail candidates of sparse mode stand for the never-fired
    neurons of explicit mode; the growth of the support agrees within the seed spread."""
    kw = dict(
        areas={"A": (100_000, 100)}, stimuli={"s": 100}, p=0.005, beta=0.05, key=jax.random.key(0)
    )
    out = {}
    for mode in ("sparse", "explicit"):
        b = A.Brain(**kw, mode=mode)
        sups = [
            np.asarray(_run(b, kk, steps=19)[1]) for kk in jax.random.split(jax.random.key(5), 4)
        ]
        out[mode] = np.array(sups)
    sp, ex = out["sparse"], out["explicit"]
    # The first recurrent steps (2-4) agree within 6 %. Later the modes drift apart by a few
    # per cent (sparse mode redraws never-fired neurons' inputs every step, explicit mode keeps
    # them): over two runs of 4-6 seeds steps 5-6 and the final support differed by 3-10 %,
    # so those are held to 15 %.
    np.testing.assert_allclose(sp[:, :3].mean(0), ex[:, :3].mean(0), rtol=0.06)
    np.testing.assert_allclose(sp[:, 3:5].mean(0), ex[:, 3:5].mean(0), rtol=0.15)
    assert abs(sp[:, -1].mean() / ex[:, -1].mean() - 1) < 0.15


# -- command line ---------------------------------------------------------------------------


def test_cli_run_assembly_json_and_plot(tmp_path, capsys):
    import json

    from neurojax.cli import main

    plot = tmp_path / "assembly.png"
    rc = main(
        [
            "run",
            "assembly",
            "--n",
            "20000",
            "--k",
            "100",
            "--p",
            "0.05",
            "--steps",
            "25",
            "--json",
            "--plot",
            str(plot),
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["new_winners"][0] == 100 and len(out["support"]) == 25
    np.testing.assert_array_equal(np.diff(out["support"]), out["new_winners"][1:])
    assert out["overlap"][-1] == 100 and out["converged_at_step"] is not None
    assert plot.stat().st_size > 0


def test_cli_run_assembly_rejects_bad_flags(capsys):
    from neurojax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "assembly", "--n", "6000", "--k", "5000"])
    assert e.value.code == 2
    assert "sparse mode needs n >= 2k" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "assembly", "--p", "1.5"])
    assert "--p: must be a number in (0, 1), got '1.5'" in capsys.readouterr().err


def test_training_example_reaches_the_target_assembly():
    """examples/assembly_target.py: optax on the soft projection makes the hard projection
    produce the chosen assembly (it starts near chance: 30 * 30 / 1000 ~ 1 neuron)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "assembly_target.py"
    spec = importlib.util.spec_from_file_location("assembly_target", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # optax's Adam mixes a weakly typed float with its int32 step count.
    with jax.numpy_dtype_promotion("standard"):
        result = module.main(["--steps", "250"])
    assert result["overlap_before"] <= 5
    assert result["overlap_after"] == result["k"]
    assert result["loss_last"] < result["loss_first"] / 10


def test_cli_run_assembly_table_stops_at_convergence_and_plot_has_legends(capsys, monkeypatch):
    """The table lists the steps up to the first one without new winners and sums up the
    rest in one line (issue "first hour", point 9); the plot's dashed lines are labelled."""
    from matplotlib.figure import Figure

    from neurojax import _cli_assembly
    from neurojax.cli import build_parser, main

    args = ["run", "assembly", "--n", "20000", "--k", "100", "--p", "0.05", "--steps", "25"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln[:5].strip().isdigit() and "no new" not in ln]
    conv = int(out.split("no new winners from step")[1].split()[0])
    assert len(rows) == conv < 25
    assert f"{conv + 1}-25: no new winners" in out
    drawn = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path: drawn.setdefault("fig", fig))
    result = _cli_assembly._run(build_parser()[0].parse_args(args), False)
    _cli_assembly._plot(result, "unused.png")
    labels = [
        [t.get_text() for t in ax.get_legend().get_texts()]
        for ax in drawn["fig"].axes
        if ax.get_legend() is not None
    ]
    assert labels == [["k = 100 (the same winners)"], ["4 k = 400"]]
