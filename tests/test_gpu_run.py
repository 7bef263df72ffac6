"""The whole-run GPU kernels of uncoupled populations (`lif_run`, `hh_run`: one Pallas Triton
program grid runs every step), on the CPU in Pallas interpret mode against the reference scan
(`nj.kernels.use("reference")`, which is `LIF.step` / `HodgkinHuxley.step` in `lax.scan`),
and lowered for CUDA without a device.

Tolerance: interpret mode runs the kernel body's XLA operations, the same ones in the same
order as the reference, so spikes must be equal and the state equal to rounding (1e-6
relative; on a GPU Triton may contract multiply-adds, which moves the last bit)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _pallas_run

TRITON = "__gpu$xla.gpu.triton"
KERNELS = nj.kernels.registry()


def _lif_case(n=50, batch=()):
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-70.0, v_th=-50.0, t_ref=2.0)
    v0 = jnp.broadcast_to(jnp.linspace(-70.0, -52.0, n, dtype=jnp.float32), (*batch, n))
    state = nj.LIFState(v=v0, refractory=jnp.zeros((*batch, n), jnp.float32))
    # From silent (I < 15 nA) to fast firing, so the run has refractory clamps and resets.
    current = jnp.linspace(5.0, 200.0, n, dtype=jnp.float32)
    return lif, state, current


def _hh_case(n=40, batch=()):
    hh = nj.HodgkinHuxley()
    rest = hh.resting_state(n)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (*batch, n)), rest)
    current = jnp.linspace(0.0, 25.0, n, dtype=jnp.float32)  # silent to tonic firing
    return hh, state, current


def _both(fn):
    """`fn()` in the reference mode and with the GPU kernels interpreted."""
    with nj.kernels.use("reference"):
        want = fn()
    with nj.kernels.interpret("gpu"):
        got = fn()
    return got, want


def _assert_run_equal(got, want, rtol=1e-6, atol=1e-5):
    (g_state, g_rec), (w_state, w_rec) = got, want
    np.testing.assert_array_equal(np.asarray(g_rec.spikes), np.asarray(w_rec.spikes))
    for g, w in zip(jax.tree.leaves(g_state), jax.tree.leaves(w_state), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


@pytest.mark.parametrize("record_every", [1, 4])
def test_lif_simulate_runs_the_gpu_kernel(record_every):
    """`nj.simulate` of an LIF population takes the whole-run kernel (one `pallas_call`, no
    scan) and gives the reference's spikes (raster or window counts) and final state."""
    lif, state, current = _lif_case()

    def run():
        return jax.jit(
            lambda st, i: nj.simulate(lif, st, i, dt=0.1, n_steps=200, record_every=record_every)
        )(state, current)

    got, want = _both(run)
    _assert_run_equal(got, want)
    counts = np.asarray(want[1].spikes).sum(axis=0)
    assert counts[0] == 0 and counts[-1] > 5  # silent and fast-firing neurons both present
    with nj.kernels.interpret("gpu"):
        jaxpr = str(
            jax.make_jaxpr(lambda st: nj.simulate(lif, st, current, dt=0.1, n_steps=8))(state)
        )
    assert jaxpr.count("pallas_call") == 1


@pytest.mark.parametrize("method", ["rk4", "exp_euler"])
def test_hh_simulate_runs_the_gpu_kernel(method):
    """200 steps of 0.025 ms (5 ms): the first spikes of the driven neurons, equal."""
    hh, state, current = _hh_case()
    hh = nj.HodgkinHuxley(method=method)

    got, want = _both(
        lambda: jax.jit(lambda st, i: nj.simulate(hh, st, i, dt=0.025, n_steps=200))(state, current)
    )
    _assert_run_equal(got, want, atol=1e-4)
    assert int(np.asarray(want[1].spikes).sum()) > 10


def test_batched_state_is_the_kernels_trial_axis():
    """A `(3, n)` state (a batch of trials) is one kernel call with three trials."""
    lif, state, current = _lif_case(n=30, batch=(3,))
    state = nj.LIFState(v=state.v + jnp.asarray([[0.0], [1.0], [2.0]]), refractory=state.refractory)
    got, want = _both(lambda: nj.simulate(lif, state, current, dt=0.1, n_steps=120))
    _assert_run_equal(got, want)
    assert got[1].spikes.shape == (120, 3, 30)


