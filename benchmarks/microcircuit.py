"""Speed and memory of the Potjans-Diesmann microcircuit: neurojax against NEST 3 in one run.

Each measurement runs in its own process (so that its peak RSS is its own), pinned with
`taskset` to the same cores; neurojax's XLA gets one intra-op thread per core given
(`--threads`), NEST `local_num_threads = --threads`. Peers alternate (neurojax, NEST,
neurojax, ...) for `--repeats` rounds. Reported per run: build time (connectivity, weights,
delays; for NEST `Create`/`Connect`/`Prepare`), compile time (neurojax), run time of
`--duration` ms of network activity (compile excluded) and its real-time factor, the
per-population mean rates, the same times in process CPU seconds (all threads; the fair
measure when the machine is shared and a process waits for a core), bytes per synapse of
the network's synapse arrays (`Network.nbytes()`) and the process's peak RSS divided by the
number of synapses. neurojax's build draws each pathway's weights and delays on two threads
beside its pairs, so its build time depends on the cores given (`--threads 2`: both cores).

Brian2 2.9 (`--peers ...,brian2`) runs in C++ standalone mode (`benchmarks.peers.
brian2_microcircuit`): its build is the Python set-up, code generation and compilation, its
run the loop time measured inside the binary. `--brian2-float float32` sets Brian2's
`prefs.core.default_float_dtype` to float32 (state, weights and delays in single precision:
Brian2's arithmetic changes, and with it the spikes); the default is float64. Its
`peak_rss_bytes` is the Python process's alone: the standalone binary, which runs while the
Python process waits, is a child whose peak RSS `getrusage` cannot separate from the Python
image it was forked from (sample `/proc/<pid>/status` for it).

Run: `python -m benchmarks.microcircuit [--scale 1] [--k-scale 1] [--duration 1000]
[--threads 1] [--repeats 1] [--peers neurojax,nest,brian2] [--brian2-float float32]`; one
JSON line per run.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

POPS = ("L23E", "L23I", "L4E", "L4I", "L5E", "L5I", "L6E", "L6I")


def _neurojax(args) -> dict:
    import jax

    import neurojax as nj
    from neurojax.models._microcircuit import run_spike_ids

    t0, c0 = time.perf_counter(), time.process_time()
    net, state = nj.models.microcircuit(
        jax.random.key(args.seed), scale=args.scale, k_scale=args.k_scale
    )
    jax.block_until_ready(state)
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    n_steps = round(args.duration / 0.1)
    # Two calls: the first compiles and runs (its CPU seconds include compiling), the
    # second reuses the compiled program, so its CPU seconds are the run's alone.
    first, cpu = {}, {}
    _, _, _, compile_s, _ = run_spike_ids(net, state, n_steps, 0.1, cpu=first)
    _, ids, counts, _, run_s = run_spike_ids(net, state, n_steps, 0.1, cpu=cpu)
    sizes = [net.sizes[p] for p in POPS]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rates = {
        p: float(((ids >= offsets[a]) & (ids < offsets[a + 1])).sum() / sizes[a])
        / (args.duration * 1e-3)
        for a, p in enumerate(POPS)
    }
    return {
        "n_synapses": net.n_synapses,
        "synapse_bytes_per_synapse": net.nbytes() / net.n_synapses,
        "build_s": build_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "build_cpu_s": build_cpu,
        "compile_cpu_s": max(0.0, first["s"] - cpu["s"]),
        "run_cpu_s": cpu["s"],
        "rates_hz": rates,
        "version": nj.__version__ if hasattr(nj, "__version__") else "",
    }


def _nest(args) -> dict:
    import nest

    from benchmarks.reference.microcircuit_reference import build_nest

    t0, c0 = time.perf_counter(), time.process_time()
    pops, recs = build_nest(args.scale, args.k_scale, args.seed + 1, args.threads)
    nest.Prepare()
    nest.Cleanup()
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    n_syn = nest.num_connections
    t0, c0 = time.perf_counter(), time.process_time()
    nest.Simulate(args.duration)
    run_s, run_cpu = time.perf_counter() - t0, time.process_time() - c0
    rates = {
        p: len(recs[a].get("events")["times"]) / len(pops[a]) / (args.duration * 1e-3)
        for a, p in enumerate(POPS)
    }
    return {
        "n_synapses": int(n_syn),
        "build_s": build_s,
        "compile_s": 0.0,
        "run_s": run_s,
        "build_cpu_s": build_cpu,
        "compile_cpu_s": 0.0,
        "run_cpu_s": run_cpu,
        "rates_hz": rates,
        "version": nest.__version__,
    }


def _brian2(args) -> dict:
    """Brian2 C++ standalone (`benchmarks.peers.brian2_microcircuit`): build = network set-up
    in Python, code generation and compilation; run = the loop time measured inside the
    binary on a second run of it (`device._last_run_time`; the binary is single-threaded and
    pinned, so its CPU time is its wall time on a quiet machine)."""
    import brian2

    from benchmarks.peers.brian2_microcircuit import run

    c0 = time.process_time()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run(
        {
            "mode": "standalone",
            "threads": args.threads,
            "seed": args.seed,
            "scale": args.scale,
            "k_scale": args.k_scale,
            "duration_ms": args.duration,
            "repeats": 1,
            "budget_s": 1e9,
            "float_dtype": args.brian2_float,
        }
    )
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    run_s = out["times_s"][0]
    build_s = out["setup_s"] + out["compile_s"]
    return {
        "n_synapses": out["n_synapses"],
        "build_s": build_s,
        "compile_s": 0.0,
        "run_s": run_s,
        "build_cpu_s": time.process_time()
        - c0
        + (ch1.ru_utime + ch1.ru_stime - ch0.ru_utime - ch0.ru_stime)
        - 2 * run_s,
        "compile_cpu_s": 0.0,
        "run_cpu_s": run_s,
        "rates_hz": out["rates_hz"],
        "version": brian2.__version__,
        "float_dtype": out["float_dtype"],
    }


def _child(args) -> None:
    out = {"neurojax": _neurojax, "nest": _nest, "brian2": _brian2}[args.peer](args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.update(
        peer=args.peer,
        scale=args.scale,
        k_scale=args.k_scale,
        duration_ms=args.duration,
        threads=args.threads,
        real_time_factor=out["run_s"] / (args.duration * 1e-3),
        real_time_factor_cpu=out["run_cpu_s"] / (args.duration * 1e-3),
        peak_rss_bytes=peak,
        peak_rss_bytes_per_synapse=peak / out["n_synapses"],
    )
    print("RESULT " + json.dumps(out), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--k-scale", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=1000.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", default="neurojax,nest")
    p.add_argument("--brian2-float", choices=("float64", "float32"), default="float64")
    p.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer is not None:
        _child(args)
        return
    cores = ",".join(str(i) for i in range(args.threads))
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={str(args.threads > 1).lower()}"
    ).strip()
    env["OMP_NUM_THREADS"] = str(args.threads)
    # neurojax's threads the documented way: its kernels' pool and XLA's (nj.use_cpu_threads
    # at import: PJRT_NPROC and XLA's sequential scheduler, docs/guides/cpu-threads.md)
    env["NEUROJAX_CPU_THREADS"] = str(args.threads)
    for _ in range(args.repeats):
        for peer in args.peers.split(","):
            cmd = ["taskset", "-c", cores, sys.executable, "-m", "benchmarks.microcircuit"]
            cmd += [
                "--peer", peer, "--scale", str(args.scale), "--k-scale", str(args.k_scale),
                "--duration", str(args.duration), "--threads", str(args.threads),
                "--seed", str(args.seed), "--brian2-float", args.brian2_float,
            ]  # fmt: skip
            res = subprocess.run(cmd, env=env, capture_output=True, text=True)
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
            if res.returncode or not lines:
                print(json.dumps({"peer": peer, "error": res.stderr[-2000:]}), flush=True)
                continue
            print(lines[-1][len("RESULT ") :], flush=True)


if __name__ == "__main__":
    main()
