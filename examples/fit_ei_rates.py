"""Example: fit the input weights of a recurrent E/I spiking network to target firing rates.

A recurrent network of 80 excitatory (E) and 20 inhibitory (I) LIF neurons (mV and ms as in
`nj.models`: tau_m 20 ms, rest and reset -60 mV, threshold -50 mV, 2 ms refractory) is built
with the library's `nj.Network`: fixed recurrent projections E->E, E->I (+0.5 and +1 mV
jumps, 5 ms exponential synapses), I->E, I->I (-4 mV, 10 ms), each pair connected with
probability 0.2 (no autapses); and 200 external Poisson neurons (`nj.PoissonSource`, 10 Hz)
projecting onto E and onto I with probability 0.2 (5 ms synapses). The weights of those
input synapses (3934 of them, dense projections masked to the drawn connectivity, all 10 mV
at first) are the trainable parameters, as log-weights so that they stay positive.

Each optimiser step runs `nj.simulate(net, ..., spike_dtype=None)` for 4 trials of 500 ms
(dt 0.5 ms) from fresh input spikes and initial voltages, takes the population rates from
the float spikes, and minimises `(rate_E - 5 Hz)^2 + (rate_I - 15 Hz)^2` with optax's Adam
(cosine-decayed rate). The gradient flows through the network's scan via the LIF neurons'
surrogate spikes and the dense projections; the recurrent weights stay fixed. At the end the
rates are measured on held-out trials (8 x 1 s, new keys).

Run: `python examples/fit_ei_rates.py [--steps N] [--duration MS] [--trials K] [--seed S]
[--quick] [--plot FILE] [--json]`. `--quick`: 80 steps of 4 x 250 ms (about 10 s; held-out
rates within 0.25 Hz of the targets over seeds 0-2, from about 38 and 48 Hz). `--plot FILE`
draws the loss and both rates per step and a raster after training
(docs/images/fit_ei_rates.png).

Result of `python examples/fit_ei_rates.py --plot docs/images/fit_ei_rates.png` (defaults:
150 steps, Adam 0.04 on the log-weights, seed 0) on 2 CPU cores, jax 0.10.2:

     step   loss Hz^2  rate E Hz  rate I Hz
        0    2360.970      38.60      50.10
       10     636.799      15.04      38.15
       20      87.117       6.96      24.12
       30       9.605       5.95      17.95
       40       1.518       5.13      13.77
       70       0.156       4.77      14.67
      100       0.064       5.04      15.25
      130       1.240       4.42      14.05
      149       0.101       5.11      15.30
    held-out (8 x 1 s): E 5.06 Hz (target 5), I 15.11 Hz (target 15); mean input weight
    onto E 4.52 mV, onto I 5.18 mV (from 10); loss 2361.0 -> 0.101 Hz^2; wall time 18.6 s

(The per-step rates fluctuate by up to about 1 Hz around the targets because each step
draws new input spikes.) Seeds 1 and 2: held-out E 5.13 and 4.87 Hz, I 15.30 and 14.71 Hz.
"""

import argparse
import json
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

import neurojax as nj

N_X, N_E, N_I = 200, 80, 20
P_IN, P_REC = 0.2, 0.2
RATE_X = 10.0  # Hz, each external Poisson neuron
DT = 0.5  # ms
W_REC = {("E", "E"): 0.5, ("E", "I"): 1.0, ("I", "E"): -4.0, ("I", "I"): -4.0}  # mV jumps
TAU_SYN = {"X": 5.0, "E": 5.0, "I": 10.0}  # ms
W_IN0 = 10.0  # mV, initial weight of every input synapse (far from the targets)
TARGET = {"E": 5.0, "I": 15.0}  # Hz


