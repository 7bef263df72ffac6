"""The check `nj.simulate` runs where a run starts: what is edited is checked as what is built.

A model reaches `simulate` built by its constructors, edited (`eqx.tree_at`, an optimiser
step, a sweep) or rebuilt by `nj.load`; only the first passed through the constructors'
checks. `check_run` runs the checks each class declares (`__check_init__` along its
hierarchy, `check_invariants` of layouts and networks: parameter ranges, layout invariants,
delays inside the ring, shared synapses equal), compares the state with the one the model
expects (`expected_state`) and refuses a NaN in the state. Values traced by the caller's
transformation cannot be read: their checks become one `equinox.branched_error_if` on the
state, which names the field when the run executes.

Cheap where it matters: the classes' checks are cached by the model's structure and the
identity of its leaves (a loop that calls `simulate` again on the same model pays a lookup;
an edited leaf is a new array and is checked again), the state comparison by the structures,
shapes and dtypes of both (it traces `init_state`); the NaN check is one reduction per state
field.
"""

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._validation import check_module, eager, leaf_text, modules

__all__ = ["check_run", "check_step", "checked_run"]

# structure of the model -> [(weak references to its leaves, problem or None)]: a few recent
# entries per structure.
_CACHE: dict[Any, list[tuple[tuple[Any, ...], str | None]]] = {}
_PER_STRUCTURE = 4
_MAX_STRUCTURES = 256


def check_run(model: Any, state: Any, *, owner: str = "simulate") -> Any:
    """Check `model` and `state` before a run; return `state` (with the flags of traced
    values attached when there are any).

    Raises `TypeError` (a state of another model's type) or `ValueError` (a field of another
    shape or dtype than `model.expected_state` gives, a parameter out of its range, a layout
    or a delay that would make a delivery read outside its arrays or at another step, shared
    synapses that differ, a NaN in the state), naming `owner`, the class and the field.
    """
    if state is None and callable(getattr(model, "init_state", None)):
        raise TypeError(
            f"{owner}: state is None; pass the initial state, made with "
            f"{type(model).__name__}.init_state(...)"
        )
    flags = _model_flags(owner, model)
    _raise(owner, _prefixed(owner, _cached_state_problem(model, state)))
    _raise(owner, _prefixed(owner, _nan_problem(state)))
    return _attach(state, flags)


# True while `simulate` runs a model it has checked with `check_run`: the steps it traces
# then skip `check_step` (the run's start already holds the checks).
_CHECKED_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "neurojax_checked_run", default=False
)


@contextlib.contextmanager
def checked_run() -> Iterator[None]:
    """Within this block, `check_step` trusts the model: the caller (`simulate`) checked it
    with `check_run` where its run started."""
    token = _CHECKED_RUN.set(True)
    try:
        yield
    finally:
        _CHECKED_RUN.reset(token)


def check_step(model: Any, state: Any, *, owner: str = "Network.step") -> Any:
    """The model's part of `check_run` for a step called outside `simulate` (a loop a user
    writes over `Network.step`, plain, under `jit` or `lax.scan`); return `state`.

    Concrete values are checked once per model (the same cache as `check_run`: a loop that
    steps the same network pays a lookup per call, and nothing once traced). Traced values
    (a network passed into the caller's `jit` as an argument) become one
    `equinox.branched_error_if` on the state, so that an index outside its layout, a delay
    outside the ring or a parameter out of range stops the run with a message naming the
    field, on every path, as the compiled CPU kernels refuse them; the reductions depend on
    the network only, not on the step, so XLA computes them once before a loop of steps
    (loop-invariant code motion), leaving one predicate per step.
    """
    if _CHECKED_RUN.get():
        return state
    return _attach(state, _model_flags(owner, model))


def _attach(state: Any, flags: list[tuple[Any, str]]) -> Any:
    """`state`, with the flags of traced values (`(bad, message)`) checked on its array
    leaves when the run executes."""
    if not flags:
        return state
    bad = jnp.stack([jnp.asarray(b, bool).reshape(()) for b, _ in flags])
    # On every array leaf of the state (its PRNG keys cannot pass through the check): the
    # check runs whichever part of the run's result the caller keeps.
    dynamic, static = eqx.partition(state, _checkable)
    if not jtu.tree_leaves(dynamic):
        return state
    dynamic = eqx.branched_error_if(
        dynamic, jnp.any(bad), jnp.argmax(bad).astype(jnp.int32), [m for _, m in flags]
    )
    return eqx.combine(dynamic, static)


