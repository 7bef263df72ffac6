"""nj.parallel.shard_network: one network split along the neuron axis over devices.

The reference is the unsharded `nj.simulate(network, ...)` run: the sharded run must give the
same spikes bit for bit (the synaptic input of every neuron is summed in the same order, see
`neurojax.parallel._shard`), and so the same spikes on every device count. The multi-device
checks run in a subprocess with 8 forced host devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX starts).
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.sharding import Mesh

import neurojax as nj
from neurojax.parallel import _shard
from neurojax.parallel._shard import ShardedNetworkState, shard_network

MESH1 = jax.make_mesh((1,), ("neurons",))


@functools.cache
def _small_cuba(key=0):
    # 500 neurons at p = 0.05: the same fan-in as CUBA, fast enough for in-process tests.
    return nj.models.cuba(jr.key(key), n_exc=400, n_inh=100, p=0.05, method="event")


def _assert_equal_trees(a, b) -> None:
    chex.assert_trees_all_equal(a, b, strict=True)


def test_one_device_equals_network_and_states_round_trip():
    net, state = _small_cuba()
    final, rec = nj.simulate(net, state, dt=0.1, n_steps=1000)
    sharded = shard_network(net, MESH1)
    s0 = sharded.shard_state(state)
    got_final, got = sharded.run(s0, dt=0.1, n_steps=1000)
    assert rec.spikes["E"].sum() > 100  # the network is active
    for name in ("E", "I"):
        assert got.spikes[name].dtype == jnp.bool_
        assert got.spikes[name].shape == (1000, net.sizes[name])
        np.testing.assert_array_equal(np.asarray(got.spikes[name]), np.asarray(rec.spikes[name]))
    np.testing.assert_allclose(np.asarray(got.t), np.asarray(rec.t))
    # The final state, read back in the network's layout, is the unsharded final state, and
    # running on from either gives the same spikes.
    _assert_equal_trees(sharded.unshard_state(got_final), final)
    _assert_equal_trees(sharded.shard_state(sharded.unshard_state(got_final)), got_final)
    _, rec2 = nj.simulate(net, final, dt=0.1, n_steps=300)
    _, got2 = sharded.run(got_final, dt=0.1, n_steps=300)
    np.testing.assert_array_equal(np.asarray(got2.spikes["E"]), np.asarray(rec2.spikes["E"]))


def test_step_under_simulate_and_external_inputs():
    net, state = _small_cuba(1)
    ext = {"I": jnp.linspace(-1.0, 1.0, 100)}
    _, want = nj.simulate(net, state, ext, dt=0.1, n_steps=400)
    # A mesh from jax.make_mesh has explicit axis types; a plain Mesh has automatic ones.
    for mesh in (MESH1, Mesh(np.array(jax.devices()[:1]), ("neurons",))):
        sharded = shard_network(net, mesh)
        s0 = sharded.shard_state(state)
        _, via_simulate = nj.simulate(sharded, s0, ext, dt=0.1, n_steps=400)
        _, via_run = sharded.run(s0, ext, dt=0.1, n_steps=400)
        for name in ("E", "I"):
            np.testing.assert_array_equal(np.asarray(via_simulate.spikes[name]), want.spikes[name])
            np.testing.assert_array_equal(np.asarray(via_run.spikes[name]), want.spikes[name])


def test_init_state_is_the_networks():
    net, _ = _small_cuba()
    sharded = shard_network(net, MESH1)
    key = jr.key(7)
    _assert_equal_trees(sharded.unshard_state(sharded.init_state(key)), net.init_state(key))
    assert isinstance(sharded.init_state(), ShardedNetworkState)


def test_no_retrace_when_only_values_change(monkeypatch):
    # The sharded run's scan (what `nj.simulate` traces through `fused_run`), allowed one
    # trace only.
    chex.clear_trace_counter()
    monkeypatch.setattr(_shard, "_run", chex.assert_max_traces(_shard._run, 1))
    net, state = _small_cuba()
    sharded = shard_network(net, MESH1)
    _, rec = sharded.run(sharded.shard_state(state), dt=0.1, n_steps=200)
    # New weights (same synapses) and new initial voltages: same program.
    heavier = eqx.tree_at(
        lambda n: n.projections[0].weights, net, net.projections[0].weights * jnp.float32(1.5)
    )
    other = shard_network(heavier, MESH1)
    v = eqx.tree_at(lambda s: s.populations["E"].v, state, state.populations["E"].v - 1.0)
    _, rec2 = other.run(other.shard_state(v), dt=0.1, n_steps=200)
    _, rec3 = sharded.run(sharded.init_state(jr.key(3)), dt=0.1, n_steps=200)
    assert not np.array_equal(np.asarray(rec2.spikes["E"]), np.asarray(rec.spikes["E"]))
    assert not np.array_equal(np.asarray(rec3.spikes["E"]), np.asarray(rec.spikes["E"]))
    # A new run length is a new program: a second trace.
    with pytest.raises(AssertionError, match="is traced > 1 times"):
        sharded.run(sharded.shard_state(state), dt=0.1, n_steps=100)
    chex.clear_trace_counter()


def test_exchange_bytes():
    net, _ = _small_cuba()
    sharded = shard_network(net, MESH1)
    # 500 neurons, 1 bit each: 16 uint32 words (4000 neurons on 1 and 8 devices: see below).
    assert sharded.exchange_nbytes == 64
    assert sharded.blocks == (400, 100) and sharded.padded_sizes == (400, 100)


def _lif():
    return nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)


def _conn(n_pre, n_post, key=0):
    return nj.connect.fixed_prob(jr.key(key), n_pre, n_post, 0.2, weight=0.5)


class _NotANeuron(eqx.Module):
    def init_state(self, shape, *, key=None):
        return jnp.zeros(shape)

    def step(self, state, current, dt):
        return state, state


def _unsupported():
    lif = _lif()
    pops = {"A": (lif, 20), "B": (lif, 10)}
    plastic = nj.Projection("A", "B", _conn(20, 10), plasticity=nj.STDP())
    per_syn = _conn(20, 10)
    delayed = nj.Projection("A", "B", per_syn, delay=np.arange(per_syn.nse) * 0.1)
    gap = nj.GapJunction(nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 20, 20))
    return [
        (nj.Network(pops, [plastic]), "plasticity is not supported; projections\\[0\\]"),
        (nj.Network(pops, [delayed], dt=0.1), "per-synapse delays are not supported"),
        (nj.Network(pops, gap_junctions={"A": gap}), "gap junctions are not supported"),
        (nj.Network(pops, inputs={"A": lambda t: 1.0}), "time-dependent inputs"),
        (nj.Network({"X": (_NotANeuron(), 5)}), "population 'X' is a _NotANeuron"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_unsupported_features_raise_before_any_work(case):
    network, match = _unsupported()[case]
    with pytest.raises(ValueError, match=match):
        shard_network(network, MESH1)


def test_argument_errors():
    net, state = _small_cuba()
    with pytest.raises(TypeError, match="network must be an nj.Network"):
        shard_network(nj.LIF(), MESH1)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        shard_network(net, "cpu")
    with pytest.raises(ValueError, match=r"axis \['x'\] not in the mesh's axes \('neurons',\)"):
        shard_network(net, MESH1, axis="x")
    sharded = shard_network(net, MESH1)
    batched = eqx.tree_at(lambda s: s.buffers, net.init_state(batch=2), state.buffers)
    with pytest.raises(ValueError, match="batched states are not supported"):
        sharded.shard_state(batched)
    with pytest.raises(ValueError, match="a batched state, or one of another network"):
        sharded.shard_state(net.init_state(batch=2))
    with pytest.raises(TypeError, match="expected an nj.NetworkState"):
        sharded.shard_state(sharded.init_state())
    other = shard_network(nj.Network({"E": (_lif(), 40), "I": (_lif(), 10)}), MESH1)
    with pytest.raises(ValueError, match="the state does not fit this sharded network"):
        sharded.run(other.init_state(), dt=0.1, n_steps=10)
    with pytest.raises(TypeError, match="expected a ShardedNetworkState"):
        sharded.run(state, dt=0.1, n_steps=10)
    with pytest.raises(ValueError, match=r"inputs\['E'\] must be a scalar or have shape \(400,\)"):
        sharded.run(sharded.init_state(), {"E": jnp.ones(3)}, dt=0.1, n_steps=10)
    delayed = nj.Network(
        {"A": (_lif(), 20)}, [nj.Projection("A", "A", _conn(20, 20), delay=0.5)], dt=0.1
    )
    sd = shard_network(delayed, MESH1)
    with pytest.raises(ValueError, match="dt=0.2 ms but the network was built with dt=0.1"):
        sd.run(sd.init_state(), dt=0.2, n_steps=10)


# ---------------------------------------------------------------------- several devices

_MULTI_DEVICE = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, jax.random as jr, jax.tree_util as jtu, numpy as np
    import neurojax as nj
    from neurojax.parallel._shard import shard_network

    jax.config.update("jax_numpy_dtype_promotion", "strict")
    opts = json.loads(sys.argv[1])
    n_steps = opts["n_steps"]
    out = {"devices": jax.device_count()}

    def mesh(n, names=("neurons",), shape=None):
        return jax.make_mesh(shape or (n,), names, devices=jax.devices()[:n])

    def first_difference(a, b):
        rows = np.nonzero((a != b).any(axis=1))[0]
        return int(rows[0]) if rows.size else None

    def compare(tag, net, state, meshes, inputs=None, via_simulate=(), n_steps=n_steps):
        _, rec = nj.simulate(net, state, inputs, dt=0.1, n_steps=n_steps)
        ref = {k: np.asarray(v) for k, v in rec.spikes.items()}
        out[tag + "-counts"] = {k: int(v.sum()) for k, v in ref.items()}
        rasters = []
        for m, axis in meshes:
            sharded = shard_network(net, m, axis=axis)
            label = f"{tag}-{dict(m.shape)}-{axis}"
            s0 = sharded.shard_state(state)
            runs = [("run", sharded.run(s0, inputs, dt=0.1, n_steps=n_steps)[1].spikes)]
            if label in via_simulate:
                runs.append(("simulate", nj.simulate(sharded, s0, inputs, dt=0.1,
                                                     n_steps=n_steps)[1].spikes))
            for how, spikes in runs:
                got = sharded.to_host(spikes)
                key = f"{label}-{how}"
                out[key] = {k: first_difference(got[k], ref[k]) for k in ref}
                out[key + "-pads-silent"] = all(
                    not np.asarray(spikes[k])[:, sharded.size(k):].any() for k in ref)
                out[key + "-spec"] = str(spikes[next(iter(ref))].sharding.spec)
                out[key + "-ndev"] = len(spikes[next(iter(ref))].sharding.device_set)
            out[label + "-bytes"] = sharded.exchange_nbytes
            rasters.append(got)
        return rasters

    if opts.get("cuba_devices"):
        net, state = nj.models.cuba(jr.key(0))
        compare("cuba", net, state, [(mesh(n), None) for n in opts["cuba_devices"]])

    if opts.get("coba"):
        net, state = nj.models.coba(jr.key(0))
        compare("coba", net, state, [(mesh(n), None) for n in opts["coba_devices"]])

    if opts.get("mixed"):
        # Padding (sizes no device count divides), Poisson sources, delays, alpha and
        # conductance synapses, per-neuron parameters and inputs, external currents, a 2-D
        # mesh split along one axis or both, and nj.simulate over the sharded step.
        lif = nj.LIF(tau_m=jnp.linspace(15.0, 25.0, 205), v_rest=-60.0, v_reset=-60.0,
                     v_th=-50.0, t_ref=2.0)
        k = jr.split(jr.key(3), 3)
        net = nj.Network(
            populations={
                "src": (nj.PoissonSource(jnp.linspace(5.0, 40.0, 301)), 301),
                "E": (lif, 205),
                "I": (nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0), 51),
            },
            projections=[
                nj.Projection("src", "E", nj.connect.fixed_prob(k[0], 301, 205, 0.1, weight=3.0),
                              synapse=nj.Exponential(5.0), delay=0.5, method="event"),
                nj.Projection("E", "I", nj.connect.fixed_prob(k[1], 205, 51, 0.2, weight=2.0),
                              synapse=nj.Alpha(3.0), delay=1.0, method="event"),
                nj.Projection("I", "E", nj.connect.fixed_prob(k[2], 51, 205, 0.2, weight=0.05),
                              synapse=nj.Exponential(10.0), output=nj.ConductanceOutput(-80.0),
                              method="event"),
            ],
            inputs={"E": jnp.linspace(5.0, 9.0, 205)},
            dt=0.1,
        )
        state = net.init_state(jr.key(5))
        meshes = [(mesh(3), None), (mesh(8, ("a", "b"), (2, 4)), "b"),
                  (mesh(8, ("a", "b"), (2, 4)), None)]
        compare("mixed", net, state, meshes, inputs={"I": jnp.linspace(10.0, 12.0, 51)},
                via_simulate=("mixed-{'neurons': 3}-None",), n_steps=2000)
        # The same with an E->E projection whose kinetics and output equal I->E's, sharing
        # its ring columns and state (merge_synapses=True), on 3 devices (padding).
        extra = nj.Projection("E", "E", nj.connect.fixed_prob(k[0], 205, 205, 0.1, weight=0.01),
                              synapse=nj.Exponential(10.0), output=nj.ConductanceOutput(-80.0),
                              delay=0.3, method="event")
        pops = {"src": (nj.PoissonSource(jnp.linspace(5.0, 40.0, 301)), 301), "E": (lif, 205),
                "I": (nj.LIF(tau_m=10.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0), 51)}
        merged = nj.Network(populations=pops,
                            projections=list(net.projections) + [extra],
                            inputs={"E": jnp.linspace(5.0, 9.0, 205)}, dt=0.1,
                            merge_synapses=True)
        out["merged-synapse-of"] = list(merged.synapse_of)
        compare("merged", merged, merged.init_state(jr.key(5)), [(mesh(3), None)],
                inputs={"I": jnp.linspace(10.0, 12.0, 51)}, n_steps=2000)

    if opts.get("errors"):
        lif = nj.LIF()
        try:
            shard_network(nj.Network({"E": (lif, 40), "I": (lif, 5)}), mesh(8))
        except ValueError as err:
            out["too-many-devices"] = str(err)
        net, state = nj.models.cuba(jr.key(0))
        four = shard_network(net, mesh(4)).shard_state(state)
        try:
            shard_network(net, mesh(8)).run(four, dt=0.1, n_steps=10)
        except ValueError as err:
            out["state-of-4-on-8"] = str(err)
    print("RESULT " + json.dumps(out))
    """
)


