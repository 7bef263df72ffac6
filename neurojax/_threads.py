"""The size of XLA's CPU thread pool in a neurojax process.

XLA:CPU sizes its thread pool once, when JAX creates the CPU client, with one worker per core
the process may run on. The thread that executes a program runs work too, so on a machine of
`n` cores a running program keeps `n + 1` threads busy: the step of a network of a few thousand
neurons (tens of independent small operations, microseconds each) then pays for threads that
preempt each other and hand work across cores, and a plain `nj.simulate` of the COBA network
on 2 cores took 1.77x as long as the same call pinned to one core (issue 24).

neurojax therefore creates the CPU client with `n - 1` workers (one fewer than the cores), so
that the workers and the executing thread together match the cores: large populations and
matrix products still use every core, and small ones stop paying for the extra thread. XLA
reads the pool size from the process's CPU affinity, so the client is created while the
creating thread's affinity leaves out one core, and every thread's affinity is restored right
after; nothing else about the process changes.

It applies when the CPU client has not been created yet at `import neurojax` (the usual case)
and the process uses one CPU device on one host; set `NEUROJAX_CPU_THREADS` to choose the
number of workers yourself (`0`: leave XLA's default).
"""

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator

__all__ = ["install", "pool_workers"]

ENV = "NEUROJAX_CPU_THREADS"

# The number of workers the CPU client was created with by neurojax (None: XLA's default).
_created_with: list[int | None] = [None]


def _requested() -> int | None:
    """Workers asked for by NEUROJAX_CPU_THREADS (None: neurojax's choice; 0: XLA's)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        warnings.warn(
            f"neurojax: {ENV}={raw!r} is not a non-negative integer (the number of XLA CPU "
            "worker threads, 0 for XLA's default); using neurojax's default",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return value


def _single_cpu_device() -> bool:
    """True when the CPU client will hold one device of one process: forced host device
    counts and multi-process runs keep XLA's pool (their devices execute concurrently)."""
    import jax
    from jax._src import distributed

    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return False
    if jax.config.jax_num_cpu_devices not in (-1, 1):
        return False
    return distributed.global_state.client is None


def pool_workers(cores: int, requested: int | None) -> int:
    """The number of CPU workers for a process allowed `cores` cores (0: XLA's default)."""
    if requested is not None:
        return min(requested, cores)
    return cores - 1 if cores >= 2 else 0


@contextlib.contextmanager
def _affinity(cpus: set[int]) -> Iterator[None]:
    """Run the block with this thread allowed only `cpus`; afterwards every thread of the
    process (those the block created included) is allowed what this thread was before."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        # A thread started by a still-restricted thread while this loop runs inherits the
        # restriction: pass over the threads until a pass finds none left to restore.
        for _ in range(10):
            changed = False
            for tid in os.listdir("/proc/self/task"):
                # A thread that ended meanwhile, or one the process may not change, keeps its own.
                with contextlib.suppress(OSError, ValueError):
                    if os.sched_getaffinity(int(tid)) != before:
                        os.sched_setaffinity(int(tid), before)
                        changed = True
            if not changed:
                break


def install() -> None:
    """Wrap JAX's CPU client factory so that the client is created with the pool size of
    `pool_workers`; a no-op where the client exists already or the platform has no CPU
    affinity (macOS, Windows)."""
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        return
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX without this module
        return
    registration = getattr(xla_bridge, "_backend_factories", {}).get("cpu")
    if registration is None or "cpu" in getattr(xla_bridge, "_backends", {"cpu": None}):
        return
    if not dataclasses.is_dataclass(registration):  # pragma: no cover - another JAX layout
        return
    original = registration.factory

    def make_cpu_client(*args, **kwargs):
        cpus = sorted(os.sched_getaffinity(0))
        workers = pool_workers(len(cpus), _requested())
        if workers == 0 or workers >= len(cpus) or not _single_cpu_device():
            return original(*args, **kwargs)
        with _affinity(set(cpus[:workers])):
            client = original(*args, **kwargs)
        _created_with[0] = workers
        return client

    xla_bridge._backend_factories["cpu"] = dataclasses.replace(
        registration, factory=make_cpu_client
    )


install()
