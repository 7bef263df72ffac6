"""Checks of the NumPy assembly-calculus peer (`benchmarks.peers.assembly_numpy`).

The peer is the yardstick the JAX assembly code is compared against, so it is checked here
against references that do not come from its own code:

- the k-cap against `heapq.nlargest` (what the reference code uses) and the candidate
  threshold against a binomial quantile summed by hand from `math.comb`;
- the candidate inputs against the mean of the rounded truncated normal, integrated with
  scipy's `truncnorm.cdf`;
- every step of small multi-area brains against the model's definition, recomputed from a
  snapshot taken before the step: support inputs from the old weights, the new neurons'
  inputs read back from the new weights, the cap (ties to the lower index, first-time
  winners labelled in cap order), the Hebbian factor on exactly the synapses from previous
  onto new winners, and Bernoulli(p) / Binomial(k_s, p) entries for every other new synapse;
- the published behaviour of the reference simulations (REFERENCE.md, "Assembly calculus"):
  projection convergence and support size, and pattern completion.
"""

import heapq
import math

import numpy as np
import pytest
from scipy.stats import truncnorm

from benchmarks.peers.assembly_numpy import (
    NumpyBrain,
    candidate_threshold,
    k_cap,
    run_projection,
    sample_candidate_inputs,
    split_inputs,
)

# --------------------------------------------------------------------------- helpers


def snapshot(brain: NumpyBrain, stimuli: list[str], areas: list[str]) -> dict:
    """Copies of everything a step reads."""
    weights = {}
    for t in areas:
        for s in stimuli + areas:
            weights[(s, t)] = brain.weights(s, t)
    return {"winners": brain.winners, "support": brain.support, "weights": weights}


def check_step(before, brain, stim_in, area_in, p, exact, plasticity=True):
    """Check one step of target areas against the model, from the pre-step snapshot.

    `stim_in[t]` / `area_in[t]` list the stimuli / areas that fired into `t`. With
    `exact=True` (integer weights, beta = 0) ties are checked exactly; otherwise inputs are
    compared with a relative tolerance of 1e-5 (float32 sums in a different order).
    """
    stim_sizes = {s: brain._stim_size[s] for s in brain._stims}
    for t in set(stim_in) | set(area_in):
        stims, srcs = stim_in.get(t, []), area_in.get(t, [])
        w0, w1 = before["support"][t], brain.support[t]
        new = brain.winners[t]
        f = w1 - w0
        assert brain.new_winners[t] == f
        assert new.size == brain._k[t]
        assert np.unique(new).size == new.size
        # first-time winners are exactly w0 .. w1-1, labelled in cap order
        first = new[new >= w0]
        np.testing.assert_array_equal(first, np.arange(w0, w1))
        # inputs of the old support from the old weights
        x = np.zeros(w0)
        for s in stims:
            x += before["weights"][(s, t)]
        for r in srcs:
            x += before["weights"][(r, t)][before["winners"][r]].sum(axis=0, dtype=np.float64)
        # the new neurons' inputs, read back from the new weights (undoing the Hebbian factor)
        m = np.zeros(f)
        for s in stims:
            factor = 1.0 + brain.beta(s, t) * plasticity
            m += brain.weights(s, t)[w0:] / factor
        for r in srcs:
            factor = 1.0 + brain.beta(r, t) * plasticity
            col = brain.weights(r, t)[: before["support"][r], w0:]
            m += col[before["winners"][r]].sum(axis=0, dtype=np.float64) / factor
            # non-winner rows of new columns are plain Bernoulli entries
            mask = np.ones(col.shape[0], dtype=bool)
            mask[before["winners"][r]] = False
            assert set(np.unique(col[mask])) <= {0.0, 1.0}
        np.testing.assert_allclose(m, np.round(m), atol=1e-4)
        m = np.round(m)
        total_k = sum(stim_sizes[s] for s in stims) + sum(before["winners"][r].size for r in srcs)
        if f:
            alpha = candidate_threshold(brain._n[t] - w0, brain._k[t], total_k, p)
            assert m.min() >= alpha and m.max() <= total_k
        value = np.empty(new.size)
        value[new < w0] = x[new[new < w0]]
        value[new >= w0] = m[new[new >= w0] - w0]
        losers = np.setdiff1d(np.arange(w0), new)
        if exact:
            keys = [(-v, int(lab)) for v, lab in zip(value, new)]
            assert keys == sorted(keys), "cap list not in stable descending order"
            for u in losers:
                beaten = (value > x[u]) | ((value == x[u]) & (new < u))
                assert beaten.all(), f"neuron {u} should have won in {t}"
        else:
            tol = 1e-5 * max(1.0, np.abs(value).max())
            assert np.all(np.diff(value) <= tol)
            if losers.size:
                assert value.min() >= x[losers].max() - tol


