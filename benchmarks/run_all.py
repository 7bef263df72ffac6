"""Run every benchmark and collect their JSON lines (what `make bench` runs).

For each thread setting the machine's limits are measured once (`benchmarks.machine`) and
every benchmark runs in its own process with `--machine FILE --threads T` plus the flags
given here (`--quick`, `--repeats R`, `--no-peers`, `--budget S`; `--sizes` only together
with `--only`, since sizes differ between benchmarks). JSON lines are echoed to stdout and
written, with a Markdown rendering of the tables and targets (`benchmarks.report`), to
`--out` (default `benchmarks/out/`, ignored by git).

`--quick` is a smoke run (small sizes, one thread setting) that finishes in a few minutes;
the full run (both thread settings, all peers) takes on the order of an hour on two cores
(the training benchmark alone about 20 minutes).

Run: `python -m benchmarks.run_all [--quick] [--threads 1|2|both] [--only hh_batch,...]
[--no-peers] [--repeats R] [--out DIR]`.
"""

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

from . import _harness, report

BENCHMARKS = (
    "lif_population",
    "hh_batch",
    "brette_networks",
    "network_scale",
    "stdp_overhead",
    "assembly",
    "training",
    "parallel_scaling",
    "sweep",
)


def main(argv: list[str] | None = None) -> int:
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
    args, passthrough = parser.parse_known_args(argv)
    only = BENCHMARKS if args.only is None else tuple(args.only.split(","))
    unknown = [b for b in only if b not in BENCHMARKS]
    if unknown:
        parser.error(f"--only must name benchmarks from {BENCHMARKS}, got {unknown}")
    if "--sizes" in " ".join(passthrough) and len(only) != 1:
        parser.error("--sizes differ between benchmarks: use it together with --only NAME")
    threads = args.threads or ("1" if args.quick else "both")
    settings = (1, 2) if threads == "both" else (int(threads),)
    extra = passthrough + (["--quick"] if args.quick else [])

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    jsonl = args.out / f"results-{stamp}.jsonl"
    t_start = time.perf_counter()
    failed = []
    with jsonl.open("w") as sink:
        for t in settings:
            machine_file = args.out / f"machine-{stamp}-t{t}.json"
            cmd = [sys.executable, "-m", "benchmarks.machine", "--threads", str(t)]
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
            machine_file.write_text(line + "\n")
            print(line, flush=True)
            sink.write(line + "\n")
            for name in only:
                cmd = [sys.executable, "-m", f"benchmarks.{name}", "--threads", str(t)]
                cmd += ["--machine", str(machine_file), *extra]
                _harness.log(f"run_all: {' '.join(cmd[1:])}")
                proc = subprocess.Popen(
                    cmd,
                    cwd=_harness.REPO_ROOT,
                    env=_harness.thread_env(t),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert proc.stdout is not None
                for out_line in proc.stdout:
                    print(out_line, end="", flush=True)
                    sink.write(out_line)
                    sink.flush()
                if proc.wait() != 0:
                    failed.append(f"{name} (threads={t}, exit {proc.returncode})")
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
