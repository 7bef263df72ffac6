"""`nj.analysis`: spike-train statistics against hand-built rasters, analytic values and
plain-NumPy references, and the plots on small data with the Agg backend.

Statistical tests draw Bernoulli rasters with NumPy (fixed seeds): each step of `dt` holds a
spike with probability `p = rate * dt`, the discrete-time Poisson process. Its exact values,
used as references, are: ISIs geometric with CV `sqrt(1 - p)`; counts in a window of `m`
steps Binomial(m, p) with Fano factor `1 - p`. Each tolerance is stated next to its test with
the standard error it covers.
"""

import io
import math

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402

import neurojax as nj  # noqa: E402
from neurojax import analysis as na  # noqa: E402

DT = 0.1  # ms


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def poisson_raster(seed: int, shape: tuple[int, ...], rate_hz: float, dt: float = DT):
    p = rate_hz * dt / 1000.0
    return np.random.default_rng(seed).random(shape) < p, p


def regular_raster(n_steps: int, n: int, period: int, phases=None) -> np.ndarray:
    """Neuron i fires every `period` steps, first at step `phases[i]`."""
    s = np.zeros((n_steps, n), bool)
    for i, ph in enumerate(phases if phases is not None else range(n)):
        s[ph::period, i] = True
    return s


def reference_cv(train: np.ndarray, dt: float) -> float:
    t = np.flatnonzero(train) * dt
    d = np.diff(t)
    return float(np.std(d) / np.mean(d)) if t.size >= 3 else math.nan


# --------------------------------------------------------------------------------- rates


def test_firing_rates_of_hand_built_raster():
    s = np.zeros((1000, 3), bool)  # 1000 steps of 0.1 ms = 100 ms
    s[::10, 0] = True  # 100 spikes -> 1000 Hz
    s[[3, 40, 500, 501, 999], 1] = True  # 5 spikes -> 50 Hz
    want = np.array([1000.0, 50.0, 0.0])
    np.testing.assert_allclose(na.firing_rates(s, dt=DT), want, rtol=1e-12)
    # JAX arrays, 0/1 floats and integers give the same; batches keep their axes.
    np.testing.assert_allclose(na.firing_rates(jnp.asarray(s), dt=DT), want, rtol=1e-12)
    np.testing.assert_allclose(na.firing_rates(s.astype(np.float32), dt=DT), want, rtol=1e-12)
    batched = np.stack([s, s[:, ::-1]], axis=1)  # (t, 2, n)
    np.testing.assert_allclose(na.firing_rates(batched, dt=DT), [want, want[::-1]], rtol=1e-12)


def test_population_and_binned_rates_are_exact():
    s = np.zeros((100, 4), bool)  # 10 ms
    s[5, [0, 1]] = True  # two spikes in [0.5, 0.6) ms, bin 0 of 1 ms
    s[15, 2] = True  # bin 1
    s[99, 3] = True  # last row, bin 9
    pop = na.population_rate(s, dt=DT, bin_ms=1.0)
    # 2 spikes / (4 neurons * 1 ms) = 500 Hz
    np.testing.assert_array_equal(pop.rate, [500.0, 250.0, 0, 0, 0, 0, 0, 0, 0, 250.0])
    np.testing.assert_allclose(pop.edges, np.arange(11.0))
    np.testing.assert_allclose(pop.centres, np.arange(10) + 0.5)
    # One row per bin by default: 2 spikes / (4 * 0.1 ms) = 5000 Hz.
    per_row = na.population_rate(s, dt=DT)
    assert per_row.rate.shape == (100,)
    assert per_row.rate[5] == pytest.approx(5000.0) and per_row.rate[15] == pytest.approx(2500.0)
    binned = na.time_binned_rates(s, dt=DT, bin_ms=5.0)
    want = np.zeros((2, 4))
    want[0, :3] = 200.0  # one spike in 5 ms
    want[1, 3] = 200.0
    np.testing.assert_allclose(binned.rate, want, rtol=1e-12)
    np.testing.assert_allclose(binned.centres, [2.5, 7.5])
    # The mean of the binned rates over time is the mean firing rate.
    np.testing.assert_allclose(binned.rate.mean(axis=0), na.firing_rates(s, dt=DT), rtol=1e-12)
    # Batched: one population rate per trial.
    batched = np.stack([s, np.zeros_like(s)], axis=1)
    assert na.population_rate(batched, dt=DT, bin_ms=1.0).rate.shape == (10, 2)
    np.testing.assert_array_equal(
        na.population_rate(batched, dt=DT, bin_ms=1.0).rate[:, 0], pop.rate
    )


