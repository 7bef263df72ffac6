"""Benchmark: the cost of each plasticity rule on the COBA network, neurojax against Brian2.

The COBA network of `nj.models.coba` (4000 LIF neurons, p = 0.02, dt = 0.1 ms, seed 0, about
205 000 excitatory-to-excitatory synapses), 1 s simulated after a 200 ms warm-up of the
static network (`WARMUP_MS`), float32, once static and once per rule of `RULES` on its E->E
projection (projection 0 rebuilt with the same connectivity,
kinetics and output plus `plasticity=`, as `benchmarks.stdp_overhead.with_stdp` does). Every
rule starts from the initial weight 0.6 inside its bounds. `RewardSTDP` reads a dopamine
series given through `nj.simulate(..., inputs={"dopamine": d})`: a tonic 0.01 plus a reward
pulse (0.5, decaying with 200 ms) every 250 ms, scaled to weight units by `DOPAMINE_SCALE`.
Vogels' rule runs on E->E here too, so that every rule acts on the same 205 000 synapses.

Timing: each configuration is compiled ahead of time (`compile_s`); then `--pairs` rounds
call every configuration once, in turn, so that a change of the machine's load moves all of
them alike; a record per rule carries the median over rounds of its time divided by the
static run's time in the same round (`over_static`).

Peer in the same run: Brian2 2.9 C++ standalone (one thread), the same network
(`benchmarks.peers.brian2_coba_stdp`) static and with each rule Brian2 can express on its
`Pe -> Pe` synapses (`BRIAN2_RULES`): pair STDP and triplet STDP and Vogels' rule with
event-driven traces, and reward-modulated STDP the way Brian2 writes it, with the
eligibility and the weight integrated `(clock-driven)` on every synapse at every step and
the dopamine as a `TimedArray`. Its records carry `over_static` (its own rule / its own
static run) and `neurojax_over_peer`. Brian2 draws its own network and trains.

Run: `python -m benchmarks.plasticity [--quick] [--duration MS] [--pairs P] [--no-peers]
[--threads 1|2] [--repeats R] [--rules triplet,vogels]`; `--quick` simulates 100 ms with 2
rounds; `--rules` times only the named rules (with the static run).
"""

import argparse
import sys
import time
from typing import Any

from . import _harness

DT = 0.1  # ms
DURATION = 1000.0  # ms
QUICK_DURATION = 100.0
SEED = 0
WARMUP_MS = 200.0
DOPAMINE_SCALE = 1e-4  # d [weight units / ms per unit eligibility] per uM of dopamine


def _rules() -> dict[str, Any]:
    """The rules timed, by name: a factory of the neurojax rule. Short-term plasticity and
    learnable delays are not weight rules of this kind: `benchmarks/plasticity_stp.py` times
    them on the same network, against the same static run and Brian2."""
    import neurojax as nj

    bounds = {"w_min": 0.0, "w_max": 1.2}
    return {
        "stdp": lambda: nj.STDP(
            a_plus=0.006, a_minus=0.0063, tau_plus=20.0, tau_minus=20.0, **bounds
        ),
        "triplet": lambda: nj.TripletSTDP.preset("visual_cortex_all_to_all", **bounds),
        "vogels": lambda: nj.VogelsSTDP(eta=1e-3, tau=20.0, rho0=3.0, **bounds),
        "reward": lambda: nj.RewardSTDP(
            a_plus=0.1, a_minus=0.15, tau_plus=20.0, tau_minus=20.0, tau_c=1000.0, **bounds
        ),
    }


RULES = ("stdp", "triplet", "vogels", "reward")
MODULATED = {"reward": "dopamine"}  # rules whose run takes a neuromodulator series


def dopamine(n_steps: int, dt: float = DT) -> Any:
    """Tonic 0.01 uM plus a 0.5 uM pulse decaying with 200 ms every 250 ms (Izhikevich
    2007's reward), in weight units per ms (`DOPAMINE_SCALE`); float32, `(n_steps,)`."""
    import numpy as np

    t = np.arange(n_steps) * dt
    phase = np.mod(t, 250.0)
    d = 0.01 + 0.5 * np.exp(-phase / 200.0) * (t >= 250.0)
    return (DOPAMINE_SCALE * d).astype(np.float32)


