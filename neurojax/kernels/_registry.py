"""The kernel registry and the one dispatch function.

A *kernel* is an operation with a pure-JAX reference and faster implementations for some
platforms. Its `Kernel` entry declares, in one place (in the manner of equinox's
`create_vprim`):

- `reference`: the pure-JAX function that defines the operation; it runs on every platform
  without an implementation and in `nj.kernels.use("reference")` mode;
- `cpu`: the implementation on CPU, usually one call of a C++ function of this folder through
  XLA's FFI (`ffi_targets` names the FFI targets and the library's symbols); `gpu` (Pallas,
  Triton backend) and `tpu` (Pallas, Mosaic backend) are the slots for accelerators;
- `batching`: how a `jax.vmap`ped axis is handled (`Fold`: folded into the operation's own
  trial axis, one call for the whole batch, on every path; `Sequential`; or a function),
  or a mapping from slot names to such rules where the slots differ (a GPU kernel that takes
  a per-trial argument the CPU kernel does not; a slot not in it uses `Sequential`);
- the derivative: by default the JVP of `differentiable` (the reference unless given), so
  gradients never go through a compiled kernel; `jvp` replaces it where a cheaper tangent is
  known;
- `rtol`/`atol`: how far an implementation may be from the reference (0 for bit-identical),
  and `examples`: inputs on which `tests/test_kernels.py` checks every implementation against
  the reference under `jit`, `vmap` and `grad`.

Under `nj.kernels.interpret("gpu")` (or `"tpu"`) the CPU runs the entry's `gpu` (`tpu`)
implementation in place of its `cpu` one, Pallas calls in interpret mode, so accelerator
kernels are tested through this same dispatch on a machine without an accelerator.

`call(kernel, *args, **static)` applies all of it. `static` holds Python values (sizes,
flags) that select a program; they are passed to every function of the entry as keyword
arguments.
"""

import abc
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from . import _build, _config, _pallas

__all__ = [
    "Kernel",
    "Example",
    "Batching",
    "Fold",
    "Sequential",
    "register",
    "registry",
    "call",
    "implementations",
    "explain",
]


class Example(NamedTuple):
    """Inputs on which the registry test checks a kernel.

    Attributes:
        args: the positional (array) arguments.
        static: the static keyword arguments.
        grad_argnums: positions of float arguments whose gradient the test checks against the
            gradient of the reference (empty: no gradient check).
        vmap_argnums: positions of arguments given a vmapped batch axis in the vmap check
            (empty: every array argument).
        label: a name for the test id.
    """

    args: tuple[Any, ...]
    static: Mapping[str, Any] = {}
    grad_argnums: tuple[int, ...] = ()
    vmap_argnums: tuple[int, ...] = ()
    label: str = ""


class Batching(abc.ABC):
    """How a kernel handles a vmapped axis: called as
    `rule(axis_size, in_batched, args, apply) -> (out, out_batched)`, where `apply(*args)`
    runs the implementation (of the platform being compiled for) on arguments without the
    vmapped axis, and `in_batched` mirrors `args` with bools. Subclass it, or give any function
    of that signature. The reference needs no rule: `jax.vmap` batches it."""

    @abc.abstractmethod
    def __call__(self, axis_size, in_batched, args, apply):
        """`(out, out_batched)` for a vmapped axis of `axis_size` (see the class docstring)."""


def _batched_any(flag: Any) -> bool:
    return any(jtu.tree_leaves(flag))


@dataclasses.dataclass(frozen=True)
class Sequential(Batching):
    """One call per element of the vmapped axis (`lax.map`): for operations that cannot fold
    it, and the fallback of `Fold`."""

    def __call__(self, axis_size, in_batched, args, apply):
        which = [i for i, f in enumerate(in_batched) if _batched_any(f)]
        # An argument whose leaves are only partly batched is broadcast whole.
        mapped = tuple(
            jtu.tree_map(
                lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
                args[i],
                in_batched[i],
            )
            for i in which
        )

        def one(xs):
            full = list(args)
            for i, x in zip(which, xs, strict=True):
                full[i] = x
            return apply(*full)

        out = lax.map(one, mapped)
        return out, jtu.tree_map(lambda _: True, out)