def test_record_every_counts_count_every_spike():
    fine, _ = poisson_raster(0, (1000, 6), 200.0)
    fine[10:15, 0] = True  # 5 spikes inside one window of 5 steps: a count of 5
    counts = fine.reshape(200, 5, 6).sum(axis=1).astype(np.uint8)
    assert counts.max() > 1
    np.testing.assert_allclose(
        na.firing_rates(counts, dt=DT, record_every=5), na.firing_rates(fine, dt=DT), rtol=1e-12
    )
    np.testing.assert_allclose(
        na.population_rate(counts, dt=DT, bin_ms=2.0, record_every=5).rate,
        na.population_rate(fine, dt=DT, bin_ms=2.0).rate,
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        na.fano_factor(counts, dt=DT, window_ms=10.0, record_every=5),
        na.fano_factor(fine, dt=DT, window_ms=10.0),
        rtol=1e-12,
    )
    # ISIs are undefined inside a row holding several spikes: rejected, not invented.
    with pytest.raises(ValueError, match=r"isi: spikes holds 5 spikes in one row \(row 2"):
        na.isi(counts, dt=DT, record_every=5)
    with pytest.raises(ValueError, match="cv_isi: .* record_every=1"):
        na.cv_isi(counts, dt=DT, record_every=5)
    # A window of 5 steps cannot be cut into bins of 0.2 ms.
    with pytest.raises(
        ValueError, match=r"bin_ms=0.2 ms is not a whole multiple of the row duration 0.5 ms"
    ):
        na.population_rate(counts, dt=DT, bin_ms=0.2, record_every=5)


def test_recording_from_simulate():
    lif = nj.LIF(t_ref=2.0)
    currents = jnp.linspace(14.0, 40.0, 8)
    _, rec1 = nj.simulate(lif, lif.init_state(8), currents, dt=DT, n_steps=2000, record=("v",))
    _, rec5 = nj.simulate(lif, lif.init_state(8), currents, dt=DT, n_steps=2000, record_every=5)
    r1 = na.firing_rates(rec1, dt=DT)
    np.testing.assert_allclose(na.firing_rates(rec5, dt=DT, record_every=5), r1, rtol=1e-12)
    np.testing.assert_allclose(r1, na.firing_rates(rec1.spikes, dt=DT), rtol=1e-12)
    assert r1[0] == 0.0 and np.all(np.diff(r1[1:]) >= 0) and r1[-1] > 50.0
    # A constant drive gives a regular train: CV 0 wherever the neuron fires 3 spikes or more.
    res = na.cv_isi(rec1, dt=DT)
    assert res.qualified[1:].all()
    np.testing.assert_allclose(res.cv[res.qualified], 0.0, atol=1e-12)
    with pytest.raises(
        ValueError,
        match=r"firing_rates: the recording's rows are 0.5 ms apart but dt \* record_every = 0.1 \* 1 = 0.1 ms",
    ):
        na.firing_rates(rec5, dt=DT)
    ax = na.raster(rec1, dt=DT)
    assert ax.collections[0].get_offsets().shape[0] == int(np.asarray(rec1.spikes).sum())
    ax = na.voltage_traces(rec1.t, rec1.v, neurons=[0, 7])
    assert len(ax.lines) == 2
    np.testing.assert_allclose(ax.lines[1].get_ydata(), np.asarray(rec1.v)[:, 7])


# ---------------------------------------------------------------------------------- ISIs


def test_isi_lists_and_padding():
    s = np.zeros((100, 3), bool)
    s[[9, 29, 59], 0] = True
    s[[50], 1] = True
    out = na.isi(s, dt=DT)
    assert len(out) == 3
    np.testing.assert_allclose(out[0], [2.0, 3.0])
    assert out[1].size == 0 and out[2].size == 0
    padded = na.isi(s, dt=DT, pad=np.nan)
    assert padded.shape == (3, 2)
    np.testing.assert_allclose(padded[0], [2.0, 3.0])
    assert np.isnan(padded[1:]).all()
    batched = na.isi(np.stack([s, s[:, ::-1]], axis=1), dt=DT)  # (t, 2, 3): nested lists
    assert len(batched) == 2 and len(batched[1]) == 3
    np.testing.assert_allclose(batched[1][2], [2.0, 3.0])
    # With record_every, counts of 0 and 1 are fine: intervals in whole rows.
    np.testing.assert_allclose(na.isi(s, dt=0.02, record_every=5)[0], [2.0, 3.0])


def test_cv_of_regular_trains_is_zero_and_small_counts_are_reported():
    s = regular_raster(5000, 5, period=37, phases=[0, 3, 11, 36, 20])
    s[:, 4] = False
    s[[100, 300], 4] = True  # two spikes: below min_spikes=3
    res = na.cv_isi(s, dt=DT)
    np.testing.assert_array_equal(res.cv[:4], 0.0)
    assert np.isnan(res.cv[4])
    np.testing.assert_array_equal(res.qualified, [True, True, True, True, False])
    np.testing.assert_array_equal(res.n_spikes, s.sum(axis=0))
    # min_spikes=2 lets one interval count: its CV is 0.
    assert na.cv_isi(s, dt=DT, min_spikes=2).cv[4] == 0.0


