"""The fused run of an uncoupled Hodgkin-Huxley population (`neurojax.neurons._hh_fused`).

`nj.simulate` runs an `nj.HodgkinHuxley` with no input or a constant input and spikes
recorded as booleans or counts in one compiled CPU kernel (the registry's `"hh_run"`,
`neurojax/kernels/hh_run.cc`). The kernel
integrates the same equations as `HodgkinHuxley.step` with its own arithmetic (a vectorised
single-precision `exp`), so it is checked against the general `lax.scan` over `step` to the
tolerance that rounding explains: in float64, where the kernel calls the C library's `exp`,
to about 1e-9; in float32 against the float64 general path (the exact numbers of the
scheme) to float32 accuracy; and against the `solve_ivp` reference of
`test_hodgkin_huxley.py` (whose `run(..., record=None)` calls go through the kernel too).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FUSED_APPLIES_OPTIONS, GENERAL_PATH_OPTIONS, has_cpu_kernel

import neurojax as nj
from neurojax.neurons import _hh_fused

METHODS = ("rk4", "exp_euler")
DT = 0.01


@pytest.fixture
def kernel():
    if not has_cpu_kernel("hh_run"):
        pytest.skip("the compiled CPU kernels could not be built here")


def _general(model, state, inputs, **kw):
    # record=() asks for no state field, like record=None, but is not the fused path's case.
    return nj.simulate(model, state, inputs, record=(), **kw)


def _lowered(model, state, inputs, **kw):
    return jax.jit(lambda s: nj.simulate(model, s, inputs, **kw)).lower(state).as_text()


def _spike_steps(spikes):
    """Per neuron, the step indices of its spikes."""
    s = np.asarray(spikes)
    return [np.nonzero(s[:, k])[0] for k in range(s.shape[1])]


def _assert_spikes_close(a, b, *, max_shift=1):
    """Same number of spikes per neuron, each dated within `max_shift` steps."""
    for k, (x, y) in enumerate(zip(_spike_steps(a), _spike_steps(b), strict=True)):
        assert len(x) == len(y), (k, x, y)
        assert np.all(np.abs(x - y) <= max_shift), (k, x, y)


def _assert_float64_equal(a, b):
    """float64 runs of the two paths: the same raster, states equal to rounding."""
    (fa, ra), (fb, rb) = a, b
    np.testing.assert_array_equal(ra.spikes, rb.spikes)
    for name in ("v", "m", "h", "n"):
        np.testing.assert_allclose(getattr(fa, name), getattr(fb, name), rtol=1e-8, atol=1e-8)


def _currents(n, lo=0.0, hi=20.0):
    return jnp.linspace(lo, hi, n, dtype=jnp.float32)


@pytest.mark.parametrize("method", METHODS)
def test_float64_fused_run_equals_general_scan(kernel, method):
    """In float64 the kernel's arithmetic differs from XLA's only in rounding: the state after
    30 ms of firing (several spikes per neuron) agrees to about 1e-9, the raster exactly."""
    with jax.enable_x64(True):
        hh = nj.HodgkinHuxley(method=method)
        n = 300  # two blocks of the kernel, shared between threads
        state = hh.init_state(n, key=jax.random.key(0))
        current = jnp.linspace(0.0, 30.0, n)
        assert state.v.dtype == jnp.float64
        assert "nj_hh_run" in _lowered(hh, state, current, dt=DT, n_steps=3000)
        fused_final, fused = nj.simulate(hh, state, current, dt=DT, n_steps=3000)
        gen_final, gen = _general(hh, state, current, dt=DT, n_steps=3000)
        assert int(fused.spikes.sum()) > 500
        _assert_float64_equal((fused_final, fused), (gen_final, gen))


@pytest.mark.parametrize("method", METHODS)
def test_float64_fused_run_from_far_states_equals_general_scan(kernel, method):
    """Starts from -150 to +100 mV (the kernel's exponentials over a wide range of arguments,
    both sides of the rate functions' removable singularities) and a large step for
    exp_euler, which is stable at any dt."""
    with jax.enable_x64(True):
        hh = nj.HodgkinHuxley(method=method)
        v = jnp.linspace(-150.0, 100.0, 501)
        m, h, n = hh.gate_steady_state(jnp.linspace(-80.0, 20.0, 501))
        state = nj.HHState(v=v, m=m, h=h, n=n)
        current = jnp.linspace(-20.0, 40.0, 501)
        dt, n_steps = (0.01, 2000) if method == "rk4" else (0.2, 400)
        assert "nj_hh_run" in _lowered(hh, state, current, dt=dt, n_steps=10)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused_final, fused = nj.simulate(hh, state, current, dt=dt, n_steps=n_steps)
            gen_final, gen = _general(hh, state, current, dt=dt, n_steps=n_steps)
        assert int(fused.spikes.sum()) > 100
        _assert_float64_equal((fused_final, fused), (gen_final, gen))
        # RK4 at dt = 0.01 ms diverges from the farthest starts: both runs say so, naming v
        n_bad = int(np.sum(~np.isfinite(np.asarray(fused_final.v))))
        said = [str(w.message) for w in caught if "final state holds NaN" in str(w.message)]
        assert len(said) == (2 if n_bad else 0)
        assert all(f"'v' ({n_bad} of 501 entries)" in m for m in said)


@pytest.mark.parametrize("method", METHODS)
def test_float32_fused_run_matches_the_float64_scheme(kernel, method):
    """float32 kernel against the general path in float64 (the scheme's exact numbers): spike
    counts equal, each spike within one step; below threshold the state within float32
    accuracy. The float32 general path is no closer (checked alongside)."""
    hh = nj.HodgkinHuxley(method=method)
    n = 600
    current = _currents(n, 0.0, 25.0)
    state = hh.init_state(n)
    fused_final, fused = nj.simulate(hh, state, current, dt=DT, n_steps=5000)
    f32_final, f32 = _general(hh, state, current, dt=DT, n_steps=5000)
    with jax.enable_x64(True):
        hh64 = nj.HodgkinHuxley(method=method)
        state64 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float64), state)
        ref_final, ref = _general(hh64, state64, current.astype(jnp.float64), dt=DT, n_steps=5000)
    assert int(fused.spikes.sum()) > 2000
    _assert_spikes_close(fused.spikes, ref.spikes)
    _assert_spikes_close(f32.spikes, ref.spikes)
    # Neurons that never fire (below the 2.24 uA/cm^2 threshold): smooth, comparable states.
    quiet = np.asarray(~ref.spikes.any(axis=0))
    assert 20 < quiet.sum() < n
    err_fused = np.abs(np.asarray(fused_final.v)[quiet] - np.asarray(ref_final.v)[quiet])
    err_f32 = np.abs(np.asarray(f32_final.v)[quiet] - np.asarray(ref_final.v)[quiet])
    assert err_fused.max() < 1e-3 and err_f32.max() < 1e-3
    for name in ("m", "h", "n"):
        got = np.asarray(getattr(fused_final, name))[quiet]
        want = np.asarray(getattr(ref_final, name))[quiet]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("every", "n_rec"), [(10, 200), (1500, 4)])
def test_fused_counts_are_window_sums_of_the_raster(kernel, every, n_rec):
    hh = nj.HodgkinHuxley()
    current = _currents(300, 5.0, 40.0)
    state = hh.init_state(300)
    n_steps = every * n_rec
    assert "nj_hh_run" in _lowered(hh, state, current, dt=DT, n_steps=n_steps, record_every=every)
    final_c, rec_c = nj.simulate(hh, state, current, dt=DT, n_steps=n_steps, record_every=every)
    final_r, rec_r = nj.simulate(hh, state, current, dt=DT, n_steps=n_steps)
    assert rec_c.spikes.shape == (n_rec, 300)
    assert rec_c.spikes.dtype == (jnp.uint8 if every <= 255 else jnp.int32)
    sums = np.asarray(rec_r.spikes).reshape(n_rec, every, 300).sum(axis=1)
    np.testing.assert_array_equal(rec_c.spikes, sums)
    assert sums.sum() > 500
    if every > 100:
        assert sums.max() > 1  # several spikes per window: true counts, not flags
    np.testing.assert_array_equal(final_c.v, final_r.v)  # the same kernel arithmetic
    # And the general path's counts agree to the spikes that rounding may shift a step.
    _, rec_g = _general(hh, state, current, dt=DT, n_steps=n_steps, record_every=every)
    assert np.abs(np.asarray(rec_g.spikes, int) - np.asarray(rec_c.spikes, int)).sum() <= 4


def test_fused_run_is_deterministic_and_chunking_changes_nothing(kernel):
    hh = nj.HodgkinHuxley(method="rk4")
    state = hh.init_state(700, key=jax.random.key(3))
    current = _currents(700, 0.0, 30.0)
    a = nj.simulate(hh, state, current, dt=DT, n_steps=2000)
    b = nj.simulate(hh, state, current, dt=DT, n_steps=2000, chunk_size=300)
    c = nj.simulate(hh, state, current, dt=DT, n_steps=2000)
    for x, y in ((a, b), (a, c)):
        np.testing.assert_array_equal(x[1].spikes, y[1].spikes)
        for name in ("v", "m", "h", "n"):
            np.testing.assert_array_equal(getattr(x[0], name), getattr(y[0], name))


def test_fused_run_per_neuron_parameters_batch_axes_and_vmap(kernel):
    key1, key2 = jax.random.split(jax.random.key(7))
    hh = nj.HodgkinHuxley(
        g_na=jax.random.uniform(key1, (3, 40), minval=80.0, maxval=140.0),
        g_k=jnp.linspace(20.0, 40.0, 40),
        c_m=jnp.array([[0.8], [1.0], [1.3]]),
        e_l=-60.0,
    )
    state = hh.init_state((3, 40), key=key2)
    for inputs in (12.0, jnp.linspace(0.0, 25.0, 40), None):
        assert "nj_hh_run" in _lowered(hh, state, inputs, dt=DT, n_steps=100)
        fused = nj.simulate(hh, state, inputs, dt=DT, n_steps=2000)
        general = _general(hh, state, inputs, dt=DT, n_steps=2000)
        assert fused[1].spikes.shape == (2000, 3, 40)
        _assert_spikes_close(
            fused[1].spikes.reshape(2000, 120), general[1].spikes.reshape(2000, 120)
        )
        if inputs is not None:
            assert int(fused[1].spikes.sum()) > 100
    # vmap over the model parameters: every batch entry equals its own unbatched run exactly
    # (the initial state is computed once: a resting state solved under vmap and jit could
    # differ from the eager one in the last bit).
    current = jnp.linspace(3.0, 25.0, 64)
    start = nj.HodgkinHuxley().init_state(64)

    def final_and_spikes(g_na):
        model = nj.HodgkinHuxley(g_na=g_na)
        final, rec = nj.simulate(model, start, current, dt=DT, n_steps=1500)
        return final.v, rec.spikes

    g = jnp.array([100.0, 120.0, 150.0])
    v_b, s_b = jax.jit(jax.vmap(final_and_spikes))(g)
    assert s_b.shape == (3, 1500, 64)
    for i in range(3):
        v_i, s_i = final_and_spikes(g[i])
        np.testing.assert_array_equal(s_b[i], s_i)
        np.testing.assert_array_equal(v_b[i], v_i)


def test_fused_gradients_equal_general_scan(kernel):
    """grad through the fused run is the general scan's derivative (custom JVP)."""

    def loss(params, general):
        hh = nj.HodgkinHuxley(g_k=params[0])
        kw = dict(record=()) if general else {}
        state = hh.init_state(50)
        final, _ = nj.simulate(
            hh, state, jnp.linspace(0.5, 2.0, 50) * params[1], dt=DT, n_steps=500, **kw
        )
        return jnp.sum((final.v + 60.0) ** 2)

    p = jnp.array([36.0, 1.0])
    g_f = jax.grad(loss)(p, False)
    g_g = jax.grad(loss)(p, True)
    assert np.all(np.isfinite(g_f)) and np.all(np.abs(g_f) > 0)
    np.testing.assert_allclose(g_f, g_g, rtol=1e-4)
    h = 1e-2
    for direction in (jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])):
        fd = (loss(p + h * direction, False) - loss(p - h * direction, False)) / (2 * h)
        np.testing.assert_allclose(jnp.dot(g_f, direction), fd, rtol=2e-2)


