"""Shared parameter conversion and validation (public as `neurojax.validation`).

Every model stores its physical parameters as array leaves produced by `as_float`, so that a
parameter given as a Python number, a NumPy array or a JAX array ends up with the default
floating dtype (float32, or float64 when `jax_enable_x64` is on). Validation helpers run at
construction time on concrete values; when a model is built inside a JAX transformation
(for example `jax.vmap(lambda a: Izhikevich(a=a))`) the values are tracers and cannot be
inspected, so the checks are skipped for those leaves rather than forcing a host sync.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

__all__ = [
    "as_float",
    "default_float",
    "check_finite",
    "check_positive",
    "check_nonnegative",
    "check_less",
    "check_choice",
    "check_broadcast",
    "check_dt",
    "check_positive_int",
    "is_concrete",
    "normalize_shape",
]


def default_float() -> Any:
    """The floating dtype JAX uses by default (float64 only when x64 is enabled)."""
    return jnp.result_type(float)


def as_float(x: Any) -> jax.Array:
    """Convert a parameter to an array of the default floating dtype.

    Use it as the `converter` of every physical parameter of a model
    (`tau_m: Float[Array, "..."] = eqx.field(default=10.0, converter=as_float)`), so that a
    Python number, a NumPy array or a JAX array all become an array leaf of one dtype.
    A traced value (a model built inside `jit` or `vmap`) passes through, cast to the default
    float if it is an integer.

    Raises `TypeError` for values that are not real numbers (strings, complex numbers,
    booleans), so that a typo such as `tau_m="10"` fails at construction.
    """
    if isinstance(x, jax.Array) and isinstance(x, jax.core.Tracer):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(default_float())
        return x
    if isinstance(x, (str, bytes)):
        raise TypeError(f"expected a real number or array of real numbers, got string {x!r}")
    if isinstance(x, bool) or (isinstance(x, np.ndarray) and x.dtype == np.bool_):
        raise TypeError(f"expected a real number or array of real numbers, got boolean {x!r}")
    arr = np.asarray(x) if not isinstance(x, jax.Array) else x
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise TypeError(f"expected a real number or array of real numbers, got complex {x!r}")
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise TypeError(
            f"expected a real number or array of real numbers, got dtype {arr.dtype} ({x!r})"
        )
    if isinstance(arr, np.ndarray):
        # A host value goes to the device as it is: jnp.asarray would compile a conversion
        # program for every shape.
        return jax.device_put(arr.astype(default_float(), copy=False))
    if arr.dtype == default_float():
        return arr
    return jnp.asarray(arr, dtype=default_float())


def eager() -> bool:
    """True outside every JAX transformation (no jit, vmap or grad is tracing).

    Array construction then fills small constants on the host and copies them to the device:
    the same operation on the device compiles a program for every shape, which a fresh process
    pays once per shape (the build of a network). Under a trace the device operation stays, so
    that no large constant enters the compiled program.
    """
    try:
        from jax._src import core
    except ImportError:  # pragma: no cover - a JAX without this module
        return False
    return bool(core.trace_state_clean())


def zeros(shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """`jnp.zeros(shape, dtype)`, filled on the host when `eager()` (see there)."""
    if eager():
        return jax.device_put(np.zeros(shape, dtype))
    return jnp.zeros(shape, dtype)


def is_concrete(x: Any) -> bool:
    """True when `x` holds values that can be inspected on the host (not a tracer)."""
    return not isinstance(x, jax.core.Tracer)


def _fmt(x: Any) -> str:
    a = np.asarray(x)
    if a.ndim == 0:
        return repr(float(a)) if a.dtype.kind == "f" else repr(a.item())
    if a.size <= 6:
        return np.array2string(a, separator=", ")
    return f"array of shape {a.shape} (min {a.min():g}, max {a.max():g})"


def _check(owner: str, name: str, value: Any, ok: Callable[[np.ndarray], np.ndarray], rule: str):
    if not is_concrete(value):
        return
    a = np.asarray(value)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{owner}: {name} must be finite, got {_fmt(a)}")
    bad = ~ok(a)
    if np.any(bad):
        shown = a if a.ndim == 0 else a[bad]
        raise ValueError(f"{owner}: {name} must be {rule}, got {_fmt(shown)}")


def check_finite(owner: str, name: str, value: Any) -> None:
    """Raise `ValueError` naming `owner` and `name` unless every entry of `value` is finite.

    Like every `check_*` helper it runs on concrete values (in `__check_init__`) and skips a
    traced value, which cannot be inspected without a host synchronisation.

    Args:
        owner: who checks, for the message (a class name such as `"LIF"`).
        name: the parameter's name.
        value: a number or an array.
    """
    _check(owner, name, value, lambda a: np.ones(a.shape, bool), "finite")


def check_positive(owner: str, name: str, value: Any, unit: str = "") -> None:
    """Raise `ValueError` unless every entry of `value` is finite and `> 0`.

    Args:
        owner: who checks, for the message (a class name such as `"LIF"`).
        name: the parameter's name.
        value: a number or an array.
        unit: the parameter's unit, for the message (`"ms"` gives "must be > 0 ms").

    Example:
    ```python
    check_positive("LIF", "tau_m", -1.0, "ms")  # ValueError: LIF: tau_m must be > 0 ms, got -1.0
    ```
    """
    _check(owner, name, value, lambda a: a > 0, f"> 0{(' ' + unit) if unit else ''}")


def check_nonnegative(owner: str, name: str, value: Any, unit: str = "") -> None:
    """Raise `ValueError` unless every entry of `value` is finite and `>= 0`.

    Args:
        owner: who checks, for the message (a class name).
        name: the parameter's name.
        value: a number or an array.
        unit: the parameter's unit, for the message.
    """
    _check(owner, name, value, lambda a: a >= 0, f">= 0{(' ' + unit) if unit else ''}")


def check_less(owner: str, lo_name: str, lo: Any, hi_name: str, hi: Any) -> None:
    """Raise `ValueError` unless `lo < hi` elementwise (after broadcasting), naming both.

    Args:
        owner: who checks, for the message (a class name).
        lo_name: the name of the parameter that must be smaller (`"v_reset"`).
        lo: its value.
        hi_name: the name of the parameter that must be larger (`"v_th"`).
        hi: its value.
    """
    if not (is_concrete(lo) and is_concrete(hi)):
        return
    a, b = np.broadcast_arrays(np.asarray(lo), np.asarray(hi))
    bad = ~(a < b)
    if np.any(bad):
        raise ValueError(
            f"{owner}: {lo_name} must be < {hi_name}, got {lo_name}={_fmt(a[bad] if a.ndim else a)}"
            f" and {hi_name}={_fmt(b[bad] if b.ndim else b)}"
        )


def check_choice(owner: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raise `ValueError` unless `value` is one of the strings `allowed` (a static option
    such as an integration `method`).

    Args:
        owner: who checks, for the message (a class name).
        name: the option's name.
        value: the value received.
        allowed: the accepted strings.
    """
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{owner}: {name} must be one of {allowed}, got {value!r}")