# ---------------------------------------------------------------------------- Brian2 peer
# Synapse models for `Pe -> Pe`, in the names of `brian2_coba_stdp`: each adds `w` to `ge`.

BRIAN2_RULES: dict[str, dict[str, Any]] = {
    "triplet": {
        "model": """
w : 1
dr1/dt = -r1/tau_plus : 1 (event-driven)
dr2/dt = -r2/tau_x : 1 (event-driven)
do1/dt = -o1/tau_minus : 1 (event-driven)
do2/dt = -o2/tau_y : 1 (event-driven)
""",
        "on_pre": """
ge_post += w
w = clip(w - o1*(a2_minus + a3_minus*r2), w_min, w_max)
r1 += 1
r2 += 1
""",
        "on_post": """
w = clip(w + r1*(a2_plus + a3_plus*o2), w_min, w_max)
o1 += 1
o2 += 1
""",
    },
    "vogels": {
        "model": """
w : 1
dapre/dt = -apre/tau : 1 (event-driven)
dapost/dt = -apost/tau : 1 (event-driven)
""",
        "on_pre": """
ge_post += w
w = clip(w + eta*(apost - alpha), w_min, w_max)
apre += 1
""",
        "on_post": """
w = clip(w + eta*apre, w_min, w_max)
apost += 1
""",
    },
    "reward": {
        "model": """
dc/dt = -c/tau_c : 1 (clock-driven)
dw/dt = c*dopamine(t)/ms : 1 (clock-driven)
dapre/dt = -apre/tau_plus : 1 (event-driven)
dapost/dt = -apost/tau_minus : 1 (event-driven)
""",
        "on_pre": """
ge_post += clip(w, w_min, w_max)
c -= a_minus*apost
apre += 1
""",
        "on_post": """
c += a_plus*apre
apost += 1
""",
    },
}


def _brian2_namespace(b2: Any, name: str, rule: Any, n_steps: int) -> dict[str, Any]:
    import numpy as np

    ms = b2.ms
    out = {"w_min": float(rule.w_min), "w_max": float(rule.w_max)}
    if name == "triplet":
        for k in ("a2_plus", "a3_plus", "a2_minus", "a3_minus"):
            out[k] = float(getattr(rule, k))
        for k in ("tau_plus", "tau_minus", "tau_x", "tau_y"):
            out[k] = float(getattr(rule, k)) * ms
    elif name == "vogels":
        out.update(eta=float(rule.eta), tau=float(rule.tau) * ms, alpha=float(rule.alpha))
    elif name == "reward":
        out.update(a_plus=float(rule.a_plus), a_minus=float(rule.a_minus))
        out.update(tau_plus=float(rule.tau_plus) * ms, tau_minus=float(rule.tau_minus) * ms)
        out.update(tau_c=float(rule.tau_c) * ms)
        out["dopamine"] = b2.TimedArray(dopamine(n_steps).astype(np.float64), dt=DT * ms)
    return out


def brian2_run(spec: dict[str, Any]) -> dict[str, Any]:
    """Peer process: Brian2 standalone COBA, static (`rule` None) or with `rule` on
    `Pe -> Pe`."""
    from .peers import _brian2, _coba, brian2_coba, brian2_coba_stdp

    name = spec["rule"]
    p = _coba.COBA
    duration = float(spec["duration_ms"])
    n_steps = int(round(duration / DT))
    b2 = _brian2.setup("standalone", threads=int(spec["threads"]), dt_ms=p["dt"])
    b2.seed(int(spec["seed"]))
    if name in (None, "stdp"):
        net, spikes, synapses = brian2_coba_stdp._network(
            b2, name == "stdp", brian2_coba_stdp.STDP_PARAMS
        )
    else:
        rule = _rules()[name]()
        syn_model = BRIAN2_RULES[name]
        ns = _brian2_namespace(b2, name, rule, n_steps)
        net, spikes, synapses = _brian2_network(b2, syn_model, ns)
    result: dict[str, Any] = {"impl": "brian2_standalone", "rule": name, "seed": spec["seed"]}
    brian2_coba.time_and_measure(b2, net, spikes, synapses, p, spec, "standalone", result)
    return result