def test_cv_of_poisson_trains_is_one():
    # 300 neurons at 50 Hz for 2 s: about 100 intervals each.
    s, p = poisson_raster(1, (20_000, 300), 50.0)
    res = na.cv_isi(s, dt=DT)
    want = np.array([reference_cv(s[:, i], DT) for i in range(s.shape[1])])
    # Exact per neuron against np.diff / np.std on np.flatnonzero.
    np.testing.assert_allclose(res.cv, want, rtol=1e-10)
    assert res.qualified.all()
    # Geometric ISIs: CV = sqrt(1 - p) = 0.9975. The per-neuron CV of ~100 exponential
    # intervals has a standard deviation of about 0.1 and a bias of about -1 %; the mean over
    # 300 neurons has a standard error near 0.006: 0.04 is a band of over 5 standard errors
    # around the biased value.
    assert abs(res.cv.mean() - math.sqrt(1.0 - p)) < 0.04


# ---------------------------------------------------------------------------------- Fano


def test_fano_factor_poisson_and_regular():
    s, p = poisson_raster(2, (20_000, 300), 50.0)
    ff = na.fano_factor(s, dt=DT, window_ms=10.0)  # 200 windows of 100 steps
    # Independent reference: counts by np.add.reduceat, variance by np.var.
    counts = np.add.reduceat(s.astype(np.int64), np.arange(0, 20_000, 100), axis=0)
    np.testing.assert_allclose(ff, counts.var(axis=0) / counts.mean(axis=0), rtol=1e-12)
    # Binomial(100, p) counts: Fano 1 - p, times (W - 1) / W for the ddof=0 variance over
    # W = 200 windows. One neuron's estimate has a standard deviation near sqrt(2 / W) = 0.1;
    # the mean over 300 neurons about 0.006: tolerance 0.04.
    assert abs(ff.mean() - (1.0 - p) * 199 / 200) < 0.04
    pooled = na.fano_factor(s, dt=DT, window_ms=10.0, pooled=True)
    assert pooled.shape == ()
    # Independent neurons: the population count is Poisson-like too; one estimate over 200
    # windows has a standard deviation near 0.1: tolerance 0.35.
    assert abs(float(pooled) - 1.0) < 0.35
    # A regular train whose period divides the window: every window holds the same count.
    reg = regular_raster(10_000, 4, period=50, phases=[0, 7, 25, 49])
    np.testing.assert_array_equal(na.fano_factor(reg, dt=DT, window_ms=10.0), 0.0)
    np.testing.assert_array_equal(na.fano_factor(reg, dt=DT, window_ms=5.0), 0.0)
    # A silent neuron has no Fano factor.
    assert np.isnan(na.fano_factor(np.zeros((100, 2), bool), dt=DT, window_ms=1.0)).all()


# ----------------------------------------------------------------------------- synchrony


def reference_chi(s: np.ndarray, m: int) -> float:
    x = np.add.reduceat(s.astype(np.float64), np.arange(0, s.shape[0], m), axis=0)
    return float(np.sqrt(np.var(np.mean(x, axis=1)) / np.mean(np.var(x, axis=0))))


def test_synchrony_golomb_chi():
    train, _ = poisson_raster(3, (20_000, 1), 20.0)
    sync = np.repeat(train, 50, axis=1)  # 50 neurons firing together
    assert na.synchrony(sync, dt=DT, bin_ms=2.0) == pytest.approx(1.0, abs=1e-12)
    n = 200
    s, _ = poisson_raster(4, (20_000, n), 20.0)
    chi = na.synchrony(s, dt=DT, bin_ms=2.0)
    assert chi == pytest.approx(reference_chi(s, 20), rel=1e-10)
    # Independent neurons: chi^2 ~ 1/N. With B = 1000 bins the variance of the population
    # mean is estimated to a relative standard deviation sqrt(2 / B) = 4.5 %, so chi * sqrt(N)
    # lies within 1 +- 0.023 (1 sd): the band [0.85, 1.15] is over 6 standard deviations.
    assert 0.85 < chi * math.sqrt(n) < 1.15
    # Two independent synchronous halves: chi^2 ~ 1/2.
    a, _ = poisson_raster(5, (20_000, 1), 20.0)
    b, _ = poisson_raster(6, (20_000, 1), 20.0)
    halves = np.concatenate([np.repeat(a, 10, 1), np.repeat(b, 10, 1)], axis=1)
    chi_h = na.synchrony(halves, dt=DT, bin_ms=2.0)
    assert chi_h == pytest.approx(reference_chi(halves, 20), rel=1e-10)
    assert abs(chi_h**2 - 0.5) < 0.05
    # Batched: one chi per trial.
    batched = na.synchrony(np.stack([sync[:, :20], halves], axis=1), dt=DT, bin_ms=2.0)
    np.testing.assert_allclose(batched, [1.0, chi_h], rtol=1e-10)
    # A silent population has no chi.
    assert np.isnan(na.synchrony(np.zeros((100, 3), bool), dt=DT, bin_ms=1.0))


