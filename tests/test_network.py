"""Projections, delays, spike sources and networks against plain reference implementations."""

import json
import subprocess
import sys

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ffi_output_shapes

import neurojax as nj
from neurojax.kernels import _build
from neurojax.network import _propagation

DT = 0.1


def _cpu_kernels() -> bool:
    return nj.kernels.mode() == "auto" and _build.library() is not None


@pytest.fixture(params=["kernel", "jax"])
def path(request):
    """Run a test through the compiled CPU kernel and through the pure-JAX event path."""
    if request.param == "kernel" and not _cpu_kernels():
        pytest.skip("the compiled CPU kernel could not be built here")
    with nj.kernels.use("auto" if request.param == "kernel" else "reference"):
        yield request.param


def arrivals_of(net, state, n_steps, proj_index=0):
    """Simulate and return, per step, the weight that reached projection `proj_index`.

    Uses a `Delta` synapse, whose `g` equals the arrivals divided by dt.
    """

    def rec(st, out):
        return st.synapses[proj_index].g * DT

    final, r = nj.simulate(net, state, dt=DT, n_steps=n_steps, record=rec)
    return final, np.asarray(r.values), {k: np.asarray(v) for k, v in r.spikes.items()}


def reference_arrivals(spikes, pre, post, weights, delay_steps, n_post):
    """Plain loop: a spike of step k with delay d arrives in step k + 1 + d."""
    n_steps = spikes.shape[0]
    out = np.zeros((n_steps, n_post))
    for k in range(n_steps):
        for i in np.nonzero(spikes[k])[0]:
            for s in np.nonzero(pre == i)[0]:
                t = k + 1 + delay_steps[s]
                if t < n_steps:
                    out[t, post[s]] += weights[s]
    return out


def poisson_net(conn, rate, *, delay=0.0, method="event", dt=None):
    n_pre, n_post = conn.shape
    sink = nj.LIF(v_th=1e6, v_reset=-1e6)  # never spikes: only the arrivals matter
    proj = nj.Projection("src", "dst", conn, synapse=nj.Delta(), delay=delay, method=method)
    return nj.Network(
        populations={"src": (nj.PoissonSource(rate), n_pre), "dst": (sink, n_post)},
        projections=[proj],
        dt=dt,
    )


def bcoo_arrays(conn):
    idx = np.asarray(conn.indices)
    return idx[:, 0], idx[:, 1], np.asarray(conn.data, np.float64)


@pytest.mark.parametrize("method", ["event", "dense", "bcoo"])
def test_arrivals_match_reference_without_delay(method, path):
    conn = nj.connect.fixed_prob(
        jax.random.key(3), 40, 30, 0.2, weight=nj.connect.uniform(0.1, 1.0), allow_self=True
    )
    net = poisson_net(conn, 300.0, method=method)
    _, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(1)), 200)
    pre, post, w = bcoo_arrays(conn)
    ref = reference_arrivals(spikes["src"], pre, post, w, np.zeros(len(pre), int), 30)
    assert spikes["src"].sum() > 100
    np.testing.assert_allclose(arr, ref, rtol=1e-5, atol=1e-6)


def test_heterogeneous_delays_match_reference(path):
    key = jax.random.key(7)
    conn = nj.connect.fixed_prob(key, 25, 20, 0.3, weight=nj.connect.uniform(0.2, 1.0))
    # Delays on and between grid points, including 0 and a half-way case (0.25 ms -> 3 steps).
    choices = np.array([0.0, 0.1, 0.25, 0.7, 1.0, 2.0])
    delay = np.random.default_rng(0).choice(choices, size=conn.nse)
    net = poisson_net(conn, 400.0, delay=delay, dt=DT)
    assert net.ring_shape[0] == (21, 20)  # 2 ms = 20 steps, plus one slot
    _, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(2)), 300)
    pre, post, w = bcoo_arrays(conn)
    steps = np.floor(delay / DT + 0.5 + 1e-6).astype(int)
    assert sorted(set(steps)) == [0, 1, 3, 7, 10, 20]
    ref = reference_arrivals(spikes["src"], pre, post, w, steps, 20)
    np.testing.assert_allclose(arr, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["event", "dense"])
def test_homogeneous_delay_matches_reference(method, path):
    conn = nj.connect.fixed_prob(jax.random.key(4), 15, 12, 0.4, weight=0.5)
    net = poisson_net(conn, 500.0, delay=1.5, method=method, dt=DT)
    _, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(5)), 150)
    pre, post, w = bcoo_arrays(conn)
    ref = reference_arrivals(spikes["src"], pre, post, w, np.full(len(pre), 15), 12)
    assert ref[:16].sum() == 0 and ref.sum() > 0
    np.testing.assert_allclose(arr, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compaction", ["top_k", "nonzero"])
def test_overflow_beyond_largest_buffer_delivers_every_spike(path, compaction, monkeypatch):
    if compaction == "nonzero":
        monkeypatch.setattr(_propagation, "_TOPK_MAX", 8)
    # 20000 sources that all spike every step: more than the largest spike buffer (16384).
    n_pre, n_post = 20000, 7
    conn = nj.connect.fixed_outdegree(jax.random.key(0), n_pre, n_post, 2, weight=0.001)
    net = poisson_net(conn, 1e4, method="event")  # rate * dt = 1: a spike every step
    assert net.capacity < n_pre  # the default buffer cannot hold a step's spikes
    _, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(0)), 3)
    assert spikes["src"].sum() == 3 * n_pre
    expected = np.asarray(conn.todense()).sum(axis=0)
    np.testing.assert_allclose(arr[1], expected, rtol=1e-5)
    np.testing.assert_allclose(arr[2], expected, rtol=1e-5)


