"""The `neurojax` command line: `info`, `run hh`, argument validation and exit codes."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import neurojax as nj
from neurojax import cli


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m neurojax ARGS` in a fresh interpreter, as a user would run it.

    float32 unless `env` says otherwise, whatever the caller's environment, since the
    expected dtypes and tolerances below are those of float32.
    """
    full_env = {**os.environ, "JAX_ENABLE_X64": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "neurojax", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


# ---- info -----------------------------------------------------------------------------------


def test_info_prints_versions_devices_and_dtype():
    proc = run_cli("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"jax version          {jax.__version__}" in out
    assert f"neurojax version     {nj.__version__}" in out
    for name in ("jaxlib", "equinox", "optax", "numpy", "python"):
        assert f"{name} version" in out
    assert f"device count         {len(jax.devices())}" in out
    assert f"default backend      {jax.default_backend()}" in out
    assert "default float dtype  float32" in out


def test_info_json_is_one_object_and_follows_jax_enable_x64():
    proc = run_cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)  # fails unless stdout is exactly one JSON document
    assert info["versions"]["jax"] == jax.__version__
    assert info["versions"]["numpy"] == np.__version__
    assert info["device_count"] == len(info["devices"]) == len(jax.devices())
    assert {"id", "platform", "kind"} <= set(info["devices"][0])
    assert info["default_backend"] == jax.default_backend()
    assert info["default_float_dtype"] == "float32"

    proc64 = run_cli("info", "--json", env={"JAX_ENABLE_X64": "1"})
    assert proc64.returncode == 0, proc64.stderr
    info64 = json.loads(proc64.stdout)
    assert info64["default_float_dtype"] == "float64"
    assert info64["x64_enabled"] is True


# ---- run hh -----------------------------------------------------------------------------------


def hh_reference_spike_times(current: float, t_end: float) -> np.ndarray:
    """Upward 0 mV crossings of the classic HH model from rest, with scipy at rtol 1e-9.

    An independent re-implementation of the equations (Hodgkin and Huxley 1952, modern sign
    convention, rest near -65 mV): the gates start at their steady state at the resting
    potential, which is found by root finding.
    """
    from scipy.integrate import solve_ivp
    from scipy.optimize import brentq

    def rates(v):
        am = 0.1 * (v + 40.0) / (1.0 - np.exp(-(v + 40.0) / 10.0))
        bm = 4.0 * np.exp(-(v + 65.0) / 18.0)
        ah = 0.07 * np.exp(-(v + 65.0) / 20.0)
        bh = 1.0 / (1.0 + np.exp(-(v + 35.0) / 10.0))
        an = 0.01 * (v + 55.0) / (1.0 - np.exp(-(v + 55.0) / 10.0))
        bn = 0.125 * np.exp(-(v + 65.0) / 80.0)
        return am, bm, ah, bh, an, bn

    def rhs(t, y, i_ext):
        v, m, h, n = y
        am, bm, ah, bh, an, bn = rates(v)
        i_ion = 120.0 * m**3 * h * (v - 50.0) + 36.0 * n**4 * (v + 77.0) + 0.3 * (v + 54.387)
        return [i_ext - i_ion, am * (1 - m) - bm * m, ah * (1 - h) - bh * h, an * (1 - n) - bn * n]

    def gates(v):
        am, bm, ah, bh, an, bn = rates(v)
        return [am / (am + bm), ah / (ah + bh), an / (an + bn)]

    v_rest = brentq(lambda v: rhs(0.0, [v, *gates(v)], 0.0)[0], -70.0, -60.0)

    def crossing(t, y, i_ext):
        return y[0]

    crossing.direction = 1
    sol = solve_ivp(
        rhs,
        (0.0, t_end),
        [v_rest, *gates(v_rest)],
        args=(current,),
        events=crossing,
        rtol=1e-9,
        atol=1e-9,
        max_step=0.1,
    )
    return sol.t_events[0]


def test_run_hh_json_matches_reference_rates():
    proc = run_cli("run", "hh", "--duration", "200", "--batch", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)  # exactly one JSON object on stdout
    for key in (
        "model", "n_neurons", "duration_ms", "dt_ms", "method", "currents", "rates_hz",
        "spike_counts", "compile_s", "run_s",
    ):  # fmt: skip
        assert key in res
    assert res["model"] == "hh" and res["method"] == "rk4"
    assert res["n_neurons"] == 5 and res["duration_ms"] == 200.0 and res["dt_ms"] == 0.01
    np.testing.assert_allclose(res["currents"], [0.0, 5.0, 10.0, 15.0, 20.0])
    assert res["rate_window_ms"] == [100.0, 200.0]
    assert res["compile_s"] >= 0.0 and res["run_s"] > 0.0

    # REFERENCE.md: steady rate 68.3 Hz at 10 uA/cm^2 (ISI 14.64 ms). The CLI reports the
    # inverse mean interspike interval of the spikes in the window (100, 200] ms.
    i10 = res["currents"].index(10.0)
    assert res["rates_hz"][i10] == pytest.approx(68.3, abs=0.3)

    # The high-precision solve puts the spikes at 104.65, 119.29, ..., 192.47 ms: 7 in the
    # window, every one at least 4.6 ms from its edges, far more than the drift of RK4 at
    # dt = 0.01 ms in float32 over 200 ms (~0.1 ms), so counts must agree exactly for every
    # current, and the rate is (n - 1) / (t_last - t_first) of those spikes, to the dating of
    # a spike at the end of its step (dt = 0.01 ms on intervals of ~90 ms: 0.02 %). The first
    # spike is dated at the end of the step that crosses 0 mV, so it lies in [0, dt] after the
    # exact crossing; 0.002 ms of slack on each side covers the float32 RK4 error over 3 ms
    # (an off-by-one-step dating would land in [-dt, 0] and fail for most currents).
    for k, current in enumerate(res["currents"]):
        ref = hh_reference_spike_times(current, 200.0)
        assert res["spike_counts"][k] == ref.size, current
        late = ref[(ref > 100.0) & (ref <= 200.0)]
        want = (
            1000.0 * (late.size - 1) / (late[-1] - late[0]) if late.size >= 2 else 10.0 * late.size
        )
        assert res["rates_hz"][k] == pytest.approx(want, rel=2e-3, abs=1e-9), current
        if ref.size:
            assert -0.002 <= res["first_spike_ms"][k] - ref[0] <= 0.012, current
        else:
            assert res["first_spike_ms"][k] is None


def test_run_hh_f_i_curve_is_monotonic_above_threshold():
    # A count over the window made 19.0 uA/cm^2 fire slower than 18.5 (84 against 86 Hz);
    # the inverse mean interval grows with the current.
    proc = run_cli(
        "run", "hh", "--duration", "300", "--batch", "7", "--i-min", "16", "--i-max", "19",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rates = json.loads(proc.stdout)["rates_hz"]
    assert all(b > a for a, b in zip(rates, rates[1:])), rates


def test_run_hh_table_and_plot(tmp_path):
    png = tmp_path / "fi.png"
    proc = run_cli(
        "run", "hh", "--duration", "30", "--batch", "3", "--method", "exp_euler",
        "--plot", str(png),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "exp_euler" in out and "first spike [ms]" in out
    for label in ("neurons", "steps", "compile time", "run time", "steps/s", "neuron-steps/s"):
        assert f"\n{label} " in out
    assert "neurons         3\n" in out and "steps           3000\n" in out
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000


def test_run_hh_unstable_dt_fails_with_exit_1_and_no_json():
    # RK4 on HH is explicit and blows up far above its ~0.05 ms limit (the fastest time
    # constant at the spike peak is ~0.03 ms); the CLI must say so instead of printing NaNs.
    proc = run_cli("run", "hh", "--duration", "20", "--dt", "1", "--batch", "2", "--json")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "neurojax run hh: error: state field(s) v" in proc.stderr
    assert "became non-finite; --dt 1 ms is probably too large" in proc.stderr


# ---- argument validation --------------------------------------------------------------------

BAD_ARGUMENTS = [
    (["--duration", "-5"], r"argument --duration: must be a finite number > 0 \(ms\), got '-5'"),
    (["--duration", "0"], r"argument --duration: must be a finite number > 0 \(ms\), got '0'"),
    (["--duration", "inf"], r"argument --duration: must be a finite number > 0 \(ms\), got 'inf'"),
    (["--dt", "0"], r"argument --dt: must be a finite number > 0 \(ms\), got '0'"),
    (["--dt", "-0.1"], r"argument --dt: must be a finite number > 0 \(ms\), got '-0.1'"),
    (["--dt", "abc"], r"argument --dt: must be a number, got 'abc'"),
    (
        ["--duration", "1", "--dt", "0.3"],
        r"argument --duration: must be a positive whole multiple of --dt, got --duration 1 and"
        r" --dt 0.3",
    ),
    (["--batch", "0"], r"argument --batch: must be an integer >= 1, got '0'"),
    (["--batch", "2.5"], r"argument --batch: must be an integer >= 1, got '2.5'"),
    (["--seed", "-1"], r"argument --seed: must be an integer in \[0, 2\*\*32\), got '-1'"),
    (
        ["--i-min", "5", "--i-max", "1"],
        r"argument --i-min: must be <= --i-max, got --i-min 5 and --i-max 1",
    ),
    (["--i-max", "nan"], r"argument --i-max: must be a finite number, got 'nan'"),
    (
        ["--method", "euler"],
        r"argument --method: invalid choice: 'euler' \(choose from 'rk4', 'exp_euler'\)",
    ),
    (
        ["--plot", "/nonexistent-folder/fi.png"],
        r"argument --plot: the folder of the file must exist, got '/nonexistent-folder/fi.png'",
    ),
    (
        ["--plot", "fi.foo"],
        r"argument --plot: the file name must end in one of \.\w+(, \.\w+)*, got 'fi.foo'",
    ),
]


@pytest.mark.parametrize(
    ("extra", "message"), BAD_ARGUMENTS, ids=[" ".join(extra) for extra, _ in BAD_ARGUMENTS]
)
def test_run_hh_bad_arguments_exit_2_before_any_work(extra, message, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("validation must happen before any simulation")

    monkeypatch.setattr(nj, "simulate", must_not_run)
    monkeypatch.setattr(nj, "HodgkinHuxley", must_not_run)
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "hh", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: neurojax run hh")
    assert re.search(message, err), err


def test_unknown_model_exits_2_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        "argument MODEL: invalid choice: 'nope' (choose from 'hh', 'coba', 'cuba', "
        "'izhikevich-lattice', 'microcircuit', 'assembly')" in err
    )


def test_bad_argument_exit_code_through_the_console_entry_point():
    proc = run_cli("run", "hh", "--batch", "-3")
    assert proc.returncode == 2
    assert "argument --batch: must be an integer >= 1, got '-3'" in proc.stderr
    assert proc.stdout == ""


def test_help_explains_units(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "hh", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for text in ("uA/cm^2", "in ms", "Hz", "--method {rk4,exp_euler}"):
        assert text in out


# ---- helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_steps", "batch"), [(1, 1), (20_000, 5), (100_000, 41), (99_991, 3), (10**7, 10**6)]
)
def test_chunking_covers_the_run_with_bounded_chunks(n_steps, batch):
    chunk, rem = cli._chunking(n_steps, batch)
    assert 1 <= chunk <= min(n_steps, 100_000) and 0 <= rem < chunk
    assert (n_steps - rem) % chunk == 0  # whole chunks, then the remainder
    # Device-side recording per chunk stays bounded (16 Mi booleans) unless one step alone
    # exceeds it.
    assert chunk * batch <= max(16 << 20, batch)
    if n_steps == 99_991:  # a prime: no useful divisor, so a remainder chunk is used
        assert rem > 0
    if n_steps == 100_000:
        assert (chunk, rem) == (5000, 0)


def test_bench_lists_names_and_rejects_unknown_before_running(capsys, monkeypatch):
    import subprocess as sp

    def no_run(*args, **kwargs):
        raise AssertionError("no benchmark may start for a bad name")

    monkeypatch.setattr(sp, "run", no_run)
    assert cli.main(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) ['nope']" in err and "'assembly'" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    assert "lif_population" in capsys.readouterr().out


def test_bench_runs_run_all_and_prints_its_table(tmp_path, capsys, monkeypatch):
    import subprocess as sp

    calls = []

    def fake_run(cmd, cwd, stdout, check):
        calls.append(cmd)
        (tmp_path / "results-1.md").write_text("| table |\n")
        return sp.CompletedProcess(cmd, 0)

    monkeypatch.setattr(sp, "run", fake_run)
    assert cli.main(["bench", "assembly", "--quick", "--out", str(tmp_path)]) == 0
    assert calls[0][1:3] == ["-m", "benchmarks.run_all"]
    assert calls[0][-3:] == ["--only", "assembly", "--quick"]
    assert "| table |" in capsys.readouterr().out


def test_devices_shards_the_network_and_keeps_its_spikes():
    # The console command restarts itself with XLA's forced host device count, so it runs
    # in a subprocess; the rates must equal the one-device run exactly (same spikes).
    import json as _json
    import subprocess as sp
    import sys as _sys

    def run(*extra):
        out = sp.run(
            [
                _sys.executable,
                "-m",
                "neurojax",
                "run",
                "cuba",
                "--duration",
                "50",
                "--json",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            # forced host devices: the CPU backend, also on a machine with one GPU
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        ).stdout
        return _json.loads(out.strip().splitlines()[-1])

    one, four = run(), run("--devices", "4")
    assert four["devices"] == 4 and one["devices"] == 1
    assert four["rates_hz"] == one["rates_hz"] and one["rates_hz"]["E"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "izhikevich-lattice", "--devices", "2"], "izhikevich-lattice runs on one device"),
        (["run", "hh", "--devices", "2"], "hh runs on one device"),
        (["run", "cuba", "--devices", "2", "--batch", "3"], "use --batch 1 with --devices 2"),
        (["run", "cuba", "--devices", "0"], "--devices"),
    ],
)
def test_devices_bad_combinations_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_run_hh_takes_the_fused_run(monkeypatch, capsys):
    """`neurojax run hh` passes its constant currents as an array, so the uncoupled population
    runs through `HodgkinHuxley.fused_run` (the compiled whole-run kernel on CPU), as the same
    call from Python does; before, its input function made the run ineligible."""
    served = []
    original = nj.HodgkinHuxley.fused_run

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        served.append(out is not None)
        return out

    monkeypatch.setattr(nj.HodgkinHuxley, "fused_run", spy)
    assert cli.main(["run", "hh", "--duration", "20", "--batch", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert served and all(served)
    assert res["spike_counts"][-1] > 0


def test_network_run_on_a_terminal_goes_in_chunks_with_a_progress_bar(capsys):
    """On a terminal the run shows `nj.simulate`'s bar: it says while the run compiles, then
    the steps per second of running alone; the chunks give the same spike counts as the
    single call."""
    from neurojax import _cli_networks
    from neurojax.cli import build_parser

    parser, _ = build_parser()
    args = parser.parse_args(["run", "cuba", "--duration", "200", "--dt", "0.1"])
    whole = _cli_networks._run_network("cuba", args, progress=False)
    chunked = _cli_networks._run_network("cuba", args, progress=True)
    err = capsys.readouterr().err
    assert "compiling" in err and "steps/s" in err and "simulate:" in err
    assert chunked["rates_hz"] == whole["rates_hz"] and chunked["rates_hz"]["E"] > 0
