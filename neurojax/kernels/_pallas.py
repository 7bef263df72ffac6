"""What the Pallas kernels of the GPU and TPU slots share: the interpret switch and a few
helpers for Triton kernel bodies.

**Interpret mode.** A Pallas kernel can run on the CPU in `interpret=True` mode (the grid as a
loop of XLA operations), which is how the accelerator kernels are tested on a machine without
an accelerator. `nj.kernels.interpret("gpu")` (or `"tpu"`) makes the CPU run, through the
registry, each entry's GPU (or TPU) implementation instead of its CPU one, with every Pallas
call in interpret mode; `"off"` (the default) restores the normal dispatch. It is a JAX
configuration option, read at trace time and part of `jax.jit`'s cache key, like the kernel
mode; the environment variable `NEUROJAX_PALLAS_INTERPRET` (`gpu`, `tpu`, or `1` for `gpu`)
sets a process's default. The switch never changes what a GPU or a TPU compiles: on those
platforms the slots always lower to Triton and Mosaic.
"""

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._system import env_choice
from ._config import jax_option

__all__ = ["INTERPRET_MODES", "interpret", "interpret_mode", "pallas_interpret"]

INTERPRET_MODES = ("off", "gpu", "tpu")


def _env_default() -> str:
    value = env_choice(
        "NEUROJAX_PALLAS_INTERPRET",
        ("0", "false", "no", "off", "1", "true", "yes", "on", "gpu", "tpu"),
        "off",
    )
    if value in ("1", "true", "yes", "on", "gpu"):
        return "gpu"
    return "tpu" if value == "tpu" else "off"


def _make_state():
    return jax_option(
        "neurojax_pallas_interpret",
        _env_default(),
        "neurojax: run the GPU or TPU kernels on the CPU in Pallas interpret mode.",
        INTERPRET_MODES,
    )


_STATE = _make_state()
_FALLBACK = [_env_default()]


def interpret_mode() -> str:
    """`"off"`, or the accelerator slot (`"gpu"`, `"tpu"`) whose kernels the CPU runs in
    Pallas interpret mode (read at trace time)."""
    return _FALLBACK[0] if _STATE is None else _STATE.value


def pallas_interpret() -> bool:
    """The `interpret=` argument of the Pallas calls being traced."""
    return interpret_mode() != "off"


@contextlib.contextmanager
def interpret(slot: str = "gpu") -> Iterator[None]:
    """Run the enclosed code with the CPU executing each kernel's `slot` implementation
    (`"gpu"` or `"tpu"`), Pallas calls in interpret mode; `"off"` for the normal dispatch.

    Entries without an implementation in `slot` keep their CPU implementation. Functions
    jitted outside the block are retraced inside it: the switch is part of the jit cache key.

    Example:
    ```python
    with nj.kernels.interpret("gpu"):
        out = jax.jit(net.step)(state, None, 0.1)   # the Triton kernels, interpreted
    ```
    """
    if not isinstance(slot, str) or slot not in INTERPRET_MODES:
        raise ValueError(
            f"nj.kernels.interpret: slot must be one of {INTERPRET_MODES}, got {slot!r}"
        )
    if _STATE is None:
        old = _FALLBACK[0]
        _FALLBACK[0] = slot
        jax.clear_caches()
        try:
            yield
        finally:
            _FALLBACK[0] = old
            jax.clear_caches()
        return
    with _STATE(slot):
        yield


def next_pow2(n: int) -> int:
    """The smallest power of two >= `n` (>= 1): Triton's block sizes are powers of two."""
    return 1 << max(int(n) - 1, 0).bit_length()


def flat_trials(x: jax.Array, n_last: int = 1) -> tuple[jax.Array, tuple[int, ...]]:
    """`x` with its leading (trial) dimensions flattened into one, and those dimensions."""
    lead = x.shape[: x.ndim - n_last]
    return x.reshape((-1, *x.shape[x.ndim - n_last :])), lead


def atomic_add(ref, idx: jax.Array, val: jax.Array, ok: jax.Array, interpret: bool) -> None:
    """`ref[idx] += val` where `ok`, as GPU atomics (every lane's add lands, in any order).

    Under interpret mode Pallas replaces a vector atomic by a gather and a scatter, which keeps
    only one of several lanes aiming at the same element and rejects a mask, so the lanes are
    added one at a time there (a masked lane adds 0 at element 0); the GPU gets one masked
    vector atomic.
    """
    from jax.experimental.pallas import triton as plgpu

    idx = jnp.where(ok, idx, 0)
    if not interpret:
        plgpu.atomic_add(ref, (idx,), val, mask=ok)
        return
    idx_f, val_f = idx.reshape(-1), jnp.where(ok, val, 0).reshape(-1)

    def one(k, c):
        plgpu.atomic_add(ref, (idx_f[k],), val_f[k])
        return c

    lax.fori_loop(0, idx_f.shape[0], one, 0)


def gpu_path() -> bool:
    """Whether the code being traced runs the GPU slots: a GPU backend, or
    `nj.kernels.interpret("gpu")` on the CPU, with the kernel mode `"auto"` (read at trace
    time, like the switches it reads). The per-step network path asks it before it fuses a
    phase into a Pallas kernel that only the GPU has."""
    from ._config import mode

    if mode() == "reference":
        return False
    if interpret_mode() == "gpu":
        return True
    dev = jax.config.jax_default_device  # `jax.default_device(cpu)` on a GPU machine
    if dev is not None and (dev if isinstance(dev, str) else getattr(dev, "platform", "")) == "cpu":
        return False
    return jax.default_backend() in ("gpu", "cuda")


def masked_store(ref, idx: jax.Array, val: jax.Array, ok: jax.Array, interpret: bool) -> None:
    """`ref[idx] = val` where `ok` (`ref` one-dimensional). Under interpret mode Pallas turns a
    masked vector store into a gather and a scatter that also writes the masked lanes, so
    there the masked lanes aim past the end instead (the scatter drops them); the GPU gets a
    masked store."""
    from jax.experimental.pallas import triton as plgpu

    if interpret:
        ref[jnp.where(ok, idx, ref.shape[0])] = val
    else:
        plgpu.store(ref.at[idx], val, mask=ok)


def uniform_value(x) -> int | float | bool | None:
    """The Python scalar that every element of `x` equals, when `x` is a concrete (not
    traced), non-empty array of one value; else None. A kernel bakes such a value in as a
    constant instead of reading an array of it (a parameter given as one number)."""
    if isinstance(x, jax.core.Tracer) or not isinstance(x, (jax.Array, np.ndarray)):
        return None
    a = np.asarray(x)
    if a.size == 0 or a.dtype == object:
        return None
    flat = a.reshape(-1)
    first = flat[0]
    if a.size > 1 and not bool((flat == first).all()):  # NaNs never compare equal: kept
        return None
    return first.item()
