"""The whole-network GPU kernel (`network_run`: one Pallas Triton program per trial runs every
step of a network that fits), on the CPU in Pallas interpret mode against the per-step path
(`nj.simulate` scanning `Network.step` with the CPU kernels), and lowered for CUDA without a
device.

Tolerance: interpret mode runs the kernel body's XLA operations (the models' own `step`,
the kinetics, the outputs) in the per-step path's order, and adds a step's arrivals in
synapse order as the per-step path does, so spikes must be equal and voltages equal to
rounding (1e-6 relative; on a GPU the atomics add in no fixed order). Poisson sources draw
from the kernel's own counter-based generator: their trains are compared by their
statistics, not draw by draw."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _pallas_network
from neurojax.network import _network_run

TRITON = "__gpu$xla.gpu.triton"


def _net(
    n_e=80, n_i=20, *, delay=0.3, per_synapse=False, model_i="izhikevich", drive=13.0, stp=False
):
    """A small E/I network: LIF excitatory and Izhikevich (or AdEx) inhibitory neurons;
    exponential, alpha and delta kinetics; conductance and current outputs; delays; with
    `stp`, Tsodyks-Markram depression on E->E and facilitation on I->E."""
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=5.0)
    inh = nj.Izhikevich() if model_i == "izhikevich" else nj.AdEx()
    drive_i = 12.0 if model_i == "izhikevich" else 0.9
    k = jax.random.split(jax.random.key(1), 4)
    rng = np.random.default_rng(3)

    def proj(pre, post, npre, npost, kk, w, syn, out, short_term=None):
        conn = nj.connect.fixed_prob(kk, npre, npost, 0.1, weight=w)
        d = delay
        if per_synapse:  # 0 to 0.5 ms in whole steps of 0.1 ms
            d = jnp.asarray(rng.integers(0, 6, conn.nse) * 0.1, jnp.float32)
        return nj.Projection(
            pre,
            post,
            conn,
            synapse=syn,
            output=out,
            layout="event",
            delay=d,
            short_term=short_term if stp else None,
        )

    depress = nj.TsodyksMarkram(u=0.5, tau_rec=20.0)
    facilitate = nj.TsodyksMarkram(u=0.1, tau_rec=5.0, tau_facil=30.0)
    e_exc, e_inh = nj.ConductanceOutput(0.0), nj.ConductanceOutput(-80.0)
    projs = [
        proj("E", "E", n_e, n_e, k[0], 1.2, nj.Exponential(5.0), e_exc, depress),
        proj("E", "I", n_e, n_i, k[1], 0.6, nj.Alpha(3.0), e_exc),
        proj("I", "E", n_i, n_e, k[2], 6.7, nj.Exponential(10.0), e_inh, facilitate),
        proj("I", "I", n_i, n_i, k[3], -2.0, nj.Delta(), nj.CurrentOutput()),
    ]
    return nj.Network(
        {"E": (lif, n_e), "I": (inh, n_i)},
        projs,
        inputs={"E": drive, "I": drive_i},
        dt=0.1,
    )


def _both(fn):
    """`fn()` on the per-step path (the CPU's default) and with the GPU slot interpreted."""
    want = fn()
    with nj.kernels.interpret("gpu"):
        got = fn()
    return got, want


def _assert_same(got, want, fields=("v",), rtol=1e-6):
    (g_state, g_rec), (w_state, w_rec) = got, want
    for name in w_rec.spikes:
        np.testing.assert_array_equal(
            np.asarray(g_rec.spikes[name]), np.asarray(w_rec.spikes[name]), err_msg=name
        )
    for field in fields:
        for name, x in w_rec.values.get(field, {}).items():
            np.testing.assert_allclose(
                np.asarray(g_rec.values[field][name]), np.asarray(x), rtol=rtol, atol=1e-5
            )
    for g, w in zip(jax.tree.leaves(g_state), jax.tree.leaves(w_state), strict=True):
        if jnp.issubdtype(g.dtype, jax.dtypes.prng_key):
            continue
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=1e-5)