# ---------------------------------------------------------------------------------- PSTH


def test_psth_of_time_locked_spikes():
    trials, n = 20, 3
    s = np.zeros((500, trials, n), bool)  # 50 ms
    s[52, :, 0] = True  # every trial: a spike at 5.2 ms (bin [5, 6) ms)
    s[75, : trials // 2, 0] = True  # half of the trials: a spike at 7.5 ms
    s[200, 0, 1] = True  # one trial only
    p = na.psth(s, dt=DT, bin_ms=1.0)
    assert p.rate.shape == (50, n)
    want = np.zeros((50, n))
    want[5, 0] = 1000.0  # one spike per trial in 1 ms
    want[7, 0] = 500.0
    want[20, 1] = 1000.0 / trials
    np.testing.assert_allclose(p.rate, want, rtol=1e-12)
    np.testing.assert_allclose(p.edges[[0, -1]], [0.0, 50.0])
    # Trials on another batch axis.
    s2 = np.stack([s, np.zeros_like(s)], axis=1)  # (t, 2 conditions, trials, n)
    p2 = na.psth(s2, dt=DT, bin_ms=1.0, trial_axis=2)
    assert p2.rate.shape == (50, 2, n)
    np.testing.assert_allclose(p2.rate[:, 0], want, rtol=1e-12)
    np.testing.assert_allclose(na.psth(s2, dt=DT, bin_ms=1.0, trial_axis=-2).rate, p2.rate)


# --------------------------------------------------------------------------- populations


def test_dict_of_populations():
    e, _ = poisson_raster(7, (2000, 40), 30.0)
    i, _ = poisson_raster(8, (2000, 10), 80.0)
    pops = {"E": e, "I": jnp.asarray(i)}
    for fn, kw in [
        (na.firing_rates, {}),
        (na.fano_factor, {"window_ms": 20.0}),
        (na.synchrony, {"bin_ms": 2.0}),
    ]:
        out = fn(pops, dt=DT, **kw)
        assert set(out) == {"E", "I"}
        np.testing.assert_allclose(out["E"], fn(e, dt=DT, **kw), rtol=1e-12)
        np.testing.assert_allclose(out["I"], fn(i, dt=DT, **kw), rtol=1e-12)
    pop = na.population_rate(pops, dt=DT, bin_ms=10.0)
    np.testing.assert_allclose(pop["I"].rate, na.population_rate(i, dt=DT, bin_ms=10.0).rate)
    cv = na.cv_isi(pops, dt=DT)
    np.testing.assert_array_equal(cv["E"].qualified, na.cv_isi(e, dt=DT).qualified)
    assert len(na.isi(pops, dt=DT)["I"]) == 10
    # Errors name the population.
    with pytest.raises(
        ValueError,
        match=r"population_rate: bin_ms=4 ms does not divide the duration 10 ms of the raster spikes\['J'\] \(100 rows of 0.1 ms\)",
    ):
        na.population_rate({"E": e, "J": i[:100]}, dt=DT, bin_ms=4.0)


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda s: na.firing_rates(s, dt=0.0),
            ValueError,
            r"firing_rates: dt must be finite and > 0 ms, got 0.0",
        ),
        (
            lambda s: na.firing_rates(s, dt=-1),
            ValueError,
            r"firing_rates: dt must be finite and > 0 ms, got -1.0",
        ),
        (
            lambda s: na.firing_rates(s, dt=float("nan")),
            ValueError,
            r"dt must be finite and > 0 ms, got nan",
        ),
        (
            lambda s: na.firing_rates(s, dt="0.1"),
            TypeError,
            r"firing_rates: dt must be a Python number in ms, got '0.1'",
        ),
        (
            lambda s: na.firing_rates(s, dt=DT, record_every=0),
            ValueError,
            r"record_every must be a positive int, got 0",
        ),
        (
            lambda s: na.firing_rates(s[:, 0], dt=DT),
            ValueError,
            r"firing_rates: spikes must be a time-major raster of shape \(t, \*batch, n\) \(at least 2 dimensions\), got shape \(100,\); a single neuron's train of shape \(t,\) is spikes\[:, None\]",
        ),
        (
            lambda s: na.firing_rates(s[:0], dt=DT),
            ValueError,
            r"spikes must have at least one time step, got shape \(0, 4\)",
        ),
        (
            lambda s: na.firing_rates(-s.astype(np.int32), dt=DT),
            ValueError,
            r"spikes must hold spike counts >= 0, got a minimum of -1",
        ),
        (
            lambda s: na.firing_rates(0.5 * s, dt=DT),
            ValueError,
            r"spikes must hold spikes as 0/1 or whole spike counts >= 0, got 0.5 at index \(5, 0\)",
        ),
        (
            lambda s: na.firing_rates(s.astype(complex), dt=DT),
            TypeError,
            r"spikes must hold spikes as bool, integer counts or 0/1 floats, got dtype complex128",
        ),
        (lambda s: na.firing_rates({}, dt=DT), ValueError, r"spikes is an empty dict"),
        (
            lambda s: na.population_rate(s, dt=DT, bin_ms=3.0),
            ValueError,
            r"population_rate: bin_ms=3 ms does not divide the duration 10 ms of the raster \(100 rows of 0.1 ms\); allowed: whole multiples of the row duration 0.1 ms \(dt \* record_every\) that divide the duration 10 ms, nearest 2.5 ms and 5 ms",
        ),
        (
            lambda s: na.population_rate(s, dt=DT, bin_ms=0.25),
            ValueError,
            r"bin_ms=0.25 ms is not a whole multiple of the row duration 0.1 ms of the raster; allowed: .* nearest 0.2 ms and 0.4 ms",
        ),
        (
            lambda s: na.population_rate(s, dt=DT, bin_ms=20.0),
            ValueError,
            r"bin_ms=20 ms exceeds the duration 10 ms of the raster \(100 rows of 0.1 ms\); allowed: .* nearest 10 ms",
        ),
        (
            lambda s: na.population_rate(s, dt=DT, bin_ms=0.0),
            ValueError,
            r"population_rate: bin_ms must be finite and > 0 ms, got 0.0",
        ),
        (
            lambda s: na.time_binned_rates(s, dt=DT, bin_ms="1"),
            TypeError,
            r"time_binned_rates: bin_ms must be a number of ms, got '1'",
        ),
        (
            lambda s: na.fano_factor(s, dt=DT, window_ms=10.0),
            ValueError,
            r"fano_factor: window_ms=10 ms gives 1 bin\(s\) over the duration 10 ms of the raster, but at least 2 are needed for a variance over bins; allowed: .* into at least 2 bins, nearest 5 ms",
        ),
        (
            lambda s: na.fano_factor(s, dt=DT, window_ms=1.0, pooled=1),
            TypeError,
            r"fano_factor: pooled must be a bool, got 1",
        ),
        (
            lambda s: na.synchrony(s[:1], dt=DT, bin_ms=0.1),
            ValueError,
            r"synchrony: bin_ms=0.1 ms gives 1 bin\(s\) .* no bin size gives 2 bins: the raster has only 1 row\(s\) of 0.1 ms",
        ),
        (
            lambda s: na.cv_isi(s, dt=DT, min_spikes=1),
            ValueError,
            r"cv_isi: min_spikes must be >= 2 \(a CV needs at least one interval\), got 1",
        ),
        (
            lambda s: na.cv_isi(s, dt=DT, min_spikes=2.5),
            TypeError,
            r"cv_isi: min_spikes must be an int >= 2, got 2.5",
        ),
        (
            lambda s: na.isi(s, dt=DT, pad="nan"),
            TypeError,
            r"isi: pad must be None or a number \(e.g. np.nan\), got 'nan'",
        ),
        (
            lambda s: na.psth(s, dt=DT, bin_ms=1.0),
            ValueError,
            r"psth: spikes must have a trial axis, shape \(t, trials, n\) or \(t, \*batch, n\), got shape \(100, 4\); a single trial is spikes\[:, None\]",
        ),
        (
            lambda s: na.psth(s[:, None], dt=DT, bin_ms=1.0, trial_axis=2),
            ValueError,
            r"psth: trial_axis must be a batch axis of spikes of shape \(100, 1, 4\): one of \[1\] \(or \[-2\]\), not time \(0\) or neurons \(last\); got 2",
        ),
        (
            lambda s: na.psth(s[:, None], dt=DT, bin_ms=1.0, trial_axis=0),
            ValueError,
            r"trial_axis must be a batch axis .* got 0",
        ),
        (
            lambda s: jax.jit(lambda x: na.firing_rates(x, dt=DT))(jnp.asarray(s)),
            TypeError,
            r"firing_rates: spikes is a traced value; nj.analysis runs on the host with NumPy",
        ),
    ],
)
def test_errors(call, error, match):
    s = np.zeros((100, 4), bool)
    s[5, 0] = True
    with pytest.raises(error, match=match):
        call(s)


