"""Which implementation of each kernel runs: the public switch.

`"auto"` (the default) runs, on each platform, the kernel's implementation for it where it
has one (the compiled C++ kernel on CPU, Pallas kernels on GPU and TPU where they exist) and
its pure-JAX reference elsewhere; `"reference"` runs the pure-JAX reference everywhere (what
a platform without an implementation runs; useful to compare and to debug).

The mode is a JAX configuration option (`jax.config.neurojax_kernels`) that is read when a
function is traced and is part of `jax.jit`'s cache key: flipping it retraces what needs
retracing, with no cache to clear. The environment variable `NEUROJAX_CPU_KERNEL=0` (also
`false`, `no`, `off`; `1`, `true`, `yes`, `on` keep `"auto"`) makes `"reference"` the default
of a process; any other value is refused with a `ValueError` naming the variable.
"""

import contextlib
from collections.abc import Iterator

import jax

from .._system import env_flag

__all__ = ["MODES", "mode", "set_mode", "use", "cross_platform", "cross_platform_enabled"]

MODES = ("auto", "reference")


def _env_default() -> str:
    # yes/no spellings; any other value is refused (naming the variable), never read as "on"
    return "auto" if env_flag("NEUROJAX_CPU_KERNEL", True) else "reference"


def jax_option(name: str, default, help: str, values: tuple[str, ...] | None = None):
    """A user-defined JAX option `name` (read at trace time, part of `jax.jit`'s cache key and
    of the trace context): an enum of `values`, or a bool when `values` is None. None where
    this JAX cannot define options (the callers then keep a plain process-wide value)."""
    try:
        from jax._src import config as jax_config

        kw = dict(include_in_jit_key=True, include_in_trace_context=True)
        if values is None:
            return jax_config.bool_state(name, default, help, **kw)
        return jax_config.enum_state(name, list(values), default, help, **kw)
    except Exception:  # noqa: BLE001  (a JAX without user-defined options: see _FALLBACK)
        return None


def _make_state():
    return jax_option(
        "neurojax_kernels",
        _env_default(),
        "neurojax: which kernel implementations run ('auto' or 'reference').",
        MODES,
    )


_STATE = _make_state()
_FALLBACK = [_env_default()]  # used only where JAX cannot define the option


def _check(value: str) -> str:
    if not isinstance(value, str) or value not in MODES:
        raise ValueError(f"nj.kernels: mode must be one of {MODES}, got {value!r}")
    return value


def mode() -> str:
    """The mode in force: `"auto"` or `"reference"` (read at trace time by every kernel)."""
    return _FALLBACK[0] if _STATE is None else _STATE.value


def set_mode(value: str) -> None:
    """Set the mode for the whole process (`"auto"` or `"reference"`).

    Example:
    ```python
    nj.kernels.set_mode("reference")   # pure JAX everywhere, as a GPU without kernels runs
    ```
    """
    value = _check(value)
    if _STATE is None:
        _FALLBACK[0] = value
        jax.clear_caches()
    else:
        jax.config.update("neurojax_kernels", value)


@contextlib.contextmanager
def use(value: str) -> Iterator[None]:
    """Run the enclosed code (tracing included) in mode `value`, then restore the mode.

    Functions jitted outside the block are retraced inside it where the mode changes what they
    run: the mode is part of `jax.jit`'s cache key.

    Example:
    ```python
    with nj.kernels.use("reference"):
        _, rec_ref = nj.simulate(net, state, dt=0.1, n_steps=1000)
    ```
    """
    value = _check(value)
    if _STATE is None:
        old = _FALLBACK[0]
        set_mode(value)
        try:
            yield
        finally:
            set_mode(old)
        return
    with _STATE(value):
        yield


# ---------------------------------------------------------------- accelerator branches
#
# A kernel call traces one implementation per platform the program may be lowered for. By
# default that is the platform of the default backend (a CPU-only machine traces the C++
# kernel's call and the pure-JAX reference, not the Triton and Mosaic kernels, which cost
# about 0.3 s of tracing per network program); `cross_platform()` traces them all, so that a
# program traced here can be lowered for another platform with its accelerator kernels
# (`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`). Without it such a lowering
# is still correct: the other platforms run the reference.


def _env_cross_platform() -> bool:
    return env_flag("NEUROJAX_CROSS_PLATFORM", False)


def _make_cross_state():
    return jax_option(
        "neurojax_cross_platform",
        _env_cross_platform(),
        "neurojax: trace every platform's kernel implementation, not only the default backend's.",
    )


_CROSS = _make_cross_state()
_CROSS_FALLBACK = [_env_cross_platform()]


def cross_platform_enabled() -> bool:
    """Whether kernel calls trace every platform's implementation (see `cross_platform`)."""
    return _CROSS_FALLBACK[0] if _CROSS is None else bool(_CROSS.value)


@contextlib.contextmanager
def cross_platform(enabled: bool = True) -> Iterator[None]:
    """Trace the enclosed code's kernel calls for every platform, so that the program can be
    lowered for another platform than this machine's with its GPU and TPU kernels.

    By default a kernel call traces only the implementation of the default backend's
    platform (and the pure-JAX reference, which any other platform then runs); tracing the
    Triton and Mosaic kernels on a machine that cannot run them costs time (about 0.3 s per
    network program on a 2-core CPU). `NEUROJAX_CROSS_PLATFORM=1` turns it on for a process.

    Example:
    ```python
    with nj.kernels.cross_platform():
        text = jax.jit(step).trace(net, state).lower(lowering_platforms=("cuda",)).as_text()
    ```
    """
    if not isinstance(enabled, bool):
        raise TypeError(
            f"nj.kernels.cross_platform: enabled must be True or False, got {enabled!r}"
        )
    if _CROSS is None:
        old = _CROSS_FALLBACK[0]
        _CROSS_FALLBACK[0] = enabled
        jax.clear_caches()
        try:
            yield
        finally:
            _CROSS_FALLBACK[0] = old
            jax.clear_caches()
        return
    with _CROSS(enabled):
        yield