@pytest.mark.parametrize("compaction", ["top_k", "nonzero"])
def test_every_buffer_size_gives_the_same_delivery(path, compaction, monkeypatch):
    if compaction == "nonzero":  # the compaction used above _TOPK_MAX sources
        monkeypatch.setattr(_propagation, "_TOPK_MAX", 8)
    # Rates chosen so that the per-step spike counts overflow the small buffers.
    conn = nj.connect.fixed_prob(jax.random.key(1), 3000, 50, 0.05, weight=0.01)
    dense = np.asarray(conn.todense())
    for rate in (30.0, 800.0, 9000.0):
        runs = []
        for capacity in (16, 256, None):
            net = poisson_net(conn, rate, method="event")
            net = net.with_capacity(capacity)
            final, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(9)), 4)
            expected = spikes["src"][:-1].astype(np.float64) @ dense
            np.testing.assert_allclose(arr[1:], expected, rtol=1e-4, atol=1e-6)
            runs.append(arr)
        # Whatever the buffer (and the reruns it took), the same terms in the same order.
        np.testing.assert_array_equal(runs[0], runs[1])
        np.testing.assert_array_equal(runs[0], runs[2])


def test_capacity_under_jit_raises_naming_populations_and_capacity():
    conn = nj.connect.fixed_prob(jax.random.key(1), 300, 20, 0.1, weight=0.01)
    net = poisson_net(conn, 5000.0, method="event").with_capacity(4)
    state = net.init_state(jax.random.key(0))
    with nj.kernels.use("reference"):
        nj.simulate(net, state, dt=DT, n_steps=5)  # eager: reruns, no error
        final, counts = state, []
        for _ in range(5):  # a hand-written loop: nothing reruns, the state keeps the peak
            final, out = net.step(final, None, DT)
            counts.append(int(out["src"].sum()))
        assert net.needed_capacity(final) == max(counts) > 4
        assert net.fit_capacity(final).capacity >= net.needed_capacity(final)
        with pytest.raises(nj.network.SpikeCapacityError, match=r"'src'.*spike_capacity=\d+"):
            net.check_capacity(final)
        run = jax.jit(lambda s: nj.simulate(net, s, dt=DT, n_steps=5)[0].step)
        with pytest.raises(Exception, match=r"population\(s\) 'src'.*capacity 4"):
            jax.block_until_ready(run(state))
    with pytest.raises(ValueError, match=r"spike_capacity must be None or an int >= 1, got 0"):
        net.with_capacity(0)


def lif_pair_net(method, weight_scale=1.0):
    lif_e = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    lif_i = nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=1.0)
    k = jax.random.split(jax.random.key(11), 3)
    ee = nj.connect.fixed_prob(k[0], 30, 30, 0.2, weight=0.5 * weight_scale)
    ei = nj.connect.fixed_prob(k[1], 30, 10, 0.3, weight=0.05 * weight_scale)
    ie = nj.connect.fixed_prob(k[2], 10, 30, 0.3, weight=0.03 * weight_scale)
    projs = [
        nj.Projection("E", "E", ee, synapse=nj.Exponential(5.0), method=method),
        nj.Projection(
            "E", "I", ei, synapse=nj.Alpha(2.0), output=nj.ConductanceOutput(0.0), method=method
        ),
        nj.Projection(
            "I",
            "E",
            ie,
            synapse=nj.Exponential(10.0),
            output=nj.ConductanceOutput(-80.0),
            method=method,
        ),
    ]
    return nj.Network(
        populations={"E": (lif_e, 30), "I": (lif_i, 10)},
        projections=projs,
        inputs={"E": jnp.linspace(9.0, 13.0, 30), "I": 8.0},
    )


def test_neuron_zero_spiking_alone_is_delivered_once(path, monkeypatch):
    """Compaction padding must never repeat a real spike (regression: nonzero's fill value)."""
    monkeypatch.setattr(_propagation, "_TOPK_MAX", 8)
    conn = nj.connect.from_arrays(np.arange(40), np.zeros(40, int), 1.0, 40, 1)
    net = poisson_net(conn, 0.0, method="event")
    rate = np.zeros(40, np.float32)
    rate[0] = rate[1] = 1e4  # only neurons 0 and 1 spike, every step
    net = net.with_population("src", nj.PoissonSource(jnp.asarray(rate)))
    jax.clear_caches()
    _, arr, spikes = arrivals_of(net, net.init_state(jax.random.key(0)), 3)
    assert spikes["src"][:, 2:].sum() == 0 and spikes["src"][:, :2].all()
    np.testing.assert_allclose(arr[1:, 0], 2.0)