def _run_multi_device(opts: dict) -> dict:
    # Eight forced host devices: the CPU backend, also on a machine with a GPU.
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _MULTI_DEVICE, json.dumps(opts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    assert out["devices"] == 8
    return out


def _assert_identical(out: dict, prefix: str, n_runs: int) -> None:
    """Every run named `prefix...` has the reference's spikes (no first difference)."""
    runs = {
        k: v
        for k, v in out.items()
        if k.startswith(prefix) and (k.endswith("-run") or k.endswith("-simulate"))
    }
    assert len(runs) == n_runs, sorted(runs)
    differ = {k: v for k, v in runs.items() if any(step is not None for step in v.values())}
    assert not differ, f"first differing step per population: {differ}"
    silent = [k for k in out if k.startswith(prefix) and k.endswith("-pads-silent")]
    assert silent and all(out[k] for k in silent)


def _assert_cuba(out: dict, devices: tuple[int, ...]) -> None:
    _assert_identical(out, "cuba-", len(devices))
    # Recordings stay sharded along the neuron axis over every device of the mesh.
    for n in devices:
        assert out[f"cuba-{{'neurons': {n}}}-None-run-spec"] == "P(None, 'neurons')"
        assert out[f"cuba-{{'neurons': {n}}}-None-run-ndev"] == n
    # One bit per neuron: 4000 bits on one device; 500 per device in 16 words on 8.
    assert out["cuba-{'neurons': 1}-None-bytes"] == 500
    assert out["cuba-{'neurons': 8}-None-bytes"] == 8 * 16 * 4


def test_sharded_cuba_one_second_identical_on_1_2_4_8_devices():
    """CUBA (4000 neurons, 1 s = 10000 steps of 0.1 ms) on 1, 2, 4 and 8 devices, and a
    network with padding, Poisson sources and delays on 3 and 2x4 devices: spikes identical
    to the unsharded run, bit for bit (COBA is in the slow test below)."""
    devices = (1, 2, 4, 8)
    out = _run_multi_device(
        {"n_steps": 10000, "cuba_devices": devices, "mixed": True, "errors": True}
    )
    assert out["cuba-counts"]["E"] > 10000
    _assert_cuba(out, devices)
    counts = out["mixed-counts"]
    assert min(counts.values()) > 100, counts
    _assert_identical(out, "mixed-", 4)
    assert out["merged-synapse-of"] == [0, 1, 2, 2]  # E->E shares I->E's columns
    assert min(out["merged-counts"].values()) > 100, out["merged-counts"]
    _assert_identical(out, "merged-", 1)
    assert out["mixed-{'a': 2, 'b': 4}-b-run-spec"] == "P(None, 'b')"
    assert out["mixed-{'a': 2, 'b': 4}-None-run-spec"] == "P(None, ('a', 'b'))"
    assert (
        "8 devices along ('neurons',) do not fit population(s) {'I': 5}"
        in (out["too-many-devices"])
    )
    assert "use a mesh of at most 5 devices" in out["too-many-devices"]
    assert "the state does not fit this sharded network" in out["state-of-4-on-8"]


@pytest.mark.slow
def test_sharded_coba_one_second_identical_on_1_2_4_8_devices():
    """COBA (conductance synapses, forward Euler) over 1 s on 1, 2, 4 and 8 devices."""
    devices = (1, 2, 4, 8)
    out = _run_multi_device({"n_steps": 10000, "coba": True, "coba_devices": devices})
    assert out["coba-counts"]["E"] > 10000
    _assert_identical(out, "coba-", len(devices))
    for n in devices:
        assert out[f"coba-{{'neurons': {n}}}-None-run-ndev"] == n
