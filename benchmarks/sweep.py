"""Benchmark: a COBA parameter sweep through `nj.parallel.sweep`, time per trial (issue 7).

The network is `nj.models.coba` (Brette et al. 2007: 3200 E + 800 I LIF neurons, p = 0.02,
conductance synapses, dt = 0.1 ms, forward Euler), seed 0, float32, 1 s simulated. The sweep
is an 8 x 8 grid of the excitatory and inhibitory conductance increments, as multiples
`g_exc`, `g_inh` of the published 0.6 and 6.7 (0.6 to 1.3 in steps of 0.1, so the grid holds
the published network at `g_exc = g_inh = 1`): 64 parameter sets on the same connectivity and
the same initial voltages.

**How the parameters enter.** The kinetics are linear (`g` is the sum of the arriving weights
filtered by the synaptic kernel), so scaling every weight of a projection by `s` is the same
as scaling its `g` by `s`. The benchmark realises `s` in the synapse output, with a
`ScaledConductanceOutput(e_rev, scale)` (`I = scale g (e_rev - v)`, a `SynapseOutput` defined
here: `nj.ConductanceOutput` holds only `e_rev`), so that the projection weights stay shared
by all trials. Scaling the weights themselves (`eqx.tree_at(lambda p: p.weights, ...)` inside
`fn`) gives every trial its own weight vector under `vmap`; that path is measured too, on
fewer trials (`weights_sweep`), to document its cost.

Configurations (one JSON line each; `config` names it). Every trial runs the same function,
`CobaTrial(params) -> spike counts per population`, recorded with `record_every = n_steps`
(one spike count per neuron for the whole run), so recording costs the same everywhere:

- `single`: one trial alone at the published parameters, `jax.jit` compiled ahead of time
  (compile excluded), median of the repeats. The reference of every ratio.
- `loop`: the same compiled single trial called on each of the 64 parameter sets in turn
  (a Python loop); its `run_per_trial_s` is a reference that matches the sweep's firing
  rates (the event-driven cost grows with the number of spikes, and the grid runs from 12 to
  50 Hz against 21 Hz at the published parameters).
- `sweep`: `nj.parallel.sweep(fn, params)`, all 64 at once, and with `batch_size` 4, 8, 16
  and 32 (chunks run one after the other, each chunk vmapped). Timed by the harness's
  `time_call`: the first call (tracing and compilation) is the warm-up, and `compile_s` is
  estimated as that call minus the median. `equal_to_loop` says whether its spike counts
  equal the loop's, trial for trial.
- `state_batch`: the path of `benchmarks.brette_networks`, without `sweep`:
  `nj.models.coba(key, batch=64)` (64 trials that differ only in their initial voltages, at
  the published parameters) through one `nj.simulate`, as one block and with
  `batch_block=4`.
- `state_batch_params`: the same state batch, with the 64 parameter sets given as a
  `(64, 1)` `scale` in the synapse outputs (broadcast against the batched `g`): the sweep
  without `vmap` (one block; `batch_block` would split the state but not the scales).
- `weights_sweep`: `nj.parallel.sweep` over the diagonal of the grid (`--weight-trials`,
  default 8, parameter sets `g_exc = g_inh`) with the scale applied to the projection
  weights, which makes the weights batched.

Reported per configuration: `run_s` (median), `run_per_trial_s` = `run_s` / trials,
`per_trial_over_single` (against `single`, the issue's target is <= 0.3), `meets_target`,
`per_trial_over_loop`, and the firing rates per parameter set (`rate_hz`, `rate_exc_hz`,
`rate_inh_hz`, lists in the order of `params`; row-major over `g_exc`, then `g_inh`).

`--quick` (the smoke test): 400 + 100 neurons with p = 0.16 (the same fan-in of ~80),
50 ms, a 4 x 4 grid (0.8 to 1.1), batch sizes 4 and 8, 4 weight trials, at most 3 repeats.

Run: `python -m benchmarks.sweep [--quick] [--duration MS] [--grid N] [--batch-sizes 4,8]
[--weight-trials K] [--threads 1|2] [--repeats R] [--budget S]`. `--sizes` and `--peers` are
not used (there is no peer: the comparison is with neurojax's own single trial).
"""

