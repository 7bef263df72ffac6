"""Benchmark: assembly-calculus projection, neurojax against the NumPy peer, in one run.

Configurations (one JSON line each):

- `projection`: n = 10^5, k = 317, p = 0.01, beta = 0.05, sparse mode; one stimulus step then
  99 rounds of stimulus + recurrence (100 steps), neurojax (`Brain.project` +
  `Brain.project_rounds`, compiled ahead of time) and the NumPy peer
  (`benchmarks.peers.assembly_numpy.run_projection`, the same algorithm vectorised with NumPy),
  timed on the same core. Reports ms per step for both and the ratio (target: neurojax >= 10x
  faster per step), and the final supports; also ms per step of 100 more rounds on the
  converged brain with and without plasticity (their difference: the Hebbian update).
- `sparse_1e6`, `sparse_1e7`: n = 10^6 and 10^7, k = 1000, p = 0.001, 100 steps: steps per
  second and the bytes of the brain state (synapses over the support capacity).
- `batch`: 64 brains (seeds) of the `projection` configuration under `jax.vmap`, one call:
  time per trial.

State kept or donated: a jitted call that keeps its input state must write its result into new
buffers, so every call of `projection` first copies the brain state (25 MB of synapses at
n = 10^5: the support capacity squared) before its 100 steps. A script that no longer needs the
input state donates it (`jax.jit(..., donate_argnums=0)`): the steps then update its buffers
in place, as the NumPy peer updates its arrays. `projection` reports both: `ms_per_step` with
the state kept and `ms_per_step_donated` with the state donated (each timed call gets a fresh
copy of the initial state, made outside the timing). Neither includes `init_state` (drawing
the synapses of the whole capacity once); the NumPy peer's time includes growing its arrays.

Interleaved pairs: the neurojax and NumPy timings of `projection` are taken one after the other,
so a change in the load of a shared machine between them moves their ratio. With the peers,
`--pairs` (default 11) more runs alternate neurojax (state donated, then kept) and NumPy
projections, and a record with `"measure": "interleaved"` carries the medians over the pairs of
the per-pair ratios.

Run: `python -m benchmarks.assembly [--quick] [--no-peers] [--repeats R] [--threads 1|2]
[--pairs P]`. `--quick` uses n = 10^4 / 10^5 and a batch of 4 (a smoke test).
"""

import resource
import sys
import time

from . import _harness

STEPS = 100


def _state_bytes(state) -> int:
    import jax

    return int(sum(x.nbytes for x in jax.tree_util.tree_leaves(state) if hasattr(x, "nbytes")))


def _neurojax_run(n, k, p, beta, steps, seed):
    import jax

    import neurojax as nj

    brain = nj.assembly.Brain(
        areas={"A": (n, k)}, stimuli={"s": k}, p=p, beta=beta, key=jax.random.key(seed)
    )

    def run(state):
        state = brain.project(state, stimuli={"s": ["A"]})
        state, trace = brain.project_rounds(
            state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=steps - 1
        )
        return trace.support["A"], trace.new_winners["A"], state.winners["A"]

    return brain, run


def _donated_run(brain, steps):
    """The projection of `_neurojax_run` as a call that donates its state: it returns the
    final state, so that the state's buffers can hold it."""

    def run(state):
        state = brain.project(state, stimuli={"s": ["A"]})
        state, trace = brain.project_rounds(
            state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=steps - 1
        )
        return trace.support["A"], state

    return run


def _fresh(state):
    """A copy of `state` in new buffers (for a call that donates it)."""
    import jax

    return jax.block_until_ready(jax.tree_util.tree_map(lambda x: x.copy(), state))


def _time_donated(compiled, state, repeats, budget_s):
    """Median and all times of `compiled` on fresh copies of `state` (copies not timed)."""
    import jax
    import numpy as np

    jax.block_until_ready(compiled(_fresh(state)))
    times = []
    for _ in range(repeats):
        arg = _fresh(state)
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(arg))
        times.append(time.perf_counter() - t0)
        del arg, out
        if sum(times) > budget_s:
            break
    return float(np.median(times)), times


def _extra(parser) -> None:
    parser.add_argument(
        "--pairs", type=int, default=None, help="interleaved neurojax/NumPy pairs (11; quick: 3)"
    )


def _projection(args, n, k, p, beta, name):
    import jax
    import numpy as np

    brain, run = _neurojax_run(n, k, p, beta, STEPS, 0)
    state = jax.block_until_ready(brain.init_state())
    timing, out, compiled = _harness.time_jax(
        run, [state], repeats=args.repeats, budget_s=args.budget
    )
    support, new, _ = (np.asarray(x) for x in out)
    record = {
        "bench": "assembly",
        "config": name,
        "impl": "neurojax",
        "n": n,
        "k": k,
        "p": p,
        "beta": beta,
        "steps": STEPS,
        "ms_per_step": timing.run_s / STEPS * 1e3,
        "steps_per_s": STEPS / timing.run_s,
        "final_support": int(support[-1]),
        "last_new_winner_step": int(np.max(np.nonzero(new)[0], initial=-1)) + 2,
        "state_mb": _state_bytes(state) / 2**20,
        "capacity": brain.capacities[0],
        **timing.as_dict(),
    }
    donated = jax.jit(_donated_run(brain, STEPS), donate_argnums=0).lower(state).compile()
    run_s, times = _time_donated(donated, state, args.repeats, args.budget)
    record["ms_per_step_donated"] = run_s / STEPS * 1e3
    record["times_donated_s"] = times
    return record, (compiled, donated, state)