def test_event_dense_and_bcoo_networks_agree(path):
    results = {}
    for method in ("event", "dense", "bcoo"):
        net = lif_pair_net(method)
        state = net.init_state(jax.random.key(0))
        final, rec = nj.simulate(net, state, dt=DT, n_steps=2000)
        results[method] = (final, rec)
    ref_final, ref_rec = results["bcoo"]
    assert ref_rec.spikes["E"].sum() > 50 and ref_rec.spikes["I"].sum() > 10
    for method in ("event", "dense"):
        final, rec = results[method]
        for pop in ("E", "I"):
            np.testing.assert_array_equal(rec.spikes[pop], ref_rec.spikes[pop])
            np.testing.assert_allclose(
                final.populations[pop].v, ref_final.populations[pop].v, atol=1e-4
            )


def test_merged_populations_equal_one_concatenated_population():
    net = lif_pair_net("event")
    assert net.groups == (("E", "I"),)
    # The same network written as one population with per-neuron parameters.
    lif = nj.LIF(
        tau_m=jnp.concatenate([jnp.full(30, 20.0), jnp.full(10, 10.0)]),
        v_rest=-60.0,
        v_reset=-60.0,
        v_th=-50.0,
        t_ref=jnp.concatenate([jnp.full(30, 2.0), jnp.full(10, 1.0)]),
    )
    p = net.projections
    rows = []
    for proj, off_pre, off_post in ((p[0], 0, 0), (p[1], 0, 30), (p[2], 30, 0)):
        c = proj.conn
        idx = np.asarray(c.indices)
        rows.append((idx[:, 0] + off_pre, idx[:, 1] + off_post, np.asarray(c.data)))

    def conn_of(i):
        pre, post, w = rows[i]
        return nj.connect.from_arrays(pre, post, w, 40, 40)

    # Each projection keeps its own kinetics; targets outside it get weight-0 rows only.
    single = nj.Network(
        populations={"all": (lif, 40)},
        projections=[
            nj.Projection("all", "all", conn_of(0), synapse=nj.Exponential(5.0), method="event"),
            nj.Projection(
                "all",
                "all",
                conn_of(1),
                synapse=nj.Alpha(2.0),
                output=nj.ConductanceOutput(0.0),
                method="event",
            ),
            nj.Projection(
                "all",
                "all",
                conn_of(2),
                synapse=nj.Exponential(10.0),
                output=nj.ConductanceOutput(-80.0),
                method="event",
            ),
        ],
        inputs={"all": jnp.concatenate([jnp.linspace(9.0, 13.0, 30), jnp.full(10, 8.0)])},
    )
    s1 = net.init_state()
    s2 = single.init_state()
    _, r1 = nj.simulate(net, s1, dt=DT, n_steps=1500)
    _, r2 = nj.simulate(single, s2, dt=DT, n_steps=1500)
    both = np.concatenate([r1.spikes["E"], r1.spikes["I"]], axis=1)
    assert both.sum() > 50
    np.testing.assert_array_equal(both, r2.spikes["all"])


def test_batch_dimension_equals_separate_trials(path):
    net = lif_pair_net("event")
    batch = net.init_state(jax.random.key(0), batch=3)
    assert batch.populations["E"].v.shape == (3, 30)
    _, rb = nj.simulate(net, batch, dt=DT, n_steps=800)
    for b in range(3):
        one = jax.tree.map(lambda x, b=b: x[b] if x.ndim else x, batch)
        _, r1 = nj.simulate(net, one, dt=DT, n_steps=800)
        np.testing.assert_array_equal(rb.spikes["E"][:, b], r1.spikes["E"])
        np.testing.assert_array_equal(rb.spikes["I"][:, b], r1.spikes["I"])


def test_vmap_of_step_equals_batch_dimension():
    net = lif_pair_net("event")
    batch = net.init_state(jax.random.key(1), batch=2)

    def run(st):
        return nj.simulate(net, st, dt=DT, n_steps=300)[1].spikes["E"]

    per_trial = jax.vmap(run, in_axes=(state_axes(batch),))(batch)
    np.testing.assert_array_equal(np.moveaxis(np.asarray(per_trial), 0, 1), run(batch))


