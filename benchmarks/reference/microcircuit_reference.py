"""Reference statistics of the Potjans-Diesmann microcircuit from NEST, for neurojax's tests.

Builds the microcircuit in NEST 3 (`iaf_psc_exp`, `fixed_total_number`, redrawn normal
weights and delays, `poisson_generator` background, the reference's optimized initial
voltages) with exactly the parameters of `nj.models.microcircuit` (taken from
`neurojax.models._microcircuit`: synapse numbers, weights in pA, DC compensation), runs it for
several seeds, and stores per-population mean rates and mean CV of the interspike intervals
over `[t_presim, t_presim + t_sim)` in `tests/data/microcircuit_nest_<tag>.json`, with the
command, the NEST version and the date.

Run: `python -m benchmarks.reference.microcircuit_reference --scale 0.1 --k-scale 0.1
[--seeds 1,2,3,4] [--t-presim 500] [--t-sim 1000] [--threads 1] [--background poisson]`.
Also usable as a module: `build_nest(...)` builds the NEST network (the speed benchmark uses it).
"""

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
POPS = ("L23E", "L23I", "L4E", "L4I", "L5E", "L5I", "L6E", "L6I")


def spike_stats(times: np.ndarray, senders: np.ndarray, n: int, t0: float, t1: float):
    """Mean rate [Hz] over the `n` neurons (ids 0..n-1) in `[t0, t1)` ms, and the mean CV of
    the interspike intervals over the neurons with at least 3 spikes there (NaN if none)."""
    sel = (times >= t0) & (times < t1)
    times, senders = times[sel], senders[sel]
    rate = times.size / n / ((t1 - t0) * 1e-3)
    order = np.lexsort((times, senders))
    times, senders = times[order], senders[order]
    cvs = []
    starts = np.flatnonzero(np.r_[True, senders[1:] != senders[:-1]])
    ends = np.r_[starts[1:], senders.size]
    for s, e in zip(starts, ends, strict=True):
        if e - s >= 3:
            isi = np.diff(times[s:e])
            cvs.append(isi.std() / isi.mean())
    return rate, (float(np.mean(cvs)) if cvs else float("nan")), len(cvs)


def build_nest(scale, k_scale, seed, threads, background="poisson", dt=0.1):
    """The microcircuit in NEST (a fresh kernel); returns (populations, recorders)."""
    import nest

    from neurojax.models import _microcircuit as mc

    c = mc.MICROCIRCUIT_PARAMS
    nest.ResetKernel()
    nest.set_verbosity("M_ERROR")
    nest.local_num_threads = threads
    nest.resolution = dt
    nest.rng_seed = seed
    n_of = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(int)
    n_syn = mc.microcircuit_synapse_numbers(scale, k_scale)
    w_mean, j_ext = mc.microcircuit_weights(k_scale)
    dc = mc.microcircuit_dc(k_scale, background)
    pops = []
    for a in range(8):
        pop = nest.Create("iaf_psc_exp", int(n_of[a]))
        pop.set(
            tau_syn_ex=c["tau_syn"],
            tau_syn_in=c["tau_syn"],
            E_L=c["e_l"],
            V_th=c["v_th"],
            V_reset=c["v_reset"],
            t_ref=c["t_ref"],
            C_m=c["c_m"],
            tau_m=c["tau_m"],
            I_e=float(dc[a]),
        )
        pop.set(V_m=nest.random.normal(c["v0_mean"][a], c["v0_std"][a]))
        pops.append(pop)
    recorders = nest.Create("spike_recorder", 8)
    for a in range(8):
        for b in range(8):
            n = int(n_syn[a, b])
            if n == 0:
                continue
            mean = float(w_mean[a, b])
            d_mean = c["delay_exc_mean"] if b % 2 == 0 else c["delay_inh_mean"]
            w_min, w_max = (0.0, np.inf) if mean > 0 else (-np.inf, 0.0)
            syn = {
                "synapse_model": "static_synapse",
                "weight": nest.math.redraw(
                    nest.random.normal(mean=mean, std=abs(mean) * c["weight_rel_std"]),
                    min=w_min,
                    max=w_max,
                ),
                "delay": nest.math.redraw(
                    nest.random.normal(mean=d_mean, std=d_mean * c["delay_rel_std"]),
                    min=0.5 * dt,
                    max=np.inf,
                ),
            }
            nest.Connect(pops[b], pops[a], {"rule": "fixed_total_number", "N": n}, syn)
    if background == "poisson":
        k_ext = np.round(np.asarray(c["k_ext"], np.float64) * k_scale)
        gens = nest.Create("poisson_generator", 8)
        gens.rate = list(k_ext * c["bg_rate"])
        for a in range(8):
            nest.Connect(
                gens[a],
                pops[a],
                "all_to_all",
                {"weight": float(j_ext), "delay": c["delay_poisson"]},
            )
    for a in range(8):
        nest.Connect(pops[a], recorders[a])
    return pops, recorders


