"""Reliability (issue 28): memory-safe kernels, verified loads, a clock that cannot wrap,
no silent wrong result, checkpoints that keep their configuration, early size checks and a
private kernel cache. Each test failed before the change it covers."""

import os
import stat
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse

import neurojax as nj
from neurojax import kernels

F32 = jnp.float32
KEY = jax.random.key(0)


def _net(method="event", delay=1.0, plastic=False, n=20):
    conn = nj.connect.fixed_prob(jax.random.key(1), n, n, 0.3, weight=0.5 if plastic else 4.0)
    proj = nj.Projection(
        "A", "A", conn, method=method, delay=delay, plasticity=nj.STDP() if plastic else None
    )
    return nj.Network({"A": (nj.LIF(), n)}, [proj], inputs={"A": 20.0}, dt=0.1)


def _corrupt(net, field, value_fn):
    return eqx.tree_at(
        lambda m: getattr(m.projections[0].layout, field),
        net,
        value_fn(getattr(net.projections[0].layout, field)),
    )


# ------------------------------------------------------------------ 1. memory-safe kernels

CORRUPTIONS = [
    ("indices", lambda a: a.at[3].set(10**6), "postsynaptic index outside"),
    ("indices", lambda a: a.at[0].set(-5), "postsynaptic index outside"),
    ("indptr", lambda a: a.at[-1].set(10**6), "rows with indptr outside"),
    ("indptr", lambda a: a.at[5].set(-7), "rows with indptr outside"),
    ("indptr", lambda a: a.at[4].set(a[6] + 1), "rows with indptr outside"),
]


def _steps(net, state, n=200):
    """`n` steps of `net` through `Network.step` with the library's own checks of the model
    switched off (`checked_run`: what `simulate` does after its start check), so that the
    compiled kernel itself meets the corrupted layout: these tests are about the kernel's
    refusal. (Checked, the start of `simulate` and a plain `Network.step` refuse it before:
    tests/test_adversarial.py.)"""
    from neurojax.network._checks import checked_run

    def body(_, st):
        return net.step(st, None, 0.1)[0]

    with checked_run():
        return jax.jit(lambda st: jax.lax.fori_loop(0, n, body, st))(state)


@pytest.mark.parametrize("field, fn, match", CORRUPTIONS)
def test_cpu_delivery_kernel_reports_corrupted_rows_instead_of_crashing(field, fn, match):
    # Before: a segmentation fault or "double free or corruption" (the process died).
    net = _net()
    bad = _corrupt(net, field, fn)
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(_steps(bad, net.init_state(KEY)))


@pytest.mark.parametrize("field", ["col_syn", "col_pre", "col_ptr", "indices"])
def test_cpu_stdp_kernel_reports_corrupted_columns_instead_of_crashing(field):
    net = _net(plastic=True)
    bad = _corrupt(net, field, lambda a: a.at[1].set(10**6))
    with pytest.raises(Exception, match="corrupted connectivity"):
        jax.block_until_ready(_steps(bad, net.init_state(KEY)))


def test_a_forged_sorted_rows_promise_is_refused_by_the_checks_and_by_the_kernel():
    """`EventLayout.sorted_rows` lets the compiled kernel split a delivery by target columns
    with binary searches in each row. A layout edited to break the promise is refused by the
    model checks (those of `simulate`'s start and of `Network.step`), and, with those checks
    switched off and the delivery shared between threads, by the kernel itself: never a
    synapse added twice or lost without an error."""
    from neurojax.kernels import _build

    n = 40
    rng = np.random.default_rng(3)
    post = np.concatenate([np.sort(rng.choice(n, 12, replace=False)) for _ in range(n)])
    pairs = np.stack([np.repeat(np.arange(n), 12), post], axis=1).astype(np.int32)
    conn = sparse.BCOO((jnp.full(12 * n, 4.0, F32), jnp.asarray(pairs)), shape=(n, n))
    proj = nj.Projection("A", "A", conn, method="event", delay=1.0)
    assert proj.layout.sorted_rows
    net = nj.Network({"A": (nj.LIF(), n)}, [proj], inputs={"A": 20.0}, dt=0.1)
    state = net.init_state(KEY)
    bad = _corrupt(net, "indices", lambda a: a.at[:12].set(a[:12][::-1]))  # row 0 descends
    with pytest.raises(ValueError, match="sorted_rows is True"):
        nj.simulate(bad, state, dt=0.1, n_steps=10)
    lib = _build.library()
    if lib is None or nj.kernels.mode() != "auto":
        pytest.skip("the compiled kernels are not in use")
    from neurojax import _threads

    old_mode, old_setting = lib.NjSetSharing(1), _threads._setting[0]
    try:
        nj.use_cpu_threads(2, xla=False)
        with pytest.raises(Exception, match="out of order in rows the layout gives as sorted"):
            jax.block_until_ready(_steps(bad, state))
        # the intact network runs the same way, every spike delivered
        jax.block_until_ready(_steps(net, state))
    finally:
        lib.NjSetSharing(old_mode)
        _threads.use_cpu_threads(old_setting, xla=False)


