"""Benchmark: the cost of STDP on the COBA network, neurojax against Brian2.

The COBA network of `nj.models.coba` (4000 LIF neurons, p = 0.02, dt = 0.1 ms, seed 0), 1 s
simulated, float32, once as built (static weights) and once with pair-based additive STDP on
its excitatory-to-excitatory projection (about 205 000 synapses): projection 0 is replaced by
an `nj.Projection` with the same connectivity, kinetics and output plus
`plasticity=nj.STDP(a_plus=0.006, a_minus=0.0063, tau_plus=tau_minus=20 ms, w_min=0,
w_max=1.2)` (bounds that contain the initial weight 0.6), in an `nj.Network` with the same
populations and inputs, starting from the same voltages. Each configuration is compiled ahead
of time and timed by the harness with the default recording (one bool spike raster per
population and step). The STDP record carries `stdp_over_static` (`run_s` with STDP / without)
and the final E->E weights (`w_ee_mean`, `w_ee_std`, fractions at the bounds).

Peer in the same run: Brian2 2.9 C++ standalone (`peers.brian2_coba_stdp`, float64, one
thread unless `--threads 2`) on the same network with the same rule on its `Pe -> Pe`
synapses, and without it; its STDP record carries its own `stdp_over_static` and
`neurojax_over_peer` (neurojax `run_s` / Brian2's, with STDP). Brian2 draws its own network
and trains, so rates and weights agree statistically, not spike by spike.

Interleaved pairs: the two configurations above are timed one after the other, so a change
in the machine's load between them (other jobs on a shared host) moves the ratio. After both,
`--pairs` (default 15) more runs alternate static and STDP calls of the same compiled
programs, and a record with `"measure": "interleaved"` carries the median over the pairs of
the per-pair ratio (`stdp_over_static_paired`), the ratio of the two medians and all times.

`--quick` (the smoke test) simulates 100 ms. The ratios are also written to stderr.

Run: `python -m benchmarks.stdp_overhead [--quick] [--duration MS] [--no-peers]
[--threads 1|2] [--repeats R] [--budget S] [--pairs P]`. `--sizes` is not used.
"""

import sys
import time
from typing import Any

from . import _harness

DT = 0.1  # ms
DURATION = 1000.0  # ms
QUICK_DURATION = 100.0
SEED = 0


