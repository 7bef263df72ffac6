"""Assembly operations built on `Brain.project`: projection to convergence, reciprocal
projection, association, merge and pattern completion, plus convergence measures.

Every operation is a pure function of `(brain, state, ...)` that returns the new state and
the `ProjectionTrace`(s) of its rounds, so it can be jitted and vmapped over a batch of
brains (`jax.vmap` over states made from different keys). The operations made of
`Brain.project_rounds` calls (`reciprocal_project`, `associate`, `merge`,
`pattern_complete`) are not jitted as a whole: each of their rounds is a compiled
`project_rounds`, which, called eagerly, grows a sparse area's capacity when the support
outgrows it (under a caller's `jit` they raise instead). The routings follow the
simulations of Papadimitriou et al. (2020) and of the reference code
(`dmitropolsky/assemblies`, `simulations.py`).
"""

from collections.abc import Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Int, PRNGKeyArray

from ._brain import Brain, BrainState, ProjectionTrace, _is_int, overlap

__all__ = [
    "project_until_stable",
    "reciprocal_project",
    "associate",
    "merge",
    "pattern_complete",
    "convergence_step",
]


def _check_steps(where: str, steps: object, low: int = 1) -> int:
    if not _is_int(steps) or steps < low:
        raise ValueError(f"{where}: steps must be an int >= {low}, got {steps!r}")
    return int(steps)


def convergence_step(new_winners: Int[Array, "... steps"]) -> Int[Array, "..."]:
    """The first step (1-based) from which no neuron fires for the first time any more.

    `new_winners` is a `ProjectionTrace.new_winners` series (time on the last axis, so a
    batch of traces works). Returns `steps + 1` when the last step still had new winners.
    """
    new_winners = jnp.asarray(new_winners)
    if new_winners.ndim < 1:
        raise ValueError(
            "convergence_step: new_winners must be a series (>= 1-d), got shape "
            f"{new_winners.shape}"
        )
    steps = new_winners.shape[-1]
    t = jnp.arange(1, steps + 1, dtype=jnp.int32)
    last = jnp.max(jnp.where(new_winners > 0, t, 0), axis=-1)
    return (last + 1).astype(jnp.int32)


@eqx.filter_jit
def project_until_stable(
    brain: Brain,
    state: BrainState,
    stimuli: Mapping[str, Sequence[str]] | None = None,
    areas: Mapping[str, Sequence[str]] | None = None,
    max_steps: int = 100,
    *,
    plasticity: bool = True,
) -> tuple[BrainState, Int[Array, ""]]:
    """Repeat a projection until no target changes its winners, at most `max_steps` times.

    Stops after the first step at which every target area keeps exactly its previous winners
    (hence no first-time winners either). Returns the state and the number of steps taken;
    `max_steps` taken means it did not converge. A `jax.lax.while_loop`: under `vmap` the
    batch runs until its slowest member has converged. Jitted as a whole, so the capacity
    of a sparse area cannot grow here: a step that exceeds it raises (build the Brain with a
    larger capacity, or grow the state first with `Brain.grow_capacity`).
    """
    max_steps = _check_steps("project_until_stable", max_steps)
    routes = brain._routes(stimuli, areas, "project_until_stable")
    targets = [t for t, _, _ in routes]

    def cond(carry):
        _, steps, stable = carry
        return (steps < max_steps) & ~stable

    def body(carry):
        s, steps, _ = carry
        # The unchecked step: its faults stay in the state and are checked once, after the
        # loop (a check per step would be a branch per step). A step that overflows or reads
        # an empty source stops the loop, whose result then raises.
        new = brain._run(s, routes, plasticity, None)
        stable = jnp.array(True)
        for t in targets:
            k = jnp.sum(new.winners[t] >= 0)
            stable = stable & (overlap(new.winners[t], s.winners[t]) == k)
        for a in brain.area_names:
            stable = stable | (new.faults[a] != 0) | (new.overflow[a] != 0)
        return new, steps + 1, stable

    state, steps, _ = jax.lax.while_loop(
        cond, body, (state, jnp.zeros((), jnp.int32), jnp.array(False))
    )
    return brain._error_if("project_until_stable", (state, steps), state)


def _two_phase(brain, state, first, then, steps, where):
    """One round with the routing `first` (the new area cannot fire yet), then `steps - 1`
    rounds of `then`; the traces of the two phases are concatenated on the time axis."""
    steps = _check_steps(where, steps)
    state, t1 = brain.project_rounds(state, *first, steps=1)
    if steps == 1:
        return state, t1
    state, t2 = brain.project_rounds(state, *then, steps=steps - 1)
    trace = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), t1, t2)
    return state, trace


