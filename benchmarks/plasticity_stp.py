"""Benchmark: the cost of short-term plasticity and of learnable delays on the COBA network.

The COBA network of `nj.models.coba` (4000 LIF neurons, p = 0.02, dt = 0.1 ms, seed 0), 1 s
simulated, float32, in four configurations built from the same connectivity and started
from the same voltages:

- `static`: the network as built;
- `stp`: projection 0 (E->E, about 205 000 synapses) with
  `short_term=nj.TsodyksMarkram.preset("depressing")` (U = 0.5, tau_rec = 800 ms,
  tau_facil = 0; Tsodyks, Pawelzik and Markram 1998). Depression weakens the recurrent
  excitation, so the firing rates differ from the static run (both are reported; the cost of
  a step grows with the spikes);
- `learnable_delays`: projection 0 with `learnable_delays=True` and its delays (0 ms, the
  COBA delays) as a float array. Whole-step delays give the static run's spikes exactly, so
  this run measures the price of the mechanism (each spike delivered to two ring slots with
  interpolated weights) at identical activity;
- `stp_same_spikes`: projection 0 with `nj.TsodyksMarkram(u=1, tau_rec=0.01, tau_facil=0)`
  (`SAME_SPIKES`). Every spike uses u+ = 1 and finds its resources recovered: R falls to 0
  at a spike and is back to 1 - exp(-ISI / tau_rec) = 1 at the next, since the 5 ms
  refractory period makes every interval at least 500 tau_rec and exp(-500) is 0 in
  float32. So every release equals the static weight and the network fires the static run's
  spikes exactly (checked: the benchmark stops if the rasters differ), while the rule does
  all of its work for every spike (relax u and R from the neuron's last spike, release,
  update).

Why two STP configurations: the depressing preset lowers the excitatory rate about 7-fold
(21 to 3 Hz, in Brian2 as well), so `stp / static` measures the rule's effect on the
network's activity and on what that activity costs, which falls with the spikes in a
simulator dominated by spike propagation (Brian2) and much less in one dominated by the
per-step neuron update (neurojax). `stp_same_spikes / static` holds the activity fixed and
measures what the rule itself costs.

Each configuration is compiled ahead of time and timed by the harness with the default
recording (spike rasters). Then `--pairs` (default 9) rounds run the four compiled programs
one after the other, and the interleaved record carries, per configuration, the median over
the rounds of its time divided by the static time of the same round (`*_over_static_paired`):
on a shared machine this ratio is steadier than a ratio of separate medians.

Peer in the same run: Brian2 2.9 C++ standalone (float64, one thread) on its COBA network
(`benchmarks.peers.brian2_coba_stdp`, whose `Pe -> Pe` synapses are the plastic ones) with the
same Tsodyks-Markram rule on `Pe -> Pe`, written the way Brian2's documentation writes
short-term plasticity (event-driven per-synapse variables, `u` jumping before release):

    dx/dt = -x / tau_rec : 1 (event-driven)       # x = 1 - R, the depleted fraction
    on_pre:  ge_post += w U (1 - x);  x += U (1 - x)

without it, and with the `stp_same_spikes` parameters (U = 1, tau_rec = 0.01 ms: x decays to
exp(-500), below float64's epsilon next to 1, so `w U (1 - x)` is `w` exactly and the run
should fire the static run's spikes; Brian2 returns statistics, not rasters, so its record's
`spikes_equal_static` compares the spike count, the rates and the ISI statistics with its
static run's). Brian2 draws its own network, so its rates agree with neurojax's
statistically. Brian2 has no learnable delays. This module also serves as that peer process
(`python -m benchmarks.plasticity_stp SPEC_JSON`).

`--quick` (the smoke test) simulates 100 ms. The ratios are also written to stderr.

Run: `python -m benchmarks.plasticity_stp [--quick] [--duration MS] [--no-peers]
[--threads 1|2] [--repeats R] [--budget S] [--pairs P]`.
"""

import sys
import time
from typing import Any

from . import _harness

DT = 0.1  # ms
DURATION = 1000.0  # ms
QUICK_DURATION = 100.0
SEED = 0
PRESET = "depressing"
# Every spike releases exactly the static weight: u+ = U = 1 (no facilitation), and R
# recovers from 0 to 1 - exp(-ISI / tau_rec) = 1 between spikes, since the refractory period
# (5 ms) makes every ISI at least 500 tau_rec (exp(-500) is 0 in float32, below float64's
# epsilon in Brian2's 1 - x).
SAME_SPIKES = {"u": 1.0, "tau_rec": 0.01, "tau_facil": 0.0}
CONFIGS = ("static", "stp", "learnable_delays", "stp_same_spikes")
# Brian2 returns no raster: for stp_same_spikes these statistics of its spikes must equal its
# static run's (the network is chaotic, so one changed spike changes them all).
SAME_STATS = ("n_spikes", "rate_exc_hz", "rate_inh_hz", "cv_isi", "n_cv")


