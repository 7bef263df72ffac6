"""Checkpoints of sharded and multi-process states: `nj.save` / `nj.load` of a directory
(orbax-checkpoint underneath).

- In this process (one device): the directory layout chosen with `sharded=True` holds the
  same trees as the single file (models, states with typed PRNG keys, NumPy leaves, Python
  scalars, weakly typed leaves) and keeps its guarantees: a resumed run equals the
  uninterrupted one bit for bit; a save interrupted before its commit leaves the previous
  checkpoint readable; a damaged array or header fails with a `ValueError` naming the leaf;
  `like` is checked before anything is read; every bad argument fails before any work.
- Across processes (started as in `test_parallel_multihost.py`: local processes joined by
  `jax.distributed`, gloo collectives, 2 processes x 2 CPU devices): a
  `nj.parallel.shard_network` state on the global mesh is saved by every process (each its
  own shards), loaded back, and the resumed run equals the single-process uninterrupted run
  bit for bit; loaded onto another layout (every array replicated) it holds the same values.
  The state's arrays span both processes, so the single-file layout cannot hold them and
  `sharded=False` is refused.
"""

import base64
import json
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

pytest.importorskip("orbax.checkpoint")

ROOT = Path(__file__).resolve().parents[1]


def _same(a, b):
    """Bit equality of two trees of arrays (keys by their data), with equal leaf types."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jr.key_impl(x) == jr.key_impl(y)
            x, y = jr.key_data(x), jr.key_data(y)
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            assert np.asarray(x).dtype == np.asarray(y).dtype
            assert getattr(x, "weak_type", False) == getattr(y, "weak_type", False)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert x == y


@pytest.fixture(scope="module")
def run():
    net, state = nj.models.cuba(jr.key(0), n_exc=80, n_inh=20, p=0.1)
    mid, _ = nj.simulate(net, state, dt=0.1, n_steps=200)
    return net, state, mid


def _tree(net, state):
    return {
        "net": net,
        "state": state,
        "t_ms": 20.0,
        "step": 200,
        "label": "cuba",
        "host": np.arange(4, dtype=np.float64) / 3,
        "scale": np.float32(0.5),
        "weak": jnp.asarray(1.5),
        "key": jr.key(7),
        "raw_key": jr.PRNGKey(3),
        "none": None,
    }


def test_round_trip_and_resume_equal_uninterrupted(run, tmp_path):
    net, state, mid = run
    path = tmp_path / "ckpt"
    tree = _tree(net, mid)
    nj.save(path, tree, sharded=True)
    assert path.is_dir() and (path / "neurojax_checkpoint.json").is_file()
    header = json.loads((path / "neurojax_checkpoint.json").read_text())
    assert header["layout"] == "sharded" and header["format"] == "neurojax-checkpoint"
    back = nj.load(path, _tree(net, state))
    _same(back, tree)
    assert back["label"] == "cuba" and back["none"] is None
    _, want = nj.simulate(net, mid, dt=0.1, n_steps=200)
    _, got = nj.simulate(back["net"], back["state"], dt=0.1, n_steps=200)
    for name in want.spikes:
        np.testing.assert_array_equal(np.asarray(got.spikes[name]), np.asarray(want.spikes[name]))
    np.testing.assert_array_equal(np.asarray(got.t), np.asarray(want.t))
    # Abstract leaves work as `like` too (placed on the default device).
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x,
        _tree(net, state),
    )
    _same(nj.load(path, abstract)["state"], mid)


def test_replacing_a_checkpoint_keeps_one_data_directory(run, tmp_path):
    net, state, mid = run
    path = tmp_path / "ckpt"
    nj.save(path, {"state": state}, sharded=True)
    nj.save(path, {"state": mid}, sharded=True)
    assert len([p for p in path.iterdir() if p.name.startswith("data-")]) == 1
    _same(nj.load(path, {"state": state})["state"], mid)


def test_interrupted_save_leaves_the_previous_checkpoint(run, tmp_path, monkeypatch):
    """A save that dies after writing its arrays but before its header commit."""
    import orbax.checkpoint as ocp

    net, state, mid = run
    path = tmp_path / "ckpt"
    nj.save(path, {"state": state}, sharded=True)
    real_save = ocp.PyTreeCheckpointer.save

    def crash(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        nj.save(path, {"state": mid}, sharded=True)
    monkeypatch.undo()
    _same(nj.load(path, {"state": state})["state"], state)
    # The next save removes what the interrupted one left.
    nj.save(path, {"state": mid}, sharded=True)
    assert len([p for p in path.iterdir() if p.name.startswith("data-")]) == 1
    _same(nj.load(path, {"state": state})["state"], mid)


def test_what_killed_saves_left_is_removed_when_the_next_save_starts(run, tmp_path, monkeypatch):
    """A save killed inside orbax's write leaves its `*.orbax-checkpoint-tmp*` folder (about
    0.5 GB for a large state); one killed after the write, a data folder no header names.
    The next save removes both before it writes anything, and keeps the committed data."""
    import orbax.checkpoint as ocp

    net, state, mid = run
    path = tmp_path / "ckpt"
    nj.save(path, {"state": state}, sharded=True)
    committed = json.loads((path / "neurojax_checkpoint.json").read_text())["data"]
    real_save = ocp.PyTreeCheckpointer.save

    def killed_in_write(self, directory, *args, **kwargs):
        tmp = directory.parent / f"{directory.name}.orbax-checkpoint-tmp-1700000000"
        (tmp / "d").mkdir(parents=True)
        (tmp / "d" / "shard").write_bytes(b"\0" * 4096)
        raise KeyboardInterrupt("kill -9 during the write")

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "save", killed_in_write)
    with pytest.raises(KeyboardInterrupt):
        nj.save(path, {"state": mid}, sharded=True)
    (path / "data-00000000deadbeef").mkdir()  # complete data of a save killed before commit
    leftovers = sorted(p.name for p in path.iterdir() if p.name != committed)
    assert len(leftovers) == 3 and any("orbax-checkpoint-tmp" in n for n in leftovers)
    seen = []

    def check_then_write(self, directory, *args, **kwargs):
        seen.append(sorted(p.name for p in path.iterdir()))
        return real_save(self, directory, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "save", check_then_write)
    nj.save(path, {"state": mid}, sharded=True)
    # At the start of the write, only the header and the committed data were left.
    assert seen == [sorted([committed, "neurojax_checkpoint.json"])]
    assert len([p for p in path.iterdir() if p.name.startswith("data-")]) == 1
    _same(nj.load(path, {"state": state})["state"], mid)


# When tensorstore fails to read a damaged file, orbax 0.12.8 leaves coroutines of the
# failed read unawaited; Python reports them when they are collected. The ValueError of
# `load` is what the test checks.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_checkpoints_are_refused(run, tmp_path):
    net, state, mid = run
    path = tmp_path / "ckpt"
    nj.save(path, {"state": mid}, sharded=True)
    header_file = path / "neurojax_checkpoint.json"
    header = json.loads(header_file.read_text())
    leaf = next(s for s in header["leaves"] if s["path"] == "['state'].populations['E'].v")
    good = leaf["digest"]
    leaf["digest"] = "0123456789abcdef"
    header_file.write_text(json.dumps(header))
    with pytest.raises(
        ValueError,
        match=r"load: cannot read checkpoint .*: the values of leaf \['state'\]\.populations\['E'\]\.v do not match their checksum",
    ):
        nj.load(path, {"state": state})
    leaf["digest"] = good
    header_file.write_text(json.dumps(header)[:-40])
    with pytest.raises(ValueError, match=r"load: cannot read checkpoint .*: its header is damaged"):
        nj.load(path, {"state": state})
    header_file.write_text(json.dumps(header))
    _same(nj.load(path, {"state": state})["state"], mid)
    # Damaged array files: every byte of the stored chunks flipped.
    data = path / header["data"]
    chunks = [f for f in data.rglob("*") if f.is_file() and f.parent.name == "d"]
    assert chunks
    for f in chunks:
        raw = bytearray(f.read_bytes())
        f.write_bytes(bytes(b ^ 0xFF for b in raw))
    with pytest.raises(
        ValueError, match=r"load: cannot read checkpoint .*(damaged|do not match their checksum)"
    ):
        nj.load(path, {"state": state})
    import shutil

    shutil.rmtree(data)
    with pytest.raises(
        ValueError,
        match=r"load: cannot read checkpoint .*: its data directory 'data-[0-9a-f]+' is missing",
    ):
        nj.load(path, {"state": state})


def test_like_is_checked_before_reading(run, tmp_path):
    net, state, mid = run
    path = tmp_path / "ckpt"
    nj.save(path, {"state": mid, "t_ms": 20.0}, sharded=True)
    _, small_state = nj.models.cuba(jr.key(0), n_exc=40, n_inh=10, p=0.1)
    with pytest.raises(
        ValueError,
        match=r"load: like does not match the checkpoint .* at \['state'\]\.populations\['E'\]\.v: the checkpoint has shape \(80,\), like \(40,\)",
    ):
        nj.load(path, {"state": small_state, "t_ms": 20.0})
    with pytest.raises(
        ValueError,
        match=r"load: like does not match the checkpoint .* at \['t_ms'\]: the checkpoint has a Python float, like a Python int",
    ):
        nj.load(path, {"state": state, "t_ms": 20})
    with pytest.raises(
        ValueError,
        match=r"like does not match .*parts of the checkpoint missing from like: \['t_ms'\]",
    ):
        nj.load(path, {"state": state})


def test_argument_errors_before_any_work(run, tmp_path, monkeypatch):
    net, state, _ = run
    with pytest.raises(TypeError, match=r"save: sharded must be None, True or False, got 'yes'"):
        nj.save(tmp_path / "a", {"s": state}, sharded="yes")
    (tmp_path / "file.nj").write_bytes(b"x")
    with pytest.raises(
        FileExistsError,
        match=r"save: path .*file.nj' is a file .*a sharded checkpoint is a directory",
    ):
        nj.save(tmp_path / "file.nj", {"s": state}, sharded=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(
        FileExistsError,
        match=r"save: path .*other' is a directory that is not a neurojax checkpoint",
    ):
        nj.save(tmp_path / "other", {"s": state}, sharded=True)
    with pytest.raises(FileNotFoundError, match=r"save: the directory .*missing.* does not exist"):
        nj.save(tmp_path / "missing" / "ckpt", {"s": state}, sharded=True)
    with pytest.raises(
        TypeError,
        match=r"save: leaf \['names'\] has dtype <U1; the sharded checkpoint layout stores bool, integer, float and complex arrays only",
    ):
        nj.save(tmp_path / "s", {"names": np.array(["a", "b"])}, sharded=True)
    with pytest.raises(TypeError, match=r"save: leaf \['x'\] is a jax.ShapeDtypeStruct"):
        nj.save(tmp_path / "s", {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}, sharded=True)
    with pytest.raises(
        ValueError, match=r"load: cannot read checkpoint .*other'.*without neurojax_checkpoint.json"
    ):
        nj.load(tmp_path / "other", {"s": state})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.nj", "other"]
    # Without orbax-checkpoint: a message naming the extra, and nothing written.
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    with pytest.raises(
        ImportError,
        match=r"save: checkpoints of sharded or multi-process states need the optional package 'orbax-checkpoint'.*pip install 'neurojax\[orbax\]'",
    ):
        nj.save(tmp_path / "ckpt", {"s": state}, sharded=True)
    assert not (tmp_path / "ckpt").exists()
    # The single-file layout does not need it.
    nj.save(tmp_path / "one.nj", {"s": state})
    assert (tmp_path / "one.nj").is_file()


def test_empty_arrays_other_dtypes_and_trees_without_arrays(tmp_path):
    """orbax stores no array without elements: the header alone describes them."""
    tree = {
        "empty": jnp.zeros((0, 3)),
        "empty_host": np.zeros((2, 0), np.int16),
        "bf16": jnp.arange(5).astype(jnp.bfloat16),
        "c64": jnp.array([1 + 2j, -3j], jnp.complex64),
        "i8": np.arange(-2, 3, dtype=np.int8),
        "flags": jnp.array([True, False]),
        "keys": jr.split(jr.key(0), 3),
    }
    nj.save(tmp_path / "a", tree, sharded=True)
    _same(nj.load(tmp_path / "a", tree), tree)
    scalars = {"t_ms": 1.5, "name": "run", "n": 3, "z": 1 - 2j, "empty": np.zeros(0)}
    nj.save(tmp_path / "b", scalars, sharded=True)
    _same(
        nj.load(tmp_path / "b", {"t_ms": 0.0, "name": "", "n": 0, "z": 0j, "empty": np.zeros(0)}),
        scalars,
    )


def test_checksum_is_the_same_for_numpy_and_jax_arrays():
    from neurojax._sharded_io import digest

    rng = np.random.default_rng(0)
    for a in (
        rng.normal(size=(3, 5)).astype(np.float32),
        rng.normal(size=7).astype(np.float16),
        rng.integers(-100, 100, size=9).astype(np.int8),
        rng.integers(0, 2**32 - 1, size=(4, 2), dtype=np.uint32),
        rng.random(11) > 0.5,
        np.zeros(0, np.float32),
    ):
        assert digest(a) == digest(jnp.asarray(a)), a.dtype
    a = np.arange(6, dtype=np.float32)
    b = a.copy()
    b[3] = np.nextafter(b[3], np.float32(10))  # one bit differs
    assert digest(a) != digest(b) and digest(a) != digest(a[::-1].copy())


# ---------------------------------------------------------------------- across processes

_WORKER = textwrap.dedent(
    """
    import base64, json, sys
    import numpy as np
    import neurojax as nj
    from neurojax.parallel import gather_to_host, global_mesh, initialize

    pid, nproc, port, ndev, ckpt = sys.argv[1:6]
    pid, nproc, port, ndev = int(pid), int(nproc), int(port), int(ndev)
    initialize(f"127.0.0.1:{port}", nproc, pid, local_device_count=ndev, timeout_s=60)
    import jax, jax.random as jr

    def b64(x):
        return base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()

    out = {}
    net, state = nj.models.cuba(jr.key(0), n_exc=400, n_inh=100, p=0.05, method="event")
    sharded = nj.parallel.shard_network(net, global_mesh("neurons"))
    mid, _ = sharded.run(sharded.shard_state(state), dt=0.1, n_steps=300)
    out["addressable"] = bool(all(x.is_fully_addressable for x in jax.tree.leaves(mid)
                                  if isinstance(x, jax.Array)))
    nj.save(ckpt, {"state": mid, "t_ms": 30.0})          # every process, its own shards
    like = {"state": sharded.shard_state(state), "t_ms": 0.0}
    back = nj.load(ckpt, like)
    same = []
    for a, b in zip(jax.tree.leaves(mid), jax.tree.leaves(back["state"])):
        if jax.numpy.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jr.key_data(a), jr.key_data(b)
        same.append(bool(a.sharding.is_equivalent_to(b.sharding, a.ndim)))
    out["same_sharding"] = all(same)
    out["t_ms"] = back["t_ms"]
    final, rec = sharded.run(back["state"], dt=0.1, n_steps=300)
    spikes = gather_to_host(rec.spikes)
    spikes = {k: s[:, : sharded.size(k)] for k, s in spikes.items()}
    out["spikes"] = {k: b64(np.packbits(s, axis=1)) for k, s in spikes.items()}
    out["shape"] = {k: list(s.shape) for k, s in spikes.items()}
    # Read onto another layout: every array replicated on every device of the mesh.
    from jax.sharding import NamedSharding, PartitionSpec as P
    everywhere = NamedSharding(global_mesh("neurons"), P())
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=everywhere), like["state"]
    )
    replicated = nj.load(ckpt, {"state": abstract, "t_ms": 0.0})["state"]
    out["replicated"] = all(
        x.sharding.is_fully_replicated for x in jax.tree.leaves(replicated)
    )
    def host(tree):
        return [np.asarray(jr.key_data(x) if jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)
                           else x) for x in jax.tree.leaves(gather_to_host(tree))]
    out["replicated_equal"] = all(
        np.array_equal(a, b) for a, b in zip(host(mid), host(replicated))
    )
    try:
        nj.save(ckpt + "-file", {"state": mid}, sharded=False)
        out["file_refused"] = "no error"
    except ValueError as err:
        out["file_refused"] = str(err)
    try:
        small = nj.models.cuba(jr.key(0), n_exc=40, n_inh=10, p=0.05, method="event")[1]
        nj.load(ckpt, {"state": small, "t_ms": 0.0})
        out["mismatch"] = "no error"
    except ValueError as err:
        out["mismatch"] = str(err)
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_two_processes_save_and_resume_equal_single_process(tmp_path):
    from test_parallel_multihost import _child_env, _free_port

    ckpt = tmp_path / "ckpt"
    port, nproc, ndev = _free_port(), 2, 2
    procs, files = [], []
    try:
        for pid in range(nproc):
            stdout = open(tmp_path / f"out{pid}.txt", "w")
            stderr = open(tmp_path / f"err{pid}.txt", "w")
            files += [stdout, stderr]
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _WORKER,
                        str(pid),
                        str(nproc),
                        str(port),
                        str(ndev),
                        str(ckpt),
                    ],
                    cwd=ROOT,
                    env=_child_env(ndev),
                    stdout=stdout,
                    stderr=stderr,
                    stdin=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 240
        for pid, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                err = (tmp_path / f"err{pid}.txt").read_text()[-2000:]
                pytest.fail(f"process {pid} still running after 240 s:\n{err}")
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
        line = [
            ln
            for ln in (tmp_path / f"out{pid}.txt").read_text().splitlines()
            if ln.startswith("RESULT ")
        ][-1]
        results.append(json.loads(line[len("RESULT ") :]))
    # The reference: one uninterrupted single-process run of 600 steps.
    with jax.default_device(jax.devices("cpu")[0]):
        net, state = nj.models.cuba(jr.key(0), n_exc=400, n_inh=100, p=0.05, method="event")
        _, rec = nj.simulate(net, state, dt=0.1, n_steps=600)
        want = {k: np.asarray(v)[300:] for k, v in rec.spikes.items()}
    assert want["E"].sum() > 50
    header = json.loads((ckpt / "neurojax_checkpoint.json").read_text())
    assert header["layout"] == "sharded" and header["process_count"] == 2
    for pid, out in enumerate(results):
        assert out["addressable"] is False  # the state spans both processes
        assert out["same_sharding"] and out["t_ms"] == 30.0
        for name, w in want.items():
            assert out["shape"][name] == list(w.shape)
            packed = np.frombuffer(base64.b64decode(out["spikes"][name]), np.uint8)
            got = np.unpackbits(packed.reshape(w.shape[0], -1), axis=1, count=w.shape[1])
            rows = np.nonzero((got.astype(bool) != w).any(axis=1))[0]
            assert rows.size == 0, f"process {pid}, {name}: first differing step {rows[:1]}"
        assert "like does not match the checkpoint" in out["mismatch"], out["mismatch"]
        assert out["replicated"] and out["replicated_equal"]
        assert "sharded=False writes one file from this process, but leaf" in out["file_refused"]
    assert not (tmp_path / "ckpt-file").exists()
