"""The whole network run on the CPU (`nj_network_run`, `neurojax.network._cpu_run`): the
same spikes and the same final state, bit for bit, as the per-step path (the scan over
`Network.step` with its own kernels), which `nj.kernels.whole_networks(False)` keeps; the
derivative of the per-step path; one call per trial under `vmap`; and a sentence for every
network or run it does not take.

The thread counts (1, 2, 3, 4, the rule forced to share) are checked in
`tests/test_thread_determinism.py`, whose slow case runs them under ThreadSanitizer.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _build
from neurojax.network import _cpu_run

DT = 0.1


@pytest.fixture(autouse=True)
def _compiled():
    if _build.library() is None or nj.kernels.mode() != "auto":
        pytest.skip("the compiled kernels are not in use")


def _numpy(tree):
    def leaf(x):
        x = jnp.asarray(x)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jr.key_data(x)
        return np.asarray(x)

    return jax.tree.leaves(jax.tree.map(leaf, tree))


def _both(net, state, n_steps, every=1):
    """(whole run, per-step run) of the same chunk, each jitted."""

    def run(net, state):
        return nj.simulate(net, state, dt=DT, n_steps=n_steps, record_every=every)

    whole = jax.jit(run)(net, state)
    with nj.kernels.whole_networks(False):
        per_step = jax.jit(run)(net, state)
    return whole, per_step


def _assert_same(a, b):
    la, lb = _numpy((a[0], a[1].spikes)), _numpy((b[0], b[1].spikes))
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _tonic_net(key, *, per_synapse=True, n=(120, 40), kinetics=nj.Exponential, inputs=None):
    """Two LIF populations that fire by themselves (v_rest above threshold), E -> E with
    per-synapse delays (or one delay), E -> I, I -> E with one delay."""
    lif_e = nj.LIF(tau_m=10.0, v_rest=-45.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)
    lif_i = nj.LIF(tau_m=8.0, v_rest=-47.0, v_reset=-60.0, v_th=-50.0, t_ref=1.0)
    k1, k2, k3, k4 = jr.split(key, 4)
    ne, ni = n
    ee = nj.connect.fixed_prob(k1, ne, ne, 0.2, weight=nj.connect.normal(0.6, 0.2))
    delay_ee = jr.uniform(k4, (ee.nse,), minval=0.1, maxval=2.0) if per_synapse else 1.3
    projs = [
        nj.Projection("E", "E", ee, synapse=kinetics(2.0), delay=delay_ee, method="event"),
        nj.Projection("E", "I", nj.connect.fixed_prob(k2, ne, ni, 0.3, weight=0.8),
                      synapse=kinetics(1.0), delay=0.5, method="event"),
        nj.Projection("I", "E", nj.connect.fixed_prob(k3, ni, ne, 0.4, weight=-1.5),
                      synapse=kinetics(4.0), delay=0.8, method="event"),
    ]  # fmt: skip
    net = nj.Network({"E": (lif_e, ne), "I": (lif_i, ni)}, projs, inputs=inputs or {}, dt=DT)
    return net, net.init_state(jr.fold_in(key, 1))


def _conductance_net(key, outputs, inputs):
    """The tonic two-population network with `outputs` = (E -> E, E -> I, I -> E), each
    "g" (conductance: excitatory reversal 0 mV, inhibitory -80 mV) or "c" (current), and
    constant `inputs`: the sums of a population's current in every order of the two kinds
    (the kernel rounds a conductance term's product as XLA:CPU contracts it)."""
    lif_e = nj.LIF(tau_m=10.0, v_rest=-49.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)
    lif_i = nj.LIF(tau_m=8.0, v_rest=-49.5, v_reset=-60.0, v_th=-50.0, t_ref=1.0)
    k1, k2, k3 = jr.split(key, 3)
    specs = [("E", "E", k1, 0.2, 0.3, 0.0, 1.0), ("E", "I", k2, 0.3, 0.2, 0.0, 0.5),
             ("I", "E", k3, 0.4, 0.1, -80.0, 0.8)]  # fmt: skip
    projs = []
    for (pre, post, k, p, w, e_rev, delay), kind in zip(specs, outputs, strict=True):
        n_pre, n_post = (120 if pre == "E" else 40), (120 if post == "E" else 40)
        if kind == "g":
            output, weight = nj.ConductanceOutput(e_rev), nj.connect.normal(w, 0.05)
        else:
            output, weight = nj.CurrentOutput(), (4.0 * w if e_rev == 0.0 else -4.0 * w)
        conn = nj.connect.fixed_prob(k, n_pre, n_post, p, weight=weight)
        projs.append(
            nj.Projection(pre, post, conn, synapse=nj.Exponential(3.0), output=output,
                          delay=delay, method="event")
        )  # fmt: skip
    net = nj.Network({"E": (lif_e, 120), "I": (lif_i, 40)}, projs, inputs=inputs, dt=DT)
    return net, net.init_state(jr.fold_in(key, 1))


@pytest.mark.parametrize(
    "outputs, inputs",
    [
        # E: conductance then current, then a per-neuron input; I: one conductance + input
        ("ggc", {"E": jnp.linspace(0.5, 2.0, 120), "I": 1.5}),
        # E: current then conductance, then an input; I: one conductance, no input
        ("cgg", {"E": 30.0}),
        # E: two conductances then an input; I: a current alone with an input
        ("gcg", {"E": 0.8, "I": 2.0}),
    ],
    ids=["ggc", "cgg", "gcg"],
)
def test_conductance_outputs_and_constant_inputs_equal_the_per_step_path(outputs, inputs):
    net, state = _conductance_net(jr.key(11), outputs, inputs)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    whole, per_step = _both(net, state, 400)
    _assert_same(whole, per_step)
    for name in ("E", "I"):
        assert int(np.asarray(whole[1].spikes[name]).sum()) > 40, name


def test_coba_equals_the_per_step_path():
    # The Brette et al. (2007) COBA network, small: two conductance terms and a constant
    # input per population, Euler integration.
    net, state = nj.models.coba(jr.key(2), n_exc=400, n_inh=100, p=0.08, method="event")
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    whole, per_step = _both(net, state, 1000)
    _assert_same(whole, per_step)
    rate = float(np.asarray(whole[1].spikes["E"]).mean()) / (DT * 1e-3)
    assert 1.0 < rate < 200.0, rate  # an active network, not a silent or saturated one


@pytest.mark.parametrize("per_synapse", [True, False], ids=["per-synapse", "one-delay"])
def test_tonic_network_equals_the_per_step_path(per_synapse):
    net, state = _tonic_net(jr.key(3), per_synapse=per_synapse)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    whole, per_step = _both(net, state, 400)
    _assert_same(whole, per_step)
    n_spikes = sum(int(np.asarray(s).sum()) for s in whole[1].spikes.values())
    assert n_spikes > 100  # the network is active: the comparison covers delivery
    # window counts: the per-step raster summed over windows of 8 steps
    counts = jax.jit(lambda n, s: nj.simulate(n, s, dt=DT, n_steps=400, record_every=8))(net, state)
    for name, raster in whole[1].spikes.items():
        want = np.asarray(raster).reshape(50, 8, -1).sum(axis=1)
        got = np.asarray(counts[1].spikes[name])
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)
    _assert_same((counts[0], counts[1]), _both(net, state, 400, 8)[1])