def _extra(parser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (1000)")
    parser.add_argument(
        "--pairs", type=int, default=None, help="interleaved static/STDP pairs (15; quick: 3)"
    )


def with_stdp(net, state, rule):
    """The network `net` with `rule` on projection 0 (E->E), and `state` carried over to it."""
    import equinox as eqx

    import neurojax as nj

    old = net.projections[0]
    plastic = nj.Projection(
        old.pre, old.post, old.conn, synapse=old.synapse, output=old.output, plasticity=rule
    )
    new = nj.Network(
        populations={name: (model, net.sizes[name]) for name, model in net.populations.items()},
        projections=[plastic, *net.projections[1:]],
        inputs=net.inputs,
        dt=net.dt,
    )
    new_state = new.init_state(batch=state.populations["E"].v.shape[:-1])
    return new, eqx.tree_at(lambda s: s.populations, new_state, state.populations)


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=(4000,), quick_sizes=(4000,), argv=argv, extra=_extra
    )
    import jax
    import numpy as np

    import neurojax as nj

    from .peers import _coba
    from .peers.brian2_coba_stdp import STDP_PARAMS

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    p = _coba.COBA
    base = {
        "bench": "stdp_overhead",
        "model": "coba",
        "dt": DT,
        "steps": n_steps,
        "duration_ms": duration,
        "seed": SEED,
        "threads": args.threads,
        "stdp_params": STDP_PARAMS,
    }
    rule = nj.STDP(**STDP_PARAMS, mode="additive")
    static_net, static_state = nj.models.coba(jax.random.key(SEED))
    stdp_net, stdp_state = with_stdp(static_net, static_state, rule)

    def run(net, state):
        final, rec = nj.simulate(net, state, dt=DT, n_steps=n_steps)
        return final.plastic, rec.spikes

    results: dict[bool, dict[str, Any]] = {}
    calls = {}
    for stdp, (net, state) in ((False, (static_net, static_state)), (True, (stdp_net, stdp_state))):
        _harness.log(f"stdp_overhead: neurojax stdp={stdp}")
        net = _harness.fit_spike_capacity(net, state, dt=DT, n_steps=n_steps)
        timing, (plastic, spikes), compiled = _harness.time_jax(
            run, (net, state), repeats=args.repeats, budget_s=args.budget
        )
        calls[stdp] = (compiled, net, state)
        raster = np.concatenate([np.asarray(spikes["E"]), np.asarray(spikes["I"])], axis=-1)
        step, idx = np.nonzero(raster)
        del spikes, raster
        rec = {
            **base,
            "impl": "neurojax",
            "stdp": stdp,
            "dtype": "float32",
            **timing.as_dict(),
            "steps_per_s": n_steps / timing.run_s,
            "n_synapses": net.n_synapses,
            "n_plastic": net.projections[0].n_synapses if stdp else 0,
            **_coba.spike_stats(idx, step * DT, p["n_exc"], p["n_inh"], duration),
        }
        if stdp:
            w = np.asarray(plastic[0].weights, np.float64)
            rec.update(
                w_ee_mean=float(w.mean()),
                w_ee_std=float(w.std()),
                w_ee_frac_min=float(np.mean(w <= STDP_PARAMS["w_min"])),
                w_ee_frac_max=float(np.mean(w >= STDP_PARAMS["w_max"])),
                stdp_over_static=timing.run_s / results[False]["run_s"],
            )
        results[stdp] = rec
        _harness.emit(rec)
        del net, state, plastic
    summary = [f"neurojax STDP / static: {results[True]['stdp_over_static']:.2f}x"]

    n_pairs = args.pairs if args.pairs is not None else (3 if args.quick else 15)
    if n_pairs > 0:
        _harness.log(f"stdp_overhead: neurojax, {n_pairs} interleaved static/STDP pairs")
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(n_pairs):
            for stdp in (False, True):
                compiled, net, state = calls[stdp]
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(net, state))
                times[stdp].append(time.perf_counter() - t0)
        static_t, stdp_t = np.asarray(times[False]), np.asarray(times[True])
        paired = float(np.median(stdp_t / static_t))
        rec = {
            **base,
            "impl": "neurojax",
            "measure": "interleaved",
            "pairs": n_pairs,
            "static_times_s": times[False],
            "stdp_times_s": times[True],
            "static_run_s": float(np.median(static_t)),
            "stdp_run_s": float(np.median(stdp_t)),
            "stdp_over_static_paired": paired,
            "stdp_over_static_medians": float(np.median(stdp_t) / np.median(static_t)),
        }
        _harness.emit(rec)
        summary.append(f"interleaved pairs: {paired:.2f}x (median of per-pair ratios)")
    del calls

    if args.peers:
        peer: dict[bool, dict[str, Any]] = {}
        for stdp in (False, True):
            _harness.log(f"stdp_overhead: brian2_standalone stdp={stdp}")
            spec = {
                "model": "coba",
                "mode": "standalone",
                "threads": args.threads,
                "seed": SEED,
                "duration_ms": duration,
                "repeats": args.repeats,
                "budget_s": args.budget,
                "stdp": stdp,
            }
            res = _harness.run_peer("benchmarks.peers.brian2_coba_stdp", spec, threads=args.threads)
            rec = {**base, "impl": "brian2_standalone", "stdp": stdp}
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(dtype=res.get("float_dtype"), **_harness.timing_from_peer(res))
                rec["steps_per_s"] = n_steps / rec["run_s"]
                for key in (
                    "build_s",
                    "binary_wall_s",
                    "openmp_threads",
                    "n_synapses",
                    "n_plastic",
                    "rate_exc_hz",
                    "rate_inh_hz",
                    "rate_hz",
                    "cv_isi",
                    "n_cv",
                    "n_spikes",
                ):
                    if key in res:
                        rec[key] = res[key]
                if stdp:
                    for key in ("w_ee_mean", "w_ee_std", "w_ee_frac_min", "w_ee_frac_max"):
                        rec[key] = res[key]
                    if "error" not in peer[False]:
                        rec["stdp_over_static"] = rec["run_s"] / peer[False]["run_s"]
                        summary.append(f"Brian2 STDP / static: {rec['stdp_over_static']:.2f}x")
                rec["neurojax_over_peer"] = results[stdp]["run_s"] / rec["run_s"]
                summary.append(
                    f"neurojax / Brian2 ({'STDP' if stdp else 'static'}): "
                    f"{rec['neurojax_over_peer']:.2f}x"
                )
            peer[stdp] = rec
            _harness.emit(rec)
    _harness.log("stdp_overhead: " + "; ".join(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
