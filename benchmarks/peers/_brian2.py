"""Brian2 set-up and timing shared by the Brian2 peers.

Two code-generation targets are timed, each the way Brian2's own documentation and
benchmarks time them:

- **C++ standalone** (`set_device("cpp_standalone", build_on_run=False)`): the network is
  generated, compiled and run as a binary by `device.build(...)`; the loop time is
  `device._last_run_time` (measured inside the binary around the simulation loop). Repeats
  re-run the compiled binary with `device.run()`. `build_s` is the wall time of the first
  build (code generation, compilation and one run). Standalone devices cannot be reset
  cleanly, so every configuration runs in its own process.
- **cython runtime**: a short warm-up `run` compiles (or loads from Brian2's on-disk cache)
  the code objects; each repeat restores the stored state and times the `run(duration)` call
  around it (`run_s`, what a user waits for), with the loop alone (`device._last_run_time`)
  reported as `loop_s`.

With `threads=2` the standalone binary uses 2 OpenMP threads; the cython runtime is always
single-threaded.
"""

import gc
import os
import tempfile
import time
from typing import Any

import numpy as np

__all__ = ["setup", "time_network"]


def setup(
    mode: str, *, threads: int, dt_ms: float, dtype: str = "float64", directory: str | None = None
) -> Any:
    """Select Brian2's device for `mode` ('standalone' or 'cython'); returns the module.

    `directory`: the standalone project folder (default: a new temporary one, so that every
    run compiles everything; a fixed folder lets a repeated run reuse what it compiled)."""
    import brian2 as b2
    import numpy as np

    b2.prefs.logging.console_log_level = "ERROR"
    b2.prefs.core.default_float_dtype = {"float64": np.float64, "float32": np.float32}[dtype]
    if mode == "standalone":
        directory = directory or tempfile.mkdtemp(prefix="nj_brian2_")
        b2.set_device("cpp_standalone", build_on_run=False, directory=directory)
        b2.prefs.devices.cpp_standalone.openmp_threads = threads if threads > 1 else 0
    elif mode == "cython":
        b2.prefs.codegen.target = "cython"
    else:
        raise ValueError(f"mode must be 'standalone' or 'cython', got {mode!r}")
    b2.defaultclock.dt = dt_ms * b2.ms
    return b2


def time_network(
    b2: Any,
    net: Any,
    duration_ms: float,
    mode: str,
    *,
    repeats: int,
    budget_s: float,
    free_static_arrays: bool = False,
) -> dict[str, Any]:
    """Time `net.run(duration)` as described in the module docstring.

    `free_static_arrays` (standalone only): once the project is written to disk, drop the
    Python-side copies of the arrays handed to Brian2 (`device.static_arrays`, by then files
    in the project folder, and the large entries of `device.array_cache`, which Brian2 reads
    back from the binary's results after the run), so that the Python process does not hold
    them while the compiler and the binary run. The build is then `build(compile=False,
    run=False)`, `compile_source` and `run`; `build_s` still covers all three."""
    out: dict[str, Any] = {"mode": mode}
    times: list[float] = []
    if mode == "standalone":
        net.run(duration_ms * b2.ms)
        directory = b2.device.project_dir
        t0 = time.perf_counter()
        if free_static_arrays:
            from brian2.codegen.cpp_prefs import get_compiler_and_args

            b2.device.build(directory=directory, compile=False, run=False, with_output=False)
            directory = b2.device.project_dir
            b2.device.static_arrays.clear()
            cache = b2.device.array_cache
            for var, value in cache.items():
                if value is not None and np.size(value) > 100_000:
                    cache[var] = None  # the binary writes every array back after its run
            gc.collect()
            b2.device.compile_source(directory, get_compiler_and_args()[0], False, False)
            b2.device.run(directory=directory, with_output=False)
        else:
            b2.device.build(directory=directory, compile=True, run=True, with_output=False)
        out["build_s"] = time.perf_counter() - t0
        out["first_call_s"] = b2.device._last_run_time
        out["compile_s"] = out["build_s"] - out["first_call_s"]
        binary = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            b2.device.run(directory=directory, with_output=False)
            binary.append(time.perf_counter() - t0)
            times.append(b2.device._last_run_time)
            if sum(binary) > budget_s:
                break
        out["binary_wall_s"] = binary
        out["openmp_threads"] = b2.prefs.devices.cpp_standalone.openmp_threads
    else:
        t0 = time.perf_counter()
        net.run(0.1 * b2.ms)
        out["compile_s"] = time.perf_counter() - t0
        net.store()
        loops = []
        for _ in range(repeats):
            net.restore()
            t0 = time.perf_counter()
            net.run(duration_ms * b2.ms)
            times.append(time.perf_counter() - t0)
            loops.append(b2.device._last_run_time)
            if sum(times) > budget_s:
                break
        out["loop_s"] = loops
    out["times_s"] = times
    out["float_dtype"] = str(b2.prefs.core.default_float_dtype.__name__)
    out["pid"] = os.getpid()
    return out
