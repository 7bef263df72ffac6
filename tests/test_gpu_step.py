"""The per-step GPU path of a network (for networks too large for one program): the kernels a
COBA step costs, the vmapped step with no loop over trials, and the step's results.

On the GPU slots a step is: one Pallas kernel for the arrivals (every projection's kinetics,
and the ring's read slot zeroed), the input currents (XLA, one fusion per population), one
Pallas kernel per group for the neurons (the model's own `step`, spikes written in place, no
concatenation or split of the state), the delivery kernel, and the step counter.
`kernels_per_step` (`tests/_kernel_count.py`) is the proxy count of issue #37."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernel_count import kernels_per_step

import neurojax as nj


@pytest.fixture(autouse=True)
def _per_step_path():
    """These tests are about the per-step path: a network that fits one GPU program would
    otherwise run whole in `network_run` under `nj.simulate` (tests/test_gpu_network_run.py)."""
    with nj.kernels.whole_networks(False):
        yield


@pytest.fixture(scope="module")
def coba():
    return nj.models.coba(jax.random.key(0))


def _stacked(state, b):
    return jax.tree.map(lambda x: jnp.stack([x] * b) if isinstance(x, jax.Array) else x, state)


# Measured on this tree: 46 before the delivery read the spike vector itself (23 of them the
# compaction of the spike list), 22 with it, 6 with the fused arrivals and group kernels (the
# arrivals, the two populations' currents, the group, the delivery, the step counter).
COBA_KERNELS_MAX = 6
# Recorded values of the same count (fails when a change makes them larger; lower them then).
STDP_COBA_KERNELS = 14  # 27 before the fused kernels
MICROCIRCUIT_KERNELS = 52  # scale 0.02; 99 before


def test_coba_step_kernel_count(coba):
    net, state = coba
    kernels, triton, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert triton == 3, ops  # arrivals, the group's neurons, the delivery
    assert kernels <= COBA_KERNELS_MAX, ops
    assert "while" not in ops and "sort" not in ops and "scatter" not in ops, ops
    assert "concatenate" not in ops and "slice" not in ops, ops


def test_vmapped_coba_step_is_one_program_for_all_trials(coba):
    """`jax.vmap` over 8 full states (the step counter batched too): one delivery kernel, no
    loop over the trials (the GPU batching rule folds them), about the unbatched count."""
    net, state = coba
    states = _stacked(state, 8)
    step = jax.vmap(lambda s: net.step(s, None, 0.1))
    kernels, triton, ops = kernels_per_step(step, states)
    assert triton == 3 and "while" not in ops, ops
    assert kernels <= COBA_KERNELS_MAX, ops
    with nj.kernels.cross_platform():
        text = jax.jit(step).trace(states).lower(lowering_platforms=("cuda",)).as_text()
        tpu = jax.jit(step).trace(states).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "stablehlo.while" not in text
    assert "stablehlo.while" not in tpu  # the TPU delivery folds the trials too


def test_proxy_counts_a_loop_it_is_shown():
    """The counter can fail: a compaction with `jnp.nonzero` shows up as extra kernels."""

    def plain(x):
        return x * 2.0 + 1.0

    def compacting(x):
        return jnp.nonzero(x > 0, size=16, fill_value=0)[0].astype(x.dtype) + x[:16]

    x = jnp.linspace(-1.0, 1.0, 64)
    assert kernels_per_step(plain, x)[0] == 1
    assert kernels_per_step(compacting, x)[0] > 1


def test_small_coba_under_interpret_equals_the_cpu_kernels():
    """COBA (400 neurons, 150 steps) with the GPU kernels interpreted gives the CPU kernels'
    spikes exactly and their state to rounding (the atomics add in no fixed order)."""
    net, state = nj.models.coba(jax.random.key(1), n_exc=320, n_inh=80, p=0.05)
    run = jax.jit(lambda st: nj.simulate(net, st, dt=0.1, n_steps=150))
    want_final, want = run(state)
    with nj.kernels.interpret("gpu"):
        final, got = run(state)
    assert int(want.spikes["E"].sum()) > 0
    for pop in ("E", "I"):
        np.testing.assert_array_equal(np.asarray(got.spikes[pop]), np.asarray(want.spikes[pop]))
    for g, w in zip(jax.tree.leaves(final), jax.tree.leaves(want_final), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_vmapped_network_under_interpret_equals_stacked_runs():
    """`jax.vmap` over three full states (different voltages; the step counter batched too)
    equals three runs, with the GPU kernels interpreted."""
    net, state = nj.models.coba(jax.random.key(2), n_exc=160, n_inh=40, p=0.1)

    def shifted(dv):
        pops = {k: eqx.tree_at(lambda p: p.v, p, p.v + dv) for k, p in state.populations.items()}
        return eqx.tree_at(lambda st: st.populations, state, pops)

    trials = [shifted(dv) for dv in (0.0, 2.0, 4.0)]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *trials)

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=80)[1].spikes

    want = [run(st) for st in trials]
    with nj.kernels.interpret("gpu"):
        got = jax.jit(jax.vmap(run))(states)
    for pop in ("E", "I"):
        np.testing.assert_array_equal(
            np.asarray(got[pop]), np.stack([np.asarray(w[pop]) for w in want])
        )
    assert int(np.asarray(got["E"]).sum()) > 0


def test_stdp_coba_and_microcircuit_step_counts():
    """The proxy count of the STDP COBA step (additive STDP on E->E, as `bench-gpu` builds
    it) and of the microcircuit's step (scale 0.02): their recorded values."""
    from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
    from benchmarks.stdp_overhead import with_stdp

    net, state = nj.models.coba(jax.random.key(0))
    net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    kernels, _, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert kernels <= STDP_COBA_KERNELS, ops
    net, state = nj.models.microcircuit(jax.random.key(0), scale=0.02)
    kernels, _, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert kernels <= MICROCIRCUIT_KERNELS, ops


