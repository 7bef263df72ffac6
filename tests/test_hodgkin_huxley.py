"""Hodgkin-Huxley against a high-precision ODE solve (REFERENCE.md "Hodgkin-Huxley").

The reference is scipy's `solve_ivp` (DOP853, rtol 1e-10, atol 1e-12, max_step 0.1 ms) on the
same equations written independently in plain Python, with spikes located by event detection
(upward zero crossings of v). Model spike times are the end of the step in which the crossing
happens (the convention of `nj.simulate`), so they lag the exact crossing by up to one dt.
"""

import functools
import math

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

import neurojax as nj
from neurojax.neurons._hodgkin_huxley import hh_rates

METHODS = ("rk4", "exp_euler")
DT = 0.01  # ms
REST_PUBLISHED = -64.996  # mV, REFERENCE.md [computed]
THRESHOLD_PUBLISHED = 2.24  # uA/cm^2, single spike within 100 ms, REFERENCE.md [computed]
RATE_PUBLISHED = 68.3  # Hz at 10 uA/cm^2, REFERENCE.md [computed]


# ---------------------------------------------------------------------------------------
# Independent reference: the 1952 equations in plain Python floats.


def ref_rates(v: float) -> tuple[float, ...]:
    x_m, x_n = (v + 40.0) / 10.0, (v + 55.0) / 10.0
    a_m = 1.0 if x_m == 0.0 else 0.1 * (v + 40.0) / -math.expm1(-x_m)
    a_n = 0.1 if x_n == 0.0 else 0.01 * (v + 55.0) / -math.expm1(-x_n)
    return (
        a_m,
        4.0 * math.exp(-(v + 65.0) / 18.0),
        0.07 * math.exp(-(v + 65.0) / 20.0),
        1.0 / (1.0 + math.exp(-(v + 35.0) / 10.0)),
        a_n,
        0.125 * math.exp(-(v + 65.0) / 80.0),
    )


def ref_rhs(t, y, current):
    v, m, h, n = y
    am, bm, ah, bh, an, bn = ref_rates(v)
    i_ion = 120.0 * m**3 * h * (v - 50.0) + 36.0 * n**4 * (v + 77.0) + 0.3 * (v + 54.387)
    return [current - i_ion, am * (1 - m) - bm * m, ah * (1 - h) - bh * h, an * (1 - n) - bn * n]


def ref_gates(v: float) -> tuple[float, float, float]:
    am, bm, ah, bh, an, bn = ref_rates(v)
    return am / (am + bm), ah / (ah + bh), an / (an + bn)


@functools.lru_cache
def ref_rest() -> tuple[float, ...]:
    """Resting state: the zero of the steady-state current, by bracketing (not Newton)."""

    def current(v):
        m, h, n = ref_gates(v)
        return 120.0 * m**3 * h * (v - 50.0) + 36.0 * n**4 * (v + 77.0) + 0.3 * (v + 54.387)

    v = brentq(current, -70.0, -60.0, xtol=1e-13, rtol=1e-15)
    return (v, *ref_gates(v))


def ref_solve(current: float, t_end: float, y0=None):
    """Spike times [ms] and the solution object of the reference solve from `y0` (rest)."""

    def crossing(t, y, current):
        return y[0]

    crossing.direction = 1.0
    sol = solve_ivp(
        ref_rhs,
        (0.0, t_end),
        ref_rest() if y0 is None else y0,
        method="DOP853",
        rtol=1e-10,
        atol=1e-12,
        max_step=0.1,
        events=crossing,
        args=(current,),
        dense_output=False,
    )
    assert sol.success, sol.message
    return sol.t_events[0], sol


@functools.lru_cache
def ref_spikes_10() -> np.ndarray:
    """Spike times over 1.1 s at 10 uA/cm^2 (shared by the spike-time and rate tests)."""
    return ref_solve(10.0, 1100.0)[0]


@functools.lru_cache
def ref_threshold() -> tuple[float, float]:
    """Bracket `(lo, hi)` of the smallest current with a spike within 100 ms (bisection)."""
    lo, hi = 2.0, 2.5
    assert len(ref_solve(lo, 100.0)[0]) == 0 and len(ref_solve(hi, 100.0)[0]) > 0
    for _ in range(6):
        mid = 0.5 * (lo + hi)
        if len(ref_solve(mid, 100.0)[0]) > 0:
            hi = mid
        else:
            lo = mid
    return lo, hi


