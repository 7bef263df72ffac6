"""Shared benchmark harness: command line, thread pinning, timing, JSON output, peer processes.

Every benchmark follows the same protocol so that numbers are comparable:

- inputs are built before any timer starts;
- a JAX computation is lowered and compiled ahead of time (`jax.jit(f).lower(...).compile()`),
  and that compile time is reported as `compile_s`; the first execution is a separate,
  untimed warm-up whose duration is reported as `first_call_s` (it pays for page faults of
  freshly allocated outputs);
- each timed call ends with `jax.block_until_ready`, and `run_s` is the median (`run_min_s`
  the minimum) of the repeats; a configuration whose repeats would exceed a time budget stops
  early and reports how many repeats it made;
- every configuration prints exactly one JSON line on stdout; progress goes to stderr.

Threads must be fixed before JAX (and NumPy's BLAS) is imported, so benchmark modules import
this module first, call `parse_args`, and only then import JAX.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "SINGLE_THREAD_XLA_FLAGS",
    "Timing",
    "parse_args",
    "thread_env",
    "configure_threads",
    "time_compiled",
    "time_jax",
    "time_call",
    "timing_from_peer",
    "emit",
    "log",
    "run_peer",
    "peer_main",
    "load_machine",
    "neurojax_cpu_kernel",
]

REPO_ROOT = Path(__file__).resolve().parent.parent

# The flags commonly used to keep XLA's CPU backend on one intra-op thread; the second token
# is read by XLA's thread-pool set-up rather than the flag parser.
SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_env(threads: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables that pin XLA and BLAS to `threads` threads (1 or 2)."""
    if threads not in (1, 2):
        raise ValueError(f"threads must be 1 or 2, got {threads!r}")
    env = dict(os.environ if base is None else base)
    flags = env.get("XLA_FLAGS", "")
    for token in SINGLE_THREAD_XLA_FLAGS.split():
        flags = flags.replace(token, "")
    if threads == 1:
        flags = f"{flags} {SINGLE_THREAD_XLA_FLAGS}"
    env["XLA_FLAGS"] = " ".join(flags.split())
    if not env["XLA_FLAGS"]:
        del env["XLA_FLAGS"]
    for var in _THREAD_VARS:
        env[var] = str(threads)
    return env


def configure_threads(threads: int) -> None:
    """Pin this process to `threads` cores; must run before JAX or NumPy is imported.

    The XLA flags alone do not keep jaxlib 0.10's CPU runtime on one core: the fusions of a
    `lax.scan` body still run partitioned over the runtime's own thread pool (measured at
    1.7 cores busy). The process is therefore also restricted to `threads` CPUs with
    `sched_setaffinity`, which XLA's thread pools respect and which peer processes inherit.
    """
    imported = [m for m in ("jax", "numpy") if m in sys.modules]
    if imported:
        raise RuntimeError(
            f"configure_threads must run before importing {imported}: XLA and BLAS read their"
            " thread settings once, at import"
        )
    if hasattr(os, "sched_setaffinity"):
        cpus = list(range(os.cpu_count() or 1))
        # The last CPU rather than CPU 0, which also serves most interrupts.
        os.sched_setaffinity(0, set(cpus[-threads:]))
    env = thread_env(threads)
    for var in ("XLA_FLAGS", *_THREAD_VARS):
        if var in env:
            os.environ[var] = env[var]
        else:
            os.environ.pop(var, None)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes must be comma-separated positive integers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"--sizes must be comma-separated positive integers, got {text!r}"
        )
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(
    description: str,
    *,
    sizes: Sequence[int],
    quick_sizes: Sequence[int],
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Parse the common benchmark flags and pin threads before JAX is imported.

    Flags: `--quick` (small sizes, a smoke run), `--sizes 1,10,100`, `--repeats R`,
    `--peers/--no-peers`, `--threads {1,2}`, `--machine FILE` (limits measured by
    `benchmarks.tools.machine`; measured afresh when absent) and `--budget S` (seconds of timed
    repeats per configuration before stopping early).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--sizes", type=_int_list, default=None, help="comma-separated sizes")
    parser.add_argument("--repeats", type=_positive_int, default=5, help="timed repeats")
    parser.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the peer simulators (default: yes)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: XLA pinned to one intra-op thread (default); 2: both cores",
    )
    parser.add_argument(
        "--machine", type=Path, default=None, help="JSON from benchmarks.tools.machine"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds of timed repeats per configuration before stopping early",
    )
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(quick_sizes if args.quick else sizes)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    configure_threads(args.threads)
    return args


@dataclass
class Timing:
    """Wall-clock times of one configuration, in seconds."""

    compile_s: float | None
    first_call_s: float | None
    times: list[float] = field(default_factory=list)
    cpu_util: float | None = None  # CPU seconds per wall second during the timed calls

    @property
    def run_s(self) -> float:
        return statistics.median(self.times)

    @property
    def run_min_s(self) -> float:
        return min(self.times)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "compile_s": self.compile_s,
            "first_call_s": self.first_call_s,
            "run_s": self.run_s,
            "run_min_s": self.run_min_s,
            "repeats": len(self.times),
            "times_s": self.times,
            "cpu_util": self.cpu_util,
        }
        out["total_s"] = (self.compile_s or 0.0) + self.run_s
        return out


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _repeat(
    call: Callable[[], Any], repeats: int, budget_s: float
) -> tuple[list[float], Any, float]:
    """Timed calls; returns the times, the last output and the cores kept busy on average."""
    times: list[float] = []
    out = None
    cpu0 = _cpu_seconds()
    for _ in range(repeats):
        # Drop the previous result first so that large outputs (spike rasters) do not double
        # the peak memory of the next call.
        out = None
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return times, out, (_cpu_seconds() - cpu0) / sum(times)


