"""Which implementation of each kernel runs: the public switch.

`"auto"` (the default) runs, on each platform, the kernel's implementation for it where it
has one (the compiled C++ kernel on CPU, Pallas kernels on GPU and TPU where they exist) and
its pure-JAX reference elsewhere; `"reference"` runs the pure-JAX reference everywhere (what
a platform without an implementation runs; useful to compare and to debug).

The mode is a JAX configuration option (`jax.config.neurojax_kernels`) that is read when a
function is traced and is part of `jax.jit`'s cache key: flipping it retraces what needs
retracing, with no cache to clear. The environment variable `NEUROJAX_CPU_KERNEL=0` (also
`false`, `no`) makes `"reference"` the default of a process.
"""

import contextlib
import os
from collections.abc import Iterator

import jax

__all__ = ["MODES", "mode", "set_mode", "use"]

MODES = ("auto", "reference")


def _env_default() -> str:
    value = os.environ.get("NEUROJAX_CPU_KERNEL", "1").strip().lower()
    return "reference" if value in ("0", "false", "no") else "auto"


def _make_state():
    try:  # a JAX option: part of the jit cache key and of the trace context
        from jax._src import config as jax_config

        return jax_config.enum_state(
            "neurojax_kernels",
            list(MODES),
            _env_default(),
            "neurojax: which kernel implementations run ('auto' or 'reference').",
            include_in_jit_key=True,
            include_in_trace_context=True,
        )
    except Exception:  # noqa: BLE001  (a JAX without user-defined options: see _Fallback)
        return None


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