def build(seed: int):
    """The network: X -> E and X -> I input (dense, trainable) and the fixed E/I recurrence."""
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, r_m=1.0, t_ref=2.0)
    sizes = {"X": N_X, "E": N_E, "I": N_I}
    keys = jr.split(jr.key(seed), 6)
    projs = []
    for k, post in zip(keys[:2], ("E", "I")):
        conn = nj.connect.fixed_prob(k, N_X, sizes[post], P_IN, weight=W_IN0)
        projs.append(
            nj.Projection("X", post, conn, synapse=nj.Exponential(TAU_SYN["X"]), layout="dense")
        )
    for k, ((pre, post), w) in zip(keys[2:], W_REC.items()):
        conn = nj.connect.fixed_prob(
            k, sizes[pre], sizes[post], P_REC, weight=w, allow_self=pre != post
        )
        projs.append(
            nj.Projection(pre, post, conn, synapse=nj.Exponential(TAU_SYN[pre]), layout="dense")
        )
    net = nj.Network(
        populations={"X": (nj.PoissonSource(RATE_X), N_X), "E": (lif, N_E), "I": (lif, N_I)},
        projections=projs,
    )
    return net


def input_weights(net, params):
    """Input weight matrices exp(params) [mV], on the synapses of the initial network only."""
    masks = [(p.matrix != 0).astype(p.matrix.dtype) for p in net.projections[:2]]
    return {"E": masks[0] * jnp.exp(params["E"]), "I": masks[1] * jnp.exp(params["I"])}


def with_input_weights(net, params):
    """The network whose X -> E and X -> I weights are exp(params) on their synapses."""
    w = input_weights(net, params)
    return eqx.tree_at(
        lambda n: (n.projections[0].matrix, n.projections[1].matrix), net, (w["E"], w["I"])
    )


def population_rates(net, params, key, n_steps: int, trials: int):
    """Mean rates [Hz] of E and I over `trials` independent runs of `n_steps` steps."""
    net = with_input_weights(net, params)
    state = net.init_state(key, batch=trials)
    _, rec = nj.simulate(net, state, dt=DT, n_steps=n_steps, record=nj.Record(spikes="float"))
    return {p: jnp.mean(rec.spikes[p]) * (1000.0 / DT) for p in ("E", "I")}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="optimiser steps (default 150, quick 80)"
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="ms per trial (default 500, quick 250)"
    )
    parser.add_argument("--trials", type=int, default=4, help="trials per step (default 4)")
    parser.add_argument("--lr", type=float, default=0.04, help="peak Adam rate on log-weights")
    parser.add_argument("--seed", type=int, default=0, help="connectivity, spikes, voltages")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests, ~10 s)")
    parser.add_argument("--plot", metavar="FILE", help="save a figure to FILE")
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    args = parser.parse_args(argv)
    n_iter = args.steps if args.steps is not None else (80 if args.quick else 150)
    duration = args.duration if args.duration is not None else (250.0 if args.quick else 500.0)
    n_steps = int(round(duration / DT))
    if n_iter < 1:
        parser.error(f"argument --steps: must be >= 1, got {n_iter}")
    if n_steps < 1:
        parser.error(f"argument --duration: must be at least one step of {DT} ms")
    if args.trials < 1:
        parser.error(f"argument --trials: must be >= 1, got {args.trials}")
    if not args.lr > 0:
        parser.error(f"argument --lr: must be > 0, got {args.lr}")
    say = (lambda *a, **k: None) if args.json else print

    t_start = time.perf_counter()
    net = build(args.seed)
    log_w0 = float(np.log(W_IN0))
    params = {
        "E": jnp.full((N_X, N_E), log_w0, jnp.float32),
        "I": jnp.full((N_X, N_I), log_w0, jnp.float32),
    }

    def loss_fn(params, key):
        r = population_rates(net, params, key, n_steps, args.trials)
        loss = (r["E"] - TARGET["E"]) ** 2 + (r["I"] - TARGET["I"]) ** 2
        return loss, r

    opt = optax.adam(optax.cosine_decay_schedule(args.lr, n_iter, alpha=0.1))
    opt_state = opt.init(params)

    @eqx.filter_jit
    def update(params, opt_state, key):
        (loss, r), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, key)
        # optax's Adam raises a weakly typed float to its int32 step count, which jax's strict
        # dtype promotion rejects; trace the update under standard promotion (as nj.training's
        # make_train_step does) so that the example also runs in strict mode.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss, r

    k_train, k_eval = jr.split(jr.key(args.seed + 1))
    say(
        f"E/I network: {N_E} E + {N_I} I LIF, {N_X} Poisson inputs at {RATE_X:g} Hz; fitting "
        f"{int(net.projections[0].n_synapses + net.projections[1].n_synapses)} input weights "
        f"to E {TARGET['E']:g} Hz, I {TARGET['I']:g} Hz ({args.trials} x {duration:g} ms per step)"
    )
    say(f"{'step':>5}  {'loss Hz^2':>10}  {'rate E Hz':>9}  {'rate I Hz':>9}")
    history = []
    every = max(1, n_iter // 15)
    for it in range(n_iter):
        # A fresh draw of input spikes and initial voltages every step (from a fixed key).
        params, opt_state, loss, r = update(params, opt_state, jr.fold_in(k_train, it))
        rec = {"step": it, "loss": float(loss), "rate_E": float(r["E"]), "rate_I": float(r["I"])}
        history.append(rec)
        if it % every == 0 or it == n_iter - 1:
            say(f"{it:>5}  {rec['loss']:>10.3f}  {rec['rate_E']:>9.2f}  {rec['rate_I']:>9.2f}")
    train_wall = time.perf_counter() - t_start

    # Held-out check: new spikes and voltages, 8 trials of 1 s.
    eval_steps = int(round(1000.0 / DT))
    rates = eqx.filter_jit(population_rates)(net, params, k_eval, eval_steps, 8)
    rates = {p: float(v) for p, v in rates.items()}
    w = input_weights(net, params)
    w_mean = {p: float(jnp.sum(w[p]) / jnp.sum(w[p] > 0).astype(w[p].dtype)) for p in ("E", "I")}
    wall = time.perf_counter() - t_start
    out = {
        "steps": n_iter,
        "duration_ms": duration,
        "trials": args.trials,
        "seed": args.seed,
        "target_E": TARGET["E"],
        "target_I": TARGET["I"],
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "loss_min": min(h["loss"] for h in history),
        "rate_E_first": history[0]["rate_E"],
        "rate_I_first": history[0]["rate_I"],
        "rate_E_final": rates["E"],
        "rate_I_final": rates["I"],
        "w_in_initial": W_IN0,
        "w_in_mean_E": w_mean["E"],
        "w_in_mean_I": w_mean["I"],
        "train_s": round(train_wall, 2),
        "wall_s": round(wall, 2),
        "history": history,
    }
    if args.plot:
        plot(args.plot, net, params, history, k_eval)
        out["figure"] = args.plot
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"held-out (8 x 1 s): E {rates['E']:.2f} Hz (target {TARGET['E']:g}), I "
            f"{rates['I']:.2f} Hz (target {TARGET['I']:g}); mean input weight onto E "
            f"{w_mean['E']:.2f} mV, onto I {w_mean['I']:.2f} mV (from {W_IN0:g}); loss "
            f"{history[0]['loss']:.1f} -> {history[-1]['loss']:.3f} Hz^2; wall time {wall:.1f} s"
        )
    return out


