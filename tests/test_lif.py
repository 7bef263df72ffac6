"""LIF against its analytic solution (REFERENCE.md "LIF (analytic)", NEST iaf_psc_alpha values)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj

# NEST iaf_psc_alpha defaults in nj.LIF terms: C = 250 pF, tau_m = 10 ms -> r_m = 40 MOhm.
NEST = dict(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=2.0)


def analytic_isi(i_na, tau_m=10.0, r_m=40.0, t_ref=2.0, dv_reset=0.0, dv_th=15.0):
    """ISI [ms] of a LIF at constant drive (REFERENCE.md formula), inf below rheobase."""
    ri = r_m * np.asarray(i_na, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        isi = t_ref + tau_m * np.log((ri - dv_reset) / (ri - dv_th))
    return np.where(ri > dv_th, isi, np.inf)


def spike_times(spikes, dt):
    """Times [ms] of the spikes of one neuron (a spike of step i is dated (i + 1) dt)."""
    return (np.nonzero(np.asarray(spikes))[0] + 1) * dt


def test_first_step_and_first_spike_match_nest():
    lif = nj.LIF(**NEST)
    final, rec = nj.simulate(lif, lif.init_state(1), 1.0, dt=0.1, n_steps=60, record=("v",))
    # NEST's testsuite value, printed to 3 decimals there; float32 resolves 1e-5 mV here.
    np.testing.assert_allclose(float(rec.v[0, 0]), -69.602, atol=5e-4)
    # Analytic crossing 4.700036 ms: on a 0.1 ms grid the spike belongs to the step ending at 4.8.
    assert spike_times(rec.spikes[:, 0], 0.1)[0] == pytest.approx(4.8)
    np.testing.assert_allclose(analytic_isi(1.0) - 2.0, 4.700036, atol=1e-6)


@pytest.mark.parametrize(
    "i_na, rate_hz",
    [(0.4, 33.64), (0.5, 63.04), (0.75, 111.96), (1.0, 149.25), (2.0, 245.31)],
)
def test_fi_table_within_one_percent(i_na, rate_hz):
    # REFERENCE.md's f-I table. On a grid every ISI is rounded up to a multiple of dt, so at
    # dt = 0.01 ms the rate is low by at most dt/ISI < 0.25 %: 1 % is a safe bound that
    # would still catch an off-by-one-step refractory period (2-6 % at these rates).
    dt = 0.01
    lif = nj.LIF(**NEST)
    _, rec = nj.simulate(lif, lif.init_state(1), i_na, dt=dt, n_steps=50_000)
    t = spike_times(rec.spikes[:, 0], dt)
    rate = 1000.0 / np.mean(np.diff(t))
    assert rate == pytest.approx(rate_hz, rel=0.01)
    assert rate == pytest.approx(1000.0 / analytic_isi(i_na), rel=0.01)


def test_rheobase():
    # r_m I must exceed v_th - v_rest = 15 mV: rheobase 0.375 nA.
    lif = nj.LIF(**NEST)
    currents = jnp.array([0.37, 0.374, 0.376, 0.38])
    _, rec = nj.simulate(lif, lif.init_state(4), currents, dt=0.1, n_steps=20_000)
    counts = np.asarray(rec.spikes.sum(0))
    assert counts[0] == 0 and counts[1] == 0
    assert counts[2] > 0 and counts[3] > counts[2]


def test_refractory_clamp_lasts_t_ref():
    dt, t_ref = 0.1, 2.0
    lif = nj.LIF(**NEST)
    _, rec = nj.simulate(
        lif, lif.init_state(1), 3.0, dt=dt, n_steps=200, record=("v", "refractory")
    )
    first = int(np.argmax(np.asarray(rec.spikes[:, 0])))
    v = np.asarray(rec.v[:, 0])
    n_ref = round(t_ref / dt)
    # At the spike and for the n_ref following steps v sits exactly at v_reset ...
    assert np.all(v[first : first + n_ref + 1] == -70.0)
    # ... and the step after that integrates again.
    assert v[first + n_ref + 1] > -70.0
    assert float(rec.refractory[first, 0]) == pytest.approx(t_ref)


def test_exact_integration_is_independent_of_dt():
    # Below threshold the exact scheme gives v(t) = v_inf + (v0 - v_inf) exp(-t / tau) on any grid.
    with jax.enable_x64(True):
        lif = nj.LIF(**NEST)
        t_end = 3.0
        expected = -70.0 + 40.0 * 0.3 * (1.0 - np.exp(-t_end / 10.0))
        for dt in (0.5, 0.1, 0.01):
            final, _ = nj.simulate(lif, lif.init_state(1), 0.3, dt=dt, n_steps=round(t_end / dt))
            np.testing.assert_allclose(float(final.v[0]), expected, rtol=0, atol=1e-10)


def test_per_neuron_parameters_equal_separate_models():
    taus = jnp.array([5.0, 10.0, 20.0])
    lif = nj.LIF(tau_m=taus, t_ref=1.0)
    _, rec = nj.simulate(lif, lif.init_state(3), 25.0, dt=0.1, n_steps=500, record=("v",))
    for j, tau in enumerate([5.0, 10.0, 20.0]):
        one = nj.LIF(tau_m=tau, t_ref=1.0)
        _, r1 = nj.simulate(one, one.init_state(1), 25.0, dt=0.1, n_steps=500, record=("v",))
        np.testing.assert_array_equal(np.asarray(rec.spikes[:, j]), np.asarray(r1.spikes[:, 0]))
        np.testing.assert_allclose(np.asarray(rec.v[:, j]), np.asarray(r1.v[:, 0]), rtol=1e-6)


def test_random_initial_state_range():
    lif = nj.LIF(**NEST)
    state = lif.init_state(10_000, key=jax.random.key(0))
    v = np.asarray(state.v)
    assert v.min() >= -70.0 and v.max() < -55.0
    # Uniform on [-70, -55): mean -62.5, standard error 15/sqrt(12 * 1e4) = 0.043 mV.
    assert v.mean() == pytest.approx(-62.5, abs=0.2)
