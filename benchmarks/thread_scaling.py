"""Thread scaling of a network run (issue 40): neurojax at 1, 2, ... threads beside NEST and
Brian2 standalone at the same thread counts.

Cases: `coba` (Brette et al. 2007, 4000 neurons, 1 s), `coba_stdp` (the same with pair STDP on
E->E, `benchmarks.stdp_overhead`'s rule), `mc0.1` and `mc1` (the Potjans-Diesmann
microcircuit at scale 0.1 and 1, k_scale 1, `--mc-duration` ms), `lif1e6` (10^6 LIF neurons
with 10^8 synapses, `benchmarks.network_scale`'s network, `--lif-steps` steps).

Every measurement runs in its own process pinned with `taskset` to the first T cores:
neurojax with `NEUROJAX_CPU_THREADS=T` (its kernels' threads, and XLA's pool through
`PJRT_NPROC = T - 1`), NEST with `local_num_threads = T` (`benchmarks.peers.nest_coba`,
`benchmarks.microcircuit --peer nest`), Brian2 in C++ standalone mode with `T` OpenMP threads
(`benchmarks.peers.brian2_coba`, `brian2_coba_stdp`, `benchmarks.microcircuit --peer brian2`).
neurojax compiles first and times a second call of the same compiled run; reported per run:
wall seconds and process CPU seconds of the run, the spike count, the number of jobs the
kernels' pool ran (0: every call stayed on one thread by the measured rule), the machine's
1-minute load average when the process ended. Rounds interleave thread counts (1, 2, 1, 2,
...), so that a change of the machine's load hits both.

Then per case and implementation: the best wall time per thread count, the speed-up over
one thread and the efficiency (speed-up / T).

Run: `python -m benchmarks.thread_scaling [--cases coba,coba_stdp,mc0.1] [--threads 1,2]
[--rounds 2] [--peers nest,brian2] [--duration 1000] [--mc-duration 200] [--lif-steps 200]`
"""

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("coba", "coba_stdp", "mc0.1", "mc1", "lif1e6")
DT = 0.1


def _network(case: str, duration: float, mc_duration: float, lif_steps: int):
    """The case's network and state, its steps and its `record_every` (None: every step)."""
    import jax

    import neurojax as nj

    record = None
    if case in ("coba", "coba_stdp"):
        net, state = nj.models.coba(jax.random.key(0))
        if case == "coba_stdp":
            from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
            from benchmarks.stdp_overhead import with_stdp

            net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
        n_steps = round(duration / DT)
    elif case.startswith("mc"):
        net, state = nj.models.microcircuit(jax.random.key(0), scale=float(case[2:]), k_scale=1.0)
        n_steps = round(mc_duration / DT)
        if float(case[2:]) >= 1.0:
            # full scale: spike counts per 1 ms window (77 MB for 1 s) rather than the raster
            # (770 MB, whose fresh pages alone cost about a second of the run)
            record = 10
    else:
        from benchmarks import network_scale as ns

        k_conn, k_state = jax.random.split(jax.random.key(ns.SEED))
        n = 1_000_000
        conn = nj.connect.fixed_indegree(
            k_conn, n, n, ns.K, weight=nj.connect.normal(ns.W_MEAN, ns.W_STD)
        )
        proj = nj.Projection(
            "all", "all", conn, synapse=nj.Exponential(ns.TAU_SYN), output=nj.CurrentOutput()
        )
        net = nj.Network(
            populations={"all": (nj.LIF(**ns.LIF_PARAMS), n)},
            projections=[proj],
            inputs={"all": ns.DRIVE},
        )
        del conn, proj
        state = net.init_state(k_state)
        n_steps = lif_steps
        record = 100
    return net, state, n_steps, record


