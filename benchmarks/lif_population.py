"""Benchmark: a population of independent LIF neurons, neurojax against Brian2 and NumPy.

N in {10^4, 10^5, 10^6} `nj.LIF` neurons (NEST's `iaf_psc_alpha` defaults: tau_m = 10 ms,
v_rest = v_reset = -70 mV, v_th = -55 mV, r_m = 40 MOhm, t_ref = 2 ms), each with its own
constant current evenly spaced in [0.5, 2] nA (above the 0.375 nA rheobase, so every neuron
fires at 60-250 Hz), 1000 steps of dt = 0.1 ms, float32, stepped by `nj.simulate` with its
default recording (the bool spike raster).

Reported per configuration: neuron updates per second, and the memory traffic this implies at
`peers._lif.BYTES_PER_NEURON_STEP` = 21 bytes per neuron-step (read v, refractory time and
current, write v and refractory time, one raster byte) as a fraction of the measured
bandwidth (`benchmarks.tools.machine`). XLA's own estimate of the bytes one step touches is
reported too (`xla_bytes_per_neuron_step`).

Peers in the same run: Brian2 2.9 (C++ standalone and cython runtime, `method="exact"`,
float64, a `SpikeMonitor`) and a vectorised NumPy version with neurojax's step order. Brian2
dates refractoriness from the start of the spiking step, so its neurons are clamped one step
less than neurojax's and fire slightly faster; the mean rates are reported side by side.

Run: `python -m benchmarks.lif_population [--quick] [--sizes 10000,100000] [--no-peers]
[--threads 1|2] [--repeats R]`.
"""

import sys
from typing import Any

from . import _harness

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000,)
DT = 0.1  # ms
N_STEPS = 1000


def _extra(parser):
    parser.add_argument("--steps", type=int, default=N_STEPS, help="steps of dt = 0.1 ms")


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=SIZES, quick_sizes=QUICK_SIZES, argv=argv, extra=_extra
    )
    import jax
    import jax.numpy as jnp
    import numpy as np

    import neurojax as nj

    from .peers import _lif

    machine = _harness.load_machine(args)
    if args.machine is None:
        _harness.emit(machine)
    steps = args.steps
    bandwidth = machine["peak_bytes_per_s"]
    base = {"bench": "lif_population", "dt": DT, "steps": steps, "threads": args.threads}

    def derived(n: int, run_s: float, n_spikes: int) -> dict[str, Any]:
        updates = n * steps / run_s
        return {
            "updates_per_s": updates,
            "bytes_per_neuron_step": _lif.BYTES_PER_NEURON_STEP,
            "bytes_per_s": updates * _lif.BYTES_PER_NEURON_STEP,
            "frac_bandwidth": updates * _lif.BYTES_PER_NEURON_STEP / bandwidth,
            "rate_hz": n_spikes / (n * steps * DT * 1e-3),
        }

    for n in args.sizes:
        _harness.log(f"lif_population: n={n}")
        model = nj.LIF(**_lif.PARAMS)
        state = model.init_state(n)
        currents = jnp.asarray(_lif.batch_currents(n), jnp.float32)

        def run(model, state, currents):
            final, rec = nj.simulate(model, state, currents, dt=DT, n_steps=steps)
            return final, rec.spikes

        timing, (_, raster), _ = _harness.time_jax(
            run, (model, state, currents), repeats=args.repeats, budget_s=args.budget
        )
        n_spikes = int(np.asarray(raster).sum())
        del raster
        # The plain call a user makes: validation and dispatch included.
        call_timing, _ = _harness.time_call(
            lambda model=model, state=state, currents=currents: jax.block_until_ready(
                nj.simulate(model, state, currents, dt=DT, n_steps=steps)
            ),
            repeats=min(args.repeats, 3),
            budget_s=args.budget,
        )
        cost = (
            jax.jit(lambda m, s, i: m.step(s, i, DT)).lower(model, state, currents).compile()
        ).cost_analysis()
        nj_rec = {
            **base,
            "impl": "neurojax",
            "method": "exact",
            "dtype": "float32",
            "n": n,
            **timing.as_dict(),
            "call_s": call_timing.run_s,
            "xla_bytes_per_neuron_step": cost.get("bytes accessed", float("nan")) / n,
            "xla_flops_per_neuron_step": cost.get("flops", float("nan")) / n,
            "n_spikes": n_spikes,
            **derived(n, timing.run_s, n_spikes),
        }
        _harness.emit(nj_rec)
        if not args.peers:
            continue

        def emit_peer(rec: dict[str, Any], n: int = n, nj_rec: dict = nj_rec) -> None:
            if "error" not in rec:
                rec.update(derived(n, rec["run_s"], rec["n_spikes"]))
                rec["neurojax_speedup"] = rec["run_s"] / nj_rec["run_s"]
            _harness.emit(rec)

        if args.threads == 1:
            np_currents = _lif.batch_currents(n).astype(np.float32)
            np_timing, (np_raster, _) = _harness.time_call(
                lambda np_currents=np_currents: _lif.simulate(np_currents, dt=DT, n_steps=steps),
                repeats=args.repeats,
                budget_s=args.budget,
            )
            emit_peer(
                {
                    **base,
                    "impl": "numpy",
                    "method": "exact",
                    "dtype": "float32",
                    "n": n,
                    **np_timing.as_dict(),
                    "n_spikes": int(np_raster.sum()),
                }
            )
            del np_raster
        # The cython runtime is single-threaded: with --threads 2 only standalone changes.
        modes = ("standalone", "cython") if args.threads == 1 else ("standalone",)
        for mode in modes:
            spec = {
                "n": n,
                "mode": mode,
                "threads": args.threads,
                "dt": DT,
                "n_steps": steps,
                "repeats": args.repeats,
                "budget_s": args.budget,
            }
            res = _harness.run_peer("benchmarks.peers.brian2_lif", spec, threads=args.threads)
            rec = {**base, "impl": f"brian2_{mode}", "method": "exact", "n": n}
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(dtype=res["float_dtype"], n_spikes=res["n_spikes"])
                rec.update(_harness.timing_from_peer(res))
                for key in ("build_s", "loop_s", "binary_wall_s", "openmp_threads"):
                    if key in res:
                        rec[key] = res[key]
            emit_peer(rec)


if __name__ == "__main__":
    main(sys.argv[1:])