def _pallas_calls(fn, *args):
    with nj.kernels.interpret("gpu"):
        return str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize(
    "model_i, per_synapse, record_every, stp",
    [
        ("izhikevich", False, 1, False),
        ("adex", True, 1, False),
        ("izhikevich", True, 4, False),
        ("izhikevich", True, 1, True),
    ],
)
def test_simulate_runs_the_network_in_one_kernel(model_i, per_synapse, record_every, stp):
    """`nj.simulate` of a network that fits takes `network_run` (one `pallas_call`, no scan
    around it) and gives the per-step path's spikes (raster or counts), recorded voltages
    and final state: LIF, Izhikevich and AdEx; exponential, alpha and delta kinetics;
    conductance and current outputs; homogeneous and per-synapse delays; Tsodyks-Markram
    short-term depression and facilitation (the releases delivered in place of the spikes,
    the short-term state `u, r, last` carried in the kernel)."""
    net = _net(model_i=model_i, per_synapse=per_synapse, stp=stp)
    state = net.init_state(jax.random.key(0))
    assert net.explain_run(state, dt=0.1, n_steps=120)["cuda"].startswith("network_run")

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=120, record=("v",), record_every=record_every)

    got, want = _both(lambda: jax.jit(run)(state))
    # AdEx's exponential term (exp((v - v_T) / delta_T)) amplifies a last-bit difference of
    # an input sum over 120 steps to ~1e-4 mV near threshold; the others stay at rounding.
    _assert_same(got, want, rtol=1e-3 if model_i == "adex" else 1e-6)
    spikes = {k: int(np.asarray(v).sum()) for k, v in want[1].spikes.items()}
    assert spikes["E"] > 5 and spikes["I"] > 5, spikes  # both populations fire
    jaxpr = _pallas_calls(run, state)
    assert jaxpr.count("pallas_call") == 1
    assert "while" not in jaxpr.split("pallas_call")[0]  # no loop of steps around the kernel


def test_small_coba_equals_the_cpu_kernels_spike_counts():
    """The bar: COBA (here 400 neurons, the benchmark's model and parameters) under
    `nj.kernels.interpret("gpu")` equals the CPU kernel's spike counts, step by step."""
    net, state = nj.models.coba(jax.random.key(2), n_exc=320, n_inh=80, p=0.05, method="event")

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=150)

    got, want = _both(lambda: jax.jit(run)(state))
    _assert_same(got, want, fields=())
    assert int(np.asarray(want[1].spikes["E"]).sum()) > 0


def test_a_burst_takes_more_tiles_never_a_rerun():
    """Every neuron fires in the same step (a burst far above any capacity) onto a dense
    fan-out: the kernel delivers every spike, as the per-step path does."""
    n = 300
    lif = nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-70.0, v_th=-50.0, t_ref=2.0)
    conn = nj.connect.fixed_prob(jax.random.key(4), n, n, 0.5, weight=0.05)
    net = nj.Network(
        {"E": (lif, n)},
        [nj.Projection("E", "E", conn, synapse=nj.Exponential(2.0), layout="event", delay=0.2)],
        inputs={"E": 0.5},
        dt=0.1,
    )
    state = eqx.tree_at(
        lambda s: s.populations["E"].v, net.init_state(), jnp.full((n,), -40.0, jnp.float32)
    )

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=30, record=("v",))

    got, want = _both(lambda: jax.jit(run)(state))
    _assert_same(got, want)
    assert int(np.asarray(want[1].spikes["E"][0]).sum()) == n  # the whole population at once


