"""Benchmark: the Brette et al. (2007) COBA and CUBA networks, neurojax against its peers.

The networks of `nj.models.coba` and `nj.models.cuba` (4000 LIF neurons, 3200 "E" and 800 "I",
p = 0.02, dt = 0.1 ms; parameters in REFERENCE.md and `peers._coba`), 1 s simulated, float32,
seed 0. neurojax configurations, each compiled ahead of time and timed by the harness:

- a single trial recorded as `nj.simulate` does by default (one bool spike raster per
  population and step): the configuration the targets are about. Its plain `nj.simulate`
  call is timed too (`call_s`; `call_first_s` is the first call, tracing and compilation
  included, what a user waits for);
- the same trial with `record_every=10` (spike counts per 1 ms window), to show what the
  full raster costs;
- a batch of `--batch` trials (default 32: the state from `batch=(32,)`, independent initial
  voltages on the same connectivity), with both recordings; `run_per_trial_s` = `run_s` / B;
  once as one block and once with `nj.simulate(..., batch_block=4)` (blocks of 4 trials run
  one after the other inside the same compiled program, which keeps them in cache).

`compile_s` is the ahead-of-time lowering and compilation of the whole run. Rates come from
the recorded spikes of the timed run: `rate_exc_hz`, `rate_inh_hz` and `rate_hz` are means over
neurons (and trials), and for the full raster `peers._coba.spike_stats` also gives `cv_isi`
(a spike emitted by step k is dated k * dt there, so the window holds every step).
`cpu_kernel` says whether event delivery ran through neurojax's compiled CPU kernel
(`NEUROJAX_CPU_KERNEL=0` in the environment selects the pure-JAX path).

Peers in the same run, each in its own process with the same seed and duration (their
networks are drawn by their own random generators, so rates agree statistically, not spike
by spike): Brian2 2.9 C++ standalone and cython runtime (`peers.brian2_coba`, float64, loop
time as in `peers._brian2`; cython only with one thread) and brainpy-state
(`peers.brainpy_coba`, float32, brainevent's numba kernels). Each peer record carries
`neurojax_over_peer` (neurojax single-trial `run_s` / the peer's) and
`neurojax_batch_per_trial_over_peer` (neurojax `run_per_trial_s` of the batch with the default
recording / the peer's `run_s`); a peer that fails leaves a record with `error`.

`--quick` (the smoke test) simulates 100 ms and batches 8 trials.

Run: `python -m benchmarks.brette_networks [--quick] [--models coba,cuba] [--batch B]
[--duration MS] [--no-peers] [--threads 1|2] [--repeats R] [--budget S]`. `--sizes` is not used.
"""

import sys
from typing import Any

from . import _harness

DT = 0.1  # ms
DURATION = 1000.0  # ms
QUICK_DURATION = 100.0
BATCH = 32
QUICK_BATCH = 8
SEED = 0
RECORD_EVERY = 10  # the reduced-recording configuration
BLOCK = 4  # trials per block in the blocked batch configurations
MODELS = ("coba", "cuba")


