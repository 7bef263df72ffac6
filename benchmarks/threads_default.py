"""A plain Python call without pinning against the same call pinned to one core (issue 24).

Each configuration runs in a fresh process (XLA sizes its CPU thread pool when the process
creates its CPU client), the configurations interleaved round by round; each process times
`repeats` calls after one warm-up and reports its best. Configurations:

- `plain`: `nj.simulate` as a user calls it, no pinning, neurojax's default pool;
- `pinned`: the same under `taskset -c <last core>` (what `neurojax run` does by default);
- `xla-default`: no pinning, `NEUROJAX_CPU_THREADS=0` (XLA's own pool, the old behaviour).

Workloads: the COBA network (4000 neurons, 1 s at dt = 0.1 ms) and an uncoupled
Hodgkin-Huxley population of 10^5 neurons (100 ms of RK4 at dt = 0.05 ms), the large case
that must keep using every core.

    python -m benchmarks.threads_default [--rounds 3] [--repeats 5] [--only coba,hh]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import jax, neurojax as nj
work, repeats = sys.argv[1], int(sys.argv[2])
if work == "coba":
    model, state = nj.models.coba(jax.random.key(0))
    inputs, dt, n = None, 0.1, 10_000
else:
    model = nj.HodgkinHuxley(method="rk4")
    state = model.init_state((100_000,))
    inputs, dt, n = 10.0, 0.05, 2_000
times = []
for i in range(repeats + 1):
    t = time.perf_counter()
    out = nj.simulate(model, state, inputs, dt=dt, n_steps=n)
    jax.block_until_ready(out)
    if i:
        times.append(time.perf_counter() - t)
print(json.dumps({"best_s": min(times), "median_s": sorted(times)[len(times) // 2]}))
"""

CONFIGS = ("plain", "pinned", "xla-default")


def run_one(work: str, config: str, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NEUROJAX_CPU_THREADS")}
    cmd = [sys.executable, "-c", _CHILD, work, str(repeats)]
    if config == "pinned":
        cmd = ["taskset", "-c", str(max(os.sched_getaffinity(0))), *cmd]
    elif config == "xla-default":
        env["NEUROJAX_CPU_THREADS"] = "0"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="coba,hh")
    args = ap.parse_args(argv)
    works = [w for w in args.only.split(",") if w]
    for w in works:
        if w not in ("coba", "hh"):
            ap.error(f"--only: unknown workload {w!r} (allowed: coba, hh)")
    cores = len(os.sched_getaffinity(0))
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for w in works:
            for c in CONFIGS:
                got = run_one(w, c, args.repeats)
                results.setdefault((w, c), []).append(got["best_s"])
                print(json.dumps({"round": r, "work": w, "config": c, "cores": cores, **got}))
    print("\nworkload  config        best of rounds (s)  median of rounds (s)  vs pinned")
    for w in works:
        pinned = min(results[(w, "pinned")])
        for c in CONFIGS:
            xs = results[(w, c)]
            print(
                f"{w:8s}  {c:12s}  {min(xs):18.4f}  {statistics.median(xs):20.4f}"
                f"  {min(xs) / pinned:9.2f}x"
            )


if __name__ == "__main__":
    main()