def _neurojax_child(case: str, duration: float, mc_duration: float, lif_steps: int) -> dict:
    import ctypes

    import jax
    import numpy as np

    import neurojax as nj
    from neurojax.kernels import _build

    t0 = time.perf_counter()
    net, state, n_steps, record = _network(case, duration, mc_duration, lif_steps)
    jax.block_until_ready(state)
    build_s = time.perf_counter() - t0

    def run(net, state):
        if record is None:
            _, rec = nj.simulate(net, state, dt=DT, n_steps=n_steps)
        else:
            _, rec = nj.simulate(net, state, dt=DT, n_steps=n_steps, record_every=record)
        return rec.spikes

    def count(spikes) -> float:
        return float(sum(np.asarray(x).sum(dtype=np.int64) for x in jax.tree.leaves(spikes)))

    # The timed call returns the recording as `nj.simulate` gives it to a user (the raster, or
    # window counts); the spikes are counted afterwards, outside the timed region. (Summing
    # the raster inside the jitted call, as this benchmark did until 2026-11-28 evening, made
    # XLA write a float32 copy of it: 41 000 page faults and 2.5x the run time of COBA, all of
    # it serial.)
    fn = jax.jit(run)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(net, state))
    compile_s = time.perf_counter() - t0
    lib = _build.library()
    jobs0 = 0
    if lib is not None:
        lib.NjSharedJobs.restype = ctypes.c_int64
        jobs0 = lib.NjSharedJobs()
    t0, c0 = time.perf_counter(), time.process_time()
    spikes = jax.block_until_ready(fn(net, state))
    run_s, run_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    n_spikes = count(spikes)
    del spikes
    return {
        "impl": "neurojax",
        "build_s": build_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "run_cpu_s": run_cpu_s,
        "spikes": n_spikes,
        "pool_jobs": (lib.NjSharedJobs() - jobs0) if lib is not None else None,
        # the pool's cost model after the run: calibrated round trip, unit of work, measured
        # overhead of a shared call (ns)
        "pool_model_ns": _pool_model(lib),
        "kernel_threads": nj.cpu_threads(),
        # the path nj.simulate took on the CPU ("network_run (CPU)": the whole run in one
        # call, nj_network_run) and the threads that call chose after its probe
        "cpu_path": net.explain_run(state, dt=DT, n_steps=n_steps, record_every=record or 1)[
            "cpu"
        ].split(":")[0],
        "run_threads": (
            lib.NjNetworkRunThreads()
            if lib is not None and hasattr(lib, "NjNetworkRunThreads")
            else None
        ),
        "n_steps": n_steps,
    }


def _pool_model(lib) -> list[float] | None:
    import ctypes

    if lib is None or not hasattr(lib, "NjPoolModel"):
        return None
    out = (ctypes.c_double * 3)()
    lib.NjPoolModel(out)
    return [round(x, 1) for x in out]


