"""Brian2 peer for the LIF population: one process per configuration.

The same neuron as `benchmarks.peers._lif` (parameters `_lif.PARAMS`, per-neuron constant
currents `_lif.batch_currents`), integrated with Brian2's `method="exact"`, threshold
`v >= v_th`, reset to `v_reset`, refractory period `t_ref` with `v` clamped
(`(unless refractory)`), and a `SpikeMonitor` as the only recording.

Usage: `python -m benchmarks.peers.brian2_lif SPEC_JSON` with keys `n`, `mode`, `threads`,
`dt`, `n_steps`, `repeats`, `budget_s`, optionally `dtype`.
"""

from typing import Any

from .._harness import peer_main
from . import _brian2, _lif

EQUATIONS = """
dv/dt = (-(v - v_rest) + r_m*I)/tau_m : volt (unless refractory)
I : amp (constant)
"""


def run(spec: dict[str, Any]) -> dict[str, Any]:
    mode = spec["mode"]
    dt, n_steps, n = float(spec["dt"]), int(spec["n_steps"]), int(spec["n"])
    b2 = _brian2.setup(
        mode, threads=int(spec["threads"]), dt_ms=dt, dtype=spec.get("dtype", "float64")
    )
    p = _lif.PARAMS
    ns = {
        "tau_m": p["tau_m"] * b2.ms,
        "v_rest": p["v_rest"] * b2.mV,
        "v_reset": p["v_reset"] * b2.mV,
        "v_th": p["v_th"] * b2.mV,
        "r_m": p["r_m"] * b2.Mohm,
    }
    group = b2.NeuronGroup(
        n,
        EQUATIONS,
        method="exact",
        threshold="v >= v_th",
        reset="v = v_reset",
        refractory=p["t_ref"] * b2.ms,
        namespace=ns,
    )
    group.v = p["v_rest"] * b2.mV
    group.I = _lif.batch_currents(n) * b2.nA
    spikes = b2.SpikeMonitor(group)
    net = b2.Network(group, spikes)
    result: dict[str, Any] = {"impl": f"brian2_{mode}", "method": "exact"}
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
