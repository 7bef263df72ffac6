"""`neurojax run assembly`: projection of a stimulus into an area of the assembly calculus."""

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["assembly_model"]

_DESCRIPTION = """\
Assembly calculus: projection of a stimulus into a brain area (Papadimitriou et al. 2020).

A stimulus of k neurons fires into area A (n neurons, cap k, connection probability p,
plasticity beta); then, for --steps - 1 more rounds, the stimulus and A's own assembly fire
into A together. The area is simulated in sparse mode (only neurons that ever fired are
represented; the others compete through the binomial tail of their inputs, as in the
reference code dmitropolsky/assemblies). Printed per step: neurons firing for the first time,
the overlap of the winners with the previous step's, and the support (neurons ever fired).
With beta = 0.05 the new winners fall to 0 within 15-20 steps, the overlap reaches k and the
support settles near 4k. --batch B runs B independent brains (seeds seed..seed+B-1, one vmap)
and prints their mean. --duration and --dt have no meaning here and are ignored.

--plot FILE saves the three series against the step.
"""


def _unit_float(text: str) -> float:
    from ._cli_common import finite_float

    x = finite_float(text)
    if not 0.0 < x < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}")
    return x


def _beta(text: str) -> float:
    from ._cli_common import finite_float

    x = finite_float(text)
    if not x > -1.0:
        raise argparse.ArgumentTypeError(f"must be a finite number > -1, got {text!r}")
    return x


def _arguments(p: argparse.ArgumentParser) -> None:
    from ._cli_common import positive_int

    g = p.add_argument_group("assembly options")
    g.add_argument(
        "--n", type=positive_int, default=100_000, help="neurons in the area (default 100000)"
    )
    g.add_argument(
        "--k", type=positive_int, default=317, help="cap: neurons firing per step (default 317)"
    )
    g.add_argument(
        "--p", type=_unit_float, default=0.01, help="connection probability (default 0.01)"
    )
    g.add_argument("--beta", type=_beta, default=0.05, help="plasticity, > -1 (default 0.05)")
    g.add_argument("--steps", type=positive_int, default=100, help="projection steps (default 100)")
    g.add_argument(
        "--capacity",
        type=positive_int,
        default=None,
        help="room for this many fired neurons in the area (default: about twice the support "
        "expected after 100 steps at this beta, 8k at beta >= 0.05, see nj.assembly.Brain); the "
        "run stops with an error naming the capacity to pass if the support outgrows it",
    )


def _brain(args: argparse.Namespace):
    import neurojax as nj

    return nj.assembly.Brain(
        areas={"A": (args.n, args.k)},
        stimuli={"s": args.k},
        p=args.p,
        beta=args.beta,
        capacity=args.capacity,
        key=jax.random.key(args.seed),
    )


def _validate(args: argparse.Namespace) -> str | None:
    if args.k > args.n:
        return f"argument --k: must be <= --n, got --k {args.k} and --n {args.n}"
    try:
        _brain(args)
    except ValueError as e:
        return f"arguments --n/--k/--capacity: {e}"
    return None


def _projection(brain, steps: int) -> Callable[[Any], tuple[Any, ...]]:
    """The run of `neurojax run assembly` for one brain state: a stimulus step, then
    `steps - 1` rounds of stimulus and recurrence. Returns, per step, the first-time winners,
    the overlap with the previous step (0 at the first), the support and the winners."""

    def run(state):
        state = brain.project(state, stimuli={"s": ["A"]})
        first = (state.new_winners["A"], state.support["A"], state.winners["A"])
        if steps == 1:
            zero = jax.numpy.zeros((1,), "int32")
            return first[0][None], zero, first[1][None], first[2][None]
        state, trace = brain.project_rounds(
            state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, steps=steps - 1
        )
        cat = jax.numpy.concatenate
        return (
            cat([first[0][None], trace.new_winners["A"]]),
            cat([jax.numpy.zeros((1,), "int32"), trace.overlap["A"]]),
            cat([first[1][None], trace.support["A"]]),
            cat([first[2][None], trace.winners["A"]]),
        )

    return run