def check_hebbian(before, brain, stim_in, area_in, plasticity=True):
    """Old synapses change only from previous winners onto new winners, by 1 + beta."""
    for t in brain._areas:
        w0 = before["support"][t]
        new_old = brain.winners[t][brain.winners[t] < w0]
        for s in brain._stims:
            expected = before["weights"][(s, t)].copy()
            if plasticity and s in stim_in.get(t, []):
                expected[new_old] *= 1.0 + brain.beta(s, t)
            np.testing.assert_array_equal(brain.weights(s, t)[:w0], expected)
        for r in brain._areas:
            expected = before["weights"][(r, t)].copy()
            if plasticity and r in area_in.get(t, []):
                expected[np.ix_(before["winners"][r], new_old)] *= 1.0 + brain.beta(r, t)
            got = brain.weights(r, t)[: before["support"][r], :w0]
            np.testing.assert_array_equal(got, expected)


def two_area_brain(seed=0, p=0.1, beta=None):
    beta = {"A": 0.05, "B": 0.1, ("s2", "B"): 0.2} if beta is None else beta
    return NumpyBrain({"A": (2000, 40), "B": (3000, 50)}, {"s1": 40, "s2": 30}, p, beta, seed)


SCHEDULE = [
    ({"s1": ["A"], "s2": ["B"]}, {}),
    ({"s1": ["A"]}, {"A": ["A", "B"]}),
    ({"s1": ["A"], "s2": ["B"]}, {"A": ["A", "B"], "B": ["A", "B"]}),
    ({}, {"A": ["B"], "B": ["A", "B"]}),
    ({"s2": ["A"]}, {"B": ["A"]}),
]


def as_inputs(stimuli, areas):
    stim_in, area_in = {}, {}
    for s, ts in stimuli.items():
        for t in ts:
            stim_in.setdefault(t, []).append(s)
    for r, ts in areas.items():
        for t in ts:
            area_in.setdefault(t, []).append(r)
    return stim_in, area_in


# --------------------------------------------------------------------------- building blocks


def test_k_cap_ties_to_lower_index():
    inputs = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0])
    np.testing.assert_array_equal(k_cap(inputs, 2), [1, 2])
    np.testing.assert_array_equal(k_cap(inputs, 4), [1, 2, 4, 3])
    np.testing.assert_array_equal(k_cap(inputs, 10), [1, 2, 4, 3, 0, 5])
    rng = np.random.default_rng(3)
    for _ in range(200):
        size = int(rng.integers(1, 60))
        values = rng.integers(0, 6, size).astype(np.float64)  # many ties
        k = int(rng.integers(1, size + 1))
        expected = heapq.nlargest(k, range(size), values.__getitem__)
        np.testing.assert_array_equal(k_cap(values, k), expected)


def test_candidate_threshold_is_the_binomial_quantile():
    for n_eff, k, total_k, p in [
        (99_683, 317, 634, 0.01),
        (100_000, 317, 317, 0.05),
        (5_000, 50, 90, 0.1),
    ]:
        q = (n_eff - k) / n_eff
        cdf, a = 0.0, -1
        while cdf < q * (1 - 1e-12):  # smallest a with P(X <= a) >= q, summed by hand
            a += 1
            cdf += math.comb(total_k, a) * p**a * (1 - p) ** (total_k - a)
        assert candidate_threshold(n_eff, k, total_k, p) == a