import sys
from typing import Any

from . import _harness

DT = 0.1  # ms
DURATION = 1000.0  # ms
QUICK_DURATION = 50.0
SEED = 0
TARGET = 0.3  # time per trial in the sweep / one trial alone (issue 7)
GRID = 8  # values per axis: GRID**2 parameter sets
QUICK_GRID = 4
SCALE_STEP = 0.1  # g_exc, g_inh = 0.6, 0.7, ... 1.3 for the 8 x 8 grid (1.0 is the 5th value)
BATCH_SIZES = (4, 8, 16, 32)
QUICK_BATCH_SIZES = (4, 8)
WEIGHT_TRIALS = 8
QUICK_WEIGHT_TRIALS = 4
BLOCK = 4  # batch_block of the state-batch configuration, as in brette_networks
QUICK_NET = dict(n_exc=400, n_inh=100, p=0.16)


def _extra(parser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="simulated ms (1000)")
    parser.add_argument("--grid", type=int, default=None, help="values per axis (8)")
    parser.add_argument(
        "--batch-sizes", default=None, help="comma-separated batch_size values (4,8,16,32)"
    )
    parser.add_argument(
        "--weight-trials", type=int, default=None, help="trials of the weight-scale sweep (8)"
    )


def scales(n: int) -> list[float]:
    """The `n` values of each grid axis, in steps of 0.1 around the published 1.0, which is
    always among them: 0.6 ... 1.3 for n = 8, 0.8 ... 1.1 for n = 4."""
    lo = 1.0 - SCALE_STEP * (n // 2)
    return [round(lo + SCALE_STEP * i, 6) for i in range(n)]


def _model():
    """The module-level model classes (defined after JAX is imported, see `main`)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import neurojax as nj

    class ScaledConductanceOutput(nj.synapses.SynapseOutput):
        """`I = scale g (e_rev - v)`: a conductance output whose increments are scaled."""

        e_rev: jax.Array
        scale: jax.Array

        def __call__(self, g, v):
            return self.scale * g * (self.e_rev - v)

    def scaled_network(net, g_exc, g_inh, where: str):
        """`net` with the E and I conductances scaled by `g_exc`, `g_inh`.

        `where="output"`: in the synapse outputs (weights shared); `"weights"`: in the
        projection weights (one weight vector per trial under vmap).
        """
        projs = []
        for proj in net.projections:
            s = g_exc if proj.pre == "E" else g_inh
            if where == "output":
                out = ScaledConductanceOutput(jnp.asarray(proj.output.e_rev), s)
                proj = eqx.tree_at(lambda p: p.output, proj, out)
            else:
                proj = eqx.tree_at(lambda p: p.weights, proj, proj.weights * s)
            projs.append(proj)
        return eqx.tree_at(lambda n: n.projections, net, tuple(projs))

    def counts(spikes) -> dict[str, jax.Array]:
        """Total spikes per population from a recording with one window for the whole run."""
        return {k: jnp.sum(v, axis=(0, -1), dtype=jnp.int32) for k, v in spikes.items()}

    class CobaTrial(eqx.Module):
        """One trial of the sweep: `params = {"g_exc": s_e, "g_inh": s_i}` -> spike counts."""

        net: Any
        state: Any
        n_steps: int = eqx.field(static=True)
        where: str = eqx.field(static=True, default="output")

        def __call__(self, params):
            net = scaled_network(self.net, params["g_exc"], params["g_inh"], self.where)
            _, rec = nj.simulate(
                net, self.state, dt=DT, n_steps=self.n_steps, record_every=self.n_steps
            )
            return counts(rec.spikes)

    return ScaledConductanceOutput, scaled_network, counts, CobaTrial


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=(4000,), quick_sizes=(500,), argv=argv, extra=_extra
    )
    import jax
    import jax.numpy as jnp
    import numpy as np

    import neurojax as nj

    _, scaled_network, counts, CobaTrial = _model()

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    n_steps = int(round(duration / DT))
    grid = args.grid or (QUICK_GRID if args.quick else GRID)
    if args.batch_sizes is not None:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    else:
        batch_sizes = list(QUICK_BATCH_SIZES if args.quick else BATCH_SIZES)
    n_weight = args.weight_trials or (QUICK_WEIGHT_TRIALS if args.quick else WEIGHT_TRIALS)
    if grid < 1 or n_weight < 1 or any(b < 1 for b in batch_sizes):
        raise SystemExit("--grid, --batch-sizes and --weight-trials must be positive")
    net_kw = QUICK_NET if args.quick else {}

    values = scales(grid)
    g_e, g_i = (a.ravel() for a in np.meshgrid(values, values, indexing="ij"))
    params = {"g_exc": jnp.asarray(g_e, jnp.float32), "g_inh": jnp.asarray(g_i, jnp.float32)}
    n_params = int(g_e.size)
    default = {"g_exc": jnp.float32(1.0), "g_inh": jnp.float32(1.0)}
    diag = np.arange(min(n_weight, grid)) * (grid + 1)  # indices of g_exc == g_inh
    weight_params = {k: v[jnp.asarray(diag)] for k, v in params.items()}

    key = jax.random.key(SEED)
    net, state = nj.models.coba(key, method="event", **net_kw)
    n_exc, n_inh = net.sizes["E"], net.sizes["I"]
    window_s = duration * 1e-3
    trial = CobaTrial(net, state, n_steps)
    base = {
        "bench": "sweep",
        "model": "coba",
        "dt": DT,
        "steps": n_steps,
        "duration_ms": duration,
        "n_neurons": n_exc + n_inh,
        "n_synapses": net.n_synapses,
        "seed": SEED,
        "threads": args.threads,
        "dtype": "float32",
        "swept": "g_exc, g_inh (conductance increments x 0.6 and x 6.7, in the synapse outputs)",
        "target": TARGET,
        "cpu_kernel": _harness.neurojax_cpu_kernel(),
    }

    def rates(c: dict[str, Any]) -> dict[str, Any]:
        e = np.asarray(c["E"], np.float64).reshape(-1)
        i = np.asarray(c["I"], np.float64).reshape(-1)
        return {
            "rate_hz": (e + i) / ((n_exc + n_inh) * window_s),
            "rate_exc_hz": e / (n_exc * window_s),
            "rate_inh_hz": i / (n_inh * window_s),
            "rate_hz_mean": float((e + i).sum() / ((n_exc + n_inh) * window_s * e.size)),
        }

    single: dict[str, Any] = {}
    loop_counts: dict[str, np.ndarray] = {}

    def emit(config: str, trials: int, timing, c, p, **extra) -> dict[str, Any]:
        per_trial = timing.run_s / trials
        rec = {**base, "config": config, "trials": trials, **extra, **timing.as_dict()}
        rec["run_per_trial_s"] = per_trial
        if single:
            rec["per_trial_over_single"] = per_trial / single["run_s"]
            rec["meets_target"] = rec["per_trial_over_single"] <= TARGET
        if "loop" in single:
            rec["per_trial_over_loop"] = per_trial / single["loop"]
        if p is not None:
            rec["params"] = {k: np.asarray(v) for k, v in p.items()}
        rec.update(rates(c))
        _harness.emit(rec)
        return rec

    # (a) one trial alone, compiled ahead of time.
    _harness.log(f"sweep: single trial, {n_exc + n_inh} neurons, {n_steps} steps")

    def one(trial, p):
        return trial(p)

    timing, c, compiled = _harness.time_jax(
        one, (trial, default), repeats=args.repeats, budget_s=args.budget
    )
    single["run_s"] = timing.run_s
    emit("single", 1, timing, c, {k: v[None] for k, v in default.items()})

    # (a') the same compiled trial over every parameter set, one after the other.
    _harness.log(f"sweep: loop of {n_params} single trials")
    rows = [{k: v[j] for k, v in params.items()} for j in range(n_params)]

    def loop():
        outs = [jax.block_until_ready(compiled(trial, r)) for r in rows]
        return {k: np.stack([np.asarray(o[k]) for o in outs]) for k in outs[0]}

    timing, loop_counts = _harness.time_call(
        loop, repeats=min(args.repeats, 3), budget_s=args.budget
    )
    timing.compile_s = None  # compiled above; the warm-up only runs
    single["loop"] = timing.run_s / n_params
    emit("loop", n_params, timing, loop_counts, params)

    def equal_to_loop(c) -> bool:
        return all(np.array_equal(np.asarray(c[k]), loop_counts[k]) for k in loop_counts)

    # (b, c) nj.parallel.sweep, all at once and in chunks.
    for bs in [None, *batch_sizes]:
        if bs is not None and bs >= n_params:
            continue
        _harness.log(f"sweep: nj.parallel.sweep of {n_params}, batch_size={bs}")
        timing, c = _harness.time_call(
            lambda bs=bs: nj.parallel.sweep(trial, params, batch_size=bs),
            repeats=args.repeats,
            budget_s=args.budget,
        )
        emit("sweep", n_params, timing, c, params, batch_size=bs, equal_to_loop=equal_to_loop(c))

    # (d) the state-batch path of brette_networks: published parameters, 64 initial states.
    _, bstate = nj.models.coba(key, batch=n_params, method="event", **net_kw)
    for block in (None, BLOCK):
        if block is not None and (n_params <= block or n_params % block):
            continue
        _harness.log(f"sweep: state batch of {n_params}, batch_block={block}")

        def run_batch(net, state, block=block):
            _, rec = nj.simulate(
                net,
                state,
                dt=DT,
                n_steps=n_steps,
                record_every=n_steps,
                run=nj.Execution(batch_block=block),
            )
            return counts(rec.spikes)

        timing, c, _ = _harness.time_jax(
            run_batch, (net, bstate), repeats=args.repeats, budget_s=args.budget
        )
        emit("state_batch", n_params, timing, c, None, batch_block=block)

    # (d') the state batch with the parameter sets as (B, 1) scales: the sweep without vmap.
    _harness.log(f"sweep: state batch of {n_params} with per-trial scales")
    # Every per-trial leaf gets the batch axis (the per-group spike peaks too, which are
    # scalars in an unbatched state); the step counter stays one scalar for all trials.
    state0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n_params,) + x.shape), state)
    state0 = type(state0)(**{**vars(state0), "step": state.step})

    def run_params(net, state, p):
        scaled = scaled_network(net, p["g_exc"][:, None], p["g_inh"][:, None], "output")
        _, rec = nj.simulate(scaled, state, dt=DT, n_steps=n_steps, record_every=n_steps)
        return counts(rec.spikes)

    timing, c, _ = _harness.time_jax(
        run_params, (net, state0, params), repeats=args.repeats, budget_s=args.budget
    )
    emit("state_batch_params", n_params, timing, c, params, equal_to_loop=equal_to_loop(c))

    # (e) the scale in the weights: batched weights under vmap.
    n_w = int(diag.size)
    _harness.log(f"sweep: weight-scale sweep of {n_w} (batched weights)")
    wtrial = CobaTrial(net, state, n_steps, where="weights")
    timing, c = _harness.time_call(
        lambda: nj.parallel.sweep(wtrial, weight_params),
        repeats=min(args.repeats, 3),
        budget_s=args.budget,
    )
    same = {k: v[diag] for k, v in loop_counts.items()}
    emit(
        "weights_sweep",
        n_w,
        timing,
        c,
        weight_params,
        output_scaled_rate_hz=rates(same)["rate_hz"],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