def test_intact_networks_still_deliver_every_spike_on_both_paths():
    net = _net(delay=0.5)
    st = net.init_state(KEY)
    _, rec = nj.simulate(net, st, dt=0.1, n_steps=300)
    with kernels.use("reference"):
        _, ref = nj.simulate(net, st, dt=0.1, n_steps=300)
    assert int(rec.spikes["A"].sum()) > 40
    np.testing.assert_array_equal(np.asarray(rec.spikes["A"]), np.asarray(ref.spikes["A"]))


@pytest.mark.parametrize(
    "field, fn, match",
    CORRUPTIONS
    + [
        ("weights", lambda a: a.at[2].set(jnp.nan), "non-finite weights"),
        ("indptr", lambda a: a.at[0].set(1), "indptr starts at 1"),
    ],
)
def test_load_revalidates_forged_connectivity(tmp_path, field, fn, match):
    # A file whose checksums are right but whose compressed rows point outside the
    # population: before, `load` returned it and the next run crashed the process.
    net = _net()
    nj.save(tmp_path / "net.nj", _corrupt(net, field, fn))
    with pytest.raises(ValueError, match=r"load: checkpoint .*EventLayout") as info:
        nj.load(tmp_path / "net.nj", net)
    assert any(w in str(info.value) for w in (match, "indptr", "indices")), info.value


def test_load_revalidates_forged_columns_and_parameters(tmp_path):
    net = _net(plastic=True)
    nj.save(tmp_path / "net.nj", _corrupt(net, "col_syn", lambda a: a[::-1]))
    with pytest.raises(ValueError, match=r"the columns \(col_syn, col_pre\) are not those"):
        nj.load(tmp_path / "net.nj", net)
    lif = nj.LIF()
    nj.save(tmp_path / "lif.nj", eqx.tree_at(lambda m: m.tau_m, lif, jnp.asarray(-1.0, F32)))
    with pytest.raises(ValueError, match=r"LIF fails its constructor's check.*tau_m"):
        nj.load(tmp_path / "lif.nj", lif)


@pytest.mark.parametrize("method", ["dense", "bcoo", "event"])
@pytest.mark.parametrize(
    "index, match",
    [((0, 5), r"postsynaptic index is outside \[0, 3\).*\[5\]"), ((-1, 1), r"presynaptic.*\[-1\]")],
)
def test_out_of_range_bcoo_indices_are_refused_by_every_layout(method, index, match):
    # Before: the dense and BCOO layouts dropped the entry (negative ones wrapped around).
    conn = sparse.BCOO((jnp.ones(2, F32), jnp.array([[0, 1], list(index)])), shape=(3, 3))
    with pytest.raises(ValueError, match="Projection: conn has 1 synapse"):
        nj.Projection("A", "B", conn, method=method)
    with pytest.raises(ValueError, match=match):
        nj.Projection("A", "B", conn, method=method)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_bcoo_weights_are_refused(bad):
    conn = sparse.BCOO((jnp.array([1.0, bad], F32), jnp.array([[0, 1], [1, 2]])), shape=(3, 3))
    with pytest.raises(ValueError, match=r"Projection: conn has 1 non-finite weight.*entry 1"):
        nj.Projection("A", "B", conn)


# ------------------------------------------------------------------ 2. the step clock

