"""Fuzzing (issue 28) of the checkpoint reader and of the compiled kernels' inputs.

The reader: arbitrary JSON headers, arbitrary values in the fields of a valid header, and
flipped or removed bytes must give the documented `ValueError` (or, where the change is
harmless, the saved values), never another exception. The kernels: corrupted compressed rows
and columns must give an error naming the corruption, or, where the corruption left valid
arrays, the result of the pure-JAX reference; the slow test runs such cases in a copy of the
kernels built with AddressSanitizer, which aborts at the first access outside an array."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neurojax as nj
from neurojax import kernels

F32 = jnp.float32
HEADER = "neurojax_checkpoint.json"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    tree = {
        "model": nj.LIF(method="exact"),
        "state": nj.LIF().init_state(4),
        "key": jax.random.key(3),
        "step": 7,
        "name": "run",
    }
    path = folder / "c.nj"
    nj.save(path, tree)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    return folder, tree, members


def _write(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _load_or_value_error(path, tree):
    """The documented outcomes only: a ValueError, or the saved tree, value for value."""
    like = jax.tree.map(lambda x: x, tree)
    try:
        out = nj.load(path, like)
    except ValueError as err:
        assert str(err).startswith("load: "), err
        return None
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
        if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return out


@settings(max_examples=60, **SETTINGS)
@given(header=json_values)
def test_any_json_header_gives_the_documented_error(saved, header):
    folder, tree, members = saved
    path = folder / "h.nj"
    _write(path, {**members, HEADER: json.dumps(header).encode()})
    assert _load_or_value_error(path, tree) is None


@settings(max_examples=120, **SETTINGS)
@given(data=st.data())
def test_any_value_in_any_header_field_gives_the_error_or_the_saved_tree(saved, data):
    folder, tree, members = saved
    header = json.loads(members[HEADER])
    # One field of the header, of a leaf, or of the static configuration, set to anything.
    where = data.draw(st.sampled_from(["top", "leaf", "static"]))
    value = data.draw(json_values)
    if where == "top":
        header[data.draw(st.sampled_from(sorted(header)))] = value
    elif where == "leaf":
        spec = data.draw(st.sampled_from(header["leaves"]))
        spec[data.draw(st.sampled_from(sorted(spec) + ["extra"]))] = value
    else:
        node = data.draw(st.sampled_from(sorted(header["static"])))
        header["static"][node][data.draw(st.sampled_from(sorted(header["static"][node])))] = value
    path = folder / "f.nj"
    _write(path, {**members, HEADER: json.dumps(header).encode()})
    _load_or_value_error(path, tree)


@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_flipped_truncated_or_removed_bytes_give_the_error_or_the_saved_tree(saved, data):
    folder, tree, members = saved
    raw = bytearray((folder / "c.nj").read_bytes())
    action = data.draw(st.sampled_from(["flip", "truncate", "remove"]))
    if action == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif action == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + raw[i + data.draw(st.integers(1, 64)) :]
    path = folder / "b.nj"
    path.write_bytes(bytes(raw))
    _load_or_value_error(path, tree)


# ------------------------------------------------------------------ the kernels' inputs


def _network(plastic):
    conn = nj.connect.fixed_prob(jax.random.key(1), 16, 16, 0.3, weight=0.5 if plastic else 4.0)
    proj = nj.Projection(
        "A", "A", conn, delay=0.5, method="event", plasticity=nj.STDP() if plastic else None
    )
    return nj.Network({"A": (nj.LIF(), 16)}, [proj], inputs={"A": 20.0}, dt=0.1)


NETS = {False: _network(False), True: _network(True)}
FIELDS = {
    False: ["indptr", "indices"],
    True: ["indptr", "indices", "col_ptr", "col_syn", "col_pre"],
}


def _run(net, state):
    # 60 steps in a jitted scan by hand, with the library's model checks off (`checked_run`):
    # nj.simulate's start check and Network.step's own check refuse the edited layouts before
    # the kernels see them, and this module fuzzes the kernels themselves
    from neurojax.network._checks import checked_run

    def run(n, s):
        return jax.lax.scan(lambda st, _: n.step(st, None, 0.1), s, None, length=60)[1]["A"]

    with checked_run():
        return eqx.filter_jit(run)(net, state)


@pytest.mark.slow
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_kernels_report_corrupted_connectivity_or_match_the_reference(data):
    plastic = data.draw(st.booleans())
    net = NETS[plastic]
    field = data.draw(st.sampled_from(FIELDS[plastic]))
    arr = np.asarray(getattr(net.projections[0].layout, field)).copy()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, arr.size - 1))
        arr[i] = data.draw(st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 60))
    bad = eqx.tree_at(
        lambda m: getattr(m.projections[0].layout, field), net, jnp.asarray(arr, jnp.int32)
    )
    state = net.init_state(jax.random.key(0))
    try:
        out = np.asarray(_run(bad, state))
    except Exception as err:  # noqa: BLE001  (the FFI error surfaces as JAX's runtime error)
        assert "corrupted connectivity" in str(err), err
        return
    # Nothing reported: every index the run touched was inside its array. If the layout is
    # still a valid one (as `Projection` and `load` check), both paths must agree; an
    # in-bounds but inconsistent layout (rows that no longer match the columns or the widest
    # row) is what those checks refuse, and the kernels only promise not to touch memory
    # outside their arrays for it.
    try:
        bad.projections[0].layout.check_invariants("fuzz")
    except ValueError:
        return
    with kernels.use("reference"):
        ref = np.asarray(_run(bad, state))
    np.testing.assert_array_equal(out, ref)


ASAN_SCRIPT = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp, equinox as eqx
    import neurojax as nj
    rng = np.random.default_rng(0)
    for plastic in (False, True):
        conn = nj.connect.fixed_prob(jax.random.key(1), 16, 16, 0.3, weight=0.5)
        proj = nj.Projection(
        "A", "A", conn, delay=0.5, method="event", plasticity=nj.STDP() if plastic else None
    )
        net = nj.Network({"A": (nj.LIF(), 16)}, [proj], inputs={"A": 20.0}, dt=0.1)
        state = net.init_state(jax.random.key(0))
        # steps by hand with the model checks off: nj.simulate's start check and
        # Network.step's own check would refuse the edits before the kernels
        from neurojax.network._checks import checked_run
        _run = eqx.filter_jit(lambda n, s: jax.lax.scan(
            lambda st, _: n.step(st, None, 0.1), s, None, length=60)[1]["A"])
        def run(n, s):
            with checked_run():
                return _run(n, s)
        fields = ["indptr", "indices"] + (["col_ptr", "col_syn", "col_pre"] if plastic else [])
        errors = 0
        for case in range(60):
            field = fields[case % len(fields)]
            arr = np.asarray(getattr(net.projections[0].layout, field)).copy()
            arr[rng.integers(arr.size)] = rng.choice([-(2**31), -1, 10**6, 2**31 - 1, 17, 64])
            bad = eqx.tree_at(lambda m: getattr(m.projections[0].layout, field), net,
                              jnp.asarray(arr, jnp.int32))
            try:
                np.asarray(run(bad, state))
            except Exception as err:
                assert "corrupted connectivity" in str(err), err
                errors += 1
        assert errors > 10, errors  # only the kernel reports this: it ran
        # Wrapped (negative) step counters stay inside the ring.
        s = eqx.tree_at(lambda s: s.step, state, jnp.int32(-(2**31) + 1))
        for _ in range(5):
            s, _ = eqx.filter_jit(lambda st: net.step(st, None, 0.1))(s)
        jax.block_until_ready(s)
    print("ASAN-FUZZ-DONE")
    """
)


