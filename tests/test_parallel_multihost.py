"""Multi-process runs with `jax.distributed`: several local processes, gloo collectives.

The test starts the processes itself (`subprocess.Popen`, one per `process_id`), with the
coordinator on `127.0.0.1` at a free port, each process exposing `ndev` CPU devices; the mesh
spans all processes' devices. Every process runs

- `nj.parallel.sweep` of a LIF simulation over 8 currents, `mesh` = the global mesh,
  `to_host=False`, read back with `gather_to_host`; and a sweep over PRNG keys made global
  first (typed keys cannot go through `device_put` onto devices of other processes);
- `nj.parallel.shard_network` of a 500-neuron CUBA network (the test network of
  `test_parallel_shard.py`), 1000 steps, spikes and final state gathered to the host;

and prints one JSON line. The test process computes the single-process references (a Python
loop over single `nj.simulate` runs, the unsharded `nj.simulate(network, ...)`) and requires
equality bit for bit on every process. The processes are always killed in a `finally`.
"""

import base64
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax.parallel import gather_to_host, global_mesh, initialize

ROOT = Path(__file__).resolve().parents[1]
N_STEPS = 1000

_WORKER = textwrap.dedent(
    """
    import base64, json, sys, time
    import numpy as np
    import neurojax as nj
    from neurojax.parallel import gather_to_host, global_mesh, initialize

    pid, nproc, port, ndev, n_steps = (int(a) for a in sys.argv[1:6])
    t0 = time.perf_counter()
    info = initialize(f"127.0.0.1:{port}", nproc, pid, local_device_count=ndev, timeout_s=60)
    import jax, jax.numpy as jnp, jax.random as jr
    from jax.sharding import NamedSharding, PartitionSpec as P

    jax.config.update("jax_numpy_dtype_promotion", "strict")
    out = {"info": info, "init_s": time.perf_counter() - t0}

    def b64(x):
        return base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()

    # 1. a sharded sweep over the global mesh
    t = time.perf_counter()
    mesh = global_mesh("trials")
    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=1.0)

    def rate(current):
        final, rec = nj.simulate(lif, lif.init_state(2), current, dt=0.1, n_steps=1000)
        return {"count": rec.spikes.sum(0), "v": final.v}

    cur = jnp.stack([jnp.linspace(0.3, 1.0, 8), jnp.linspace(1.0, 0.3, 8)], axis=1)
    got = nj.parallel.sweep(rate, cur, mesh=mesh, to_host=False)
    out["sweep_spec"] = str(got["v"].sharding.spec)
    out["sweep_addressable"] = bool(got["v"].is_fully_addressable)
    host = gather_to_host(got)
    out["sweep_count"] = host["count"].tolist()
    out["sweep_v"] = b64(host["v"])
    keys = jr.split(jr.key(0), 8)
    keys = jax.make_array_from_callback(keys.shape, NamedSharding(mesh, P("trials")),
                                        lambda index: keys[index])
    normal = nj.parallel.sweep(lambda k: jr.normal(k, (2,)), keys, mesh=mesh, to_host=False)
    out["sweep_keys"] = b64(gather_to_host(normal))
    out["sweep_s"] = time.perf_counter() - t

    # 2. one network sharded along the neuron axis over the global mesh
    t = time.perf_counter()
    net, state = nj.models.cuba(jr.key(0), n_exc=400, n_inh=100, p=0.05, method="event")
    sharded = nj.parallel.shard_network(net, global_mesh("neurons"))
    s0 = sharded.shard_state(state)
    out["shard_s"] = time.perf_counter() - t
    t = time.perf_counter()
    final, rec = sharded.run(s0, dt=0.1, n_steps=n_steps)
    jax.block_until_ready(rec.spikes)
    out["run_s"] = time.perf_counter() - t
    out["net_spec"] = str(rec.spikes["E"].sharding.spec)
    out["net_addressable"] = bool(rec.spikes["E"].is_fully_addressable)
    out["net_local_shards"] = len(rec.spikes["E"].addressable_shards)
    spikes = gather_to_host(rec.spikes)
    out["pads_silent"] = all(not spikes[k][:, sharded.size(k):].any() for k in spikes)
    spikes = {k: v[:, : sharded.size(k)] for k, v in spikes.items()}
    out["net_shape"] = {k: list(v.shape) for k, v in spikes.items()}
    out["net_spikes"] = {k: b64(np.packbits(v, axis=1)) for k, v in spikes.items()}
    back = sharded.unshard_state(gather_to_host(final))
    out["net_final_v"] = {k: b64(np.asarray(p.v)) for k, p in back.populations.items()}
    out["exchange_nbytes"] = sharded.exchange_nbytes
    out["total_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(ndev: int) -> dict[str, str]:
    env = dict(os.environ)
    # gRPC (the coordinator) honours proxy variables; loopback traffic must not use one.
    for name in [n for n in env if "_proxy" in n.lower()]:
        del env[name]
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ndev}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _launch(nproc: int, ndev: int, tmp_path: Path, timeout_s: float) -> list[dict]:
    """Run the worker as processes 0..nproc-1; return each one's JSON result, in order."""
    port = _free_port()
    procs, files = [], []
    deadline = time.monotonic() + timeout_s
    try:
        for pid in range(nproc):
            # Files, not pipes: a process blocked on a full pipe would stall the whole job.
            stdout = open(tmp_path / f"out{pid}.txt", "w")
            stderr = open(tmp_path / f"err{pid}.txt", "w")
            files += [stdout, stderr]
            args = [str(a) for a in (pid, nproc, port, ndev, N_STEPS)]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _WORKER, *args],
                    cwd=ROOT,
                    env=_child_env(ndev),
                    stdout=stdout,
                    stderr=stderr,
                    stdin=subprocess.DEVNULL,
                )
            )
        for pid, proc in enumerate(procs):
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                err = (tmp_path / f"err{pid}.txt").read_text()[-2000:]
                pytest.fail(f"process {pid} of {nproc} still running after {timeout_s} s:\n{err}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        for f in files:
            f.close()
    results = []
    for pid, proc in enumerate(procs):
        err = (tmp_path / f"err{pid}.txt").read_text()
        assert proc.returncode == 0, f"process {pid}: exit {proc.returncode}\n{err[-3000:]}"
        lines = (tmp_path / f"out{pid}.txt").read_text().splitlines()
        line = [ln for ln in lines if ln.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def _bits(s: str, dtype, shape=None) -> np.ndarray:
    x = np.frombuffer(base64.b64decode(s), dtype=dtype)
    return x.reshape(shape) if shape is not None else x


def _reference() -> dict:
    """The single-process results the processes must reproduce bit for bit."""
    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=1.0)
    cur = jnp.stack([jnp.linspace(0.3, 1.0, 8), jnp.linspace(1.0, 0.3, 8)], axis=1)
    counts, vs = [], []
    for c in cur:  # single runs, no vmap
        final, rec = nj.simulate(lif, lif.init_state(2), c, dt=0.1, n_steps=1000)
        counts.append(np.asarray(rec.spikes.sum(0)))
        vs.append(np.asarray(final.v))
    keys = jr.split(jr.key(0), 8)
    normal = np.stack([np.asarray(jr.normal(k, (2,))) for k in keys])
    net, state = nj.models.cuba(jr.key(0), n_exc=400, n_inh=100, p=0.05, method="event")
    final, rec = nj.simulate(net, state, dt=0.1, n_steps=N_STEPS)
    return {
        "count": np.stack(counts),
        "v": np.stack(vs),
        "keys": normal,
        "spikes": {k: np.asarray(v) for k, v in rec.spikes.items()},
        "final_v": {k: np.asarray(p.v) for k, p in final.populations.items()},
    }


@pytest.fixture(scope="module")
def reference() -> dict:
    # The processes run on CPU devices; bit equality holds against the CPU backend.
    with jax.default_device(jax.devices("cpu")[0]):
        return _reference()


def _check(results: list[dict], ref: dict, nproc: int, ndev: int) -> None:
    assert ref["spikes"]["E"].sum() > 100  # the network is active
    for pid, out in enumerate(results):
        info = out["info"]
        assert info == {
            "process_id": pid,
            "num_processes": nproc,
            "platform": "cpu",
            "local_devices": ndev,
            "global_devices": nproc * ndev,
            "cpu_collectives": "gloo",
            "gloo_host": "127.0.0.1",  # pinned to the loopback, like the coordinator
        }
        # Sweep: sharded over every process's devices, equal to single runs bit for bit.
        assert out["sweep_spec"] == "P('trials', None)"
        assert out["sweep_addressable"] is (nproc == 1)
        np.testing.assert_array_equal(np.array(out["sweep_count"]), ref["count"])
        v = _bits(out["sweep_v"], np.float32, ref["v"].shape)
        np.testing.assert_array_equal(v.view(np.uint32), ref["v"].view(np.uint32))
        keys = _bits(out["sweep_keys"], np.float32, ref["keys"].shape)
        np.testing.assert_array_equal(keys.view(np.uint32), ref["keys"].view(np.uint32))
        # Network: recordings sharded over all devices, each process holding its own.
        assert out["net_spec"] == "P(None, 'neurons')"
        assert out["net_addressable"] is (nproc == 1)
        assert out["net_local_shards"] == ndev
        assert out["pads_silent"]
        for name, want in ref["spikes"].items():
            assert out["net_shape"][name] == list(want.shape)
            packed = _bits(out["net_spikes"][name], np.uint8, (want.shape[0], -1))
            got = np.unpackbits(packed, axis=1, count=want.shape[1]).astype(bool)
            rows = np.nonzero((got != want).any(axis=1))[0]
            assert rows.size == 0, f"process {pid}, {name}: first differing step {rows[:1]}"
            final_v = _bits(out["net_final_v"][name], np.float32)
            np.testing.assert_array_equal(
                final_v.view(np.uint32), ref["final_v"][name].view(np.uint32)
            )


def test_two_processes_two_devices_each_equal_single_process(tmp_path, reference):
    """2 processes x 2 CPU devices: a 4-device global mesh, exchanges within and across
    processes every step."""
    results = _launch(2, 2, tmp_path, timeout_s=120)
    _check(results, reference, nproc=2, ndev=2)
    # 500 neurons on 4 devices: 100 E + 25 I per device in 4 words of 32 bits.
    assert all(out["exchange_nbytes"] == 4 * 4 * 4 for out in results)


@pytest.mark.slow
def test_four_processes_one_device_each_equal_single_process(tmp_path, reference):
    """4 processes x 1 CPU device: every exchange crosses processes (gloo over TCP)."""
    results = _launch(4, 1, tmp_path, timeout_s=240)
    _check(results, reference, nproc=4, ndev=1)


# ---------------------------------------------------------------------- in this process


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("127.0.0.1", 2, 0), {}, r"coordinator_address must be a 'host:port' string"),
        ((1234, 2, 0), {}, r"coordinator_address must be a 'host:port' string, got 1234"),
        (("127.0.0.1:0", 2, 0), {}, r"port in \[1, 65535\], got '127.0.0.1:0'"),
        (("127.0.0.1:x", 2, 0), {}, r"port in \[1, 65535\]"),
        ((":1234", 2, 0), {}, r"'host:port'"),
        (("127.0.0.1:1234", 0, 0), {}, r"num_processes must be an int >= 1, got 0"),
        (("127.0.0.1:1234", 2.0, 0), {}, r"num_processes must be an int >= 1, got 2.0"),
        (("127.0.0.1:1234", 2, -1), {}, r"process_id must be an int >= 0, got -1"),
        (("127.0.0.1:1234", 2, 2), {}, r"process_id must be in \[0, num_processes\) = \[0, 2\)"),
        (("127.0.0.1:1234", 2, True), {}, r"process_id must be an int >= 0, got True"),
        (("127.0.0.1:1234", 2, 0), {"local_device_count": 0}, r"local_device_count must be"),
        (("127.0.0.1:1234", 2, 0), {"timeout_s": 0}, r"timeout_s must be an int >= 1"),
    ],
)
def test_initialize_argument_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        initialize(*args, **kwargs)


def test_initialize_after_the_backend_started_raises_before_any_work():
    jnp.zeros(1).block_until_ready()  # this test process has a running backend
    with pytest.raises(RuntimeError, match="backend has already started"):
        initialize("127.0.0.1:1234", 2, 0)
    assert not jax.distributed.is_initialized()


def test_global_mesh_and_gather_in_one_process():
    mesh = global_mesh("trials")
    assert mesh.axis_names == ("trials",) and mesh.size == jax.device_count()
    with pytest.raises(ValueError, match="axis_name must be a non-empty str, got ''"):
        global_mesh("")
    keys = jr.split(jr.key(1), 3)
    tree = {"a": jnp.arange(3), "b": np.ones(2), "c": 1.5, "k": keys, "s": "label", "n": None}
    host = gather_to_host(tree)
    assert isinstance(host["a"], np.ndarray) and host["a"].tolist() == [0, 1, 2]
    assert isinstance(host["b"], np.ndarray) and isinstance(host["c"], np.ndarray)
    assert host["s"] == "label" and host["n"] is None
    np.testing.assert_array_equal(jr.key_data(host["k"]), jr.key_data(keys))