WRAP = 2**31 - 1


def _at_step(state, step):
    return eqx.tree_at(lambda s: s.step, state, jnp.asarray(step, jnp.int32))


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_runs_that_would_wrap_the_step_counter_are_refused_before_work(mode):
    # Before: the int32 counter wrapped; the CPU kernel then crashed (negative ring slot) and
    # the pure-JAX path delivered into the wrong slots.
    net = _net(delay=1.0)
    state = _at_step(net.init_state(KEY), WRAP - 50)
    with kernels.use(mode), pytest.raises(ValueError, match=r"from 2147483597 to 2147483697"):
        nj.simulate(net, state, dt=0.1, n_steps=100)
    lif = nj.LIF()
    with pytest.raises(ValueError, match=r"past 2\*\*31 - 1 = 2147483647"):
        nj.simulate(lif, lif.init_state(3), 20.0, dt=0.1, n_steps=2**31)


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_runs_just_below_the_wrap_point_equal_runs_at_the_same_ring_phase(mode):
    # Delays act through step mod D (D ring slots): a run that starts 400 steps before the
    # limit and ends exactly at it equals one started at a small step of the same phase.
    net = _net(delay=1.0)
    n_slots = net.ring_shape[0][0]
    start = WRAP - 400
    state = net.init_state(KEY)
    with kernels.use(mode):
        _, near = nj.simulate(net, _at_step(state, start), dt=0.1, n_steps=400)
        _, ref = nj.simulate(net, _at_step(state, start % n_slots), dt=0.1, n_steps=400)
    assert int(ref.spikes["A"].sum()) > 40
    np.testing.assert_array_equal(np.asarray(near.spikes["A"]), np.asarray(ref.spikes["A"]))


def test_kernel_ring_slot_of_a_negative_counter_stays_inside_the_ring():
    # A caller's own loop over `step` can still take the counter past 2**31 - 1: the kernel
    # then reads the same (non-negative) slot as the pure-JAX path, never outside the ring.
    net = _net(delay=1.0)
    state = _at_step(net.init_state(KEY), -(2**31) + 3)
    step = eqx.filter_jit(lambda s: net.step(s, None, 0.1))
    for _ in range(12):
        state_k, _ = step(state)
        with kernels.use("reference"):
            state_r, _ = step(state)
        for a, b in zip(jax.tree.leaves(state_k.buffers), jax.tree.leaves(state_r.buffers)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        state = state_k


# ------------------------------------------------------------------ 3. silent wrong results


def test_record_every_beyond_int32_counts_is_refused():
    lif = nj.LIF()
    with pytest.raises(ValueError, match=r"record_every=2147483648 is more than 2\*\*31 - 1"):
        nj.simulate(lif, lif.init_state(3), 20.0, dt=0.1, n_steps=2**31, record_every=2**31)


def test_state_of_another_network_size_is_refused():
    # Before: a 30-neuron state ran in a 20-neuron network and returned a 30-wide raster.
    net20 = nj.Network({"A": (nj.LIF(), 20)}, [])
    net30 = nj.Network({"A": (nj.LIF(), 30)}, [])
    with pytest.raises(
        ValueError, match=r"state field populations\['A'\]\.v is float32\[30\].*float32\[20\]"
    ):
        nj.simulate(net20, net30.init_state(KEY), dt=0.1, n_steps=5)


def test_non_finite_final_state_warns_naming_the_field():
    # Hodgkin-Huxley with RK4 at dt = 1 ms is unstable: before, it ran silently and recorded
    # spikes at zero current. At dt = 0.05 ms it stays at rest (no warning, no spike).
    hh = nj.HodgkinHuxley()
    with pytest.warns(RuntimeWarning, match=r"field\(s\) 'v' \(3 of 3 entries\).*dt=1.0 ms"):
        nj.simulate(hh, hh.init_state(3), 0.0, dt=1.0, n_steps=50)
    _, rec = nj.simulate(hh, hh.init_state(3), 0.0, dt=0.05, n_steps=1000)
    assert int(rec.spikes.sum()) == 0
    lif = nj.LIF()
    with pytest.raises(FloatingPointError, match=r"state field 'v' became non-finite at step"):
        nj.simulate(hh, hh.init_state(3), 0.0, dt=1.0, n_steps=50, check=True)
    # A NaN initial v is refused before the run (issue 42), as NaN inputs are.
    nan = eqx.tree_at(lambda s: s.v, lif.init_state(3), jnp.array([0.0, jnp.nan, 0.0], F32))
    for check in (False, True):
        with pytest.raises(ValueError, match=r"simulate: the initial state field v holds 1 NaN"):
            nj.simulate(lif, nan, 0.0, dt=0.1, n_steps=5, check=check)


@pytest.mark.parametrize(
    "inputs, error, match",
    [
        (jnp.nan, ValueError, r"inputs must be finite, got nan"),
        (jnp.array([1.0, jnp.inf, 0.0], F32), ValueError, r"1 non-finite value.*index \(1,\)"),
        (jnp.ones(3, jnp.complex64), TypeError, r"inputs are complex \(complex64\)"),
        (1 + 2j, TypeError, r"inputs must be real, got the complex number"),
        (lambda t, i: jnp.ones(3, jnp.complex64), TypeError, r"function returns complex"),
    ],
)
def test_non_finite_and_complex_inputs_are_refused(inputs, error, match):
    lif = nj.LIF()
    with pytest.raises(error, match=match):
        nj.simulate(lif, lif.init_state(3), inputs, dt=0.1, n_steps=5)


@pytest.mark.parametrize("dt", [1e-300, 1e-39, 1e39])
def test_dt_that_the_model_dtype_cannot_hold_is_refused(dt):
    lif = nj.LIF()
    with pytest.raises(ValueError, match=r"not representable in float32.*time would not advance"):
        nj.simulate(lif, lif.init_state(3), 0.0, dt=dt, n_steps=5)


# ------------------------------------------------------------------ 5. late or crashing errors


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "NEUROJAX_CPU_KERNEL": "0"}
    return subprocess.run(
        [sys.executable, "-m", "neurojax", *args], capture_output=True, text=True, env=env
    )