def test_candidate_inputs_follow_the_rounded_truncated_normal():
    n_eff, total_k, p = 99_683, 634, 0.01
    alpha = candidate_threshold(n_eff, 317, total_k, p)
    x = sample_candidate_inputs(n_eff, 317, total_k, p, np.random.default_rng(0))
    assert x.shape == (317,) and np.all(x == np.round(x))
    assert x.min() >= alpha and x.max() <= total_k
    # a large sample against the mean of round(mu + sd Z) integrated from the truncnorm cdf
    big = np.concatenate(
        [
            sample_candidate_inputs(n_eff, 317, total_k, p, np.random.default_rng(s))
            for s in range(64)
        ]
    )
    mu, sd = total_k * p, math.sqrt(total_k * p * (1 - p))
    dist = truncnorm((alpha - mu) / sd, (total_k - mu) / sd, loc=mu, scale=sd)
    j = np.arange(int(alpha), total_k + 1)
    prob = dist.cdf(j + 0.5) - dist.cdf(j - 0.5)
    mean = (j * prob).sum()
    sd_round = math.sqrt((j**2 * prob).sum() - mean**2)
    assert abs(big.mean() - mean) < 4 * sd_round / math.sqrt(big.size)


def test_candidate_inputs_point_mass_when_quantile_is_total():
    # P(X = 2) = 0.25 for Bin(2, 0.5): the 0.9-quantile is 2 = total_k
    x = sample_candidate_inputs(10, 1, 2, 0.5, np.random.default_rng(0))
    np.testing.assert_array_equal(x, [2.0])


def test_split_inputs_is_multivariate_hypergeometric():
    rng = np.random.default_rng(1)
    sizes = [30, 50, 20]
    m = np.full(40_000, 25)
    counts = split_inputs(m, sizes, rng)
    np.testing.assert_array_equal(counts.sum(axis=1), m)
    assert counts.min() >= 0 and np.all(counts <= np.array(sizes))
    # mean m K_b / K, variance m (K_b/K)(1 - K_b/K)(K - m)/(K - 1)
    total = sum(sizes)
    for b, size in enumerate(sizes):
        frac = size / total
        var = 25 * frac * (1 - frac) * (total - 25) / (total - 1)
        assert abs(counts[:, b].mean() - 25 * frac) < 4 * math.sqrt(var / m.size)
        assert abs(counts[:, b].var() / var - 1) < 0.05
    np.testing.assert_array_equal(split_inputs(np.array([0, 100]), sizes, rng), [[0, 0, 0], sizes])


# --------------------------------------------------------------------------- one step


def test_first_projection_from_a_stimulus():
    brain = NumpyBrain({"A": (100_000, 317)}, {"stim": 317}, p=0.01, beta=0.05, seed=4)
    brain.project(stimuli={"stim": ["A"]})
    assert brain.support == {"A": 317} and brain.new_winners == {"A": 317}
    np.testing.assert_array_equal(brain.winners["A"], np.arange(317))
    assert brain.winners["A"].dtype == np.int64
    # every winner got all its input from the stimulus, scaled once by 1 + beta
    m = brain.weights("stim", "A") / 1.05
    np.testing.assert_allclose(m, np.round(m), atol=1e-4)
    assert np.round(m).min() >= candidate_threshold(100_000, 317, 317, 0.01)
    assert brain.weights("A", "A").shape == (317, 317)
    assert set(np.unique(brain.weights("A", "A"))) <= {0.0, 1.0}


@pytest.mark.parametrize("beta", [0.0, None])
def test_steps_of_two_areas_follow_the_model(beta):
    exact = beta == 0.0
    brain = two_area_brain(seed=7, beta=beta)
    for stimuli, areas in SCHEDULE:
        before = snapshot(brain, ["s1", "s2"], ["A", "B"])
        brain.project(stimuli=stimuli, areas=areas)
        stim_in, area_in = as_inputs(stimuli, areas)
        check_step(before, brain, stim_in, area_in, p=0.1, exact=exact)
        check_hebbian(before, brain, stim_in, area_in)
    assert brain.support["A"] > 40 and brain.support["B"] > 50


def test_plasticity_false_leaves_weights_unchanged():
    brain = two_area_brain(seed=2)
    for i, (stimuli, areas) in enumerate(SCHEDULE):
        before = snapshot(brain, ["s1", "s2"], ["A", "B"])
        brain.project(stimuli=stimuli, areas=areas, plasticity=i == 0)
        if i:
            stim_in, area_in = as_inputs(stimuli, areas)
            check_step(before, brain, stim_in, area_in, 0.1, exact=False, plasticity=False)
            check_hebbian(before, brain, stim_in, area_in, plasticity=False)
            for t in ["A", "B"]:
                w0 = before["support"][t]
                for s in ["s1", "s2"]:
                    np.testing.assert_array_equal(
                        brain.weights(s, t)[:w0], before["weights"][(s, t)]
                    )