# --------------------------------------------------------------------------------- plots


def test_raster_single_and_populations():
    s = np.zeros((100, 5), bool)
    s[[3, 10, 10, 50], [0, 1, 4, 2]] = True
    ax = na.raster(s, dt=DT)
    offsets = ax.collections[0].get_offsets()
    assert offsets.shape == (4, 2)  # one point per spike
    # Dated at the end of their step, like Recording.t.
    np.testing.assert_allclose(sorted(offsets[:, 0]), [0.4, 1.1, 1.1, 5.1])
    assert ax.get_xlim() == (0.0, 10.0)
    # Populations stacked bottom-up, each in its colour, into a given Axes.
    _, given = plt.subplots()
    i = np.zeros((100, 2), bool)
    i[7, 1] = True
    ax = na.raster({"E": s, "I": i}, dt=DT, ax=given, colors={"E": "red", "I": "blue"})
    assert ax is given
    assert len(ax.collections) == 2
    assert ax.collections[0].get_offsets().shape[0] == 4
    np.testing.assert_allclose(ax.collections[1].get_offsets(), [[0.8, 5 + 1]])
    np.testing.assert_allclose(ax.collections[1].get_facecolor()[0], [0, 0, 1, 1])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["E", "I"]
    # Counts: one point per row that holds spikes.
    counts = s.reshape(20, 5, 5).sum(axis=1).astype(np.uint8)
    ax = na.raster(counts, dt=DT, record_every=5)
    assert ax.collections[0].get_offsets().shape[0] == np.count_nonzero(counts)
    with pytest.raises(
        ValueError,
        match=r"raster: spikes must be a time-major raster of shape \(t, n\) \(2 dimensions\), got shape \(100, 2, 5\); select one trial of a batch, e.g. spikes\[:, 0\]",
    ):
        na.raster(np.stack([s, s], 1), dt=DT)
    with pytest.raises(
        ValueError, match=r"raster: colors has no entry for population\(s\) \['I'\]"
    ):
        na.raster({"E": s, "I": i}, dt=DT, colors={"E": "red"})
    with pytest.raises(
        ValueError, match=r"raster: colors must be a matplotlib colour, .* got 'notacolour'"
    ):
        na.raster(s, dt=DT, colors="notacolour")
    with pytest.raises(
        TypeError, match=r"raster: ax must be a matplotlib Axes or None, got Figure"
    ):
        na.raster(s, dt=DT, ax=plt.figure())