def _on_a_gpu(monkeypatch):
    """Trace as a GPU machine does (the per-step path's fused kernels, Pallas not
    interpreted), so that a program can be lowered for `cuda` from this machine."""
    from neurojax.kernels import _pallas
    from neurojax.network import _propagation

    monkeypatch.setattr(_pallas, "gpu_path", lambda: True)
    monkeypatch.setattr(_propagation, "gpu_path", lambda: True)


def test_fused_step_lowers_for_cuda(coba, monkeypatch):
    """The arrivals, group and delivery kernels lower to Triton (three calls per step, for
    one state and for `jax.vmap` over eight), with no loop; the STDP step lowers too."""
    from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
    from benchmarks.stdp_overhead import with_stdp

    _on_a_gpu(monkeypatch)
    net, state = coba
    step = lambda s: net.step(s, None, 0.1)  # noqa: E731
    with nj.kernels.cross_platform():
        one = jax.jit(step).trace(state).lower(lowering_platforms=("cuda",)).as_text()
        states = _stacked(state, 8)
        many = jax.jit(jax.vmap(step)).trace(states).lower(lowering_platforms=("cuda",))
        many = many.as_text()
        plastic, pstate = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
        stdp = jax.jit(lambda s: plastic.step(s, None, 0.1)).trace(pstate)
        stdp = stdp.lower(lowering_platforms=("cuda",)).as_text()
    for text in (one, many):
        assert text.count("__gpu$xla.gpu.triton") == 3
        assert "stablehlo.while" not in text
    assert text.count("nj_group_step") >= 1 and text.count("nj_arrivals") >= 1
    assert stdp.count("__gpu$xla.gpu.triton") >= 3


