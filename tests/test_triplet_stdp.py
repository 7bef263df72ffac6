"""`nj.TripletSTDP` (Pfister and Gerstner 2006): event-driven in a network with a delay, equal
to an independent NumPy loop over spike events (exact exponentials of the spike-time
differences) and to the rule's dense reference; the paper's pairing-frequency and triplet
protocols; `jit`, `vmap` and `grad`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import neurojax as nj
from neurojax.network._plastic import PlasticLayout, plastic_update

DT = 0.1
PULSE = 1e4  # one step of this input takes a forced LIF from rest far above threshold
N_PRE, N_POST = 5, 4


def forced_lif(**kwargs):
    return nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=0.0, **kwargs)


def pulses(spikes):
    return PULSE * np.asarray(spikes, np.dtype(jnp.result_type(float)))


def raster(n_steps, spike_steps):
    out = np.zeros((n_steps, len(spike_steps)), bool)
    for i, steps in enumerate(spike_steps):
        out[np.asarray(steps, int), i] = True
    return out


def shift(spikes, d):
    out = np.zeros_like(spikes)
    out[d:] = spikes[: spikes.shape[0] - d]
    return out


def make_net(rule, conn, n_pre, n_post, delay=0.0, dt=DT, lif=None, inputs=None):
    lif = lif or forced_lif()
    proj = nj.Projection(
        "pre",
        "post",
        conn,
        synapse=nj.Delta(),
        output=nj.ConductanceOutput(0.0),
        delay=delay,
        plasticity=rule,
    )
    return nj.Network({"pre": (lif, n_pre), "post": (lif, n_post)}, [proj], inputs=inputs, dt=dt)


def synapses(proj):
    indptr = np.asarray(proj.indptr)
    return np.repeat(np.arange(proj.n_pre), np.diff(indptr)), np.asarray(proj.indices)


def numpy_triplet(rule, w0, arrivals, post_spikes, pre_idx, post_idx, dt):
    """Independent reference: each synapse's events in time order (an arrival before a
    postsynaptic spike of the same step), traces kept as (value, time of last spike) and
    decayed by exp(-elapsed / tau) at each event, float64. Weights after every step."""
    p = {k: float(getattr(rule, k)) for k in ("a2_plus", "a3_plus", "a2_minus", "a3_minus")}
    tp, tm, tx, ty = (float(getattr(rule, k)) for k in ("tau_plus", "tau_minus", "tau_x", "tau_y"))
    lo, hi = float(rule.w_min), float(rule.w_max)
    nearest = rule.pairing == "nearest"
    n_steps = arrivals.shape[0]
    out = np.tile(np.asarray(w0, np.float64), (n_steps, 1))
    for s, (i, j) in enumerate(zip(pre_idx, post_idx, strict=True)):
        events = [(k, 0) for k in np.flatnonzero(arrivals[:, i])]
        events += [(k, 1) for k in np.flatnonzero(post_spikes[:, j])]
        w = float(w0[s])
        r1 = r2 = o1 = o2 = 0.0
        t_r = t_o = 0.0
        for k, kind in sorted(events):
            t = k * dt
            if kind == 0:
                o1_t = o1 * np.exp(-(t - t_o) / tm)
                r2_t = r2 * np.exp(-(t - t_r) / tx)
                r1_t = r1 * np.exp(-(t - t_r) / tp)
                w = min(max(w - o1_t * (p["a2_minus"] + p["a3_minus"] * r2_t), lo), hi)
                r1, r2 = (1.0, 1.0) if nearest else (r1_t + 1.0, r2_t + 1.0)
                t_r = t
            else:
                r1_t = r1 * np.exp(-(t - t_r) / tp)
                o2_t = o2 * np.exp(-(t - t_o) / ty)
                o1_t = o1 * np.exp(-(t - t_o) / tm)
                w = min(max(w + r1_t * (p["a2_plus"] + p["a3_plus"] * o2_t), lo), hi)
                o1, o2 = (1.0, 1.0) if nearest else (o1_t + 1.0, o2_t + 1.0)
                t_o = t
            out[k:, s] = w
    return out


def dense_trajectory(rule, w0, arrivals, post_spikes, pre_idx, post_idx, dt):
    decays = rule.trace_decays(dt)

    def step(carry, s):
        w, pre, post = carry
        s_arr, s_post = s
        pre = tuple(t * d for t, d in zip(pre, decays[0], strict=True))
        post = tuple(t * d for t, d in zip(post, decays[1], strict=True))
        w = rule.dense_update(w, pre, post, s_arr, s_post, pre_idx, post_idx)
        return (w, rule.update_pre_traces(pre, s_arr), rule.update_post_traces(post, s_post)), w

    z_pre = tuple(jnp.zeros(arrivals.shape[1:], w0.dtype) for _ in range(2))
    z_post = tuple(jnp.zeros(post_spikes.shape[1:], w0.dtype) for _ in range(2))
    return jax.lax.scan(step, (w0, z_pre, z_post), (arrivals, post_spikes))[1]


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("pairing", ["all_to_all", pytest.param("nearest", marks=pytest.mark.slow)])
def test_network_equals_numpy_event_loop_and_dense_reference(pairing):
    n_steps, delay = 3000, 0.3
    d = round(delay / DT)
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        # amplitudes large enough that every term matters; bounds far away
        rule = nj.TripletSTDP(
            a2_plus=0.015, a3_plus=0.02, a2_minus=0.01, a3_minus=0.01, tau_plus=16.8,
            tau_minus=33.7, tau_x=60.0, tau_y=45.0, w_min=-10.0, w_max=10.0, pairing=pairing,
        )  # fmt: skip
        conn = nj.connect.fixed_prob(jr.key(2), N_PRE, N_POST, 0.6, weight=0.5)
        net = make_net(rule, conn, N_PRE, N_POST, delay)
        proj = net.projections[0]
        drive = {
            "pre": pulses(rng.random((n_steps, N_PRE)) < 0.006),
            "post": pulses(rng.random((n_steps, N_POST)) < 0.006),
        }
        state = net.init_state()
        assert isinstance(state.plastic[0], nj.plasticity.TripletSTDPState)
        assert state.plastic[0].r2.shape == (N_PRE,) and state.plastic[0].o2.shape == (N_POST,)
        _, rec = nj.simulate(net, state, drive, dt=DT, record=lambda s, o: s.plastic[0].weights)
        sim = np.asarray(rec.values)
        spikes = {k: np.asarray(v) for k, v in rec.spikes.items()}
        np.testing.assert_array_equal(spikes["post"], drive["post"] > 0)
        arrivals = shift(spikes["pre"], d)
        pre_idx, post_idx = synapses(proj)
        w0 = jnp.asarray(proj.weights)
        dense = np.asarray(
            dense_trajectory(
                rule, w0, jnp.asarray(arrivals, w0.dtype), jnp.asarray(spikes["post"], w0.dtype),
                jnp.asarray(pre_idx), jnp.asarray(post_idx), DT,
            )
        )  # fmt: skip
    ref = numpy_triplet(rule, np.asarray(w0), arrivals, spikes["post"], pre_idx, post_idx, DT)
    assert spikes["pre"].sum() > 50 and spikes["post"].sum() > 50
    steps = np.diff(sim, axis=0)  # both kinds of events acted, many times
    assert (steps > 1e-3).sum() > 20 and (steps < -1e-3).sum() > 20
    # float64: step decays multiply where the loop exponentiates elapsed times, ~1e-15 each
    np.testing.assert_allclose(sim, ref, rtol=0, atol=1e-11)
    np.testing.assert_allclose(sim, dense, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_without_triplet_terms_it_is_pair_stdp():
    """A_3 = 0 leaves pair STDP: the same weights as `nj.STDP` (additive) on one drive."""
    rng = np.random.default_rng(4)
    conn = nj.connect.fixed_prob(jr.key(5), N_PRE, N_POST, 0.7, weight=0.5)
    drive = {
        "pre": pulses(rng.random((800, N_PRE)) < 0.03),
        "post": pulses(rng.random((800, N_POST)) < 0.03),
    }
    kw = dict(tau_plus=15.0, tau_minus=25.0, w_min=0.0, w_max=1.0)
    triplet = nj.TripletSTDP(a2_plus=0.02, a3_plus=0.0, a2_minus=0.025, a3_minus=0.0, **kw)
    pair = nj.STDP(a_plus=0.02, a_minus=0.025, **kw)
    out = []
    for rule in (triplet, pair):
        net = make_net(rule, conn, N_PRE, N_POST, delay=0.2)
        out.append(
            np.asarray(nj.simulate(net, net.init_state(), drive, dt=DT)[0].plastic[0].weights)
        )
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-6)
    assert np.abs(out[0] - 0.5).max() > 0.02


# ---------------------------------------------------------------- the paper's protocols


def protocol_changes(rule, trains, n_steps, dt=1.0):
    """Weight change of one synapse (w0 = 1, bounds far away: the paper's normalised weight)
    under each protocol of `trains` [(pre steps, post steps)], run as one batch of trials."""
    rule = eqx.tree_at(
        lambda r: (r.w_min, r.w_max), rule, (jnp.asarray(-100.0), jnp.asarray(100.0))
    )
    conn = nj.connect.from_arrays([0], [0], 1.0, 1, 1)
    net = make_net(rule, conn, 1, 1, dt=dt)
    pre = np.stack([raster(n_steps, [p])[:, 0] for p, _ in trains], axis=1)[..., None]
    post = np.stack([raster(n_steps, [q])[:, 0] for _, q in trains], axis=1)[..., None]
    state = net.init_state(batch=len(trains))
    final, _ = jax.jit(lambda dr: nj.simulate(net, state, dr, dt=dt))(
        {"pre": pulses(pre), "post": pulses(post)}
    )
    w = np.asarray(final.plastic[0].weights)[:, 0] - 1.0
    refs = [
        numpy_triplet(rule, np.ones(1), raster(n_steps, [p]), raster(n_steps, [q]), [0], [0], dt)
        for p, q in trains
    ]
    return w, np.array([r[-1, 0] - 1.0 for r in refs])


def pairing_trains(rate_hz, lag, n_pairs=60, start=20, dt=1.0):
    period = round(1000.0 / rate_hz / dt)
    pre = start + period * np.arange(n_pairs)
    return pre, pre + round(lag / dt)


def test_pairing_frequency_dependence_visual_cortex():
    """Pfister and Gerstner (2006) Fig. 4 protocol (Sjostrom et al. 2001): 60 pairings,
    post 10 ms after pre (+10) or before it (-10), at 1-50 Hz, visual-cortex all-to-all set.
    The data's shape: pre-post potentiation that grows with the frequency; post-pre
    depression at low frequencies that turns into potentiation at 40-50 Hz, where the two
    orders converge (each post spike lies between two pre spikes). Exact values against the
    NumPy event loop."""
    rates = [1.0, 10.0, 20.0, 40.0, 50.0]
    trains = [pairing_trains(r, lag) for lag in (10.0, -10.0) for r in rates]
    n_steps = max(int(max(p.max(), q.max())) for p, q in trains) + 50
    with jax.enable_x64(True):
        sim, ref = protocol_changes(
            nj.TripletSTDP.preset("visual_cortex_all_to_all"), trains, n_steps
        )
    np.testing.assert_allclose(sim, ref, rtol=1e-9, atol=1e-12)
    plus, minus = sim[: len(rates)], sim[len(rates) :]
    assert np.all(np.diff(plus) > 0)  # LTP grows with the pairing frequency
    assert minus[0] < -0.2 and minus[1] < -0.2  # 1 and 10 Hz post-pre: depression
    assert minus[-1] > 0.2 and minus[-2] > 0  # 40 and 50 Hz post-pre: potentiation
    assert abs(plus[0]) < 0.05  # 1 Hz pre-post: almost nothing (A_2^+ ~ 0)
    assert abs(plus[-1] - minus[-1]) < 0.35 * plus[-1]  # orders converge at 50 Hz
    # the pair rule (A_3 = 0) cannot produce frequency-dependent potentiation of post-pre
    with jax.enable_x64(True):
        pair = nj.TripletSTDP.preset("visual_cortex_all_to_all", a3_plus=0.0, a2_plus=6.5e-3)
        sim_pair, _ = protocol_changes(pair, trains, n_steps)
    assert np.all(sim_pair[len(rates) :] < 0)


# Sjostrom, Turrigiano and Nelson (2001), Neuron 32:1149-1164: synaptic change after 60
# pairings, post 10 ms after pre (+10) or before it (-10), visual cortex; the data that Pfister
# and Gerstner (2006) fit with the visual-cortex sets. Values as tabulated in the VH-Lab
# toolbox, https://github.com/VH-Lab/vhlab-toolbox-matlab/blob/
# c736744c00688633a7be5b8a3d35ff62c59e330f/+vlt/+neuro/+stdp/sjostrom_freq_stdp.m ("Returns
# data from Sjostrom et al. 2001 ... 60 repetitions of pairings"), read as a fractional change
# (0.56 is +56 %; that file's comment is unsure whether the unit is percent, which would make
# every change below 1 % and no plasticity at all). Columns: pairing frequency [Hz], +10 ms
# mean, its SEM, -10 ms mean, its SEM.
SJOSTROM_2001 = np.array(
    [
        [0.1, -0.04, 0.05, -0.29, 0.08],
        [10.0, 0.14, 0.10, -0.41, 0.11],
        [20.0, 0.29, 0.14, -0.34, 0.10],
        [40.0, 0.53, 0.11, 0.56, 0.32],
        [50.0, 0.56, 0.26, 0.75, 0.19],
    ]
)
VISUAL_CORTEX = sorted(n for n in nj.plasticity.TRIPLET_PRESETS if n.startswith("visual"))


def sjostrom_trains():
    rates = SJOSTROM_2001[:, 0]
    trains = [pairing_trains(r, lag) for lag in (10.0, -10.0) for r in rates]
    mean = np.r_[SJOSTROM_2001[:, 1], SJOSTROM_2001[:, 3]]
    sem = np.r_[SJOSTROM_2001[:, 2], SJOSTROM_2001[:, 4]]
    return trains, mean, sem


@pytest.mark.parametrize(
    "name",
    [n if n == "visual_cortex_all_to_all" else pytest.param(n, marks=pytest.mark.slow)
     for n in VISUAL_CORTEX],
)  # fmt: skip
def test_pairing_frequency_dependence_matches_sjostrom_data(name):
    """Each visual-cortex set of Table 4 against the data it was fitted to (`SJOSTROM_2001`):
    60 pairings at 0.1, 10, 20, 40 and 50 Hz, +10 and -10 ms, weight change of a synapse of
    initial weight 1 (the paper's normalised weight). Tolerance from the data's SEM: every one of
    the ten points within 1.5 SEM, and sum(((model - mean) / SEM)^2) below the number of points,
    i.e. the preset lies within the scatter of the experiment. With neurojax's presets the
    largest deviation is 1.3 SEM (`_all_to_all_minimal`, +10 ms at 50 Hz) and the sums are
    2.3-5.3 for 10 points."""
    trains, mean, sem = sjostrom_trains()
    n_steps = max(int(max(p.max(), q.max())) for p, q in trains) + 50
    with jax.enable_x64(True):
        sim, ref = protocol_changes(nj.TripletSTDP.preset(name), trains, n_steps)
    np.testing.assert_allclose(sim, ref, rtol=1e-9, atol=1e-12)
    z = (sim - mean) / sem
    assert np.all(np.abs(z) < 1.5), dict(zip(["+10", "-10"], np.split(np.round(z, 2), 2)))
    assert np.sum(z**2) < z.size


@pytest.mark.parametrize("name", ["hippocampal_all_to_all", "hippocampal_nearest"])
def test_hippocampal_sets_do_not_fit_the_visual_cortex_data(name):
    """The hippocampal sets were fitted to Wang et al. (2005), not to Sjostrom et al. (2001):
    at the latter's frequencies they miss the data by several SEM (their pre-post change does not
    grow with the frequency), so the comparison above discriminates between parameter sets.
    NumPy event loop only (the network equals it, tests above)."""
    trains, mean, sem = sjostrom_trains()
    rule = nj.TripletSTDP.preset(name, w_min=-100.0, w_max=100.0)
    sim = np.empty(len(trains))
    for k, (p, q) in enumerate(trains):
        n_steps = int(max(p.max(), q.max())) + 50
        w = numpy_triplet(
            rule, np.ones(1), raster(n_steps, [p]), raster(n_steps, [q]), [0], [0], 1.0
        )
        sim[k] = w[-1, 0] - 1.0
    z = (sim - mean) / sem
    assert np.max(np.abs(z)) > 2.5
    assert np.sum(z**2) > 3 * z.size


def test_triplet_protocols_hippocampal():
    """Wang et al. (2005) triplets as in Pfister and Gerstner (2006) Fig. 5, hippocampal
    all-to-all set, 60 repetitions at 1 Hz: post-pre-post (5 ms, 5 ms) potentiates strongly
    while pre-post-pre (5, 5) gives little change; a pair rule with the same pair terms
    treats the two nearly alike (the asymmetry is the triplet term's)."""
    onsets = 20 + 1000 * np.arange(60)
    trains = [
        (np.sort(np.r_[onsets, onsets + 10]), onsets + 5),  # pre-post-pre
        (onsets + 5, np.sort(np.r_[onsets, onsets + 10])),  # post-pre-post
    ]
    n_steps = int(onsets[-1]) + 100
    with jax.enable_x64(True):
        rule = nj.TripletSTDP.preset("hippocampal_all_to_all")
        sim, ref = protocol_changes(rule, trains, n_steps)
        pair_rule = eqx.tree_at(
            lambda r: (r.a3_plus, r.a3_minus), rule, (jnp.asarray(0.0), jnp.asarray(0.0))
        )
        pair, _ = protocol_changes(pair_rule, trains, n_steps)
    np.testing.assert_allclose(sim, ref, rtol=1e-9, atol=1e-12)
    pre_post_pre, post_pre_post = sim
    assert post_pre_post > 0.2
    assert abs(pre_post_pre) < 0.5 * post_pre_post
    assert post_pre_post - pre_post_pre > 3 * abs(pair[1] - pair[0])


@pytest.mark.parametrize("name", sorted(nj.plasticity.TRIPLET_PRESETS))
def test_presets_are_the_papers_sets(name):
    rule = nj.TripletSTDP.preset(name)
    assert float(rule.tau_plus) == pytest.approx(16.8) and float(rule.tau_minus) == pytest.approx(
        33.7
    )
    assert rule.pairing == ("nearest" if "nearest" in name else "all_to_all")
    assert float(nj.TripletSTDP.preset(name, w_max=3.0).w_max) == 3.0


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="TripletSTDP: tau_x must be > 0"):
        nj.TripletSTDP(tau_x=0.0)
    with pytest.raises(ValueError, match="TripletSTDP: a3_plus must be >= 0"):
        nj.TripletSTDP(a3_plus=-1.0)
    with pytest.raises(ValueError, match="pairing"):
        nj.TripletSTDP(pairing="nearest_neighbour")
    with pytest.raises(ValueError, match="TripletSTDP.preset: unknown name 'cortex'"):
        nj.TripletSTDP.preset("cortex")


def test_bounds_errors_say_that_preset_takes_overrides():
    """Issue 41: a preset's bounds are the defaults [0, 1]; both errors a user meets with them
    (bounds that contradict, weights outside them) say how to pass others."""
    with pytest.raises(
        ValueError,
        match=r"TripletSTDP.preset\('hippocampal_all_to_all'\): TripletSTDP: w_min must be < "
        r"w_max.*\[2.0, 1.0\].*preset\(name, w_min=\.\.\., w_max=\.\.\.\) takes both",
    ):
        nj.TripletSTDP.preset("hippocampal_all_to_all", w_min=2.0)
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) \['wmax'\].*'w_max'"):
        nj.TripletSTDP.preset("hippocampal_all_to_all", wmax=2.0)
    conn = nj.connect.fixed_prob(jr.key(0), 10, 10, 0.5, weight=2.0)
    rule = nj.TripletSTDP.preset("hippocampal_all_to_all")
    with pytest.raises(
        ValueError,
        match=r"bounds \[w_min, w_max\] = \[0.0, 1.0\], got weights in \[2.0, 2.0\]; .*"
        r"TripletSTDP.preset\(name, w_max=\.\.\.\) \(it takes overrides\)",
    ):
        nj.Projection("A", "B", conn, plasticity=rule)
    proj = nj.Projection(
        "A", "B", conn, plasticity=nj.TripletSTDP.preset("hippocampal_all_to_all", w_max=2.0)
    )
    assert float(proj.plasticity.w_max) == 2.0