def _distinct(where: str, **names: str) -> None:
    values = list(names.values())
    if len(set(values)) != len(values):
        raise ValueError(f"{where}: the areas must be distinct, got {names}")


def reciprocal_project(
    brain: Brain, state: BrainState, stimulus: str, a: str, b: str, steps: int = 20
) -> tuple[BrainState, ProjectionTrace]:
    """Reciprocal projection: `stimulus` drives `a`, `a` projects into `b` and `b` back into
    `a` (each area also recurrent), so that the two assemblies become linked both ways.

    Round 1: `stimulus -> a`, `a -> {a, b}`; then `stimulus -> a`, `a -> {a, b}`,
    `b -> {a, b}`. Expects an assembly in `a` (project the stimulus into it first).
    """
    _distinct("reciprocal_project", a=a, b=b)
    first = ({stimulus: [a]}, {a: [a, b]})
    then = ({stimulus: [a]}, {a: [a, b], b: [a, b]})
    return _two_phase(brain, state, first, then, steps, "reciprocal_project")


def associate(
    brain: Brain,
    state: BrainState,
    stimulus_a: str,
    a: str,
    stimulus_b: str,
    b: str,
    c: str,
    steps: int = 10,
) -> tuple[BrainState, ProjectionTrace]:
    """Association: the assemblies of `a` and `b` fire together into `c` (with their stimuli
    and recurrence), so that their projections in `c` come to overlap.

    Round 1: stimuli into their areas, `a -> {a, c}`, `b -> {b, c}`; then the same with
    `c -> c` as well (the association phase of the reference `associate` simulation).
    Expects assemblies in `a` and `b` (and usually their separate projections into `c`).
    """
    _distinct("associate", a=a, b=b, c=c)
    stims = {stimulus_a: [a], stimulus_b: [b]}
    first = (stims, {a: [a, c], b: [b, c]})
    then = (stims, {a: [a, c], b: [b, c], c: [c]})
    return _two_phase(brain, state, first, then, steps, "associate")


def merge(
    brain: Brain,
    state: BrainState,
    stimulus_a: str,
    a: str,
    stimulus_b: str,
    b: str,
    c: str,
    steps: int = 50,
) -> tuple[BrainState, ProjectionTrace]:
    """Merge: `a` and `b` fire into `c` together and `c` fires back into both, forming one
    assembly in `c` linked to both parents.

    Round 1: stimuli into their areas, `a -> {a, c}`, `b -> {b, c}`; then
    `c -> {c, a, b}` as well (the reference `merge_sim`). Expects assemblies in `a` and `b`.
    """
    _distinct("merge", a=a, b=b, c=c)
    stims = {stimulus_a: [a], stimulus_b: [b]}
    first = (stims, {a: [a, c], b: [b, c]})
    then = (stims, {a: [a, c], b: [b, c], c: [c, a, b]})
    return _two_phase(brain, state, first, then, steps, "merge")


def pattern_complete(
    brain: Brain,
    state: BrainState,
    area: str,
    fraction: float,
    steps: int = 5,
    *,
    key: PRNGKeyArray,
) -> tuple[BrainState, ProjectionTrace]:
    """Fire a random `fraction` of the current assembly of `area`, then let the area run on
    its own recurrence (`area -> area`, no stimulus) for `steps` rounds.

    `floor(k * fraction)` of the current winners are chosen uniformly without replacement
    (at least one). Recovery is `overlap(final winners, original winners)`.
    """
    i = brain._area(area, "pattern_complete")
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 < fraction <= 1
    ):
        raise ValueError(f"pattern_complete: fraction must be a number in (0, 1], got {fraction!r}")
    steps = _check_steps("pattern_complete", steps)
    k = brain.caps[i]
    size = max(1, int(k * fraction))
    winners = state.winners[area]
    # A random order of the current winners (invalid entries last), then its first `size`.
    score = jnp.where(winners >= 0, jr.uniform(key, winners.shape), 2.0)
    order = jnp.argsort(score)
    subset = winners[order[:size]]
    subset = eqx.error_if(
        subset,
        jnp.any(subset < 0),
        f"pattern_complete: area {area!r} fires fewer than {size} neurons; cannot fire "
        f"{fraction} of its assembly",
    )
    state = brain.set_winners(state, area, subset)
    return brain.project_rounds(state, areas={area: [area]}, steps=steps)