def _brian2_network(b2: Any, syn_model: dict[str, str], syn_ns: dict[str, Any]):
    """`brian2_coba_stdp._network` with another synapse model on `Pe -> Pe`."""
    from .peers import _coba, brian2_coba, brian2_coba_stdp

    p = _coba.COBA
    ms, mV = b2.ms, b2.mV
    ns = {
        "e_l": p["e_l"] * mV,
        "v_th": p["v_th"] * mV,
        "v_reset": p["v_reset"] * mV,
        "tau_m": p["tau_m"] * ms,
        "tau_exc": p["tau_exc"] * ms,
        "tau_inh": p["tau_inh"] * ms,
        "e_exc": p["e_exc"] * mV,
        "e_inh": p["e_inh"] * mV,
        "i_ext": p["i_ext"] * mV,
        "w_inh": p["w_inh"],
    }
    n_exc = p["n_exc"]
    group = b2.NeuronGroup(
        n_exc + p["n_inh"],
        brian2_coba.COBA_EQUATIONS,
        method="euler",
        threshold="v > v_th",
        reset="v = v_reset",
        refractory=p["t_ref"] * ms,
        namespace=ns,
    )
    group.v = f"{p['v0_mean']}*mV + {p['v0_std']}*mV*randn()"
    group.ge = 0
    group.gi = 0
    exc, inh = group[:n_exc], group[n_exc:]
    # the eligibility and weight of reward-modulated STDP read a TimedArray: forward Euler
    method = "euler" if "clock-driven" in syn_model["model"] else "exact"
    ee = b2.Synapses(exc, exc, namespace=syn_ns, method=method, **syn_model)
    ei = b2.Synapses(exc, inh, **brian2_coba_stdp.STATIC)
    ie = b2.Synapses(inh, group, on_pre="gi += w_inh", namespace=ns)
    for syn in (ee, ei, ie):
        syn.connect(p=p["p_conn"])
    ee.w = p["w_exc"]
    ei.w = p["w_exc"]
    spikes = b2.SpikeMonitor(group)
    return b2.Network(group, ee, ei, ie, spikes), spikes, [ee, ei, ie]


# ---------------------------------------------------------------------------- neurojax


def _rule_list(text: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n)
    unknown = [n for n in names if n not in RULES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"names must be among {RULES}, got {text!r}")
    return names