def _extra(parser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (1000)")
    parser.add_argument(
        "--pairs", type=int, default=None, help="interleaved rounds of the four (9; quick: 2)"
    )


def with_projection0(net, state, **options):
    """The network `net` with projection 0 (E->E) rebuilt with `options`, and `state`'s
    populations carried over."""
    import equinox as eqx

    import neurojax as nj

    old = net.projections[0]
    new_proj = nj.Projection(
        old.pre,
        old.post,
        old.conn,
        synapse=old.synapse,
        output=old.output,
        delay=old.delay,
        **options,
    )
    new = nj.Network(
        populations={name: (model, net.sizes[name]) for name, model in net.populations.items()},
        projections=[new_proj, *net.projections[1:]],
        inputs=net.inputs,
        dt=DT if net.dt is None else net.dt,
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

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    p = _coba.COBA
    stp_params = dict(zip(("u", "tau_rec", "tau_facil"), nj.TsodyksMarkram.PRESETS[PRESET]))
    base = {
        "bench": "plasticity_stp",
        "model": "coba",
        "dt": DT,
        "steps": n_steps,
        "duration_ms": duration,
        "seed": SEED,
        "threads": args.threads,
        "stp_params": stp_params,
    }
    static_net, static_state = nj.models.coba(jax.random.key(SEED))
    nets = {
        "static": (static_net, static_state),
        "stp": with_projection0(
            static_net, static_state, short_term=nj.TsodyksMarkram(**stp_params)
        ),
        "learnable_delays": with_projection0(static_net, static_state, learnable_delays=True),
        "stp_same_spikes": with_projection0(
            static_net, static_state, short_term=nj.TsodyksMarkram(**SAME_SPIKES)
        ),
    }

    def run(net, state):
        _, rec = nj.simulate(net, state, dt=DT, n_steps=n_steps)
        return rec.spikes

    results: dict[str, dict[str, Any]] = {}
    calls = {}
    rasters = {}
    for name in CONFIGS:
        net, state = nets[name]
        _harness.log(f"plasticity_stp: neurojax {name}")
        net = _harness.fit_spike_capacity(net, state, dt=DT, n_steps=n_steps)
        timing, spikes, compiled = _harness.time_jax(
            run, (net, state), repeats=args.repeats, budget_s=args.budget
        )
        calls[name] = (compiled, net, state)
        raster = np.concatenate([np.asarray(spikes["E"]), np.asarray(spikes["I"])], axis=-1)
        rasters[name] = raster
        step, idx = np.nonzero(raster)
        rec = {
            **base,
            "impl": "neurojax",
            "config": name,
            "dtype": "float32",
            **timing.as_dict(),
            "steps_per_s": n_steps / timing.run_s,
            "n_synapses": net.n_synapses,
            "n_ee": net.projections[0].n_synapses,
            **_coba.spike_stats(idx, step * DT, p["n_exc"], p["n_inh"], duration),
        }
        if name != "static":
            rec[f"{name}_over_static"] = timing.run_s / results["static"]["run_s"]
        if name == "stp_same_spikes":
            rec["stp_params"] = SAME_SPIKES
        if name in ("learnable_delays", "stp_same_spikes"):
            rec["spikes_equal_static"] = bool(np.array_equal(raster, rasters["static"]))
        results[name] = rec
        _harness.emit(rec)
        if name == "stp_same_spikes" and not rec["spikes_equal_static"]:
            # Its time would not be the rule's own cost at the static run's activity.
            raise RuntimeError(
                "plasticity_stp: the stp_same_spikes run's spikes differ from the static "
                f"run's ({rec['n_spikes']} against {results['static']['n_spikes']} spikes); "
                f"with {SAME_SPIKES} every release should equal the static weight"
            )
    del rasters
    summary = [
        f"neurojax {name} / static: {results[name][f'{name}_over_static']:.2f}x"
        for name in CONFIGS[1:]
    ]

    n_pairs = args.pairs if args.pairs is not None else (2 if args.quick else 9)
    if n_pairs > 0:
        _harness.log(f"plasticity_stp: neurojax, {n_pairs} interleaved rounds")
        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for _ in range(n_pairs):
            for name in CONFIGS:
                compiled, net, state = calls[name]
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(net, state))
                times[name].append(time.perf_counter() - t0)
        static_t = np.asarray(times["static"])
        rec = {
            **base,
            "impl": "neurojax",
            "measure": "interleaved",
            "pairs": n_pairs,
            "stp_same_spikes_params": SAME_SPIKES,
            **{f"{name}_times_s": times[name] for name in CONFIGS},
            **{f"{name}_run_s": float(np.median(times[name])) for name in CONFIGS},
        }
        for name in CONFIGS[1:]:
            paired = float(np.median(np.asarray(times[name]) / static_t))
            rec[f"{name}_over_static_paired"] = paired
            summary.append(f"interleaved {name} / static: {paired:.2f}x")
        _harness.emit(rec)
    del calls

    if args.peers:
        peer: dict[str, dict[str, Any]] = {}
        peer_res: dict[str, dict[str, Any]] = {}
        peer_configs = (
            ("static", False, stp_params),
            ("stp", True, stp_params),
            ("stp_same_spikes", True, SAME_SPIKES),
        )
        for name, stp, params in peer_configs:
            _harness.log(f"plasticity_stp: brian2_standalone {name}")
            spec = {
                "model": "coba",
                "mode": "standalone",
                "threads": args.threads,
                "seed": SEED,
                "duration_ms": duration,
                "repeats": args.repeats,
                "budget_s": args.budget,
                "stp": stp,
                "stp_params": params,
            }
            res = _harness.run_peer("benchmarks.plasticity_stp", spec, threads=args.threads)
            rec = {**base, "impl": "brian2_standalone", "config": name}
            if name == "stp_same_spikes":
                rec["stp_params"] = SAME_SPIKES
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(dtype=res.get("float_dtype"), **_harness.timing_from_peer(res))
                rec["steps_per_s"] = n_steps / rec["run_s"]
                for key in ("build_s", "n_synapses", "rate_exc_hz", "rate_inh_hz", "n_spikes"):
                    if key in res:
                        rec[key] = res[key]
                if stp and "error" not in peer["static"]:
                    rec[f"{name}_over_static"] = rec["run_s"] / peer["static"]["run_s"]
                    summary.append(f"Brian2 {name} / static: {rec[f'{name}_over_static']:.2f}x")
                if name == "stp_same_spikes" and "error" not in peer["static"]:
                    static_res = peer_res["static"]
                    same = all(res.get(k) == static_res.get(k) for k in SAME_STATS)
                    rec["spikes_equal_static"] = same
                    if not same:
                        summary.append("Brian2 stp_same_spikes: SPIKES DIFFER FROM ITS STATIC RUN")
                rec["neurojax_over_peer"] = results[name]["run_s"] / rec["run_s"]
                summary.append(f"neurojax / Brian2 ({name}): {rec['neurojax_over_peer']:.2f}x")
            peer[name] = rec
            peer_res[name] = res
            _harness.emit(rec)
    _harness.log("plasticity_stp: " + "; ".join(summary))


def brian2_stp_synapses(u: float, tau_rec: float, tau_facil: float) -> dict[str, str]:
    """Brian2 `Synapses` arguments for the Tsodyks-Markram rule (u jumps before release;
    `x = 1 - R` starts at 0, Brian2's default for a synaptic variable)."""
    if tau_facil > 0:
        return {
            "model": f"""
w : 1
du/dt = -u / ({tau_facil}*ms) : 1 (event-driven)
dx/dt = -x / ({tau_rec}*ms) : 1 (event-driven)
""",
            "on_pre": f"""
u += {u} * (1 - u)
ge_post += w * u * (1 - x)
x += u * (1 - x)
""",
        }
    return {
        "model": f"""
w : 1
dx/dt = -x / ({tau_rec}*ms) : 1 (event-driven)
""",
        "on_pre": f"""
ge_post += w * {u} * (1 - x)
x += {u} * (1 - x)
""",
    }


def _peer_run(spec: dict[str, Any]) -> dict[str, Any]:
    """The Brian2 peer: `benchmarks.peers.brian2_coba_stdp` with its plastic `Pe -> Pe`
    synapses replaced by the Tsodyks-Markram rule (or static)."""
    from .peers import brian2_coba_stdp

    brian2_coba_stdp.PLASTIC = brian2_stp_synapses(**spec["stp_params"])
    res = brian2_coba_stdp.run({**spec, "stdp": bool(spec["stp"])})
    for key in ("stdp", "stdp_params", "w_ee_mean", "w_ee_std", "w_ee_frac_min", "w_ee_frac_max"):
        res.pop(key, None)
    res["stp"] = bool(spec["stp"])
    return res


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].lstrip().startswith("{"):
        _harness.peer_main(_peer_run)
    else:
        main(sys.argv[1:])