def test_cli_refuses_durations_past_the_step_clock_and_the_memory():
    # Before: --duration 1e30 exited 1 with a traceback; --duration 1e7 failed after
    # compiling with an out-of-memory error.
    proc = _cli("run", "hh", "--duration", "1e30")
    assert proc.returncode == 2, proc.stderr
    assert "argument --duration: at most 2**31 - 1 steps" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("run", "hh", "--duration", "1e8", "--dt", "0.05")
    assert proc.returncode == 2, proc.stderr
    assert "spike raster of 2000000000 steps x 41 neurons would take 82 GB" in proc.stderr


def test_builders_refuse_connectivity_larger_than_memory_before_sampling():
    # Before: 57 s of sampling, then out of memory.
    with pytest.raises(ValueError, match=r"fixed_prob: n_pre \* n_post \* p = .* 5e\+11 synapses"):
        nj.connect.fixed_prob(KEY, 10**6, 10**6, 0.5)
    with pytest.raises(ValueError, match=r"fixed_indegree: n_post \* k = 1000000000 \* 1000"):
        nj.connect.fixed_indegree(KEY, 10**9, 10**9, 1000)
    with pytest.raises(ValueError, match=r"all_to_all: n_pre \* n_post = 1000000 \* 1000000"):
        nj.connect.all_to_all(10**6, 10**6)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda k: nj.LIF().init_state(3, key=k),
            ValueError,
            r"LIF.init_state: key must be a single",
        ),
        (
            lambda k: nj.Network({"A": (nj.LIF(), 3)}, []).init_state(k),
            ValueError,
            r"Network.init_state: key must be a single PRNG key, got a batch of keys of shape \(2,\)",
        ),
        (
            lambda k: nj.connect.fixed_prob(jax.random.key_data(k), 5, 5, 0.5),
            ValueError,
            r"fixed_prob: key must be a single PRNG key, got raw key data of shape \(2, 2\)",
        ),
    ],
)
def test_batched_keys_are_refused_naming_owner_and_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(jax.random.split(KEY, 2))


