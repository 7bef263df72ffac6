"""Reference statistics of the COBA and CUBA networks from Brian2, for neurojax's tests.

Runs the Brian2 peer (`benchmarks.peers.brian2_coba`, C++ standalone, one thread, one
process per run) for each model and seed, computes `peers._coba.spike_stats` of its spikes
over two windows (the whole run, and without the first 100 ms, which hold the transient
of the random initial state), and writes per-seed values, their mean and standard deviation
over seeds (`ddof=1`) and the provenance (Brian2 version, date, command) to
`tests/data/brian2_coba_cuba_stats.json`. Each run takes about 10-15 s, nearly all of it the
standalone build.

Run: `python -m benchmarks.reference.brian2_network_stats [--models coba,cuba] [--seeds 0,1,2,3,4]
[--duration 1000] [--out FILE]`.
"""

import argparse
import datetime
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import _harness

PEER = "benchmarks.peers.brian2_coba"
OUT = _harness.REPO_ROOT / "tests" / "data" / "brian2_coba_cuba_stats.json"
WINDOWS_SKIP_MS = (0.0, 100.0)
STATS = ("rate_exc_hz", "rate_inh_hz", "rate_hz", "cv_isi", "n_cv", "n_spikes")


def _command(argv: list[str]) -> str:
    python = Path(sys.executable)
    if python.is_relative_to(_harness.REPO_ROOT):
        python = python.relative_to(_harness.REPO_ROOT)
    return " ".join([str(python), "-m", __spec__.name, *argv])


def _summary(per_seed: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    import numpy as np

    values = {k: np.array([s[k] for s in per_seed], dtype=np.float64) for k in STATS}
    mean = {k: float(v.mean()) for k, v in values.items()}
    std = {k: float(v.std(ddof=1)) if v.size > 1 else float("nan") for k, v in values.items()}
    return mean, std


def _model(name: str, seeds: list[int], duration: float, argv: list[str]) -> dict[str, Any]:
    from ..peers import _coba, brian2_coba

    p = _coba.MODELS[name]
    runs = []
    for seed in seeds:
        spec = {
            "model": name,
            "mode": "standalone",
            "threads": 1,
            "seed": seed,
            "duration_ms": duration,
            "repeats": 1,
            "budget_s": 60.0,
            "return_spikes": True,
        }
        result = _harness.run_peer(PEER, spec, threads=1)
        if "error" in result:
            raise RuntimeError(f"{name} seed {seed}: {result['error']}")
        _harness.log(
            f"{name} seed {seed}: {result['rate_hz']:.2f} Hz, CV {result['cv_isi']:.3f},"
            f" loop {result['times_s'][0]:.3f} s, build {result['build_s']:.1f} s"
        )
        runs.append(result)
    windows = {}
    for skip in WINDOWS_SKIP_MS:
        per_seed = [
            {
                "seed": r["seed"],
                **_coba.spike_stats(
                    r["spike_i"], r["spike_t_ms"], p["n_exc"], p["n_inh"], duration, skip
                ),
            }
            for r in runs
        ]
        mean, std = _summary(per_seed)
        windows[f"{skip:g}"] = {"t_skip_ms": skip, "per_seed": per_seed, "mean": mean, "std": std}
    return {
        "params": p,
        "method": brian2_coba.METHODS[name],
        "seeds": seeds,
        "n_synapses": [r["n_synapses"] for r in runs],
        "loop_s": [r["times_s"][0] for r in runs],
        "windows": windows,
        "brian2_version": metadata.version("brian2"),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": _command(argv),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="coba,cuba", help="comma-separated: coba, cuba")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--duration", type=float, default=1000.0, help="simulated ms")
    parser.add_argument("--out", type=Path, default=OUT, help="output JSON file")
    args = parser.parse_args(argv)
    # One core for this process and the peers it starts, before NumPy is imported.
    _harness.configure_threads(1)
    models = [m for m in args.models.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = {
        "description": (
            "Spike statistics of the Brette et al. (2007) COBA and CUBA networks simulated by"
            " Brian2 (benchmarks.peers.brian2_coba, C++ standalone, 1 thread), computed by"
            " benchmarks.peers._coba.spike_stats over spikes with t_skip_ms <= t <"
            " duration_ms; mean and std (ddof=1) over seeds."
        ),
        "command": _command(argv),
        "brian2_version": metadata.version("brian2"),
        "numpy_version": metadata.version("numpy"),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "standalone",
        "threads": 1,
        "duration_ms": args.duration,
        "models": {m: _model(m, seeds, args.duration, argv) for m in models},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_harness._clean(out), indent=1, allow_nan=False) + "\n")
    _harness.log(f"wrote {os.path.relpath(args.out, _harness.REPO_ROOT)}")


if __name__ == "__main__":
    main()