def check_dt(owner: str, dt: Any) -> float:
    """`dt` as a Python float; it must be a static, finite, positive number (milliseconds).

    Raises `TypeError` for a traced or non-numeric `dt`, `ValueError` for a non-finite or
    non-positive one.
    """
    if isinstance(dt, jax.core.Tracer):
        raise TypeError(
            f"{owner}: dt must be a static Python number (ms), got a traced value; "
            "pass dt as a Python float, not through jit/vmap arguments"
        )
    if isinstance(dt, bool) or not isinstance(dt, (int, float, np.integer, np.floating)):
        if isinstance(dt, (np.ndarray, jax.Array)) and np.ndim(dt) == 0:
            dt = float(dt)
        else:
            raise TypeError(f"{owner}: dt must be a Python number in ms, got {dt!r}")
    dt = float(dt)
    if not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"{owner}: dt must be finite and > 0 ms, got {dt!r}")
    # The models compute in the default float dtype: a dt that it rounds to 0 (time would
    # never advance) or to infinity is refused, as is one below its smallest normal number.
    dtype = np.dtype(default_float())
    info = np.finfo(dtype)
    if not (float(info.tiny) <= dt <= float(info.max)):
        raise ValueError(
            f"{owner}: dt={dt!r} ms is not representable in {dtype.name}, the dtype the "
            f"models compute in (normal numbers from {float(info.tiny):.3g} to "
            f"{float(info.max):.3g}); time would not advance"
        )
    return dt


