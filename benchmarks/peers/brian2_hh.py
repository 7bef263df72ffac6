"""Brian2 peer for the Hodgkin-Huxley batch: one process per configuration.

The same equations and parameters as `benchmarks.peers._hh` (rate functions written with
Brian2's `exprel`, which is finite at the singular voltages), each neuron with its own
constant current, a `SpikeMonitor` as the only recording, spikes as upward crossings of 0 mV
(`threshold="v > 0*mV"` with the neuron refractory while `v > 0*mV`, so a spike is counted
once per crossing). `method` is Brian2's `rk4` or `exponential_euler`. Brian2 computes in
float64 unless `dtype` says otherwise.

With `accuracy_currents` in the spec (cython mode only), the process first runs those
currents with a `StateMonitor` on `v` and returns their interpolated 0 mV crossings.

Usage: `python -m benchmarks.peers.brian2_hh SPEC_JSON` with keys `n`, `method`, `mode`,
`threads`, `dt`, `n_steps`, `i_max`, `y0`, `repeats`, `budget_s`, optionally `dtype` and
`accuracy_currents`.
"""

from typing import Any

import numpy as np

from .._harness import peer_main
from . import _brian2, _hh

EQUATIONS = """
dv/dt = (I - g_na*m**3*h*(v - e_na) - g_k*n**4*(v - e_k) - g_l*(v - e_l))/c_m : volt
dm/dt = alpha_m*(1 - m) - beta_m*m : 1
dh/dt = alpha_h*(1 - h) - beta_h*h : 1
dn/dt = alpha_n*(1 - n) - beta_n*n : 1
alpha_m = 1/exprel(-(v + 40*mV)/(10*mV))/ms : Hz
beta_m = 4*exp(-(v + 65*mV)/(18*mV))/ms : Hz
alpha_h = 0.07*exp(-(v + 65*mV)/(20*mV))/ms : Hz
beta_h = 1/(1 + exp(-(v + 35*mV)/(10*mV)))/ms : Hz
alpha_n = 0.1/exprel(-(v + 55*mV)/(10*mV))/ms : Hz
beta_n = 0.125*exp(-(v + 65*mV)/(80*mV))/ms : Hz
I : amp/meter**2 (constant)
"""

METHODS = {"rk4": "rk4", "exp_euler": "exponential_euler"}


def _group(b2, currents, y0, method):
    p = _hh.PARAMS
    ns = {
        "c_m": p["c_m"] * b2.uF / b2.cm**2,
        "g_na": p["g_na"] * b2.msiemens / b2.cm**2,
        "g_k": p["g_k"] * b2.msiemens / b2.cm**2,
        "g_l": p["g_l"] * b2.msiemens / b2.cm**2,
        "e_na": p["e_na"] * b2.mV,
        "e_k": p["e_k"] * b2.mV,
        "e_l": p["e_l"] * b2.mV,
    }
    group = b2.NeuronGroup(
        len(currents),
        EQUATIONS,
        method=METHODS[method],
        threshold="v > 0*mV",
        refractory="v > 0*mV",
        namespace=ns,
    )
    group.v = y0[0] * b2.mV
    group.m = y0[1]
    group.h = y0[2]
    group.n = y0[3]
    group.I = np.asarray(currents) * b2.uA / b2.cm**2
    return group


def run(spec: dict[str, Any]) -> dict[str, Any]:
    mode, method = spec["mode"], spec["method"]
    dt, n_steps = float(spec["dt"]), int(spec["n_steps"])
    b2 = _brian2.setup(
        mode, threads=int(spec["threads"]), dt_ms=dt, dtype=spec.get("dtype", "float64")
    )
    result: dict[str, Any] = {"impl": f"brian2_{mode}", "method": method}
    if spec.get("accuracy_currents"):
        if mode != "cython":
            raise ValueError("accuracy runs use the cython runtime")
        group = _group(b2, spec["accuracy_currents"], spec["y0"], method)
        mon = b2.StateMonitor(group, "v", record=True)
        b2.Network(group, mon).run(n_steps * dt * b2.ms)
        # StateMonitor samples at the start of each step: row k is v(k dt), k < n_steps.
        t = np.asarray(mon.t / b2.ms)
        v = np.asarray(mon.v / b2.mV).T
        result["accuracy_spike_times"] = [s.tolist() for s in _hh.crossing_times(t, v)]
    group = _group(b2, _hh.batch_currents(int(spec["n"]), float(spec["i_max"])), spec["y0"], method)
    spikes = b2.SpikeMonitor(group)
    net = b2.Network(group, spikes)
    result.update(
        _brian2.time_network(
            b2,
            net,
            n_steps * dt,
            mode,
            repeats=int(spec["repeats"]),
            budget_s=float(spec["budget_s"]),
        )
    )
    result["n_spikes"] = int(spikes.num_spikes)
    return result


if __name__ == "__main__":
    peer_main(run)