def plot(path, net, params, history, key):
    """Loss and both rates per step; a raster of E and I after training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    trained = with_input_weights(net, params)
    _, rec = nj.simulate(trained, trained.init_state(key), dt=DT, n_steps=int(round(500 / DT)))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    ax.semilogy(steps, [h["loss"] for h in history], color="k", lw=1)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (Hz$^2$)")
    ax.set_title("(rate$_E$ - 5)$^2$ + (rate$_I$ - 15)$^2$")
    ax = axes[1]
    for p, color in (("E", "C0"), ("I", "C3")):
        ax.plot(steps, [h[f"rate_{p}"] for h in history], color=color, lw=1, label=p)
        ax.axhline(TARGET[p], color=color, ls="--", lw=0.8)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("population rate (Hz)")
    ax.set_title("rates (dashed: targets)")
    ax.legend()
    ax = axes[2]
    t_e, n_e = np.nonzero(np.asarray(rec.spikes["E"]))
    t_i, n_i = np.nonzero(np.asarray(rec.spikes["I"]))
    ax.plot((t_e + 1) * DT, n_e, "|", color="C0", ms=2.5)
    ax.plot((t_i + 1) * DT, n_i + N_E, "|", color="C3", ms=2.5)
    ax.set_xlim(0, 500)
    ax.set_ylim(-0.5, N_E + N_I - 0.5)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("neuron (E blue, I red)")
    ax.set_title("after training: 500 ms of a held-out trial")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
    sys.exit(0)