def test_fixed_area_keeps_its_winners_and_learns():
    brain = NumpyBrain({"A": (10_000, 50)}, {"s": 50}, p=0.05, beta=0.1, seed=5)
    brain.project(stimuli={"s": ["A"]})
    brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    brain.fix("A")
    assert brain.fixed == {"A": True}
    kept, w = brain.winners["A"], brain.support["A"]
    before = snapshot(brain, ["s"], ["A"])
    brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    np.testing.assert_array_equal(brain.winners["A"], kept)
    assert brain.support["A"] == w and brain.new_winners["A"] == 0
    check_hebbian(before, brain, {"A": ["s"]}, {"A": ["A"]})
    assert not np.array_equal(brain.weights("A", "A"), before["weights"][("A", "A")])
    brain.unfix("A")
    brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    assert brain.fixed == {"A": False}


def test_set_winners_then_project():
    brain = NumpyBrain({"A": (10_000, 50), "B": (10_000, 50)}, {"s": 50}, p=0.05, seed=1)
    brain.project(stimuli={"s": ["A"]})
    brain.set_winners("A", [3, 1, 4])
    before = snapshot(brain, ["s"], ["A", "B"])
    brain.project(areas={"A": ["B"]})
    check_step(before, brain, {}, {"B": ["A"]}, p=0.05, exact=False)
    check_hebbian(before, brain, {}, {"B": ["A"]})
    np.testing.assert_array_equal(brain.winners["A"], [3, 1, 4])  # A did not update


def test_order_of_dicts_does_not_matter():
    first, second = two_area_brain(seed=11), two_area_brain(seed=11)
    first.project(stimuli={"s1": ["A"], "s2": ["B"]})
    second.project(stimuli={"s2": ["B"], "s1": ["A"]})
    first.project(stimuli={"s1": ["A"], "s2": ["B"]}, areas={"A": ["A", "B"], "B": ["A", "B"]})
    second.project(stimuli={"s2": ["B"], "s1": ["A"]}, areas={"B": ["B", "A"], "A": ["B", "A"]})
    for t in ["A", "B"]:
        np.testing.assert_array_equal(first.winners[t], second.winners[t])
        assert first.support[t] == second.support[t]
        for s in ["s1", "s2", "A", "B"]:
            np.testing.assert_array_equal(first.weights(s, t), second.weights(s, t))


def test_new_synapses_are_bernoulli():
    p = 0.2
    brain = NumpyBrain(
        {"A": (20_000, 200), "B": (20_000, 200)}, {"s": 200, "t": 150}, p=p, beta=0.0, seed=3
    )
    brain.project(stimuli={"s": ["A", "B"]})
    brain.project(stimuli={"s": ["A", "B"]}, areas={"A": ["A"], "B": ["B"]})
    before = snapshot(brain, ["s", "t"], ["A", "B"])
    w0 = before["support"]
    brain.project(stimuli={"s": ["A", "B"]}, areas={"A": ["A", "B"], "B": ["A", "B"]})
    w1 = brain.support
    assert w1["A"] > w0["A"] and w1["B"] > w0["B"] and w0["A"] > 200
    ones = n_entries = 0
    for r in ["A", "B"]:
        for t in ["A", "B"]:
            W = brain.weights(r, t)
            new_rows = W[w0[r] :, :]  # from r's new neurons onto t's whole support
            old_cols = np.delete(W[: w0[r], w0[t] :], before["winners"][r], axis=0)
            for block in (new_rows, old_cols):
                assert set(np.unique(block)) <= {0.0, 1.0}
                ones, n_entries = ones + block.sum(), n_entries + block.size
    assert n_entries > 10**5
    assert abs(ones / n_entries - p) < 5 * math.sqrt(p * (1 - p) / n_entries)
    newnew = brain.weights("A", "B")[w0["A"] :, w0["B"] :]  # both grew in the same step
    assert newnew.size > 1000
    assert abs(newnew.mean() - p) < 5 * math.sqrt(p * (1 - p) / newnew.size)
    # stimulus "t" never fired: Binomial(150, p) weights onto every support neuron
    vec = np.concatenate([brain.weights("t", a) for a in ["A", "B"]])
    assert vec.size == w1["A"] + w1["B"] and np.all(vec == np.round(vec))
    assert abs(vec.mean() - 150 * p) < 5 * math.sqrt(150 * p * (1 - p) / vec.size)
    assert abs(vec.var() / (150 * p * (1 - p)) - 1) < 0.15
    brain.project(stimuli={"t": ["A"]})  # works (the reference code would fail here)
    assert brain.support["A"] >= w1["A"]