def test_vmap_over_full_states_and_parameters():
    """`jax.vmap` over states, inputs and a parameter (HH's `g_na`, per trial) folds into the
    kernel's trial axis: one `pallas_call`, results equal to the reference's vmap."""
    hh, state, current = _hh_case(n=20)
    states = jax.tree.map(lambda x: jnp.stack([x, x, x]), state)
    currents = jnp.stack([current, current * 0.8, current * 1.2])
    g_na = jnp.asarray([120.0, 100.0, 140.0], jnp.float32)

    def one(st, i, g):
        return nj.simulate(nj.HodgkinHuxley(g_na=g), st, i, dt=0.025, n_steps=160)

    run = jax.jit(jax.vmap(one))
    got, want = _both(lambda: run(states, currents, g_na))
    _assert_run_equal(got, want, atol=1e-4)
    with nj.kernels.interpret("gpu"):
        jaxpr = str(jax.make_jaxpr(jax.vmap(one))(states, currents, g_na))
    assert jaxpr.count("pallas_call") == 1
    assert "while" not in jaxpr.split("pallas_call")[0]  # no loop over trials around it


@pytest.mark.parametrize("model_name", ["lif", "hh"])
def test_simulate_records_fields_through_the_gpu_kernel(model_name):
    """`nj.simulate(..., record=fields, record_every=k)` takes the whole-run kernel under the
    GPU slots (one `pallas_call`) and equals the general scan's recording; on the CPU without
    the switch the same call keeps the general scan (the C++ kernels record spikes only)."""
    if model_name == "lif":
        model, state, current = _lif_case(n=40)
        record, dt = ("v", "refractory"), 0.1
    else:
        model, state, current = _hh_case(n=30)
        record, dt = ("v", "m"), 0.025

    def run(st, i):
        return nj.simulate(model, st, i, dt=dt, n_steps=120, record=record, record_every=3)

    with nj.kernels.use("reference"):
        want_state, want = jax.jit(run)(state, current)
    with nj.kernels.interpret("gpu"):
        got_state, got = jax.jit(run)(state, current)
        jaxpr = str(jax.make_jaxpr(run)(state, current))
    assert jaxpr.count("pallas_call") == 1
    np.testing.assert_array_equal(np.asarray(got.spikes), np.asarray(want.spikes))
    for name in record:
        assert getattr(got, name).shape == (40, *state.v.shape)
        np.testing.assert_allclose(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), rtol=1e-6, atol=1e-4
        )
    options = dict(
        kind="const",
        record=record,
        spike_dtype="bool",
        check=False,
        checkpoint=False,
        truncate_backprop=None,
    )
    assert model.fused_run(state, current, dt, 40, 3, **options) is None  # CPU: general scan
    with nj.kernels.interpret("gpu"):
        assert model.fused_run(state, current, dt, 40, 3, **options) is not None
        assert model.fused_run(state, current, dt, 40, 3, **{**options, "record": ("u",)}) is None


@pytest.mark.parametrize(
    "name,fields", [("lif_run", ("v", "refractory")), ("hh_run", ("v", "m", "h", "n"))]
)
def test_recorded_fields_are_every_windows_last_value(name, fields):
    """With `record=`, each field is recorded at the end of each window of `every` steps; the
    entry is compared with a Python loop over the model's `step` (an independent reference)."""
    kernel = KERNELS[name]
    every, n_rec, dt = 3, 6, 0.05
    if name == "lif_run":
        model, state, current = _lif_case(n=24)
        v_inf = model.v_rest + model.r_m * current
        full = [
            jnp.broadcast_to(jnp.asarray(x, jnp.float32), (24,))
            for x in (v_inf, jnp.exp(-dt / model.tau_m), model.v_reset, model.v_th, model.t_ref)
        ]
        args = (state.v, state.refractory, *full, jnp.asarray([dt, dt / 2], jnp.float32))
        static = dict(euler=False)
    else:
        model, state, current = _hh_case(n=24)
        params = [getattr(model, p) for p in ("c_m", "g_na", "g_k", "g_l", "e_na", "e_k", "e_l")]
        args = (*jax.tree.leaves(state), current, *params, model.v_spike)
        static = dict(dt=dt, method="rk4")
    with nj.kernels.interpret("gpu"):
        out = nj.kernels.call(
            kernel, *args, n_rec=n_rec, every=every, shape=(24,), record=fields, **static
        )
    rec = out[-len(fields) :]
    st, want = state, {f: [] for f in fields}
    spikes = np.zeros((n_rec, 24), np.int64)
    for w in range(n_rec):
        for _ in range(every):
            st, s = model.step(st, current, dt)
            spikes[w] += np.asarray(s > 0)
        for f in fields:
            want[f].append(np.asarray(getattr(st, f)))
    for f, got in zip(fields, rec, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.stack(want[f]), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(out[-len(fields) - 1]), spikes)