def run_seed(scale, k_scale, seed, threads, t_presim, t_sim, background):
    import nest

    t0 = time.perf_counter()
    pops, recs = build_nest(scale, k_scale, seed, threads, background)
    nest.Prepare()
    nest.Cleanup()
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    nest.Simulate(t_presim + t_sim)
    sim_s = time.perf_counter() - t0
    out = {"seed": seed, "build_s": build_s, "sim_s": sim_s, "rates_hz": {}, "cv_isi": {}}
    for a, name in enumerate(POPS):
        ev = recs[a].get("events")
        first = pops[a][0].global_id
        rate, cv, n_cv = spike_stats(
            np.asarray(ev["times"]),
            np.asarray(ev["senders"]) - first,
            len(pops[a]),
            t_presim,
            t_presim + t_sim,
        )
        out["rates_hz"][name] = rate
        out["cv_isi"][name] = cv
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--k-scale", type=float, default=0.1)
    p.add_argument("--seeds", default="1,2,3,4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--t-presim", type=float, default=500.0)
    p.add_argument("--t-sim", type=float, default=1000.0)
    p.add_argument("--background", default="poisson", choices=("poisson", "dc"))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import nest

    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    for seed in seeds:
        r = run_seed(
            args.scale,
            args.k_scale,
            seed,
            args.threads,
            args.t_presim,
            args.t_sim,
            args.background,
        )
        print(json.dumps(r), flush=True)
        runs.append(r)
    summary: dict[str, Any] = {}
    for stat in ("rates_hz", "cv_isi"):
        vals = np.array([[r[stat][k] for k in POPS] for r in runs])
        summary[stat] = {
            "mean": dict(zip(POPS, vals.mean(axis=0).tolist(), strict=True)),
            "std": dict(zip(POPS, vals.std(axis=0, ddof=1).tolist(), strict=True)),
        }
    tag = f"s{args.scale:g}_k{args.k_scale:g}_{args.background}"
    out = Path(args.out) if args.out else REPO / "tests" / "data" / f"microcircuit_nest_{tag}.json"
    doc = {
        "what": "NEST reference of nj.models.microcircuit: per-population mean rate [Hz] and "
        "mean CV ISI (neurons with >= 3 spikes) over [t_presim, t_presim + t_sim)",
        "command": "python -m benchmarks.reference.microcircuit_reference "
        + " ".join(sys.argv[1:]),
        "nest_version": nest.__version__ if hasattr(nest, "__version__") else nest.build_info,
        "date": datetime.date.today().isoformat(),
        "scale": args.scale,
        "k_scale": args.k_scale,
        "background": args.background,
        "t_presim_ms": args.t_presim,
        "t_sim_ms": args.t_sim,
        "threads": args.threads,
        "seeds": seeds,
        "per_seed": runs,
        **summary,
    }
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
