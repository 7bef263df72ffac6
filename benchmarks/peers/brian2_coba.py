"""Brian2 peer for the Brette et al. (2007) COBA and CUBA networks: one process per run.

The networks of `benchmarks.peers._coba` (parameters `_coba.COBA` and `_coba.CUBA`) written
as in Brian2's own examples: one `NeuronGroup` of 4000 neurons with subgroups
`Pe = P[:3200]` and `Pi = P[3200:]`, two `Synapses` (`Pe -> P` adding `w_exc` to `ge`,
`Pi -> P` adding `w_inh` to `gi`) each connected with `connect(p=0.02)`, threshold
`v > v_th`, reset to `v_reset`, `v` clamped for `t_ref` (`(unless refractory)`), and a
`SpikeMonitor` as the only recording. COBA is integrated with `method="euler"` (the
published formulation), CUBA with `method="exact"` (its equations are linear). `seed`
seeds Brian2's random numbers (connectivity and initial `v`) before the network is built,
so a seed gives the same network in both modes; the returned statistics are those of the
last run (every repeat of a standalone binary replays the same seeded run).

Usage: `python -m benchmarks.peers.brian2_coba SPEC_JSON` with keys `model` ('coba' or
'cuba'), `mode`, `threads`, `seed`, `duration_ms`, `repeats`, `budget_s`, optionally
`t_skip_ms` (start of the statistics window, default 0), `return_spikes` (also return
the spike indices and times [ms]) and `directory` (the standalone project folder).
"""

from typing import Any

import numpy as np

from .._harness import peer_main
from . import _brian2, _coba

COBA_EQUATIONS = """
dv/dt = (ge*(e_exc - v) + gi*(e_inh - v) - (v - e_l) + i_ext)/tau_m : volt (unless refractory)
dge/dt = -ge/tau_exc : 1
dgi/dt = -gi/tau_inh : 1
"""

CUBA_EQUATIONS = """
dv/dt = (ge + gi - (v - e_l))/tau_m : volt (unless refractory)
dge/dt = -ge/tau_exc : volt
dgi/dt = -gi/tau_inh : volt
"""

METHODS = {"coba": "euler", "cuba": "exact"}


def _network(b2: Any, model: str) -> tuple[Any, Any, list[Any]]:
    """Build the network; returns (network, spike monitor, [exc, inh] synapses)."""
    p = _coba.MODELS[model]
    ms, mV = b2.ms, b2.mV
    ns = {
        "e_l": p["e_l"] * mV,
        "v_th": p["v_th"] * mV,
        "v_reset": p["v_reset"] * mV,
        "tau_m": p["tau_m"] * ms,
        "tau_exc": p["tau_exc"] * ms,
        "tau_inh": p["tau_inh"] * ms,
    }
    if model == "coba":
        equations = COBA_EQUATIONS
        ns.update(
            e_exc=p["e_exc"] * mV,
            e_inh=p["e_inh"] * mV,
            i_ext=p["i_ext"] * mV,
            w_exc=p["w_exc"],
            w_inh=p["w_inh"],
        )
    else:
        equations = CUBA_EQUATIONS
        ns.update(w_exc=p["w_exc"] * mV, w_inh=p["w_inh"] * mV)
    n_exc = p["n_exc"]
    group = b2.NeuronGroup(
        n_exc + p["n_inh"],
        equations,
        method=METHODS[model],
        threshold="v > v_th",
        reset="v = v_reset",
        refractory=p["t_ref"] * ms,
        namespace=ns,
    )
    if model == "coba":
        group.v = f"{p['v0_mean']}*mV + {p['v0_std']}*mV*randn()"
        group.ge = 0
        group.gi = 0
    else:
        group.v = "v_reset + rand()*(v_th - v_reset)"
        group.ge = 0 * mV
        group.gi = 0 * mV
    exc = b2.Synapses(group[:n_exc], group, on_pre="ge += w_exc", namespace=ns)
    inh = b2.Synapses(group[n_exc:], group, on_pre="gi += w_inh", namespace=ns)
    exc.connect(p=p["p_conn"])
    inh.connect(p=p["p_conn"])
    spikes = b2.SpikeMonitor(group)
    return b2.Network(group, exc, inh, spikes), spikes, [exc, inh]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    model, mode = spec["model"], spec["mode"]
    if model not in _coba.MODELS:
        raise ValueError(f"model must be one of {sorted(_coba.MODELS)}, got {model!r}")
    p = _coba.MODELS[model]
    duration = float(spec["duration_ms"])
    b2 = _brian2.setup(
        mode, threads=int(spec["threads"]), dt_ms=p["dt"], directory=spec.get("directory")
    )
    b2.seed(int(spec["seed"]))
    net, spikes, synapses = _network(b2, model)
    result: dict[str, Any] = {
        "impl": f"brian2_{mode}",
        "model": model,
        "method": METHODS[model],
        "seed": int(spec["seed"]),
        "duration_ms": duration,
    }
    t_skip = float(spec.get("t_skip_ms", 0.0))
    result["t_skip_ms"] = t_skip
    idx, t_ms = time_and_measure(b2, net, spikes, synapses, p, spec, mode, result, t_skip)
    if spec.get("return_spikes"):
        result["spike_i"] = idx
        result["spike_t_ms"] = t_ms
    return result


def time_and_measure(b2, net, spikes, synapses, p, spec, mode, result, t_skip=0.0):
    """Time `net` (see `_brian2.time_network`) and add synapse count and spike statistics
    to `result`; returns the recorded spikes `(neuron, time in ms)`."""
    duration = float(spec["duration_ms"])
    result.update(
        _brian2.time_network(
            b2, net, duration, mode, repeats=int(spec["repeats"]), budget_s=float(spec["budget_s"])
        )
    )
    result["n_synapses"] = int(sum(len(s) for s in synapses))
    idx = np.asarray(spikes.i, dtype=np.int64)
    t_ms = np.asarray(spikes.t / b2.ms, dtype=np.float64)
    result.update(_coba.spike_stats(idx, t_ms, p["n_exc"], p["n_inh"], duration, t_skip))
    return idx, t_ms


if __name__ == "__main__":
    peer_main(run)
