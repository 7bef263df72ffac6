"""Run every timing benchmark and collect their JSON lines (what `make bench` runs).

For each thread setting the machine's limits are measured once (`benchmarks.tools.machine`)
and every benchmark runs in its own process. The scripts on the common harness
(`HARNESS`) get `--machine FILE --threads T` plus the flags given here (`--quick`,
`--repeats R`, `--no-peers`, `--budget S`; `--sizes` only together with `--only`, since sizes
differ between benchmarks). The scripts with a command line of their own (`OWN`) get their
own full or quick arguments, and `--no-peers` in their own spelling. JSON lines are echoed
to stdout and written, with a Markdown rendering of the tables and targets
(`benchmarks.tools.report`), to `--out` (default `benchmarks/out/`, ignored by git).

`--quick` is the smoke run (small sizes, one thread setting; with `--no-peers` nothing but
neurojax runs); the full run (both thread settings, all peers) takes hours on two cores.
`benchmarks.gpu` is not run here: it needs a GPU (`make bench-gpu`).

Run: `python -m benchmarks.run_all [--quick] [--threads 1|2|both] [--only hh_batch,...]
[--no-peers] [--repeats R] [--out DIR] [--dry-run]`.
"""

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from . import _harness
from .tools import report

# Every timing script that `run_all` runs, in order (`neurojax bench` reads this tuple from
# the source without importing the module, so it stays a literal).
BENCHMARKS = (
    "lif_population",
    "hh_batch",
    "brette_networks",
    "network_scale",
    "connect_scale",
    "stdp_overhead",
    "plasticity",
    "plasticity_stp",
    "assembly",
    "training",
    "parallel_scaling",
    "sweep",
    "vmap_cost",
    "procedural",
    "microcircuit",
    "memory_stages",
    "time_to_result",
    "threads_default",
    "thread_scaling",
    "thread_choice",
    "start_check",
    "eventprop",
    "eventprop_peers",
)

# Top-level scripts of `benchmarks/` that `run_all` leaves out, and why.
NOT_RUN = {
    "gpu": "needs a GPU; `make bench-gpu` runs it on a GPU machine",
    "network_run_cpu": "an interleaved before/after check of the CPU's whole network run "
    "against the per-step path (thread_scaling times the same network in the suite)",
}

# The scripts that parse their flags with `_harness.parse_args`.
HARNESS = frozenset(
    {
        "lif_population",
        "hh_batch",
        "brette_networks",
        "network_scale",
        "stdp_overhead",
        "plasticity",
        "plasticity_stp",
        "assembly",
        "training",
        "parallel_scaling",
        "sweep",
    }
)


@dataclasses.dataclass(frozen=True)
class Own:
    """How `run_all` calls a script with a command line of its own.

    `full` and `quick`: its arguments in a full and in a quick run; `no_peers`: its spelling
    of `--no-peers` (None: it runs no peers); `threads`: whether it takes `--threads T` (the
    others pin their own processes and run once, in the first thread setting).
    """

    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    no_peers: tuple[str, ...] | None = None
    threads: bool = False


OWN = {
    "connect_scale": Own(quick=("--quick",), threads=True),
    "vmap_cost": Own(quick=("--steps", "200", "--batch", "2", "--repeats", "1"), threads=True),
    "procedural": Own(full=("coba",), quick=("coba", "--duration", "50")),
    "microcircuit": Own(
        full=("--scale", "0.1", "--k-scale", "1", "--duration", "200"),
        quick=("--scale", "0.02", "--k-scale", "0.1", "--duration", "50"),
        no_peers=("--peers", "neurojax"),
        threads=True,
    ),
    "memory_stages": Own(quick=("--scale", "0.02", "--steps", "200")),
    "time_to_result": Own(quick=("--rounds", "1", "--duration", "100"), no_peers=("--no-peers",)),
    "threads_default": Own(quick=("--rounds", "1", "--repeats", "1", "--only", "coba")),
    "thread_scaling": Own(
        full=("--cases", "coba,coba_stdp,mc0.1"),
        quick=("--cases", "coba", "--rounds", "1", "--duration", "100"),
        no_peers=("--peers", ""),
    ),
    "thread_choice": Own(quick=("--cases", "coba", "--rounds", "1", "--repeats", "1")),
    "start_check": Own(quick=("--repeats", "3")),
    "eventprop": Own(full=("--steps", "1000", "10000", "100000"), quick=("--steps", "1000")),
    "eventprop_peers": Own(
        quick=("--rounds", "1", "--batches", "2"),
        no_peers=("--libraries", "neurojax-eventprop", "neurojax-surrogate"),
    ),
}


