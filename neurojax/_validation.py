"""Shared parameter conversion and validation (public as `neurojax.validation`).

Every model stores its physical parameters as array leaves produced by `as_float`, so that a
parameter given as a Python number, a NumPy array or a JAX array ends up with the default
floating dtype (float32, or float64 when `jax_enable_x64` is on). Validation helpers run at
construction time on concrete values; when a model is built inside a JAX transformation
(for example `jax.vmap(lambda a: Izhikevich(a=a))`) the values are tracers and cannot be
inspected, so the checks are skipped for those leaves rather than forcing a host sync.
"""

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
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
