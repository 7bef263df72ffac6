"""`neurojax bench`: run the benchmarks of a source checkout and print their table.

The benchmarks live in the repository's `benchmarks/` folder (they compare neurojax with
peer simulators installed by `pip install -e ".[bench]"`), not in the installed package, so
this command works from a checkout: it runs `python -m benchmarks.run_all` there and prints
the Markdown table that `run_all` writes.
"""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

__all__ = ["add_bench_parser", "find_benchmarks"]


def find_benchmarks() -> Path | None:
    """The checkout root holding `benchmarks/run_all.py`, or None for an installed package."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "benchmarks" / "run_all.py").is_file() else None


def _names(root: Path | None) -> tuple[str, ...]:
    if root is None:
        return ()
    # Read the list without importing the benchmarks (they pin threads at import time).
    tree = ast.parse((root / "benchmarks" / "run_all.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BENCHMARKS" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def _cmd_bench(args: argparse.Namespace) -> int:
    root = find_benchmarks()
    if root is None:
        print(
            "neurojax bench: the benchmarks are part of the source checkout (benchmarks/), not "
            "of the installed package; run this command from an editable install "
            '(pip install -e ".[bench]") of the repository',
            file=sys.stderr,
        )
        return 2
    known = _names(root)
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(
            f"neurojax bench: unknown benchmark(s) {unknown}; choose from {list(known)}",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out).resolve() if args.out else root / "benchmarks" / "out"
    cmd = [sys.executable, "-m", "benchmarks.run_all", "--out", str(out)]
    if args.names:
        cmd += ["--only", ",".join(args.names)]
    if args.quick:
        cmd.append("--quick")
    if args.threads:
        cmd += ["--threads", args.threads]
    if args.no_peers:
        cmd.append("--no-peers")
    before = set(out.glob("results-*.md")) if out.is_dir() else set()
    # JSON lines go to stdout only with --json; progress (stderr) is passed through.
    proc = subprocess.run(
        cmd, cwd=root, stdout=None if args.json else subprocess.DEVNULL, check=False
    )
    tables = sorted(set(out.glob("results-*.md")) - before) if out.is_dir() else []
    if tables and not args.json:
        print(tables[-1].read_text())
    return proc.returncode


def add_bench_parser(sub) -> None:
    """Register `neurojax bench` on the top-level sub-parsers."""
    names = _names(find_benchmarks())
    p = sub.add_parser(
        "bench",
        help="run benchmarks and print the table (from a source checkout)",
        description=(
            "Run neurojax's benchmarks side by side with the peer simulators installed by "
            '`pip install -e ".[bench]"` and print the results table (times in seconds, '
            "ratios against peers measured in the same run, fractions of the machine's limits). "
            "JSON lines and the Markdown table are also written to --out."
        ),
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default all): {', '.join(names) or 'none found'}",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, one thread setting")
    p.add_argument("--threads", choices=("1", "2", "both"), help="thread settings to run")
    p.add_argument("--no-peers", action="store_true", help="time neurojax only")
    p.add_argument("--out", help="folder for the results (default benchmarks/out)")
    p.add_argument("--json", action="store_true", help="print the JSON lines instead of the table")
    p.set_defaults(handler=_cmd_bench)
