"""Smoke tests of the STDP examples and benchmark: they run and print plausible JSON.

Short runs only (`--quick`, short durations, `--no-peers`); the numbers of the full runs are in
the scripts' docstrings and the benchmark report. The Brian2 peer test builds two C++ binaries
and is marked slow.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines, "no output on stdout"
    return [json.loads(line) for line in lines]  # every stdout line is one JSON object


def test_stdp_song_short_run(tmp_path):
    out = tmp_path / "song.png"
    (r,) = _run("benchmarks.examples.stdp_song", "--duration", "0.5", "--out", str(out))
    assert r["bench"] == "stdp_song" and r["steps"] == 5000 and r["n_inputs"] == 1000
    assert out.is_file() and out.stat().st_size > 0 and r["figure"] == str(out)
    # 7500 input spikes expected (Poisson, sd ~87).
    assert r["rate_in_hz"] == pytest.approx(15.0, rel=0.06)
    # The neuron is driven well above threshold at first (Brian2's example: ~35-40 Hz).
    assert 10.0 < r["rate_out_hz"] < 80.0
    for key in ("frac_low", "frac_high", "frac_low_initial", "frac_high_initial"):
        assert 0.0 <= r[key] <= 1.0
    # Initial weights are uniform in [0, gmax]: about 10 % in each end bin.
    assert 0.05 < r["frac_low_initial"] < 0.15 and 0.05 < r["frac_high_initial"] < 0.15
    assert 0.0 <= r["mean_w_over_gmax"] <= 1.0
    assert isinstance(r["bimodal"], bool) and r["wall_s"] > 0


def test_stdp_learn_rule_quick(tmp_path):
    out = tmp_path / "learn.png"
    (r,) = _run(
        "benchmarks.examples.stdp_learn_rule",
        "--quick",
        "--iters",
        "5",
        "--duration",
        "100",
        "--out",
        str(out),
    )
    assert r["bench"] == "stdp_learn_rule" and r["iters"] == 5 and out.is_file()
    losses = r["losses"]
    assert len(losses) == r["iters"] + 1
    assert losses[-1] < losses[0]
    assert r["loss_initial"] == losses[0] and r["loss_final"] == losses[-1]
    assert r["a_plus"] > 0 and r["a_minus"] > 0
    # Towards the target (0.65, above the initial 0.5): potentiation up, depression down.
    assert r["a_plus"] > r["a_plus_initial"] and r["a_minus"] < r["a_minus_initial"]
    # The gradient of the mean weight agrees with central finite differences.
    for auto, fd in zip(r["dmean_dlog_a_autodiff"], r["dmean_dlog_a_fd"], strict=True):
        assert auto == pytest.approx(fd, rel=0.2)
    assert r["dmean_dlog_a_autodiff"][0] > 0 > r["dmean_dlog_a_autodiff"][1]


def _check_coba(r: dict) -> None:
    assert 10.0 < r["rate_exc_hz"] < 40.0 and 10.0 < r["rate_inh_hz"] < 40.0
    assert r["run_s"] > 0 and r["repeats"] >= 1


def test_stdp_overhead_quick():
    records = _run("benchmarks.stdp_overhead", "--quick", "--no-peers", "--repeats", "2")
    assert [(r["impl"], r.get("stdp"), r.get("measure")) for r in records] == [
        ("neurojax", False, None),
        ("neurojax", True, None),
        ("neurojax", None, "interleaved"),
    ]
    static, plastic, pairs = records
    assert pairs["pairs"] == 3 and len(pairs["static_times_s"]) == len(pairs["stdp_times_s"]) == 3
    ratios = np.asarray(pairs["stdp_times_s"]) / np.asarray(pairs["static_times_s"])
    assert pairs["stdp_over_static_paired"] == pytest.approx(float(np.median(ratios)))
    assert pairs["stdp_over_static_medians"] == pytest.approx(
        pairs["stdp_run_s"] / pairs["static_run_s"]
    )
    records = records[:2]
    for r in records:
        assert r["bench"] == "stdp_overhead" and r["steps"] == 1000
        assert r["n_synapses"] == static["n_synapses"]
        _check_coba(r)
    assert static["n_plastic"] == 0 and 150_000 < plastic["n_plastic"] < 260_000
    # 100 ms with a_plus = 0.006: the weights spread a little around 0.6, inside the bounds.
    assert plastic["w_ee_mean"] == pytest.approx(0.6, abs=0.01)
    assert 0.0 < plastic["w_ee_std"] < 0.1
    assert plastic["w_ee_frac_min"] == 0.0 and plastic["w_ee_frac_max"] == 0.0
    assert plastic["stdp_over_static"] == pytest.approx(plastic["run_s"] / static["run_s"])


@pytest.mark.slow
def test_stdp_overhead_brian2_peer():
    pytest.importorskip("brian2")
    records = _run("benchmarks.stdp_overhead", "--quick", "--repeats", "1")
    peers = [r for r in records if r["impl"] == "brian2_standalone"]
    assert [r["stdp"] for r in peers] == [False, True]
    for r in peers:
        assert "error" not in r, r.get("error")
        _check_coba(r)
        assert r["neurojax_over_peer"] > 0
    assert peers[0]["n_plastic"] == 0 and 150_000 < peers[1]["n_plastic"] < 260_000
    assert peers[1]["w_ee_mean"] == pytest.approx(0.6, abs=0.01)
    assert peers[1]["stdp_over_static"] > 0
