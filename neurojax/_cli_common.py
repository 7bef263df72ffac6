"""What the command line's modules share: argument types, the run error, the step count and
the aligned rows of a report. `cli` and its subcommand modules (`_cli_networks`,
`_cli_assembly`) import from here, so that none of them imports another in a circle."""

import argparse
import math
from typing import Any

__all__ = [
    "RunError",
    "finite_float",
    "nonnegative_int",
    "positive_int",
    "positive_ms",
    "print_rows",
]

# Argument types. argparse turns an `ArgumentTypeError` into "argument --flag: <message>" and
# exit code 2, so each message states the rule and the value received.


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def positive_ms(text: str) -> float:
    """A finite duration > 0 in milliseconds."""
    x = _parse_float(text)
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (ms), got {text!r}")
    return x


def finite_float(text: str) -> float:
    """Any finite real number."""
    x = _parse_float(text)
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return x


def _int_at_least(text: str, low: int) -> int:
    try:
        n = int(text)
    except ValueError:
        n = low - 1
    if n < low:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
    return n


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0)


class RunError(Exception):
    """A failure while running a model (reported with exit code 1)."""


def _steps(duration: float, dt: float) -> int | None:
    """`duration / dt` when it is a whole number (to 1e-9 relative), else None."""
    n = round(duration / dt)
    if n < 1 or abs(n * dt - duration) > 1e-9 * duration:
        return None
    return n


def print_rows(rows: list[tuple[str, str]], result: dict[str, Any]) -> None:
    """Print `(label, value)` rows aligned, plus the plot's path when one was saved and, before
    the compile time, the C++ kernel build when this run built them."""
    if result.get("kernel_build_s"):
        at = next((i for i, (k, _) in enumerate(rows) if k == "compile time"), len(rows))
        rows = [*rows[:at], ("kernel build", f"{result['kernel_build_s']:.2f} s"), *rows[at:]]
    if result.get("plot"):
        rows = [*rows, ("plot", result["plot"])]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
