"""Benchmark: building large sparse connectivity with nj.connect (time, bytes, peak memory).

Configurations (full size; `--quick` divides the neuron counts by 10):

- `fixed_indegree`: n_pre = n_post = 10^6, k = 100, float32 weights (10^8 synapses), the
  connectivity of the 10^6-neuron scale target of the networks issue;
- `fixed_outdegree`: the same sizes, drawn row by row (no global sort);
- `fixed_prob`: n = 10^5, p = 0.02 (2 * 10^8 synapses), never touching n^2 pairs;
- `distance_connect`: a periodic 1000 x 1000 lattice, radius 3 (28 neighbours, 2.8 * 10^7
  synapses) with cell lists.

Each configuration runs in its own process, so that `peak_rss_gib` (the process's maximum
resident set, `ru_maxrss`) is its own; `rss_before_gib` is that maximum just before the build
(Python, JAX and NumPy loaded). `build_s` is the wall time of one build, JIT compilation of the
sampling kernels included (about 1 s), ending when the BCOO's arrays are ready. Reported too:
`bytes_per_synapse` of the result (int32 indices + float32 data = 12) and, for the
fixed-degree rules, whether every degree is exactly k.

Run: `python -m benchmarks.connect_scale [--quick] [--only fixed_indegree,fixed_prob]
[--threads 1|2]`; one JSON line per configuration on stdout.
"""

import argparse
import json
import resource
import subprocess
import sys
import time

from . import _harness

CONFIGS = ("fixed_indegree", "fixed_outdegree", "fixed_prob", "distance_connect")


def _rss_gib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _child(name: str, quick: bool) -> dict:
    import jax
    import numpy as np

    import neurojax as nj

    scale = 10 if quick else 1
    key = jax.random.key(0)
    if name in ("fixed_indegree", "fixed_outdegree"):
        n, k = 1_000_000 // scale, 100
        params = {"n_pre": n, "n_post": n, "k": k}
        build = getattr(nj.connect, name)
        call = lambda: build(key, n, n, k)  # noqa: E731
    elif name == "fixed_prob":
        n, p = 100_000 // scale, 0.02
        params = {"n_pre": n, "n_post": n, "p": p}
        call = lambda: nj.connect.fixed_prob(key, n, n, p)  # noqa: E731
    elif name == "distance_connect":
        side = 1000 // int(np.sqrt(scale) + 0.5)
        pos = nj.connect.grid_positions((side, side))
        params = {"lattice": [side, side], "radius": 3.0, "periodic": True}
        call = lambda: nj.connect.distance_connect(  # noqa: E731
            key, pos, pos, 3.0, periodic=float(side), allow_self=False
        )
    else:
        raise SystemExit(f"unknown configuration {name!r}; choose from {CONFIGS}")
    rss_before = _rss_gib()
    t0 = time.perf_counter()
    conn = call()
    jax.block_until_ready((conn.indices, conn.data))
    build_s = time.perf_counter() - t0
    peak = _rss_gib()
    s = nj.connect.stats(conn)
    record = {
        "bench": "connect_scale",
        "builder": name,
        **params,
        "n_synapses": s["n_synapses"],
        "build_s": build_s,
        "synapses_per_s": s["n_synapses"] / build_s,
        "bytes": s["bytes"],
        "bytes_per_synapse": s["bytes_per_synapse"],
        "peak_rss_gib": peak,
        "rss_before_gib": rss_before,
        "mean_fan_in": s["mean_fan_in"],
        "mean_fan_out": s["mean_fan_out"],
    }
    if name == "fixed_indegree":
        record["degrees_exact"] = s["min_fan_in"] == s["max_fan_in"] == params["k"]
    elif name == "fixed_outdegree":
        record["degrees_exact"] = s["min_fan_out"] == s["max_fan_out"] == params["k"]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="neuron counts divided by 10")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {CONFIGS}")
    parser.add_argument("--threads", type=int, choices=(1, 2), default=2)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _harness.configure_threads(args.threads)
        _harness.emit(_child(args.child, args.quick))
        return 0
    names = CONFIGS if args.only is None else tuple(args.only.split(","))
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--only must name configurations from {CONFIGS}, got {unknown}")
    failed = 0
    for name in names:
        _harness.log(f"connect_scale: {name}")
        cmd = [sys.executable, "-m", "benchmarks.connect_scale", "--child", name]
        cmd += ["--threads", str(args.threads)] + (["--quick"] if args.quick else [])
        proc = subprocess.run(
            cmd,
            cwd=_harness.REPO_ROOT,
            env=_harness.thread_env(args.threads),
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            failed += 1
            tail = " | ".join(proc.stderr.strip().splitlines()[-10:])
            _harness.emit({"bench": "connect_scale", "builder": name, "error": tail})
            continue
        record = json.loads(lines[-1])
        record["threads"] = args.threads
        _harness.emit(record)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