@pytest.mark.parametrize("inner_batch", [(), (3,)])
def test_vmap_over_weights_and_delays_equals_loop(path, inner_batch):
    """`vmap` over per-trial weights (as `nj.parallel.sweep` does), on top of a state batch,
    with per-synapse delays: the kernel takes the vmapped axis as more trials of one call;
    the arrivals equal separate runs exactly."""
    conn = nj.connect.fixed_prob(
        jax.random.key(4), 25, 20, 0.3, weight=nj.connect.uniform(0.2, 1.0)
    )
    delay = np.random.default_rng(1).choice([0.0, 0.1, 0.3, 1.0], size=conn.nse)
    net = poisson_net(conn, 400.0, delay=delay, dt=DT)
    state = net.init_state(jax.random.key(5), batch=inner_batch)
    scales = jnp.array([0.5, 1.0, 2.0, 3.0])

    def scaled(scale):
        return eqx.tree_at(
            lambda m: m.projections[0].weights, net, net.projections[0].weights * scale
        )

    def run(scale, st):
        def rec(s, out):
            return s.synapses[0].g * DT

        return nj.simulate(scaled(scale), st, dt=DT, n_steps=200, record=rec)[1].values

    swept = np.asarray(jax.jit(jax.vmap(run, in_axes=(0, None)))(scales, state))
    # The same with the state vmapped too (every leaf but the shared step count).
    states = jax.tree.map(lambda x: jnp.stack([x] * len(scales)) if x.ndim else x, state)
    both = np.asarray(jax.vmap(run, in_axes=(0, state_axes(states)))(scales, states))
    for i, scale in enumerate(scales):
        one = arrivals_of(scaled(scale), state, 200)[1]
        assert one.sum() > 0
        np.testing.assert_array_equal(swept[i], one)
        np.testing.assert_array_equal(both[i], one)
    if path == "kernel":  # one call for all trials: the ring (4, *inner, D, T)
        shapes = ffi_output_shapes(jax.vmap(run, in_axes=(0, None)), scales, state)
        assert shapes and all(sh[: 1 + len(inner_batch)] == (4, *inner_batch) for sh in shapes)


def state_axes(state):
    """vmap axes for a batched network state: 0 for batched leaves, None for the step count."""
    return jax.tree.map(lambda x: None if x.ndim == 0 else 0, state)


def test_gradients_event_equal_dense(path):
    """The event path's custom JVP differentiates sum_pre s w over every synapse."""

    def loss(drive, method):
        net = eqx.tree_at(lambda n: n.inputs["E"], lif_pair_net(method), drive)
        final, _ = nj.simulate(net, net.init_state(jax.random.key(0)), dt=DT, n_steps=600)
        return jnp.sum(final.populations["I"].v)

    drive = jnp.linspace(9.0, 13.0, 30)
    g_event = jax.grad(loss)(drive, "event")
    g_dense = jax.grad(loss)(drive, "dense")
    assert np.all(np.isfinite(g_event)) and np.abs(g_event).max() > 0
    np.testing.assert_allclose(g_event, g_dense, rtol=2e-3, atol=1e-5)


def test_weight_gradient_event_equals_dense_on_the_synapses():
    def final_v(net):
        st, _ = nj.simulate(net, net.init_state(jax.random.key(0)), dt=DT, n_steps=400)
        return jnp.sum(st.populations["E"].v)

    ev, de = lif_pair_net("event"), lif_pair_net("dense")
    g_ev = jax.grad(lambda w: final_v(eqx.tree_at(lambda n: n.projections[0].weights, ev, w)))(
        ev.projections[0].weights
    )
    g_de = jax.grad(lambda m: final_v(eqx.tree_at(lambda n: n.projections[0].matrix, de, m)))(
        de.projections[0].matrix
    )
    idx = np.asarray(ev.projections[0].conn.indices)
    np.testing.assert_allclose(g_ev, np.asarray(g_de)[idx[:, 0], idx[:, 1]], rtol=2e-3, atol=1e-6)
    assert np.abs(g_ev).max() > 0


def test_gradient_matches_finite_differences_below_threshold():
    """Sub-threshold (smooth) network: d(final v)/d(weight scale) against central differences."""
    jax.config.update("jax_enable_x64", True)
    try:

        def f(scale):
            src = nj.PoissonSource(200.0)
            lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=0.0)
            conn = nj.connect.fixed_prob(jax.random.key(0), 20, 5, 0.5, weight=1.0)
            proj = nj.Projection("s", "n", conn, synapse=nj.Exponential(3.0), method="event")
            net = nj.Network(populations={"s": (src, 20), "n": (lif, 5)}, projections=[proj])
            net = eqx.tree_at(lambda n: n.projections[0].weights, net, proj.weights * scale)
            st, _ = nj.simulate(net, net.init_state(jax.random.key(1)), dt=DT, n_steps=300)
            return jnp.sum(st.populations["n"].v)

        g = jax.grad(f)(1.0)
        h = 1e-4
        fd = (f(1.0 + h) - f(1.0 - h)) / (2 * h)
        assert abs(float(g) - float(fd)) <= 1e-6 * max(1.0, abs(float(fd)))
        assert abs(float(g)) > 1.0
    finally:
        jax.config.update("jax_enable_x64", False)


def test_poisson_source_rate():
    src = nj.PoissonSource(rate=25.0)
    state = src.init_state(2000, key=jax.random.key(0))
    _, rec = nj.simulate(src, state, dt=DT, n_steps=5000)
    counts = np.asarray(rec.spikes).sum(axis=0)
    p = 25.0 * DT * 1e-3
    mean, sd = 5000 * p, np.sqrt(5000 * p * (1 - p) / 2000)
    assert abs(counts.mean() - mean) < 4 * sd
    # Per-neuron counts are binomial: variance n p (1 - p).
    assert abs(counts.var() / (5000 * p * (1 - p)) - 1.0) < 0.15


