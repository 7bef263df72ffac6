"""Checks that keep a run from giving a wrong answer silently (issue 28).

Each function raises a `ValueError`/`TypeError` naming its caller, the argument, the value and
what is allowed, before any work is done; they are called once at the boundary (a
constructor, `simulate`, `load`), never per step. See the docs page "Reliability".
"""

import os
import stat
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._validation import eager

__all__ = [
    "check_private_path",
    "check_conn_entries",
    "check_layout",
    "check_key",
    "STEP_LIMIT",
]

# The largest step index the int32 clocks (a network's `state.step`, the step index that
# `simulate` gives an inputs function) can hold.
STEP_LIMIT = 2**31 - 1


# ----------------------------------------------------------------------------- caches


def check_private_path(owner: str, path: Path, what: str) -> None:
    """Refuse a cache folder or file that another user could have written.

    As compilers' and package managers' caches do (ccache, pip): the path must be owned by
    this process's user and carry no group or other write permission; a folder must not be
    a symbolic link owned by someone else either. A library or compiled program found there
    is executed, so anything another user can replace is code that user runs as you.
    Raises `PermissionError`; no check where the platform has no user ids (Windows).
    """
    if not hasattr(os, "getuid"):
        return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    uid = os.getuid()
    if stat.S_ISLNK(info.st_mode):
        if info.st_uid != uid:
            raise PermissionError(
                f"{owner}: the {what} {str(path)!r} is a symbolic link owned by user id "
                f"{info.st_uid}, not by you ({uid}); refusing to use it"
            )
        info = os.stat(path)
    if info.st_uid != uid:
        raise PermissionError(
            f"{owner}: the {what} {str(path)!r} is owned by user id {info.st_uid}, not by you "
            f"({uid}); another user could place code there, refusing to use it (remove it, or "
            "point NEUROJAX_CACHE_DIR at a folder of your own)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{owner}: the {what} {str(path)!r} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); refusing to use it (chmod go-w it, or point "
            "NEUROJAX_CACHE_DIR at a folder of your own)"
        )


# ----------------------------------------------------------------------------- synapses


def _fmt_list(values: np.ndarray, limit: int = 5) -> str:
    shown = ", ".join(str(v) for v in values[:limit].tolist())
    return f"[{shown}{', ...' if values.size > limit else ''}]"


def checked_conn(owner: str, conn: Any) -> Any:
    """`conn` (a 2-D BCOO) without JAX's padding entries, after `check_conn_entries`.

    JAX marks unused entries of a BCOO (after slicing, `sum_duplicates`, ...) with the index
    `(n_pre, n_post)` and a zero value; those carry no synapse and are removed. Any other
    index outside the shape is refused."""
    idx = np.asarray(conn.indices)
    data = np.asarray(conn.data)
    pad = None
    if idx.ndim == 2 and idx.shape[1:] == (2,) and idx.shape[0] and not _inside(idx, conn.shape):
        # padding lies outside the shape: looked for only when some index is
        pad = (idx == np.asarray(conn.shape)).all(axis=1) & (data == 0)
    if pad is not None and pad.any():
        from jax.experimental import sparse

        keep = np.flatnonzero(~pad)
        conn = sparse.BCOO((conn.data[keep], conn.indices[keep]), shape=conn.shape)
    check_conn_entries(owner, tuple(conn.shape), conn.indices, conn.data)
    return conn


def _inside(idx: np.ndarray, shape) -> bool:
    """Whether every row of the `(nnz, 2)` indices lies inside `shape` (four reductions, no
    temporary array)."""
    return all(
        int(idx[:, axis].min()) >= 0 and int(idx[:, axis].max()) < int(shape[axis])
        for axis in (0, 1)
    )


