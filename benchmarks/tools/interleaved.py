"""Before/after timings of a change: one benchmark run alternately from two source trees.

A refactor is judged by the same benchmark measured before and after it in one session, the
two alternating so that a change in the machine's load touches both alike. This script runs
`python -m benchmarks.NAME ARGS` from the working tree `--before` (for example a `git
worktree` of the commit before the change) and from `--after`, alternately, `--rounds`
times each, every run in a fresh process with that tree first on the import path, and prints
every JSON line of every run tagged with `"tree"` and `"round"`. The figures to compare are
picked from those lines afterwards (`--summary KEY` prints the median of KEY per tree and
configuration).

Run: `python -m benchmarks.tools.interleaved --before ../wt-before --after . --rounds 3
[--summary run_s] -- brette_networks --no-peers --threads 1`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_SIZES = ("n", "size", "batch", "threads", "steps", "k", "record_every", "brains")


def _config_of(record: dict) -> str:
    """A label of the configuration a JSON line describes: its text and flag fields and its
    sizes (not its timings)."""
    skip = ("tree", "xla_flags", "cpu", "python", "jax", "numpy", "error")
    parts = [
        f"{k}={v}"
        for k, v in record.items()
        if k not in skip and (isinstance(v, (str, bool)) or (k in _SIZES and isinstance(v, int)))
    ]
    return ",".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree before")
    parser.add_argument("--after", type=Path, required=True, help="source tree after")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree (3)")
    parser.add_argument("--summary", default=None, help="print the median of this JSON key")
    parser.add_argument("benchmark", nargs=argparse.REMAINDER, help="-- NAME [ARGS...]")
    args = parser.parse_args(argv)
    bench = [a for a in args.benchmark if a != "--"]
    if not bench:
        parser.error("give the benchmark after --, e.g. -- brette_networks --no-peers")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "neurojax" / "__init__.py").exists():
            parser.error(f"--{name} {tree} holds no neurojax package")
    values: dict[tuple[str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            cmd = [sys.executable, "-m", f"benchmarks.{bench[0]}", *bench[1:]]
            proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"{name} round {rnd}: {' '.join(cmd)} exited {proc.returncode}")
            for line in proc.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                record = json.loads(line)
                record.update(tree=name, round=rnd)
                print(json.dumps(record), flush=True)
                if args.summary and isinstance(record.get(args.summary), (int, float)):
                    key = (name, _config_of(record))
                    values.setdefault(key, []).append(float(record[args.summary]))
    if args.summary:
        configs = sorted({c for _, c in values})
        for config in configs:
            b = values.get(("before", config), [])
            a = values.get(("after", config), [])
            if not (a and b):
                continue
            mb, ma = statistics.median(b), statistics.median(a)
            print(
                f"# {config}: {args.summary} before {mb:.5g} (n={len(b)}), after {ma:.5g} "
                f"(n={len(a)}), after/before {ma / mb:.3f}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