@pytest.mark.slow
def test_kernel_fuzz_cases_under_address_sanitizer(tmp_path):
    from neurojax.kernels import _build

    cxx = _build._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    runtime = subprocess.run(
        [cxx, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"{cxx} has no AddressSanitizer runtime")
    env = {**os.environ, "NEUROJAX_CACHE_DIR": str(tmp_path / "cache"), "NEUROJAX_CPU_KERNEL": "1"}
    (tmp_path / "cache").mkdir(mode=0o700)
    # The library under the name the child process will look for, built with ASan.
    old = os.environ.get("NEUROJAX_CACHE_DIR")
    os.environ["NEUROJAX_CACHE_DIR"] = env["NEUROJAX_CACHE_DIR"]
    try:
        out = _build.library_path()
    finally:
        if old is None:
            del os.environ["NEUROJAX_CACHE_DIR"]
        else:
            os.environ["NEUROJAX_CACHE_DIR"] = old
    _build.compile_library(out, ("-fsanitize=address", "-fno-omit-frame-pointer", "-g"))
    # libstdc++ with the runtime: jaxlib throws C++ exceptions, and ASan's interceptor of
    # __cxa_throw needs the real one loaded when it starts.
    stdcxx = subprocess.run(
        [cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True
    ).stdout.strip()
    env.update(
        LD_PRELOAD=f"{runtime}:{stdcxx}" if os.path.isabs(stdcxx) else runtime,
        # Python and XLA leak by design at exit; only invalid accesses matter here.
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        PYTHONPATH=os.getcwd(),
    )
    proc = subprocess.run(
        [sys.executable, "-c", ASAN_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0 and "ASAN-FUZZ-DONE" in proc.stdout, proc.stderr[-4000:]
