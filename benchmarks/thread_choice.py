"""Does the whole network run (`nj_network_run`) choose the faster of one thread and all?

For each case, the networks of `benchmarks.thread_scaling` (`coba`: the COBA network, 1 s at dt
= 0.1 ms; `coba_stdp`: the same with pair STDP on E -> E; `mc<scale>`: the Potjans-Diesmann
microcircuit, k_scale 1, 200 ms; `lif1e6`: 10^6 LIF neurons, 200 steps), one fresh process with
the kernels' threads set to the machine's cores reports: the thread pool's calibrated round trip
(an empty job handed to the workers and back, the smallest of seven: it grows where the cores
pass a cache line slowly), the threads its first call chose (the probe), and the best of
`--repeats` calls in each of three modes, interleaved for `--rounds` rounds: `one` (the tests'
switch forcing one thread), `all` (forcing every thread) and `auto` (the measured rule, as a
user runs it). `right` says whether the first call's choice was the faster forced mode (within 3
%, a tie).

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

from . import thread_scaling

_CHILD = r"""
import ctypes, json, sys, time
import jax, neurojax as nj
from neurojax.kernels import _build
from benchmarks.thread_scaling import _network, _pool_model
case, rounds, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = _build.library()
lib.NjSetSharing.argtypes = [ctypes.c_int]
lib.NjSetSharing.restype = ctypes.c_int
net, state, n_steps, record = _network(case, 1000.0, 200.0, 200)
every = {} if record is None else {"record_every": record}
run = jax.jit(lambda s: nj.simulate(net, s, dt=0.1, n_steps=n_steps, **every)[1].spikes)
t = time.perf_counter()
jax.block_until_ready(run(state))
first_s, first_threads = time.perf_counter() - t, lib.NjNetworkRunThreads()
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
    "case": case, "threads": nj.cpu_threads(), "pool_round_trip_ns": _pool_model(lib)[0],
    "first_call_s": first_s, "first_call_threads": first_threads,
    "one_s": best["one"], "all_s": best["all"], "auto_s": best["auto"],
    "auto_threads": sorted(set(auto_threads)),
}))
"""


def measure(case: str, rounds: int, repeats: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, case, str(rounds), str(repeats)],
        env=thread_scaling._env(len(os.sched_getaffinity(0))),
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
        if case not in thread_scaling.CASES and not case.startswith("mc"):
            ap.error(f"--cases: {case!r} is not one of {', '.join(thread_scaling.CASES)}")
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