def check_conn_entries(owner: str, shape: tuple[int, int], indices: Any, data: Any) -> None:
    """Every synapse of a BCOO `(n_pre, n_post)` inside the shape, and every weight finite.

    A layout would otherwise drop an out-of-range entry (JAX's sparse and scatter operations
    do) or wrap a negative one, and compute with NaN weights: a silently wrong network.
    """
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != 2:
        raise ValueError(f"{owner}: conn.indices must have shape (nnz, 2), got {idx.shape}")
    if idx.shape[0] and not _inside(idx, shape):
        for axis, name, n in ((0, "presynaptic", shape[0]), (1, "postsynaptic", shape[1])):
            col = idx[:, axis]
            bad = (col < 0) | (col >= n)
            if bad.any():
                raise ValueError(
                    f"{owner}: conn has {int(bad.sum())} synapse(s) whose {name} index is "
                    f"outside [0, {n}) for shape {tuple(shape)}, e.g. {_fmt_list(col[bad])} "
                    f"(first at entry {int(np.argmax(bad))}); indices must lie inside the shape"
                )
    w = np.asarray(data)
    if w.dtype.kind == "c":
        raise TypeError(f"{owner}: conn weights must be real, got dtype {w.dtype}")
    # NaN propagates to the minimum and an infinity is the minimum or the maximum: two
    # reductions without a temporary, the detailed search only when one is not finite
    if w.dtype.kind == "f" and w.size and not (np.isfinite(w.min()) and np.isfinite(w.max())):
        bad = ~np.isfinite(w)
        raise ValueError(
            f"{owner}: conn has {int(bad.sum())} non-finite weight(s) (NaN or inf), e.g. "
            f"{_fmt_list(w[bad])} (first at entry {int(np.argmax(bad))}); weights must be finite"
        )


def _csr_problem(indptr: np.ndarray, n_rows: int, nnz: int) -> str | None:
    if indptr.shape != (n_rows + 1,):
        return f"has shape {indptr.shape}, expected ({n_rows + 1},)"
    if indptr.size and indptr[0] != 0:
        return f"starts at {int(indptr[0])}, expected 0"
    steps = np.diff(indptr.astype(np.int64))
    if (steps < 0).any():
        return f"decreases at row {int(np.argmax(steps < 0))}"
    if indptr.size and indptr[-1] != nnz:
        return f"ends at {int(indptr[-1])}, but there are {nnz} synapses"
    return None


def check_layout(owner: str, layout: Any) -> None:
    """The invariants a layout's constructor (`from_bcoo`) establishes, checked on a layout
    that was not built by it (one rebuilt by `nj.load` from a file's values)."""
    from .network._layout import BCOOLayout, DenseLayout, EventLayout

    name = type(layout).__name__
    if isinstance(layout, EventLayout):
        indptr = np.asarray(layout.indptr)
        indices = np.asarray(layout.indices)
        weights = np.asarray(layout.weights)
        nnz = indices.shape[0] if indices.ndim == 1 else -1
        if indices.ndim != 1 or weights.shape[-1:] != (nnz,):
            raise ValueError(
                f"{owner}: {name}: indices of shape {indices.shape} and weights of shape "
                f"{weights.shape} do not hold one entry per synapse"
            )
        why = _csr_problem(indptr, layout.n_pre, nnz)
        if why is not None:
            raise ValueError(f"{owner}: {name}: indptr {why} (compressed rows of {nnz} synapses)")
        if nnz and (indices.min() < 0 or indices.max() >= layout.n_post):
            bad = (indices < 0) | (indices >= layout.n_post)
            raise ValueError(
                f"{owner}: {name}: {int(bad.sum())} postsynaptic indices outside [0, "
                f"{layout.n_post}), e.g. {_fmt_list(indices[bad])}"
            )
        counts = np.diff(indptr.astype(np.int64))
        widest = int(counts.max()) if counts.size else 0
        if widest != layout.max_fan_out:
            raise ValueError(
                f"{owner}: {name}: max_fan_out is {layout.max_fan_out}, but the widest row has "
                f"{widest} synapses"
            )
        if layout.col_ptr is not None:
            col_ptr = np.asarray(layout.col_ptr)
            col_syn = np.asarray(layout.col_syn)
            col_pre = np.asarray(layout.col_pre)
            why = _csr_problem(col_ptr, layout.n_post, nnz)
            if why is not None:
                raise ValueError(f"{owner}: {name}: col_ptr {why}")
            pre = np.repeat(np.arange(layout.n_pre), counts)
            order = np.argsort(indices, kind="stable")
            if (
                col_syn.shape != (nnz,)
                or col_pre.shape != (nnz,)
                or not np.array_equal(col_syn, order)
                or not np.array_equal(col_pre, pre[order])
            ):
                raise ValueError(
                    f"{owner}: {name}: the columns (col_syn, col_pre) are not those of the rows "
                    "(indptr, indices)"
                )
            col_widest = int(np.diff(col_ptr.astype(np.int64)).max()) if col_ptr.size > 1 else 0
            if col_widest != layout.max_fan_in:
                raise ValueError(
                    f"{owner}: {name}: max_fan_in is {layout.max_fan_in}, but the widest column "
                    f"has {col_widest} synapses"
                )
        _check_finite_weights(owner, name, "weights", weights)
    elif isinstance(layout, DenseLayout):
        m = np.asarray(layout.matrix)
        if m.shape != (layout.n_pre, layout.n_post):
            raise ValueError(
                f"{owner}: {name}: matrix has shape {m.shape}, expected "
                f"({layout.n_pre}, {layout.n_post})"
            )
        _check_finite_weights(owner, name, "matrix", m)
    elif isinstance(layout, BCOOLayout):
        conn = layout.conn
        if tuple(conn.shape) != (layout.n_pre, layout.n_post):
            raise ValueError(
                f"{owner}: {name}: conn has shape {conn.shape}, expected "
                f"({layout.n_pre}, {layout.n_post})"
            )
        check_conn_entries(f"{owner}: {name}", tuple(conn.shape), conn.indices, conn.data)


