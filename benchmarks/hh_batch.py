"""Benchmark: a batch of independent Hodgkin-Huxley neurons, neurojax against its peers.

N in {1, 10, 100, 1000, 10^4, 10^5} classic HH neurons (`nj.HodgkinHuxley`, squid-axon
parameters), 50 ms at dt = 0.01 ms (5000 steps), float32, neuron k of N driven by its own
constant current `20 k / N` uA/cm^2 (`peers._hh.batch_currents`), starting from the model's
resting state, stepped by `nj.simulate` recording only the bool spike raster. Both
integration methods are timed: `method="rk4"` and `method="exp_euler"`. On CPU that call
runs the fused kernel of `neurojax.neurons._hh_fused`; elsewhere (or with
`NEUROJAX_CPU_KERNEL=0`) the general scan, whose `unroll` is swept at small N, where the
compiled loop's per-step overhead dominates (the kernel has no `unroll`).

Peers in the same run, with the same currents, initial state and spike definition (upward
crossing of 0 mV):

- **Brian2 2.9** (`rk4` and `exponential_euler`, float64), C++ standalone (loop time from
  `device._last_run_time`) and cython runtime (wall time of `run()` after a warm-up), each
  configuration in its own process; the cython runtime is limited to N <= `--cython-max`
  (default 10^4: at 10^5 one rk4 run takes about two minutes);
- **Jaxley 0.14** (its default implicit-Euler voltage step with exponential gate updates,
  its `HH` channel with matched parameters, one compartment per neuron, `jx.integrate`
  vmapped over the currents), float32 and float64;
- **NumPy**: a plain vectorised RK4 and exponential Euler (`peers._hh`), float32, limited to
  N <= `--numpy-max` (default 10^4).

**Accuracy.** Every implementation also runs six neurons with currents
`peers._hh.ACCURACY_CURRENTS` and reports `spike_err_max_ms`: the largest error of the first
(up to five) spike times against a float64 `solve_ivp` reference at rtol 1e-10, spike times
taken from each voltage trace by linear interpolation of the 0 mV crossing. The
interpolation itself contributes about 4e-5 ms (the float64 RK4 error at this dt), the
floor of this measure. neurojax's trace is taken from the path the timed runs take (on CPU
the fused kernel of `neurojax.neurons._hh_fused`, stepped one `simulate` call per step);
the `general_` fields give the same measure for the general scan over `HodgkinHuxley.step`.

**Work.** The floating-point operations and transcendental functions of one neurojax step
come from XLA's cost analysis of `model.step`; `flops_per_s` and `frac_peak_flops` compare
them with the measured float32 matmul peak, and `exp_per_s`/`frac_peak_exp` the
transcendental rate with the measured `exp` throughput.

Run: `python -m benchmarks.hh_batch [--quick] [--sizes 1,1000] [--no-peers] [--threads 1|2]
[--repeats R] [--cython-max N] [--numpy-max N]`.
"""

import sys
from typing import Any

from . import _harness

SIZES = (1, 10, 100, 1000, 10_000, 100_000)
QUICK_SIZES = (1, 100)
DT = 0.01  # ms
DURATION = 50.0  # ms
QUICK_DURATION = 10.0  # ms
METHODS = ("rk4", "exp_euler")
JAXLEY_CHUNK = 10_000


def _extra(parser) -> None:
    parser.add_argument("--cython-max", type=int, default=10_000, help="largest N for cython")
    parser.add_argument("--numpy-max", type=int, default=10_000, help="largest N for NumPy")
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (50)")


def _unrolls(n: int, quick: bool, fused: bool) -> tuple[int, ...]:
    if fused:
        return (1,)
    if quick:
        return (1, 8) if n == 1 else (1,)
    if n == 1:
        return (1, 2, 4, 8, 16, 32)
    if n <= 100:
        return (1, 8)
    return (1,)