@pytest.mark.parametrize("batched", [False, True])
def test_lowers_for_cuda_with_the_steps_inside_the_kernel(batched):
    """The LIF run (and `jax.vmap` over 8 full states) lowered for CUDA is one Triton call and
    no XLA loop: the steps are inside the kernel, the trials are its grid."""
    lif, state, current = _lif_case()

    def f(st, i):
        return nj.simulate(lif, st, i, dt=0.1, n_steps=1000)

    args = (state, current)
    if batched:
        f = jax.vmap(f)
        args = jax.tree.map(lambda x: jnp.stack([x] * 8), args)
    with nj.kernels.cross_platform():
        text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count(TRITON) == 1
    assert not re.search(r"stablehlo\.while|scf\.while", text)


def test_whole_run_arguments_are_checked():
    """Bad arguments of the generic kernel are refused before any work, with the argument."""
    x = jnp.zeros((2, 8), jnp.float32)

    def upd(st, ps):
        return st, st[0] > 0

    with pytest.raises(ValueError, match=r"states\[1\] must be \(2, 8\) float32"):
        _pallas_run.whole_run_gpu(upd, (x, x[0]), (), (), n_rec=1, every=1)
    with pytest.raises(ValueError, match="kinds must give one kind per parameter"):
        _pallas_run.whole_run_gpu(upd, (x,), (x,), (), n_rec=1, every=1)
    with pytest.raises(ValueError, match=r"kinds\[0\] must be one of"):
        _pallas_run.whole_run_gpu(upd, (x,), (x,), ("dense",), n_rec=1, every=1)
    with pytest.raises(ValueError, match=r"params\[0\] of kind 'scalar' must have shape \(1,\)"):
        _pallas_run.whole_run_gpu(upd, (x,), (x,), ("scalar",), n_rec=1, every=1)
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        _pallas_run.whole_run_gpu(upd, (x,), (), (), n_rec=1, every=0)
    with pytest.raises(ValueError, match="record must hold state indices"):
        _pallas_run.whole_run_gpu(upd, (x,), (), (), n_rec=1, every=1, record=(1,))
    with pytest.raises(ValueError, match="spikes_dtype must be bool when every == 1"):
        _pallas_run.whole_run_gpu(upd, (x,), (), (), n_rec=1, every=1, spikes_dtype=jnp.uint8)
    with pytest.raises(ValueError, match=r"lif_run: record must be a tuple of names in"):
        lif, state, current = _lif_case(n=4)
        KERNELS["lif_run"].reference(
            *([state.v] * 7),
            jnp.asarray([0.1, 0.05]),
            n_rec=1,
            every=1,
            euler=False,
            shape=(4,),
            record=("u",),
        )


def test_explain_says_which_slot_runs_and_why():
    """`nj.kernels.explain` answers for every platform and agrees with the dispatch."""
    kernel = KERNELS["lif_run"]
    ex = next(iter(kernel.examples()))
    plain = nj.kernels.explain("lif_run", *ex.args, **ex.static)
    assert plain["cuda"].startswith("gpu:") and plain["tpu"].startswith("reference:")
    assert plain["cpu"].split(":")[0] == (
        "cpu" if "cpu" in nj.kernels.implementations(kernel, *ex.args, **ex.static) else "reference"
    )
    fields = nj.kernels.explain(kernel, *ex.args, **ex.static, record=("v",))
    assert "supports" in fields["cpu"] and fields["cuda"].startswith("gpu:")
    with nj.kernels.interpret("gpu"):
        assert nj.kernels.explain(kernel, *ex.args, **ex.static)["cpu"].startswith("gpu:")
    with nj.kernels.use("reference"):
        assert all(
            v.startswith("reference:")
            for v in nj.kernels.explain(kernel, *ex.args, **ex.static).values()
        )
    with pytest.raises(ValueError, match="kernel must be a Kernel or one of .* got 'nope'"):
        nj.kernels.explain("nope")
