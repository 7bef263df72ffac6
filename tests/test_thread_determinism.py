"""Every network kernel gives the same spikes, weights and states, bit for bit, with 1, 2, 3
and 4 threads (issue 40): static delivery, per-synapse delays, procedural layouts, pair,
triplet, Vogels and reward STDP, short-term plasticity and the microcircuit at a small scale,
on the compiled kernels and on the pure-JAX path.

The kernels share a call out only when the measured rule says it gains (`pool.cc`); these
networks are small, so the tests switch the rule to "share every call that has work"
(`NjSetSharing(1)`) and check that shared jobs did run. More threads than cores is fine: the
result must not depend on how the threads are scheduled.
"""

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax import _threads
from neurojax.kernels import _build

DT = 0.1
THREADS = (1, 2, 3, 4)


def _lib():
    lib = _build.library()
    if lib is None or nj.kernels.mode() != "auto":
        pytest.skip("the compiled kernels are not in use")
    lib.NjSetSharing.argtypes = [ctypes.c_int]
    lib.NjSetSharing.restype = ctypes.c_int
    lib.NjSharedJobs.restype = ctypes.c_int64
    lib.NjThreads.restype = ctypes.c_int
    return lib


@pytest.fixture
def share_everything():
    """Share every kernel call with work between the threads; restore the setting after."""
    lib = _lib()
    old_mode = lib.NjSetSharing(1)
    old_setting = _threads._setting[0]
    yield lib
    lib.NjSetSharing(old_mode)
    _threads.use_cpu_threads(old_setting, xla=False)


def _numpy(tree):
    def leaf(x):
        x = jnp.asarray(x)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jr.key_data(x)
        return np.asarray(x)

    return jax.tree.leaves(jax.tree.map(leaf, tree))


def _across_threads(lib, net, state, n_steps, inputs=None, *, reference=False, shares=True):
    """Runs `net` (jitted once) with each thread count; asserts every leaf of the final state
    and the recording equal the one-thread run's, and returns that run. `shares`: whether
    the network's kernels hand work to the pool at all."""
    run = jax.jit(lambda s: nj.simulate(net, s, inputs, dt=DT, n_steps=n_steps))
    outs, jobs = {}, {}
    with nj.kernels.use("reference" if reference else "auto"):
        for k in THREADS:
            nj.use_cpu_threads(k, xla=False)
            assert lib.NjThreads() == k
            before = lib.NjSharedJobs()
            outs[k] = _numpy(run(state))
            jobs[k] = lib.NjSharedJobs() - before
    for k in THREADS[1:]:
        assert len(outs[k]) == len(outs[1])
        for a, b in zip(outs[1], outs[k], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{k} threads differ from 1")
    assert jobs[1] == 0
    if reference or not shares:
        assert all(j == 0 for j in jobs.values())  # no kernel call was shared
    else:
        assert all(jobs[k] > 0 for k in THREADS[1:]), jobs  # the shared path did run
    return outs[1]


def _lif():
    return nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)