def test_voltage_traces():
    t = np.arange(1, 51) * DT
    v = np.cumsum(np.ones((50, 4)), axis=0) - 65.0
    ax = na.voltage_traces(t, v)
    assert len(ax.lines) == 4
    np.testing.assert_allclose(ax.lines[2].get_xdata(), t)
    _, given = plt.subplots()
    assert na.voltage_traces(t, jnp.asarray(v[:, 0]), ax=given) is given
    assert len(given.lines) == 1
    ax = na.voltage_traces(t, v, neurons=-1)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), v[:, 3])
    with pytest.raises(
        ValueError,
        match=r"voltage_traces: neurons must be None, an index or a non-empty list of indices in \[-4, 4\) for v with 4 neuron\(s\), got \[0, 4\]",
    ):
        na.voltage_traces(t, v, neurons=[0, 4])
    with pytest.raises(
        ValueError,
        match=r"voltage_traces: t and v must have the same number of time steps, got t of shape \(49,\) and v of shape \(50, 4\)",
    ):
        na.voltage_traces(t[1:], v)
    with pytest.raises(
        ValueError,
        match=r"voltage_traces: v must be 1-D or 2-D, got shape \(50, 2, 2\); select one trial",
    ):
        na.voltage_traces(t, v.reshape(50, 2, 2))


def test_rate_histogram():
    s, _ = poisson_raster(9, (1000, 30), 100.0)
    ax = na.rate_histogram(s, dt=DT, bins=7)
    assert 1 <= len(ax.patches) <= 7
    assert sum(p.get_height() for p in ax.patches) == 30
    _, given = plt.subplots()
    ax = na.rate_histogram({"E": s, "I": s[:, :5]}, dt=DT, bins=4, ax=given)
    assert ax is given and len(ax.patches) % 2 == 0 and len(ax.patches) <= 8
    assert sum(p.get_height() for p in ax.patches) == 35
    with pytest.raises(
        ValueError, match=r"rate_histogram: bins must be a positive int or bin edges, got 0"
    ):
        na.rate_histogram(s, dt=DT, bins=0)
    with pytest.raises(ValueError, match=r"bins given as edges must be 1-D, increasing"):
        na.rate_histogram(s, dt=DT, bins=[3.0, 1.0])


def test_rate_histogram_bins_follow_the_rate_levels_of_a_finite_run():
    # 100 rows of 1 ms: every rate is a multiple of 10 Hz. Neuron j spikes j times (0..9).
    s = np.zeros((100, 10), bool)
    for j in range(10):
        s[:j, j] = True
    ax = na.rate_histogram(s, dt=1.0, bins=20)  # more bins than levels: one level per bin
    heights = [p.get_height() for p in ax.patches]
    assert heights == [1] * 10  # no empty bin between two levels
    lefts = [p.get_x() for p in ax.patches]
    np.testing.assert_allclose(lefts, np.arange(10) * 10.0 - 5.0)
    ax = na.rate_histogram(s, dt=1.0, bins=4)  # 10 levels in bins of 3 levels each
    assert [p.get_height() for p in ax.patches] == [3, 3, 3, 1]


