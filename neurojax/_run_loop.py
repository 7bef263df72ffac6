"""The one run loop of neurojax: a run of many steps in compiled chunks.

Every multi-step run goes through `run_chunks`: `nj.simulate` (and with it the command line's
`neurojax run`, a sharded network's `run` and the spike-id recording), so that chunking, the
rerun of a chunk whose spikes did not fit a bounded buffer, the progress bar and the split of
wall time into compiling and running are written once.

A chunk is whatever `run_chunk(model, state, start, length)` runs: `simulate` passes its
jitted scan. After each chunk `refit(model, state, out)` may answer that the chunk must run
again with a larger buffer; the loop then reruns it from the state before it, so no spike is
dropped and a burst costs one chunk run twice.

Compile time is read from JAX's own monitoring events (tracing, lowering, XLA compilation and
persistent-cache reads), so it is measured wherever it happens, also inside a chunk's first
call; the run time is the rest of the chunks' wall time.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["RunInfo", "run_chunks"]

# JAX reports these durations (seconds) through `jax.monitoring` for every program it traces,
# lowers and compiles, or reads from the persistent compilation cache.
_COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
        "/jax/compilation_cache/cache_retrieval_time_sec",
    }
)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """How a `nj.simulate` call spent its time (`recording.info`; `None` under a
    transformation, where nothing runs until the caller's program does).

    Attributes:
        compile_s: wall seconds spent tracing, lowering and compiling programs (or reading
            them from the persistent compilation cache), including a one-time build of the
            C++ kernels when it happens inside the call.
        run_s: wall seconds spent running the compiled chunks (everything else of the call's
            chunk loop).
        cpu_s: CPU seconds of the process (all threads) over the whole loop: on a shared
            machine the fairer measure of the work done.
        chunks: compiled calls that produced the recording.
        reruns: chunks run again with a larger spike buffer (a burst that did not fit).
        n_steps: steps simulated.
    """

    compile_s: float
    run_s: float
    cpu_s: float
    chunks: int
    reruns: int
    n_steps: int

    @property
    def steps_per_s(self) -> float:
        """Simulated steps per second of running (compile time excluded)."""
        return self.n_steps / self.run_s if self.run_s > 0 else float("inf")


class _CompileClock:
    """The wall time JAX spent compiling while the clock is active.

    JAX reports each trace, lowering and compilation with its duration when it ends; traces
    nest (a jitted function traced inside another), so the durations overlap. The clock
    keeps each as the interval that ends when it is reported and sums their union."""

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []

    def _listener(self, event: str, duration: float, **_: Any) -> None:
        if event in _COMPILE_EVENTS:
            end = time.perf_counter()
            self._intervals.append((end - duration, end))

    @property
    def seconds(self) -> float:
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self._intervals):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    def __enter__(self) -> "_CompileClock":
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc: Any) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listener)


def _no_refit(model: Any, state: Any, out: Any) -> tuple[Any, bool]:
    return model, False


def run_chunks(
    run_chunk: Callable[[Any, Any, int, int], tuple[Any, Any]],
    model: Any,
    state: Any,
    *,
    n_steps: int,
    chunk_size: int,
    refit: Callable[[Any, Any, Any], tuple[Any, bool]] | None = None,
    to_host: bool = False,
    progress: bool = False,
    dt: float | None = None,
    desc: str = "simulate",
    traced: bool = False,
) -> tuple[Any, Any, list[Any], RunInfo | None]:
    """Run `n_steps` steps as chunks of at most `chunk_size` steps.

    Args:
        run_chunk: `(model, state, start, length) -> (state, out)`, one compiled chunk from
            step `start` (counted from the run's first step) of `length` steps.
        model: what `run_chunk` steps; `refit` may replace it between tries.
        state: the state at the start of the run.
        n_steps: steps in all.
        chunk_size: steps per chunk (the last one may be shorter).
        refit: `(model, state_after, out) -> (model, rerun)`: after a chunk, the model to go
            on with and whether the chunk must run again (with that model) because its
            spikes did not fit a bounded buffer. `None`: never rerun.
        to_host: move each chunk's `out` to the host (NumPy) before the next chunk runs.
        progress: a tqdm progress bar that says when it compiles and gives the simulated
            time and the steps per second of running alone.
        dt: the step [ms], for the progress bar's simulated time.
        desc: the progress bar's label.
        traced: the arguments are traced (the run is inside the caller's `jit`, `vmap` or
            `grad`): one chunk, nothing blocked on or timed, and the info is `None`.

    Returns:
        `(model, state, outs, info)`: the model the last chunk ran with, the final state, the
        list of chunk outputs in order, and a `RunInfo` (`None` when traced).
    """
    refit = refit or _no_refit
    if traced:
        state, out = run_chunk(model, state, 0, n_steps)
        return model, state, [out], None
    outs: list[Any] = []
    reruns = 0
    run_s = 0.0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        # tqdm's own rate would count compile time: the postfix gives the run's alone.
        bar = tqdm(
            total=n_steps,
            unit="step",
            desc=desc,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
        )
    cpu0 = time.process_time()
    done = 0
    try:
        with _CompileClock() as clock:
            while done < n_steps:
                length = min(chunk_size, n_steps - done)
                while True:
                    compiled_before = clock.seconds
                    if bar is not None and done == 0:
                        bar.set_postfix_str("compiling")
                        bar.refresh()
                    t0 = time.perf_counter()
                    new_state, out = run_chunk(model, state, done, length)
                    jax.block_until_ready((new_state, out))
                    elapsed = time.perf_counter() - t0
                    run_s += max(0.0, elapsed - (clock.seconds - compiled_before))
                    model, rerun = refit(model, new_state, out)
                    if not rerun:
                        break
                    reruns += 1
                state = new_state
                if to_host:
                    out = jax.device_get(out)
                outs.append(out)
                done += length
                if bar is not None:
                    bar.update(length)
                    rate = done / run_s if run_s > 0 else float("inf")
                    sim = f"t={done * dt:.1f} ms, " if dt is not None else ""
                    bar.set_postfix_str(f"{sim}{rate:.3g} steps/s")
            compile_s = clock.seconds
    finally:
        if bar is not None:
            bar.close()
    info = RunInfo(
        compile_s=compile_s,
        run_s=run_s,
        cpu_s=time.process_time() - cpu0,
        chunks=len(outs),
        reruns=reruns,
        n_steps=n_steps,
    )
    return model, state, outs, info