def test_without_the_kernel_the_fused_path_is_the_general_scan():
    """Off CPU, or without the compiled library, `_hh_fused` runs the general scan: identical."""
    hh = nj.HodgkinHuxley(method="exp_euler")
    state = hh.init_state(200, key=jax.random.key(2))
    current = _currents(200, 0.0, 25.0)
    with nj.kernels.use("reference"):
        assert "nj_hh_run" not in _lowered(hh, state, current, dt=DT, n_steps=500)
        for every in (1, 25):
            fused = nj.simulate(hh, state, current, dt=DT, n_steps=1000, record_every=every)
            general = _general(hh, state, current, dt=DT, n_steps=1000, record_every=every)
            np.testing.assert_array_equal(fused[1].spikes, general[1].spikes)
            assert fused[1].spikes.dtype == general[1].spikes.dtype
            np.testing.assert_array_equal(fused[0].v, general[0].v)
            np.testing.assert_array_equal(fused[0].n, general[0].n)


@pytest.mark.parametrize("kwargs", GENERAL_PATH_OPTIONS)
def test_other_configurations_take_the_general_path(kernel, kwargs):
    hh = nj.HodgkinHuxley()
    state = hh.init_state(16)
    assert "nj_hh_run" not in _lowered(hh, state, 10.0, dt=DT, n_steps=100, **kwargs)


