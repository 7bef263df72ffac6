"""Procedural against stored connectivity: build, compile and loop time, bytes, peak memory.

Each configuration runs in its own process (so that its peak resident memory, `ru_maxrss`,
is its own) and prints one JSON line:

    python benchmarks/procedural.py coba --duration 1000          # COBA, stored vs procedural
    python benchmarks/procedural.py big --neurons 1000000 --fanout 10000 --duration 100
    python benchmarks/procedural.py builder --builder pkg.module:function [--kwargs JSON]

`measure(builder, ...)` takes any `builder(key) -> (network, state)` (for instance
`lambda key: nj.models.microcircuit(key, layout=...)` once that model exists), runs it for
`duration` ms and returns the figures; `big` builds a balanced E/I network of LIF neurons with
`fanout` procedural synapses per neuron (80 % excitatory, `p = fanout / neurons`), current
synapses with normally distributed weights and a 1.5 ms delay, and reports the spikes and
synaptic events it delivered. Loop time excludes compilation (the run is done twice; the
second is timed). The memory report (`Network.memory()`) gives the bytes by part.
"""

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(
    builder,
    *,
    duration: float = 1000.0,
    dt: float = 0.1,
    seed: int = 0,
    repeats: int = 1,
    label: str = "",
) -> dict:
    """Build with `builder(key) -> (network, state)`, run `duration` ms twice (the first
    compiles), and return build, compile and loop seconds, the real-time factor, the memory
    report's bytes, spikes and synaptic events per second, and the process's peak RSS."""
    import jax
    import jax.numpy as jnp

    import neurojax as nj

    base_rss = _rss_mb()
    t0 = time.perf_counter()
    net, state = builder(jax.random.key(seed))
    jax.block_until_ready(state)
    build_s = time.perf_counter() - t0
    report = net.memory()
    n_steps = int(round(duration / dt))

    chunk = max(1, min(n_steps, 200))
    while n_steps % chunk:
        chunk -= 1
    every = max(1, chunk // 10)  # spike counts over windows: no (steps x neurons) raster
    while chunk % every:  # `simulate` needs windows that tile a chunk
        every -= 1

    def run(steps):
        final, rec = nj.simulate(
            net, state, dt=dt, n_steps=steps, record_every=every, chunk_size=chunk
        )
        return jax.block_until_ready((final, rec))

    # The first call compiles the program of one chunk and runs it; the timed run reuses it.
    t0 = time.perf_counter()
    run(chunk)
    first_s = time.perf_counter() - t0
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, rec = run(n_steps)
        loops.append(time.perf_counter() - t0)
    loop_s = min(loops)
    first_s -= loop_s * chunk / n_steps  # the warm-up's own chunk of simulation
    spikes = {k: float(jnp.sum(v)) for k, v in rec.spikes.items()}
    sizes = net.sizes
    fan = {}
    for p in net.projections:
        fan[p.pre] = fan.get(p.pre, 0.0) + p.n_synapses / sizes[p.pre]
    events = sum(spikes[k] * fan.get(k, 0.0) for k in spikes)
    return {
        "label": label,
        "neurons": net.n_neurons,
        "synapses": net.n_synapses,
        "methods": sorted({p.method for p in net.projections}),
        "duration_ms": duration,
        "build_s": round(build_s, 3),
        "compile_s": round(first_s, 3),
        "loop_s": round(loop_s, 4),
        "realtime_factor": round(loop_s / (duration / 1000.0), 4),
        "rate_hz": {k: round(v / sizes[k] / (duration / 1000.0), 3) for k, v in spikes.items()},
        "synaptic_events": events,
        "ns_per_event": round(1e9 * loop_s / max(events, 1.0), 2),
        "table_bytes": report.table_bytes,
        "state_bytes": report.state_bytes,
        "planned_total_bytes": report.total_bytes,
        "bytes_per_synapse": round(report.table_bytes / max(1, net.n_synapses), 4),
        "peak_rss_mb": round(_rss_mb(), 1),
        "rss_before_build_mb": round(base_rss, 1),
        "kernel_mode": nj.kernels.mode() if hasattr(nj.kernels, "mode") else "",
    }


# ---------------------------------------------------------------------- builders


def coba(method: str, p: float = 0.02):
    """COBA (Brette et al. 2007) stored (`nj.models.coba`) or its procedural twin: the same
    sizes, Bernoulli(p) pairs, weights, kinetics and drive, each projection a
    `nj.connect.procedural.fixed_prob`."""
    import jax
    import jax.random as jr

    import neurojax as nj

    def build(key):
        net, state = nj.models.coba(key, p=p)
        if method == "stored":
            return net, state
        projs = []
        for k, proj in zip(jr.split(jr.fold_in(key, 1), 4), net.projections, strict=True):
            w = float(proj.conn.data[0])
            desc = nj.connect.procedural.fixed_prob(k, proj.n_pre, proj.n_post, p, weight=w)
            projs.append(
                nj.Projection(
                    proj.pre,
                    proj.post,
                    desc,
                    synapse=proj.synapse,
                    output=proj.output,
                    delay=proj.delay,
                )
            )
        twin = nj.Network(
            {n: (m, net.sizes[n]) for n, m in net.populations.items()},
            projs,
            inputs=net.inputs,
            dt=net.dt,
        )
        return twin, jax.tree.map(lambda x: x, state)

    return build


def big(
    neurons: int,
    fanout: int,
    *,
    method: str = "procedural",
    dt: float = 0.1,
    drive: float = 12.0,
    g: float = 5.0,
):
    """A balanced E/I LIF network with `fanout` synapses per neuron (see the module docstring).

    Drive `drive` mV above rest (threshold 10 mV above), tau_m = 20 ms, t_ref = 2 ms, current
    synapses tau = 5 ms; weights N(J, (J/10)^2) (E) and N(-g J, (g J/10)^2) (I) with
    J = 40 / fanout, so that the summed recurrent input does not depend on the fan-out."""
    import equinox as eqx
    import jax.numpy as jnp
    import jax.random as jr

    import neurojax as nj

    def build(key):
        n_e = int(0.8 * neurons)
        n_i = neurons - n_e
        p = fanout / neurons
        j = 40.0 / fanout
        lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
        sizes = {"E": n_e, "I": n_i}
        weights = {"E": nj.connect.normal(j, 0.1 * j), "I": nj.connect.normal(-g * j, 0.1 * g * j)}
        projs = []
        for idx, (pre, post) in enumerate((("E", "E"), ("E", "I"), ("I", "E"), ("I", "I"))):
            k = jr.fold_in(key, idx)
            if method == "procedural":
                conn = nj.connect.procedural.fixed_prob(
                    k, sizes[pre], sizes[post], p, weight=weights[pre]
                )
            else:
                conn = nj.connect.fixed_prob(k, sizes[pre], sizes[post], p, weight=weights[pre])
            projs.append(
                nj.Projection(
                    pre,
                    post,
                    conn,
                    synapse=nj.Exponential(5.0),
                    delay=1.5,
                    method=method if method != "stored" else "event",
                )
            )
        net = nj.Network(
            {"E": (lif, n_e), "I": (lif, n_i)}, projs, inputs={"E": drive, "I": drive}, dt=dt
        )
        state = net.init_state(jr.fold_in(key, 99))
        # Initial voltages uniform between reset and threshold (init_state's default for LIF).
        return net, eqx.tree_at(lambda s: s.step, state, jnp.zeros((), jnp.int32))

    return build


# ---------------------------------------------------------------------- command line


def _one(args) -> dict:
    if args.case == "coba":
        return measure(
            coba(args.method, args.p), duration=args.duration, label=f"coba-{args.method}"
        )
    if args.case == "big":
        return measure(
            big(args.neurons, args.fanout, method=args.method, drive=args.drive, g=args.g),
            duration=args.duration,
            label=f"big-{args.neurons}x{args.fanout}-{args.method}",
        )
    module, name = args.builder.split(":")
    fn = getattr(importlib.import_module(module), name)
    kwargs = json.loads(args.kwargs)
    return measure(lambda key: fn(key, **kwargs), duration=args.duration, label=args.builder)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=["coba", "big", "builder"])
    parser.add_argument("--method", default=None, help="stored | procedural (default: both)")
    parser.add_argument("--duration", type=float, default=1000.0, help="ms")
    parser.add_argument("--neurons", type=int, default=1_000_000)
    parser.add_argument("--fanout", type=int, default=10_000)
    parser.add_argument("--p", type=float, default=0.02)
    parser.add_argument("--drive", type=float, default=12.0, help="big: constant drive [mV]")
    parser.add_argument("--g", type=float, default=5.0, help="big: relative inhibition")
    parser.add_argument("--builder", default="", help="module:function(key, **kwargs)")
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of peers")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_one(args)), flush=True)
        return
    methods = [args.method] if args.method else ["stored", "procedural"]
    if args.case == "builder":
        methods = [None]
    for _ in range(args.rounds):
        for m in methods:  # interleaved: peers measured in the same run, one process each
            cmd = [
                sys.executable,
                __file__,
                *(argv if argv is not None else sys.argv[1:]),
                "--child",
            ]
            if m is not None and not args.method:
                cmd += ["--method", m]
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            try:
                out = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
                )
            except subprocess.TimeoutExpired:
                print(
                    json.dumps(
                        {
                            "case": args.case,
                            "method": m,
                            "error": "timeout",
                            "timeout_s": args.timeout,
                        }
                    ),
                    flush=True,
                )
                continue
            line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
            if out.returncode != 0 or not line:
                print(
                    json.dumps({"case": args.case, "method": m, "error": out.stderr[-2000:]}),
                    flush=True,
                )
            else:
                print(line, flush=True)


if __name__ == "__main__":
    main()