def _check_finite_weights(owner: str, name: str, field: str, w: np.ndarray) -> None:
    # NaN propagates to the minimum and an infinity is the minimum or the maximum: two
    # reductions without a temporary, the detailed search only when one is not finite
    if w.dtype.kind == "f" and w.size and not (np.isfinite(w.min()) and np.isfinite(w.max())):
        bad = ~np.isfinite(w)
        raise ValueError(
            f"{owner}: {name}: {int(bad.sum())} non-finite {field} (NaN or inf), e.g. "
            f"{_fmt_list(w[bad])}"
        )


# ----------------------------------------------------------------------------- keys


def check_key(owner: str, name: str, key: Any, *, batched: bool = False) -> None:
    """A single PRNG key (typed `jax.random.key`, or a raw `uint32` key of shape `(2,)`).

    `batched=True` also accepts a batch of keys.
    """
    if isinstance(key, jax.core.Tracer) and not hasattr(key, "dtype"):
        return
    dtype = getattr(key, "dtype", None)
    shape = tuple(np.shape(key)) if dtype is not None else None
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        if shape == () or batched:
            return
        raise ValueError(
            f"{owner}: {name} must be a single PRNG key, got a batch of keys of shape {shape}; "
            f"split it outside and pass one key (or jax.vmap over {owner})"
        )
    if dtype is not None and dtype == jnp.uint32 and shape is not None and shape[-1:] == (2,):
        if len(shape) == 1 or batched:
            return
        raise ValueError(
            f"{owner}: {name} must be a single PRNG key, got raw key data of shape {shape} "
            "(a batch of keys); pass one key"
        )
    raise TypeError(
        f"{owner}: {name} must be a JAX PRNG key such as jax.random.key(0), got "
        + (
            f"an array of shape {shape} and dtype {dtype}"
            if dtype is not None
            else f"{type(key).__name__} {key!r}"
        )
    )


# ----------------------------------------------------------------------------- modules


