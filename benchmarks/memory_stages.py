"""Where a process's memory goes while it builds and runs the cortical microcircuit.

Prints one JSON line: the resident size (MB, `/proc/self/statm`) and the peak so far
(`ru_maxrss`) after each stage: importing neurojax, one tiny jitted call (the XLA runtime),
the build (`nj.models.microcircuit`), compiling one jitted step, compiling and running the
first chunk of `nj.simulate`, and the rest of the run; plus the network's own bytes from
`network.memory()`. Each stage's growth is what it added and kept (or the compiler's
memory, which the allocator keeps).

    python -m benchmarks.memory_stages [--layout procedural|event] [--scale 1.0]
        [--steps 1000] [--no-merge]

Linux only (`/proc`).
"""

import argparse
import json
import os
import resource


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="procedural", choices=("procedural", "event"))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=1000, help="steps of 0.1 ms (>= 200)")
    parser.add_argument(
        "--no-merge", action="store_true", help="one ring block per pathway (merge_synapses=False)"
    )
    args = parser.parse_args(argv)
    if args.steps < 200:
        parser.error(f"--steps must be at least 200 (one chunk), got {args.steps}")
    stages: dict[str, tuple[float, float]] = {}

    def mark(name: str) -> None:
        stages[name] = (round(_rss_mb(), 1), round(_peak_mb(), 1))

    import jax
    import jax.numpy as jnp

    import neurojax as nj

    mark("import")
    jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
    mark("one_jit")
    net, state = nj.models.microcircuit(
        jax.random.key(0), scale=args.scale, layout=args.layout, merge_synapses=not args.no_merge
    )
    jax.block_until_ready(state)
    mark("build")
    report = net.memory()
    step = jax.jit(lambda n, s: n.step(s, None, 0.1)).lower(net, state).compile()
    mark("compile_step")
    del step
    kw = dict(dt=0.1, record_every=20, chunk_size=200)
    state, _ = nj.simulate(net, state, n_steps=200, **kw)
    jax.block_until_ready(state)
    mark("first_chunk")
    if args.steps > 200:
        state, _ = nj.simulate(net, state, n_steps=args.steps - 200, **kw)
        jax.block_until_ready(state)
    mark("run")
    print(
        json.dumps(
            {
                "layout": args.layout,
                "scale": args.scale,
                "merge_synapses": not args.no_merge,
                "network_mb": round(report.total_bytes / 2**20, 1),
                "state_mb": round(report.state_bytes / 2**20, 1),
                "stages_rss_peak_mb": stages,
            }
        )
    )


if __name__ == "__main__":
    main()