def test_poisson_source_errors():
    with pytest.raises(ValueError, match="rate"):
        nj.PoissonSource(-1.0)
    with pytest.raises(ValueError, match="key is required"):
        nj.PoissonSource(5.0).init_state(3)
    src = nj.PoissonSource(20000.0)
    with pytest.raises(ValueError, match="rate \\* dt"):
        src.step(src.init_state(3, key=jax.random.key(0)), None, 0.1)


def test_network_validation_messages():
    lif = nj.LIF()
    conn = nj.connect.fixed_prob(jax.random.key(0), 5, 5, 0.5)
    with pytest.raises(ValueError, match="'B' is not a population"):
        nj.Network({"A": (lif, 5)}, [nj.Projection("A", "B", conn)])
    with pytest.raises(ValueError, match="n_post=5 but population 'A' has 6"):
        nj.Network(
            {"A": (lif, 6)},
            [nj.Projection("A", "A", nj.connect.fixed_prob(jax.random.key(0), 6, 5, 0.5))],
        )
    with pytest.raises(ValueError, match="pass dt="):
        nj.Network({"A": (lif, 5)}, [nj.Projection("A", "A", conn, delay=1.0)])
    with pytest.raises(ValueError, match="delay must be finite and >= 0"):
        nj.Projection("A", "A", conn, delay=-0.5)
    with pytest.raises(ValueError, match="one value per synapse"):
        nj.Projection("A", "A", conn, delay=np.ones(conn.nse + 1))
    with pytest.raises(ValueError, match="per-synapse delays need layout='event'"):
        nj.Projection("A", "A", conn, delay=np.arange(conn.nse) * 0.1, method="dense")
    with pytest.raises(TypeError, match="plasticity must be None or nj.STDP"):
        nj.Projection("A", "A", conn, plasticity="stdp")
    with pytest.raises(ValueError, match="one delay for all its synapses"):
        nj.Projection("A", "A", conn, delay=np.arange(conn.nse) * 0.1, plasticity=nj.STDP())
    with pytest.raises(ValueError, match="within the STDP bounds"):
        nj.Projection("A", "A", conn, plasticity=nj.STDP(w_max=0.5))
    with pytest.raises(ValueError, match="plastic weights need layout='event'"):
        nj.Projection("A", "A", conn, plasticity=nj.STDP(), method="dense")
    with pytest.raises(ValueError, match="layout must be one of"):
        nj.Projection("A", "A", conn, method="fast")
    with pytest.raises(ValueError, match="size must be a positive int"):
        nj.Network({"A": (lif, 0)})
    with pytest.raises(ValueError, match="inputs names unknown population"):
        nj.Network({"A": (lif, 5)}, inputs={"Z": 1.0})
    with pytest.raises(ValueError, match="spike source, which takes no input"):
        nj.Network({"S": (nj.PoissonSource(1.0), 5)}, [nj.Projection("S", "S", conn)])
    net = nj.Network({"A": (lif, 5)}, [nj.Projection("A", "A", conn, delay=1.0)], dt=0.1)
    with pytest.raises(ValueError, match="built with dt=0.1"):
        net.step(net.init_state(), None, 0.2)
    with pytest.raises(ValueError, match="ext names 'Q'"):
        net.step(net.init_state(), {"Q": 1.0}, 0.1)
    with pytest.raises(ValueError, match="needs a key"):
        nj.Network({"S": (nj.PoissonSource(1.0), 5)}).init_state()


def test_time_varying_external_input_through_simulate():
    lif = nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1e6)
    net = nj.Network({"A": (lif, 2)})
    drive = np.zeros((50, 2), np.float32)
    drive[10:20] = [1.0, 2.0]
    final, rec = nj.simulate(
        net, net.init_state(), {"A": drive}, dt=DT, record=lambda s, o: s.populations["A"].v
    )
    v = np.asarray(rec.values)
    # Exact integration of a pulse of 10 steps, then free decay for 30 steps.
    expected_peak = np.array([1.0, 2.0]) * (1 - np.exp(-1.0 / 10.0))
    np.testing.assert_allclose(v[19], expected_peak, rtol=1e-5)
    np.testing.assert_allclose(v[49], expected_peak * np.exp(-3.0 / 10.0), rtol=1e-5)


def test_gap_junctions_in_a_network_match_the_dense_coupling():
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=1e6)
    pairs = nj.connect.from_arrays(np.array([0, 1, 0]), np.array([1, 2, 3]), 1.0, 4, 4)
    gap = nj.GapJunction(pairs, g=0.05)
    net = nj.Network(
        {"A": (lif, 4)}, inputs={"A": jnp.array([20.0, 0.0, 0.0, -10.0])}, gap_junctions={"A": gap}
    )
    st, _ = nj.simulate(net, net.init_state(), dt=DT, n_steps=500)
    # Reference: the same linear system stepped with the dense coupling matrix.
    m = np.asarray(gap.dense(), np.float64)
    v = np.full(4, -65.0)
    drive = np.array([20.0, 0.0, 0.0, -10.0])
    for _ in range(500):
        i = drive + m @ v - m.sum(axis=1) * v
        v_inf = -65.0 + i
        v = v_inf + (v - v_inf) * np.exp(-DT / 10.0)
    np.testing.assert_allclose(st.populations["A"].v, v, rtol=1e-4)