def check_positive_int(owner: str, name: str, value: Any) -> int:
    """`value` as a Python int; `TypeError` unless it is an int (not a bool), `ValueError`
    unless it is positive."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return int(value)


def normalize_shape(owner: str, shape: Any) -> tuple[int, ...]:
    """A state shape as a tuple: an int `n` becomes `(n,)`, a tuple of non-negative ints is
    kept. `TypeError` or `ValueError`, naming `owner`, for anything else."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape
    ):
        raise TypeError(f"{owner}: shape must be an int or a tuple of ints, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"{owner}: shape entries must be >= 0, got {shape}")
    return shape


def check_broadcast(model: Any, shape: tuple[int, ...]) -> None:
    """Raise `ValueError` if an array parameter of `model` cannot broadcast to `shape`.

    Call it in `init_state` with the population's shape (after `normalize_shape`): a
    per-neuron parameter of shape `(n,)` must match the last state axis. Scalar parameters
    and non-array fields are skipped.

    Args:
        model: an `equinox.Module` whose array fields are parameters.
        shape: the population's shape `(*batch, n)`.
    """
    for name, value in vars(model).items():
        if not isinstance(value, jax.Array) or value.ndim == 0:
            continue
        try:
            out = jnp.broadcast_shapes(value.shape, shape)
        except ValueError:
            out = None
        if out != shape:
            raise ValueError(
                f"{type(model).__name__}: parameter {name} has shape {value.shape}, which does not"
                f" broadcast to the population shape {shape} (per-neuron parameters need shape"
                " (n,) matching the last state axis)"
            )


class NamesBadParameters(type(eqx.Module)):
    """Metaclass of a module whose array parameters go through `as_float`: a value the
    converter refuses (a string, None, a boolean, a complex number) is reported with the
    class's and the parameter's names, before any work (`"LIF: parameter tau_m must be a real
    number or array: ... got None"`)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except TypeError as err:
            if not str(err).startswith("expected a real number"):
                raise
            fields = [f for f in dataclasses.fields(cls) if f.init]
            static = {f.name for f in fields if f.metadata.get("static", False)}
            given = {**dict(zip([f.name for f in fields], args)), **kwargs}
            bad = []
            for name, value in given.items():
                if name in static:
                    continue
                try:
                    as_float(value)
                except TypeError:
                    bad.append(name)
            which = f"parameter {bad[0]}" if bad else "a parameter"
            raise TypeError(
                f"{cls.__name__}: {which} must be a real number or array: {err}"
            ) from None


# ----------------------------------------------------------------------------- keys


def check_key(
    owner: str, key: Any, name: str = "key", *, batched: bool = False, eager: bool = False
) -> jax.Array:
    """A JAX PRNG key: a typed key (`jax.random.key`) or raw `uint32` key data of shape
    `(2,)` (`jax.random.PRNGKey`), returned as a typed key.

    `batched=True` also accepts a batch of keys; `eager=True` refuses a traced key (for
    builders that run on the host, outside `jit`). Raises `TypeError` (not a key) or
    `ValueError` (a batch where one key is needed) naming `owner` and `name`.
    """
    if eager and isinstance(key, jax.core.Tracer):
        raise TypeError(
            f"{owner}: {name} is a traced value; {owner} runs eagerly on the host, so call it "
            "outside jit/vmap"
        )
    dtype = getattr(key, "dtype", None)
    shape = tuple(np.shape(key)) if dtype is not None else None
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        if shape == () or batched:
            return key
        raise ValueError(
            f"{owner}: {name} must be a single PRNG key, got a batch of keys of shape {shape}; "
            f"split it outside and pass one key (or jax.vmap over {owner})"
        )
    if dtype is not None and dtype == np.uint32 and shape is not None and shape[-1:] == (2,):
        if len(shape) == 1 or batched:
            return jax.random.wrap_key_data(jnp.asarray(key))
        raise ValueError(
            f"{owner}: {name} must be a single PRNG key, got raw key data of shape {shape} "
            "(a batch of keys); pass one key"
        )
    shown = (
        f"an array of shape {shape} and dtype {dtype}"
        if dtype is not None
        else f"{type(key).__name__} {key!r:.60}"
    )
    raise TypeError(
        f"{owner}: {name} must be a JAX PRNG key such as jax.random.key(0), got {shown}"
    )


# ----------------------------------------------------------------------------- simulate

# The largest step index the int32 clocks (a network's `state.step`, the step index that
# `simulate` gives an inputs function) can hold.
STEP_LIMIT = 2**31 - 1


def leaf_text(path: Any) -> str:
    """A pytree key path as the field name a message shows (`populations['E'].v`)."""
    return jtu.keystr(path).lstrip(".") or "<root>"


def fmt_list(values: np.ndarray, limit: int = 5) -> str:
    """The first `limit` entries of a 1-D array, for a message."""
    shown = ", ".join(str(v) for v in values[:limit].tolist())
    return f"[{shown}{', ...' if values.size > limit else ''}]"


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


def check_input_values(owner: str, inputs: Any) -> None:
    """Refuse complex inputs (their imaginary part would be dropped) and concrete inputs
    that hold NaN or infinity, naming the leaf and the first bad entry."""
    check_finite_tree(owner, "inputs", inputs)


def check_finite_tree(owner: str, what: str, tree: Any) -> None:
    """Refuse complex leaves and concrete float leaves of `tree` that hold NaN or infinity,
    naming `what`, the leaf and the first bad entry (traced leaves are skipped)."""
    for path, x in jtu.tree_leaves_with_path(tree):
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            if isinstance(x, complex):
                raise TypeError(f"{owner}: {what} must be real, got the complex number {x!r}")
            if isinstance(x, float) and not np.isfinite(x):
                raise ValueError(f"{owner}: {what} must be finite, got {x!r}")
            continue
        where = "" if not path else f" at {leaf_text(path)}"
        if jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(
                f"{owner}: {what}{where} are complex ({dtype}); the models take real "
                "values, and the imaginary part would be dropped. Pass the real part "
                "(jnp.real) or the magnitude explicitly"
            )
        if isinstance(x, jax.core.Tracer) or not jnp.issubdtype(dtype, jnp.floating):
            continue
        # Outside a trace: one reduction on the device and one scalar back, the details only
        # on failure. Under a trace (concrete values closed over by the caller's jit) a device
        # operation would be staged, so the check reads the values on the host instead.
        if eager() and bool(jnp.all(jnp.isfinite(x))):
            continue
        finite = np.isfinite(np.asarray(x))
        if not finite.all():
            first = np.unravel_index(int(np.argmin(finite.reshape(-1))), finite.shape)
            raise ValueError(
                f"{owner}: {what}{where} hold {int((~finite).sum())} non-finite value(s) (NaN "
                f"or inf), the first at index {tuple(int(i) for i in first)}; {what} must be "
                "finite"
            )


def nonfinite_fields(state: Any) -> list[tuple[str, int, int]]:
    """(field, non-finite entries, entries) of every float field of a concrete state with a
    NaN or infinity, from one reduction per field and one transfer."""
    named = [
        (leaf_text(p), x)
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
                f"{'' if not path else ' at ' + leaf_text(path)}, not an array; it must "
                "return a PyTree of arrays (state fields, outputs or values computed from them)"
            )


# ----------------------------------------------------------------------------- modules


def _partial(module: Any) -> bool:
    """Whether a module has a field set to None that its class does not default to None
    (a tree filtered by `eqx.filter` or `eqx.partition`)."""
    for field in dataclasses.fields(module):
        if field.metadata.get("static", False):
            continue
        if getattr(module, field.name, None) is None and field.default is not None:
            return True
    return False


def _is_node(x: Any) -> bool:
    return isinstance(x, (eqx.Module, list, tuple, dict))


def modules(tree: Any) -> list[Any]:
    """Every complete `eqx.Module` in `tree` (each once, parents before children), skipping
    NamedTuples (an optimizer's state holds moments shaped like the parameters, not
    parameters) and partial modules (a field left None by `eqx.filter`)."""
    seen: set[int] = set()
    out: list[Any] = []

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return
        if isinstance(x, eqx.Module) and not _partial(x):
            out.append(x)
        for child in jtu.tree_leaves(x, is_leaf=lambda y: y is not x and _is_node(y)):
            if child is not x and _is_node(child):
                visit(child)

    visit(tree)
    return out


def check_module(owner: str, module: Any, *, thorough: bool = True) -> list[tuple[Any, str]]:
    """Run the checks a module's class declares on an object that may not have passed
    through its constructor (edited with `eqx.tree_at`, rebuilt by `nj.load`): every
    `__check_init__` along its class hierarchy, then its `check_invariants(owner,
    thorough=thorough)` where it has one (`thorough=False`: skip what costs more than a pass
    over the arrays).

    Concrete values that break a check raise `ValueError` naming `owner`, the class and the
    field; `__check_init__` is skipped on a module with traced leaves. Returns the flags of
    traced values that `check_invariants` could not read:
    `(bad, message)` pairs, a boolean array that is True where the invariant fails.
    """
    # A constructor's check reads concrete values; on a module with traced leaves (one
    # passed through the caller's jit, vmap or pmap) it is the class's check_invariants that
    # flags what matters.
    traced = any(isinstance(x, jax.core.Tracer) for x in jtu.tree_leaves(module))
    for cls in reversed(type(module).__mro__):
        check = cls.__dict__.get("__check_init__")
        if check is None or traced:
            continue
        try:
            # concrete values closed over by the caller's transformation: the check's jnp
            # operations run now on them (as at construction), none is staged into the trace
            with jax.ensure_compile_time_eval():
                check(module)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{owner}: the {type(module).__name__} fails its constructor's check: {err}"
            ) from None
    invariants = getattr(module, "check_invariants", None)
    if not callable(invariants):
        return []
    return list(invariants(owner, thorough=thorough) or [])