def _plastic_net(rule, n=160):
    key_e, key_i = jr.split(jr.key(1))
    projs = [
        nj.Projection(
            "E", "E", nj.connect.fixed_prob(key_e, n, n, 0.2, weight=0.5),
            synapse=nj.Exponential(5.0), delay=0.3, plasticity=rule,
        ),
        nj.Projection("I", "E", nj.connect.fixed_prob(key_i, n // 4, n, 0.3, weight=0.5),
                      synapse=nj.Exponential(10.0)),
    ]  # fmt: skip
    return nj.Network(
        {"E": (_lif(), n), "I": (_lif(), n // 4)}, projs, inputs={"E": 17.0, "I": 16.0}, dt=DT
    )


RULES = {
    "stdp-additive": lambda: nj.STDP(a_plus=0.01, a_minus=0.012, w_max=1.0),
    "stdp-multiplicative": lambda: nj.STDP(a_plus=0.01, a_minus=0.012, mode="multiplicative"),
    "triplet": lambda: nj.TripletSTDP(a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01),
    "triplet-nearest": lambda: nj.TripletSTDP(
        a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01, pairing="nearest"
    ),
    "vogels": lambda: nj.VogelsSTDP(eta=0.01, tau=20.0, rho0=5.0, w_min=0.0, w_max=1.0),
}


def test_coba(share_everything):
    net, state = nj.models.coba(jr.key(0), n_exc=400, n_inh=100, p=0.1)
    out = _across_threads(share_everything, net, state, 300)
    assert sum(float(x.sum()) for x in out if x.dtype == np.bool_) > 50


@pytest.mark.parametrize("name", sorted(RULES))
def test_coba_with_plasticity(share_everything, name):
    net = _plastic_net(RULES[name]())
    state = net.init_state(jr.key(4))
    out = _across_threads(share_everything, net, state, 300)
    # the weights moved: the run exercised the update, not only the delivery
    w0 = np.asarray(net.projections[0].weights)
    assert any(x.shape == w0.shape and np.abs(x - w0).max() > 1e-4 for x in out)


def test_reward_stdp(share_everything):
    rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.12, tau_c=100.0, sweep_interval=10.0)
    n = 120
    proj = nj.Projection(
        "E", "E", nj.connect.fixed_prob(jr.key(2), n, n, 0.3, weight=0.5),
        synapse=nj.Exponential(5.0), delay=0.5, plasticity=rule,
    )  # fmt: skip
    net = nj.Network({"E": (_lif(), n)}, [proj], inputs={"E": 17.0, "dopamine": 0.5}, dt=DT)
    _across_threads(share_everything, net, net.init_state(jr.key(5)), 300)


def test_per_synapse_delays(share_everything):
    n = 300
    conn = nj.connect.fixed_prob(jr.key(3), n, n, 0.1, weight=0.6)
    delays = jr.uniform(jr.key(6), (conn.nse,), minval=0.1, maxval=3.0)
    proj = nj.Projection("E", "E", conn, synapse=nj.Exponential(5.0), delay=delays)
    net = nj.Network({"E": (_lif(), n)}, [proj], inputs={"E": 16.5}, dt=DT)
    _across_threads(share_everything, net, net.init_state(jr.key(7)), 300)


def test_procedural_layout(share_everything):
    n = 400
    # Normal weights and uniform delays: a description the C++ kernel draws itself.
    desc = nj.connect.procedural.fixed_prob(
        jr.key(8), n, n, 0.1, weight=nj.connect.normal(1.0, 0.2),
        delay=nj.connect.uniform(0.1, 1.5), dt=DT,
    )  # fmt: skip
    proj = nj.Projection("E", "E", desc, synapse=nj.Exponential(5.0))
    net = nj.Network({"E": (_lif(), n)}, [proj], inputs={"E": 16.0}, dt=DT)
    _across_threads(share_everything, net, net.init_state(jr.key(9)), 300)


def test_short_term_plasticity(share_everything):
    """The release kernel touches one state per spiking neuron (never shared out) and the
    released values take the event path of a projection with short-term plasticity."""
    n = 200
    proj = nj.Projection(
        "E", "E", nj.connect.fixed_prob(jr.key(10), n, n, 0.1, weight=2.0),
        synapse=nj.Exponential(5.0), delay=0.3, short_term=nj.TsodyksMarkram(0.3, 120.0, 80.0),
    )  # fmt: skip
    net = nj.Network({"E": (_lif(), n)}, [proj], inputs={"E": 16.5}, dt=DT)
    _across_threads(share_everything, net, net.init_state(jr.key(11)), 300, shares=False)


def test_microcircuit_small_scale(share_everything):
    net, state = nj.models.microcircuit(jr.key(0), scale=0.02, k_scale=0.2)
    _across_threads(share_everything, net, state, 200)


def test_rows_sorted_by_target_split_by_columns_as_the_bins_do(share_everything):
    """A layout whose rows list their targets in ascending order (`EventLayout.sorted_rows`,
    the microcircuit's) is split between threads by ring columns, each thread adding into its
    own; the same synapses with every row shuffled take the bins. With per-synapse delays,
    three trials and the read slot cleared, both equal the one-thread ring and the pure-JAX
    delivery bit for bit (the targets of a row are distinct, so a shuffle keeps the order of
    the additions into every cell)."""
    from neurojax.network._layout._event import EventLayout
    from neurojax.network._propagation import EventArrays, EventSpec, deliver

    rng = np.random.default_rng(0)
    n_pre, n_post, n_slots = 300, 400, 20
    rows = [np.sort(rng.choice(n_post, rng.integers(0, 60), replace=False)) for _ in range(n_pre)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    idx = np.concatenate(rows).astype(np.int32)
    w = rng.normal(0.5, 0.2, idx.size).astype(np.float32)
    d = rng.integers(0, n_slots - 1, idx.size).astype(np.int32)
    shuffle = np.concatenate(
        [indptr[r] + rng.permutation(len(rows[r])) for r in range(n_pre)]
    ).astype(np.int64)
    assert EventLayout.from_csr(n_pre, n_post, indptr, idx, w)[0].sorted_rows
    assert not EventLayout.from_csr(n_pre, n_post, indptr, idx[shuffle], w[shuffle])[0].sorted_rows
    s = jnp.asarray((rng.random((3, n_pre)) < 0.2).astype(np.float32))
    ring = jnp.asarray(rng.normal(size=(3, n_slots, n_post)).astype(np.float32))

    def run(order, sorted_rows):
        spec = (EventSpec(n_pre, 0, n_pre, n_post, 60, n_slots, None, n_post, 0, sorted_rows),)
        arrays = (
            EventArrays(
                jnp.asarray(indptr, jnp.int32),
                jnp.asarray(idx[order]),
                jnp.asarray(w[order]),
                jnp.asarray(d[order]),
            ),
        )
        return np.asarray(deliver(spec, s, jnp.int32(7), arrays, ring, clear=True)[0])

    with nj.kernels.use("reference"):
        want = run(slice(None), False)
    assert np.abs(want - np.asarray(ring)).max() > 0.1  # spikes were delivered
    for k in THREADS:
        nj.use_cpu_threads(k, xla=False)
        for order, sorted_rows in ((slice(None), True), (shuffle, False)):
            before = share_everything.NjSharedJobs()
            got = run(order, sorted_rows)
            jobs = share_everything.NjSharedJobs() - before
            np.testing.assert_array_equal(got, want, err_msg=f"{k} threads, {sorted_rows=}")
            assert (jobs > 0) == (k > 1), (k, sorted_rows, jobs)


def test_poisson_background_counts(share_everything):
    """The microcircuit's Poisson background alone (`nj_poisson_counts`, split by source
    ranges): the same counts with 1-4 threads, equal to the pure-JAX draws, the pool used."""
    net, state = nj.models.microcircuit(jr.key(0), scale=0.02, k_scale=0.2)
    source = net.populations["background"]
    key = jr.key(12)
    st0 = source.init_state(source.level.shape, key=key)

    def draws(st):
        def body(st, _):
            st, counts = source.step(st, None, DT)
            return st, counts

        return jax.lax.scan(body, st, None, length=50)[1]

    run = jax.jit(draws)
    outs, jobs = {}, {}
    for k in THREADS:
        nj.use_cpu_threads(k, xla=False)
        before = share_everything.NjSharedJobs()
        outs[k] = np.asarray(run(st0))
        jobs[k] = share_everything.NjSharedJobs() - before
    with nj.kernels.use("reference"):
        want = np.asarray(jax.jit(draws)(st0))
    assert want.sum() > 1000  # counts of several per source and step at these rates
    for k in THREADS:
        np.testing.assert_array_equal(outs[k], want, err_msg=f"{k} threads")
    assert jobs[1] == 0 and all(jobs[k] > 0 for k in THREADS[1:]), jobs


def test_pure_jax_path(share_everything):
    """The reference mode runs no kernel: its results do not depend on the setting either."""
    net = _plastic_net(RULES["stdp-additive"]())
    _across_threads(share_everything, net, net.init_state(jr.key(4)), 100, reference=True)


def test_kernels_equal_the_pure_jax_path_with_threads(share_everything):
    """With 4 threads sharing every call, the compiled kernels give the pure-JAX path's
    spikes (an independent implementation: the one-thread kernels match it in
    tests/test_kernels.py and tests/test_plasticity_kernels.py)."""
    with jax.enable_x64(True):
        net = _plastic_net(RULES["stdp-additive"]())
        state = net.init_state(jr.key(4))
        nj.use_cpu_threads(4, xla=False)
        _, rec_k = nj.simulate(net, state, dt=DT, n_steps=300)
        with nj.kernels.use("reference"):
            _, rec_r = nj.simulate(net, state, dt=DT, n_steps=300)
    assert int(rec_k.spikes["E"].sum()) > 50
    for k in rec_k.spikes:
        np.testing.assert_array_equal(np.asarray(rec_k.spikes[k]), np.asarray(rec_r.spikes[k]))


def test_every_ffi_handler_is_ordered_for_the_sanitizer():
    """Every FFI handler of the kernels is defined through `nj_ffi::Ordered` (xla_order.h), so
    that the ThreadSanitizer build below knows XLA's ordering of kernel calls; a handler
    without it would make that test report XLA's reuse of buffers as races."""
    handlers = {}
    for src in Path(_build.__file__).parent.glob("*.cc"):
        text = src.read_text()
        for name, impl in re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+),\s*([^,]+),", text):
            handlers[f"{src.name}:{name}"] = impl.strip()
            assert '#include "xla_order.h"' in text, src.name
    assert len(handlers) >= 19, handlers
    bare = {k: v for k, v in handlers.items() if not re.fullmatch(r"nj_ffi::Ordered<\w+>", v)}
    assert not bare, f"FFI handlers not wrapped in nj_ffi::Ordered: {bare}"


@pytest.mark.slow
def test_cases_under_thread_sanitizer(tmp_path):
    """The cases above (the microcircuit aside) in a process whose compiled library is built
    with ThreadSanitizer: no data race is reported in the kernels and their pool."""
    cxx = _build._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    runtime = subprocess.run(
        [cxx, "-print-file-name=libtsan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"{cxx} has no ThreadSanitizer runtime")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = os.environ.get("NEUROJAX_CACHE_DIR")
    os.environ["NEUROJAX_CACHE_DIR"] = str(cache)
    try:
        out = _build.library_path()  # the name the child process will look for
    finally:
        if old is None:
            del os.environ["NEUROJAX_CACHE_DIR"]
        else:
            os.environ["NEUROJAX_CACHE_DIR"] = old
    _build.compile_library(out, ("-fsanitize=thread", "-g"))
    env = {
        **os.environ,
        "NEUROJAX_CACHE_DIR": str(cache),
        "NEUROJAX_CPU_KERNEL": "1",
        "LD_PRELOAD": runtime,
        # Only the kernels are instrumented: report their races, and stop at the first.
        "TSAN_OPTIONS": "halt_on_error=1:report_signal_unsafe=0:ignore_noninstrumented_modules=1",
        "PYTHONPATH": os.getcwd(),
    }
    proc = subprocess.run(
        # -s: a report ends the process, and pytest's capture would swallow it.
        [sys.executable, "-m", "pytest", "-s", "-q", "-x", "-p", "no:cacheprovider", __file__,
         "-k", "not microcircuit and not sanitizer", "-m", "not slow"],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    if "unexpected memory mapping" in proc.stderr:
        pytest.skip("ThreadSanitizer cannot run with this kernel's address-space layout")
    assert "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0 and " passed" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


def test_whole_network_run(share_everything):
    """The CPU's whole network run (`nj_network_run`: a barrier per step, each thread owning
    a range of neurons and the ring columns that feed them) of the microcircuit with its
    Poisson background."""
    from neurojax.network import _cpu_run

    net, state = nj.models.microcircuit(jr.key(0), scale=0.02, k_scale=1.0)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    _across_threads(share_everything, net, state, 200)


def test_whole_network_run_coba(share_everything):
    """The same for COBA (conductance outputs, constant inputs, Euler), small."""
    from neurojax.network import _cpu_run

    net, state = nj.models.coba(jr.key(4), n_exc=400, n_inh=100, p=0.08, method="event")
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    out = _across_threads(share_everything, net, state, 500)
    assert out[-2].sum() > 100  # E's raster: an active network


def test_whole_network_run_rebalanced_segments(share_everything):
    """A run of several segments (512 steps each), the neuron cut moved between them from the
    threads' measured times and the sorted rows' splits moved with it (galloping from the
    last ones): still the one-thread result, with 1-4 threads."""
    from neurojax.network import _cpu_run

    net, state = nj.models.microcircuit(jr.key(1), scale=0.02, k_scale=1.0)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    out = _across_threads(share_everything, net, state, 1600)
    assert sum(int(x.sum()) for x in out if x.dtype == bool) > 1000


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint16"])
def test_out_of_range_across_threads(share_everything, dtype):
    """`nj_out_of_range` (the run-start check of a traced network's indices and delays),
    split over 1-4 threads: every bad value found wherever it lies (the parts' first and last
    elements included), the answer equal to NumPy's."""
    from neurojax.kernels._ranges import out_of_range

    info = np.iinfo(dtype)
    lo, hi = (0, 100) if info.min == 0 else (-5, 100)
    n = 1_000_003  # not a multiple of any thread count
    x = np.random.default_rng(3).integers(lo, hi, n).astype(dtype)
    check = jax.jit(lambda a: out_of_range(a, lo, hi))
    check(x)  # the first call runs on one thread and times it
    bad_values = [hi, info.max] + ([lo - 1, info.min] if info.min < lo else [])
    spots = [0, n // 4, n // 4 - 1, n // 3, n // 2, n // 2 - 1, 3 * n // 4, n - 1]
    for k in THREADS:
        nj.use_cpu_threads(k, xla=False)
        before = share_everything.NjSharedJobs()
        assert not bool(check(x)), f"{k} threads: a clean array flagged"
        for at in spots:
            for v in bad_values:
                y = x.copy()
                y[at] = v
                want = bool(((y.astype(np.int64) < lo) | (y.astype(np.int64) >= hi)).any())
                assert want
                assert bool(check(y)), f"{k} threads: {v} at {at} not found"
        if k > 1:
            assert share_everything.NjSharedJobs() > before, "the pool was not used"


@pytest.mark.parametrize("mode", ["additive", "multiplicative"])
def test_whole_network_run_coba_pair_stdp(share_everything, mode):
    """COBA with pair STDP on E -> E in the whole run: the presynaptic trace advanced by the
    owners of the presynaptic neurons, each synapse depressed and potentiated by the owner of
    its target; weights, traces and spikes the same with 1-4 threads."""
    from benchmarks.stdp_overhead import with_stdp
    from neurojax.network import _cpu_run

    net, state = nj.models.coba(jr.key(5), n_exc=400, n_inh=100, p=0.08, method="event")
    rule = nj.STDP(a_plus=0.01, a_minus=0.0105, w_max=1.2, mode=mode)
    net, state = with_stdp(net, state, rule)
    assert _cpu_run.explain(net, state, dt=DT).startswith("network_run")
    out = _across_threads(share_everything, net, state, 1200)
    assert out[-2].sum() > 100  # E's raster: an active network
