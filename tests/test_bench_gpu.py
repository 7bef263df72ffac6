"""Smoke test of `benchmarks/gpu.py`: `--quick` runs every section and writes valid JSON lines.

Without a GPU the neurojax sections run on JAX's CPU backend at tiny sizes; the peers either
run on the CPU, record `"skipped: no GPU"` (CuPy) or record the `error` of a missing package.
The test checks the set of sections, the fields of each neurojax figure, that every number
is finite, and the time-limit arithmetic.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu

ROOT = Path(__file__).resolve().parent.parent

# The fields each neurojax section's figures must carry (besides section/figure/impl/status).
FIELDS = {
    "machine": {
        "platform",
        "device_kind",
        "matmul_f32_flops",
        "matmul_default_flops",
        "triad_bytes_per_s",
    },
    "scan_floor": {"steps", "us_per_step", "run_s", "compile_s", "times_s"},
    "coba_one": {
        "run_s",
        "record_every",
        "steps",
        "rate_hz",
        "rate_exc_hz",
        "rate_inh_hz",
        "n_synapses",
        "compile_s",
    },
    "coba_batch": {"batch", "run_s", "run_per_trial_s", "rate_hz"},
    "coba_stdp": {"run_s", "rate_hz", "n_plastic", "w_ee_mean", "stdp_over_static"},
    "network_scale": {"n", "n_synapses", "run_s", "rate_hz", "connect_s", "steps_per_s"},
    "hh": {"n", "steps", "run_s", "n_spikes", "neuron_steps_per_s"},
    "lif": {"n", "steps", "run_s", "updates_per_s", "rate_hz"},
    "assembly": {"n", "k", "steps", "run_s"},
    "training": {"n", "batch", "steps", "run_s", "n_spikes", "grad_norm"},
    "coba_scales": {"scale", "n_neurons", "run_s", "rate_hz"},
}
FIGURES = {
    "scan_floor": {"scalar", "vector_4000"},
    "coba_one": {"record_every_1", "record_every_10"},
    "coba_batch": {f"batch_{b}" for b in gpu.QUICK["coba_batches"]},
    "assembly": {"one_brain", f"batch_{gpu.QUICK['assembly_batch']}"},
}


def _numbers(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


def test_effective_limit_keeps_the_later_sections_minimum():
    names = ["machine", "scan_floor", "peer_cupy_hh"]
    now = 1000.0
    later = gpu.BY_NAME["scan_floor"].floor_s + gpu.BY_NAME["peer_cupy_hh"].floor_s
    # Plenty of time: the section's own limit.
    assert gpu.effective_limit("machine", now, now + 1e4, False, names) == (
        gpu.BY_NAME["machine"].limit_s
    )
    # Little time: what is left once the later sections' minimums are set aside.
    assert gpu.effective_limit("machine", now, now + later + 3.0, False, names) == 3.0
    assert gpu.effective_limit("peer_cupy_hh", now, now + 4.0, False, names) == 4.0


def test_a_section_past_its_limit_is_abandoned_and_the_run_goes_on(tmp_path):
    # `--stall` makes the child hang in a section; a budget of 9 s leaves the first section
    # 4 s (5 s are kept for the second) and the second what remains.
    out = tmp_path / "gpu"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--quick",
            "--out",
            str(out),
            "--sections",
            "scan_floor,hh",
            "--stall",
            "scan_floor",
            "--total",
            "9",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    status = {(r["section"], r["figure"]): r["status"] for r in records}
    assert status["scan_floor", "section"] == "abandoned"
    # The second section ran in a fresh child: done, or skipped when the budget ran out first
    # on a slow machine; either way it has a line and the run ended on time.
    assert status.get(("hh", f"n_{gpu.QUICK['hh_n']}")) == "ok" or status.get(
        ("hh", "section")
    ) in ("abandoned", "skipped")
    assert ("summary", "run") in status
    assert wall < 60


# About 40-70 s on the 2-core reference machine (every section compiles): too long for the
# default suite.
@pytest.mark.slow
def test_gpu_quick_writes_every_section(tmp_path):
    out = tmp_path / "gpu"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "log.txt").exists()
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    # stdout carries the same lines.
    assert [json.loads(line) for line in proc.stdout.splitlines()] == records
    assert wall < gpu.QUICK_TOTAL_S + 60

    by_section: dict[str, list[dict]] = {}
    for rec in records:
        assert {"section", "figure", "impl", "status"} <= rec.keys(), rec
        assert rec["status"] in ("ok", "error", "abandoned", "skipped"), rec
        for x in _numbers(rec):
            assert math.isfinite(x), rec
        by_section.setdefault(rec["section"], []).append(rec)

    for name, fields in FIELDS.items():
        recs = by_section.get(name, [])
        assert recs, f"no line for section {name}"
        for rec in recs:
            assert rec["status"] == "ok", rec
            missing = fields - rec.keys()
            assert not missing, f"{name}/{rec['figure']} lacks {missing}"
            assert all(rec[f] is not None for f in fields), rec
            if "run_s" in rec:
                assert rec["run_s"] > 0 and rec["repeats"] >= 1
        if name in FIGURES:
            assert {r["figure"] for r in recs} == FIGURES[name]
    assert by_section["machine"][0]["matmul_f32_flops"] > 0
    assert by_section["machine"][0]["neurojax_path"] == str(ROOT / "neurojax")
    for rec in by_section["coba_one"]:
        assert rec["rate_hz"] > 0
    one = {r["figure"]: r for r in by_section["assembly"]}["one_brain"]
    assert one["final_support"] >= gpu.QUICK["assembly_k"]

    peers = [s.name for s in gpu.SECTIONS if s.group != "neurojax"]
    for name in peers:
        recs = by_section.get(name, [])
        assert recs, f"no line for peer section {name}"
        for rec in recs:
            if rec["status"] == "error":
                assert isinstance(rec["error"], str) and rec["error"]
            elif rec["status"] == "ok":
                assert rec["run_s"] > 0
    if not gpu.cuda_present():
        (cupy,) = by_section["peer_cupy_hh"]
        assert cupy["status"] == "skipped" and cupy["reason"] == "skipped: no GPU"
    # Ratios are written only where a peer ran; each compares two positive times.
    for rec in by_section.get("ratio", []):
        assert rec["neurojax_over_peer"] == pytest.approx(rec["neurojax_s"] / rec["peer_s"])
    (summary,) = by_section["summary"]
    assert summary["sections"] == [s.name for s in gpu.SECTIONS]


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_the_kernel_counts(tmp_path):
    """`--dry-run` times nothing: the plan, the command-buffer variants' flags and the proxy
    kernel counts per step (COBA at most 6, three of them Triton kernels)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--dry-run", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    plan = [r["section"] for r in records if r["figure"] == "plan"]
    assert plan == [s.name for s in gpu.SECTIONS]
    flags = {r["figure"]: r["xla_flags"] for r in records if "xla_flags" in r}
    assert flags == {f"variant_{k}": v for k, v in gpu.STEP_CMDBUF_VARIANTS.items()}
    counts = {r["figure"]: r for r in records if r["section"] == "kernels_per_step"}
    assert counts["coba"]["kernels"] <= 6 and counts["coba"]["triton_kernels"] == 3
    assert counts["coba_stdp"]["kernels"] > counts["coba"]["kernels"]
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.slow
def test_command_buffer_flags_are_ones_this_xla_accepts():
    """Each `step_cmdbuf` variant's flag parses in this jaxlib's XLA (which checks the
    command types' names even on a CPU), and a misspelt type is refused: the check can fail."""

    def starts(flags: str) -> bool:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env["XLA_FLAGS"] = flags
        proc = subprocess.run(
            [sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1.0)"],
            env=env,
            capture_output=True,
            timeout=120,
        )
        return proc.returncode == 0

    for flag in gpu.STEP_CMDBUF_VARIANTS.values():
        assert starts(flag), flag
    assert not starts("--xla_gpu_enable_command_buffer=+WHILEE")