def _prefixed(owner: str, problem: str | None) -> str | None:
    if problem is not None and not problem.startswith(owner + ":"):
        return f"{owner}: {problem}"
    return problem


def _model_flags(owner: str, model: Any) -> list[tuple[Any, str]]:
    """Run the classes' checks over every module of `model`: raise for concrete values,
    return the flags of traced ones. Cached by the model's structure and the identity of
    its leaves (only when every leaf is concrete and nothing is flagged)."""
    if getattr(type(model), "modules_checked_at_build", False):
        # Its modules are per-device layouts of a network checked when it was built (a
        # sharded network): the constructors' checks do not apply to their stacked shapes.
        return []
    leaves = jtu.tree_leaves(model)
    concrete = not any(isinstance(x, jax.core.Tracer) for x in leaves)
    key = _structure(model) if concrete else None
    if key is not None:
        hit = _lookup(key, leaves)
        if hit is not None:
            _raise(owner, hit[0])
            return []
    flags: list[tuple[Any, str]] = []
    problem = None
    try:
        for module in modules(model):
            flags.extend(check_module(owner, module, thorough=False))
    except ValueError as err:
        problem = _prefixed(owner, str(err))
    if key is not None and not flags:
        _store(key, leaves, problem)
    _raise(owner, problem)
    return flags


# (abstract model, abstract state) -> problem or None: comparing a state with the one the
# model expects traces `init_state`, which costs milliseconds to seconds (a large network's
# memory plan), and depends only on structures, shapes and dtypes.
_STATE_CACHE: dict[Any, str | None] = {}


def _cached_state_problem(model: Any, state: Any) -> str | None:
    """`_state_problem`, cached; only its answers are kept (a `ValueError` is the answer
    "this state is wrong"; any other exception propagates and nothing is cached)."""
    key = (_abstract(model), _abstract(state))
    if key[0] is None or key[1] is None:
        key = None
    if key is not None and key in _STATE_CACHE:
        return _STATE_CACHE[key]
    try:
        problem = _state_problem(model, state)
    except ValueError as err:
        problem = str(err)
    if key is not None:
        if len(_STATE_CACHE) >= _MAX_STRUCTURES:
            _STATE_CACHE.pop(next(iter(_STATE_CACHE)))
        _STATE_CACHE[key] = problem
    return problem


def _abstract(tree: Any) -> Any:
    """A hashable description of a PyTree's structure, shapes and dtypes (None if one of
    its leaves cannot be hashed)."""
    leaves, treedef = jtu.tree_flatten(tree)
    sig = []
    for x in leaves:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            sig.append((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))))
        elif isinstance(x, (bool, int, float, complex)):
            sig.append((type(x).__name__,))
        else:
            try:
                hash(x)
            except TypeError:
                return None
            sig.append(("object", x))
    try:
        hash(treedef)
    except TypeError:
        return None
    return treedef, tuple(sig)


def _checkable(x: Any) -> bool:
    return eqx.is_array(x) and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _raise(owner: str, problem: str | None) -> None:
    if problem is not None:
        kind = TypeError if problem.startswith(f"{owner}: state is a") else ValueError
        raise kind(problem)


def _structure(model: Any) -> Any:
    try:
        key = jtu.tree_structure(model)
        hash(key)
    except TypeError:  # a static field that cannot be hashed: no caching
        return None
    return key


def _lookup(key: Any, leaves: list[Any]) -> tuple[str | None] | None:
    for refs, problem in _CACHE.get(key, ()):
        if len(refs) == len(leaves) and all(_same(r, x) for r, x in zip(refs, leaves, strict=True)):
            return (problem,)
    return None


