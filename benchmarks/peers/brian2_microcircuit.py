"""Brian2 peer for the Potjans-Diesmann (2014) cortical microcircuit: one process per run.

The model of `nj.models.microcircuit` with the parameters of
`neurojax.models._microcircuit.MICROCIRCUIT_PARAMS` (the same source as the NEST reference,
`benchmarks/reference/microcircuit_reference.build_nest`), written as a Brian2 user would:

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

Memory (what lets the full-scale model, 3e8 synapses, run on a 24 GB machine in float32):
the arrays are built per pathway in int32 / float, handed to Brian2 without unit-carrying
copies, connected in pieces with the standalone device's Python cache dropped, and freed,
with Brian2's own copies, before the compiler and the binary run. The binary itself needs
about 66 bytes per synapse in float64 and 50 in float32 (its static copies of the arrays,
the synapses' arrays and the spike queue), the Python set-up about 33 and 26.

Usage: `python -m benchmarks.peers.brian2_microcircuit SPEC_JSON` with keys `mode`
('standalone' or 'cython'), `threads`, `seed`, `scale`, `k_scale`, `duration_ms`,
`repeats`, `budget_s`, optionally `background` ('poisson' or 'dc'), `float_dtype`
('float64', the default, or 'float32': Brian2's `prefs.core.default_float_dtype`, which
changes its arithmetic and so its spikes) and `directory`.
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


def _fill_integers(rng, out: np.ndarray, offset: int, high: int) -> None:
    """Fill `out` with `offset + rng.integers(0, high)`, drawn in int64 chunks.

    NumPy's `Generator.integers` gives the same stream whether `n` values are drawn at once
    or in consecutive chunks, so the result equals one int64 draw cast to `out.dtype`,
    without its full-size int64 temporary."""
    chunk = 1 << 22
    for s in range(0, out.shape[0], chunk):
        part = out[s : s + chunk]
        part[:] = offset + rng.integers(0, high, part.shape[0], dtype=np.int64)


def connectivity(
    scale: float,
    k_scale: float,
    seed: int,
    dt: float = 0.1,
    *,
    dtype: Any = np.float64,
    si: bool = False,
):
    """`(pre, post, weight, delay)` of every recurrent synapse, in pathway order.

    Indices are int32, weights and delays `dtype` (float64 or float32), in pA and ms, or in
    A and s with `si=True` (the values Brian2 stores, so that they can be handed over without
    a unit-carrying copy). Each pathway is drawn into the preallocated output arrays, so the
    peak memory is the outputs plus one pathway's float64 draws; the random stream, and the
    float64 values, are those of drawing each pathway's arrays whole."""
    from neurojax.models import _microcircuit as mc

    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dtype}")
    c = mc.MICROCIRCUIT_PARAMS
    rng = np.random.default_rng(seed)
    sizes = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    n_syn = mc.microcircuit_synapse_numbers(scale, k_scale)
    w_mean, _ = mc.microcircuit_weights(k_scale)
    total = int(sum(int(n_syn[a, b]) for a in range(8) for b in range(8)))
    if start[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"scale={scale} gives more neurons than int32 indices can hold")
    w_unit, d_unit = (1e-12, 1e-3) if si else (1.0, 1.0)
    pre = np.empty(total, np.int32)
    post = np.empty(total, np.int32)
    w = np.empty(total, dtype)
    d = np.empty(total, dtype)
    pos = 0
    for a in range(8):  # target
        for b in range(8):  # source
            n = int(n_syn[a, b])
            if n == 0:
                continue
            sl = slice(pos, pos + n)
            pos += n
            _fill_integers(rng, pre[sl], int(start[b]), int(sizes[b]))
            _fill_integers(rng, post[sl], int(start[a]), int(sizes[a]))
            mean = float(w_mean[a, b])
            low, high = (0.0, np.inf) if mean > 0 else (-np.inf, 0.0)
            draw = _redraw_normal(rng, n, mean, abs(mean) * c["weight_rel_std"], low, high)
            w[sl] = draw * w_unit  # exact for a unit of 1.0
            d_mean = c["delay_exc_mean"] if b % 2 == 0 else c["delay_inh_mean"]
            draw = _redraw_normal(rng, n, d_mean, d_mean * c["delay_rel_std"], dt / 2, np.inf)
            d[sl] = draw * d_unit  # exact for a unit of 1.0
            del draw
    return pre, post, w, d


