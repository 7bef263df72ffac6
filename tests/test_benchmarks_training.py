"""Tests of the training benchmark (`benchmarks.training`) and its peers.

The benchmark times one forward and backward pass of a dense layer of LIF neurons in neurojax,
snnTorch, Norse and Spyx. These tests check that its quick run prints well-formed JSON with
positive times, and that the frameworks it compares really compute the same layer: on a tiny
input neurojax's spike raster equals a plain NumPy implementation of the same recursion and
snnTorch's and Norse's rasters, and its weight gradient equals snnTorch's.
"""

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from benchmarks import training

ROOT = Path(__file__).resolve().parent.parent


def _run(*flags: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.training", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines, "no output on stdout"
    return [json.loads(line) for line in lines]


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _check_timing(r: dict) -> None:
    assert r["repeats"] >= 1 and len(r["times_s"]) == r["repeats"]
    assert 0 < r["run_min_s"] <= r["run_s"] <= max(r["times_s"])
    assert r["compile_s"] is not None and r["compile_s"] >= 0


def _numpy_lif(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Spikes of the benchmark's layer, neurojax's update order, in float32 NumPy."""
    decay = np.exp(np.float32(-training.DT) / np.float32(training.TAU))
    currents = x @ w
    v = np.zeros(currents.shape[1:], np.float32)
    spikes = np.zeros(currents.shape, np.float32)
    for t, i in enumerate(currents):
        v = i + (v - i) * decay
        s = v >= np.float32(training.V_TH)
        spikes[t] = s
        v[s] = 0.0
    return spikes


def _neurojax(x: np.ndarray, w: np.ndarray):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    layer = training.neurojax_layer(w)
    xj = jnp.asarray(x, jnp.float32)
    spikes = layer(xj, dt=training.DT)

    def loss(weight):
        return training.neurojax_loss(eqx.tree_at(lambda m: m.weight, layer, weight), xj)

    return np.asarray(spikes), np.asarray(jax.grad(loss)(layer.weight))


def test_problem_is_deterministic_float32():
    x1, w1 = training.problem(16, batch=2, steps=5, seed=3)
    x2, w2 = training.problem(16, batch=2, steps=5, seed=3)
    assert x1.dtype == np.float32 and w1.dtype == np.float32
    assert x1.shape == (5, 2, 16) and w1.shape == (16, 16)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(w1, w2)
    assert set(np.unique(x1)) <= {0.0, 1.0}
    assert training.matmul_flops(16, 2, 5) == 4 * 5 * 2 * 16 * 16


def test_neurojax_layer_matches_numpy_recursion():
    x, w = training.problem(32, batch=4, steps=100, seed=1)
    spikes, _ = _neurojax(x, w)
    reference = _numpy_lif(x, w)
    assert 0.01 < reference.mean() < 0.3  # the problem actually spikes
    np.testing.assert_array_equal(spikes, reference)


def test_neurojax_layer_matches_snntorch_and_norse():
    torch = pytest.importorskip("torch")
    pytest.importorskip("snntorch")
    from benchmarks.peers import snn_torch

    x, w = training.problem(32, batch=4, steps=100, seed=1)
    nj_spikes, nj_grad = _neurojax(x, w)
    xt = torch.from_numpy(x)
    for variant in ("loop", "hoisted"):
        fc, neuron = snn_torch.build("snntorch", w, beta=training.BETA)
        spikes = snn_torch.forward("snntorch", variant, fc, neuron, xt)
        np.testing.assert_array_equal(spikes.detach().numpy(), nj_spikes)
        spikes.sum().backward()
        # snnTorch's Linear holds (1 - beta) W: its gradient is dL/dW / (1 - beta).
        grad = fc.weight.grad.numpy().T * np.float32(1.0 - training.BETA)
        np.testing.assert_allclose(grad, nj_grad, rtol=1e-4, atol=1e-4 * np.abs(nj_grad).max())
    try:
        with warnings.catch_warnings():  # norse 1.1 calls the deprecated torch.jit.script
            warnings.simplefilter("ignore", DeprecationWarning)
            import norse.torch  # noqa: F401
    except ImportError:
        return
    for variant in ("loop", "hoisted"):
        fc, neuron = snn_torch.build("norse", w, beta=training.BETA)
        spikes = snn_torch.forward("norse", variant, fc, neuron, xt)
        np.testing.assert_array_equal(spikes.detach().numpy(), nj_spikes)


def test_training_quick_prints_valid_json():
    records = _run("--quick", "--no-peers", "--repeats", "2")
    machine = [r for r in records if r["bench"] == "machine"]
    assert len(machine) == 1 and machine[0]["peak_flops"] > 0
    runs = [r for r in records if r["bench"] == "training"]
    assert [(r["impl"], r["variant"], r["n"]) for r in runs] == [
        ("neurojax", "default", 512),
        ("neurojax", "checkpoint", 512),
        ("neurojax", "sparse_input", 512),
    ]
    x, w = training.problem(512, steps=100)
    n_ref = _numpy_lif(x, w).sum()
    for r in runs:
        assert r["steps"] == 100 and r["batch"] == 16 and r["dtype"] == "float32"
        _check_timing(r)
        assert r["compile_s"] > 0
        assert r["matmul_flops"] == training.matmul_flops(512, 16, 100)
        assert r["matmul_flops_per_s"] == pytest.approx(r["matmul_flops"] / r["run_s"])
        assert 0 < r["frac_peak_flops"]
        assert r["xla_temp_bytes"] > 0 and r["grad_norm"] > 0
        assert r["xla_matmul_floor_s"] > 0 and r["sparse_matmul_floor_s"] > 0
        # Up to XLA's and NumPy's rounding of the 512-term products, which can move a
        # spike of a neuron sitting at threshold: 0.1 %.
        assert r["n_spikes"] == pytest.approx(n_ref, rel=1e-3)
    # Rematerialising changes the memory and time, not the result.
    assert runs[1]["n_spikes"] == runs[0]["n_spikes"]
    assert runs[1]["grad_norm"] == pytest.approx(runs[0]["grad_norm"], rel=1e-5)
    assert runs[1]["over_neurojax"] == pytest.approx(runs[1]["run_s"] / runs[0]["run_s"])
    # The sparse input product computes the same products up to rounding.
    assert runs[2]["n_spikes"] == pytest.approx(runs[0]["n_spikes"], rel=1e-4)
    assert runs[2]["grad_norm"] == pytest.approx(runs[0]["grad_norm"], rel=1e-4)
    assert "sparse_input=True" in runs[2]["note"]


@pytest.mark.slow
def test_training_peers_tiny_prints_valid_json():
    records = _run("--quick", "--sizes", "64", "--steps", "50", "--repeats", "1")
    runs = {(r["impl"], r["variant"]): r for r in records if r["bench"] == "training"}
    assert set(runs) == {
        ("neurojax", "default"),
        ("neurojax", "checkpoint"),
        ("neurojax", "sparse_input"),
        ("snntorch", "loop"),
        ("snntorch", "hoisted"),
        ("norse", "loop"),
        ("norse", "hoisted"),
        ("spyx", "scan"),
        ("spyx", "hoisted"),
    }
    ref = runs["neurojax", "default"]
    for key, r in runs.items():
        if "error" in r:
            # A peer that is not installed is reported, not fatal; snnTorch must run
            # wherever torch and snntorch are installed (the peers' own environment).
            assert "No module named" in r["error"], r["error"]
            if key[0] == "snntorch":
                assert not _importable("torch") or not _importable("snntorch"), r["error"]
            continue
        _check_timing(r)
        assert r["over_neurojax" if key != ("neurojax", "default") else "run_s"] > 0
        if key[0] != "neurojax":
            assert r["over_neurojax_sparse"] > 0
        assert r["peak_rss_delta_bytes"] is None or r["peak_rss_delta_bytes"] >= 0
        if key[0] in ("snntorch", "norse"):
            assert r["n_spikes"] == ref["n_spikes"]
        if key[0] == "snntorch":
            assert r["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        if key[0] == "spyx":
            # Subtractive reset and a one-step output delay: close, not equal.
            assert r["n_spikes"] == pytest.approx(ref["n_spikes"], rel=0.3)
