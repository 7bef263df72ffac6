"""The fused run of an uncoupled LIF population (`neurojax.neurons._lif_fused`).

`nj.simulate` runs an `nj.LIF` with no input or a constant input and spikes recorded as
booleans or counts in one compiled CPU kernel (the registry's `"lif_run"`,
`neurojax/kernels/lif_run.cc`), or its reference, a pure-JAX scan of the same arithmetic, off
CPU. Both must give exactly what the general `lax.scan` over
`LIF.step` gives (which `test_lif.py` checks against the analytic solution); here they are
compared with it bit for bit, with the analytic interspike interval directly, and under
jit, vmap and grad.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FUSED_APPLIES_OPTIONS, GENERAL_PATH_OPTIONS, has_cpu_kernel, python_loop

import neurojax as nj
from neurojax.neurons import _lif_fused

# NEST's iaf_psc_alpha defaults, as in benchmarks/lif_population.py
PARAMS = dict(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=2.0)


@pytest.fixture
def kernel():
    if not has_cpu_kernel("lif_run"):
        pytest.skip("the compiled CPU kernels could not be built here")


def _general(model, state, inputs, **kw):
    # record=() asks for no state field, like record=None, but is not the fused path's case.
    return nj.simulate(model, state, inputs, record=(), **kw)


def _assert_same(a, b):
    (fa, ra), (fb, rb) = a, b
    assert ra.spikes.dtype == rb.spikes.dtype == jnp.bool_
    np.testing.assert_array_equal(ra.spikes, rb.spikes)
    np.testing.assert_array_equal(fa.v, fb.v)
    np.testing.assert_array_equal(fa.refractory, fb.refractory)


def _lowered(model, state, inputs, **kw):
    return jax.jit(lambda s: nj.simulate(model, s, inputs, **kw)).lower(state).as_text()


@pytest.mark.parametrize("method", ["exact", "euler"])
def test_fused_run_equals_general_scan(kernel, method):
    lif = nj.LIF(**PARAMS, method=method)
    n = 3000
    state = lif.init_state(n, key=jax.random.key(1))
    current = jnp.linspace(0.2, 2.0, n)
    assert "nj_lif_run" in _lowered(lif, state, current, dt=0.1, n_steps=2000)
    fused = nj.simulate(lif, state, current, dt=0.1, n_steps=2000)
    assert int(fused[1].spikes.sum()) > 50_000
    _assert_same(fused, _general(lif, state, current, dt=0.1, n_steps=2000))


@pytest.mark.parametrize("every", [7, 300])
def test_fused_run_counts_equal_general_scan(kernel, every):
    """`record_every > 1`: spike counts per window, uint8 up to 255 steps, int32 beyond."""
    lif = nj.LIF(**PARAMS)
    state = lif.init_state((3, 400), key=jax.random.key(5))
    current = jnp.linspace(0.2, 2.5, 400)
    n_steps = every * 12
    assert "nj_lif_run" in _lowered(
        lif, state, current, dt=0.1, n_steps=n_steps, record_every=every
    )
    fused = nj.simulate(lif, state, current, dt=0.1, n_steps=n_steps, record_every=every)
    general = _general(lif, state, current, dt=0.1, n_steps=n_steps, record_every=every)
    assert fused[1].spikes.shape == (12, 3, 400)
    assert (
        fused[1].spikes.dtype
        == general[1].spikes.dtype
        == (jnp.uint8 if every <= 255 else jnp.int32)
    )
    np.testing.assert_array_equal(fused[1].spikes, general[1].spikes)
    np.testing.assert_array_equal(fused[0].v, general[0].v)
    np.testing.assert_array_equal(fused[0].refractory, general[0].refractory)
    # The counts are the raster's window sums.
    _, raster = nj.simulate(lif, state, current, dt=0.1, n_steps=n_steps)
    sums = np.asarray(raster.spikes).reshape(12, every, 3, 400).sum(axis=1)
    np.testing.assert_array_equal(fused[1].spikes, sums)
    assert sums.sum() > 1000
    if every > 100:
        assert sums.max() > 1  # several spikes per window: true counts, not flags
    # ... under vmap over the initial state too.
    keys = jax.random.split(jax.random.key(6), 2)
    states = jax.vmap(lambda k: lif.init_state((3, 400), key=k))(keys)
    batched = jax.vmap(
        lambda s: (
            nj.simulate(lif, s, current, dt=0.1, n_steps=n_steps, record_every=every)[1].spikes
        )
    )(states)
    for i in range(2):
        s_i = jax.tree_util.tree_map(lambda x, i=i: x[i], states)
        ref = _general(lif, s_i, current, dt=0.1, n_steps=n_steps, record_every=every)[1].spikes
        np.testing.assert_array_equal(batched[i], ref)


def test_fused_run_with_per_neuron_parameters_and_batch_axes(kernel):
    key1, key2 = jax.random.split(jax.random.key(3))
    lif = nj.LIF(
        tau_m=jax.random.uniform(key1, (4, 50), minval=5.0, maxval=30.0),
        v_rest=-65.0,
        v_reset=jnp.linspace(-75.0, -60.0, 50),
        v_th=-50.0,
        r_m=jnp.linspace(1.0, 50.0, 50),
        t_ref=jnp.array([[0.0], [0.7], [1.0], [3.3]]),
    )
    state = lif.init_state((4, 50), key=key2)
    for inputs in (0.8, jnp.linspace(0.0, 1.5, 50), None):
        fused = nj.simulate(lif, state, inputs, dt=0.05, n_steps=3000)
        _assert_same(fused, _general(lif, state, inputs, dt=0.05, n_steps=3000))
        if inputs is not None:
            assert int(fused[1].spikes.sum()) > 1000


def test_fused_run_matches_analytic_interspike_interval(kernel):
    """Spike counts against `t_ref + tau_m ln((r_m I - (v_reset - v_rest)) / (r_m I - (v_th -
    v_rest)))` rounded up to the grid (class docstring), for neurons starting at rest."""
    dt, n_steps = 0.1, 5000
    lif = nj.LIF(**PARAMS)
    current = np.linspace(0.4, 2.0, 400)
    drive = PARAMS["r_m"] * current
    t_cross = PARAMS["tau_m"] * np.log(drive / (drive - (PARAMS["v_th"] - PARAMS["v_rest"])))
    cross_steps = t_cross / dt
    # Leave out neurons whose threshold crossing falls within float32 reach of a grid point.
    clear = np.abs(cross_steps - np.round(cross_steps)) > 1e-3
    first = np.ceil(cross_steps)  # steps until the first spike (v starts at v_rest = v_reset)
    period = first + round(PARAMS["t_ref"] / dt)
    expected = np.floor((n_steps - first) / period) + 1
    _, rec = nj.simulate(lif, lif.init_state(400), jnp.asarray(current), dt=dt, n_steps=n_steps)
    counts = np.asarray(rec.spikes.sum(axis=0))
    assert clear.sum() > 390
    np.testing.assert_array_equal(counts[clear], expected[clear])


def test_pure_jax_fused_path_equals_general_scan(monkeypatch):
    """Off CPU, or without the compiled library, the fused path is a pure-JAX scan."""
    lif = nj.LIF(**PARAMS)
    state = lif.init_state(500, key=jax.random.key(2))
    current = jnp.linspace(0.3, 2.0, 500)
    calls = []
    pure = _lif_fused.LIF_RUN.reference

    def reference(*args, **static):
        calls.append((static["n_rec"], static["every"]))
        return pure(*args, **static)

    # The fused run's kernel with a reference that reports its calls (made while tracing;
    # the reference mode is part of jit's cache key, so these runs are traced afresh).
    kernel = dataclasses.replace(_lif_fused.LIF_RUN, reference=reference)
    monkeypatch.setattr(_lif_fused, "LIF_RUN", kernel)
    with nj.kernels.use("reference"):
        assert "nj_lif_run" not in _lowered(lif, state, current, dt=0.1, n_steps=800)
        fused = nj.simulate(lif, state, current, dt=0.1, n_steps=800)
        _assert_same(fused, _general(lif, state, current, dt=0.1, n_steps=800))
        f_c, r_c = nj.simulate(lif, state, current, dt=0.1, n_steps=800, record_every=20)
        f_g, r_g = _general(lif, state, current, dt=0.1, n_steps=800, record_every=20)
        assert r_c.spikes.dtype == jnp.uint8 and r_c.spikes.shape == (40, 500)
        np.testing.assert_array_equal(r_c.spikes, r_g.spikes)
        np.testing.assert_array_equal(f_c.v, f_g.v)
    assert (800, 1) in calls and (40, 20) in calls  # (records, steps per record)


def test_fused_run_under_vmap_and_jit(kernel):
    # The input is an argument, not a constant baked into the jitted program: XLA may fold
    # constant loop-invariant arithmetic (v_inf, the decay factor) of the two programs
    # differently, in the last bit (see the module docstring of _lif_fused).
    def run(tau, current, general):
        lif = nj.LIF(**{**PARAMS, "tau_m": tau})
        kw = dict(record=()) if general else {}
        final, rec = nj.simulate(lif, lif.init_state(100), current, dt=0.1, n_steps=500, **kw)
        return final.v, rec.spikes

    current = jnp.linspace(0.3, 2.0, 100)
    taus = jnp.array([5.0, 10.0, 20.0])
    v_f, s_f = jax.jit(jax.vmap(lambda t, c: run(t, c, False), (0, None)))(taus, current)
    v_g, s_g = jax.vmap(lambda t: run(t, current, True))(taus)
    assert s_f.shape == (3, 500, 100)
    np.testing.assert_array_equal(s_f, s_g)
    np.testing.assert_array_equal(v_f, v_g)
    # Each vmapped run equals its own unbatched run.
    for i, tau in enumerate(np.asarray(taus)):
        np.testing.assert_array_equal(s_f[i], run(jnp.float32(tau), current, False)[1])
    # vmap over the initial state.
    lif = nj.LIF(**PARAMS)
    states = jax.vmap(lambda k: lif.init_state(100, key=k))(jax.random.split(jax.random.key(0), 4))
    f_b, r_b = jax.vmap(lambda s: nj.simulate(lif, s, current, dt=0.1, n_steps=300))(states)
    for i in range(4):
        s_i = jax.tree_util.tree_map(lambda x, i=i: x[i], states)
        f_i, r_i = _general(lif, s_i, current, dt=0.1, n_steps=300)
        np.testing.assert_array_equal(r_b.spikes[i], r_i.spikes)
        np.testing.assert_array_equal(f_b.v[i], f_i.v)


def test_fused_run_gradients_equal_general_scan(kernel):
    # Below rheobase (r_m I < v_th - v_rest) for every neuron: the loss is smooth in the
    # parameters, so a central difference is a fair reference.
    current = jnp.linspace(0.05, 0.25, 100)

    def loss(params, general):
        lif = nj.LIF(**{**PARAMS, "tau_m": params[0]})
        kw = dict(record=()) if general else {}
        final, _ = nj.simulate(
            lif, lif.init_state(100), current * params[1], dt=0.1, n_steps=300, **kw
        )
        return jnp.sum((final.v + 60.0) ** 2)

    p = jnp.array([10.0, 1.3])
    g_f = jax.grad(loss)(p, False)
    g_g = jax.grad(loss)(p, True)
    assert np.all(np.isfinite(g_f)) and np.all(np.abs(g_f) > 0)
    _, rec = nj.simulate(
        nj.LIF(**PARAMS), nj.LIF(**PARAMS).init_state(100), current * 1.3, dt=0.1, n_steps=300
    )
    assert not bool(rec.spikes.any())
    # Same derivative; the tangent arithmetic of the two scans rounds differently in float32.
    np.testing.assert_allclose(g_f, g_g, rtol=1e-4)
    # Forward mode too, against a central difference in float32.
    for direction in (jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])):
        _, t_f = jax.jvp(lambda q: loss(q, False), (p,), (direction,))
        h = 1e-2
        fd = (loss(p + h * direction, False) - loss(p - h * direction, False)) / (2 * h)
        np.testing.assert_allclose(t_f, fd, rtol=1e-2)


@pytest.mark.parametrize("kwargs", GENERAL_PATH_OPTIONS)
def test_other_configurations_take_the_general_path(kernel, kwargs):
    lif = nj.LIF(**PARAMS)
    state = lif.init_state(64)
    assert "nj_lif_run" not in _lowered(lif, state, 1.0, dt=0.1, n_steps=100, **kwargs)
    final, _ = nj.simulate(lif, state, 1.0, dt=0.1, n_steps=100, **kwargs)
    ref, _ = nj.simulate(lif, state, 1.0, dt=0.1, n_steps=100)
    np.testing.assert_array_equal(final.v, ref.v)


def test_applies_only_to_lif_steps_with_constant_float_input():
    lif = nj.LIF(**PARAMS)
    state = lif.init_state(8)

    def applies(model=lif, st=state, inputs=None, kind="none"):
        options = {**FUSED_APPLIES_OPTIONS, "kind": kind}
        return _lif_fused.applies(model, st, inputs, **options)

    assert applies()
    assert applies(inputs=jnp.ones(8), kind="const")
    assert not applies(inputs=jnp.ones(8, jnp.int32), kind="const")
    assert not applies(inputs=jnp.ones(9), kind="const")
    assert not applies(kind="series")
    assert not applies(kind="fn")

    # A subclass that keeps `LIF.step` keeps the fused run (the same numbers); one that
    # overrides `step` does not, and the capability itself answers None.
    class Custom(nj.LIF):
        pass

    class OwnStep(nj.LIF):
        def step(self, state, current, dt):
            return super().step(state, current, dt)

    assert applies(model=Custom(**PARAMS))
    assert not applies(model=OwnStep(**PARAMS))
    options = {**FUSED_APPLIES_OPTIONS, "kind": "none"}
    del options["record_every"]
    assert OwnStep(**PARAMS).fused_run(state, None, 0.1, 10, 1, **options) is None
    assert not applies(model=nj.Izhikevich(), st=nj.Izhikevich().init_state(8))


class _Leaky(nj.LIF):
    """A LIF with an extra constant outward current of 0.1 nA: its own `step`."""

    def step(self, state, current, dt):
        return super().step(state, nj.neurons.input_current(current, state.v) - 0.1, dt)


def test_a_subclass_overriding_step_runs_its_own_step(kernel):
    """Its `simulate` follows its `step`, not the inherited fused run of `LIF.step`."""
    leaky, lif = _Leaky(**PARAMS), nj.LIF(**PARAMS)
    state = lif.init_state(50, key=jax.random.key(8))
    current = jnp.linspace(0.5, 2.0, 50)
    assert "nj_lif_run" not in _lowered(leaky, state, current, dt=0.1, n_steps=800)
    final, rec = nj.simulate(leaky, state, current, dt=0.1, n_steps=800, record=("v",))
    ref_final, ref_spikes, ref_v = python_loop(leaky, state, current, 0.1, 800)
    np.testing.assert_array_equal(np.asarray(rec.spikes), ref_spikes > 0)
    np.testing.assert_allclose(np.asarray(rec.v), ref_v, rtol=1e-6, atol=1e-4)
    _, plain = nj.simulate(leaky, state, current, dt=0.1, n_steps=800)
    np.testing.assert_array_equal(plain.spikes, rec.spikes)
    # ... which is not what the LIF itself does.
    _, lif_rec = nj.simulate(lif, state, current, dt=0.1, n_steps=800)
    assert int(lif_rec.spikes.sum()) > int(rec.spikes.sum()) > 0


@pytest.mark.slow
def test_float64_fused_run_equals_general_scan(kernel):
    with jax.enable_x64(True):
        lif = nj.LIF(**PARAMS)
        state = lif.init_state(700, key=jax.random.key(4))
        assert state.v.dtype == jnp.float64
        current = jnp.linspace(0.3, 2.0, 700)
        jax.clear_caches()
        assert "nj_lif_run" in _lowered(lif, state, current, dt=0.1, n_steps=1500)
        fused = nj.simulate(lif, state, current, dt=0.1, n_steps=1500)
        _assert_same(fused, _general(lif, state, current, dt=0.1, n_steps=1500))
        jax.clear_caches()