def _env(threads: int) -> dict[str, str]:
    drop = ("XLA_FLAGS", "PJRT_NPROC", "NEUROJAX_CPU_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(NEUROJAX_CPU_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


def _pinned(threads: int, cmd: list[str]) -> list[str]:
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    return ["taskset", "-c", ",".join(map(str, cpus)), *cmd]


def _last_json(stdout: str, prefix: str = "") -> dict | None:
    for line in reversed(stdout.splitlines()):
        line = line[len(prefix) :] if prefix and line.startswith(prefix) else line
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _run(cmd: list[str], threads: int, timeout: float, prefix: str = "") -> dict:
    try:
        proc = subprocess.run(
            _pinned(threads, cmd), env=_env(threads), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    out = _last_json(proc.stdout, prefix)
    if proc.returncode or out is None:
        return {"error": proc.stderr[-1500:]}
    return out


def measure(impl: str, case: str, threads: int, args) -> dict:
    py = sys.executable
    if impl == "neurojax":
        cmd = [py, "-m", "benchmarks.thread_scaling", "--child", case]
        cmd += ["--duration", str(args.duration), "--mc-duration", str(args.mc_duration)]
        cmd += ["--lif-steps", str(args.lif_steps)]
        out = _run(cmd, threads, args.timeout)
    elif case.startswith("mc"):
        cmd = [py, "-m", "benchmarks.microcircuit", "--peer", impl, "--scale", case[2:]]
        cmd += ["--k-scale", "1", "--duration", str(args.mc_duration), "--threads", str(threads)]
        if impl == "brian2":
            cmd += ["--brian2-float", "float32"]
        out = _run(cmd, threads, args.timeout, prefix="RESULT ")
    else:
        spec = {"model": "coba", "mode": "standalone", "threads": threads, "seed": 0,
                "duration_ms": args.duration, "repeats": 1, "budget_s": 0.0}  # fmt: skip
        if impl == "nest":
            module = "benchmarks.peers.nest_coba"
        elif case == "coba_stdp":
            module = "benchmarks.peers.brian2_coba_stdp"
            spec["stdp"] = True
        else:
            module = "benchmarks.peers.brian2_coba"
        out = _run([py, "-m", module, json.dumps(spec)], threads, args.timeout)
    out.update(case=case, impl=impl, threads=threads, load=os.getloadavg()[0])
    return out


def _run_seconds(out: dict) -> float | None:
    """The run time of a record: `run_s` (neurojax, the microcircuit's peers) or the best
    of `times_s` (the COBA peers' harness)."""
    if "run_s" in out:
        return float(out["run_s"])
    if out.get("times_s"):
        return float(min(out["times_s"]))
    return None


def _peers_for(case: str, peers: list[str]) -> list[str]:
    if case == "lif1e6":
        return []  # no peer script builds this network
    if case == "coba_stdp":
        return [p for p in peers if p == "brian2"]  # NEST's STDP network is not scripted here
    return peers


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="coba,coba_stdp,mc0.1")
    ap.add_argument("--threads", default=None, help="comma-separated (default 1..cores)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default="nest,brian2")
    ap.add_argument("--duration", type=float, default=1000.0, help="COBA runs [ms]")
    ap.add_argument("--mc-duration", type=float, default=200.0, help="microcircuit runs [ms]")
    ap.add_argument("--lif-steps", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        out = _neurojax_child(args.child, args.duration, args.mc_duration, args.lif_steps)
        print(json.dumps(out), flush=True)
        return
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"--cases: unknown case {c!r} (allowed: {', '.join(CASES)})")
    cores = len(os.sched_getaffinity(0))
    if args.threads is None:
        counts = list(range(1, cores + 1))
    else:
        try:
            counts = [int(t) for t in args.threads.split(",")]
        except ValueError:
            ap.error(f"--threads: {args.threads!r} is not a comma-separated list of integers")
        if any(t < 1 or t > cores for t in counts):
            ap.error(f"--threads: each count must be in [1, {cores}] (the cores), got {counts}")
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in ("nest", "brian2"):
            ap.error(f"--peers: unknown peer {p!r} (allowed: nest, brian2)")
    best: dict[tuple[str, str, int], float] = {}
    for r in range(args.rounds):
        for case in cases:
            for impl in ["neurojax", *_peers_for(case, peers)]:
                for t in counts:
                    out = measure(impl, case, t, args)
                    out["round"] = r
                    print(json.dumps(out), flush=True)
                    got = _run_seconds(out)
                    if got is not None:
                        key = (case, impl, t)
                        best[key] = min(best.get(key, float("inf")), got)
    print("\ncase       impl      threads  best run (s)  speed-up  efficiency")
    for case in cases:
        for impl in ["neurojax", *_peers_for(case, peers)]:
            one = best.get((case, impl, counts[0]))
            for t in counts:
                got = best.get((case, impl, t))
                if got is None:
                    continue
                up = one / got if one else float("nan")
                print(f"{case:9s}  {impl:8s}  {t:7d}  {got:12.4f}  {up:8.2f}  {up / t:10.2f}")


if __name__ == "__main__":
    main()