def test_batch_and_time_series_inputs():
    """A `batch=(3,)` state is the kernel's trial axis (one launch), with a constant input
    per trial and a time series shared by the trials, as on the per-step path."""
    net = _net()
    state = net.init_state(jax.random.key(5), batch=(3,))
    n_steps = 80
    series = {"E": jnp.linspace(0.0, 4.0, n_steps)[:, None] * jnp.ones((1, 80))}

    def run(st):
        return nj.simulate(net, st, series, dt=0.1, n_steps=n_steps, record=("v",))

    got, want = _both(lambda: jax.jit(run)(state))
    _assert_same(got, want)
    counts = np.asarray(want[1].spikes["E"]).sum(axis=(0, 2))
    assert len(set(counts.tolist())) > 1  # the trials differ
    assert _pallas_calls(run, state).count("pallas_call") == 1

    const = {"E": jnp.asarray([[0.0], [2.0], [4.0]]) * jnp.ones((3, 80))}

    def run_const(st):
        return nj.simulate(net, st, const, dt=0.1, n_steps=40)

    got, want = _both(lambda: jax.jit(run_const)(state))
    _assert_same(got, want, fields=())


def test_a_run_in_chunks_is_the_run_in_one():
    """`simulate(..., chunk_size=...)` hands the kernel's state (rings, synapses, step
    counter, Poisson counters) from chunk to chunk: the same spikes as one call."""
    net = _net()
    state = net.init_state(jax.random.key(9))
    with nj.kernels.interpret("gpu"):
        _, whole = nj.simulate(net, state, dt=0.1, n_steps=90, record=("v",))
        _, chunked = nj.simulate(net, state, dt=0.1, n_steps=90, record=("v",), chunk_size=30)
    for name in ("E", "I"):
        np.testing.assert_array_equal(
            np.asarray(chunked.spikes[name]), np.asarray(whole.spikes[name])
        )
        np.testing.assert_allclose(
            np.asarray(chunked.values["v"][name]), np.asarray(whole.values["v"][name]), rtol=1e-6
        )
    assert int(np.asarray(whole.spikes["E"]).sum()) > 0


def test_vmap_over_full_states_and_a_weight_scale_is_one_launch():
    """`jax.vmap` over keys (full states) and a per-trial weight scale becomes the kernel's
    trial axis: one `pallas_call`, no loop over trials, and the stacked single runs."""
    net = _net()
    keys = jax.random.split(jax.random.key(6), 3)
    scales = jnp.asarray([0.5, 1.0, 2.0], jnp.float32)

    def one(key, scale):
        scaled = eqx.tree_at(
            lambda m: m.projections[0].layout.weights,
            net,
            net.projections[0].layout.weights * scale,
        )
        return nj.simulate(scaled, scaled.init_state(key), dt=0.1, n_steps=60, record=("v",))

    got, want = _both(lambda: jax.jit(jax.vmap(one))(keys, scales))
    _assert_same(got, want)
    singles = [jax.jit(one)(k, s) for k, s in zip(keys, scales, strict=True)]
    for b, single in enumerate(singles):
        np.testing.assert_array_equal(
            np.asarray(got[1].spikes["E"][b]), np.asarray(single[1].spikes["E"])
        )
    jaxpr = _pallas_calls(jax.vmap(one), keys, scales)
    assert jaxpr.count("pallas_call") == 1
    assert "while" not in jaxpr.split("pallas_call")[0]


