"""Does the whole network run (`nj_network_run`) choose the faster of one thread and all?

For each case (`coba`: the COBA network, 1 s at dt = 0.1 ms; `coba_stdp`: the same with pair
STDP on E -> E, `benchmarks.stdp_overhead`'s rule; `mc0.1`: the Potjans-Diesmann microcircuit
at scale 0.1, k_scale 1, 200 ms) one fresh process with the kernels' threads set to the
machine's cores reports: the thread pool's calibrated round trip (an empty job handed to the
workers and back, the smallest of seven: it grows where the cores pass a cache line slowly),
the threads its first call chose (the probe), and the best of `--repeats` calls in each of
three modes, interleaved for `--rounds` rounds: `one` (the tests' switch forcing one thread),
`all` (forcing every thread) and `auto` (the measured rule, as a user runs it). `right` says
whether the first call's choice was the faster forced mode (within 3 %, a tie).

    python -m benchmarks.thread_choice [--cases coba,coba_stdp,mc0.1] [--rounds 2]
        [--repeats 5]

The machine's state matters: where two cores' round trip changes between runs (one machine
here went from 110 ns to 550 ns and back for minutes at a time), run it more than once.
"""

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import ctypes, json, sys, time
import jax, neurojax as nj
from neurojax.kernels import _build
case, rounds, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = _build.library()
lib.NjSetSharing.argtypes = [ctypes.c_int]
lib.NjSetSharing.restype = ctypes.c_int
lib.NjPoolModel.argtypes = [ctypes.POINTER(ctypes.c_double)]
if case.startswith("mc"):
    net, state = nj.models.microcircuit(jax.random.key(0), scale=float(case[2:]), k_scale=1.0)
    n_steps = 2000
else:
    net, state = nj.models.coba(jax.random.key(0))
    if case == "coba_stdp":
        from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
        from benchmarks.stdp_overhead import with_stdp
        net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    n_steps = 10_000
run = jax.jit(lambda s: nj.simulate(net, s, dt=0.1, n_steps=n_steps)[1].spikes)
t = time.perf_counter()
jax.block_until_ready(run(state))
first_s, first_threads = time.perf_counter() - t, lib.NjNetworkRunThreads()
model = (ctypes.c_double * 3)()
lib.NjPoolModel(model)
best = {"one": float("inf"), "all": float("inf"), "auto": float("inf")}
auto_threads = []
for _ in range(rounds):
    for mode, switch in (("one", 2), ("all", 1), ("auto", 0)):
        lib.NjSetSharing(switch)
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(run(state))
            best[mode] = min(best[mode], time.perf_counter() - t)
            if mode == "auto":
                auto_threads.append(lib.NjNetworkRunThreads())
        lib.NjSetSharing(0)
print(json.dumps({
    "case": case, "threads": nj.cpu_threads(), "pool_round_trip_ns": model[0],
    "first_call_s": first_s, "first_call_threads": first_threads,
    "one_s": best["one"], "all_s": best["all"], "auto_s": best["auto"],
    "auto_threads": sorted(set(auto_threads)),
}))
"""


def measure(case: str, rounds: int, repeats: int) -> dict:
    cores = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k not in ("NEUROJAX_CPU_THREADS", "PJRT_NPROC")}
    env["NEUROJAX_CPU_THREADS"] = str(cores)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, case, str(rounds), str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"thread_choice {case}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    faster = 1 if out["one_s"] <= out["all_s"] else out["threads"]
    tie = abs(out["one_s"] - out["all_s"]) <= 0.03 * min(out["one_s"], out["all_s"])
    out["right"] = tie or out["first_call_threads"] == faster
    out["speedup_all"] = out["one_s"] / out["all_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="coba,coba_stdp,mc0.1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case not in ("coba", "coba_stdp") and not case.startswith("mc"):
            ap.error(f"--cases: {case!r} is not one of coba, coba_stdp, mc<scale>")
    if args.rounds < 1 or args.repeats < 1:
        ap.error(f"--rounds {args.rounds} / --repeats {args.repeats}: both must be at least 1")
    rows = []
    for case in cases:
        out = measure(case, args.rounds, args.repeats)
        print(json.dumps({"benchmark": "thread_choice", **out}), flush=True)
        rows.append(out)
    print(
        "\n| case | pool round trip (ns) | one thread (s) | all (s) | speed-up of all | auto (s) "
        "| first call chose | right |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['case']} | {r['pool_round_trip_ns']:.0f} | {r['one_s']:.4f} | "
            f"{r['all_s']:.4f} | {r['speedup_all']:.2f}x | {r['auto_s']:.4f} | "
            f"{r['first_call_threads']} | {'yes' if r['right'] else 'NO'} |"
        )


if __name__ == "__main__":
    main()
