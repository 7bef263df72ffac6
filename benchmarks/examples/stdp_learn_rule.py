"""Example: learn the STDP rule itself by gradient descent through a spiking simulation.

A small network, 100 Poisson inputs at 20 Hz onto 10 LIF neurons (`tau_m` = 10 ms, rest
-70 mV, threshold -54 mV, 2 ms refractory, a constant 10 mV drive), all-to-all current
synapses (`nj.Exponential(5.0)`) with initial weights uniform in [0.2, 0.8] and additive STDP
(`w_max` = 1, `tau_plus = tau_minus` = 20 ms). The amplitudes `(a_plus, a_minus)` are learned
with `optax.adam` (learning rate 0.2, cosine decay to a tenth) so that the mean weight after `T` ms
(default 500) reaches a target (default 0.65; the initial rule, `a_plus` = 0.005 and
`a_minus` = 1.05 `a_plus`, lets it drift down from 0.5). They are optimised as logarithms,
which keeps them positive. The loss is `(mean weight - target)^2`, the mean taken over the
synapses of 4 trials (fixed input trains and initial voltages, one key); its gradient flows
through `nj.simulate`: through the weight updates (the STDP rule's exact derivative) and the
spikes (the LIF surrogate).

At the start, the gradient of the mean weight with respect to the two log-amplitudes is
compared with central finite differences; at the end the learned rule is run on 16 fresh
trials (new input trains and initial voltages), whose mean weights vary from trial to trial.

Progress (loss, mean weight, amplitudes per iteration) goes to stderr; one JSON line with the
whole loss history, the initial and final loss, the learned amplitudes, the final and
held-out mean weight, the gradient check and the times. The figure (`--out`) shows the loss,
the mean weight against the target and the amplitudes per iteration.

Run: `python -m benchmarks.examples.stdp_learn_rule [--iters N] [--target W] [--duration MS]
[--lr LR] [--out FILE] [--quick]` (`--quick`: 200 ms, 8 iterations). The common benchmark
flags (`--threads`, ...) are accepted; `--sizes`, `--repeats` and `--peers` are not used.
"""

import sys
import time
from pathlib import Path

from .. import _harness

DT = 0.1  # ms
N_IN, N_OUT = 100, 10
RATE_HZ = 20.0
DURATION = 500.0  # ms
QUICK_DURATION = 200.0
ITERS = 40
QUICK_ITERS = 8
TARGET = 0.65
LR = 0.2
N_TRAIN = 4  # trials per loss evaluation
A_PLUS0 = 0.005
A_MINUS0 = 1.05 * A_PLUS0
FD_STEP = 1e-2  # in log-amplitude
N_HELDOUT = 16
OUT = _harness.REPO_ROOT / "benchmarks" / "out" / "stdp_learn_rule.png"


def _extra(parser) -> None:
    parser.add_argument("--iters", type=int, default=None, help=f"Adam steps ({ITERS})")
    parser.add_argument("--target", type=float, default=TARGET, help="target mean weight")
    parser.add_argument("--duration", type=float, default=None, help=f"T in ms ({DURATION:g})")
    parser.add_argument("--lr", type=float, default=LR, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed")
    parser.add_argument("--out", type=Path, default=OUT, help="figure path (.png)")


def build(key):
    """The network and its STDP projection (weights and amplitudes as initial values)."""
    import neurojax as nj

    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-54.0, t_ref=2.0)
    conn = nj.connect.all_to_all(N_IN, N_OUT, weight=nj.connect.uniform(0.2, 0.8), key=key)
    stdp = nj.STDP(a_plus=A_PLUS0, a_minus=A_MINUS0, tau_plus=20.0, tau_minus=20.0, w_max=1.0)
    proj = nj.Projection("in", "out", conn, synapse=nj.Exponential(5.0), plasticity=stdp)
    return nj.Network(
        {"in": (nj.PoissonSource(RATE_HZ), N_IN), "out": (lif, N_OUT)},
        [proj],
        inputs={"out": 10.0},
    )


def with_rule(net, log_a):
    """`net` with `(a_plus, a_minus) = exp(log_a)`."""
    import equinox as eqx
    import jax.numpy as jnp

    return eqx.tree_at(
        lambda n: (n.projections[0].plasticity.a_plus, n.projections[0].plasticity.a_minus),
        net,
        (jnp.exp(log_a[0]), jnp.exp(log_a[1])),
    )


def run(log_a, net, state, n_steps: int):
    """Weights after `n_steps` with the rule `exp(log_a)`, and the output spike count."""
    import neurojax as nj

    final, rec = nj.simulate(
        with_rule(net, log_a), state, dt=DT, n_steps=n_steps, record_every=n_steps
    )
    return final.plastic[0].weights, rec.spikes["out"].sum()