def test_network_bytes_per_synapse():
    conn = nj.connect.fixed_indegree(jax.random.key(0), 2000, 2000, 50, weight=0.1)
    proj = nj.Projection("A", "A", conn, method="event")
    net = nj.Network({"A": (nj.LIF(), 2000)}, [proj])
    # int32 post index + float32 weight per synapse, one int32 per neuron for the row pointer.
    assert net.nbytes() == 8 * 100_000 + 4 * 2001


def test_models_coba_cuba_build_and_fire():
    net, state = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100)
    assert net.n_synapses > 0 and state.populations["E"].v.shape == (400,)
    v0 = np.asarray(jnp.concatenate([state.populations["E"].v, state.populations["I"].v]))
    assert abs(v0.mean() + 55.0) < 1.0 and abs(v0.std() - 5.0) < 0.6
    net, state = nj.models.cuba(jax.random.key(0), batch=2)
    v0 = np.asarray(state.populations["E"].v)
    assert v0.shape == (2, 3200) and v0.min() >= -60.0 and v0.max() < -50.0
    with pytest.raises(ValueError, match="p must be a probability"):
        nj.models.coba(p=1.5)
    with pytest.raises(ValueError, match="n_exc must be a positive int"):
        nj.models.cuba(n_exc=0)


def test_izhikevich_lattice_runs_with_gap_junctions():
    net, state = nj.models.izhikevich_lattice(jax.random.key(0), side=12)
    assert "I" in net.gap_junctions
    _, rec = nj.simulate(net, state, dt=0.5, n_steps=400)
    rate_e = float(np.asarray(rec.spikes["E"]).mean()) / 0.5e-3
    assert 1.0 < rate_e < 100.0
    with pytest.raises(ValueError, match="w_inh must be a negative number"):
        nj.models.izhikevich_lattice(w_inh=1.0)