def test_beta_resolution():
    brain = two_area_brain()
    assert brain.beta("s1", "A") == 0.05 and brain.beta("B", "A") == 0.05
    assert brain.beta("s1", "B") == 0.1 and brain.beta("s2", "B") == 0.2
    assert NumpyBrain({"A": (100, 5)}, {}, 0.1, beta=0.3).beta("A", "A") == 0.3


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"areas": {}}, "areas must be a non-empty dict"),
        ({"areas": {"A": 100}}, r"areas\['A'\] must be a pair"),
        ({"areas": {"A": (100, 100)}}, r"1 <= k < n, got \(100, 100\)"),
        ({"areas": {"A": (100, 0)}}, "1 <= k < n"),
        ({"areas": {"A": (100.0, 5)}}, "integers"),
        ({"stimuli": {"A": 5}}, "also an area name"),
        ({"stimuli": {"s": 0}}, r"stimuli\['s'\] must be an integer >= 1, got 0"),
        ({"p": 0.0}, r"p must be a number in \(0, 1\), got 0.0"),
        ({"p": 1.0}, r"p must be a number in \(0, 1\)"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"beta": -1.0}, "beta must be a finite number > -1, got -1.0"),
        ({"beta": float("nan")}, "beta must be a finite number"),
        ({"beta": {"C": 0.1}}, "beta key 'C' is not an area"),
        ({"beta": {("x", "A"): 0.1}}, r"beta key \('x', 'A'\) must be \(source, target\)"),
        ({"beta": {3: 0.1}}, "beta keys must be area names or"),
        ({"beta": {("s", "A"): 0.1}}, r"beta has no value for \[\('A', 'A'\)\]"),
        ({"beta": {"A": "big"}}, r"beta\['A'\] must be a finite number"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = {"areas": {"A": (1000, 10)}, "stimuli": {"s": 10}, "p": 0.1, "beta": 0.05, "seed": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        NumpyBrain(**args)


def test_project_and_state_errors():
    brain = NumpyBrain({"A": (1000, 10), "B": (1000, 10)}, {"s": 10}, p=0.1, seed=0)
    with pytest.raises(ValueError, match="area 'A' has no winners to project from"):
        brain.project(areas={"A": ["B"]})
    with pytest.raises(ValueError, match="unknown stimulus 'x'"):
        brain.project(stimuli={"x": ["A"]})
    with pytest.raises(ValueError, match="project: unknown area 'C'"):
        brain.project(stimuli={"s": ["C"]})
    with pytest.raises(ValueError, match=r"must be a list of area names, got 'A' \(write \['A'\]"):
        brain.project(stimuli={"s": "A"})
    with pytest.raises(ValueError, match="lists an area twice"):
        brain.project(stimuli={"s": ["A", "A"]})
    with pytest.raises(ValueError, match="plasticity must be True or False, got 1"):
        brain.project(stimuli={"s": ["A"]}, plasticity=1)
    with pytest.raises(ValueError, match="fix: area 'A' has no winners to fix"):
        brain.fix("A")
    with pytest.raises(ValueError, match="unfix: unknown area 'Z'"):
        brain.unfix("Z")
    assert brain.support == {"A": 0, "B": 0}  # nothing happened
    brain.project(stimuli={"s": ["A"]})
    with pytest.raises(ValueError, match=r"must lie in \[0, support=10\), got min 0 and max 10"):
        brain.set_winners("A", [0, 10])
    with pytest.raises(ValueError, match="must be distinct"):
        brain.set_winners("A", [1, 1])
    with pytest.raises(ValueError, match="1-D sequence of integers"):
        brain.set_winners("A", [0.5])
    brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    assert brain.support["A"] > 11
    with pytest.raises(ValueError, match="cap k=10, got 11 labels"):
        brain.set_winners("A", list(range(11)))
    brain.set_winners("A", [])  # an empty assembly is allowed, but cannot be projected
    with pytest.raises(ValueError, match="area 'A' has no winners to project from"):
        brain.project(areas={"A": ["A"]})
    with pytest.raises(ValueError, match="weights: unknown source 'q'"):
        brain.weights("q", "A")
    with pytest.raises(ValueError, match="run_projection: steps must be an integer >= 1, got 0"):
        run_projection(1000, 10, 0.1, 0.05, 0, 0)


def test_support_exhaustion_error():
    brain = NumpyBrain({"A": (25, 10)}, {"s": 10}, p=0.5, beta=0.0, seed=0)
    brain.project(stimuli={"s": ["A"]})
    for _ in range(20):
        if 25 - brain.support["A"] <= 10:
            break
        brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    w, winners = brain.support["A"], brain.winners["A"]
    assert 25 - w <= 10
    with pytest.raises(ValueError, match=rf"area 'A' has only n - w = {25 - w} never-fired"):
        brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
    assert brain.support["A"] == w
    np.testing.assert_array_equal(brain.winners["A"], winners)
    brain.fix("A")  # a fixed area does not grow, so it can still be projected into
    brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})


