"""`benchmarks.run_all`: which scripts it runs and with which arguments (no benchmark runs).

The plan is checked against the files of `benchmarks/` and the scripts' own parsers: every
top-level script is run or left out with a reason, the quick plan passes each script its
small configuration, and the arguments of the scripts with their own command lines are
accepted by those command lines (`--help` of each is not enough: the arguments are parsed).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run_all

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _scripts() -> set[str]:
    """Top-level modules of `benchmarks/` that are scripts (not the harness or run_all)."""
    return {
        p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and p.stem != "run_all"
    }


def test_every_script_is_run_or_left_out_with_a_reason():
    listed = set(run_all.BENCHMARKS) | set(run_all.NOT_RUN)
    assert sorted(_scripts() - listed) == [], (
        "scripts of benchmarks/ that run_all neither runs nor leaves out: add each to "
        "BENCHMARKS (a timing script) or NOT_RUN with a reason, or move it to "
        "benchmarks/examples, reference or tools"
    )
    assert sorted(listed - _scripts()) == []
    assert not set(run_all.BENCHMARKS) & set(run_all.NOT_RUN)
    assert len(set(run_all.BENCHMARKS)) == len(run_all.BENCHMARKS)
    assert set(run_all.HARNESS) | set(run_all.OWN) == set(run_all.BENCHMARKS)
    assert not set(run_all.HARNESS) & set(run_all.OWN)


def test_harness_scripts_are_the_ones_that_parse_with_the_harness():
    for name in run_all.BENCHMARKS:
        uses = "_harness.parse_args(" in (BENCH / f"{name}.py").read_text(encoding="utf-8")
        assert uses == (name in run_all.HARNESS), name


def test_neurojax_bench_reads_the_list_without_importing():
    from neurojax import _cli_bench

    assert _cli_bench._names(ROOT) == run_all.BENCHMARKS


def _plan(*argv, settings=(1,), quick=True, only=None):
    machine = {t: Path(f"/m{t}.json") for t in settings}
    return run_all.plan(
        tuple(only or run_all.BENCHMARKS),
        settings,
        quick=quick,
        passthrough=list(argv),
        machine_file=machine,
    )


def test_quick_plan():
    steps = _plan("--no-peers")
    assert [s.name for s in steps] == list(run_all.BENCHMARKS)
    by_name = {s.name: s.args for s in steps}
    assert by_name["hh_batch"] == (
        "benchmarks.hh_batch",
        "--threads",
        "1",
        "--machine",
        "/m1.json",
        "--no-peers",
        "--quick",
    )
    assert by_name["memory_stages"] == (
        "benchmarks.memory_stages",
        "--scale",
        "0.02",
        "--steps",
        "200",
    )
    assert by_name["microcircuit"][-4:] == ("--threads", "1", "--peers", "neurojax")
    assert by_name["time_to_result"][-1] == "--no-peers"
    assert "--no-peers" not in by_name["procedural"]  # no peers to leave out


def test_full_plan_runs_thread_settings_and_own_scripts_once():
    steps = _plan(settings=(1, 2), quick=False)
    names_2 = [s.name for s in steps if s.threads == 2]
    assert "hh_batch" in names_2 and "connect_scale" in names_2
    assert "procedural" not in names_2 and "threads_default" not in names_2
    assert all(len([s for s in steps if s.name == n]) == 1 for n in ("procedural", "memory_stages"))
    full = {s.name: s.args for s in steps if s.threads == 1}
    assert full["microcircuit"] == (
        "benchmarks.microcircuit",
        *run_all.OWN["microcircuit"].full,
        "--threads",
        "1",
    )
    assert "--quick" not in full["hh_batch"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "hh_batch,nope"], "--only must name benchmarks from"),
        (["--sizes", "10"], "--sizes differ between benchmarks"),
        (["--repeats", "2"], "have their own command lines: leave those out with --only"),
    ],
)
def test_bad_flags_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        run_all.main([*argv, "--dry-run"])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_dry_run_prints_the_plan(capsys):
    assert run_all.main(["--quick", "--dry-run", "--only", "hh_batch,vmap_cost"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("threads=1: python -m benchmarks.hh_batch --threads 1 --machine")
    assert out[0].endswith("--quick")
    assert (
        out[1]
        == "threads=1: python -m benchmarks.vmap_cost --steps 200 --batch 2 --repeats 1 --threads 1"
    )


def test_record_tags_untagged_json_lines():
    assert run_all._record('{"x": 1}\n', "vmap_cost") == '{"x": 1, "bench": "vmap_cost"}'
    assert run_all._record('{"bench": "a"}', "b") == '{"bench": "a"}'
    assert run_all._record("RESULT done\n", "b") is None
    assert run_all._record("[1, 2]", "b") is None


def _own_parser_accepts(name: str, args: tuple[str, ...]) -> None:
    """Parse `args` with the script's own `argparse` parser, without running the script.

    The parser is built inside each script's `main`; `parse_args` is intercepted to raise
    once it has parsed, so nothing after it runs.
    """
    code = (
        "import argparse, sys\n"
        "class Parsed(Exception): pass\n"
        "orig = argparse.ArgumentParser.parse_args\n"
        "def parse(self, args=None, namespace=None):\n"
        "    orig(self, args, namespace)\n"
        "    raise Parsed\n"
        "argparse.ArgumentParser.parse_args = parse\n"
        f"import benchmarks.{name} as m\n"
        "try:\n"
        f"    m.main({list(args)!r})\n"
        "except Parsed:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{name} {args}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize("name", sorted(run_all.OWN))
def test_own_scripts_accept_their_quick_and_full_arguments(name):
    own = run_all.OWN[name]
    for args in (own.quick, own.full):
        extra = ("--threads", "1") if own.threads else ()
        _own_parser_accepts(name, (*args, *extra, *(own.no_peers or ())))


def test_bench_list_is_a_literal_tuple():
    tree = ast.parse((BENCH / "run_all.py").read_text(encoding="utf-8"))
    (node,) = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(getattr(t, "id", "") == "BENCHMARKS" for t in n.targets)
    ]
    assert isinstance(node.value, ast.Tuple)


def test_report_table_keeps_one_line_per_record():
    from benchmarks.tools import report

    records = [
        {"bench": "procedural", "case": "coba", "error": "Traceback ...\n  x\nValueError: a | b\n"},
        {"bench": "procedural", "case": "big", "error": None},
    ]
    text = report.render(records)
    table = text[text.index("### procedural") :].strip().splitlines()
    assert table[1:] == [
        "",
        "| case | error |",
        "|---|---|",
        "| coba | ValueError: a \\| b |",
        "| big | - |",
    ]
