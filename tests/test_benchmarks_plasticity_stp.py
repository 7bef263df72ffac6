"""The `stp_same_spikes` configuration of `benchmarks.plasticity_stp` (issue 26).

With `SAME_SPIKES` (u = 1, tau_rec = 0.01 ms, tau_facil = 0) every release must equal the
static weight, so the network must fire the static run's spikes exactly while the rule does
its work at every spike. Checked here against independent references: the release formula
evaluated in NumPy, the static run's raster, and the final Tsodyks-Markram state predicted
from that raster. The benchmark's own records and, when Brian2 is installed, its peer are
checked by the slow tests.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from benchmarks import plasticity_stp

ROOT = Path(__file__).resolve().parent.parent
DT = plasticity_stp.DT


def _release_after(tm, gaps):
    """Releases of a second spike `gaps[i]` steps after a first one from rest, one neuron
    per gap."""
    n = len(gaps)
    state = tm.init_state(n)
    ones = jnp.ones(n, jnp.float32)
    state, first = tm.release(state, ones, jnp.asarray(0, jnp.int32), DT)
    release = jax.jit(lambda s, step: tm.release(s, ones, step, DT)[1])
    # Neuron i spikes again at step gaps[i]: one call per distinct step, neuron i read there.
    out = np.empty(n, np.float32)
    for i, gap in enumerate(gaps):
        out[i] = np.asarray(release(state, jnp.asarray(gap, jnp.int32)))[i]
    return np.asarray(first), out


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_same_spikes_releases_equal_the_static_weight(mode):
    tm = nj.TsodyksMarkram(**plasticity_stp.SAME_SPIKES)
    gaps = np.arange(1, 81)
    with nj.kernels.use(mode):
        first, second = _release_after(tm, gaps)
    np.testing.assert_array_equal(first, 1.0)
    # Independent reference, float32 as in the network: u+ = 1, R- = 1 - exp(-gap dt / tau_rec).
    elapsed = gaps.astype(np.float32) * np.float32(DT)
    r_minus = np.float32(1) - np.exp(-elapsed * np.float32(1 / 0.01), dtype=np.float32)
    # std::exp and NumPy's may differ in the last bits where R- is not yet 1.
    np.testing.assert_allclose(second, r_minus, rtol=1e-6, atol=0)
    # R- is exactly 1 from 5 steps (0.5 ms) on; the refractory period is 10 times longer.
    np.testing.assert_array_equal(second[gaps >= 5], 1.0)
    assert second[0] < 1.0  # one step (10 tau_rec) is not enough: the check discriminates
    net, _ = nj.models.coba(jax.random.key(plasticity_stp.SEED))
    for name in ("E", "I"):
        assert float(net.populations[name].t_ref) >= 50 * DT


def test_same_spikes_run_fires_the_static_spikes():
    n_steps = int(round(plasticity_stp.QUICK_DURATION / DT))
    net, state = nj.models.coba(jax.random.key(plasticity_stp.SEED))
    run = jax.jit(lambda n, s: nj.simulate(n, s, dt=DT, n_steps=n_steps))
    _, static = run(net, state)
    static_e = np.asarray(static.spikes["E"])
    static_i = np.asarray(static.spikes["I"])
    assert static_e.sum() > 1000 and static_i.sum() > 100  # an active network

    same_net, same_state = plasticity_stp.with_projection0(
        net, state, short_term=nj.TsodyksMarkram(**plasticity_stp.SAME_SPIKES)
    )
    final, same = run(same_net, same_state)
    np.testing.assert_array_equal(np.asarray(same.spikes["E"]), static_e)
    np.testing.assert_array_equal(np.asarray(same.spikes["I"]), static_i)

    # The rule ran at every spike: the final state is that of each E neuron's last spike
    # (u+ = 1, R+ = 0, dated at the end of its step), rest for the silent ones.
    tm_state = final.short_term[0]
    spiked = static_e.any(axis=0)
    last = np.where(spiked, n_steps - np.argmax(static_e[::-1], axis=0), 0)
    np.testing.assert_array_equal(np.asarray(tm_state.last), last)
    np.testing.assert_array_equal(np.asarray(tm_state.u), np.where(spiked, 1.0, 0.0))
    np.testing.assert_array_equal(np.asarray(tm_state.r), np.where(spiked, 0.0, 1.0))

    # The same comparison separates the depressing preset's run from the static one.
    dep_net, dep_state = plasticity_stp.with_projection0(
        net, state, short_term=nj.TsodyksMarkram.preset("depressing")
    )
    _, dep = run(dep_net, dep_state)
    assert np.asarray(dep.spikes["E"]).sum() < 0.5 * static_e.sum()


@pytest.mark.slow
def test_quick_run_records_the_same_spikes_configuration():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.plasticity_stp",
            "--quick",
            "--no-peers",
            "--repeats",
            "1",
            "--pairs",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r.get("config", r.get("measure")) for r in records] == [
        "static",
        "stp",
        "learnable_delays",
        "stp_same_spikes",
        "interleaved",
    ]
    by_name = {r.get("config", r.get("measure")): r for r in records}
    static, same, stp = by_name["static"], by_name["stp_same_spikes"], by_name["stp"]
    assert same["spikes_equal_static"] is True
    assert same["stp_params"] == plasticity_stp.SAME_SPIKES
    assert stp["stp_params"] == {"u": 0.5, "tau_rec": 800.0, "tau_facil": 0.0}
    for key in ("n_spikes", "rate_exc_hz", "rate_inh_hz", "cv_isi"):
        assert same[key] == static[key]
    assert stp["n_spikes"] < static["n_spikes"]
    assert same["stp_same_spikes_over_static"] == pytest.approx(same["run_s"] / static["run_s"])

    inter = by_name["interleaved"]
    assert inter["pairs"] == 3
    for name in plasticity_stp.CONFIGS:
        assert len(inter[f"{name}_times_s"]) == 3
        assert inter[f"{name}_run_s"] == pytest.approx(np.median(inter[f"{name}_times_s"]))
    ratio = np.median(
        np.asarray(inter["stp_same_spikes_times_s"]) / np.asarray(inter["static_times_s"])
    )
    assert inter["stp_same_spikes_over_static_paired"] == pytest.approx(ratio)
    assert "interleaved stp_same_spikes / static" in proc.stderr


@pytest.mark.slow
def test_brian2_same_spikes_run_equals_its_static_run():
    pytest.importorskip("brian2")
    spec = {
        "model": "coba",
        "mode": "standalone",
        "threads": 1,
        "seed": plasticity_stp.SEED,
        "duration_ms": 50.0,
        "repeats": 1,
        "budget_s": 10.0,
    }
    results = {}
    for name, stp, params in (
        ("static", False, plasticity_stp.SAME_SPIKES),
        ("same", True, plasticity_stp.SAME_SPIKES),
        ("depressing", True, {"u": 0.5, "tau_rec": 800.0, "tau_facil": 0.0}),
    ):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.plasticity_stp",
                json.dumps({**spec, "stp": stp, "stp_params": params}),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(proc.stdout.splitlines()[-1])
    assert results["static"]["n_spikes"] > 1000
    for key in plasticity_stp.SAME_STATS:
        assert results["same"][key] == results["static"][key], key
    assert results["depressing"]["n_spikes"] != results["static"]["n_spikes"]