@pytest.mark.parametrize("mode", ["additive", "multiplicative"])
def test_pair_stdp_runs_in_the_kernel(mode):
    """Pair STDP (`nj.STDP`) on E->E inside the kernel: the traces in registers, depression
    over the rows of the arriving neurons and potentiation over the columns of the spiking
    ones (in that order, a barrier between), then delivery with the new weights; equal to
    the per-step path's weights, traces and spikes, over a batch of two trials."""
    base = _net(delay=0.0)
    rule = nj.STDP(a_plus=0.05, a_minus=0.06, tau_plus=10.0, tau_minus=12.0, w_max=2.0, mode=mode)
    plastic = nj.Projection(
        "E",
        "E",
        nj.connect.fixed_prob(jax.random.key(1), 80, 80, 0.1, weight=0.6),
        synapse=nj.Exponential(5.0),
        output=nj.ConductanceOutput(0.0),
        layout="event",
        plasticity=rule,
    )
    net = nj.Network(
        {"E": (base.populations["E"], 80), "I": (base.populations["I"], 20)},
        [plastic, *base.projections[1:]],
        inputs=base.inputs,
        dt=0.1,
    )
    state = net.init_state(jax.random.key(3), batch=(2,))
    assert net.explain_run(state, dt=0.1, n_steps=100)["cuda"].startswith("network_run")

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=100, record=("v",))

    got, want = _both(lambda: jax.jit(run)(state))
    _assert_same(got, want)
    w0 = np.asarray(state.plastic[0].weights)
    w1 = np.asarray(want[0].plastic[0].weights)
    assert np.abs(w1 - w0).max() > 1e-3  # the weights moved
    assert _pallas_calls(run, state).count("pallas_call") == 1


def test_gradient_through_the_kernel_is_the_per_step_paths():
    """`jax.grad` of recorded voltages with respect to a weight scale: the kernel's
    derivative (the JVP of the entry's reference, with the models' surrogate spikes) equals
    the per-step path's (same operations in the same order: 1e-5 relative)."""
    net = _net()
    state = net.init_state(jax.random.key(0))

    def loss(scale):
        scaled = eqx.tree_at(
            lambda m: m.projections[0].layout.weights,
            net,
            net.projections[0].layout.weights * scale,
        )
        _, rec = nj.simulate(scaled, state, dt=0.1, n_steps=40, record=("v",))
        return rec.values["v"]["E"].sum() + rec.values["v"]["I"].sum()

    got, want = _both(lambda: jax.jit(jax.grad(loss))(1.0))
    assert abs(float(want)) > 1.0  # the weight matters
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    assert _pallas_calls(jax.grad(loss), 1.0).count("pallas_call") == 1


def test_poisson_sources_match_the_reference_statistics():
    """Poisson sources drawn in the kernel (counter-based generator) have the mean and
    variance of counts of `PoissonSource.step` (binomial: `N p`, `N p (1 - p)`), independent
    across trials; and they drive their targets (that the kernel delivers them as its
    reference does, with the same generator, is checked in the next test)."""
    n_src, n_steps, rate, dt = 400, 200, 500.0, 0.1
    p = rate * dt * 1e-3
    lif = nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    conn = nj.connect.fixed_prob(jax.random.key(7), n_src, 50, 0.1, weight=1.5)
    net = nj.Network(
        {"P": (nj.PoissonSource(rate), n_src), "E": (lif, 50)},
        [nj.Projection("P", "E", conn, synapse=nj.Exponential(5.0), layout="event")],
        dt=dt,
    )
    state = net.init_state(jax.random.key(8), batch=(2,))

    def run(st):
        return nj.simulate(net, st, dt=dt, n_steps=n_steps, record=("v",))

    (g_state, g_rec), (_, w_rec) = _both(lambda: jax.jit(run)(state))
    counts = np.asarray(g_rec.spikes["P"]).sum(axis=0).astype(float)  # (2, n_src)
    ref = np.asarray(w_rec.spikes["P"]).sum(axis=0).astype(float)
    mean, var = n_steps * p, n_steps * p * (1 - p)
    # The mean over 800 counts has standard error sqrt(var / 800) = 0.11; the sample
    # variance of 800 near-Poisson counts has a relative standard error of about 5 %.
    for c in (counts, ref):
        assert abs(c.mean() - mean) < 5 * np.sqrt(var / c.size), (c.mean(), mean)
        assert abs(c.var(ddof=1) / var - 1) < 0.25, (c.var(ddof=1), var)
    assert abs(np.corrcoef(counts[0], counts[1])[0, 1]) < 0.2  # trials independent
    assert not np.array_equal(counts[0], counts[1])
    assert int(np.asarray(g_rec.spikes["E"]).sum()) > 0  # and drive their targets
    assert g_state.populations["P"].spikes.shape == (2, n_src)


