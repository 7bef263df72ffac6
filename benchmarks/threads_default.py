"""A plain Python call without pinning against the same call pinned to one core (issues 24
and 39), for one or more checkouts of neurojax interleaved (before and after a change).

Each configuration runs in a fresh process (XLA sizes its CPU thread pool when the process
creates its CPU client), the configurations interleaved round by round; each process times
`repeats` calls after one warm-up and reports its best wall time and the process CPU time of
that call. Configurations:

- `plain`: `nj.simulate` as a user calls it, no pinning, nothing set;
- `pinned`: the same under `taskset -c <last core>` (what `neurojax run` does by default);
- `threads`: no pinning, `NEUROJAX_CPU_THREADS=<cores>` (as `nj.use_cpu_threads()` at the top
  of the script: the kernels' threads and XLA's `PJRT_NPROC = cores - 1`); only for
  checkouts whose neurojax has `use_cpu_threads`.

Workloads: the COBA network (4000 neurons, 1 s at dt = 0.1 ms) and an uncoupled
Hodgkin-Huxley population of 10^5 neurons (100 ms of RK4 at dt = 0.05 ms), the large case
that must keep using every core.

    python -m benchmarks.threads_default [--rounds 3] [--repeats 5] [--only coba,hh]
        [--checkouts after=.,before=/work/main]
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
    t, c = time.perf_counter(), time.process_time()
    out = nj.simulate(model, state, inputs, dt=dt, n_steps=n)
    jax.block_until_ready(out)
    if i:
        times.append((time.perf_counter() - t, time.process_time() - c))
times.sort()
print(json.dumps({"best_s": times[0][0], "best_cpu_s": times[0][1],
                  "median_s": times[len(times) // 2][0]}))
"""

CONFIGS = ("plain", "pinned", "threads")


def run_one(work: str, config: str, repeats: int, checkout: str = ".") -> dict:
    drop = ("XLA_FLAGS", "NEUROJAX_CPU_THREADS", "PJRT_NPROC", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # `python -c` puts the working folder first on sys.path: the checkout's neurojax runs.
    cmd = [sys.executable, "-c", _CHILD, work, str(repeats)]
    if config == "pinned":
        cmd = ["taskset", "-c", str(max(os.sched_getaffinity(0))), *cmd]
    elif config == "threads":
        env["NEUROJAX_CPU_THREADS"] = str(len(os.sched_getaffinity(0)))
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=True, timeout=900, cwd=checkout
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _has_use_cpu_threads(checkout: str) -> bool:
    path = os.path.join(checkout, "neurojax", "_threads.py")
    with open(path) as f:
        return "def use_cpu_threads" in f.read()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="coba,hh")
    ap.add_argument(
        "--checkouts",
        default="this=.",
        help="name=path,... of neurojax checkouts to interleave (e.g. after=.,before=/work/main)",
    )
    args = ap.parse_args(argv)
    checkouts = {}
    for item in args.checkouts.split(","):
        name, sep, path = item.partition("=")
        if not sep or not name or not os.path.isdir(os.path.join(path, "neurojax")):
            ap.error(f"--checkouts: {item!r} is not name=path of a neurojax checkout")
        checkouts[name] = path
    works = [w for w in args.only.split(",") if w]
    for w in works:
        if w not in ("coba", "hh"):
            ap.error(f"--only: unknown workload {w!r} (allowed: coba, hh)")
    cores = len(os.sched_getaffinity(0))
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for w in works:
            for name, path in checkouts.items():
                for c in CONFIGS:
                    if c == "threads" and not _has_use_cpu_threads(path):
                        continue
                    got = run_one(w, c, args.repeats, path)
                    results.setdefault((w, name, c), []).append((got["best_s"], got["best_cpu_s"]))
                    print(
                        json.dumps(
                            {
                                "round": r,
                                "work": w,
                                "checkout": name,
                                "config": c,
                                "cores": cores,
                                "load": os.getloadavg()[0],
                                **got,
                            }
                        ),  # fmt: skip
                        flush=True,
                    )
    print(
        "\nworkload  checkout  config    best wall (s)  median wall (s)  best cpu (s)  "
        "wall vs pinned"
    )
    for w in works:
        for name in checkouts:
            pinned = min(x[0] for x in results[(w, name, "pinned")])
            for c in CONFIGS:
                xs = results.get((w, name, c))
                if not xs:
                    continue
                walls = [x[0] for x in xs]
                print(
                    f"{w:8s}  {name:8s}  {c:8s}  {min(walls):13.4f}  "
                    f"{statistics.median(walls):15.4f}  {min(x[1] for x in xs):12.4f}  "
                    f"{min(walls) / pinned:13.2f}x"
                )


if __name__ == "__main__":
    main()