def test_wrong_key_types_are_refused_naming_owner_and_argument():
    with pytest.raises(TypeError, match=r"Network.init_state: key must be a JAX PRNG key.*str 'a'"):
        nj.Network({"A": (nj.LIF(), 3)}, []).init_state("a")
    with pytest.raises(TypeError, match=r"HodgkinHuxley.init_state: key must be a JAX PRNG key"):
        nj.HodgkinHuxley().init_state(3, key=jnp.zeros(3, F32))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: nj.LIF(tau_m="10"), r"LIF: parameter tau_m must be a real number.*'10'"),
        (lambda: nj.Izhikevich(0.02, "x"), r"Izhikevich: parameter b must be a real number"),
        (lambda: nj.AdEx(a=1j), r"AdEx: parameter a must be a real number"),
    ],
)
def test_string_parameters_name_the_model_and_the_parameter(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_state_of_another_model_or_precision_blames_the_state_before_compiling():
    lif = nj.LIF()
    # Before: an AttributeError after 21 compilations.
    with pytest.raises(TypeError, match=r"state is a IzhikevichState, but LIF.init_state makes"):
        nj.simulate(lif, nj.Izhikevich().init_state(3), 0.0, dt=0.1, n_steps=5)
    bad = eqx.tree_at(lambda s: s.refractory, lif.init_state(3), jnp.zeros(4, F32))
    with pytest.raises(ValueError, match=r"state field refractory is float32\[4\].*float32\[3\]"):
        nj.simulate(lif, bad, 0.0, dt=0.1, n_steps=5)
    state32 = lif.init_state(3)
    with jax.enable_x64(True):
        lif64 = nj.LIF()
        with pytest.raises(ValueError, match=r"state field v is float32\[3\].*float64\[3\]"):
            nj.simulate(lif64, state32, 0.0, dt=0.1, n_steps=5)


def test_set_winners_out_of_range_raises_with_the_value_at_once():
    brain = nj.assembly.Brain({"A": (50, 5)}, p=0.2, beta=0.1, mode="explicit", key=KEY)
    state = brain.init_state(KEY)
    with pytest.raises(
        ValueError, match=r"labels of area 'A' must be in \[0, 50\) \(n\), got \[50, -1\]"
    ):
        brain.set_winners(state, "A", jnp.array([1, 50, -1]))
    with pytest.raises(ValueError, match=r"must be distinct, got \[2, 2\]"):
        brain.set_winners(state, "A", jnp.array([2, 2]))


def test_record_and_sweep_functions_returning_non_arrays_are_named():
    lif = nj.LIF()
    with pytest.raises(TypeError, match=r"simulate: the record function returned str 'x'"):
        nj.simulate(lif, lif.init_state(3), 0.0, dt=0.1, n_steps=5, record=lambda s, o: "x")
    with pytest.raises(TypeError, match=r"sweep: fn returned str 'x' at \[1\], not an array"):
        nj.parallel.sweep(lambda p: (p, "x"), jnp.ones(3, F32))


# ------------------------------------------------------------------ 4. checkpoints


def test_static_configuration_mismatch_is_refused_naming_the_field(tmp_path):
    # Before: the method and the network's delay steps came silently from like.
    nj.save(tmp_path / "lif.nj", nj.LIF(method="exact"))
    with pytest.raises(ValueError, match=r"static field 'method' is 'exact' in the checkpoint"):
        nj.load(tmp_path / "lif.nj", nj.LIF(method="euler"))
    assert nj.load(tmp_path / "lif.nj", nj.LIF(method="exact")).method == "exact"
    nj.save(tmp_path / "net.nj", _net(delay=1.0))
    with pytest.raises(
        ValueError, match=r"static field 'n_slots' is \(11,\) in the checkpoint but \(21,\)"
    ):
        nj.load(tmp_path / "net.nj", _net(delay=2.0))
    net = nj.load(tmp_path / "net.nj", _net(delay=1.0))
    assert net.projections[0].delay == 1.0 and net.homogeneous_delay_steps == (10,)


def test_next_save_removes_temporaries_of_killed_saves(tmp_path):
    path = tmp_path / "run.nj"
    nj.save(path, {"w": jnp.zeros(3, F32)})
    # A save killed with `kill -9`: its writer process is gone, its temporary file stays.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = nj.io._HOST
    stale = tmp_path / f".run.nj.{host}-{child.pid}.0123456789abcdef.tmp"
    stale.write_bytes(b"half a checkpoint")
    alive = tmp_path / f".run.nj.{host}-{os.getpid()}.fedcba9876543210.tmp"
    alive.write_bytes(b"being written")
    other = tmp_path / f".other.nj.{host}-{child.pid}.0123456789abcdef.tmp"
    other.write_bytes(b"another target")
    nj.save(path, {"w": jnp.ones(3, F32)})
    assert not stale.exists()
    assert alive.exists() and other.exists()  # a live writer's, another target's
    np.testing.assert_array_equal(np.asarray(nj.load(path, {"w": jnp.zeros(3, F32)})["w"]), 1.0)


def test_save_os_errors_name_the_target_with_the_save_prefix(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who can write a read-only folder (root)")
        with pytest.raises(PermissionError, match=r"^save: cannot write '.*ro/x.nj'") as info:
            nj.save(folder / "x.nj", {"w": jnp.zeros(3, F32)})
        assert info.value.errno == 13
    finally:
        folder.chmod(0o700)


def test_save_os_errors_from_the_disk_name_the_target(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"^save: cannot write '.*x\.nj': No space left") as info:
        nj.save(tmp_path / "x.nj", {"w": jnp.zeros(3, F32)})
    assert info.value.errno == 28
    assert os.listdir(tmp_path) == []


def _with_header(path, header):
    import json
    import zipfile

    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["neurojax_checkpoint.json"] = (
        header if isinstance(header, bytes) else json.dumps(header).encode()
    )
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)


def test_malformed_headers_raise_the_documented_value_error(tmp_path):
    # Before: a list as a leaf's member escaped as TypeError (unhashable), a deeply nested
    # header as RecursionError.
    import json
    import zipfile

    path = tmp_path / "c.nj"
    nj.save(path, {"w": jnp.zeros(3, F32)})
    with zipfile.ZipFile(path) as zf:
        header = json.loads(zf.read("neurojax_checkpoint.json"))
    header["leaves"][0]["member"] = ["leaves/00000.npy"]
    _with_header(path, header)
    with pytest.raises(ValueError, match=r"its array is missing from the archive"):
        nj.load(path, {"w": jnp.zeros(3, F32)})
    _with_header(path, b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match=r"header is damaged \(nested too deeply\)"):
        nj.load(path, {"w": jnp.zeros(3, F32)})


# ------------------------------------------------------------------ 6. the kernel cache


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids on this platform")
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_kernel_cache_writable_by_others_is_refused(tmp_path, monkeypatch, mode):
    # Before: a library placed in such a folder under the expected name was loaded and run.
    from neurojax.kernels import _build

    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(mode)
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(folder))
    with pytest.raises(PermissionError, match=r"kernel cache folder .* is writable by other users"):
        _build._build()
    with pytest.raises(ValueError, match=r"compilation cache folder .* writable by other users"):
        nj.enable_compilation_cache(folder)