def time_compiled(
    compiled: Callable[..., Any],
    args: Sequence[Any],
    *,
    compile_s: float | None,
    repeats: int,
    budget_s: float = 60.0,
) -> tuple[Timing, Any]:
    """Time an already compiled JAX callable: one warm-up call, then `repeats` timed calls."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t0
    times, out, util = _repeat(lambda: jax.block_until_ready(compiled(*args)), repeats, budget_s)
    return Timing(compile_s, first, times, util), out


def fit_spike_capacity(net: Any, state: Any, *, dt: float, n_steps: int) -> Any:
    """`net` with a spike capacity that holds every step of this run, for timing it under
    `jit` (where `nj.simulate` cannot rerun a chunk whose spikes overflowed the pure-JAX
    path's buffer). Runs `n_steps` plain steps with the current buffer, grows it to the peak
    they report (`Network.fit_capacity`) and repeats until nothing overflows; a network whose
    buffers cannot overflow here (the compiled CPU kernels) is returned as it is."""
    import jax

    if not callable(getattr(net, "fit_capacity", None)) or not net.buffers_may_overflow():
        return net

    def steps(n, s):
        return jax.lax.scan(lambda c, _: (n.step(c, None, dt)[0], None), s, None, length=n_steps)[0]

    for _ in range(16):
        grown = net.fit_capacity(jax.jit(steps)(net, state))
        if grown is net:
            return net
        log(f"spike capacity {net.capacity} -> {grown.capacity} (the pure-JAX path's buffer)")
        net = grown
    return net


def time_jax(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    repeats: int,
    budget_s: float = 60.0,
    static_argnums: tuple[int, ...] = (),
) -> tuple[Timing, Any, Any]:
    """Compile `fn` ahead of time for `args`, then time it; returns (timing, output, compiled)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn, static_argnums=static_argnums).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    dyn_args = [a for i, a in enumerate(args) if i not in static_argnums]
    timing, out = time_compiled(
        compiled, dyn_args, compile_s=compile_s, repeats=repeats, budget_s=budget_s
    )
    return timing, out, compiled


def time_call(
    call: Callable[[], Any],
    *,
    repeats: int,
    budget_s: float = 60.0,
    warmup: bool = True,
) -> tuple[Timing, Any]:
    """Time a plain callable (NumPy, or code that compiles on its first call).

    The first call is the warm-up; when the callable compiles on first use, `compile_s` is
    estimated as the first call minus the median of the later ones.
    """
    first = None
    if warmup:
        t0 = time.perf_counter()
        call()
        first = time.perf_counter() - t0
    times, out, util = _repeat(call, repeats, budget_s)
    timing = Timing(None, first, times, util)
    if first is not None:
        timing.compile_s = max(first - timing.run_s, 0.0)
    return timing, out


def timing_from_peer(result: dict[str, Any]) -> dict[str, Any]:
    """The `Timing.as_dict` fields of a peer process's result (which reports `times_s`)."""
    timing = Timing(result.get("compile_s"), result.get("first_call_s"), list(result["times_s"]))
    return timing.as_dict()


def _clean(value: Any) -> Any:
    """Make `value` JSON-safe: NumPy scalars to Python, non-finite floats to null."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if hasattr(value, "tolist"):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit(record: dict[str, Any]) -> None:
    """Print one configuration's result as a single JSON line on stdout.

    The 1-minute load average and the CPUs the process may use are added, so that a result
    taken while other work shared the cores can be recognised.
    """
    record = dict(record)
    if hasattr(os, "getloadavg"):
        record.setdefault("loadavg_1m", os.getloadavg()[0])
    if hasattr(os, "sched_getaffinity"):
        record.setdefault("cpus", sorted(os.sched_getaffinity(0)))
    print(json.dumps(_clean(record), allow_nan=False, sort_keys=False), flush=True)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_peer(
    module: str, spec: dict[str, Any], *, threads: int, timeout_s: float = 1800.0
) -> dict[str, Any]:
    """Run `python -m module SPEC_JSON` in a fresh process and return its JSON result.

    Peers run in their own processes so that their thread settings, global configuration
    (Brian2 devices, JAX's x64 flag) and memory cannot leak into the neurojax measurement.
    A failure is returned as `{"error": ...}` so that one broken peer does not stop the run.
    """
    cmd = [sys.executable, "-m", module, json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd,
            env=thread_env(threads),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{module} timed out after {timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return {"error": f"{module} exited with {proc.returncode}: " + " | ".join(tail)}


def peer_main(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Entry point of a peer process: read the spec from argv, print the result as JSON."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m {sys.argv[0]} SPEC_JSON")
    spec = json.loads(sys.argv[1])
    emit(run(spec))


def load_machine(args: argparse.Namespace) -> dict[str, Any]:
    """The machine limits from `--machine FILE`, or measured now (smaller sizes under --quick)."""
    if args.machine is not None:
        return json.loads(Path(args.machine).read_text())
    from .tools import machine

    log("measuring machine limits (use --machine FILE to reuse a measurement)")
    return machine.measure(threads=args.threads, quick=args.quick)


def neurojax_cpu_kernel() -> bool:
    """Whether neurojax's compiled CPU kernels run: the kernel mode is "auto" and the library
    builds and loads (`nj.kernels.mode()`, `neurojax.kernels._build.library()`)."""
    import neurojax as nj
    from neurojax.kernels import _build

    return nj.kernels.mode() == "auto" and _build.library() is not None
