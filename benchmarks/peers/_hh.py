r"""Hodgkin-Huxley in plain NumPy, a high-precision reference, and spike-time accuracy.

The classic squid-axon model (Hodgkin and Huxley 1952, in the modern convention with rest near
-65 mV) with per-neuron constant current `I` [uA/cm^2]:

$$C \dot v = I - g_{Na} m^3 h (v - E_{Na}) - g_K n^4 (v - E_K) - g_L (v - E_L),\qquad
\dot x = \alpha_x(v)(1 - x) - \beta_x(v) x,\quad x \in \{m, h, n\}$$

with $\alpha_m = 0.1(v+40)/(1-e^{-(v+40)/10})$, $\beta_m = 4e^{-(v+65)/18}$,
$\alpha_h = 0.07e^{-(v+65)/20}$, $\beta_h = 1/(1+e^{-(v+35)/10})$,
$\alpha_n = 0.01(v+55)/(1-e^{-(v+55)/10})$, $\beta_n = 0.125e^{-(v+65)/80}$ [1/ms].
$\alpha_m$ and $\alpha_n$ have removable singularities; they are evaluated as
$x / (e^x - 1)$ with its Taylor series near 0, so float32 runs stay finite at v = -40 and
-55 mV.

Units: time ms, voltage mV, current uA/cm^2, conductance mS/cm^2, capacitance uF/cm^2.
A spike is an upward crossing of 0 mV.

Two fixed-step integrators serve as the NumPy peer: classic RK4, and exponential Euler
(every variable advanced with the exact solution of its equation linearised in itself, all
from the state at the start of the step, as in Brian2's `exponential_euler`).

The reference is `scipy.integrate.solve_ivp` (DOP853, rtol 1e-10) with an event for the
upward 0 mV crossing, so its spike times carry no time-grid error. An implementation's spike
times come from its voltage trace on the `dt` grid by linear interpolation of the crossing,
the same rule for every implementation.
"""

import numpy as np

__all__ = [
    "PARAMS",
    "ACCURACY_CURRENTS",
    "batch_currents",
    "rates",
    "rest_state",
    "simulate",
    "reference_spike_times",
    "crossing_times",
    "spike_time_error",
]

PARAMS = {
    "c_m": 1.0,  # uF/cm^2
    "g_na": 120.0,  # mS/cm^2
    "g_k": 36.0,
    "g_l": 0.3,
    "e_na": 50.0,  # mV
    "e_k": -77.0,
    "e_l": -54.387,
}
# Currents [uA/cm^2] whose spike times measure accuracy: one single-spike response (4), and
# repetitive firing from near the onset of the periodic branch to strong drive.
ACCURACY_CURRENTS = (4.0, 7.0, 10.0, 12.0, 15.0, 20.0)
V_SPIKE = 0.0  # mV


def batch_currents(n: int, i_max: float = 20.0) -> np.ndarray:
    """Per-neuron constant currents [uA/cm^2] of the batch benchmark: evenly spaced in
    `(0, i_max]` (so a single neuron gets `i_max` and fires), float64."""
    return np.linspace(i_max / n, i_max, n)


def _x_over_expm1(x: np.ndarray) -> np.ndarray:
    # Below |x| = 1e-3 the series 1 - x/2 + x^2/12 is exact to float64 rounding of the
    # leading terms, and it avoids 0/0 at the singular voltage.
    small = np.abs(x) < 1e-3
    safe = np.where(small, np.ones_like(x), x)
    return np.where(small, 1.0 - x / 2.0 + x * x / 12.0, safe / np.expm1(safe))


def rates(v: np.ndarray) -> tuple[np.ndarray, ...]:
    """Opening and closing rates (alpha_m, beta_m, alpha_h, beta_h, alpha_n, beta_n) [1/ms]."""
    alpha_m = _x_over_expm1(-(v + 40.0) / 10.0)
    beta_m = 4.0 * np.exp(-(v + 65.0) / 18.0)
    alpha_h = 0.07 * np.exp(-(v + 65.0) / 20.0)
    beta_h = 1.0 / (1.0 + np.exp(-(v + 35.0) / 10.0))
    alpha_n = 0.1 * _x_over_expm1(-(v + 55.0) / 10.0)
    beta_n = 0.125 * np.exp(-(v + 65.0) / 80.0)
    return alpha_m, beta_m, alpha_h, beta_h, alpha_n, beta_n


def _derivatives(v, m, h, n, i, p):
    am, bm, ah, bh, an, bn = rates(v)
    i_ion = (
        p["g_na"] * m**3 * h * (v - p["e_na"])
        + p["g_k"] * n**4 * (v - p["e_k"])
        + p["g_l"] * (v - p["e_l"])
    )
    return (
        (i - i_ion) / p["c_m"],
        am * (1.0 - m) - bm * m,
        ah * (1.0 - h) - bh * h,
        an * (1.0 - n) - bn * n,
    )


def rest_state(params: dict[str, float] = PARAMS) -> tuple[float, float, float, float]:
    """The resting state at zero current: (v, m, h, n) with gates at their steady state."""
    from scipy.optimize import brentq

    def gates(v):
        am, bm, ah, bh, an, bn = rates(np.float64(v))
        return am / (am + bm), ah / (ah + bh), an / (an + bn)

    def current(v):
        m, h, n = gates(v)
        return float(_derivatives(np.float64(v), m, h, n, 0.0, params)[0])

    v = brentq(current, -70.0, -60.0, xtol=1e-13)
    return (float(v), *(float(g) for g in gates(v)))


