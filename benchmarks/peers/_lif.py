r"""Leaky integrate-and-fire population in plain vectorised NumPy (the NumPy peer).

$$\tau_m \dot v = -(v - v_{rest}) + r_m I$$

with per-neuron constant current `I` [nA], integrated exactly over each step
(`v <- v_inf + (v - v_inf) exp(-dt/tau_m)`, `v_inf = v_rest + r_m I`), the same step order as
`neurojax.LIF`: a refractory neuron stays at `v_reset` while its remaining refractory time
exceeds `dt/2`; every other neuron integrates; `v >= v_th` spikes, resets to `v_reset` and
becomes refractory for `t_ref`. Units: ms, mV, nA, MOhm. The spike raster `(steps, n)` is
recorded as booleans, like `neurojax.simulate`'s default recording.
"""

import numpy as np

__all__ = ["PARAMS", "batch_currents", "simulate", "BYTES_PER_NEURON_STEP"]

# NEST's iaf_psc_alpha defaults written for nj.LIF (C = 250 pF -> r_m = tau_m / C = 40 MOhm).
PARAMS = {
    "tau_m": 10.0,  # ms
    "v_rest": -70.0,  # mV
    "v_reset": -70.0,
    "v_th": -55.0,
    "r_m": 40.0,  # MOhm
    "t_ref": 2.0,  # ms
}
# Minimal memory traffic of one neuron-step with the state kept in memory between steps:
# read v, refractory and the current (3 x 4 B), write v and refractory (2 x 4 B) and one
# spike byte of the raster.
BYTES_PER_NEURON_STEP = 21


def batch_currents(n: int, i_min: float = 0.5, i_max: float = 2.0) -> np.ndarray:
    """Per-neuron constant currents [nA], evenly spaced above the rheobase (0.375 nA)."""
    return np.linspace(i_min, i_max, n)


def simulate(
    currents: np.ndarray, *, dt: float, n_steps: int, dtype: str = "float32"
) -> tuple[np.ndarray, np.ndarray]:
    """Run the population from rest; returns the spike raster and the final `v`."""
    f = np.dtype(dtype).type
    p = {k: f(val) for k, val in PARAMS.items()}
    dt_ = f(dt)
    i = np.asarray(currents, dtype=dtype)
    v_inf = p["v_rest"] + p["r_m"] * i
    decay = np.exp(-dt_ / p["tau_m"])
    v = np.full(i.shape, p["v_rest"], dtype=dtype)
    refractory = np.zeros(i.shape, dtype=dtype)
    raster = np.zeros((n_steps, i.size), dtype=bool)
    clamped = np.empty(i.shape, dtype=bool)
    half_dt = f(0.5) * dt_
    for k in range(n_steps):
        np.greater(refractory, half_dt, out=clamped)
        v = v_inf + (v - v_inf) * decay
        v[clamped] = p["v_reset"]
        spikes = raster[k]
        np.greater_equal(v, p["v_th"], out=spikes)
        v[spikes] = p["v_reset"]
        refractory = np.where(clamped, refractory - dt_, f(0.0))
        refractory[spikes] = p["t_ref"]
    return raster, v