# ---------------------------------------------------------------- jit, vmap, grad


def test_vmap_over_parameters_and_trials_equals_single_runs():
    """vmap over `a3_plus` and the drive equals single runs; a batch of trials in the state
    (one shared connectivity, per-trial weights and traces) equals the vmapped run."""
    rng = np.random.default_rng(6)
    conn = nj.connect.fixed_prob(jr.key(2), N_PRE, N_POST, 0.6, weight=0.5)
    rule = nj.TripletSTDP(a2_plus=0.01, a3_plus=0.02, a2_minus=0.012, a3_minus=0.005)
    net = make_net(rule, conn, N_PRE, N_POST, delay=0.2)
    drives = {
        "pre": pulses(rng.random((400, 3, N_PRE)) < 0.03),
        "post": pulses(rng.random((400, 3, N_POST)) < 0.03),
    }
    state = net.init_state()

    @jax.jit
    def final(a3_plus, drive):
        n = eqx.tree_at(lambda n: n.projections[0].plasticity.a3_plus, net, a3_plus)
        return nj.simulate(n, state, drive, dt=DT)[0].plastic[0].weights

    a3 = jnp.full(3, rule.a3_plus).at[0].set(0.0)
    swept = np.asarray(jax.jit(jax.vmap(final, in_axes=(0, 1)))(a3, drives))
    for t in (0, 2):
        one = {k: v[:, t] for k, v in drives.items()}
        np.testing.assert_allclose(swept[t], np.asarray(final(a3[t], one)), rtol=1e-6, atol=1e-7)
    assert np.abs(swept[2] - swept[1]).max() > 1e-3  # own drives
    assert np.abs(swept[0] - swept[1]).max() > 1e-4  # own parameters
    batched, _ = nj.simulate(net, net.init_state(batch=3), drives, dt=DT)
    np.testing.assert_allclose(
        np.asarray(batched.plastic[0].weights[1:]), swept[1:], rtol=1e-6, atol=1e-7
    )
    assert batched.plastic[0].r2.shape == (3, N_PRE)