def revalidate(owner: str, tree: Any) -> None:
    """Run the constructor checks of every module in `tree` again (for a tree rebuilt from
    values that did not pass through the constructors, as `nj.load` rebuilds one).

    Every `__check_init__` along each module's class hierarchy, and the invariants of every
    storage layout (`check_layout`). Not checked: the pytrees of an optimizer's state
    (NamedTuples such as optax's, whose modules hold moments of the parameters, not
    parameters) and partial modules (a field left `None` by `eqx.filter`).
    """
    from .network._layout import Layout

    seen: set[int] = set()

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return  # an optimizer state: moments shaped like the parameters
        if isinstance(x, eqx.Module) and not _partial(x):
            for cls in reversed(type(x).__mro__):
                check = cls.__dict__.get("__check_init__")
                if check is not None:
                    try:
                        check(x)
                    except (ValueError, TypeError) as err:
                        raise ValueError(
                            f"{owner}: the loaded {type(x).__name__} fails its constructor's "
                            f"check: {err}"
                        ) from None
            if isinstance(x, Layout):
                check_layout(owner, x)
        children = jtu.tree_leaves(x, is_leaf=lambda y: y is not x and _is_node(y))
        for child in children:
            if child is not x and _is_node(child):
                visit(child)

    visit(tree)


def _partial(module: Any) -> bool:
    """Whether a module has a field set to None that its class does not default to None
    (a tree filtered by `eqx.filter` or `eqx.partition`)."""
    import dataclasses

    for field in dataclasses.fields(module):
        if field.metadata.get("static", False):
            continue
        if getattr(module, field.name, None) is None and field.default is not None:
            return True
    return False


def _is_node(x: Any) -> bool:
    return isinstance(x, eqx.Module) or isinstance(x, (list, tuple, dict))


# ----------------------------------------------------------------------------- simulate


def _leaf_text(path: Any) -> str:
    return jtu.keystr(path).lstrip(".") or "<root>"


def check_run_length(owner: str, first: int, n_steps: int, record_every: int) -> None:
    """Refuse a run whose int32 step clock would wrap.

    The step index of a run (a network's `state.step`, the index an inputs function is
    given, the ring-buffer slots of delays) is an int32; past `2**31 - 1` it would wrap to
    negative numbers and spikes would be delivered to the wrong slots.
    """
    if record_every > STEP_LIMIT:
        raise ValueError(
            f"{owner}: record_every={record_every} is more than 2**31 - 1 steps; a window's "
            "spike count (int32) could then wrap to a negative number. Record windows of at "
            "most 2**31 - 1 steps"
        )
    last = first + n_steps
    if last > STEP_LIMIT:
        raise ValueError(
            f"{owner}: the run would take the step index from {first} to {last}, past "
            f"2**31 - 1 = {STEP_LIMIT}, where the int32 step clock (a network's state.step, "
            "the step index of inputs, the delay ring slots) would wrap; at dt = 0.1 ms that "
            "is 59.6 h of simulated time. Run at most "
            f"{max(STEP_LIMIT - first, 0)} more steps from this state (a model without a step "
            "counter restarts at 0 in each call, so split its run into calls)"
        )


def _expected_state(model: Any, state: Any) -> Any:
    """The abstract state `model.init_state` makes for the sizes of `state`, or None when
    the model is neither a neuron model nor a network."""
    from .neurons._base import NeuronModel

    if isinstance(model, NeuronModel):
        v = getattr(state, "v", None)
        if v is None or not hasattr(v, "shape"):
            floats = [
                x
                for x in jtu.tree_leaves(state)
                if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
            ]
            if not floats:
                return None
            v = floats[0]
        if not np.shape(v):
            return None
        shape = tuple(np.shape(v))
        return eqx.filter_eval_shape(lambda: model.init_state(shape))
    populations = getattr(model, "populations", None)
    sizes = getattr(model, "sizes", None)
    if isinstance(populations, dict) and isinstance(sizes, dict) and hasattr(model, "ring_shape"):
        pops = getattr(state, "populations", None)
        if not isinstance(pops, dict):
            return None
        if set(pops) != set(sizes):
            raise ValueError(
                f"the state holds populations {sorted(pops)}, but the network has "
                f"{sorted(sizes)}: a state of another network; make it with this network's "
                "init_state"
            )
        first = next(iter(sizes))
        leaves = jtu.tree_leaves(pops[first])
        if not leaves or not np.shape(leaves[0]):
            return None
        batch = tuple(np.shape(leaves[0])[:-1])
        return eqx.filter_eval_shape(lambda k: model.init_state(k, batch=batch), jax.random.key(0))
    return None


_STATE_CACHE: dict[Any, str | None] = {}


