"""The training examples learn: digits classification and an E/I rate fit.

Quick runs (`--quick`, about 10-15 s each) call the examples' `main` in this process, so that
they run under the test session's strict dtype promotion and warnings-as-errors; the full
runs (marked slow) run the scripts as subprocesses, as a user would, and check the numbers
quoted in their docstrings.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_script(name: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"--json should print one line, got {len(lines)}"
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def digits():
    return _load("train_digits")


@pytest.fixture(scope="module")
def ei():
    return _load("fit_ei_rates")


# ---------------------------------------------------------------------- digits


def test_digits_split_is_stratified_and_seeded(digits):
    (x_tr, y_tr), (x_te, y_te) = digits.load_data(0)
    assert x_tr.shape == (1437, 64) and x_te.shape == (360, 64)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int32
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0
    # Stratified: every class holds 36 +- 1 of the 360 test digits.
    counts = np.bincount(y_te, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    (x_tr2, _), _ = digits.load_data(0)
    np.testing.assert_array_equal(x_tr, x_tr2)


def test_digits_quick_run_learns(digits, capsys):
    r = digits.main(["--quick", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["test_acc"] == pytest.approx(r["test_acc"])
    assert r["epochs"] == 3 and len(r["history"]) == 3
    assert r["steps"] == 40 and r["hidden"] == 256
    # Chance is 0.1; three epochs reach 0.92-0.94 over seeds 0-3.
    assert r["test_acc"] > 0.8 and r["train_acc"] > 0.8
    losses = [h["loss"] for h in r["history"]]
    assert losses[-1] < 0.5 * losses[0]


def test_digits_rejects_bad_arguments(digits):
    for argv in (["--epochs", "0"], ["--steps", "0"], ["--hidden", "-1"], ["--lr", "0"]):
        with pytest.raises(SystemExit):
            digits.main(argv)


@pytest.mark.slow
def test_digits_full_run_reaches_93_percent(tmp_path):
    fig = tmp_path / "digits.png"
    r = _run_script("train_digits", "--plot", str(fig))
    assert fig.is_file() and fig.stat().st_size > 10_000
    assert r["epochs"] == 30 and len(r["history"]) == 30
    assert r["test_acc"] >= 0.93
    assert r["train_acc"] >= 0.95


# ---------------------------------------------------------------------- E/I rates


def test_ei_gradient_reaches_both_input_projections(ei):
    import jax
    import jax.numpy as jnp
    import jax.random as jr

    net = ei.build(0)
    params = {
        "E": jnp.full((ei.N_X, ei.N_E), float(np.log(ei.W_IN0)), jnp.float32),
        "I": jnp.full((ei.N_X, ei.N_I), float(np.log(ei.W_IN0)), jnp.float32),
    }

    def rates(p):
        r = ei.population_rates(net, p, jr.key(3), 100, 2)
        return jnp.stack([r["E"], r["I"]])

    jac = jax.jacrev(rates)(params)  # {"E": (2, n_x, n_e), "I": (2, n_x, n_i)}
    masks = {q: np.asarray(net.projections[i].matrix) != 0 for i, q in enumerate("EI")}
    for row, pop in enumerate(("E", "I")):
        for q in ("E", "I"):
            g = np.asarray(jac[q][row])
            assert np.all(np.isfinite(g))
            assert np.all(g[~masks[q]] == 0.0)  # no gradient off the synapses
        # Stronger input onto a population raises its rate.
        assert np.asarray(jac[pop][row])[masks[pop]].sum() > 0


def test_ei_quick_fit_reaches_the_targets(ei, tmp_path, capsys):
    fig = tmp_path / "ei.png"
    r = ei.main(["--quick", "--json", "--plot", str(fig)])
    json.loads(capsys.readouterr().out)
    assert r["steps"] == 80 and len(r["history"]) == 80
    # The start is far from the targets (E 5 Hz, I 15 Hz) ...
    assert r["rate_E_first"] > 20.0 and r["rate_I_first"] > 30.0
    # ... and the held-out rates after fitting are close to them (seeds 0-2: within 0.25 Hz).
    assert abs(r["rate_E_final"] - 5.0) < 1.0
    assert abs(r["rate_I_final"] - 15.0) < 2.0
    assert r["loss_last"] <= 0.5 * r["loss_first"]
    late = np.mean([h["loss"] for h in r["history"][-10:]])
    assert late < 0.01 * r["loss_first"]
    assert 0.0 < r["w_in_mean_E"] < ei.W_IN0 and 0.0 < r["w_in_mean_I"] < ei.W_IN0
    assert fig.is_file() and fig.stat().st_size > 10_000


@pytest.mark.slow
def test_ei_full_run_matches_the_targets():
    r = _run_script("fit_ei_rates")
    assert r["steps"] == 150
    assert abs(r["rate_E_final"] - 5.0) < 0.5
    assert abs(r["rate_I_final"] - 15.0) < 1.0
    assert r["loss_last"] < 0.01 * r["loss_first"]