def test_kernel_library_writable_by_others_is_refused(tmp_path, monkeypatch):
    from neurojax.kernels import _build

    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(folder))
    monkeypatch.setattr(_build, "compile_library", lambda out: out.write_bytes(b"\x7fELF"))
    built = _build._build()
    built.chmod(0o666)
    with pytest.raises(
        PermissionError, match=r"compiled kernel library .* writable by other users"
    ):
        _build._build()
    built.chmod(0o600)
    assert _build._build() == built


def test_kernel_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    from neurojax import _system

    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.raises(PermissionError, match=r"is owned by user id \d+, not by you"):
        _system.check_private_path("t", folder, "kernel cache folder")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


@pytest.mark.parametrize("method", ["dense", "bcoo", "event"])
def test_jax_padding_entries_of_a_sliced_bcoo_carry_no_synapse(method):
    # JAX marks the unused entries of a sliced BCOO with index (n_pre, n_post) and value 0:
    # they are removed, every other out-of-range index is refused.
    full = nj.connect.fixed_prob(jax.random.key(2), 7, 30, 0.5, weight=3.0)
    part = full[:, :7]
    proj = nj.Projection("A", "A", part, method=method)
    np.testing.assert_array_equal(
        np.asarray(proj.conn.todense()), np.asarray(full.todense())[:, :7]
    )