def check_state(owner: str, model: Any, state: Any, signature: Any = None) -> None:
    """Refuse, before anything is compiled, a state that `model` did not make: a state of
    another model's type, or a field whose shape or dtype differs from what
    `model.init_state` makes for the same number of neurons (a state of a network of
    another size, a float32 state for a float64 model), naming the field."""
    key = signature
    if key is not None and key in _STATE_CACHE:
        problem = _STATE_CACHE[key]
    else:
        try:
            expected = _expected_state(model, state)
            problem = None if expected is None else _state_problem(model, state, expected)
        except ValueError as err:
            problem = str(err)
        except Exception:  # noqa: BLE001  (init_state itself failing: the run will tell)
            problem = None
        if key is not None:
            if len(_STATE_CACHE) > 512:
                _STATE_CACHE.pop(next(iter(_STATE_CACHE)))
            _STATE_CACHE[key] = problem
    if problem is not None:
        raise (TypeError if problem.startswith("state is a") else ValueError)(f"{owner}: {problem}")


def _state_problem(model: Any, state: Any, expected: Any) -> str | None:
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
                f"state field {_leaf_text(path)} is {g_dtype}{list(g_shape)}, but "
                f"{name}.init_state makes {want.dtype}{list(want.shape)} for this model and "
                "number of neurons: the state was made for another model, size or precision; "
                f"make it with {name}.init_state (with jax_enable_x64 as the model was built)"
            )
    return None


def check_input_values(owner: str, inputs: Any) -> None:
    """Refuse complex inputs (their imaginary part would be dropped) and concrete inputs
    that hold NaN or infinity, naming the leaf and the first bad entry."""
    for path, x in jtu.tree_leaves_with_path(inputs):
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            if isinstance(x, complex):
                raise TypeError(f"{owner}: inputs must be real, got the complex number {x!r}")
            if isinstance(x, float) and not np.isfinite(x):
                raise ValueError(f"{owner}: inputs must be finite, got {x!r}")
            continue
        where = "" if not path else f" at {_leaf_text(path)}"
        if jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(
                f"{owner}: inputs{where} are complex ({dtype}); the models take real "
                "currents, and the imaginary part would be dropped. Pass the real part "
                "(jnp.real) or the magnitude explicitly"
            )
        if isinstance(x, jax.core.Tracer) or not jnp.issubdtype(dtype, jnp.floating):
            continue
        # Outside a trace: one reduction on the device and one scalar back, the details only
        # on failure. Under a trace (concrete inputs closed over by the caller's jit) a device
        # operation would be staged, so the check reads the values on the host instead.
        if eager() and bool(jnp.all(jnp.isfinite(x))):
            continue
        finite = np.isfinite(np.asarray(x))
        if not finite.all():
            first = np.unravel_index(int(np.argmin(finite.reshape(-1))), finite.shape)
            raise ValueError(
                f"{owner}: inputs{where} hold {int((~finite).sum())} non-finite value(s) (NaN "
                f"or inf), the first at index {tuple(int(i) for i in first)}; inputs must be "
                "finite"
            )


def nonfinite_fields(state: Any) -> list[tuple[str, int, int]]:
    """(field, non-finite entries, entries) of every float field of a concrete state with a
    NaN or infinity, from one reduction per field and one transfer."""
    named = [
        (_leaf_text(p), x)
        for p, x in jtu.tree_leaves_with_path(state)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
    ]
    if not named:
        return []
    counts = jax.device_get(jnp.stack([jnp.sum(~jnp.isfinite(x)) for _, x in named]))
    return [(n, int(c), int(np.size(x))) for (n, x), c in zip(named, counts) if c]


def check_record_values(owner: str, values: Any) -> None:
    """Every leaf a `record` function returns must be an array (or a number)."""
    for path, x in jtu.tree_leaves_with_path(values):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")) and not isinstance(
            x, (bool, int, float)
        ):
            raise TypeError(
                f"{owner}: the record function returned {type(x).__name__} {x!r:.60}"
                f"{'' if not path else ' at ' + _leaf_text(path)}, not an array; it must "
                "return a PyTree of arrays (state fields, outputs or values computed from them)"
            )