def _accuracy_fields(acc: dict[str, Any]) -> dict[str, Any]:
    """Accuracy fields for a record; a failed accuracy run is reported, not raised."""
    if "error" in acc:
        return {"accuracy_error": acc["error"]}
    return acc


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=SIZES, quick_sizes=QUICK_SIZES, argv=argv, extra=_extra
    )
    import jax
    import jax.numpy as jnp
    import numpy as np

    import neurojax as nj

    from .peers import _hh

    machine = _harness.load_machine(args)
    if args.machine is None:
        _harness.emit(machine)
    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    base = {"bench": "hh_batch", "dt": DT, "steps": n_steps, "threads": args.threads}

    # The common initial state is neurojax's resting state, so every peer starts where
    # neurojax does.
    probe = nj.HodgkinHuxley().init_state(1)
    y0 = tuple(float(np.asarray(getattr(probe, name)).reshape(-1)[0]) for name in "vmhn")
    _harness.log(f"hh_batch: initial state (v, m, h, n) = {y0}; reference solve")
    reference = _hh.reference_spike_times(_hh.ACCURACY_CURRENTS, y0, duration)
    acc_currents = jnp.asarray(_hh.ACCURACY_CURRENTS, jnp.float32)
    t_grid = np.arange(n_steps + 1) * DT

    def error_of(times: list) -> dict[str, Any]:
        return _hh.spike_time_error(reference, [np.asarray(s) for s in times], duration)

    accuracy: dict[tuple[str, str, str], dict[str, Any]] = {}
    nj_models = {m: nj.HodgkinHuxley(method=m) for m in METHODS}

    @jax.jit
    def timed_path_trace(model, state, currents):
        # The voltage after every step of the path the timed runs take (on CPU the fused
        # kernel), one step per `simulate` call: the kernel's state round-trips exactly, so
        # this is the trajectory of one long run.
        def one(s, _):
            s, _ = nj.simulate(model, s, currents, dt=DT, n_steps=1)
            return s, s.v

        return jax.lax.scan(one, state, None, length=n_steps)[1]

    for method, model in nj_models.items():
        state = model.init_state(len(_hh.ACCURACY_CURRENTS))
        v = np.asarray(timed_path_trace(model, state, acc_currents))
        v = np.concatenate([np.asarray(state.v)[None], v], axis=0)
        accuracy["neurojax", method, "float32"] = error_of(_hh.crossing_times(t_grid, v))
        # The general scan over `HodgkinHuxley.step` (what recording `v` runs), for comparison.
        _, rec = nj.simulate(model, state, acc_currents, dt=DT, n_steps=n_steps, record=("v",))
        v = np.concatenate([np.asarray(state.v)[None], np.asarray(rec.v)], axis=0)
        general = error_of(_hh.crossing_times(t_grid, v))
        accuracy["neurojax", method, "float32"].update(
            {f"general_{key}": value for key, value in general.items()}
        )
    if args.peers:
        for method in METHODS:
            _, v = _hh.simulate(
                np.asarray(_hh.ACCURACY_CURRENTS),
                y0,
                dt=DT,
                n_steps=n_steps,
                method=method,
                record_v=True,
            )
            accuracy["numpy", method, "float32"] = error_of(_hh.crossing_times(t_grid, v))
        # Peer accuracy comes from a separate small run with the accuracy currents (Brian2
        # through the cython runtime: the standalone binary runs the same generated code).
        small = {
            "n": 1,
            "dt": DT,
            "n_steps": n_steps,
            "i_max": 20.0,
            "y0": y0,
            "repeats": 1,
            "budget_s": 0.0,
            "accuracy_currents": list(_hh.ACCURACY_CURRENTS),
        }
        for method in METHODS:
            res = _harness.run_peer(
                "benchmarks.peers.brian2_hh",
                {**small, "method": method, "mode": "cython", "threads": 1},
                threads=args.threads,
            )
            accuracy["brian2", method, "float64"] = (
                error_of(res["accuracy_spike_times"]) if "error" not in res else res
            )
        for dtype in ("float32", "float64"):
            res = _harness.run_peer(
                "benchmarks.peers.jaxley_hh",
                {**small, "dtype": dtype, "chunk": 1},
                threads=args.threads,
            )
            accuracy["jaxley", "bwd_euler", dtype] = (
                error_of(res["accuracy_spike_times"]) if "error" not in res else res
            )
    for key, err in accuracy.items():
        _harness.log(f"hh_batch: accuracy {key}: {err}")

    def step_cost(model, n: int) -> dict[str, float]:
        state = model.init_state(n)
        cur = jnp.zeros((n,), jnp.float32)
        cost = jax.jit(lambda m, s, i: m.step(s, i, DT)).lower(model, state, cur).compile()
        cost = cost.cost_analysis()
        return {
            "flops_per_neuron_step": cost.get("flops", float("nan")) / n,
            "transcendentals_per_neuron_step": cost.get("transcendentals", float("nan")) / n,
            "xla_bytes_per_neuron_step": cost.get("bytes accessed", float("nan")) / n,
        }

    costs = {m: step_cost(model, 1024) for m, model in nj_models.items()}
    fused = jax.default_backend() == "cpu" and bool(_harness.neurojax_cpu_kernel())
    nj_default: dict[tuple[int, str], dict[str, Any]] = {}

    def emit_peer(rec: dict[str, Any], n: int, method: str | None) -> None:
        if "error" not in rec:
            rec["neuron_steps_per_s"] = n * n_steps / rec["run_s"]
            speedup = {}
            for m in METHODS if method is None else (method,):
                if (n, m) in nj_default:
                    speedup[m] = rec["run_s"] / nj_default[n, m]["run_s"]
            rec["neurojax_speedup"] = speedup
        _harness.emit(rec)

    for n in args.sizes:
        currents = jnp.asarray(_hh.batch_currents(n), jnp.float32)
        for method, model in nj_models.items():
            for unroll in _unrolls(n, args.quick, fused):
                _harness.log(f"hh_batch: neurojax {method} n={n} unroll={unroll}")
                state = model.init_state(n)

                def run(model, state, currents, unroll=unroll):
                    final, rec = nj.simulate(
                        model, state, currents, dt=DT, n_steps=n_steps,
                        run=nj.Execution(unroll=unroll),
                    )  # fmt: skip
                    return final, rec.spikes

                timing, (_, raster), _ = _harness.time_jax(
                    run, (model, state, currents), repeats=args.repeats, budget_s=args.budget
                )
                n_spikes = int(np.asarray(raster).sum())
                del raster
                call_s = None
                if timing.run_s < 1.0:
                    # What a plain nj.simulate call costs, validation and dispatch included.
                    call_timing, _ = _harness.time_call(
                        lambda model=model, state=state, currents=currents, unroll=unroll: (
                            jax.block_until_ready(
                                nj.simulate(
                                    model,
                                    state,
                                    currents,
                                    dt=DT,
                                    n_steps=n_steps,
                                    run=nj.Execution(unroll=unroll),
                                )  # fmt: skip
                            )
                        ),
                        repeats=3,
                        budget_s=args.budget,
                    )
                    call_s = call_timing.run_s
                c = costs[method]
                rate = n * n_steps / timing.run_s
                rec = {
                    **base,
                    "impl": "neurojax",
                    "method": method,
                    "dtype": "float32",
                    "n": n,
                    "unroll": unroll,
                    **timing.as_dict(),
                    "call_s": call_s,
                    "n_spikes": n_spikes,
                    "neuron_steps_per_s": rate,
                    **c,
                    "flops_per_s": c["flops_per_neuron_step"] * rate,
                    "frac_peak_flops": c["flops_per_neuron_step"] * rate / machine["peak_flops"],
                    "exp_per_s": c["transcendentals_per_neuron_step"] * rate,
                    "frac_peak_exp": c["transcendentals_per_neuron_step"]
                    * rate
                    / machine["jax_exp_per_s"],
                    **accuracy["neurojax", method, "float32"],
                }
                if unroll == 1:
                    nj_default[n, method] = rec
                _harness.emit(rec)
        if not args.peers:
            continue

        if args.threads == 1 and n <= args.numpy_max:
            for method in METHODS:
                _harness.log(f"hh_batch: numpy {method} n={n}")
                np_currents = _hh.batch_currents(n)
                timing, (raster, _) = _harness.time_call(
                    lambda np_currents=np_currents, method=method: _hh.simulate(
                        np_currents, y0, dt=DT, n_steps=n_steps, method=method
                    ),
                    repeats=args.repeats,
                    budget_s=args.budget,
                )
                rec = {
                    **base,
                    "impl": "numpy",
                    "method": method,
                    "dtype": "float32",
                    "n": n,
                    **timing.as_dict(),
                    "n_spikes": int(raster.sum()),
                    **accuracy["numpy", method, "float32"],
                }
                emit_peer(rec, n, method)

        modes = ["standalone"]
        if args.threads == 1 and n <= args.cython_max:
            modes.append("cython")
        for mode in modes:
            for method in METHODS:
                _harness.log(f"hh_batch: brian2 {mode} {method} n={n}")
                spec = {
                    "n": n,
                    "method": method,
                    "mode": mode,
                    "threads": args.threads,
                    "dt": DT,
                    "n_steps": n_steps,
                    "i_max": 20.0,
                    "y0": y0,
                    "repeats": args.repeats,
                    "budget_s": args.budget,
                }
                res = _harness.run_peer("benchmarks.peers.brian2_hh", spec, threads=args.threads)
                rec = {**base, "impl": f"brian2_{mode}", "method": method, "n": n}
                if "error" in res:
                    rec["error"] = res["error"]
                else:
                    rec.update(dtype=res["float_dtype"], n_spikes=res["n_spikes"])
                    rec.update(_harness.timing_from_peer(res))
                    for key in ("build_s", "loop_s", "binary_wall_s", "openmp_threads"):
                        if key in res:
                            rec[key] = res[key]
                    rec.update(_accuracy_fields(accuracy["brian2", method, "float64"]))
                emit_peer(rec, n, method)

        for dtype in ("float32", "float64"):
            _harness.log(f"hh_batch: jaxley {dtype} n={n}")
            spec = {
                "n": n,
                "dtype": dtype,
                "dt": DT,
                "n_steps": n_steps,
                "i_max": 20.0,
                "y0": y0,
                "repeats": args.repeats,
                "budget_s": args.budget,
                "chunk": JAXLEY_CHUNK,
            }
            res = _harness.run_peer("benchmarks.peers.jaxley_hh", spec, threads=args.threads)
            rec = {**base, "impl": "jaxley", "method": "bwd_euler", "dtype": dtype, "n": n}
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(n_spikes=res["n_spikes"], chunk=res["chunk"])
                rec.update(_harness.timing_from_peer(res))
                rec.update(_accuracy_fields(accuracy["jaxley", "bwd_euler", dtype]))
            emit_peer(rec, n, None)


if __name__ == "__main__":
    main(sys.argv[1:])
