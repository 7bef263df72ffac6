"""Benchmark: the cost per trial of `jax.vmap` over trials of the COBA network.

A sweep (`nj.parallel.sweep`) and a user's `jax.vmap(simulate)` batch trials with `vmap`. On
the pure-JAX path (`NEUROJAX_CPU_KERNEL=0`, what GPUs and TPUs run) a step that branches on
the data (`lax.switch`, a `while` of data-dependent length) becomes "run every branch" under
`vmap`; a step without branches batches into one computation. This benchmark times
`nj.simulate` of the COBA network (`nj.models.coba`, 4000 neurons, dt 0.1 ms, spike counts
per 1 ms window) for one trial and under `jax.vmap` over `--batch` trials with independent
initial voltages and the same connectivity, static and with pair STDP on E->E, and reports
`vmap_per_trial_over_single` (the vmapped run's time / batch / the single trial's time).

Each configuration is compiled ahead of time; the time is the best of `--repeats` calls.
Under `vmap` no chunk can be rerun, so the network gets a spike capacity (`--capacity`,
default 1024) that holds the COBA network's initial burst (about 650 spikes in one step).

Run: `NEUROJAX_CPU_KERNEL=0 python -m benchmarks.vmap_cost [--steps 2000] [--batch 8]
[--capacity 1024] [--repeats 3] [--threads 1]`.
"""

import argparse
import json
import os
import platform
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stdp", choices=("both", "off", "on"), default="both")
    args = parser.parse_args(argv)
    if args.threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()
    import jax
    import jax.numpy as jnp

    import neurojax as nj

    from .stdp_overhead import with_stdp

    def best(fn, x):
        jax.block_until_ready(fn(x))
        out = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x))
            out.append(time.perf_counter() - t0)
        return min(out)

    for stdp in {"both": (False, True), "off": (False,), "on": (True,)}[args.stdp]:
        net, single = nj.models.coba(jax.random.key(0))
        _, batched = nj.models.coba(jax.random.key(0), batch=(args.batch,))
        if stdp:
            rule = nj.STDP(a_plus=0.006, a_minus=0.0063, w_max=1.0, mode="additive")
            net, single = with_stdp(net, single, rule)
            _, batched = with_stdp(nj.models.coba(jax.random.key(0))[0], batched, rule)
        if hasattr(net, "with_capacity"):
            net = net.with_capacity(args.capacity)
        # vmap maps every leaf over its first axis: the step counter (and any other scalar)
        # is given one copy per trial.
        stacked = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (args.batch, *x.shape)) if x.ndim == 0 else x, batched
        )

        def run(state, net=net):
            final, rec = nj.simulate(net, state, dt=0.1, n_steps=args.steps, record_every=10)
            return final.step, rec.spikes

        one = jax.jit(run).lower(single).compile()
        many = jax.jit(jax.vmap(run)).lower(stacked).compile()
        t_one = best(one, single)
        t_many = best(many, stacked)
        rates = {
            k: float(v.sum() / (args.batch * v.shape[-1] * args.steps * 1e-4))
            for k, v in many(stacked)[1].items()
        }
        print(
            json.dumps(
                {
                    "bench": "vmap_cost",
                    "stdp": stdp,
                    "steps": args.steps,
                    "batch": args.batch,
                    "spike_capacity": getattr(net, "spike_capacity", None),
                    "kernel_mode": nj.kernels.mode(),
                    "threads": args.threads,
                    "single_s": t_one,
                    "vmap_s": t_many,
                    "vmap_per_trial_over_single": t_many / args.batch / t_one,
                    "rates_hz": rates,
                    "cpu": platform.processor() or platform.machine(),
                    "jax": jax.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
