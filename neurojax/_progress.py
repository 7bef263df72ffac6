"""The progress bar of a chunked run (`nj.simulate(..., progress=True)`).

A jitted call traces and compiles its program (synchronously, on its first call with a new
shape) and then runs it asynchronously: the call returns when the run has been dispatched, and
the results are ready later. The bar uses that split. It shows `compiling...` from the start
until the first chunk has been dispatched, then the simulated time and the steps per second of
the run alone: a chunk whose length the run had not used before (one that may have compiled)
counts from its dispatch to its results, any other chunk from its start to its results. Once
a chunk of an already compiled length has finished, only such chunks make up the rate, so a
backend that runs a program before its call returns cannot make a compiled chunk look
instantaneous. tqdm's own rate and time left, which would count the compilation, are left out.
"""

import time
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["RunProgress"]

_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class RunProgress:
    """A tqdm bar over `n_steps` steps of `dt` ms that says when it compiles and reports the
    steps per second of the run without the compilation.

    Call `start(length)` before a chunk of `length` steps, `dispatched()` each time its
    jitted call returns (a chunk that is run again, with a larger spike buffer, calls it
    again), `finish(state)` when it is done (it blocks until `state` is ready), and
    `close()` at the end. `clock` is the time source (seconds), replaceable in tests.
    """

    def __init__(
        self,
        n_steps: int,
        dt: float,
        *,
        desc: str = "simulate",
        clock: Callable[[], float] = time.perf_counter,
        **tqdm_kwargs: Any,
    ):
        from tqdm.auto import tqdm

        self._dt = dt
        self._clock = clock
        self._bar = tqdm(
            total=n_steps,
            unit="step",
            desc=desc,
            dynamic_ncols=True,
            bar_format=_FORMAT,
            **tqdm_kwargs,
        )
        self._bar.set_postfix_str("compiling...", refresh=True)
        self._seen: set[int] = set()
        self._done = 0
        self._length = 0
        self._new = False
        self._t_start = self._t_dispatched = 0.0
        # (steps, seconds) of the chunks that may have compiled, and of those that did not.
        self._fresh = [0, 0.0]
        self._warm = [0, 0.0]

    @property
    def steps_per_s(self) -> float | None:
        """The run's steps per second so far, without compilation (None before a chunk ends)."""
        steps, seconds = self._warm if self._warm[0] else self._fresh
        if not steps:
            return None
        return steps / seconds if seconds > 0 else float("inf")

    def start(self, length: int) -> None:
        self._length = length
        self._new = length not in self._seen
        self._seen.add(length)
        self._t_start = self._t_dispatched = self._clock()
        if self._new and self._done:
            self._bar.set_postfix_str(self._status("compiling..."), refresh=True)

    def dispatched(self) -> None:
        self._t_dispatched = self._clock()

    def finish(self, state: Any) -> None:
        jax.block_until_ready(state)
        now = self._clock()
        if self._new:
            self._fresh[0] += self._length
            self._fresh[1] += now - self._t_dispatched
        else:
            self._warm[0] += self._length
            self._warm[1] += now - self._t_start
        self._done += self._length
        self._bar.set_postfix_str(self._status(None), refresh=False)
        self._bar.update(self._length)

    def _status(self, extra: str | None) -> str:
        rate = self.steps_per_s
        text = f"t={self._done * self._dt:.1f} ms"
        if rate is not None:
            text += f", {rate:.3g} steps/s"
        return text if extra is None else f"{text}, {extra}"

    def close(self) -> None:
        self._bar.close()