def _store(key: Any, leaves: list[Any], problem: str | None) -> None:
    try:
        refs = tuple(_ref(x) for x in leaves)
    except TypeError:  # a leaf that cannot be weakly referenced: no caching
        return
    if key not in _CACHE and len(_CACHE) >= _MAX_STRUCTURES:
        _CACHE.pop(next(iter(_CACHE)))
    entries = _CACHE.setdefault(key, [])
    entries.insert(0, (refs, problem))
    del entries[_PER_STRUCTURE:]


class _Value:
    """A Python scalar leaf, compared by type and value (it cannot be weakly referenced,
    and equal scalars are interchangeable)."""

    def __init__(self, value: Any):
        self.value = value


def _ref(x: Any) -> Any:
    if isinstance(x, (bool, int, float, complex, str)):
        return _Value(x)
    return weakref.ref(x)


def _same(ref: Any, x: Any) -> bool:
    if isinstance(ref, _Value):
        return type(ref.value) is type(x) and ref.value == x
    return ref() is x


def _state_problem(model: Any, state: Any) -> str | None:
    """What differs between `state` and the state `model` expects (None when nothing
    does, or when the model does not say what it expects)."""
    answer = getattr(model, "expected_state", None)
    if not callable(answer):
        return None
    expected = answer(state)
    if expected is None:
        return None
    name = type(model).__name__
    if type(state) is not type(expected):
        return (
            f"state is a {type(state).__name__}, but {name}.init_state makes a "
            f"{type(expected).__name__}: a state of another model; make it with "
            f"{name}.init_state"
        )
    if jtu.tree_structure(state) != jtu.tree_structure(expected):
        return None  # an older layout of the same state type: the step decides
    for (path, want), got in zip(jtu.tree_leaves_with_path(expected), jtu.tree_leaves(state)):
        g_shape, g_dtype = tuple(np.shape(got)), getattr(got, "dtype", None)
        if g_dtype is None:
            continue
        if g_shape != tuple(want.shape) or g_dtype != want.dtype:
            return (
                f"state field {leaf_text(path)} is {g_dtype}{list(g_shape)}, but "
                f"{name}.init_state makes {want.dtype}{list(want.shape)} for this model and "
                "number of neurons: the state was made for another model, size or precision; "
                f"make it with {name}.init_state (with jax_enable_x64 as the model was built)"
            )
    return None


def _on_cpu(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


def _local(x: jax.Array) -> Any:
    """`x`, or the concatenation of its shards on this process when it spans processes."""
    if getattr(x, "is_fully_addressable", True):
        return x
    return np.concatenate([np.asarray(s.data).reshape(-1) for s in x.addressable_shards])


def _nan_problem(state: Any) -> str | None:
    """A NaN in a concrete float field of the state (an edited initial `v`, `u`, ...): the
    run would carry it to the end. One pass over each field."""
    named = [
        (leaf_text(p), x)
        for p, x in jtu.tree_leaves_with_path(state)
        if isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and jnp.issubdtype(x.dtype, jnp.floating)
        and x.size
    ]
    # A state spread over processes (jax.distributed): each process reads the shards it
    # holds, so a NaN in any of them is refused in the process that holds it.
    named = [(n, _local(x)) for n, x in named]
    if not named:
        return None
    on_host = [x for _, x in named if isinstance(x, np.ndarray) or _on_cpu(x)]
    if len(on_host) < len(named) and eager():
        # arrays on an accelerator: one reduction each there, one transfer of the counts
        counts = jax.device_get(jnp.stack([jnp.sum(jnp.isnan(x)) for _, x in named]))
    else:
        # on the CPU (or closed over by the caller's jit): read in place with NumPy, which
        # compiles nothing and stages nothing
        counts = [int(np.isnan(np.asarray(x)).sum()) for _, x in named]
    for (name, x), c in zip(named, counts, strict=True):
        if c:
            first = np.unravel_index(int(np.argmax(np.isnan(np.asarray(x)).reshape(-1))), x.shape)
            return (
                f"the initial state field {name} holds {int(c)} NaN value(s), the first at "
                f"index {tuple(int(i) for i in first)}; a state must hold numbers (make it "
                "with init_state, or check the values you set)"
            )
    return None
