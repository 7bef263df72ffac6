"""NEST peer for the Brette et al. (2007) COBA network: one process per run.

The network of `benchmarks.peers._coba.COBA` in NEST 3: 4000 `iaf_cond_exp` neurons (C_m =
200 pF, g_L = 10 nS, so tau_m = 20 ms; E_L = V_reset = -60 mV, V_th = -50 mV, t_ref = 5 ms;
E_ex = 0 mV, E_in = -80 mV; tau_syn_ex = 5 ms, tau_syn_in = 10 ms), a constant current
I_e = 200 pA (the 20 mV drive times g_L), initial V_m ~ N(-55, 5) mV, excitatory (first 3200)
and inhibitory (last 800) neurons each connected onto the whole network with
`pairwise_bernoulli` p = 0.02 (autapses allowed, as Brian2's `connect(p=0.02)`), weights
6 nS and 67 nS, delay 0.1 ms (one step, the shortest NEST allows at dt = 0.1 ms), a
`spike_recorder` as the only recording. NEST integrates `iaf_cond_exp` with an adaptive
Runge-Kutta-Fehlberg solver, not forward Euler: its rates are close to, not equal to, the
Euler network's; the peer is here for timing (`build_s`: creating and connecting; `times_s`:
`nest.Simulate` of the duration, repeated from the state the previous run left).

Usage: `python -m benchmarks.peers.nest_coba SPEC_JSON` with keys `threads`, `seed`,
`duration_ms`, `repeats`.
"""

import time
from typing import Any

import numpy as np

from .._harness import peer_main
from . import _coba


def run(spec: dict[str, Any]) -> dict[str, Any]:
    t_import = time.perf_counter()
    import nest

    import_s = time.perf_counter() - t_import
    p = _coba.COBA
    nest.set_verbosity("M_ERROR")
    nest.ResetKernel()
    nest.SetKernelStatus(
        {
            "resolution": p["dt"],
            "local_num_threads": int(spec["threads"]),
            "rng_seed": int(spec["seed"]) + 1,
        }
    )
    t0 = time.perf_counter()
    n = p["n_exc"] + p["n_inh"]
    neurons = nest.Create(
        "iaf_cond_exp",
        n,
        params={
            "C_m": p["c_m"],
            "g_L": p["g_l"],
            "E_L": p["e_l"],
            "V_th": p["v_th"],
            "V_reset": p["v_reset"],
            "t_ref": p["t_ref"],
            "E_ex": p["e_exc"],
            "E_in": p["e_inh"],
            "tau_syn_ex": p["tau_exc"],
            "tau_syn_in": p["tau_inh"],
            "I_e": p["i_ext"] * p["g_l"],  # mV * nS = pA
        },
    )
    neurons.V_m = nest.random.normal(mean=p["v0_mean"], std=p["v0_std"])
    exc, inh = neurons[: p["n_exc"]], neurons[p["n_exc"] :]
    rule = {"rule": "pairwise_bernoulli", "p": p["p_conn"], "allow_autapses": True}
    nest.Connect(exc, neurons, rule, {"weight": p["w_exc_ns"], "delay": p["dt"]})
    nest.Connect(inh, neurons, rule, {"weight": -p["w_inh_ns"], "delay": p["dt"]})
    recorder = nest.Create("spike_recorder")
    nest.Connect(neurons, recorder)
    nest.Prepare()
    build_s = time.perf_counter() - t0
    duration = float(spec["duration_ms"])
    times = []
    for _ in range(int(spec["repeats"])):
        t1 = time.perf_counter()
        nest.Run(duration)
        times.append(time.perf_counter() - t1)
    nest.Cleanup()
    events = recorder.get("events")
    senders = np.asarray(events["senders"]) - neurons[0].global_id
    total_ms = duration * len(times)
    rate = senders.size / n / (total_ms / 1000.0) if total_ms else float("nan")
    return {
        "impl": "nest",
        "version": nest.__version__,
        "model": "coba",
        "threads": int(spec["threads"]),
        "import_s": import_s,
        "build_s": build_s,
        "times_s": times,
        "n_synapses": int(nest.GetKernelStatus("num_connections")) - n,
        "rate_hz": float(rate),
    }


if __name__ == "__main__":
    peer_main(run)