def test_cli_run_coba_json():
    out = subprocess.run(
        [sys.executable, "-m", "neurojax", "run", "coba", "--duration", "50", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    for key in (
        "model",
        "n_neurons",
        "n_synapses",
        "duration_ms",
        "dt_ms",
        "batch",
        "rates_hz",
        "compile_s",
        "run_s",
    ):
        assert key in result
    assert result["model"] == "coba" and result["n_neurons"] == 4000
    assert set(result["rates_hz"]) == {"E", "I"}
    bad = subprocess.run(
        [sys.executable, "-m", "neurojax", "run", "cuba", "--duration", "-3"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--duration" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "neurojax", "run", "coba", "--threads", "-1"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "argument --threads: must be an integer >= 0" in bad.stderr


def test_kernel_and_jax_paths_give_identical_spikes():
    """Both paths add the same terms in the same order: bit-identical COBA over 200 ms."""
    if not _cpu_kernels():
        pytest.skip("the compiled CPU kernel could not be built here")
    net, state = nj.models.coba(jax.random.key(3), n_exc=800, n_inh=200, p=0.05)
    fin_k, rec_k = nj.simulate(net, state, dt=DT, n_steps=2000)
    with nj.kernels.use("reference"):
        fin_j, rec_j = nj.simulate(net, state, dt=DT, n_steps=2000)
    assert rec_k.spikes["E"].sum() > 1000
    for pop in ("E", "I"):
        np.testing.assert_array_equal(rec_k.spikes[pop], rec_j.spikes[pop])
        np.testing.assert_array_equal(fin_k.populations[pop].v, fin_j.populations[pop].v)


def test_kernel_and_jax_paths_give_identical_plastic_weights():
    """COBA with STDP on E->E, E->I and I->E: the compiled and pure-JAX STDP updates agree to
    rounding. E and I are stepped as one group, so the kernel reads the arrivals and the
    postsynaptic spikes out of the group's spike vector at offsets 0 (E) and 400 (I)."""
    if not _cpu_kernels():
        pytest.skip("the compiled CPU kernel could not be built here")
    net, state = nj.models.coba(jax.random.key(4), n_exc=400, n_inh=100, p=0.1)
    ee = net.projections[0]
    for mode in ("additive", "multiplicative"):
        stdp = nj.STDP(a_plus=0.006, a_minus=0.0063, w_max=1.2, mode=mode)
        plastic = [
            nj.Projection(p.pre, p.post, p.conn, synapse=p.synapse, output=p.output, plasticity=r)
            for p, r in zip(net.projections[:3], (stdp, stdp, nj.STDP(w_max=8.0)), strict=True)
        ]
        pnet = nj.Network(
            {"E": (net.populations["E"], 400), "I": (net.populations["I"], 100)},
            [*plastic, net.projections[3]],
            inputs=net.inputs,
        )
        assert pnet.groups == (("E", "I"),)
        v0 = [jnp.stack([state.populations[p].v] * 2) for p in ("E", "I")]
        pstate = eqx.tree_at(
            lambda s: (s.populations["E"].v, s.populations["I"].v), pnet.init_state(batch=2), v0
        )
        fin_k, rec_k = nj.simulate(pnet, pstate, dt=DT, n_steps=1500)
        with nj.kernels.use("reference"):
            fin_j, rec_j = nj.simulate(pnet, pstate, dt=DT, n_steps=1500)
        for i in range(3):
            w_k, w_j = fin_k.plastic[i].weights, fin_j.plastic[i].weights
            moved = float(jnp.abs(w_k - pstate.plastic[i].weights).max())
            assert moved > 1e-3, (i, moved)  # the weights did move
            # Equal up to the last bit of the traces (XLA may fuse decay and increment into
            # one multiply-add, the kernel rounds twice): 1 ulp of the weights at most.
            np.testing.assert_allclose(w_k, w_j, rtol=4e-7, atol=0)
        assert float(jnp.abs(fin_k.plastic[0].weights - ee.weights).max()) > 1e-3
        np.testing.assert_array_equal(rec_k.spikes["E"], rec_j.spikes["E"])
        np.testing.assert_array_equal(rec_k.spikes["I"], rec_j.spikes["I"])


def test_populations_view_and_with_population():
    net = lif_pair_net("event")
    assert net.groups == (("E", "I"),)
    views = net.populations
    np.testing.assert_array_equal(views["E"].tau_m, np.full(30, 20.0))
    np.testing.assert_array_equal(views["I"].tau_m, np.full(10, 10.0))
    np.testing.assert_array_equal(views["I"].t_ref, 1.0)

    def final_v(tau):
        n = net.with_population(
            "I", nj.LIF(tau_m=tau, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=1.0)
        )
        st, _ = nj.simulate(n, n.init_state(), dt=DT, n_steps=50)
        return jnp.sum(st.populations["I"].v)

    # Below threshold for 5 ms: smooth in tau, so autodiff equals finite differences.
    g = jax.grad(final_v)(10.0)
    fd = (final_v(10.05) - final_v(9.95)) / 0.1
    assert abs(float(g) - float(fd)) < 2e-2 * abs(float(fd)) and abs(float(g)) > 0
    swept = jax.vmap(final_v)(jnp.array([5.0, 10.0, 20.0]))
    np.testing.assert_allclose(swept[1], final_v(10.0), rtol=1e-6)
    with pytest.raises(TypeError, match="must have the same type"):
        net.with_population("I", nj.Izhikevich())
    with pytest.raises(KeyError, match="no population 'Z'"):
        net.with_population("Z", nj.LIF())


class _ChargeState(eqx.Module):
    charge: jax.Array


class _Counter(nj.neurons.NeuronModel):
    """A neuron model of this test only whose state has no membrane potential `v`."""

    def init_state(self, shape, *, key=None):
        return _ChargeState(jnp.zeros(shape, jnp.float32))

    def step(self, state, current, dt):
        charge = state.charge + (0.0 if current is None else current) * dt
        spikes = (charge >= 1.0).astype(jnp.float32)
        return _ChargeState(charge * (1.0 - spikes)), spikes


def test_state_fields_the_network_reads_are_checked_at_construction():
    conn = nj.connect.fixed_prob(jax.random.key(0), 5, 4, 0.5, weight=0.5)
    pops = {"src": (nj.PoissonSource(100.0), 5), "C": (_Counter(), 4)}
    cond = nj.Projection("src", "C", conn, output=nj.ConductanceOutput(0.0))
    with pytest.raises(
        ValueError,
        match=r"_Counter: the state \(_ChargeState\) has no field 'v'; projections\[0\] "
        r"\(src -> C, output ConductanceOutput\) of the Network \(population 'C'\) needs it",
    ):
        nj.Network(pops, [cond])
    gap = nj.GapJunction(nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 4, 4))
    with pytest.raises(ValueError, match=r"no field 'v'; gap_junctions\['C'\] of the Network"):
        nj.Network(pops, gap_junctions={"C": gap})
    # Current outputs do not read v: such a model runs in a network.
    net = nj.Network(pops, [nj.Projection("src", "C", conn)], inputs={"C": 2.0})
    _, rec = nj.simulate(net, net.init_state(jax.random.key(1)), dt=DT, n_steps=200)
    assert rec.spikes["C"].sum() > 0
    # Two such populations stepped as one group read their batch shape without v.
    two = nj.Network(
        {**pops, "D": (_Counter(), 3)}, [nj.Projection("src", "C", conn)], inputs={"C": 2.0}
    )
    assert two.groups == (("src",), ("C", "D"))
    _, rec2 = nj.simulate(two, two.init_state(jax.random.key(1), batch=2), dt=DT, n_steps=200)
    assert rec2.spikes["C"].shape == (200, 2, 4) and rec2.spikes["D"].sum() == 0


class _Clock(nj.network.SpikeSource):
    """A spike source of this test only: every source spikes once every `period` steps,
    source `i` first at step `i mod period`."""

    period: int = eqx.field(static=True)

    def init_state(self, shape, *, key=None):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.int32), shape)

    def step(self, state, current=None, dt=0.1):
        return state + 1, (state % self.period == 0).astype(jnp.float32)

    def step_block(self, state, dt, *, size, padded_size, block, axis_name):
        return self.step(state, None, dt)


def test_a_new_spike_source_runs_in_networks_without_other_changes():
    conn = nj.connect.fixed_prob(jax.random.key(2), 7, 30, 0.5, weight=3.0)
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0)
    net = nj.Network(
        {"clock": (_Clock(50), 7), "E": (lif, 30)},
        [nj.Projection("clock", "E", conn, synapse=nj.Exponential(5.0), method="event")],
        inputs={"E": 9.0},
    )
    with pytest.raises(ValueError, match="spike source, which takes no input"):
        nj.Network({"clock": (_Clock(50), 7)}, [nj.Projection("clock", "clock", conn[:, :7])])
    with pytest.raises(ValueError, match="needs a key"):
        net.init_state()
    state = net.init_state(jax.random.key(0))
    _, rec = nj.simulate(net, state, dt=DT, n_steps=500)
    clock = np.asarray(rec.spikes["clock"])
    np.testing.assert_array_equal(clock.sum(axis=0), np.full(7, 10))
    assert np.asarray(rec.spikes["E"]).sum() > 0
    # The sharded network steps each device's block with the source's own step_block.
    sharded = nj.parallel.shard_network(net, jax.make_mesh((1,), ("neurons",)))
    _, got = sharded.run(sharded.shard_state(state), dt=DT, n_steps=500)
    chex.assert_trees_all_equal(sharded.to_host(got.spikes), jax.tree.map(np.asarray, rec.spikes))