# ------------------------------------------------------------------ checks on the classes


def _layout(method):
    if method == "procedural":
        desc = nj.connect.procedural.fixed_prob(KEY, 30, 20, 0.2, weight=0.5)
        return nj.Projection("A", "B", desc).layout
    conn = nj.connect.fixed_prob(jax.random.key(1), 30, 20, 0.2, weight=0.5)
    return nj.Projection("A", "B", conn, method=method).layout


EDITS = {
    "dense": (lambda lay: lay.matrix, lambda a: a.at[1, 2].set(jnp.inf), r"non-finite matrix"),
    "bcoo": (
        lambda lay: lay.conn.indices,
        lambda a: a.at[0, 1].set(20),
        r"postsynaptic index is outside \[0, 20\)",
    ),
    "event": (lambda lay: lay.indptr, lambda a: a.at[3].set(a[4] + 1), r"indptr decreases"),
    "procedural": (
        lambda lay: lay.conn.counts,
        lambda a: a.at[0].set(-1),
        r"conn.counts holds 1 row length\(s\) outside \[0, max_fan_out=\d+\], e.g. \[-1\]",
    ),
}


@pytest.mark.parametrize("method", sorted(EDITS))
def test_every_layout_checks_its_own_invariants(method):
    layout = _layout(method)
    assert layout.check_invariants("t") == []
    where, edit, match = EDITS[method]
    bad = eqx.tree_at(where, layout, edit(where(layout)))
    with pytest.raises(ValueError, match=rf"t: {type(layout).__name__}.*{match}"):
        bad.check_invariants("t")
    # traced: the invariant a delivery needs comes back as a flag, True for the edit
    if method != "dense":
        flags = jax.jit(lambda lay: [b for b, _ in lay.check_invariants("t")])(bad)
        assert any(bool(f) for f in flags)
        assert not any(
            bool(f) for f in jax.jit(lambda lay: [b for b, _ in lay.check_invariants("t")])(layout)
        )


def test_procedural_row_lengths_must_sum_to_the_synapses():
    layout = _layout("procedural")
    counts = np.asarray(layout.conn.counts)
    # a row neither empty nor the widest: one synapse fewer keeps every row in range and
    # the widest row as it is, so only the total tells
    j = int(np.flatnonzero((counts > 0) & (counts < counts.max()))[0])
    shorter = eqx.tree_at(lambda lay: lay.conn.counts, layout, layout.conn.counts.at[j].add(-1))
    with pytest.raises(
        ValueError,
        match=rf"conn.counts sums to {counts.sum() - 1} synapses, but n_synapses is {counts.sum()}",
    ):
        shorter.check_invariants("t")


def test_a_layout_of_your_own_checks_nothing_by_default():
    from jax.experimental import sparse as jsparse

    class Mine(nj.network.Layout):
        name = "mine"
        n_pre: int = eqx.field(static=True)
        n_post: int = eqx.field(static=True)
        w: jax.Array

        @classmethod
        def from_bcoo(cls, conn, *, delay=None, plastic=False):
            return cls(conn.shape[0], conn.shape[1], conn.todense()), delay

        def to_bcoo(self):
            return jsparse.BCOO.fromdense(self.w)

        def nbytes(self):
            return int(self.w.nbytes)

        def product(self, s):
            return s @ self.w

    layout, _ = Mine.from_bcoo(nj.connect.fixed_prob(KEY, 4, 3, 0.5))
    assert layout.check_invariants() == []


def test_models_answer_the_state_they_expect():
    lif = nj.LIF()
    want = lif.expected_state(lif.init_state((2, 5)))
    assert type(want) is nj.LIFState and want.v.shape == (2, 5)
    net = _net()
    got = net.expected_state(net.init_state(KEY, batch=3))
    assert got.populations["A"].v.shape == (3, 20)
    other = nj.Network({"B": (nj.LIF(), 20)}, [], dt=0.1)
    with pytest.raises(ValueError, match=r"holds populations \['B'\], but the network has \['A'\]"):
        net.expected_state(other.init_state(KEY))
