"""Brian2 peer for the Potjans-Diesmann (2014) cortical microcircuit: one process per run.

The model of `nj.models.microcircuit` with the parameters of
`neurojax.models._microcircuit.MICROCIRCUIT_PARAMS` (the same source as the NEST reference,
`benchmarks/microcircuit_reference.build_nest`), written as a Brian2 user would:

- one `NeuronGroup` of all neurons, populations as contiguous subgroups, NEST's
  `iaf_psc_exp` in Brian2's equations: `dv/dt = (e_l - v)/tau_m + (I + I_e)/c_m` and
  `dI/dt = -I/tau_syn` integrated with `method="exact"` (the same exact propagator as NEST),
  threshold `v > v_th`, reset to `v_reset`, `v` clamped for `t_ref`; initial `v` drawn per
  population from N(v0_mean, v0_std^2);
- one `Synapses` object for all 64 pathways (`I_post += w`, a weight and a delay per
  synapse), connected with explicit index arrays: per pathway a fixed total number of
  synapses (`microcircuit_synapse_numbers`), sources and targets uniform with autapses and
  multapses (NEST's `fixed_total_number`), weights from N(w, (0.1 w)^2) redrawn until they
  keep their sign, delays from N(d, (0.5 d)^2) redrawn below dt / 2 (NEST's `redraw`);
  Brian2 rounds each delay to whole steps;
- the Poisson background as `PoissonInput(N=k_ext, rate=bg_rate, weight=j_ext)` on each
  population (a binomial draw per neuron and step, the same law as NEST's generator of rate
  `k_ext * bg_rate` per neuron), or its mean as the DC current (`background="dc"`); the
  down-scaling compensation of `microcircuit_dc`.

Connectivity, weights and delays are drawn in NumPy (seeded by `seed`), initial voltages by
Brian2's generator (`b2.seed(seed)`).

Usage: `python -m benchmarks.peers.brian2_microcircuit SPEC_JSON` with keys `mode`
('standalone' or 'cython'), `threads`, `seed`, `scale`, `k_scale`, `duration_ms`,
`repeats`, `budget_s`, optionally `background` ('poisson' or 'dc') and `directory`.
"""

from typing import Any

import numpy as np

from .._harness import peer_main
from . import _brian2

POPS = ("L23E", "L23I", "L4E", "L4I", "L5E", "L5I", "L6E", "L6I")

EQUATIONS = """
dv/dt = (e_l - v)/tau_m + (I + I_e)/c_m : volt (unless refractory)
dI/dt = -I/tau_syn : amp
I_e : amp (constant)
"""


def _redraw_normal(rng, n: int, mean: float, std: float, low: float, high: float) -> np.ndarray:
    """`n` values of N(mean, std^2), each redrawn until it lies in [low, high]."""
    out = rng.normal(mean, std, n)
    bad = np.flatnonzero((out < low) | (out > high))
    while bad.size:
        out[bad] = rng.normal(mean, std, bad.size)
        bad = bad[(out[bad] < low) | (out[bad] > high)]
    return out


