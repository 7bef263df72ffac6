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

Memory: the synapses are connected pathway by pathway (one `connect(i=..., j=...)` each, so
Brian2's temporary copies of the indices are those of one pathway), weights and delays set
once each in SI units through the unit-less attributes (`w_`, `delay_`: no `Quantity`
copies), and the Python copies of the arrays Brian2 wrote for the binary are dropped before
the binary runs (`_brian2.time_network(..., release_arrays=True)`). `dtype` (`"float64"`,
the default, or `"float32"`, `prefs.core.default_float_dtype`) is Brian2's float type;
float32 halves the binary's weights and delays (and changes its arithmetic). At scale 0.1
the Python process peaks at about 58 bytes per synapse in float64 and the binary at about 63
(48 in float32).

Usage: `python -m benchmarks.peers.brian2_microcircuit SPEC_JSON` with keys `mode`
('standalone' or 'cython'), `threads`, `seed`, `scale`, `k_scale`, `duration_ms`,
`repeats`, `budget_s`, optionally `background` ('poisson' or 'dc'), `dtype` ('float64' or
'float32') and `directory`.
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


def pathways(scale: float, k_scale: float, seed: int, dt: float = 0.1):
    """Per pathway (target, then source population), `(pre, post, weight [pA], delay [ms])`
    of its synapses: int32 indices into the whole group, float64 weights and delays."""
    from neurojax.models import _microcircuit as mc

    c = mc.MICROCIRCUIT_PARAMS
    rng = np.random.default_rng(seed)
    sizes = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    n_syn = mc.microcircuit_synapse_numbers(scale, k_scale)
    w_mean, _ = mc.microcircuit_weights(k_scale)
    for a in range(8):  # target
        for b in range(8):  # source
            n = int(n_syn[a, b])
            if n == 0:
                continue
            pre = (start[b] + rng.integers(0, sizes[b], n, dtype=np.int64)).astype(np.int32)
            post = (start[a] + rng.integers(0, sizes[a], n, dtype=np.int64)).astype(np.int32)
            mean = float(w_mean[a, b])
            low, high = (0.0, np.inf) if mean > 0 else (-np.inf, 0.0)
            w = _redraw_normal(rng, n, mean, abs(mean) * c["weight_rel_std"], low, high)
            d_mean = c["delay_exc_mean"] if b % 2 == 0 else c["delay_inh_mean"]
            d = _redraw_normal(rng, n, d_mean, d_mean * c["delay_rel_std"], dt / 2, np.inf)
            yield pre, post, w, d


def n_synapses(scale: float, k_scale: float) -> int:
    """The number of recurrent synapses of the model at this scale."""
    from neurojax.models import _microcircuit as mc

    return int(np.asarray(mc.microcircuit_synapse_numbers(scale, k_scale), np.int64).sum())


def connectivity(scale: float, k_scale: float, seed: int, dt: float = 0.1, dtype: Any = np.float64):
    """`(pre, post, weight [pA], delay [ms])` of every recurrent synapse, in pathway order
    (`pathways` concatenated): int32 indices, `dtype` weights and delays."""
    total = n_synapses(scale, k_scale)
    pre, post = np.empty(total, np.int32), np.empty(total, np.int32)
    w, d = np.empty(total, dtype), np.empty(total, dtype)
    at = 0
    for parts in pathways(scale, k_scale, seed, dt):
        n = parts[0].shape[0]
        for out, part in zip((pre, post, w, d), parts, strict=True):
            out[at : at + n] = part
        at += n
    return pre, post, w, d


def _forget_index_copies(b2: Any) -> None:
    """Drop the Python-side copies of `connect(i=..., j=...)`'s index arrays that Brian2's
    standalone device caches for reading values back before a run (the copies written for
    the binary stay in `device.static_arrays`)."""
    cache = b2.device.array_cache
    for var in [v for v in cache if getattr(v, "name", None) in ("sources", "targets")]:
        del cache[var]


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
    dtype = spec.get("dtype", "float64")
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    b2 = _brian2.setup(
        mode, threads=int(spec["threads"]), dt_ms=dt, dtype=dtype, directory=spec.get("directory")
    )
    # 64 connect calls make 64 code objects: compile them two at a time (Brian2's default
    # `make -j` starts them all at once, about 100 MB of compiler each).
    b2.prefs.devices.cpp_standalone.extra_make_args_unix = ["-j2"]
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
    # One connect call per pathway, so that Brian2's copies of one pathway's indices are the
    # only temporaries; weights and delays gathered in SI units for one assignment each
    # (through the unit-less attributes: no Quantity copies).
    syn = b2.Synapses(group, group, model="w : amp (constant)", on_pre="I_post += w")
    total = n_synapses(scale, k_scale)
    w_all, d_all = np.empty(total, dtype), np.empty(total, dtype)
    at = 0
    for pre, post, w, d in pathways(scale, k_scale, int(spec["seed"]), dt):
        syn.connect(i=pre, j=post)
        _forget_index_copies(b2)
        n = pre.shape[0]
        w_all[at : at + n] = w * 1e-12  # pA -> A
        d_all[at : at + n] = d * 1e-3  # ms -> s
        at += n
    syn.w_ = w_all
    del w_all
    syn.delay_ = d_all
    del d_all
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
        "n_synapses": total,
        "float_dtype": dtype,
    }
    result.update(
        _brian2.time_network(
            b2,
            net,
            duration,
            mode,
            repeats=int(spec["repeats"]),
            budget_s=float(spec["budget_s"]),
            release_arrays=mode == "standalone",
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
