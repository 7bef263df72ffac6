"""Measure the machine's limits once per benchmark run.

Benchmarks report the fraction of these limits that they reach:

- **compute**: float32 matrix-multiply FLOP/s, best over several sizes, through NumPy's BLAS
  and through XLA (`jax.jit(a @ b)`); a matmul is the easiest way to reach the FMA peak;
- **memory bandwidth**: a large-array copy (`np.copyto`, read + write = 2 words per element)
  and a STREAM-style triad `a = b + s c` through XLA (3 words per element, output buffer
  donated so that no page faults are timed), on arrays far larger than the caches;
- **exp throughput**: `exp` of a cache-resident float32 array (NumPy and XLA), the operation
  that dominates Hodgkin-Huxley rate functions.

All numbers are best-of-repeats, so they estimate what the hardware can do, not what a
typical call gets. `threads` is the thread count the process was pinned to (see
`benchmarks._harness.configure_threads`); run with
`python -m benchmarks.tools.machine [--threads N]`.
"""

import os
import platform
import time
from collections.abc import Callable
from typing import Any

__all__ = ["measure", "cpu_model"]


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or `platform.processor()` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _best(call: Callable[[], Any], repeats: int, min_time_s: float = 0.02) -> float:
    """Best time of one call over `repeats` measurements, each of enough calls back to back
    to last `min_time_s`, so that timer resolution and dispatch jitter cannot make a short
    call look faster than the hardware allows."""
    t0 = time.perf_counter()
    call()
    once = max(time.perf_counter() - t0, 1e-7)
    batch = max(1, int(min_time_s / once))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batch):
            call()
        best = min(best, (time.perf_counter() - t0) / batch)
    return best


def _numpy_copy_bandwidth(size: int, repeats: int) -> float:
    import numpy as np

    src = np.ones(size, np.float32)
    dst = np.zeros(size, np.float32)
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src), repeats)


def _jax_triad_bandwidth(size: int, repeats: int) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    # The output reuses the donated buffer of `a`, so no freshly mapped pages are timed.
    triad = jax.jit(lambda a, b, c: b + np.float32(1.5) * c, donate_argnums=0)
    b = jnp.ones(size, jnp.float32)
    c = jnp.ones(size, jnp.float32)
    holder = [jnp.zeros(size, jnp.float32)]

    def run():
        holder[0] = triad(holder[0], b, c)
        holder[0].block_until_ready()

    return 3 * b.nbytes / _best(run, repeats)


def measure(*, threads: int, quick: bool = False) -> dict[str, Any]:
    """Measure compute, bandwidth and exp limits of this process's threads; see the module doc."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    repeats = 3 if quick else 5
    mm_sizes = (256, 512, 1024) if quick else (256, 512, 1024, 2048)
    big = 2**23 if quick else 2**26  # elements: 32 MiB or 256 MiB of float32 per array
    small = 2**18  # 1 MiB of float32: resident in L2

    rng = np.random.default_rng(0)
    np_mm, jax_mm = 0.0, 0.0
    mm = jax.jit(lambda a, b: a @ b)
    for n in mm_sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        flops = 2.0 * n**3
        np_mm = max(np_mm, flops / _best(lambda a=a, b=b: a @ b, repeats))
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        jax_mm = max(
            jax_mm, flops / _best(lambda ja=ja, jb=jb: mm(ja, jb).block_until_ready(), repeats)
        )

    np_copy = _numpy_copy_bandwidth(big, repeats)
    jax_triad = _jax_triad_bandwidth(big, repeats)

    x = np.linspace(-5.0, 5.0, small, dtype=np.float32)
    y = np.empty_like(x)
    np_exp = small / _best(lambda: np.exp(x, out=y), 10 * repeats)
    jexp = jax.jit(jnp.exp)
    jx = jnp.asarray(x)
    jax_exp = small / _best(lambda: jexp(jx).block_until_ready(), 10 * repeats)

    return {
        "bench": "machine",
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "matmul_sizes": list(mm_sizes),
        "numpy_matmul_flops": np_mm,
        "jax_matmul_flops": jax_mm,
        "peak_flops": max(np_mm, jax_mm),
        "bandwidth_array_bytes": 4 * big,
        "numpy_copy_bytes_per_s": np_copy,
        "jax_triad_bytes_per_s": jax_triad,
        "peak_bytes_per_s": max(np_copy, jax_triad),
        "numpy_exp_per_s": np_exp,
        "jax_exp_per_s": jax_exp,
    }


def main(argv: list[str] | None = None) -> None:
    from .. import _harness

    args = _harness.parse_args(
        "Measure FLOP/s, memory bandwidth and exp throughput", sizes=[1], quick_sizes=[1], argv=argv
    )
    _harness.emit(measure(threads=args.threads, quick=args.quick))


if __name__ == "__main__":
    main()