def test_microcircuit_with_poisson_background_equals_the_per_step_path():
    net, state = nj.models.microcircuit(jr.key(0), scale=0.02, k_scale=1.0)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    whole, per_step = _both(net, state, 300)
    _assert_same(whole, per_step)
    assert int(np.asarray(whole[1].spikes["L4E"]).sum()) > 10
    # and the run continues where it stopped: two chunks equal one
    first = jax.jit(lambda n, s: nj.simulate(n, s, dt=DT, n_steps=150))(net, state)
    second = jax.jit(lambda n, s: nj.simulate(n, s, dt=DT, n_steps=150))(net, first[0])
    np.testing.assert_array_equal(
        np.concatenate([first[1].spikes["L4E"], second[1].spikes["L4E"]]),
        whole[1].spikes["L4E"],
    )
    for a, b in zip(_numpy(second[0]), _numpy(whole[0]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_vmap_runs_each_trial_as_alone():
    net, state = _tonic_net(jr.key(5))
    states = jax.vmap(net.init_state)(jr.split(jr.key(6), 3))
    run = jax.jit(jax.vmap(lambda s: nj.simulate(net, s, dt=DT, n_steps=200)))
    batched = run(states)
    for b in range(3):
        one = jax.tree.map(lambda x, b=b: x[b], states)
        with nj.kernels.whole_networks(False):
            alone = jax.jit(lambda s: nj.simulate(net, s, dt=DT, n_steps=200))(one)
        for x, y in zip(
            _numpy(jax.tree.map(lambda x, b=b: x[b], (batched[0], batched[1].spikes))),
            _numpy((alone[0], alone[1].spikes)),
            strict=True,
        ):
            np.testing.assert_array_equal(x, y)


def test_gradient_is_the_per_step_paths():
    net, state = _tonic_net(jr.key(7), n=(60, 20))

    def loss(w, whole):
        n2 = eqx.tree_at(lambda n: n.projections[0].layout.weights, net, w)
        with nj.kernels.whole_networks(whole):
            st, _ = nj.simulate(n2, state, dt=DT, n_steps=60)
        return jnp.sum(st.populations["E"].v) + jnp.sum(st.synapses[0].g)

    w = net.projections[0].layout.weights
    v_whole, g_whole = jax.jit(jax.value_and_grad(lambda w: loss(w, True)))(w)
    v_step, g_step = jax.jit(jax.value_and_grad(lambda w: loss(w, False)))(w)
    assert v_whole == v_step
    assert float(jnp.max(jnp.abs(g_step))) > 0
    np.testing.assert_allclose(g_whole, g_step, rtol=1e-6, atol=1e-6)


def test_what_it_does_not_take_is_said():
    net, state = _tonic_net(jr.key(8))
    assert "inputs" in _cpu_run.explain(net, state, {"E": 1.0}, dt=DT, kind="const")
    assert "spike_dtype" in _cpu_run.explain(net, state, dt=DT, spike_dtype="ids")
    assert "fields" in _cpu_run.explain(net, state, dt=DT, record=("v",))
    with nj.kernels.whole_networks(False):
        assert "whole_networks(False)" in _cpu_run.explain(net, state, dt=DT)
    with nj.kernels.use("reference"):
        assert "reference" in _cpu_run.explain(net, state, dt=DT)
    alpha, _ = _tonic_net(jr.key(8), kinetics=nj.Alpha)
    why = _cpu_run.explain(alpha, alpha.init_state(jr.key(1)), dt=DT)
    assert why.startswith("per-step") and "Alpha" in why
    timed, st = _tonic_net(jr.key(8), inputs={"E": lambda t: 2.0 + 0.0 * t})
    assert "function of time" in _cpu_run.explain(timed, st, dt=DT)
    # a network it does not take still runs, on the per-step path, with the same numbers
    whole, per_step = _both(alpha, alpha.init_state(jr.key(1)), 50)
    _assert_same(whole, per_step)


def _coba_stdp(key, mode, pairing):
    from benchmarks.stdp_overhead import with_stdp

    net, state = nj.models.coba(key, n_exc=400, n_inh=100, p=0.08, method="event")
    rule = nj.STDP(
        a_plus=0.01,
        a_minus=0.0105,
        tau_plus=20.0,
        tau_minus=20.0,
        w_min=0.0,
        w_max=1.2,
        mode=mode,
        pairing=pairing,
    )
    return with_stdp(net, state, rule)


@pytest.mark.parametrize(
    "mode,pairing",
    [
        ("additive", "all_to_all"),
        ("additive", "nearest"),
        ("multiplicative", "all_to_all"),
        ("multiplicative", "nearest"),
    ],
)
def test_coba_with_pair_stdp_equals_the_per_step_path(mode, pairing):
    # Pair STDP on E -> E in the whole run: weights, traces, spikes and the rest of the state
    # equal the per-step path's (which runs nj_stdp_update), and the rule did change weights.
    net, state = _coba_stdp(jr.key(2), mode, pairing)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    whole, per_step = _both(net, state, 1000)
    _assert_same(whole, per_step)
    w0 = np.asarray(state.plastic[0].weights)
    w1 = np.asarray(whole[0].plastic[0].weights)
    assert (w0 != w1).sum() > 1000
    assert np.all((w1 >= 0.0) & (w1 <= 1.2))
    assert float(np.asarray(whole[0].plastic[0].pre_traces[0]).max()) > 0.0


def test_plastic_rules_it_does_not_run_are_said():
    from benchmarks.stdp_overhead import with_stdp

    net, state = nj.models.coba(jr.key(3), n_exc=80, n_inh=20, p=0.1, method="event")
    triplet, st = with_stdp(net, state, nj.TripletSTDP())
    why = _cpu_run.explain(triplet, st, dt=DT)
    assert why.startswith("per-step") and "not pair STDP" in why
    whole, per_step = _both(triplet, st, 100)
    _assert_same(whole, per_step)


def test_corrupted_plastic_columns_are_refused_before_the_run():
    net, state = _coba_stdp(jr.key(4), "additive", "all_to_all")
    lay = net.projections[0].layout
    bad_syn = jnp.asarray(lay.col_syn).at[5].set(lay.col_syn[6])  # a synapse of another column
    forged = eqx.tree_at(lambda n: n.projections[0].layout.col_syn, net, bad_syn)

    def run(net, state):
        return nj.simulate(net, state, dt=DT, n_steps=50)

    with pytest.raises(Exception, match="corrupted columns"):
        jax.block_until_ready(jax.jit(run)(forged, state))


_SLOW_SHARING = """
import ctypes, json, sys
import jax, jax.random as jr, numpy as np
import neurojax as nj
from neurojax.kernels import _build
lib = _build.library()
lib.NjSetSharePenalty.argtypes = [ctypes.c_int64]
lib.NjSetSharePenalty.restype = ctypes.c_int64
lib.NjSetSharePenalty(int(sys.argv[1]))
net, state = nj.models.coba(jr.key(0))
run = jax.jit(lambda s: nj.simulate(net, s, dt=0.1, n_steps=2000)[1].spikes)
spikes = [sum(int(np.asarray(x).sum()) for x in jax.tree.leaves(run(state)))]
threads = [lib.NjNetworkRunThreads()]
print(json.dumps({"threads": threads, "spikes": spikes}))
"""


def test_probe_keeps_a_network_on_one_thread_where_sharing_loses():
    # Each shared step made 8 us slower (NjSetSharePenalty stands in for two cores whose
    # round trip is slow; COBA's step is 4-6 us on one thread): the first call's probe must
    # keep the run on one thread. Its first steps, timed cold, once made one thread look
    # about 2.5 times slower than it is and chose the two threads.
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("NEUROJAX_CPU_THREADS", "PJRT_NPROC")}
    env["NEUROJAX_CPU_THREADS"] = "2"
    out = []
    for penalty in (8000, 0):
        proc = subprocess.run(
            [sys.executable, "-c", _SLOW_SHARING, str(penalty)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert out[0]["threads"] == [1]
    # the same spikes whichever way it ran
    assert out[0]["spikes"] == out[1]["spikes"] and out[0]["spikes"][0] > 1000