def test_weight_histogram_of_arrays_bcoo_and_projections():
    conn = nj.connect.fixed_prob(jax.random.key(0), 40, 30, 0.2, weight=0.5)
    nnz = int(conn.nse)
    ax = na.weight_histogram(conn, bins=5)
    assert len(ax.patches) == 5 and sum(p.get_height() for p in ax.patches) == nnz
    w = np.random.default_rng(0).normal(size=(20, 3))
    ax = na.weight_histogram(jnp.asarray(w), bins=np.linspace(-4, 4, 9))
    assert len(ax.patches) == 8 and sum(p.get_height() for p in ax.patches) == 60
    for method in ("event", "dense"):
        proj = nj.Projection("A", "B", conn, method=method)
        _, given = plt.subplots()
        ax = na.weight_histogram(proj, ax=given, bins=3)
        assert ax is given and sum(p.get_height() for p in ax.patches) == nnz
    with pytest.raises(
        ValueError,
        match=r"weight_histogram: weights must be finite, got 1 non-finite value\(s\) of 60",
    ):
        na.weight_histogram(np.where(w > 10, 0, w).ravel().tolist()[:59] + [np.nan])
    with pytest.raises(
        TypeError,
        match=r"weight_histogram: weights must be an array, a BCOO matrix, or an object with .weights",
    ):
        na.weight_histogram(None)
    with pytest.raises(
        ValueError, match=r"weight_histogram: color must be a matplotlib colour or None, got 'nope'"
    ):
        na.weight_histogram(w, color="nope")


def test_fi_curve():
    currents = np.linspace(0.0, 30.0, 7)
    rates = np.stack([np.maximum(currents - 15.0, 0.0), 2.0 * currents], axis=1)
    ax = na.fi_curve(currents, rates, labels=["LIF", "other"])
    assert len(ax.lines) == 2
    np.testing.assert_allclose(ax.lines[1].get_ydata(), 2.0 * currents)
    _, given = plt.subplots()
    assert na.fi_curve(currents, rates[:, 0], given) is given and len(given.lines) == 1
    with pytest.raises(
        ValueError,
        match=r"fi_curve: rates must have one row per current: currents of shape \(7,\), rates of shape \(6, 2\)",
    ):
        na.fi_curve(currents, rates[1:])
    with pytest.raises(
        ValueError, match=r"fi_curve: labels must name each of the 2 curve\(s\), got 1 label\(s\)"
    ):
        na.fi_curve(currents, rates, labels=["one"])


def test_assembly_overlap():
    brain = nj.assembly.Brain(
        areas={"A": (200, 10)},
        stimuli={"s": 10},
        p=0.1,
        beta=0.1,
        mode="explicit",
        key=jax.random.key(0),
    )
    state = brain.project(brain.init_state(), stimuli={"s": ["A"]})
    _, trace = brain.project_rounds(state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=6)
    ax = na.assembly_overlap(trace, k=10)
    assert len(ax.lines) == 4  # overlap, support, new winners, k
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.asarray(trace.overlap["A"]))
    np.testing.assert_allclose(ax.lines[1].get_ydata(), np.asarray(trace.support["A"]))
    np.testing.assert_allclose(ax.lines[0].get_xdata(), np.arange(1, 7))
    np.testing.assert_allclose(ax.lines[3].get_ydata(), [10, 10])
    _, given = plt.subplots()
    assert na.assembly_overlap(np.array([3, 20, 29, 30]), given) is given
    assert len(given.lines) == 1
    ax = na.assembly_overlap({"run 1": [1, 2, 3], "run 2": [2, 3, 3]})
    assert len(ax.lines) == 2
    assert len(na.assembly_overlap(np.ones((5, 3))).lines) == 3
    two = nj.assembly.ProjectionTrace(
        winners={},
        new_winners={"A": [1], "B": [1]},
        support={"A": [1], "B": [1]},
        overlap={"A": [1], "B": [1]},
    )
    with pytest.raises(
        ValueError,
        match=r"assembly_overlap: the trace records areas \['A', 'B'\]; choose one with area=...",
    ):
        na.assembly_overlap(two)
    with pytest.raises(
        ValueError,
        match=r"assembly_overlap: area 'C' is not in the trace, which records areas \['A', 'B'\]",
    ):
        na.assembly_overlap(two, area="C")
    assert len(na.assembly_overlap(two, area="B").lines) == 3
    with pytest.raises(
        ValueError, match=r"assembly_overlap: k must be None or a positive int, got 0"
    ):
        na.assembly_overlap([1, 2], k=0)