def test_applies_only_to_hodgkin_huxley_steps_with_constant_float_input():
    hh = nj.HodgkinHuxley()
    state = hh.init_state(8)

    def applies(model=hh, st=state, inputs=None, kind="none"):
        options = {**FUSED_APPLIES_OPTIONS, "kind": kind}
        return _hh_fused.applies(model, st, inputs, **options)

    assert applies()
    assert applies(inputs=jnp.ones(8), kind="const")
    assert not applies(inputs=jnp.ones(8, jnp.int32), kind="const")
    assert not applies(inputs=jnp.ones(9), kind="const")
    assert not applies(kind="series")
    assert not applies(kind="fn")
    assert not applies(st=nj.HHState(state.v, state.m, state.h, state.n[:4]))

    # A subclass keeps the fused run while it keeps `HodgkinHuxley.step`.
    class Custom(nj.HodgkinHuxley):
        pass

    class OwnStep(nj.HodgkinHuxley):
        def step(self, state, current, dt):
            return super().step(state, current, dt)

    assert applies(model=Custom())
    assert not applies(model=OwnStep())
    options = {**FUSED_APPLIES_OPTIONS, "kind": "none"}
    del options["record_every"]
    assert OwnStep().fused_run(state, None, DT, 10, 1, **options) is None
    assert not applies(model=nj.LIF(), st=nj.LIF().init_state(8))


def test_nonfinite_state_stays_nonfinite(kernel):
    """A NaN start propagates (the kernel's clamped exp passes NaN through) as in `step`;
    `nj.simulate` itself refuses such a state before the run."""
    hh = nj.HodgkinHuxley()
    state = hh.init_state(4)
    state = nj.HHState(state.v.at[1].set(jnp.nan), state.m, state.h, state.n)
    with pytest.raises(ValueError, match="initial state field v holds 1 NaN"):
        nj.simulate(hh, state, 10.0, dt=DT, n_steps=200)
    options = dict(
        kind="const", record=None, spike_dtype="bool", check=False, checkpoint=False,
        truncate_backprop=None,
    )  # fmt: skip
    final, spikes = jax.jit(lambda s: hh.fused_run(s, jnp.float32(10.0), DT, 200, 1, **options))(
        state
    )

    def step(st, _):
        st, out = hh.step(st, jnp.float32(10.0), DT)
        return st, out

    general, _ = jax.lax.scan(step, state, None, length=200)
    assert np.isnan(final.v[1]) and np.isnan(general.v[1])
    assert np.all(np.isfinite(np.asarray(final.v)[[0, 2, 3]]))
    assert not bool(np.asarray(spikes)[:, 1].any())