def _net_with_delays(batch):
    """Two LIF populations with different parameters (one group; per-neuron thresholds in
    one), an Izhikevich population (a group of its own), alpha and exponential kinetics,
    per-synapse and homogeneous delays, conductance and current outputs, constant drives."""
    k = jax.random.split(jax.random.key(3), 6)
    lif_e = nj.LIF(
        tau_m=20.0,
        v_rest=-60.0,
        v_reset=-60.0,
        v_th=jnp.linspace(-51.0, -49.0, 120),
        r_m=1.0,
        t_ref=2.0,
    )
    lif_i = nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, r_m=1.0, t_ref=1.0)
    ee = nj.connect.fixed_prob(k[0], 120, 120, 0.1, weight=0.6)
    ei = nj.connect.fixed_prob(k[1], 120, 40, 0.1, weight=0.8)
    ie = nj.connect.fixed_prob(k[2], 40, 120, 0.2, weight=2.0)
    ez = nj.connect.fixed_prob(k[3], 120, 30, 0.2, weight=1.5)
    d = jax.random.uniform(k[4], ee.data.shape, minval=0.1, maxval=2.0)
    projs = [
        nj.Projection(
            "E", "E", ee, synapse=nj.Alpha(5.0), output=nj.ConductanceOutput(0.0), delay=d
        ),
        nj.Projection(
            "E", "I", ei, synapse=nj.Exponential(5.0), output=nj.ConductanceOutput(0.0), delay=1.0
        ),
        nj.Projection(
            "I", "E", ie, synapse=nj.Exponential(10.0), output=nj.ConductanceOutput(-80.0)
        ),
        nj.Projection("E", "Z", ez, synapse=nj.Exponential(3.0)),
    ]
    net = nj.Network(
        populations={"E": (lif_e, 120), "I": (lif_i, 40), "Z": (nj.Izhikevich(), 30)},
        projections=projs,
        inputs={"E": 12.0, "I": 11.0, "Z": 6.0},
        dt=0.1,
    )
    state = net.init_state(batch=batch)
    v = -60.0 + 10.0 * jax.random.uniform(k[5], batch + (120,))
    return net, eqx.tree_at(lambda s: s.populations["E"].v, state, v)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_delays_models_and_batch_under_interpret_equal_the_cpu(batch):
    """The fused kernels (arrivals, two groups, delivery: four Triton calls a step) on a
    network with delays of several steps, two neuron models and a batch: the CPU path's
    spikes exactly and its state to rounding."""
    net, state = _net_with_delays(batch)
    assert kernels_per_step(lambda s: net.step(s, None, 0.1), state)[1] == 4
    run = jax.jit(lambda st: nj.simulate(net, st, dt=0.1, n_steps=200))
    want_final, want = run(state)
    with nj.kernels.interpret("gpu"):
        final, got = run(state)
    for pop in ("E", "I", "Z"):
        assert int(want.spikes[pop].sum()) > 0
        np.testing.assert_array_equal(np.asarray(got.spikes[pop]), np.asarray(want.spikes[pop]))
    for g, w in zip(jax.tree.leaves(final), jax.tree.leaves(want_final), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_stdp_coba_under_interpret_equals_the_cpu():
    """COBA with additive STDP on E->E (400 neurons): the fused arrivals and group kernels
    with the plasticity and delivery kernels give the CPU path's spikes and weights."""
    from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
    from benchmarks.stdp_overhead import with_stdp

    net, state = nj.models.coba(jax.random.key(4), n_exc=320, n_inh=80, p=0.05)
    net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    run = jax.jit(lambda st: nj.simulate(net, st, dt=0.1, n_steps=150))
    want_final, want = run(state)
    with nj.kernels.interpret("gpu"):
        final, got = run(state)
    assert int(want.spikes["E"].sum()) > 0
    for pop in ("E", "I"):
        np.testing.assert_array_equal(np.asarray(got.spikes[pop]), np.asarray(want.spikes[pop]))
    for g, w in zip(jax.tree.leaves(final), jax.tree.leaves(want_final), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_a_step_the_kernels_cannot_take_keeps_the_xla_path():
    """A traced `dt` cannot be baked into the fused kernels: that step keeps the XLA phases
    (no arrivals or group kernel) and equals the CPU path; a vmapped neuron parameter (one
    `tau_m` per trial) is a scalar input of the group kernel, batched by Pallas."""
    net, state = nj.models.coba(jax.random.key(5), n_exc=160, n_inh=40, p=0.1)
    traced_dt = lambda s, dt: net.step(s, None, dt)  # noqa: E731
    fused = kernels_per_step(lambda s: net.step(s, None, 0.1), state)[1]
    assert kernels_per_step(traced_dt, state, jnp.float32(0.1))[1] == fused - 2
    want = jax.jit(traced_dt)(state, jnp.float32(0.1))
    with nj.kernels.interpret("gpu"):
        got = jax.jit(traced_dt)(state, jnp.float32(0.1))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)

    def run(tau):
        lif = net.group_models[0]
        tuned = eqx.tree_at(
            lambda n: n.group_models, net, (eqx.tree_at(lambda m: m.tau_m, lif, tau),)
        )
        return nj.simulate(tuned, state, dt=0.1, n_steps=60)[1].spikes["E"]

    taus = jnp.asarray([10.0, 20.0], jnp.float32)
    want = jnp.stack([run(t) for t in taus])
    with nj.kernels.interpret("gpu"):
        got = jax.jit(jax.vmap(run))(taus)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_gradient_through_the_fused_step_is_the_xla_paths():
    """The fused kernels' derivative is their XLA computation's (Pallas cannot differentiate
    a kernel that updates the ring in place): the surrogate gradient of a loss through 40
    steps with respect to the initial voltages equals the CPU path's."""
    net, state = nj.models.coba(jax.random.key(6), n_exc=160, n_inh=40, p=0.1, method="event")

    def loss(v):
        st = eqx.tree_at(lambda s: s.populations["E"].v, state, v)
        final, _ = nj.simulate(net, st, dt=0.1, n_steps=40)
        return jnp.sum(final.populations["E"].v) + jnp.sum(final.populations["I"].v)

    v0 = state.populations["E"].v
    want = jax.jit(jax.grad(loss))(v0)
    with nj.kernels.interpret("gpu"):
        got = jax.jit(jax.grad(loss))(v0)
    assert float(jnp.abs(want).max()) > 0
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_sharded_network_under_interpret_equals_the_unsharded_run():
    """`nj.parallel.shard_network` walks the same phases: with the GPU kernels interpreted
    (fused arrivals, the `CLEARED` ring flag through its delivery) its spikes are the
    unsharded CPU run's."""
    from neurojax.parallel import shard_network

    net, state = nj.models.cuba(jax.random.key(0), n_exc=400, n_inh=100, p=0.05, method="event")
    _, want = nj.simulate(net, state, dt=0.1, n_steps=200)
    sharded = shard_network(net, jax.make_mesh((1,), ("neurons",)))
    with nj.kernels.interpret("gpu"):
        _, got = sharded.run(sharded.shard_state(state), dt=0.1, n_steps=200)
    assert int(want.spikes["E"].sum()) > 0
    for pop in ("E", "I"):
        np.testing.assert_array_equal(np.asarray(got.spikes[pop]), np.asarray(want.spikes[pop]))