def test_plots_never_show(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("plt.show called")

    monkeypatch.setattr(plt, "show", fail)
    s = np.zeros((10, 2), bool)
    s[1, 0] = True
    axes = [
        na.raster({"E": s, "I": s}, dt=DT),
        na.rate_histogram(s, dt=DT),
        na.weight_histogram(np.ones(3)),
        na.fi_curve([0.0, 1.0], [0.0, 2.0]),
        na.assembly_overlap([1, 2], k=2),
        na.voltage_traces(np.arange(10.0), np.zeros((10, 2))),
    ]
    for ax in axes:  # each one renders with Agg
        ax.figure.savefig(io.BytesIO(), format="png")


# ------------------------------------------------------------- network recordings (issue 41)


def _two_population_recording():
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0)
    conn = nj.connect.fixed_prob(jax.random.key(0), 6, 4, 0.5, weight=3.0)
    net = nj.Network(
        populations={"E": (lif, 6), "I": (lif, 4)},
        projections=[nj.Projection("E", "I", conn, synapse=nj.Exponential(5.0))],
        inputs={"E": jnp.linspace(14.0, 20.0, 6, dtype=jnp.float32)},
    )
    _, rec = nj.simulate(
        net,
        net.init_state(jax.random.key(1)),
        dt=DT,
        n_steps=400,
        record={"E": ("v",), "I": ("v",)},
    )
    return rec


def test_voltage_traces_take_a_network_recordings_dict():
    """`rec.v` of a network is `{population: (t, n)}`: drawn as it is, every population's
    lines labelled with its name (before: "v must be a real array, got dtype object")."""
    rec = _two_population_recording()
    assert isinstance(rec.v, dict) and set(rec.v) == {"E", "I"}
    ax = na.voltage_traces(rec.t, rec.v)
    assert len(ax.lines) == 10
    assert [ln.get_label() for ln in ax.lines[5:7]] == ["E neuron 5", "I neuron 0"]
    np.testing.assert_allclose(ax.lines[6].get_ydata(), np.asarray(rec.v["I"])[:, 0])
    ax = na.voltage_traces(rec.t, rec.v, neurons={"I": [3, 1]})
    assert [ln.get_label() for ln in ax.lines] == ["I neuron 3", "I neuron 1"]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.asarray(rec.v["I"])[:, 3])
    ax = na.voltage_traces(rec.t, rec.v, neurons=0)  # the same index in every population
    assert [ln.get_label() for ln in ax.lines] == ["E neuron 0", "I neuron 0"]
    with pytest.raises(ValueError, match=r"neurons names population\(s\) \['L4E'\] that v does"):
        na.voltage_traces(rec.t, rec.v, neurons={"L4E": None})
    with pytest.raises(ValueError, match=r"in \[-4, 4\) for v\['I'\] with 4 neuron\(s\), got 4"):
        na.voltage_traces(rec.t, rec.v, neurons={"I": 4})
    with pytest.raises(TypeError, match=r"neurons is a dict of populations but v is a single"):
        na.voltage_traces(rec.t, rec.v["E"], neurons={"E": 0})
    batched = {"E": np.zeros((400, 2, 6))}
    with pytest.raises(ValueError, match=r"v\['E'\] must be 1-D or 2-D.*rec.v\['E'\]\[:, 0\]"):
        na.voltage_traces(rec.t, batched)
    # the statistics already take the spikes dict; the two agree on the same recording
    rates = na.firing_rates(rec.spikes, dt=DT)
    assert set(rates) == {"E", "I"} and rates["E"].shape == (6,) and rates["E"].max() > 0


def test_record_function_may_return_python_numbers():
    """A `record` function returning a Python number (to discard what a step gives) runs; the
    recording-size estimate used to fail with "'int' object has no attribute 'shape'"."""
    lif = nj.LIF()
    state = lif.init_state(3)
    _, rec = nj.simulate(lif, state, 20.0, dt=DT, n_steps=50, record=lambda s, o: 0)
    assert np.asarray(rec.values).shape == (50,) and not np.asarray(rec.values).any()
    # numbers beside arrays, in a chunked run (the host-side recording) too
    fn = lambda s, o: {"one": 1.5, "v0": s.v[..., 0]}  # noqa: E731
    _, whole = nj.simulate(lif, state, 20.0, dt=DT, n_steps=60, record=fn)
    _, chunked = nj.simulate(lif, state, 20.0, dt=DT, n_steps=60, record=fn, chunk_size=25)
    np.testing.assert_array_equal(np.asarray(whole.values["one"]), np.full(60, 1.5))
    np.testing.assert_array_equal(np.asarray(chunked.values["v0"]), np.asarray(whole.values["v0"]))
    _, ref = nj.simulate(lif, state, 20.0, dt=DT, n_steps=60, record=("v",))
    np.testing.assert_array_equal(np.asarray(whole.values["v0"]), np.asarray(ref.v)[:, 0])