def _rk4(y, i, dt, p):
    k1 = _derivatives(*y, i, p)
    k2 = _derivatives(*(a + 0.5 * dt * k for a, k in zip(y, k1)), i, p)
    k3 = _derivatives(*(a + 0.5 * dt * k for a, k in zip(y, k2)), i, p)
    k4 = _derivatives(*(a + dt * k for a, k in zip(y, k3)), i, p)
    return tuple(
        a + (dt / 6.0) * (q1 + 2.0 * q2 + 2.0 * q3 + q4)
        for a, q1, q2, q3, q4 in zip(y, k1, k2, k3, k4)
    )


def _exp_euler(y, i, dt, p):
    v, m, h, n = y
    am, bm, ah, bh, an, bn = rates(v)
    g_na = p["g_na"] * m**3 * h
    g_k = p["g_k"] * n**4
    g_tot = g_na + g_k + p["g_l"]
    v_inf = (g_na * p["e_na"] + g_k * p["e_k"] + p["g_l"] * p["e_l"] + i) / g_tot
    v = v_inf + (v - v_inf) * np.exp(-dt * g_tot / p["c_m"])

    def gate(x, a, b):
        tau_inv = a + b
        x_inf = a / tau_inv
        return x_inf + (x - x_inf) * np.exp(-dt * tau_inv)

    return v, gate(m, am, bm), gate(h, ah, bh), gate(n, an, bn)


def simulate(
    currents: np.ndarray,
    y0: tuple[float, float, float, float],
    *,
    dt: float,
    n_steps: int,
    method: str,
    dtype: str = "float32",
    record_v: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Run the NumPy HH peer; returns the spike raster `(n_steps, n)` and optionally `v`.

    `v` (when recorded) has shape `(n_steps + 1, n)`, row `k` at time `k dt` (row 0 is the
    initial state). Spike `k` marks an upward 0 mV crossing during step `k`.
    """
    steppers = {"rk4": _rk4, "exp_euler": _exp_euler}
    if method not in steppers:
        raise ValueError(f"simulate: method must be one of {tuple(steppers)}, got {method!r}")
    step = steppers[method]
    dt_ = np.dtype(dtype).type(dt)
    p = {k: np.dtype(dtype).type(val) for k, val in PARAMS.items()}
    i = np.asarray(currents, dtype=dtype)
    y = tuple(np.full(i.shape, val, dtype=dtype) for val in y0)
    spikes = np.zeros((n_steps, i.size), dtype=bool)
    trace = np.empty((n_steps + 1, i.size), dtype=dtype) if record_v else None
    if trace is not None:
        trace[0] = y[0]
    for k in range(n_steps):
        v_old = y[0]
        y = step(y, i, dt_, p)
        np.logical_and(v_old < V_SPIKE, y[0] >= V_SPIKE, out=spikes[k])
        if trace is not None:
            trace[k + 1] = y[0]
    return spikes, trace


def reference_spike_times(
    currents: tuple[float, ...],
    y0: tuple[float, float, float, float],
    t_end: float,
    *,
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> list[np.ndarray]:
    """Spike times [ms] of each current from a tight-tolerance float64 solve (scipy DOP853)."""
    from scipy.integrate import solve_ivp

    def rhs(_t, y, i):
        return _derivatives(y[0], y[1], y[2], y[3], i, PARAMS)

    def crossing(_t, y, _i):
        return y[0] - V_SPIKE

    crossing.direction = 1.0
    out = []
    for i in currents:
        sol = solve_ivp(
            rhs,
            (0.0, t_end),
            np.asarray(y0, float),
            method="DOP853",
            rtol=rtol,
            atol=atol,
            max_step=0.1,
            events=crossing,
            args=(float(i),),
        )
        if sol.status != 0:
            raise RuntimeError(f"reference solve failed at I={i}: {sol.message}")
        out.append(np.asarray(sol.t_events[0]))
    return out


def crossing_times(t: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
    """Upward 0 mV crossings of each column of `v` (time first), linearly interpolated."""
    t = np.asarray(t, np.float64)
    v = np.asarray(v, np.float64)
    out = []
    for col in v.T:
        k = np.nonzero((col[:-1] < V_SPIKE) & (col[1:] >= V_SPIKE))[0]
        frac = (V_SPIKE - col[k]) / (col[k + 1] - col[k])
        out.append(t[k] + frac * (t[k + 1] - t[k]))
    return out


def spike_time_error(
    reference: list[np.ndarray],
    measured: list[np.ndarray],
    t_end: float,
    *,
    max_spikes: int = 5,
    margin: float = 1.0,
) -> dict[str, float | int | None]:
    """Compare the first `max_spikes` spikes of each neuron with the reference.

    Spikes within `margin` ms of the end are ignored (a spike there may fall on either side
    of the end). A neuron whose spike count differs from the reference counts as a mismatch
    and makes `max_ms` undefined (None), since its error is then not a timing error.
    """
    errors: list[float] = []
    mismatches = 0
    for ref, got in zip(reference, measured, strict=True):
        ref_all = ref[ref < t_end - margin]
        got_all = got[got < t_end - margin]
        ref = ref_all[:max_spikes]
        enough = len(got_all) >= max_spikes if len(ref_all) > max_spikes else None
        if not (enough if enough is not None else len(got_all) == len(ref_all)):
            mismatches += 1
            continue
        got = got_all[: len(ref)]
        errors.extend(np.abs(got - ref).tolist())
    return {
        "spike_err_max_ms": max(errors) if errors and not mismatches else None,
        "spike_err_median_ms": float(np.median(errors)) if errors else None,
        "spikes_compared": len(errors),
        "spike_count_mismatches": mismatches,
    }