def plot(path: Path, losses, means, amps, target: float, heldout) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    it = np.arange(len(losses))
    fig, axes = plt.subplots(3, 1, figsize=(6, 8), sharex=True, constrained_layout=True)
    axes[0].semilogy(it, losses, "o-", ms=3)
    axes[0].set_ylabel("loss (mean w - target)$^2$")
    axes[0].set_title("Learning the STDP amplitudes with Adam")
    axes[1].plot(it, means, "o-", ms=3, label="mean weight after T")
    axes[1].axhline(target, color="k", ls="--", label="target")
    axes[1].errorbar(
        [it[-1] + 1],
        [np.mean(heldout)],
        yerr=[np.std(heldout, ddof=1)],
        fmt="s",
        color="C3",
        capsize=3,
        label=f"learned rule, {len(heldout)} fresh trials (mean, sd)",
    )
    axes[1].set_ylabel("mean weight")
    axes[1].legend()
    amps = np.asarray(amps)
    axes[2].semilogy(it, amps[:, 0], "o-", ms=3, label="a_plus")
    axes[2].semilogy(it, amps[:, 1], "o-", ms=3, label="a_minus")
    axes[2].set_xlabel("iteration")
    axes[2].set_ylabel("amplitude")
    axes[2].legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=(N_IN,), quick_sizes=(N_IN,), argv=argv, extra=_extra
    )
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import numpy as np
    import optax

    duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
    iters = args.iters or (QUICK_ITERS if args.quick else ITERS)
    n_steps = int(round(duration / DT))
    k_conn, k_train, k_test = jr.split(jr.key(args.seed), 3)
    net = build(k_conn)
    state = net.init_state(k_train, batch=(N_TRAIN,))
    target = args.target

    @eqx.filter_jit
    def loss_and_grad(log_a, net, state):
        def loss(log_a):
            w, n_spk = run(log_a, net, state, n_steps)
            m = w.mean()
            return (m - target) ** 2, (m, n_spk)

        return jax.value_and_grad(loss, has_aux=True)(log_a)

    run_jit = eqx.filter_jit(lambda log_a, net, state: run(log_a, net, state, n_steps)[0])

    log_a = jnp.log(jnp.array([A_PLUS0, A_MINUS0], jnp.float32))
    t0 = time.perf_counter()
    (loss0, (m0, _)), g0 = jax.block_until_ready(loss_and_grad(log_a, net, state))
    compile_s = time.perf_counter() - t0

    # Gradient check of the mean weight against central finite differences (log space).
    dm_auto = np.asarray(g0) / (2.0 * (float(m0) - target))
    dm_fd = []
    for i in range(2):
        e = jnp.zeros(2).at[i].set(FD_STEP)
        hi = run_jit(log_a + e, net, state).mean()
        lo = run_jit(log_a - e, net, state).mean()
        dm_fd.append((float(hi) - float(lo)) / (2 * FD_STEP))
    _harness.log(
        f"d(mean w)/d(log a_plus, log a_minus): autodiff {dm_auto.tolist()}, "
        f"finite differences {dm_fd}"
    )

    opt = optax.adam(optax.cosine_decay_schedule(args.lr, iters, alpha=0.1))
    opt_state = opt.init(log_a)
    losses, means, amps, spikes = [], [], [], []
    t0 = time.perf_counter()
    for it in range(iters + 1):
        (loss, (m, n_spk)), g = loss_and_grad(log_a, net, state)
        losses.append(float(loss))
        means.append(float(m))
        amps.append(np.exp(np.asarray(log_a)).tolist())
        spikes.append(int(n_spk))
        _harness.log(
            f"iter {it:3d}  loss {float(loss):.3e}  mean w {float(m):.4f}  "
            f"a_plus {amps[-1][0]:.3e}  a_minus {amps[-1][1]:.3e}  "
            f"output rate {int(n_spk) / (N_TRAIN * N_OUT * duration * 1e-3):.1f} Hz"
        )
        if it == iters:  # the last evaluation is of the final parameters
            break
        updates, opt_state = opt.update(g, opt_state)
        log_a = optax.apply_updates(log_a, updates)
    train_s = time.perf_counter() - t0

    heldout = net.init_state(k_test, batch=(N_HELDOUT,))
    per_trial = np.asarray(run_jit(log_a, net, heldout)).mean(axis=-1)

    plot(args.out, losses, means, amps, target, per_trial)
    _harness.emit(
        {
            "bench": "stdp_learn_rule",
            "impl": "neurojax",
            "duration_ms": duration,
            "dt": DT,
            "steps": n_steps,
            "n_in": N_IN,
            "n_out": N_OUT,
            "iters": iters,
            "n_train_trials": N_TRAIN,
            "n_heldout_trials": N_HELDOUT,
            "lr": args.lr,
            "seed": args.seed,
            "threads": args.threads,
            "target": target,
            "a_plus_initial": A_PLUS0,
            "a_minus_initial": A_MINUS0,
            "a_plus": amps[-1][0],
            "a_minus": amps[-1][1],
            "loss_initial": losses[0],
            "loss_final": losses[-1],
            "loss_min": min(losses),
            "mean_w_initial_rule": means[0],
            "mean_w_final": means[-1],
            "heldout_mean_w": float(per_trial.mean()),
            "heldout_mean_w_std": float(per_trial.std(ddof=1)),
            "rate_out_hz_initial": spikes[0] / (N_TRAIN * N_OUT * duration * 1e-3),
            "rate_out_hz_final": spikes[-1] / (N_TRAIN * N_OUT * duration * 1e-3),
            "dmean_dlog_a_autodiff": dm_auto,
            "dmean_dlog_a_fd": dm_fd,
            "losses": losses,
            "compile_s": compile_s,
            "train_s": train_s,
            "s_per_iter": train_s / (iters + 1),
            "figure": str(args.out),
        }
    )


if __name__ == "__main__":
    main(sys.argv[1:])
