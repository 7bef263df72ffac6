"""What the check at the start of `nj.simulate` costs (issue 42): the classes' checks of an
edited or loaded network (`neurojax/network/_checks.py`), cold and cached.

For COBA (320 k synapses) and the microcircuit at scale 0.1 (30 M synapses), one JSON line
each: `cold_s` (both caches empty: the classes' checks over every synapse and the state
compared with the one `init_state` makes), `model_s` (the classes' checks alone, the state
comparison cached: a network edited between runs), `cached_s` (the same network and state
again: what a loop over `simulate` pays), medians of `--repeats`.

    python -m benchmarks.start_check [--repeats 5]
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


if __name__ == "__main__":
    main()