def _forget_cached_synapses(b2: Any, syn: Any) -> None:
    """Drop the Python-side values Brian2's standalone device caches for `syn`.

    The cache (`device.array_cache`) only serves reading or indexing these variables from
    Python before the run, which this peer never does; after the run Brian2 reads them
    from the binary's results. With `N` uncached, later `connect` calls do not cache the
    synapses' pre- and postsynaptic indices either."""
    cache = b2.device.array_cache
    for var in list(cache):
        if getattr(var.owner, "name", None) == syn.name:
            cache[var] = None


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import time

    from neurojax.models import _microcircuit as mc

    mode = spec["mode"]
    scale, k_scale = float(spec["scale"]), float(spec.get("k_scale", 1.0))
    background = spec.get("background", "poisson")
    if background not in ("poisson", "dc"):
        raise ValueError(f"background must be 'poisson' or 'dc', got {background!r}")
    float_dtype = spec.get("float_dtype", "float64")
    if float_dtype not in ("float64", "float32"):
        raise ValueError(f"float_dtype must be 'float64' or 'float32', got {float_dtype!r}")
    duration = float(spec["duration_ms"])
    dt = 0.1
    c = mc.MICROCIRCUIT_PARAMS
    b2 = _brian2.setup(
        mode,
        threads=int(spec["threads"]),
        dt_ms=dt,
        dtype=float_dtype,
        directory=spec.get("directory"),
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
    # Weights in A and delays in s, so that `w_`/`delay_` take them without a Quantity copy.
    # The arrays live in a dict, not in local variables, and leave it once Brian2 holds its
    # own copy: Brian2 captures the caller's local namespace on `connect` and on assignments
    # (for names in string expressions) and keeps it, which would keep the arrays alive.
    seed = int(spec["seed"])
    arrays = dict(
        zip(
            ("pre", "post", "w", "d"),
            connectivity(scale, k_scale, seed, dt, dtype=float_dtype, si=True),
        )
    )
    n_synapses = int(arrays["pre"].shape[0])
    syn = b2.Synapses(group, group, model="w : amp (constant)", on_pre="I_post += w")
    # `connect` in 16 pieces: in standalone mode each call makes int32 copies of the indices
    # it gets (a cached one and the one written to disk) and caches int64 `_synaptic_pre` /
    # `_synaptic_post` in Python; per piece, with the cache dropped after each call, these
    # copies stay small. The synapses keep their order.
    piece = -(-n_synapses // 16)
    for lo in range(0, n_synapses, piece):
        syn.connect(i=arrays["pre"][lo : lo + piece], j=arrays["post"][lo : lo + piece])
        if mode == "standalone":
            _forget_cached_synapses(b2, syn)
    del arrays["pre"], arrays["post"]
    syn.w_ = arrays.pop("w")
    syn.delay_ = arrays.pop("d")
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
        "n_synapses": n_synapses,
    }
    result.update(
        _brian2.time_network(
            b2,
            net,
            duration,
            mode,
            repeats=int(spec["repeats"]),
            budget_s=float(spec["budget_s"]),
            free_static_arrays=True,
        )
    )
    idx = np.asarray(spikes.i, dtype=np.int64)
    counts = np.bincount(idx, minlength=int(start[-1]))
    if mode == "standalone" and spec.get("directory") is None:
        # The project folder made for this run (static arrays and results: 6-12 GB at
        # full scale); a folder the caller named is kept.
        import shutil

        shutil.rmtree(b2.device.project_dir, ignore_errors=True)
    result["rates_hz"] = {
        p: float(counts[start[a] : start[a + 1]].mean() / (duration * 1e-3))
        for a, p in enumerate(POPS)
    }
    return result


if __name__ == "__main__":
    peer_main(run)
