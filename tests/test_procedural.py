"""Procedural connectivity (`nj.connect.procedural`, `nj.network.ProceduralLayout`).

References: the analytic degree distributions of each rule (binomial out- and in-degrees,
multinomial row counts), the stored builders of `nj.connect` (two-sample tests), analytic
moments of the weight and delay distributions, the stored projection built from the
description's own synapses (`stored()`: a network run must deliver exactly the same values),
and finite differences for the gradients.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse
from scipy import stats

import neurojax as nj

proc = nj.connect.procedural
DT = 0.1


def _chi2_pvalue(observed: np.ndarray, pmf: np.ndarray, n: int, min_expected: float = 5.0):
    """Chi-square goodness of fit of integer samples to a pmf over 0..len(pmf)-1, bins
    merged from both tails until each holds `min_expected` expected counts."""
    counts = np.bincount(observed, minlength=len(pmf))[: len(pmf)].astype(float)
    assert counts.sum() == observed.size, "samples outside the pmf's support"
    expected = pmf * n
    obs_bins, exp_bins, o, e = [], [], 0.0, 0.0
    for ci, ei in zip(counts, expected, strict=True):
        o, e = o + ci, e + ei
        if e >= min_expected:
            obs_bins.append(o)
            exp_bins.append(e)
            o = e = 0.0
    obs_bins[-1] += o
    exp_bins[-1] += e
    obs_bins, exp_bins = np.array(obs_bins), np.array(exp_bins)
    exp_bins *= obs_bins.sum() / exp_bins.sum()
    return stats.chisquare(obs_bins, exp_bins).pvalue


def _indices(conn: sparse.BCOO) -> tuple[np.ndarray, np.ndarray]:
    idx = np.asarray(conn.indices)
    return idx[:, 0], idx[:, 1]


# ---------------------------------------------------------------------- statistics


def test_fixed_prob_degrees_match_binomial_and_the_stored_builder():
    n_pre, n_post, p = 3000, 2000, 0.03
    desc = proc.fixed_prob(jax.random.key(0), n_pre, n_post, p)
    pre, post = _indices(desc.to_bcoo())
    assert pre.size == desc.n_synapses
    out_deg = np.bincount(pre, minlength=n_pre)
    in_deg = np.bincount(post, minlength=n_post)
    np.testing.assert_array_equal(out_deg, np.asarray(desc.counts))
    pmf_out = stats.binom.pmf(np.arange(n_post + 1), n_post, p)
    pmf_in = stats.binom.pmf(np.arange(n_pre + 1), n_pre, p)
    assert _chi2_pvalue(out_deg, pmf_out, n_pre) > 1e-3
    assert _chi2_pvalue(in_deg, pmf_in, n_post) > 1e-3
    # No multapse: every (pre, post) pair at most once.
    assert np.unique(pre.astype(np.int64) * n_post + post).size == pre.size
    # Two-sample check against the stored builder's in-degrees.
    stored = nj.connect.fixed_prob(jax.random.key(1), n_pre, n_post, p)
    in_stored = np.bincount(np.asarray(stored.indices)[:, 1], minlength=n_post)
    assert stats.ks_2samp(in_deg, in_stored).pvalue > 1e-3


def test_fixed_prob_without_autapses_and_targets_spread_over_every_post():
    n, p = 500, 0.2
    desc = proc.fixed_prob(jax.random.key(2), n, n, p, allow_self=False)
    pre, post = _indices(desc.to_bcoo())
    assert not np.any(pre == post)
    pmf = stats.binom.pmf(np.arange(n), n - 1, p)
    assert _chi2_pvalue(np.bincount(pre, minlength=n), pmf, n) > 1e-3
    # Targets uniform over the candidates: the pooled post ids fit a uniform.
    counts = np.bincount(post, minlength=n).astype(float)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_fixed_total_counts_are_multinomial_and_targets_uniform():
    n_pre, n_post, total = 800, 600, 60_000
    desc = proc.fixed_total(jax.random.key(3), n_pre, n_post, total, weight=0.25)
    assert desc.n_synapses == total
    pre, post = _indices(desc.to_bcoo())
    assert pre.size == total
    out_deg = np.bincount(pre, minlength=n_pre)
    in_deg = np.bincount(post, minlength=n_post)
    # Each row count is Binomial(total, 1/n_pre); each in-degree Binomial(total, 1/n_post).
    assert _chi2_pvalue(out_deg, stats.binom.pmf(np.arange(400), total, 1 / n_pre), n_pre) > 1e-3
    assert _chi2_pvalue(in_deg, stats.binom.pmf(np.arange(400), total, 1 / n_post), n_post) > 1e-3
    # Multapses occur at the rate of independent draws: sum over rows of C(c, 2) / n_post.
    pairs = pre.astype(np.int64) * n_post + post
    repeats = pairs.size - np.unique(pairs).size
    expected = np.sum(out_deg * (out_deg - 1) / 2) / n_post
    assert abs(repeats - expected) < 5 * np.sqrt(expected)


def test_distance_rule_matches_the_profile_and_the_stored_gaussian_builder():
    pos = nj.connect.grid_positions((30, 30))
    box, sigma, p_max = 30.0, 2.0, 0.6
    desc = proc.distance(jax.random.key(4), pos, pos, p_max, sigma, box=box, allow_self=False)
    pre, post = _indices(desc.to_bcoo())
    assert pre.size == desc.n_synapses
    assert not np.any(pre == post)
    host = np.asarray(pos)
    diff = host[pre] - host[post]
    diff -= box * np.round(diff / box)
    dist = np.sqrt((diff**2).sum(-1))
    # Per distance shell of the lattice: connected fraction against p_max exp(-d^2/2s^2).
    all_d = host[:, None, :] - host[None, :, :]
    all_d -= box * np.round(all_d / box)
    all_dist = np.sqrt((all_d**2).sum(-1))
    for shell in (1.0, 2.0, np.sqrt(8.0), 4.0):
        candidates = np.sum(np.isclose(all_dist, shell))
        hits = np.sum(np.isclose(dist, shell))
        q = p_max * np.exp(-(shell**2) / (2 * sigma**2))
        assert abs(hits - q * candidates) < 5 * np.sqrt(candidates * q * (1 - q)), shell
    stored = nj.connect.gaussian_connect(
        jax.random.key(5), pos, pos, p_max, sigma, periodic=box, allow_self=False
    )
    in_proc = np.bincount(post, minlength=900)
    in_stored = np.bincount(np.asarray(stored.indices)[:, 1], minlength=900)
    assert stats.ks_2samp(in_proc, in_stored).pvalue > 1e-3
    assert abs(pre.size - stored.nse) < 5 * np.sqrt(stored.nse)


def test_weight_and_delay_moments():
    w = nj.connect.normal(0.5, 0.1)
    desc = proc.fixed_prob(
        jax.random.key(6),
        2000,
        1000,
        0.05,
        weight=w,
        delay=nj.connect.normal(1.5, 0.75),
        delay_range=(0.1, 3.0),
        dt=DT,
    )
    conn, delay = desc.stored()
    weights = np.asarray(conn.data, np.float64)
    n = weights.size
    assert abs(weights.mean() - 0.5) < 4 * 0.1 / np.sqrt(n)
    assert abs(weights.std() - 0.1) < 4 * 0.1 / np.sqrt(2 * n)
    # Delays: whole steps, distributed as the normal conditioned on [0.1, 3.0] and rounded.
    steps = np.rint(delay / DT).astype(int)
    np.testing.assert_allclose(steps * DT, delay, atol=1e-12)
    a, b = (0.1 - 1.5) / 0.75, (3.0 - 1.5) / 0.75
    law = stats.truncnorm(a, b, loc=1.5, scale=0.75)
    k = np.arange(0, 31)
    edges = np.clip((k[:, None] + np.array([-0.5, 0.5])) * DT, 0.1, 3.0)
    pmf = law.cdf(edges[:, 1]) - law.cdf(edges[:, 0])
    assert steps.min() >= 1 and steps.max() <= 30 and desc.max_delay_steps == 30
    assert _chi2_pvalue(steps, pmf, n) > 1e-3


# ---------------------------------------------------------------------- delivery


def _pair(desc, n, *, spike_capacity=None, delay=0.0):
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    conn, d = desc.stored()
    kw = dict(inputs={"E": 11.0}, dt=DT, spike_capacity=spike_capacity)
    syn = nj.Exponential(5.0)
    procedural = nj.Network(
        {"E": (lif, n)}, [nj.Projection("E", "E", desc, synapse=syn, delay=delay)], **kw
    )
    stored = nj.Network(
        {"E": (lif, n)},
        [nj.Projection("E", "E", conn, synapse=syn, delay=delay if d is None else d)],
        **kw,
    )
    return procedural, stored


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_network_delivers_exactly_its_stored_conversion(mode):
    n = 200
    desc = proc.fixed_prob(
        jax.random.key(7),
        n,
        n,
        0.08,
        weight=nj.connect.normal(0.9, 0.3),
        delay=nj.connect.uniform(0.0, 2.0),
        dt=DT,
        allow_self=False,
    )
    # A capacity of 4 spikes per step forces a rerun of the pure-JAX path's chunks.
    procedural, stored = _pair(desc, n, spike_capacity=4 if mode == "reference" else None)
    assert procedural.projections[0].method == "procedural"
    state = procedural.init_state(jax.random.key(8))
    with nj.kernels.use(mode):
        a, ra = nj.simulate(procedural, state, dt=DT, n_steps=200, record=("v",), chunk_size=100)
        b, rb = nj.simulate(stored, state, dt=DT, n_steps=200, record=("v",), chunk_size=100)
    assert float(ra.spikes["E"].sum()) > 20
    np.testing.assert_array_equal(np.asarray(ra.spikes["E"]), np.asarray(rb.spikes["E"]))
    np.testing.assert_array_equal(np.asarray(ra.v["E"]), np.asarray(rb.v["E"]))
    if mode == "reference":  # a step over the capacity is reported, never silently dropped
        small = procedural.with_capacity(1)
        step = jax.jit(lambda st: small.step(st, None, DT)[0])
        st = state
        with nj.kernels.use(mode):
            for _ in range(100):
                st = step(st)
        assert small.needed_capacity(st) >= 2
        with pytest.raises(nj.network.SpikeCapacityError, match="spike capacity 1"):
            small.check_capacity(st)


@pytest.mark.slow
def test_fixed_total_and_distance_deliver_their_stored_conversions():
    pos = nj.connect.random_positions(jax.random.key(9), 200, (10.0, 10.0))
    descs = [
        proc.fixed_total(jax.random.key(10), 200, 200, 4000, weight=nj.connect.uniform(0.5, 1.5)),
        proc.distance(
            jax.random.key(11),
            pos,
            pos,
            0.8,
            1.5,
            profile="exponential",
            weight=1.2,
            allow_self=False,
        ),
    ]
    for desc in descs:
        procedural, stored = _pair(desc, 200, delay=0.5)
        state = procedural.init_state(jax.random.key(12))
        _, ra = nj.simulate(procedural, state, dt=DT, n_steps=100)
        _, rb = nj.simulate(stored, state, dt=DT, n_steps=100)
        assert float(ra.spikes["E"].sum()) > 5
        np.testing.assert_array_equal(np.asarray(ra.spikes["E"]), np.asarray(rb.spikes["E"]))


@pytest.mark.slow
def test_product_equals_the_stored_matrix_and_vmap_equals_single_trials():
    desc = proc.fixed_prob(jax.random.key(13), 60, 40, 0.2, weight=nj.connect.lognormal(0.0, 0.5))
    layout = nj.network.ProceduralLayout.from_procedural(desc)
    s = (jax.random.uniform(jax.random.key(14), (3, 60)) < 0.3).astype(jnp.float32)
    dense = np.asarray(desc.to_bcoo().todense(), np.float64)
    np.testing.assert_allclose(np.asarray(layout.product(s)), np.asarray(s) @ dense, rtol=1e-5)
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0)
    net = nj.Network(
        {"A": (lif, 60), "B": (lif, 40)},
        [nj.Projection("A", "B", desc, synapse=nj.Exponential(5.0))],
        inputs={"A": 12.0},
    )
    keys = jax.random.split(jax.random.key(15), 3)
    states = jax.vmap(net.init_state)(keys)
    run = jax.jit(lambda st: nj.simulate(net, st, dt=DT, n_steps=40)[1].spikes["B"])
    batched = jax.vmap(run)(states)
    for t in range(3):
        single = run(jax.tree.map(lambda x, t=t: x[t], states))
        np.testing.assert_array_equal(np.asarray(batched[t]), np.asarray(single))


def test_gradient_wrt_weight_distribution_matches_finite_differences():
    # Poisson sources drive a population that stays below threshold, so its potential is a
    # smooth (linear) function of the weights drawn as mean + std * z.
    n_src, n = 80, 30
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=100.0)
    desc = proc.fixed_prob(
        jax.random.key(16),
        n_src,
        n,
        0.3,
        weight=nj.connect.normal(0.4, 0.2),
        delay=nj.connect.uniform(0.0, 1.0),
        dt=DT,
    )
    net = nj.Network(
        {"S": (nj.PoissonSource(rate=80.0), n_src), "P": (lif, n)},
        [nj.Projection("S", "P", desc, synapse=nj.Exponential(3.0))],
        dt=DT,
    )
    state = net.init_state(jax.random.key(17))

    def loss(mean, std):
        d = eqx.tree_at(lambda c: (c.weight.mean, c.weight.std), desc, (mean, std))
        nt = eqx.tree_at(lambda m: m.projections[0].layout.conn, net, d)
        final, _ = nj.simulate(nt, state, dt=DT, n_steps=150)
        return jnp.sum(final.populations["P"].v + 65.0)

    mean, std = jnp.float32(0.4), jnp.float32(0.2)
    g_mean, g_std = jax.grad(loss, argnums=(0, 1))(mean, std)
    h = 1e-2
    fd_mean = (loss(mean + h, std) - loss(mean - h, std)) / (2 * h)
    fd_std = (loss(mean, std + h) - loss(mean, std - h)) / (2 * h)
    assert float(jnp.abs(g_mean)) > 1.0
    np.testing.assert_allclose(float(g_mean), float(fd_mean), rtol=2e-3)
    np.testing.assert_allclose(float(g_std), float(fd_std), rtol=2e-3, atol=1e-2)


def test_memory_grows_with_neurons_not_synapses():
    small = proc.fixed_prob(jax.random.key(18), 1000, 1000, 0.01)
    dense = proc.fixed_prob(jax.random.key(18), 1000, 1000, 0.5)
    assert small.nbytes() == dense.nbytes() < 4 * 1000 + 64
    proj = nj.Projection("E", "E", dense)
    assert proj.nbytes() == dense.nbytes()
    stored = nj.Projection("E", "E", dense.to_bcoo(), method="event")
    assert stored.nbytes() > 100 * proj.nbytes()


# ---------------------------------------------------------------------- errors


def test_bad_inputs_are_refused_with_clear_messages():
    key = jax.random.key(0)
    desc = proc.fixed_prob(key, 10, 10, 0.5)
    with pytest.raises(ValueError, match="cannot be plastic"):
        nj.Projection("E", "E", desc, plasticity=nj.STDP())
    with pytest.raises(ValueError, match="needs layout='procedural'"):
        nj.Projection("E", "E", desc, method="event")
    with pytest.raises(ValueError, match="needs a procedural description"):
        nj.Projection("E", "E", nj.connect.fixed_prob(key, 10, 10, 0.5), method="procedural")
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1.5"):
        proc.fixed_prob(key, 10, 10, 1.5)
    with pytest.raises(ValueError, match="needs dt="):
        proc.fixed_prob(key, 10, 10, 0.5, delay=nj.connect.uniform(0.0, 1.0))
    with pytest.raises(ValueError, match="pass delay_range"):
        proc.fixed_prob(key, 10, 10, 0.5, delay=nj.connect.normal(1.0, 0.5), dt=DT)
    with pytest.raises(TypeError, match="cannot take per-synapse arrays"):
        proc.fixed_prob(key, 10, 10, 0.5, weight=np.ones(3))
    with pytest.raises(ValueError, match="n_synapses must be a non-negative int, got -1"):
        proc.fixed_total(key, 10, 10, -1)
    with pytest.raises(ValueError, match="profile must be one of"):
        proc.distance(key, np.zeros((3, 2)), np.zeros((3, 2)), 0.5, 1.0, profile="box")
    drawn = proc.fixed_prob(key, 10, 10, 0.5, delay=nj.connect.uniform(0.0, 1.0), dt=DT)
    with pytest.raises(ValueError, match="leave delay at 0"):
        nj.Projection("E", "E", drawn, delay=1.0)
    with pytest.raises(TypeError, match="delay must be a real scalar"):
        nj.Projection("E", "E", desc, delay=np.ones(3))
    lif = nj.LIF()
    net = nj.Network({"E": (lif, 10)}, [nj.Projection("E", "E", drawn)], dt=0.05)
    with pytest.raises(ValueError, match="drawn for dt = 0.1 ms"):
        net.step(net.init_state(), None, 0.05)


_SHARD_SCRIPT = """
import jax, numpy as np, neurojax as nj
from neurojax.parallel import shard_network
n, dt = 203, 0.1
desc = nj.connect.procedural.fixed_prob(
    jax.random.key(0), n, n, 0.08, weight=nj.connect.normal(0.9, 0.3),
    delay=nj.connect.uniform(0.0, 2.0), dt=dt, allow_self=False)
lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
net = nj.Network({"E": (lif, n)}, [nj.Projection("E", "E", desc, synapse=nj.Exponential(5.0))],
                 inputs={"E": 11.0}, dt=dt)
state = net.init_state(jax.random.key(1))
_, want = nj.simulate(net, state, dt=dt, n_steps=200)
sharded = shard_network(net, jax.make_mesh((4,), ("neurons",)))
_, got = sharded.run(sharded.shard_state(state), dt=dt, n_steps=200)
got = np.asarray(got.spikes["E"])[:, :n]
assert want.spikes["E"].sum() > 20
np.testing.assert_array_equal(got, np.asarray(want.spikes["E"]))
print("OK")
"""


@pytest.mark.slow
def test_sharded_procedural_network_equals_the_single_device_run():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", _SHARD_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_procedural_refuses_short_term_and_learnable_delays():
    desc = nj.connect.procedural.fixed_prob(jax.random.key(0), 20, 30, 0.1, weight=0.5)
    with pytest.raises(ValueError, match="procedural projection .* neither short_term"):
        nj.Projection("A", "B", desc, short_term=nj.TsodyksMarkram.preset("depressing"))
    with pytest.raises(ValueError, match="learnable_delays=True"):
        nj.Projection("A", "B", desc, learnable_delays=True)
