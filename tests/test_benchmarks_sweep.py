"""Smoke test of the COBA sweep benchmark (`benchmarks.sweep`, issue 7).

`--quick` runs a 500-neuron COBA network for 50 ms over a 4 x 4 grid of conductance scales.
The test checks that every stdout line is one JSON object, that every configuration ran with
positive times, and that the numbers come from the computation they claim: the sweep's spike
counts equal a loop of single trials, trial for trial, and the firing rate grows with the
excitatory and falls with the inhibitory conductance.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import sweep

ROOT = Path(__file__).resolve().parent.parent


def test_scales_hold_the_published_parameters():
    assert sweep.scales(8) == [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
    assert 1.0 in sweep.scales(sweep.QUICK_GRID)


@pytest.mark.slow
def test_sweep_quick_prints_valid_json():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep", "--quick", "--repeats", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines, "no output on stdout"
    records = [json.loads(line) for line in lines]  # progress goes to stderr
    assert all(r["bench"] == "sweep" for r in records)
    configs = [(r["config"], r.get("batch_size"), r.get("batch_block")) for r in records]
    assert configs == [
        ("single", None, None),
        ("loop", None, None),
        ("sweep", None, None),
        ("sweep", 4, None),
        ("sweep", 8, None),
        ("state_batch", None, None),
        ("state_batch", None, 4),
        ("state_batch_params", None, None),
        ("weights_sweep", None, None),
    ]
    n = sweep.QUICK_GRID**2
    single = records[0]
    for r in records:
        assert r["steps"] == 500 and r["n_neurons"] == 500
        assert r["repeats"] >= 1 and len(r["times_s"]) == r["repeats"]
        assert 0 < r["run_min_s"] <= r["run_s"] <= max(r["times_s"])
        assert r["run_per_trial_s"] == pytest.approx(r["run_s"] / r["trials"])
        assert r["per_trial_over_single"] == pytest.approx(r["run_per_trial_s"] / single["run_s"])
        assert r["meets_target"] == (r["per_trial_over_single"] <= sweep.TARGET)
        assert len(r["rate_hz"]) == r["trials"]
        assert all(0 < x < 200 for x in r["rate_hz"])
    assert single["compile_s"] > 0 and single["trials"] == 1
    for r in records[1:]:
        assert r["trials"] == (sweep.QUICK_WEIGHT_TRIALS if r["config"] == "weights_sweep" else n)

    # The sweeps compute what a loop of single trials computes, bit for bit.
    loop = records[1]
    for r in records:
        if r["config"] in ("sweep", "state_batch_params"):
            assert r["equal_to_loop"] is True, r
            assert r["rate_hz"] == loop["rate_hz"]
    # The grid is row-major over g_exc, then g_inh: rates rise with excitation and fall
    # with inhibition (averaged over the other axis, so that chance cannot flip the sign).
    rate = np.array(loop["rate_hz"]).reshape(sweep.QUICK_GRID, sweep.QUICK_GRID)
    g_exc = np.array(loop["params"]["g_exc"]).reshape(rate.shape)
    assert np.all(g_exc[:, :1] == g_exc)  # g_exc constant along a row
    assert rate.mean(axis=1)[-1] > rate.mean(axis=1)[0]
    assert rate.mean(axis=0)[-1] < rate.mean(axis=0)[0]
    # Scaling the weights instead of the outputs gives the same network statistically.
    w = records[-1]
    assert np.mean(w["rate_hz"]) == pytest.approx(np.mean(w["output_scaled_rate_hz"]), rel=0.3)
