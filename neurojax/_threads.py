"""How many CPU threads neurojax uses, set once for the process by the user.

`import neurojax` changes nothing in JAX or in the process. The compiled CPU kernels (event
delivery, plasticity, procedural connectivity) share their work between the threads of one
pool of their own (`neurojax/kernels/pool.cc`), sized by this module's setting: by default
every CPU the process may run on; `nj.use_cpu_threads(n)` or the environment variable
`NEUROJAX_CPU_THREADS=n` (read at `import neurojax`) sets it to `n`.

XLA's own CPU thread pool is sized once, when JAX creates its CPU client (the first JAX
operation), from XLA's documented `PJRT_NPROC` variable or else the CPUs of the process. When
the user sets neurojax's threads before that moment, neurojax also sets `PJRT_NPROC` to
`n - 1` (at least 1), unless the user set it already: XLA's workers and the thread that runs
the compiled program then match the cores instead of exceeding them by one, which on a small
network's step (tens of operations of microseconds each) is worth 1.3-1.8x (see
docs/guides/cpu-threads.md).
"""

import os
import warnings
from collections.abc import Callable

__all__ = ["ENV", "allowed_cpus", "cpu_threads", "parse_env", "use_cpu_threads"]

ENV = "NEUROJAX_CPU_THREADS"

# The setting made by use_cpu_threads (None: not set; every allowed CPU).
_setting: list[int | None] = [None]
# Called with the new setting when it changes (the compiled kernels' loader registers one).
_listeners: list[Callable[[int], None]] = []


def allowed_cpus() -> int:
    """The number of CPUs this process may run on (its affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_env(raw: str | None) -> int | None:
    """The thread count that a value of `NEUROJAX_CPU_THREADS` asks for: None when unset,
    empty or `auto` (every allowed CPU); else a positive integer. Anything else is refused."""
    if raw is None or raw.strip().lower() in ("", "auto"):
        return None
    text = raw.strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(
        f"{ENV}={raw!r} is not allowed: use a positive integer (the number of CPU threads) "
        "or 'auto' (every CPU the process may run on)"
    )


def cpu_threads() -> int:
    """The number of threads neurojax's compiled CPU kernels use: the value given to
    `use_cpu_threads`, else every CPU the process may run on."""
    n = _setting[0]
    return allowed_cpus() if n is None else n


def use_cpu_threads(n: int | None = None, *, xla: bool = True) -> None:
    """Use `n` CPU threads (None: every CPU the process may run on) in neurojax's kernels.

    The compiled kernels of a network step (event delivery, plasticity, procedural
    connectivity) then share a step's work between `n` threads, the calling thread included,
    when the step's work is large enough to gain (a rule measured on the machine: see
    docs/guides/cpu-threads.md). Results do not depend on `n`: they are bit for bit those of
    one thread.

    With `xla=True` (the default) and when JAX has not yet created its CPU client (call this
    at the top of a script, before the first JAX operation), XLA's CPU thread pool is sized
    to match: `PJRT_NPROC` is set to `max(n - 1, 1)` unless it is set already, and
    `--xla_cpu_enable_concurrency_optimized_scheduler=false` is added to `XLA_FLAGS` unless
    that flag is there already (XLA then orders a program's operations to run one after the
    other, which suits a network step's many small operations: see
    docs/guides/cpu-threads.md). Later, XLA's pool keeps its size and a `RuntimeWarning` says
    so; the kernels' threads change anyway.

    **Arguments:**
    - `n`: a positive integer, more than the CPUs allowed (a test of determinism) included.
    - `xla`: whether to size XLA's pool as well.

    **Example:**
    ```python
    import neurojax as nj

    nj.use_cpu_threads(2)
    ```
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"use_cpu_threads: n must be a positive integer or None, got {n!r}")
    if not isinstance(xla, bool):
        raise ValueError(f"use_cpu_threads: xla must be True or False, got {xla!r}")
    _setting[0] = n
    threads = cpu_threads()
    if xla:
        _size_xla_pool(threads)
    for listener in _listeners:
        listener(threads)


# XLA's CPU scheduler that orders a program for the most concurrency between its operations
# (its default) runs a network step's tens of small operations on several of its pool's
# threads, which costs more in hand-overs than it gains and takes the core the kernels'
# threads need: measured on the 2-core machine (benchmarks/results/thread_scaling.md),
# without it the microcircuit at scale 0.1 runs 6-12 % faster on one thread, COBA 3-6 %,
# and on two threads COBA is no longer slower than on one; a dense training step of
# benchmarks/training.py is 3-10 % faster.
_XLA_SCHEDULER = "xla_cpu_enable_concurrency_optimized_scheduler"


def _size_xla_pool(threads: int) -> None:
    from ._jax_private import cpu_backend_started

    started = cpu_backend_started()
    flags = os.environ.get("XLA_FLAGS", "")
    if not started and _XLA_SCHEDULER not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --{_XLA_SCHEDULER}=false".strip()
    if "PJRT_NPROC" in os.environ:
        return
    if started:
        warnings.warn(
            "neurojax.use_cpu_threads: JAX's CPU client exists already, so XLA's thread pool "
            "keeps its size (only neurojax's kernels change); call use_cpu_threads before the "
            "first JAX operation, or set PJRT_NPROC yourself",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    os.environ["PJRT_NPROC"] = str(max(threads - 1, 1))


def _on_change(listener: Callable[[int], None]) -> None:
    """Call `listener(cpu_threads())` now and whenever the setting changes."""
    _listeners.append(listener)
    listener(cpu_threads())


def _from_environment() -> None:
    """Apply `NEUROJAX_CPU_THREADS` (at `import neurojax`): as `use_cpu_threads(n)`; unset
    or `auto` changes nothing."""
    n = parse_env(os.environ.get(ENV))
    if n is not None:
        use_cpu_threads(n)


# The user's environment, read once at `import neurojax` (this module is imported first, before
# anything creates JAX's CPU client); unset, nothing happens.
_from_environment()