@dataclasses.dataclass(frozen=True)
class Step:
    """One process of a run: the benchmark, its thread setting and its `python -m` arguments."""

    name: str
    threads: int
    args: tuple[str, ...]


def plan(
    only: tuple[str, ...],
    settings: tuple[int, ...],
    *,
    quick: bool,
    passthrough: list[str],
    machine_file: dict[int, Path],
) -> list[Step]:
    """The processes of a run, in order: per thread setting, each benchmark of `only`."""
    no_peers = "--no-peers" in passthrough
    steps = []
    for i, t in enumerate(settings):
        for name in only:
            if name in HARNESS:
                args = ["--threads", str(t), "--machine", str(machine_file[t]), *passthrough]
                if quick:
                    args.append("--quick")
            else:
                own = OWN[name]
                if not own.threads and i > 0:
                    continue
                args = list(own.quick if quick else own.full)
                if own.threads:
                    args += ["--threads", str(t)]
                if no_peers and own.no_peers is not None:
                    args += own.no_peers
            steps.append(Step(name, t, (f"benchmarks.{name}", *args)))
    return steps


def _record(line: str, name: str) -> str | None:
    """A JSON line of a benchmark's stdout, tagged with `"bench": name` when the script does
    not name itself (so that the report can group it); None for any other line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    record.setdefault("bench", name)
    return json.dumps(record)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one thread setting")
    parser.add_argument(
        "--threads",
        choices=("1", "2", "both"),
        default=None,
        help="thread settings to run (default: both, or 1 with --quick)",
    )
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--out", type=Path, default=_harness.REPO_ROOT / "benchmarks" / "out")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the commands without running them"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, passthrough = parser.parse_known_args(argv)
    only = BENCHMARKS if args.only is None else tuple(args.only.split(","))
    unknown = [b for b in only if b not in BENCHMARKS]
    if unknown:
        parser.error(f"--only must name benchmarks from {BENCHMARKS}, got {unknown}")
    if "--sizes" in " ".join(passthrough) and len(only) != 1:
        parser.error("--sizes differ between benchmarks: use it together with --only NAME")
    harness_flags = [a for a in passthrough if a != "--no-peers"]
    own_only = [b for b in only if b not in HARNESS]
    if harness_flags and own_only:
        parser.error(
            f"flags {harness_flags} are those of the common harness; {own_only} have their own"
            " command lines: leave those out with --only"
        )
    threads = args.threads or ("1" if args.quick else "both")
    settings = (1, 2) if threads == "both" else (int(threads),)

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    machine_file = {t: args.out / f"machine-{stamp}-t{t}.json" for t in settings}
    steps = plan(
        only, settings, quick=args.quick, passthrough=passthrough, machine_file=machine_file
    )
    if args.dry_run:
        for step in steps:
            print(f"threads={step.threads}: python -m {' '.join(step.args)}")
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / f"results-{stamp}.jsonl"
    t_start = time.perf_counter()
    failed = []
    with jsonl.open("w") as sink:
        for t in settings:
            if not any(s.threads == t and s.name in HARNESS for s in steps):
                continue
            cmd = [sys.executable, "-m", "benchmarks.tools.machine", "--threads", str(t)]
            if args.quick:
                cmd.append("--quick")
            _harness.log(f"run_all: measuring machine limits with {t} thread(s)")
            line = subprocess.run(
                cmd,
                cwd=_harness.REPO_ROOT,
                env=_harness.thread_env(t),
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            machine_file[t].write_text(line + "\n")
            print(line, flush=True)
            sink.write(line + "\n")
        for step in steps:
            cmd = [sys.executable, "-m", *step.args]
            _harness.log(f"run_all: {' '.join(cmd[1:])}")
            proc = subprocess.Popen(
                cmd,
                cwd=_harness.REPO_ROOT,
                env=_harness.thread_env(step.threads),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            for out_line in proc.stdout:
                record = _record(out_line, step.name)
                if record is None:
                    continue  # only JSON lines are results (some scripts also print text)
                print(record, flush=True)
                sink.write(record + "\n")
                sink.flush()
            if proc.wait() != 0:
                failed.append(f"{step.name} (threads={step.threads}, exit {proc.returncode})")
    markdown = args.out / f"results-{stamp}.md"
    markdown.write_text(report.render(report.load([jsonl])))
    _harness.log(
        f"run_all: done in {time.perf_counter() - t_start:.0f} s; results in {jsonl}, tables in"
        f" {markdown}"
    )
    if failed:
        _harness.log("run_all: failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