def connectivity(scale: float, k_scale: float, seed: int, dt: float = 0.1):
    """`(pre, post, weight [pA], delay [ms])` of every recurrent synapse, in pathway order."""
    from neurojax.models import _microcircuit as mc

    c = mc.MICROCIRCUIT_PARAMS
    rng = np.random.default_rng(seed)
    sizes = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    n_syn = mc.microcircuit_synapse_numbers(scale, k_scale)
    w_mean, _ = mc.microcircuit_weights(k_scale)
    pre, post, w, d = [], [], [], []
    for a in range(8):  # target
        for b in range(8):  # source
            n = int(n_syn[a, b])
            if n == 0:
                continue
            pre.append(start[b] + rng.integers(0, sizes[b], n, dtype=np.int64))
            post.append(start[a] + rng.integers(0, sizes[a], n, dtype=np.int64))
            mean = float(w_mean[a, b])
            low, high = (0.0, np.inf) if mean > 0 else (-np.inf, 0.0)
            w.append(_redraw_normal(rng, n, mean, abs(mean) * c["weight_rel_std"], low, high))
            d_mean = c["delay_exc_mean"] if b % 2 == 0 else c["delay_inh_mean"]
            d.append(_redraw_normal(rng, n, d_mean, d_mean * c["delay_rel_std"], dt / 2, np.inf))
    return (
        np.concatenate(pre).astype(np.int32),
        np.concatenate(post).astype(np.int32),
        np.concatenate(w),
        np.concatenate(d),
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import time

    from neurojax.models import _microcircuit as mc

    mode = spec["mode"]
    scale, k_scale = float(spec["scale"]), float(spec.get("k_scale", 1.0))
    background = spec.get("background", "poisson")
    if background not in ("poisson", "dc"):
        raise ValueError(f"background must be 'poisson' or 'dc', got {background!r}")
    duration = float(spec["duration_ms"])
    dt = 0.1
    c = mc.MICROCIRCUIT_PARAMS
    b2 = _brian2.setup(
        mode, threads=int(spec["threads"]), dt_ms=dt, directory=spec.get("directory")
    )
    b2.seed(int(spec["seed"]))
    t0 = time.perf_counter()
    ms, mV, pA, pF, Hz = b2.ms, b2.mV, b2.pA, b2.pF, b2.Hz
    sizes = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    ns = {
        "e_l": c["e_l"] * mV,
        "v_th": c["v_th"] * mV,
        "v_reset": c["v_reset"] * mV,
        "tau_m": c["tau_m"] * ms,
        "tau_syn": c["tau_syn"] * ms,
        "c_m": c["c_m"] * pF,
    }
    group = b2.NeuronGroup(
        int(start[-1]),
        EQUATIONS,
        method="exact",
        threshold="v > v_th",
        reset="v = v_reset",
        refractory=c["t_ref"] * ms,
        namespace=ns,
    )
    dc = mc.microcircuit_dc(k_scale, background)
    _, j_ext = mc.microcircuit_weights(k_scale)
    k_ext = np.round(np.asarray(c["k_ext"], np.float64) * k_scale).astype(int)
    objects: list[Any] = [group]
    for a in range(8):
        sub = group[int(start[a]) : int(start[a + 1])]
        sub.v = f"{c['v0_mean'][a]}*mV + {c['v0_std'][a]}*mV*randn()"
        sub.I_e = float(dc[a]) * pA
        if background == "poisson":
            objects.append(
                b2.PoissonInput(sub, "I", int(k_ext[a]), c["bg_rate"] * Hz, weight=j_ext * pA)
            )
    pre, post, w, d = connectivity(scale, k_scale, int(spec["seed"]), dt)
    syn = b2.Synapses(group, group, model="w : amp (constant)", on_pre="I_post += w")
    syn.connect(i=pre, j=post)
    syn.w = w * pA
    syn.delay = d * ms
    spikes = b2.SpikeMonitor(group)
    objects += [syn, spikes]
    net = b2.Network(*objects)
    setup_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "impl": f"brian2_{mode}",
        "scale": scale,
        "k_scale": k_scale,
        "background": background,
        "seed": int(spec["seed"]),
        "duration_ms": duration,
        "setup_s": setup_s,
        "n_synapses": int(pre.shape[0]),
    }
    del pre, post, w, d
    result.update(
        _brian2.time_network(
            b2, net, duration, mode, repeats=int(spec["repeats"]), budget_s=float(spec["budget_s"])
        )
    )
    idx = np.asarray(spikes.i, dtype=np.int64)
    counts = np.bincount(idx, minlength=int(start[-1]))
    result["rates_hz"] = {
        p: float(counts[start[a] : start[a + 1]].mean() / (duration * 1e-3))
        for a, p in enumerate(POPS)
    }
    return result


if __name__ == "__main__":
    peer_main(run)