def test_kernel_equals_its_reference_with_poisson_sources():
    """With Poisson sources the kernel and the entry's pure-JAX reference (the same
    generator) agree exactly on every spike and to rounding on every state."""
    example = next(_pallas_network._examples())
    spec = example.static["spec"]
    want = jax.jit(lambda *a: _pallas_network.network_run_reference(*a, spec=spec))(*example.args)
    with nj.kernels.interpret("gpu"):
        got = jax.jit(lambda *a: _pallas_network.network_run_gpu(*a, spec=spec))(*example.args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, float), np.asarray(w, float), rtol=1e-6, atol=1e-5)
    assert int(np.asarray(want[5]).sum()) > 20  # the sources fired


def test_the_cpu_keeps_the_per_step_path_and_unfit_networks_fall_back():
    """Without the interpret switch the CPU answers None (its C++ per-step kernels run); a
    network that does not fit one program (gap junctions, a plastic projection, a custom
    limit) falls back with the reason in `explain_run`."""
    net = _net()
    state = net.init_state(jax.random.key(0))
    assert net.fused_run(state, None, 0.1, 10, 1, **_options()) is None
    with nj.kernels.interpret("gpu"):
        assert net.fused_run(state, None, 0.1, 10, 1, **_options()) is not None
        gap = nj.Network(
            {"E": (nj.LIF(), 10)},
            gap_junctions={"E": nj.GapJunction(_ring_pairs(10))},
        )
        assert gap.fused_run(gap.init_state(), None, 0.1, 10, 1, **_options()) is None
        why = gap.explain_run(gap.init_state(), dt=0.1, n_steps=10)
        assert why["cuda"].startswith("per-step") and "gap junctions" in why["cuda"]
        small = _pallas_network.Limits(200, 10**9, 64, "a test")
        found = _network_run.plan(net, state, None, 0.1, 10, 1, limits=small)
        assert isinstance(found, str) and "registers" in found and "> 200 (a test)" in found
        small = _pallas_network.Limits(10**6, 10**9, 2, "a test")
        found = _network_run.plan(net, state, None, 0.1, 10, 1, limits=small)
        assert isinstance(found, str) and "fan-out" in found
        small = _pallas_network.Limits(10**6, 100, 64, "a test")
        found = _network_run.plan(net, state, None, 0.1, 10, 1, limits=small)
        # two rings of 4 slots: (4 x 100 + 4 x 100) floats of 4 bytes
        assert isinstance(found, str) and "rings take 3200 bytes > 100 (a test)" in found


def _ring_pairs(n):
    """Neighbours on a chain, each pair once: a gap-junction connectivity."""
    from jax.experimental import sparse

    i = np.arange(n - 1)
    idx = np.stack([i, i + 1], axis=1).astype(np.int32)
    return sparse.BCOO((jnp.full((n - 1,), 0.1, jnp.float32), jnp.asarray(idx)), shape=(n, n))


def _options(**kw):
    base = dict(
        kind="none",
        record=None,
        spike_dtype="bool",
        check=False,
        checkpoint=False,
        truncate_backprop=None,
    )
    return {**base, **kw}