def _extra(parser) -> None:
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--batch", type=int, default=None, help="trials per batch (0: none)")
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (1000)")


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=(4000,), quick_sizes=(4000,), argv=argv, extra=_extra
    )
    models = tuple(args.models.split(","))
    if any(m not in MODELS for m in models):
        raise SystemExit(f"--models must name models from {MODELS}, got {args.models!r}")
    import jax
    import numpy as np

    import neurojax as nj

    from .peers import _coba

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    batch = args.batch if args.batch is not None else (QUICK_BATCH if args.quick else BATCH)
    base = {
        "bench": "brette_networks",
        "dt": DT,
        "steps": n_steps,
        "duration_ms": duration,
        "seed": SEED,
        "threads": args.threads,
    }

    def rates(spikes: dict[str, Any], p: dict[str, Any], trials: int) -> dict[str, Any]:
        """Mean rates (and, for a single-trial raster, the CV of ISIs) of recorded spikes."""
        counts = {k: np.asarray(v) for k, v in spikes.items()}  # bool raster or counts
        window_s = duration * 1e-3
        n_e = int(counts["E"].sum(dtype=np.int64))
        n_i = int(counts["I"].sum(dtype=np.int64))
        out = {
            "rate_exc_hz": n_e / (p["n_exc"] * trials * window_s),
            "rate_inh_hz": n_i / (p["n_inh"] * trials * window_s),
            "rate_hz": (n_e + n_i) / ((p["n_exc"] + p["n_inh"]) * trials * window_s),
            "n_spikes": n_e + n_i,
        }
        if trials > 1:
            # Spread of the mean rate over trials.
            per_trial = sum(c.sum(axis=(0, 2), dtype=np.int64) for c in counts.values())
            per_trial = per_trial / ((p["n_exc"] + p["n_inh"]) * window_s)
            out["rate_hz_trial_std"] = float(per_trial.std(ddof=1))
        elif counts["E"].dtype == bool:
            raster = np.concatenate([counts["E"], counts["I"]], axis=-1)
            step, idx = np.nonzero(raster)
            stats = _coba.spike_stats(idx, step * DT, p["n_exc"], p["n_inh"], duration)
            out.update(cv_isi=stats["cv_isi"], n_cv=stats["n_cv"])
        return out

    for model in models:
        p = _coba.MODELS[model]
        build = getattr(nj.models, model)
        single: dict[str, Any] | None = None
        batched: dict[str, Any] | None = None
        configs = [(1, 1, None), (1, RECORD_EVERY, None)]
        if batch > 1:
            configs += [(batch, 1, None), (batch, RECORD_EVERY, None)]
            if batch > BLOCK and batch % BLOCK == 0:
                configs += [(batch, 1, BLOCK), (batch, RECORD_EVERY, BLOCK)]
        for trials, every, block in configs:
            _harness.log(
                f"brette_networks: neurojax {model} batch={trials} record_every={every} "
                f"batch_block={block}"
            )
            net, state = build(jax.random.key(SEED), batch=() if trials == 1 else (trials,))
            net = _harness.fit_spike_capacity(net, state, dt=DT, n_steps=n_steps)

            def run(net, state, every=every, block=block):
                final, rec = nj.simulate(
                    net,
                    state,
                    dt=DT,
                    n_steps=n_steps,
                    record_every=every,
                    run=nj.Execution(batch_block=block),
                )
                return final, rec.spikes

            timing, (_, spikes), _ = _harness.time_jax(
                run, (net, state), repeats=args.repeats, budget_s=args.budget
            )
            stats = rates(spikes, p, trials)
            del spikes
            rec = {
                **base,
                "model": model,
                "impl": "neurojax",
                "method": "euler" if model == "coba" else "exact",
                "dtype": "float32",
                "batch": trials,
                "record_every": every,
                "batch_block": block,
                **timing.as_dict(),
                "run_per_trial_s": timing.run_s / trials,
                "steps_per_s": n_steps * trials / timing.run_s,
                "n_synapses": net.n_synapses,
                "synapse_bytes": net.nbytes(),
                "cpu_kernel": _harness.neurojax_cpu_kernel(),
                **stats,
            }
            if trials == 1 and every == 1:
                # The plain call a user makes; its first call traces and compiles.
                call_timing, _ = _harness.time_call(
                    lambda net=net, state=state: jax.block_until_ready(
                        nj.simulate(net, state, dt=DT, n_steps=n_steps)
                    ),
                    repeats=min(args.repeats, 3),
                    budget_s=args.budget,
                )
                rec.update(call_s=call_timing.run_s, call_first_s=call_timing.first_call_s)
                single = rec
            elif every == 1 and (batched is None or rec["run_s"] < batched["run_s"]):
                batched = rec
            _harness.emit(rec)
            del net, state
        if not args.peers:
            continue

        def emit_peer(rec: dict[str, Any], single=single, batched=batched) -> None:
            if "error" not in rec:
                rec["neurojax_speedup"] = rec["run_s"] / single["run_s"]
                rec["neurojax_over_peer"] = single["run_s"] / rec["run_s"]
                if batched is not None:
                    rec["neurojax_batch_per_trial_over_peer"] = (
                        batched["run_per_trial_s"] / rec["run_s"]
                    )
            _harness.emit(rec)

        common = {
            "model": model,
            "seed": SEED,
            "duration_ms": duration,
            "repeats": args.repeats,
            "budget_s": args.budget,
            "threads": args.threads,
        }
        # The cython runtime is single-threaded: with --threads 2 only standalone changes.
        modes = ("standalone", "cython") if args.threads == 1 else ("standalone",)
        peers = [("benchmarks.peers.brian2_coba", {"mode": m}) for m in modes]
        peers.append(("benchmarks.peers.brainpy_coba", {}))
        for module, extra in peers:
            impl = f"brian2_{extra['mode']}" if "mode" in extra else "brainpy_state"
            _harness.log(f"brette_networks: {impl} {model}")
            res = _harness.run_peer(module, {**common, **extra}, threads=args.threads)
            rec = {**base, "model": model, "impl": impl, "batch": 1}
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(method=res.get("method"), dtype=res.get("float_dtype"))
                rec.update(_harness.timing_from_peer(res))
                rec["run_per_trial_s"] = rec["run_s"]
                for key in (
                    "build_s",
                    "loop_s",
                    "binary_wall_s",
                    "openmp_threads",
                    "backend",
                    "n_synapses",
                    "rate_exc_hz",
                    "rate_inh_hz",
                    "rate_hz",
                    "cv_isi",
                    "n_cv",
                    "n_spikes",
                ):
                    if key in res:
                        rec[key] = res[key]
            emit_peer(rec)


if __name__ == "__main__":
    main(sys.argv[1:])