# ---------------------------------------------------------------------------------------
# Model helpers.


def run(model, state, current, n_steps, dt=DT, record=("v",)):
    return nj.simulate(model, state, current, dt=dt, n_steps=n_steps, record=record)


def spike_times(spikes, dt=DT) -> np.ndarray:
    """End-of-step times [ms] of the spikes of one neuron."""
    return (np.nonzero(np.asarray(spikes))[0] + 1) * dt


def scan_steps(model, state, current, n_steps, dt=DT):
    """Plain `lax.scan` over `step`, returning float spikes (differentiable) and v."""

    def body(s, _):
        s, spikes = model.step(s, current, dt)
        return s, (spikes, s.v)

    return jax.lax.scan(body, state, None, length=n_steps)


# ---------------------------------------------------------------------------------------
# Rate functions.


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_rates_match_formulas(x64):
    with jax.enable_x64(x64):
        dtype = np.float64 if x64 else np.float32
        v = np.concatenate(
            [
                np.linspace(-120.0, 80.0, 20001),
                -40.0 + np.linspace(-1, 1, 2001),
                -55.0 + np.linspace(-1, 1, 2001),
            ]
        ).astype(dtype)
        got = jax.jit(hh_rates)(jnp.asarray(v))
        assert all(r.dtype == dtype for r in got)
    want = np.array([ref_rates(float(x)) for x in v]).T
    # The reference is evaluated in float64 at the same (rounded) voltages, so the error is
    # the model's own arithmetic: float32 reaches ~1e-6 relative (exp of an argument of up to
    # 10 carries ~10 ulp), float64 ~5e-14 (cancellation in 1 - exp(-x) just outside the
    # Taylor branch, eps / 0.01).
    rtol = 1e-13 if x64 else 3e-6
    for name, g, w in zip(("a_m", "b_m", "a_h", "b_h", "a_n", "b_n"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=0, err_msg=name)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("v0, index, limit, slope", [(-40.0, 0, 1.0, 0.05), (-55.0, 4, 0.1, 0.005)])
def test_removable_singularities(x64, v0, index, limit, slope):
    """alpha_m at -40 mV and alpha_n at -55 mV: exact limits, finite gradient, continuity."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        rate = lambda v: hh_rates(v)[index]  # noqa: E731
        value = float(rate(jnp.asarray(v0, dtype)))
        grad = float(jax.grad(rate)(jnp.asarray(v0, dtype)))
        # Limits of c x / (1 - exp(-x)) at x = 0: value c, slope c / 2 per 10 mV.
        tol = 1e-13 if x64 else 1e-6
        assert value == pytest.approx(limit, rel=tol)
        assert grad == pytest.approx(slope, rel=tol)
        # Across the switch between series and quotient (|x| = 0.01 in float64, 0.5 in
        # float32, i.e. 0.1 and 5 mV): the gradient agrees with a central difference of the
        # float64 reference formula on both sides.
        for dv in (-5.1, -4.9, -0.11, -0.09, 0.09, 0.11, 4.9, 5.1):
            g = float(jax.grad(rate)(jnp.asarray(v0 + dv, dtype)))
            h = 1e-5
            fd = (ref_rates(v0 + dv + h)[index] - ref_rates(v0 + dv - h)[index]) / (2 * h)
            assert g == pytest.approx(fd, rel=1e-8 if x64 else 1e-4)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("method", METHODS)
def test_step_at_singular_voltages_is_finite(x64, method):
    with jax.enable_x64(x64):
        hh = nj.HodgkinHuxley(method=method)
        v = jnp.array([-40.0, -55.0])
        m, h, n = hh.gate_steady_state(v)
        state = nj.HHState(v=v, m=m, h=h, n=n)

        def loss(v):
            new, spikes = hh.step(nj.HHState(v=v, m=m, h=h, n=n), 3.0, DT)
            return new.v.sum() + new.m.sum() + new.n.sum() + spikes.sum()

        new, _ = hh.step(state, 3.0, DT)
        g = jax.grad(loss)(v)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in (new.v, new.m, new.h, new.n, g))
        # d v_new / d v is close to 1 for a 0.01 ms step (the membrane time constant is ms).
        np.testing.assert_allclose(np.asarray(g), 1.0, atol=0.1)


# ---------------------------------------------------------------------------------------
# Resting state.


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_init_state_is_the_resting_state(x64):
    with jax.enable_x64(x64):
        hh = nj.HodgkinHuxley()
        state = hh.init_state((2, 3))
        assert state.v.shape == (2, 3) and state.v.dtype == (jnp.float64 if x64 else jnp.float32)
        rest = np.array(ref_rest())
        got = np.array([np.asarray(x)[1, 2] for x in (state.v, state.m, state.h, state.n)])
    # Newton converges to rounding: float64 to 1e-10, float32 to a few ulp of 65 mV.
    np.testing.assert_allclose(got, rest, rtol=0, atol=1e-10 if x64 else 3e-5)
    assert got[0] == pytest.approx(REST_PUBLISHED, abs=5e-4)  # published to 3 decimals


@pytest.mark.parametrize("method", METHODS)
def test_long_zero_input_run_settles_at_rest(method):
    """From the classic textbook start (v, m, h, n) = (-65, 0.05, 0.6, 0.32), 300 ms of no input."""
    y0 = (-65.0, 0.05, 0.6, 0.32)
    _, sol = ref_solve(0.0, 300.0, y0)
    rest = ref_rest()
    for x64, tol in ((True, 1e-6), (False, 1e-3)):
        with jax.enable_x64(x64):
            hh = nj.HodgkinHuxley(method=method)
            state = nj.HHState(*(jnp.full((1,), x) for x in y0))
            final, rec = run(hh, state, None, 30_000, record=None)
            v_end = float(final.v[0])
        assert not np.asarray(rec.spikes).any()
        # float64: the reference itself has settled to 1e-9 mV; the 1e-6 tolerance covers the
        # integration error. float32: once dt dv/dt falls below half an ulp of v (7.6e-6 mV)
        # the update rounds to nothing, which leaves v about 3e-4 mV short of rest.
        assert v_end == pytest.approx(sol.y[0, -1], abs=tol)
        assert v_end == pytest.approx(rest[0], abs=tol)


def test_init_state_with_key_randomises_v_up_to_10_mv_above_rest():
    hh = nj.HodgkinHuxley()
    rest = hh.init_state(200)
    state = hh.init_state(200, key=jr.PRNGKey(0))
    dv = np.asarray(state.v - rest.v)
    assert np.all((dv >= 0.0) & (dv < 10.0)) and dv.min() < 0.5 and dv.max() > 9.5
    assert np.array_equal(np.asarray(state.v), np.asarray(hh.init_state(200, key=jr.PRNGKey(0)).v))
    m, h, n = hh.gate_steady_state(state.v)
    for got, want in ((state.m, m), (state.h, h), (state.n, n)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Released from anywhere up to 10 mV above rest, no neuron fires and all relax to rest.
    final, rec = run(hh, state, None, 10_000, record=None)
    assert not np.asarray(rec.spikes).any()
    np.testing.assert_allclose(np.asarray(final.v), np.asarray(rest.v), atol=0.05)


def test_resting_state_under_a_current_is_an_equilibrium():
    with jax.enable_x64(True):
        hh = nj.HodgkinHuxley()
        state = hh.resting_state(3, current=jnp.array([-2.0, 1.0, 5.0]))
        # steady_current(v) equals the holding current, and the reference field is zero there.
        np.testing.assert_allclose(np.asarray(hh.steady_current(state.v)), [-2.0, 1.0, 5.0])
        for k, i in enumerate((-2.0, 1.0, 5.0)):
            y = [float(np.asarray(x)[k]) for x in (state.v, state.m, state.h, state.n)]
            np.testing.assert_allclose(ref_rhs(0.0, y, i), 0.0, atol=1e-10)


def test_no_resting_potential_without_conductances():
    hh = nj.HodgkinHuxley(g_na=0.0, g_k=0.0, g_l=0.0)
    with pytest.raises(RuntimeError, match="HodgkinHuxley: no resting potential found"):
        hh.init_state(2)


# ---------------------------------------------------------------------------------------
# Spikes against the reference solve.


@pytest.mark.parametrize("method", METHODS)
def test_spike_times_at_10_ua(method):
    ref = ref_spikes_10()
    ref = ref[ref < 100.0]
    hh = nj.HodgkinHuxley(method=method)
    _, rec = run(hh, hh.init_state(1), 10.0, 10_000, record=None)
    got = spike_times(rec.spikes[:, 0])
    assert len(got) == len(ref) == 7
    # A spike is dated at the end of its step: the lag from the exact crossing lies in
    # [0, dt) plus the integration error (measured <= 1e-4 ms for rk4 and 5e-3 ms for
    # exp_euler over these 100 ms at dt = 0.01 ms); 0.05 ms is the required bound.
    err = got - ref
    assert np.all(np.abs(err) <= 0.05), err
    assert np.all(err > -0.006), err


@pytest.mark.parametrize("method", METHODS)
def test_single_spike_threshold(method):
    lo, hi = ref_threshold()
    assert hi - lo < 0.01
    assert 0.5 * (lo + hi) == pytest.approx(THRESHOLD_PUBLISHED, abs=0.01)
    currents = 2.0 + 0.01 * np.arange(51)
    hh = nj.HodgkinHuxley(method=method)
    _, rec = run(hh, hh.init_state(51), jnp.asarray(currents), 10_000, record=None)
    fired = np.asarray(rec.spikes).any(axis=0)
    assert fired[-1] and not fired[0]
    # Spiking must be monotone in the current: no neuron below the first one that fires.
    first = int(np.argmax(fired))
    assert fired[first:].all()
    threshold = currents[first]
    assert threshold == pytest.approx(THRESHOLD_PUBLISHED, abs=0.05)
    # The 0.01 grid puts the first firing current within 0.01 above the model's threshold,
    # which agrees with the reference bracket to its width.
    assert lo - 0.005 <= threshold <= hi + 0.01


@pytest.mark.parametrize("method", METHODS)
def test_steady_rate_at_10_ua(method):
    ref = ref_spikes_10()
    window = ref[ref > 100.0]
    ref_rate = 1000.0 * (len(window) - 1) / (window[-1] - window[0])
    assert ref_rate == pytest.approx(RATE_PUBLISHED, rel=1e-3)
    hh = nj.HodgkinHuxley(method=method)
    _, rec = run(hh, hh.init_state(1), 10.0, 110_000, record=None)
    got = spike_times(rec.spikes[:, 0])
    assert len(got) == len(ref)
    win = got[got > 100.0]
    rate = 1000.0 * (len(win) - 1) / (win[-1] - win[0])
    assert rate == pytest.approx(RATE_PUBLISHED, rel=0.01)
    # Against the reference: measured 1e-5 (rk4) and 6e-5 (exp_euler) relative; the dt grid
    # alone moves the window's end points by up to 0.01 ms in 1000 ms (1e-5).
    assert rate == pytest.approx(ref_rate, rel=5e-4)


def test_spikes_are_upward_crossings_without_reset():
    hh = nj.HodgkinHuxley()
    state = hh.init_state(1)
    _, rec = run(hh, state, 20.0, 5_000)
    v = np.concatenate([np.asarray(state.v), np.asarray(rec.v[:, 0])])
    want = (v[1:] >= 0.0) & (v[:-1] < 0.0)
    np.testing.assert_array_equal(np.asarray(rec.spikes[:, 0]), want)
    assert want.sum() >= 5 and v.max() > 30.0  # full action potentials, no reset
    # A neuron already above v_spike at the start of a step does not fire again.
    top = nj.HHState(*(jnp.full((1,), x) for x in (20.0, 0.9, 0.3, 0.5)))
    _, s = hh.step(top, 0.0, DT)
    assert float(s[0]) == 0.0


# ---------------------------------------------------------------------------------------
# Precision and gradients.


@pytest.mark.parametrize("method", METHODS)
def test_float32_follows_float64(method):
    traces = {}
    for x64 in (False, True):
        with jax.enable_x64(x64):
            hh = nj.HodgkinHuxley(method=method)
            state = hh.init_state(2)
            _, rec = run(hh, state, jnp.array([10.0, 1.0]), 10_000)
            v = np.concatenate([np.asarray(state.v)[None], np.asarray(rec.v)])
            traces[x64] = v.astype(np.float64)
    t = np.arange(10_001) * DT

    def crossings(v):
        k = np.nonzero((v[1:] >= 0) & (v[:-1] < 0))[0]
        return t[k] + DT * (-v[k]) / (v[k + 1] - v[k])

    c32, c64 = crossings(traces[False][:, 0]), crossings(traces[True][:, 0])
    assert len(c32) == len(c64) == 7
    # Interpolated spike times: measured 8e-5 ms apart after 100 ms (float32 rounding of the
    # state shifts the phase slowly); subthreshold v: measured 9e-4 mV apart, float32
    # stagnation once increments fall below half an ulp of v (see the rest test).
    np.testing.assert_allclose(c32, c64, atol=1e-3)
    np.testing.assert_allclose(traces[False][:, 1], traces[True][:, 1], atol=5e-3)


@pytest.mark.parametrize("method", METHODS)
def test_subthreshold_gradient_matches_finite_differences(method):
    with jax.enable_x64(True):
        hh = nj.HodgkinHuxley(method=method)
        state = hh.init_state(1)

        @jax.jit
        def mean_v(current):
            _, (_, v) = scan_steps(hh, state, current, 2_000)
            return v.mean()

        # Smooth (no spike at I = 1 uA/cm^2), so forward and reverse mode must agree with
        # central differences; float64 makes the difference quotient accurate to ~1e-9.
        check_grads(mean_v, (1.0,), order=1, modes=("fwd", "rev"), eps=1e-4, atol=1e-7, rtol=1e-6)
        # Sanity of the scale: about the input resistance (~1.5 kOhm cm^2 at rest) averaged
        # over the charging curve, positive and below the steady-state slope.
        g = float(jax.grad(mean_v)(1.0))
        assert 0.5 < g < 1.5 / 0.68


@pytest.mark.parametrize("method", METHODS)
def test_spike_count_gradient_flows_through_surrogate(method):
    state = nj.HodgkinHuxley().init_state(1)

    def count(current, model):
        _, (spikes, _) = scan_steps(model, state, current, 5_000)
        return spikes.sum()

    grads = {}
    for name in ("fast_sigmoid", "arctan"):
        model = nj.HodgkinHuxley(method=method, surrogate=name)
        n, grads[name] = jax.jit(jax.value_and_grad(count))(10.0, model)
        assert float(n) == np.sum(ref_spikes_10() < 50.0) == 4
        assert np.isfinite(float(grads[name])) and float(grads[name]) != 0.0
    # The forward pass does not depend on the surrogate, so a gradient that changes with it
    # can only have come through it.
    assert float(grads["fast_sigmoid"]) != pytest.approx(float(grads["arctan"]), rel=1e-3)


# ---------------------------------------------------------------------------------------
# Parameters.


def test_per_neuron_parameters_equal_separate_models():
    g_k = jnp.array([36.0, 30.0])
    both = nj.HodgkinHuxley(g_k=g_k)
    _, rec = run(both, both.init_state(2), 10.0, 3_000)
    for k in range(2):
        single = nj.HodgkinHuxley(g_k=float(g_k[k]))
        _, r = run(single, single.init_state(1), 10.0, 3_000)
        np.testing.assert_allclose(np.asarray(rec.v[:, k]), np.asarray(r.v[:, 0]), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(c_m=0.0), ValueError, r"HodgkinHuxley: c_m must be > 0 uF/cm\^2, got 0\.0"),
        (dict(c_m=-1.0), ValueError, r"HodgkinHuxley: c_m must be > 0 uF/cm\^2, got -1\.0"),
        (dict(g_na=-1.0), ValueError, r"HodgkinHuxley: g_na must be >= 0 mS/cm\^2, got -1\.0"),
        (
            dict(g_k=jnp.array([36.0, -2.0])),
            ValueError,
            r"HodgkinHuxley: g_k must be >= 0 mS/cm\^2, got \[-2\.\]",
        ),
        (dict(g_l=float("nan")), ValueError, r"HodgkinHuxley: g_l must be finite, got nan"),
        (dict(e_na=float("inf")), ValueError, r"HodgkinHuxley: e_na must be finite, got inf"),
        (dict(e_k=float("-inf")), ValueError, r"HodgkinHuxley: e_k must be finite, got -inf"),
        (dict(e_l=float("nan")), ValueError, r"HodgkinHuxley: e_l must be finite, got nan"),
        (dict(v_spike=float("nan")), ValueError, r"HodgkinHuxley: v_spike must be finite"),
        (
            dict(method="euler"),
            ValueError,
            r"HodgkinHuxley: method must be one of \('rk4', 'exp_euler'\), got 'euler'",
        ),
        (dict(c_m="1"), TypeError, r"got string '1'"),
        (dict(surrogate="sigmoid"), ValueError, r"surrogate must be .*got 'sigmoid'"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        nj.HodgkinHuxley(**kwargs)


def test_parameter_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"parameter g_na has shape \(4,\), which does not"):
        nj.HodgkinHuxley(g_na=jnp.ones(4)).init_state(3)