def central_differences(f, x, rel_step=1e-6):
    out = np.empty(x.size)
    for i in range(x.size):
        h = rel_step * max(1.0, abs(x[i]))
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        out[i] = (float(f(up)) - float(f(down))) / (2 * h)
    return out


@pytest.mark.slow
def test_gradients_match_finite_differences_and_dense_reference():
    n_steps, delay = 250, 0.2
    d = round(delay / DT)
    pre_trains = [[20, 60, 130], [45, 100, 101]]
    post_trains = [[30, 70, 125, 150], [50, 52, 60, 140]]
    names = (
        "a2_plus",
        "a3_plus",
        "a2_minus",
        "a3_minus",
        "tau_plus",
        "tau_minus",
        "tau_x",
        "tau_y",
    )
    with jax.enable_x64(True):
        rule = nj.TripletSTDP(
            a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01, tau_x=50.0, tau_y=40.0,
            w_min=-5.0, w_max=5.0,
        )  # fmt: skip
        conn = nj.connect.from_arrays([0, 0, 1, 1], [0, 1, 0, 1], 0.5, 2, 2)
        lif = forced_lif(surrogate=nj.surrogate.Triangular(width=0.5))
        net = make_net(rule, conn, 2, 2, delay, lif=lif, inputs={"pre": jnp.full(2, 0.2)})
        state = net.init_state()
        pre_spikes, post_spikes = raster(n_steps, pre_trains), raster(n_steps, post_trains)
        drive = {"pre": pulses(pre_spikes), "post": pulses(post_spikes)}
        theta = {n: getattr(rule, n) for n in names}
        theta["w0"] = jnp.array([0.3, 0.5, 0.6, 0.4])
        theta["current"] = net.inputs["pre"]
        flat, unravel = ravel_pytree(theta)
        c = jnp.array([1.0, -2.0, 0.5, 1.5])

        def rule_of(t):
            return nj.TripletSTDP(**{n: t[n] for n in names}, w_min=-5.0, w_max=5.0)

        @jax.jit
        def loss(v):
            t = unravel(v)
            n = eqx.tree_at(lambda n: n.projections[0].plasticity, net, rule_of(t))
            n = eqx.tree_at(lambda n: n.inputs["pre"], n, t["current"])
            s = eqx.tree_at(lambda s: s.plastic[0].weights, state, t["w0"])
            w = nj.simulate(n, s, drive, dt=DT)[0].plastic[0].weights
            return jnp.sum(c * w) + jnp.sum(w**2)

        pre_idx, post_idx = synapses(net.projections[0])
        arrivals = jnp.asarray(shift(pre_spikes, d), flat.dtype)

        @jax.jit
        def loss_dense(v):
            t = unravel(v)
            w = dense_trajectory(
                rule_of(t), t["w0"], arrivals, jnp.asarray(post_spikes, flat.dtype),
                jnp.asarray(pre_idx), jnp.asarray(post_idx), DT,
            )[-1]  # fmt: skip
            return jnp.sum(c * w) + jnp.sum(w**2)

        grad = np.asarray(jax.grad(loss)(flat))
        grad_dense = np.asarray(jax.grad(loss_dense)(flat))
        fd = central_differences(loss, np.asarray(flat))
        assert float(loss(flat)) == pytest.approx(float(loss_dense(flat)), abs=1e-12)
    named = unravel(jnp.asarray(grad))
    for name in (*names, "w0"):
        assert np.all(np.asarray(named[name]) != 0), name
    # forced spikes cannot move (triangular surrogate, no slope at rest or in a pulse)
    assert np.all(np.asarray(named["current"]) == 0)
    np.testing.assert_allclose(grad, grad_dense, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
def test_gradient_with_respect_to_spikes_is_the_dense_references():
    """The event path's derivative with respect to the spike values (what surrogate
    gradients flow through) equals the dense reference's and central differences."""
    rng = np.random.default_rng(8)
    n_pre, n_post = 6, 5
    mask = rng.random((n_pre, n_post)) < 0.6
    pre_of, post_of = np.nonzero(mask)
    order = np.argsort(post_of, kind="stable")
    lay = PlasticLayout(
        jnp.asarray(np.r_[0, np.cumsum(mask.sum(1))], jnp.int32),
        jnp.asarray(post_of, jnp.int32),
        jnp.asarray(np.r_[0, np.cumsum(mask.sum(0))], jnp.int32),
        jnp.asarray(order, jnp.int32),
        jnp.asarray(pre_of[order], jnp.int32),
    )
    sizes = (n_pre, n_post, int(mask.sum(1).max()), int(mask.sum(0).max()))
    with jax.enable_x64(True):
        rule = nj.TripletSTDP(
            a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01, w_min=-9.0, w_max=9.0
        )
        f64 = jnp.float64
        w = jnp.asarray(rng.uniform(0.2, 0.8, int(mask.sum())), f64)
        pre = tuple(jnp.asarray(rng.uniform(0, 2, n_pre), f64) for _ in range(2))
        post = tuple(jnp.asarray(rng.uniform(0, 2, n_post), f64) for _ in range(2))
        decays = tuple(tuple(jnp.asarray(x, f64) for x in dd) for dd in rule.trace_decays(DT))
        # spike values away from 0, where the event path's primal is smooth (a value at 0 is
        # skipped, one above it is not); the surrogate gradient reaches spikes there
        s = jnp.asarray(rng.uniform(0.3, 1.2, n_pre + n_post), f64)
        cw = jnp.asarray(rng.normal(size=w.shape), f64)

        @jax.jit
        def loss(s):
            out = plastic_update(rule, lay, sizes, w, pre, post, s[:n_pre], s[n_pre:], *decays)
            return jnp.sum(cw * out[0]) + sum(jnp.sum(t**2) for t in out[1] + out[2])

        def loss_dense(s):
            p = tuple(t * d for t, d in zip(pre, decays[0]))
            q = tuple(t * d for t, d in zip(post, decays[1]))
            pre_idx = jnp.asarray(pre_of, jnp.int32)
            w_new = rule.dense_update(w, p, q, s[:n_pre], s[n_pre:], pre_idx, lay.indices)
            traces = rule.update_pre_traces(p, s[:n_pre]) + rule.update_post_traces(q, s[n_pre:])
            return jnp.sum(cw * w_new) + sum(jnp.sum(t**2) for t in traces)

        g = np.asarray(jax.grad(loss)(s))
        np.testing.assert_allclose(float(loss(s)), float(loss_dense(s)), rtol=1e-13)
        np.testing.assert_allclose(g, np.asarray(jax.grad(loss_dense)(s)), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(
            g, central_differences(loss, np.asarray(s)), rtol=1e-6, atol=1e-8
        )
    assert np.all(g != 0)
