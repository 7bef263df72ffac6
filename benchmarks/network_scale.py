"""Benchmark: a 10^6-neuron LIF network with 10^8 synapses, built and run with neurojax.

One population of N `nj.LIF` neurons (tau_m = 20 ms, v_rest = v_reset = -60 mV,
v_th = -50 mV, t_ref = 2 ms, r_m = 1 so that currents are in mV), every neuron receiving
exactly K = 100 synapses from random neurons of the population (`nj.connect.fixed_indegree`,
autapses allowed; N = 10^6: 10^8 synapses) with float32 weights drawn per synapse from N(-2, 2^2) mV
(`nj.connect.normal`), exponential current synapses (5 ms), one `nj.Projection(...,
method="event")` in an `nj.Network`, and a constant drive of 20 mV. The drive alone would make
every neuron fire at ~60 Hz; the net inhibition (K x rate x 5 ms x -2 mV, 10 mV at 10 Hz)
holds the network in a fluctuation-driven state near 11 Hz (measured from 10^4 to 10^6
neurons), so it neither dies nor explodes: `rate_bins_hz`, the population rate per
`record_every` window, shows that it stays put. Initial voltages are uniform between reset
and threshold (`Network.init_state(key)`).

The run is 100 ms (1000 steps of 0.1 ms) with `nj.simulate(..., record_every=100)`: spike
counts per neuron and 10 ms window (uint8), 10 MB at N = 10^6 instead of a 1 GB raster.

Reported, each phase timed on its own (wall clock, arrays ready): `connect_s` (the
connectivity, weights included), `build_s` (`Projection` and `Network`: the compressed-row
layout), `bytes_per_synapse` = `net.nbytes() / net.n_synapses` (int32 target index and float32
weight: 8 plus the row pointers), `compile_s` and `run_s` of the whole run (ahead-of-time
compilation, as in every benchmark), `steps_per_s`, `synaptic_events_per_s` (spikes x mean
fan-out per second of run), `rate_hz`, and the process's peak resident set `peak_rss_gib`
(`ru_maxrss`) with the resident set after each phase. Each size runs in its own process so
that the peak is its own. `cpu_kernel` says whether event delivery ran through neurojax's
compiled CPU kernel (`NEUROJAX_CPU_KERNEL=0` in the environment selects the pure-JAX path).

`--quick` (the smoke test) uses N = 10^4 (10^6 synapses).

Run: `python -m benchmarks.network_scale [--quick] [--sizes 1000000] [--steps 1000]
[--threads 1|2] [--repeats R]`. There are no peers (`--no-peers` is accepted and ignored).
"""

import argparse
import resource
import subprocess
import sys
import time

from . import _harness

SIZES = (1_000_000,)
QUICK_SIZES = (10_000,)
DT = 0.1  # ms
N_STEPS = 1000
RECORD_EVERY = 100
K = 100
SEED = 0
LIF_PARAMS = dict(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, r_m=1.0, t_ref=2.0)
W_MEAN, W_STD = -2.0, 2.0  # mV (current units with r_m = 1)
TAU_SYN = 5.0  # ms
DRIVE = 20.0  # mV


