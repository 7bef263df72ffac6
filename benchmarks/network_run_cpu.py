"""Benchmark: the CPU's whole network run (`nj_network_run`) against the per-step path it
replaces, interleaved in one process per thread count.

The network (`--network`) is the Potjans-Diesmann microcircuit (`mc`, the default:
`nj.models.microcircuit`, k_scale 1, its Poisson background) at `--scale` (default 0.1), or
COBA (`coba`: `nj.models.coba`, 4000 neurons, conductance synapses, constant input),
`--duration` ms (default 200) at dt 0.1 ms, recorded as `nj.simulate` records it by default
(the bool raster; the background's counts).
Each thread count runs in its own process (`NEUROJAX_CPU_THREADS=T`, set before JAX starts):
both paths are compiled first (`nj.kernels.whole_networks(True | False)`), then timed
`--reps` times each, alternating which goes first, and the spike totals of the two are
checked equal. Printed per thread count: best and median run seconds of each path, their
ratio, and the threads the whole run chose after its probe (`NjNetworkRunThreads`).

Run: `python -m benchmarks.network_run_cpu [--network mc|coba] [--threads 1,2] [--scale 0.1]
[--duration 200] [--reps 12]`
"""

import argparse
import json
import os
import subprocess
import sys


def _child(network: str, scale: float, duration: float, reps: int) -> dict:
    import time

    import jax
    import numpy as np

    import neurojax as nj
    from neurojax.kernels import _build

    if network == "coba":
        net, state = nj.models.coba(jax.random.key(0))
    else:
        net, state = nj.models.microcircuit(jax.random.key(0), scale=scale, k_scale=1.0)
    n_steps = round(duration / 0.1)

    def make(whole: bool):
        def run(net, state):
            with nj.kernels.whole_networks(whole):
                return nj.simulate(net, state, dt=0.1, n_steps=n_steps)[1].spikes

        return jax.jit(run)

    fns = {"whole": make(True), "per_step": make(False)}
    totals = {}
    for name, fn in fns.items():
        out = jax.block_until_ready(fn(net, state))
        totals[name] = int(sum(np.asarray(x).sum(dtype=np.int64) for x in jax.tree.leaves(out)))
    if totals["whole"] != totals["per_step"]:
        raise SystemExit(f"network_run_cpu: the two paths' spikes differ: {totals}")
    times = {name: [] for name in fns}
    for r in range(reps):
        order = ("whole", "per_step") if r % 2 else ("per_step", "whole")
        for name in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](net, state))
            times[name].append(time.perf_counter() - t0)
    lib = _build.library()
    return {
        "threads": nj.cpu_threads(),
        "run_threads": lib.NjNetworkRunThreads() if lib is not None else None,
        "path": net.explain_run(state, dt=0.1, n_steps=n_steps)["cpu"],
        "spikes": totals["whole"],
        **{f"{k}_best_s": min(v) for k, v in times.items()},
        **{f"{k}_median_s": float(np.median(v)) for k, v in times.items()},
        "load": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", choices=("mc", "coba"), default="mc")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.network, args.scale, args.duration, args.reps)))
        return 0
    rows = []
    for t in (int(x) for x in args.threads.split(",")):
        env = {**os.environ, "NEUROJAX_CPU_THREADS": str(t)}
        cmd = [sys.executable, "-m", "benchmarks.network_run_cpu", "--child",
               "--network", args.network, "--scale", str(args.scale),
               "--duration", str(args.duration), "--reps", str(args.reps)]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(rec))
        rows.append(rec)
    print(f"\n{'threads':>7}  {'whole run (s)':>13}  {'per-step (s)':>12}  {'ratio':>6}  chose")
    for r in rows:
        ratio = r["per_step_best_s"] / r["whole_best_s"]
        print(f"{r['threads']:>7}  {r['whole_best_s']:>13.4f}  {r['per_step_best_s']:>12.4f}  "
              f"{ratio:>6.2f}  {r['run_threads']}")  # fmt: skip
    if len(rows) > 1:
        base = rows[0]["whole_best_s"]
        for r in rows[1:]:
            print(f"whole run, {r['threads']} threads over {rows[0]['threads']}: "
                  f"{base / r['whole_best_s']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