# ------------------------------------------------------------------ delays kept in steps


def test_per_synapse_delays_are_kept_as_steps_and_read_in_ms(path):
    """A projection keeps per-synapse delays as whole steps once dt is known (its own `dt`
    or the network's): `delay` reads `steps * dt` in ms; both give the same steps (NumPy
    rounding of the float32 delays as the reference) and the same run, bit for bit."""
    conn = nj.connect.fixed_prob(jax.random.key(11), 30, 20, 0.3, weight=0.7)
    d = np.random.default_rng(3).uniform(0.0, 3.0, conn.nse)
    d[:3] = [0.25, 1.05, 2.95]  # half-way cases round up
    d32 = d.astype(np.float32).astype(np.float64)
    want = np.floor(d32 / DT + 0.5 + 1e-6 * np.maximum(d32 / DT, 1.0)).astype(np.int64)
    order = np.argsort(np.asarray(conn.indices)[:, 0], kind="stable")  # layout order

    plain = nj.Projection("src", "dst", conn, synapse=nj.Delta(), delay=d)
    assert plain.delay_steps is None and plain.delay.dtype == jnp.float32  # dt not known yet
    np.testing.assert_array_equal(np.asarray(plain.delay), d.astype(np.float32)[order])
    own = nj.Projection("src", "dst", conn, synapse=nj.Delta(), delay=d, dt=DT)
    assert own.delay_ms is None and own.delay_steps.dtype == jnp.int8

    runs = []
    for proj in (plain, own):
        net = nj.Network(
            {"src": (nj.PoissonSource(300.0), 30), "dst": (nj.LIF(v_th=1e6), 20)}, [proj], dt=DT
        )
        kept = net.projections[0]
        np.testing.assert_array_equal(np.asarray(kept.delay_steps), want[order])
        assert net.delay_steps[0] is kept.delay_steps
        ms = jax.jit(lambda p: p.delay)(kept)  # a property, under jit too
        np.testing.assert_array_equal(ms, want[order].astype(np.float32) * np.float32(DT))
        assert net.ring_shape[0][0] == want.max() + 1
        runs.append(arrivals_of(net, net.init_state(jax.random.key(5)), 80)[1])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0].sum() > 0


def test_delays_in_steps_of_another_dt_are_refused():
    conn = nj.connect.fixed_prob(jax.random.key(1), 10, 10, 0.5, weight=1.0)
    d = np.linspace(0.1, 1.0, conn.nse)
    proj = nj.Projection("a", "b", conn, delay=d, dt=0.1)
    with pytest.raises(ValueError, match=r"whole steps of dt=0.1 ms but the network's dt is 0.05"):
        nj.Network({"a": (nj.LIF(), 10), "b": (nj.LIF(), 10)}, [proj], dt=0.05)
    with pytest.raises(ValueError, match=r"Projection: dt must be finite and > 0 ms, got -0.1"):
        nj.Projection("a", "b", conn, delay=d, dt=-0.1)
    with pytest.raises(TypeError, match=r"Projection: dt must be a Python number in ms"):
        nj.Projection("a", "b", conn, delay=d, dt="0.1")


def test_projection_layout_keyword_and_its_old_name():
    """`layout=` names the storage; `method=`, its old name, gives the same projection with a
    DeprecationWarning for one release, and both at once are refused."""
    import warnings

    conn = nj.connect.fixed_prob(jax.random.key(0), 30, 40, 0.2, weight=0.5)
    new = nj.Projection("A", "B", conn, layout="event")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = nj.Projection("A", "B", conn, method="event")
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "renamed Projection(layout=...)" in str(caught[0].message)
    assert new.method == old.method == "event"
    for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(old), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(TypeError, match="give the storage as layout= alone"):
        nj.Projection("A", "B", conn, layout="event", method="dense")