def _converged_step_cost(args, n, k, p, beta) -> dict:
    """ms per step of 100 further rounds on a converged brain, with and without plasticity:
    the difference is the cost of the Hebbian update."""
    import jax

    brain, _ = _neurojax_run(n, k, p, beta, STEPS, 0)
    state = brain.project(brain.init_state(), stimuli={"s": ["A"]})
    state, _ = brain.project_rounds(state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=STEPS)
    out = {}
    for plastic in (True, False):

        def rounds(s, plastic=plastic):
            s, _ = brain.project_rounds(
                s, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=STEPS, plasticity=plastic
            )
            return s.winners["A"]

        timing, _, _ = _harness.time_jax(
            rounds, [jax.block_until_ready(state)], repeats=args.repeats, budget_s=args.budget
        )
        out["converged_ms_per_step_" + ("plastic" if plastic else "static")] = (
            timing.run_s / STEPS * 1e3
        )
    return out


def main(argv=None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=[1], quick_sizes=[1], argv=argv, extra=_extra
    )
    import jax
    import numpy as np

    from .peers import assembly_numpy

    n_proj = 10_000 if args.quick else 100_000
    k_proj = 100 if args.quick else 317
    rec, (compiled, donated, state) = _projection(args, n_proj, k_proj, 0.01, 0.05, "projection")
    rec.update(_converged_step_cost(args, n_proj, k_proj, 0.01, 0.05))
    if args.peers:
        _harness.log("NumPy peer")
        timing, out = _harness.time_call(
            lambda: assembly_numpy.run_projection(n_proj, k_proj, 0.01, 0.05, STEPS, 0),
            repeats=args.repeats,
            budget_s=args.budget,
        )
        rec["numpy_ms_per_step"] = timing.run_s / STEPS * 1e3
        rec["numpy_final_support"] = int(out["support"][-1])
        rec["speedup_vs_numpy"] = timing.run_s / (rec["ms_per_step"] * STEPS * 1e-3)
        rec["speedup_vs_numpy_donated"] = timing.run_s / (rec["ms_per_step_donated"] * STEPS * 1e-3)
        rec["target_speedup"] = 10.0
        rec["target_met"] = rec["speedup_vs_numpy"] >= 10.0
        rec["target_met_donated"] = rec["speedup_vs_numpy_donated"] >= 10.0
    _harness.emit(rec)
    n_pairs = args.pairs if args.pairs is not None else (3 if args.quick else 11)
    if args.peers and n_pairs > 0:
        _harness.log(f"projection: {n_pairs} interleaved neurojax/NumPy pairs")
        times: dict[str, list[float]] = {"neurojax": [], "donated": [], "numpy": []}
        for _ in range(n_pairs):
            arg = _fresh(state)
            t0 = time.perf_counter()
            jax.block_until_ready(donated(arg))
            times["donated"].append(time.perf_counter() - t0)
            del arg
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(state))
            times["neurojax"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assembly_numpy.run_projection(n_proj, k_proj, 0.01, 0.05, STEPS, 0)
            times["numpy"].append(time.perf_counter() - t0)
        nj_t, np_t = np.asarray(times["neurojax"]), np.asarray(times["numpy"])
        do_t = np.asarray(times["donated"])
        _harness.emit(
            {
                "bench": "assembly",
                "config": "projection",
                "impl": "neurojax",
                "measure": "interleaved",
                "n": n_proj,
                "k": k_proj,
                "steps": STEPS,
                "pairs": n_pairs,
                "neurojax_times_s": times["neurojax"],
                "donated_times_s": times["donated"],
                "numpy_times_s": times["numpy"],
                "ms_per_step": float(np.median(nj_t)) / STEPS * 1e3,
                "ms_per_step_donated": float(np.median(do_t)) / STEPS * 1e3,
                "numpy_ms_per_step": float(np.median(np_t)) / STEPS * 1e3,
                "speedup_vs_numpy_paired": float(np.median(np_t / nj_t)),
                "speedup_vs_numpy_paired_donated": float(np.median(np_t / do_t)),
                "target_speedup": 10.0,
                "target_met": float(np.median(np_t / nj_t)) >= 10.0,
                "target_met_donated": float(np.median(np_t / do_t)) >= 10.0,
            }
        )

    sizes = [100_000] if args.quick else [1_000_000, 10_000_000]
    for n in sizes:
        _harness.log(f"sparse n={n}")
        rec, _ = _projection(args, n, 1000, 0.001, 0.05, f"sparse_{n:.0e}".replace("+0", ""))
        rec["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        _harness.emit(rec)

    batch = 4 if args.quick else 64
    _harness.log(f"batch of {batch}")
    brain, run = _neurojax_run(n_proj, k_proj, 0.01, 0.05, STEPS, 0)
    keys = jax.random.split(jax.random.key(1), batch)
    states = jax.block_until_ready(jax.vmap(brain.init_state)(keys))
    timing, out, _ = _harness.time_jax(
        jax.vmap(run), [states], repeats=min(args.repeats, 3), budget_s=args.budget
    )
    support = np.asarray(out[0])[:, -1]
    _harness.emit(
        {
            "bench": "assembly",
            "config": "batch",
            "impl": "neurojax",
            "n": n_proj,
            "k": k_proj,
            "batch": batch,
            "steps": STEPS,
            "s_per_trial": timing.run_s / batch,
            "ms_per_trial_step": timing.run_s / batch / STEPS * 1e3,
            "final_support_mean": float(support.mean()),
            "final_support_sd": float(support.std()),
            "state_mb": _state_bytes(states) / 2**20,
            **timing.as_dict(),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