@dataclasses.dataclass(frozen=True)
class Fold(Batching):
    """Fold the vmapped axis into the kernel's own trial axis: one call for the whole batch.

    Every argument at a position in `trial` has leading trial dimensions that the kernel's
    implementations treat as independent trials; an unbatched one is broadcast to the batch.
    The arguments at positions in `shared` (connectivity, rule parameters, sizes) must be the
    same for all trials: when one of them is vmapped the rule falls back to `Sequential`.
    Arguments in neither list are passed as they are, batched or not (the kernel accepts
    both). Every output gets the vmapped axis in front.

    `only_if_batched` lists trial arguments too large to broadcast (a weight matrix): when one
    of them is not vmapped, the rule runs one call per element instead (`Sequential`).
    """

    trial: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()
    only_if_batched: tuple[int, ...] = ()

    def __call__(self, axis_size, in_batched, args, apply):
        if any(_batched_any(in_batched[i]) for i in self.shared) or not all(
            _batched_any(in_batched[i]) for i in self.only_if_batched
        ):
            return Sequential()(axis_size, in_batched, args, apply)
        args = list(args)
        for i in self.trial:
            if not _batched_any(in_batched[i]):
                args[i] = jtu.tree_map(
                    lambda x: jnp.broadcast_to(x, (axis_size, *jnp.shape(x))), args[i]
                )
        out = apply(*args)
        return out, jtu.tree_map(lambda _: True, out)


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One registered operation: its reference, its implementations and its rules.

    See the module docstring; every function of the entry is called as
    `fn(*args, **static)`, with `supports(*args, **static) -> bool` telling whether the
    compiled implementations handle these arguments (dtypes, sizes) at all; a mapping
    from slot names (`"cpu"`, `"gpu"`, `"tpu"`) to such functions asks it per slot (a slot
    not in it handles every argument).
    """

    name: str
    reference: Callable[..., Any]
    cpu: Callable[..., Any] | None = None
    gpu: Callable[..., Any] | None = None
    tpu: Callable[..., Any] | None = None
    ffi_targets: tuple[tuple[str, str], ...] = ()
    batching: Callable[..., Any] | Mapping[str, Callable[..., Any]] = Sequential()
    differentiable: Callable[..., Any] | None = None
    jvp: Callable[..., Any] | None = None
    supports: Callable[..., bool] | Mapping[str, Callable[..., bool]] | None = None
    rtol: float = 0.0
    atol: float = 0.0
    examples: Callable[[], Iterable[Example]] | None = None
    doc: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Kernel: name must be a non-empty str, got {self.name!r}")
        if not callable(self.reference):
            raise TypeError(f"Kernel {self.name!r}: reference must be callable")
        for field in ("rtol", "atol"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"Kernel {self.name!r}: {field} must be >= 0, got {value!r}")


_REGISTRY: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Add `kernel` to the registry (names are unique) and return it."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"register: expected a Kernel, got {type(kernel).__name__}")
    old = _REGISTRY.get(kernel.name)
    if old is not None and old is not kernel:
        raise ValueError(f"register: a kernel named {kernel.name!r} is already registered")
    _REGISTRY[kernel.name] = kernel
    return kernel


# Callables that import modules whose kernels register on import but which a package
# imports only on first use (see `add_provider`).
_PROVIDERS: list[Callable[[], Any]] = []


def add_provider(load: Callable[[], Any]) -> None:
    """Have `registry()` call `load()` before it answers: a package that imports its kernel
    modules on first use (neurojax's assembly calculus and training layers) adds one, so that
    the registry lists their kernels without this layer naming the packages above it."""
    if not callable(load):
        raise TypeError(f"add_provider: expected a callable, got {type(load).__name__}")
    _PROVIDERS.append(load)


def registry() -> dict[str, Kernel]:
    """Every registered kernel by name (a copy): the kernels of every module imported, and
    of the modules the providers (`add_provider`) import."""
    for load in tuple(_PROVIDERS):
        load()
    return dict(_REGISTRY)


def _freeze(value: Any) -> Any:
    """A hashable version of a static argument (lists and arrays become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("__ndarray__", value.dtype.str, value.shape, tuple(value.reshape(-1).tolist()))
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    hash(value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "__ndarray__":
        return np.asarray(value[3], dtype=np.dtype(value[1])).reshape(value[2])
    if isinstance(value, tuple):
        return tuple(_thaw(v) for v in value)
    return value


def _may_run_on_cpu() -> bool:
    """Whether traced code may be compiled for the CPU (so the CPU library may be needed)."""
    dev = jax.config.jax_default_device
    if dev is not None:
        return (dev if isinstance(dev, str) else getattr(dev, "platform", "")) == "cpu"
    return jax.default_backend() == "cpu"


def _supported(kernel: Kernel, slot: str, args, static) -> bool:
    supports = kernel.supports
    if isinstance(supports, Mapping):
        supports = supports.get(slot)
    return supports is None or bool(supports(*args, **static))


def _slots(kernel: Kernel, *args, **static) -> dict[str, str]:
    """The slot (`"cpu"`, `"gpu"`, `"tpu"`) that runs on each platform, for these arguments
    in the current mode (`{}`: the reference everywhere). Under `nj.kernels.interpret(slot)`
    the CPU runs the entry's `slot` implementation, its Pallas calls interpreted."""
    if _config.mode() == "reference":
        return {}
    out = {}
    emulated = _pallas.interpret_mode()
    if emulated != "off" and getattr(kernel, emulated) is not None and _may_run_on_cpu():
        if _supported(kernel, emulated, args, static):
            out["cpu"] = emulated
    elif kernel.cpu is not None and _may_run_on_cpu() and _supported(kernel, "cpu", args, static):
        if not kernel.ffi_targets or _build.register_targets(kernel.ffi_targets):
            out["cpu"] = "cpu"
    traced = _accelerator_platforms()
    for platform, slot in (("cuda", "gpu"), ("tpu", "tpu")):
        if platform not in traced:
            continue
        if getattr(kernel, slot) is not None and _supported(kernel, slot, args, static):
            out[platform] = slot
    return out


def _accelerator_platforms() -> tuple[str, ...]:
    """The accelerator platforms whose implementations a call traces: all of them under
    `nj.kernels.cross_platform()`, else the default backend's (none on a CPU machine)."""
    if _config.cross_platform_enabled():
        return ("cuda", "tpu")
    backend = jax.default_backend()
    return ("cuda",) if backend in ("gpu", "cuda") else (backend,)


def implementations(kernel: Kernel, *args, **static) -> dict[str, Callable[..., Any]]:
    """The platform implementations that `call` would dispatch between for these arguments
    in the current mode (`{}` means the reference runs everywhere)."""
    return {p: getattr(kernel, slot) for p, slot in _slots(kernel, *args, **static).items()}


def explain(kernel: "Kernel | str", *args, **static) -> dict[str, str]:
    """Which implementation of `kernel` (an entry or its name) each platform runs for these
    arguments in the current mode, and why: `{"cpu": ..., "cuda": ..., "tpu": ...}`, each a
    sentence that starts with the slot that runs (`"cpu"`, `"gpu"`, `"tpu"`) or
    `"reference"`.

    Unlike `implementations`, it answers for every platform, whichever ones this machine
    traces, and says what sent a platform to the reference (the mode, a missing slot, the
    entry's `supports`, the compiled library).

    Given a model that says how it runs (an object with `explain_run`, such as
    `nj.Network`) in place of a kernel, it answers with that method:
    `nj.kernels.explain(net, state, dt=0.1, n_steps=1000)` says, per platform, whether
    `nj.simulate` runs the whole network in one GPU program per trial (`"network_run"`) or
    step by step (`"per-step"`), and why.

    Example:
    ```python
    nj.kernels.explain("lif_run", *args, n_rec=100, every=1, euler=False, shape=(n,))
    # {"cpu": "cpu: the entry's CPU implementation (nj_lif_run)",
    #  "cuda": "gpu: the entry's Pallas Triton implementation",
    #  "tpu": "reference: 'lif_run' has no tpu implementation"}
    ```
    """
    if not isinstance(kernel, (Kernel, str)) and callable(getattr(kernel, "explain_run", None)):
        return kernel.explain_run(*args, **static)
    if isinstance(kernel, str):
        known = registry()
        if kernel not in known:
            raise ValueError(
                f"nj.kernels.explain: kernel must be a Kernel or one of {sorted(known)}, "
                f"got {kernel!r}"
            )
        kernel = known[kernel]
    if not isinstance(kernel, Kernel):
        raise TypeError(
            f"nj.kernels.explain: kernel must be a Kernel or its name, got {type(kernel).__name__}"
        )
    if _config.mode() == "reference":
        why = "reference: nj.kernels.use('reference') (or NEUROJAX_CPU_KERNEL=0) is in force"
        return {p: why for p in ("cpu", "cuda", "tpu")}
    out = {}
    emulated = _pallas.interpret_mode()
    for platform, slot in (("cpu", "cpu"), ("cuda", "gpu"), ("tpu", "tpu")):
        if platform == "cpu" and emulated != "off" and getattr(kernel, emulated) is not None:
            if _supported(kernel, emulated, args, static):
                out[platform] = (
                    f"{emulated}: nj.kernels.interpret({emulated!r}) runs the {emulated} slot "
                    "on the CPU, Pallas calls interpreted"
                )
            else:
                out[platform] = (
                    f"reference: the {emulated} slot's `supports` refuses these arguments"
                )
            continue
        if getattr(kernel, slot) is None:
            out[platform] = f"reference: {kernel.name!r} has no {slot} implementation"
        elif not _supported(kernel, slot, args, static):
            out[platform] = f"reference: the {slot} slot's `supports` refuses these arguments"
        elif (
            platform == "cpu"
            and kernel.ffi_targets
            and not _build.register_targets(kernel.ffi_targets)
        ):
            out[platform] = "reference: the compiled CPU library is not available"
        elif platform == "cpu":
            targets = ", ".join(t for t, _ in kernel.ffi_targets) or "no FFI target"
            out[platform] = f"cpu: the entry's CPU implementation ({targets})"
        else:
            kind = "Pallas Triton" if slot == "gpu" else "TPU"
            out[platform] = f"{slot}: the entry's {kind} implementation"
    return out


@functools.cache
def _implementation(kernel: Kernel, frozen: Any, slot: str) -> Callable[..., Any]:
    """The implementation in `slot` of `kernel`, with the entry's batching rule: a vmapped
    axis reaches it through the rule (folded into its trials, or one call per element), at any
    depth of nested `vmap`s."""
    static = {k: _thaw(v) for k, v in frozen}
    fn = functools.partial(getattr(kernel, slot), **static)

    @custom_vmap
    def apply(*args):
        return fn(*args)

    rule = kernel.batching
    if isinstance(rule, Mapping):
        rule = rule.get(slot, Sequential())

    @apply.def_vmap
    def _rule(axis_size, in_batched, *args):
        return rule(axis_size, in_batched, args, apply)

    return apply


def _platform_call(kernel: Kernel, frozen: Any, *args) -> Any:
    # The reference is batched by `jax.vmap` itself (one vectorised computation); each
    # implementation by the entry's rule.
    static = {k: _thaw(v) for k, v in frozen}
    slots = _slots(kernel, *args, **static)
    reference = functools.partial(kernel.reference, **static)
    if not slots:
        return reference(*args)
    branches = {p: _implementation(kernel, frozen, slot) for p, slot in slots.items()}
    return lax.platform_dependent(*args, default=reference, **branches)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _differentiable_call(kernel: Kernel, frozen: Any, *args):
    return _platform_call(kernel, frozen, *args)


@_differentiable_call.defjvp
def _call_jvp(kernel, frozen, primals, tangents):
    static = {k: _thaw(v) for k, v in frozen}
    out = _differentiable_call(kernel, frozen, *primals)
    if kernel.jvp is not None:
        return out, kernel.jvp(out, primals, tangents, **static)
    fn = functools.partial(kernel.differentiable or kernel.reference, **static)
    _, tangent = jax.jvp(fn, primals, tangents)
    return out, tangent


def call(kernel: Kernel, *args, **static) -> Any:
    """Run `kernel` on `args` with the static keyword arguments `static`.

    On each platform the implementation for it runs where the entry has one (and the mode is
    `"auto"`), else the reference; a vmapped axis goes through the entry's batching rule; the
    derivative is the JVP of the entry's `differentiable` function (its reference unless
    given), or its `jvp`. Works under `jit`, `vmap`, `grad`, `scan` and `shard_map`.
    """
    frozen = tuple(sorted((k, _freeze(v)) for k, v in static.items()))
    return _differentiable_call(kernel, frozen, *args)