# --------------------------------------------------------------------------- published behaviour


@pytest.mark.slow
def test_projection_converges_like_the_reference():
    """n = 1e5, k = 317, p = 0.01, beta = 0.05, 100 steps (REFERENCE.md: 1262 +- 27).

    A loop-by-loop port of the reference step gave 1243 +- 45 (mean +- sd, 60 seeds) and this
    peer 1241 +- 52 (200 seeds), so the band is taken as: mean of 16 seeds within 1262 +-
    3 sqrt(12^2 + 13^2), combining the published mean's error (sd 27, about 5 reruns) with
    ours (sd ~50 / 4).
    """
    k = 317
    finals, settled = [], 0
    for seed in range(16):
        out = run_projection(100_000, k, 0.01, 0.05, 100, seed)
        new, overlap = np.array(out["new_winners"]), np.array(out["overlap_prev"])
        assert new[0] == k and out["support"][0] == k
        assert np.all(new[25:] == 0), f"seed {seed}: new winners after step 25: {new[25:]}"
        # a few seeds settle in a 2-cycle that swaps 1-4 neurons (a loop port of the
        # reference step does the same: 3 of 40 seeds, overlaps 316, 315 and 313)
        assert overlap[-1] >= k - 5
        assert np.all(np.diff(out["support"]) >= 0)
        finals.append(out["support"][-1])
        assert out["winners"].shape == (k,)
        settled += int(overlap[-1] == k)
    assert settled >= 12  # 53 of 60 seeds end with identical consecutive winner sets
    assert abs(np.mean(finals) - 1262) < 3 * math.hypot(12, 13)
    assert 3 * k < min(finals) and max(finals) < 5 * k


@pytest.mark.slow
def test_large_projection_support_settles():
    """The reference repository's test: n = 1e6, k = 1000, p = 0.001, 25 steps, w[-2] == w[-1]."""
    out = run_projection(1_000_000, 1000, 0.001, 0.05, 25, 0)
    assert out["support"][-2] == out["support"][-1]
    assert out["new_winners"][-1] == 0


def test_pattern_completion_recovers_the_assembly():
    k = 317
    brain = NumpyBrain({"A": (100_000, k)}, {"stim": k}, p=0.05, beta=0.05, seed=0)
    brain.project(stimuli={"stim": ["A"]})
    for _ in range(24):
        brain.project(stimuli={"stim": ["A"]}, areas={"A": ["A"]})
    assembly = brain.winners["A"]
    half = np.random.default_rng(1).choice(assembly, k // 2, replace=False)
    brain.set_winners("A", half)
    for _ in range(5):
        brain.project(areas={"A": ["A"]})
    recovered = np.intersect1d(brain.winners["A"], assembly).size
    assert recovered >= 300
