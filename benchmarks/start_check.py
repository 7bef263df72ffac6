"""What the check at the start of `nj.simulate` costs (issue 42): the classes' checks of an
edited or loaded network (`neurojax/network/_checks.py`), cold and cached.

For COBA (320 k synapses) and the microcircuit at scale 0.1 (30 M synapses), one JSON line
each: `cold_s` (both caches empty: the classes' checks over every synapse and the state
compared with the one `init_state` makes), `model_s` (the classes' checks alone, the state
comparison cached: a network edited between runs), `cached_s` (the same network and state
again: what a loop over `simulate` pays), medians of `--repeats`.

Then a loop of one's own over `Network.step` (COBA, 2 000 steps in a `lax.fori_loop`, the
network passed into `equinox.filter_jit` as an argument, so that the step's check is traced:
`Network.step` -> `_checks.check_step`), with the check and with it switched off
(`checked_run`), interleaved, in CPU seconds, on the kernel path and the pure-JAX path: one
JSON line each with `checked_cpu_s`, `unchecked_cpu_s` and their ratio.

    python -m benchmarks.start_check [--repeats 5] [--loop-steps 2000]
"""

import argparse
import json
import statistics
import time


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-steps", type=int, default=2000)
    args = parser.parse_args(argv)

    import jax

    import neurojax as nj
    from neurojax.network import _checks

    builds = {
        "coba": lambda: nj.models.coba(jax.random.key(0)),
        "microcircuit_0.1": lambda: nj.models.microcircuit(jax.random.key(0), scale=0.1),
    }
    for name, build in builds.items():
        net, state = build()
        jax.block_until_ready(state)

        def cold(net=net, state=state):
            _checks._CACHE.clear()
            _checks._STATE_CACHE.clear()
            _checks.check_run(net, state)

        def model_only(net=net, state=state):
            _checks._CACHE.clear()
            _checks.check_run(net, state)

        cold()  # the eager reductions' programs compile once per shape
        row = {
            "benchmark": "start_check",
            "network": name,
            "synapses": int(net.n_synapses),
            "cold_s": _median(cold, args.repeats),
            "model_s": _median(model_only, args.repeats),
            "cached_s": _median(lambda n=net, s=state: _checks.check_run(n, s), 4 * args.repeats),
        }
        print(json.dumps(row), flush=True)
    _step_loop(args)


def _step_loop(args) -> None:
    """The traced step check's cost in a loop of one's own (module docstring)."""
    import contextlib

    import equinox as eqx
    import jax

    import neurojax as nj
    from neurojax.network import _checks

    net, state = nj.models.coba(jax.random.key(0))

    def loop(m, s):
        return jax.lax.fori_loop(0, args.loop_steps, lambda _, x: m.step(x, None, 0.1)[0], s)

    def loop_unchecked(m, s):
        with _checks.checked_run():
            return loop(m, s)

    runs = {"checked": eqx.filter_jit(loop), "unchecked": eqx.filter_jit(loop_unchecked)}
    for path in ("kernel", "reference"):
        ctx = nj.kernels.use("reference") if path == "reference" else contextlib.nullcontext()
        with ctx:
            for f in runs.values():
                jax.block_until_ready(f(net, state))  # compile
            cpu: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.repeats):
                for name, f in runs.items():
                    c0 = time.process_time()
                    jax.block_until_ready(f(net, state))
                    cpu[name].append(time.process_time() - c0)
        checked, unchecked = (statistics.median(cpu[k]) for k in ("checked", "unchecked"))
        row = {
            "benchmark": "step_check_loop",
            "network": "coba",
            "path": path,
            "steps": args.loop_steps,
            "checked_cpu_s": checked,
            "unchecked_cpu_s": unchecked,
            "ratio": checked / unchecked,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
