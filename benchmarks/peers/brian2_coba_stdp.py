"""Brian2 peer for the COBA network with STDP on its excitatory-to-excitatory synapses.

The COBA network of `benchmarks.peers.brian2_coba` (same neurons, equations and initial
voltages), with the excitatory synapses split by target so that only `Pe -> Pe` can be
plastic: three `Synapses`, `Pe -> Pe` and `Pe -> Pi` adding `w` (initially `w_exc`) to `ge`,
`Pi -> P` adding `w_inh` to `gi`, each connected with `connect(p=0.02)`. With `stdp` true,
`Pe -> Pe` carries pair-based additive STDP with event-driven traces, as `nj.STDP` defines it:

    on_pre:  ge += w;  w = clip(w - a_minus * apost, w_min, w_max);  apre += 1
    on_post: w = clip(w + a_plus * apre, w_min, w_max);  apost += 1

(traces `apre`, `apost` decaying with `tau_plus`, `tau_minus`). With `stdp` false the same
three `Synapses` are static, so the two configurations differ only by the plasticity.

Usage: `python -m benchmarks.peers.brian2_coba_stdp SPEC_JSON` with keys `model` (only
'coba'), `mode`, `threads`, `seed`, `duration_ms`, `repeats`, `budget_s`, `stdp` (bool),
optionally `stdp_params` (overrides of `STDP_PARAMS`). Returns the timing of
`peers._brian2`, the spike statistics of `peers._coba.spike_stats` and the mean, standard
deviation and fractions at the bounds of the final `Pe -> Pe` weights.
"""

from typing import Any

import numpy as np

from .._harness import peer_main
from . import _brian2, _coba, brian2_coba

# The rule of benchmarks.stdp_overhead: bounds that contain the initial weight 0.6.
STDP_PARAMS = {
    "a_plus": 0.006,
    "a_minus": 0.0063,
    "tau_plus": 20.0,  # ms
    "tau_minus": 20.0,
    "w_min": 0.0,
    "w_max": 1.2,
}

STATIC = {"model": "w : 1", "on_pre": "ge_post += w"}
PLASTIC = {
    "model": """
w : 1
dapre/dt = -apre/tau_plus : 1 (event-driven)
dapost/dt = -apost/tau_minus : 1 (event-driven)
""",
    "on_pre": """
ge_post += w
w = clip(w - a_minus*apost, w_min, w_max)
apre += 1
""",
    "on_post": """
w = clip(w + a_plus*apre, w_min, w_max)
apost += 1
""",
}


def _network(b2: Any, stdp: bool, rule: dict[str, float]) -> tuple[Any, Any, list[Any]]:
    """Build the network; returns (network, spike monitor, [Pe->Pe, Pe->Pi, Pi->P])."""
    p = _coba.COBA
    ms, mV = b2.ms, b2.mV
    ns = {
        "e_l": p["e_l"] * mV,
        "v_th": p["v_th"] * mV,
        "v_reset": p["v_reset"] * mV,
        "tau_m": p["tau_m"] * ms,
        "tau_exc": p["tau_exc"] * ms,
        "tau_inh": p["tau_inh"] * ms,
        "e_exc": p["e_exc"] * mV,
        "e_inh": p["e_inh"] * mV,
        "i_ext": p["i_ext"] * mV,
        "w_inh": p["w_inh"],
    }
    syn_ns = {
        "a_plus": rule["a_plus"],
        "a_minus": rule["a_minus"],
        "tau_plus": rule["tau_plus"] * ms,
        "tau_minus": rule["tau_minus"] * ms,
        "w_min": rule["w_min"],
        "w_max": rule["w_max"],
    }
    n_exc = p["n_exc"]
    group = b2.NeuronGroup(
        n_exc + p["n_inh"],
        brian2_coba.COBA_EQUATIONS,
        method="euler",
        threshold="v > v_th",
        reset="v = v_reset",
        refractory=p["t_ref"] * ms,
        namespace=ns,
    )
    group.v = f"{p['v0_mean']}*mV + {p['v0_std']}*mV*randn()"
    group.ge = 0
    group.gi = 0
    exc, inh = group[:n_exc], group[n_exc:]
    ee = b2.Synapses(exc, exc, namespace=syn_ns, **(PLASTIC if stdp else STATIC))
    ei = b2.Synapses(exc, inh, **STATIC)
    ie = b2.Synapses(inh, group, on_pre="gi += w_inh", namespace=ns)
    for syn in (ee, ei, ie):
        syn.connect(p=p["p_conn"])
    ee.w = p["w_exc"]
    ei.w = p["w_exc"]
    spikes = b2.SpikeMonitor(group)
    return b2.Network(group, ee, ei, ie, spikes), spikes, [ee, ei, ie]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("model", "coba") != "coba":
        raise ValueError(f"model must be 'coba', got {spec['model']!r}")
    mode = spec["mode"]
    stdp = bool(spec["stdp"])
    rule = {**STDP_PARAMS, **spec.get("stdp_params", {})}
    p = _coba.COBA
    duration = float(spec["duration_ms"])
    b2 = _brian2.setup(mode, threads=int(spec["threads"]), dt_ms=p["dt"])
    b2.seed(int(spec["seed"]))
    net, spikes, synapses = _network(b2, stdp, rule)
    result: dict[str, Any] = {
        "impl": f"brian2_{mode}",
        "model": "coba",
        "method": "euler",
        "stdp": stdp,
        "stdp_params": rule if stdp else None,
        "seed": int(spec["seed"]),
        "duration_ms": duration,
    }
    brian2_coba.time_and_measure(b2, net, spikes, synapses, p, spec, mode, result)
    result["n_plastic"] = len(synapses[0]) if stdp else 0
    w = np.asarray(synapses[0].w, dtype=np.float64)
    result.update(
        w_ee_mean=float(w.mean()),
        w_ee_std=float(w.std()),
        w_ee_frac_min=float(np.mean(w <= rule["w_min"])),
        w_ee_frac_max=float(np.mean(w >= rule["w_max"])),
    )
    return result


if __name__ == "__main__":
    peer_main(run)