def _run(args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    brain = _brain(args)
    steps = args.steps
    projection = _projection(brain, steps)

    def run(state):
        return projection(state)[:3]

    keys = jax.numpy.stack([jax.random.key(args.seed + i) for i in range(args.batch)])
    t0 = time.perf_counter()
    states = jax.block_until_ready(jax.jit(jax.vmap(brain.init_state))(keys))
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(run)).lower(states).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    new, overlap, support = (np.asarray(x) for x in jax.block_until_ready(compiled(states)))
    run_s = time.perf_counter() - t0
    new_m, ov_m, sup_m = new.mean(0), overlap.mean(0), support.mean(0)
    last = np.nonzero(new_m > 0)[0]
    return {
        "model": "assembly",
        "n": args.n,
        "k": args.k,
        "p": args.p,
        "beta": args.beta,
        "steps": steps,
        "batch": args.batch,
        "capacity": brain.capacities[0],
        "new_winners": new_m.tolist(),
        "overlap": ov_m.tolist(),
        "support": sup_m.tolist(),
        "final_support": float(sup_m[-1]),
        "converged_at_step": int(last[-1]) + 2 if last.size and last[-1] + 1 < steps else None,
        "init_s": init_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "steps_per_s": steps * args.batch / run_s,
        "device": str(jax.devices()[0].platform),
    }


def _report(result: dict[str, Any]) -> None:
    from ._cli_common import print_rows

    print(f"{'step':>5}  {'new':>8}  {'overlap':>8}  {'support':>9}")
    series = list(zip(result["new_winners"], result["overlap"], result["support"]))
    conv = result["converged_at_step"]
    # Rows up to the step from which no neuron joins the support; the rest, where nothing
    # changes but the overlap, in one line (every row is in --json).
    shown = len(series) if conv is None else min(len(series), conv)
    for i, (nw, ov, sup) in enumerate(series[:shown], start=1):
        print(f"{i:>5}  {nw:>8.4g}  {ov:>8.4g}  {sup:>9.6g}")
    if shown < len(series):
        rest = series[shown:]
        overlaps = [ov for _, ov, _ in rest]
        print(
            f"{shown + 1:>5}-{len(series)}: no new winners; overlap {min(overlaps):.4g} to "
            f"{max(overlaps):.4g}, support {rest[-1][2]:.6g} (all rows with --json)"
        )
    rows = [
        ("area", f"n={result['n']}, k={result['k']}, p={result['p']}, beta={result['beta']}"),
        ("brains", f"{result['batch']}"),
        (
            "final support",
            f"{result['final_support']:.6g} ({result['final_support'] / result['k']:.2f} k)",
        ),
        ("no new winners from step", "not within the run" if conv is None else f"{conv}"),
        ("synapses drawn in", f"{result['init_s']:.2f} s"),
        ("compile time", f"{result['compile_s']:.2f} s"),
        ("run time", f"{result['run_s']:.3f} s"),
        ("steps/s", f"{result['steps_per_s']:.4g}"),
    ]
    print()
    print_rows(rows, result)


def _plot(result: dict[str, Any], path: str) -> None:
    from matplotlib.figure import Figure

    steps = np.arange(1, result["steps"] + 1)
    fig = Figure(figsize=(9, 3.2), layout="constrained")
    axes = fig.subplots(1, 3)
    k = result["k"]
    for ax, key, label in zip(
        axes,
        ("new_winners", "overlap", "support"),
        ("first-time winners", "overlap with previous step", "support (ever fired)"),
    ):
        ax.plot(steps, result[key], lw=1.2)
        ax.set_xlabel("step")
        ax.set_title(label, fontsize=10)
    axes[1].axhline(k, color="0.6", lw=0.8, ls="--", label=f"k = {k} (the same winners)")
    axes[2].axhline(4 * k, color="0.6", lw=0.8, ls="--", label=f"4 k = {4 * k}")
    axes[1].legend(loc="lower right", fontsize=8)
    axes[2].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"projection, n={result['n']}, k={k}, p={result['p']}, beta={result['beta']}")
    fig.savefig(path)


def assembly_model(run_model: Callable[..., Any]) -> dict[str, Any]:
    """The `RunModel` entry of the assembly projection (`run_model` is the dataclass)."""
    return {
        "assembly": run_model(
            name="assembly",
            help="Assembly calculus: projection of a stimulus into an area",
            description=_DESCRIPTION,
            duration_ms=1.0,
            dt_ms=1.0,
            batch=1,
            add_arguments=_arguments,
            validate=_validate,
            run=_run,
            report=_report,
            plot=_plot,
        )
    }