def _extra(parser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (1000)")
    parser.add_argument("--pairs", type=int, default=None, help="timed rounds (7; quick: 2)")
    parser.add_argument(
        "--rules",
        type=_rule_list,
        default=RULES,
        help=f"comma-separated rules to time beside the static run (default: all of {RULES})",
    )


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=(4000,), quick_sizes=(4000,), argv=argv, extra=_extra
    )
    import equinox as eqx
    import jax
    import numpy as np

    import neurojax as nj

    from .peers import _coba
    from .stdp_overhead import with_stdp

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    rounds = args.pairs if args.pairs is not None else (2 if args.quick else 7)
    p = _coba.COBA
    base = {
        "bench": "plasticity",
        "model": "coba",
        "dt": DT,
        "steps": n_steps,
        "duration_ms": duration,
        "seed": SEED,
        "threads": args.threads,
    }
    static_net, static_state = nj.models.coba(jax.random.key(SEED))
    # Past the synchronous burst of the first milliseconds (initial v ~ N(-55, 5) mV puts
    # hundreds of neurons above threshold at once), which would size the pure-JAX path's
    # static spike buffer for the whole run: every configuration starts from the voltages
    # after WARMUP_MS of the static network, with synapses and buffers at rest.
    warm, _ = nj.simulate(static_net, static_state, dt=DT, n_steps=int(WARMUP_MS / DT))
    static_state = eqx.tree_at(lambda s: s.populations, static_net.init_state(), warm.populations)
    factories = _rules()
    configs: dict[str, tuple[Any, Any, Any]] = {"static": (static_net, static_state, None)}
    for name in args.rules:
        net, state = with_stdp(static_net, static_state, factories[name]())
        inputs = {MODULATED[name]: dopamine(n_steps)} if name in MODULATED else None
        configs[name] = (net, state, inputs)

    def run(net, state, inputs):
        final, rec = nj.simulate(net, state, inputs, dt=DT, n_steps=None if inputs else n_steps)
        return final.plastic, rec.spikes

    compiled, records = {}, {}
    capacity = 1
    for name, (net, state, inputs) in configs.items():
        _harness.log(f"plasticity: neurojax {name}: compile")
        if inputs is None:
            net = _harness.fit_spike_capacity(net, state, dt=DT, n_steps=n_steps)
            capacity = max(capacity, net.capacity)
        else:  # fit_spike_capacity runs without inputs; a short buffer is only rerun larger
            net = net.with_capacity(capacity)
        t0 = time.perf_counter()
        call = jax.jit(run).lower(net, state, inputs).compile()
        compile_s = time.perf_counter() - t0
        plastic, spikes = jax.block_until_ready(call(net, state, inputs))  # warm-up
        raster = np.concatenate([np.asarray(spikes["E"]), np.asarray(spikes["I"])], axis=-1)
        step, idx = np.nonzero(raster)
        rec = {
            **base,
            "impl": "neurojax",
            "rule": name,
            "dtype": "float32",
            "compile_s": compile_s,
            **_coba.spike_stats(idx, step * DT, p["n_exc"], p["n_inh"], duration),
        }
        if name != "static":
            w = np.asarray(plastic[0].weights, np.float64)
            rec.update(w_ee_mean=float(w.mean()), w_ee_std=float(w.std()))
        records[name] = rec
        compiled[name] = (call, net, state, inputs)
        del plastic, spikes, raster

    times: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(rounds):
        _harness.log(f"plasticity: neurojax round {r + 1}/{rounds}")
        for name, (call, net, state, inputs) in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(call(net, state, inputs))
            times[name].append(time.perf_counter() - t0)
    static_t = np.asarray(times["static"])
    summary = []
    for name, rec in records.items():
        t = np.asarray(times[name])
        rec.update(times_s=times[name], run_s=float(np.median(t)), rounds=rounds)
        rec["steps_per_s"] = n_steps / rec["run_s"]
        if name != "static":
            rec["over_static"] = float(np.median(t / static_t))
            summary.append(f"{name} {rec['over_static']:.2f}x")
        _harness.emit(rec)
    _harness.log("plasticity: neurojax rule / static: " + ", ".join(summary))

    if args.peers:
        peer: dict[str, dict[str, Any]] = {}
        for name in (None, *(n for n in ("stdp", *BRIAN2_RULES) if n in args.rules)):
            _harness.log(f"plasticity: brian2_standalone {name or 'static'}")
            spec = {
                "rule": name,
                "threads": args.threads,
                "seed": SEED,
                "duration_ms": duration,
                "repeats": args.repeats,
                "budget_s": args.budget,
            }
            res = _harness.run_peer("benchmarks.plasticity", spec, threads=args.threads)
            key = name or "static"
            rec = {**base, "impl": "brian2_standalone", "rule": key}
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(**_harness.timing_from_peer(res))
                for k in ("rate_exc_hz", "rate_inh_hz", "n_synapses", "build_s"):
                    if k in res:
                        rec[k] = res[k]
                if key != "static" and "run_s" in peer.get("static", {}):
                    rec["over_static"] = rec["run_s"] / peer["static"]["run_s"]
                    summary.append(f"Brian2 {key} {rec['over_static']:.2f}x")
                rec["neurojax_over_peer"] = records[key]["run_s"] / rec["run_s"]
            peer[key] = rec
            _harness.emit(rec)
    _harness.log("plasticity: " + "; ".join(summary))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        _harness.peer_main(brian2_run)
    else:
        main(sys.argv[1:])