def test_explain_says_which_path_runs_and_why():
    """`nj.kernels.explain(net, state, ...)` (and `net.explain_run`) name the path per
    platform: the CPU's per-step path, the GPU's whole-network kernel, the TPU's per-step
    path; under the interpret switch the CPU runs the kernel."""
    net = _net()
    state = net.init_state(jax.random.key(0))
    why = nj.kernels.explain(net, state, dt=0.1, n_steps=100)
    assert why == net.explain_run(state, dt=0.1, n_steps=100)
    assert why["cpu"].startswith("per-step") and "C++" in why["cpu"]
    assert why["cuda"].startswith("network_run") and "100 neurons" in why["cuda"]
    assert why["tpu"].startswith("per-step")
    with nj.kernels.interpret("gpu"):
        assert nj.kernels.explain(net, state, dt=0.1, n_steps=100)["cpu"].startswith("network_run")
    with nj.kernels.use("reference"):
        assert all(
            s.startswith("per-step")
            for s in nj.kernels.explain(net, state, dt=0.1, n_steps=100).values()
        )
    # the switch that keeps networks on the per-step path (to time or test it on a GPU)
    with nj.kernels.whole_networks(False), nj.kernels.interpret("gpu"):
        why = nj.kernels.explain(net, state, dt=0.1, n_steps=100)
        assert all(s.startswith("per-step") and "whole_networks(False)" in s for s in why.values())
        assert net.fused_run(state, None, 0.1, 10, 1, **_options()) is None
    with pytest.raises(TypeError, match="enabled must be True or False, got 'no'"):
        with nj.kernels.whole_networks("no"):
            pass


def test_kernel_arguments_are_checked():
    """A wrong argument is refused before any work, naming it."""
    example = next(_pallas_network._examples())
    spec = example.static["spec"]
    args = list(example.args)
    args[3] = args[3][:, :10]  # v of the wrong width is still rank 2: change its rank
    args[3] = args[3][0]
    with pytest.raises(ValueError, match=r"argument pop1\.state0 must have a leading axis"):
        _pallas_network.network_run_reference(*args, spec=spec)
    with pytest.raises(ValueError, match=r"expected 16 arguments, got 15"):
        _pallas_network.network_run_gpu(*example.args[:-1], spec=spec)
    with pytest.raises(ValueError, match=r"n_rec must be an int >= 1, got 0"):
        _pallas_network.network_run_reference(*example.args, spec=spec._replace(n_rec=0))


@pytest.mark.parametrize(
    "case", ["coba", "coba_vmap8", "coba_stdp", "short_term", "poisson_series"]
)
def test_coba_one_second_lowers_for_cuda_with_the_steps_inside_the_kernel(case):
    """The bar: the COBA 1 s program (4000 neurons, 10^4 steps; `jax.vmap` over 8 full
    states; COBA with pair STDP on E->E; a network with short-term plasticity; Poisson
    sources, a time-series input, recorded voltages and window counts) lowered for CUDA is
    one Triton call with no XLA loop around it."""
    inputs, options = None, {}
    if case == "short_term":
        net = _net(stp=True)
        state = net.init_state(jax.random.key(0))
    elif case == "poisson_series":
        lif = nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
        conn = nj.connect.fixed_prob(jax.random.key(7), 400, 50, 0.1, weight=1.5)
        net = nj.Network(
            {"P": (nj.PoissonSource(500.0), 400), "E": (lif, 50)},
            [nj.Projection("P", "E", conn, synapse=nj.Exponential(5.0), layout="event")],
            dt=0.1,
        )
        state = net.init_state(jax.random.key(8), batch=(2,))
        inputs = {"E": jnp.ones((10_000, 50))}
        options = dict(record=("v",), record_every=10)
    else:
        net, state = nj.models.coba(jax.random.key(0), method="event")
    if case == "coba_stdp":
        from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
        from benchmarks.stdp_overhead import with_stdp

        net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    every = options.get("record_every", 1)
    why = net.explain_run(state, inputs, dt=0.1, n_steps=10_000, record_every=every)
    assert why["cuda"].startswith("network_run")

    def run(st):
        return nj.simulate(net, st, inputs, dt=0.1, n_steps=10_000, **options)

    fn, args = run, (state,)
    if case == "coba_vmap8":
        states = jax.tree.map(lambda x: jnp.broadcast_to(x, (8, *x.shape)), state)
        fn, args = jax.vmap(run), (states,)
    with nj.kernels.cross_platform():
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count(TRITON) == 1
    assert not re.search(r"stablehlo\.while|scf\.while", text)
