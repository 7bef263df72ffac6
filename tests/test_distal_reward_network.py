"""The distal reward experiment of Izhikevich (2007), Fig. 1, in a network of 1000 Izhikevich
neurons (`benchmarks/examples/distal_reward.py`): the reward bookkeeping against NumPy loops over the
recorded spikes (fast), and the paper's outcome over an hour of model time (slow)."""

import numpy as np
import pytest

from benchmarks.examples import distal_reward as dr


def test_rewards_follow_the_pairings_of_the_chosen_synapse():
    """Four seconds with extra drive on the chosen synapse's neurons: a reward is scheduled
    1001..3000 ms after exactly those spikes of `n2` that come 1..20 ms after an arrival of a
    spike of `n1` through the synapse (a loop over all recorded spike pairs), and the dopamine
    of every chunk is the tonic level plus a jump of 0.5 per reward decaying with 200 ms (a
    step-by-step recursion over the whole run)."""
    seconds = 4
    exp = dr.build(seed=1, max_delay=4)  # delays 1..4 ms: 4 plastic projections to compile
    runner = dr.make_runner(exp)
    state = dr.init_state(exp)
    rng = np.random.default_rng(3)
    spikes, fed = [], []
    for sec in range(seconds):
        extra = np.zeros((dr.CHUNK, dr.N), np.float32)
        t1 = np.arange(10, dr.CHUNK, 70)
        extra[t1, exp.n1] = 150.0  # n1 fires on (or just after) these steps
        t2 = np.minimum(t1 + exp.delay + rng.integers(-5, 35, t1.size), dr.CHUNK - 1)
        extra[t2, exp.n2] = 150.0  # n2 at lags around the coincidence window
        state, s, d = dr.run_chunk(exp, runner, state, sec, extra)
        spikes.append(s)
        fed.append(d)
    spikes, fed = np.concatenate(spikes), np.concatenate(fed)
    pre = np.flatnonzero(spikes[:, exp.n1])
    post = np.flatnonzero(spikes[:, exp.n2])
    expected = [int(k) for k in post if any(1 <= k - (p + exp.delay) <= dr.INTERVAL for p in pre)]
    assert len(pre) > 40 and len(post) > 40
    assert exp.delay >= 2  # the chosen synapse has a delay of several steps
    assert 10 < len(expected) < len(post)  # rewarded and unrewarded spikes of n2
    assert exp.earned == expected
    lateness = np.array(exp.rewards) - np.array(exp.earned)
    assert lateness.min() >= 1001 and lateness.max() <= 3000
    # the dopamine, step by step over the whole run
    decay = np.exp(-1.0 / dr.TAU_D)
    da, ref = 0.0, np.empty(seconds * dr.CHUNK)
    jumps = np.bincount([r for r in exp.rewards if r < ref.size], minlength=ref.size)
    for t in range(ref.size):
        da = da * decay + dr.DA_JUMP * jumps[t]
        ref[t] = (dr.DA_TONIC + da) * dr.DA_SCALE
    assert jumps.sum() > 3
    np.testing.assert_allclose(fed, ref, rtol=2e-6)
    # a chunk never waits on a reward earned during it: every reward is at least a chunk late
    assert all(r // dr.CHUNK > k // dr.CHUNK for k, r in zip(exp.earned, exp.rewards))


def test_earned_rewards_carries_the_last_arrival_across_chunks():
    """An arrival from the previous chunk (`last_arrival`) counts; a spike of `n2` on the
    arrival step or more than 20 steps later does not."""
    got = dr.earned_rewards([], [1000, 1005, 1021, 1030], 3, last_arrival=1000.0)
    np.testing.assert_array_equal(got, [1005])
    got = dr.earned_rewards([1010], [1012, 1013, 1033, 1034], 3, last_arrival=-np.inf)
    np.testing.assert_array_equal(got, [1033])
    assert dr.earned_rewards([5], [], 1, -np.inf).size == 0


@pytest.mark.slow
def test_the_rewarded_synapse_grows_to_the_maximum_in_the_network():
    """The paper's Fig. 1 over 30 minutes of model time (seed 0, the author's noise input,
    `nj.Izhikevich(method="spnet")`; about 18 minutes of wall time on 2 shared cores): the
    rewarded synapse, started at 0, reaches 0.9 of the maximum weight (at 546 s), stays there
    most of the time after (93 %; mean 3.96 over the last 10 minutes, 3.48 at the last
    second) and well above the 95th percentile of the other 79 999 excitatory weights, whose
    median and mean stay low (0.40, 0.77), with 112 rewards and the paper's low rates (1.33
    Hz excitatory, 0.86 Hz inhibitory). Unlike the paper's text, the others are not all low:
    2.7 % of them also end above 0.9 of the maximum. The author's program does the same (a
    NumPy reading of daspnet.m, benchmarks/RESULTS.md, "Distal reward": 0.7-2.4 % above 3.6
    at 1800 s in two readings, 99th percentile 3.39-3.99), so the 99th percentile is not
    asserted and the fraction near the maximum may be at most the program's larger one plus
    1.6 points."""
    res = dr.run(1800, seed=0, every=60, verbose=False)
    chosen, others, rate = res["chosen"], res["others"], res["rate"]
    assert chosen[0] < 0.1
    first = int(np.argmax(chosen >= 0.9 * dr.W_MAX))
    assert chosen[first] >= 0.9 * dr.W_MAX and first < 1200
    assert np.mean(chosen[first:] >= 0.9 * dr.W_MAX) > 0.8
    late = chosen[-600:].mean()
    assert late >= 0.9 * dr.W_MAX
    assert np.median(others[-1]) < 0.15 * dr.W_MAX
    assert others[-1].mean() < 0.25 * dr.W_MAX
    assert late > np.quantile(others[-1], 0.95) + 0.5
    assert np.mean(others[-1] > 0.9 * dr.W_MAX) < 0.024 + 0.016
    assert len(res["rewards"]) > 60
    assert 1.0 < rate[:, 0].mean() < 2.0 and 0.5 < rate[:, 1].mean() < 1.5


def test_the_network_matches_a_numpy_reading_of_the_authors_program():
    """neurojax's network against `benchmarks/peers/daspnet_numpy.py` (a NumPy re-reading of
    daspnet.m): all delays 1 ms, which acts one step later than the program's (`shift=1`),
    `v` in the program's two 0.5 ms halves (`nj.Izhikevich(method="spnet")`, `halves=2`),
    repeated targets summed; the same connectivity, input and initial state. The spike trains
    are identical (neurojax dates a spike one step earlier) for at least the first 1000 ms,
    until float32 rounding sends them apart (near 1840 ms with this seed), and the spike
    counts of 2 s agree within 1 % (2437 against 2436). With one 1 ms step of `v`
    (`method="published"`) they part near 650 ms and the network fires 12 % more."""
    from benchmarks.peers.daspnet_numpy import Daspnet

    exp = dr.build(seed=2, max_delay=1)
    ref = Daspnet(seed=2, delays=1, duplicates="sum", halves=2, shift=1)
    assert (ref.n1, ref.n2) == (exp.n1, exp.n2)
    x = (13.0 * (np.random.default_rng(5).random((2000, dr.N)) - 0.5)).astype(np.float32)
    runner, state, got = dr.make_runner(exp), dr.init_state(exp), []
    for sec in range(2):
        chunk = {
            "N": x[sec * 1000 : (sec + 1) * 1000],
            "dopamine": dr.dopamine([], sec * 1000, 1000),
        }
        state, rec = runner(state, chunk)
        got.append(np.asarray(rec.spikes["N"]))
    got = np.concatenate(got)
    want = ref.run(2000, x.astype(np.float64))
    same = (got[:-1] == want[1:]).all(axis=1)
    first_diff = int(np.argmin(same)) if not same.all() else same.size
    assert got[:1000].sum() > 500  # the early trains are not empty
    assert first_diff >= 1000
    assert abs(got.sum() - want.sum()) <= 0.01 * want.sum()