def _extra(parser) -> None:
    parser.add_argument("--steps", type=int, default=N_STEPS, help="steps of dt = 0.1 ms")
    parser.add_argument("--record-every", type=int, default=RECORD_EVERY, help="window (steps)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def _rss_gib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _current_rss_gib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**30


def _child(args) -> dict:
    import jax
    import numpy as np

    import neurojax as nj

    (n,) = args.sizes
    steps, every = args.steps, args.record_every
    k_conn, k_state = jax.random.split(jax.random.key(SEED))
    record = {
        "bench": "network_scale",
        "impl": "neurojax",
        "n": n,
        "k": K,
        "dt": DT,
        "steps": steps,
        "record_every": every,
        "threads": args.threads,
        "weights": f"normal({W_MEAN}, {W_STD})",
        "drive_mv": DRIVE,
    }
    rss = {"imports": _current_rss_gib()}

    t0 = time.perf_counter()
    conn = nj.connect.fixed_indegree(k_conn, n, n, K, weight=nj.connect.normal(W_MEAN, W_STD))
    jax.block_until_ready((conn.indices, conn.data))
    record["connect_s"] = time.perf_counter() - t0
    rss["connect"] = _current_rss_gib()
    _harness.log(f"network_scale: n={n}: connectivity in {record['connect_s']:.1f} s")

    t0 = time.perf_counter()
    lif = nj.LIF(**LIF_PARAMS)
    proj = nj.Projection(
        "all",
        "all",
        conn,
        synapse=nj.Exponential(TAU_SYN),
        output=nj.CurrentOutput(),
        method="event",
    )
    net = nj.Network(populations={"all": (lif, n)}, projections=[proj], inputs={"all": DRIVE})
    jax.block_until_ready((proj.indptr, proj.indices, proj.weights))
    record["build_s"] = time.perf_counter() - t0
    del conn, proj
    rss["build"] = _current_rss_gib()
    state = net.init_state(k_state)
    record.update(
        n_synapses=net.n_synapses,
        synapse_bytes=net.nbytes(),
        bytes_per_synapse=net.nbytes() / net.n_synapses,
        weight_dtype=str(net.projections[0].weights.dtype),
        max_fan_out=net.projections[0].max_fan_out,
    )
    _harness.log(f"network_scale: n={n}: network built in {record['build_s']:.1f} s")

    net = _harness.fit_spike_capacity(net, state, dt=DT, n_steps=steps)

    def run(net, state):
        final, rec = nj.simulate(net, state, dt=DT, n_steps=steps, record_every=every)
        return final, rec.spikes["all"]

    timing, (_, counts), _ = _harness.time_jax(
        run, (net, state), repeats=args.repeats, budget_s=args.budget
    )
    rss["run"] = _current_rss_gib()
    counts = np.asarray(counts)
    per_window = counts.sum(axis=1, dtype=np.int64)
    n_spikes = int(per_window.sum())
    window_s = every * DT * 1e-3
    record.update(timing.as_dict())
    record.update(
        steps_per_s=steps / timing.run_s,
        neuron_steps_per_s=n * steps / timing.run_s,
        synaptic_events_per_s=n_spikes * (net.n_synapses / n) / timing.run_s,
        n_spikes=n_spikes,
        rate_hz=n_spikes / (n * steps * DT * 1e-3),
        rate_bins_hz=(per_window / (n * window_s)).tolist(),
        frac_silent=float(np.mean(counts.sum(axis=0) == 0)),
        cpu_kernel=_harness.neurojax_cpu_kernel(),
        rss_gib=rss,
        peak_rss_gib=_rss_gib(),
    )
    return record


def main(argv: list[str] | None = None) -> int:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=SIZES, quick_sizes=QUICK_SIZES, argv=argv, extra=_extra
    )
    if args.steps % args.record_every:
        raise SystemExit(f"--record-every {args.record_every} must divide --steps {args.steps}")
    if args.child:
        _harness.emit(_child(args))
        return 0
    failed = 0
    for n in args.sizes:
        _harness.log(f"network_scale: n={n}")
        cmd = [sys.executable, "-m", "benchmarks.network_scale", "--child", "--sizes", str(n)]
        cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
        cmd += ["--budget", str(args.budget), "--steps", str(args.steps)]
        cmd += ["--record-every", str(args.record_every)]
        proc = subprocess.run(
            cmd,
            cwd=_harness.REPO_ROOT,
            env=_harness.thread_env(args.threads),
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            failed += 1
            _harness.emit(
                {
                    "bench": "network_scale",
                    "impl": "neurojax",
                    "n": n,
                    "threads": args.threads,
                    "error": f"child exited with {proc.returncode} (its stderr is above)",
                }
            )
            continue
        print(lines[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
