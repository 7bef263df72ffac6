"""Train a 64-100-10 LIF network on scikit-learn's 8x8 digits, latency coded (one spike per
lit pixel, brighter earlier, `nj.training.latency_digits`), by EventProp (exact gradients)
or by surrogate gradients on a 0.1 ms grid, and print the test accuracy.

    python examples/train_latency_digits.py                       # EventProp, 20 epochs
    python examples/train_latency_digits.py --gradient surrogate

The neurons, synapses, loss (cross-entropy over first-spike times with its early-spike
regulariser, Wunderlich and Pehle 2021) and both gradient paths are those of
`examples/train_yinyang.py`; 1437 digits train and 360 test (a fixed split, seed 0).
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import neurojax as nj
from neurojax import training as nt

_spec = importlib.util.spec_from_file_location(
    "_train_yinyang", Path(__file__).resolve().parent / "train_yinyang.py"
)
yy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(yy)

N_IN, N_HIDDEN, N_OUT = 64, 100, 10


def build(seed: int = 0, n_hidden: int = N_HIDDEN) -> nt.EventNetwork:
    """64 -> n_hidden -> 10, weights drawn so that hidden and output neurons fire: about 40
    lit pixels drive each hidden neuron (0.2 +- 0.3 each), and the outputs get
    40 / n_hidden +- 0.2 (the Yin-Yang example's rule)."""
    rng = np.random.default_rng(seed)
    lif = nj.LIF(**yy.LIF)
    syn = nj.Exponential(yy.TAU_S)
    w1 = rng.normal(0.2, 0.3, (N_IN, n_hidden))
    w2 = rng.normal(40.0 / n_hidden, 0.2 * np.sqrt(200.0 / n_hidden), (n_hidden, N_OUT))
    return nt.EventNetwork(
        populations={"hidden": (lif, n_hidden), "out": (lif, N_OUT)},
        inputs={"in": N_IN},
        projections=[
            nt.EventProjection("in", "hidden", w1, synapse=syn),
            nt.EventProjection("hidden", "out", w2, synapse=syn),
        ],
    )


def train(*, epochs=20, batch=32, lr=5e-3, lr_decay=0.95, seed=0, gradient="eventprop", log=print):
    if gradient not in ("eventprop", "surrogate"):
        raise ValueError(f"train: gradient must be 'eventprop' or 'surrogate', got {gradient!r}")
    times, labels = nt.latency_digits(t_early=2.0, t_late=20.0)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_train = 1437
    tr, te = order[:n_train], order[n_train:]
    net = build(seed)
    weights = [p.weight for p in net.projections]
    n_batches = n_train // batch
    opt = optax.adam(optax.exponential_decay(lr, n_batches, lr_decay, staircase=True))
    state = opt.init(weights)

    def with_weights(w):
        return eqx.tree_at(lambda n: [p.weight for p in n.projections], net, w)

    @jax.jit
    def step(w, state, t, y):
        def f(w):
            return yy.loss_fn(with_weights(w), t, y, gradient)[0]

        loss, g = jax.value_and_grad(f)(w)
        upd, state = opt.update(g, state, w)
        return optax.apply_updates(w, upd), state, loss

    rng = np.random.default_rng(seed + 1)
    history = []
    for epoch in range(epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        perm = tr[rng.permutation(n_train)]
        losses = []
        for b in range(n_batches):
            idx = perm[b * batch : (b + 1) * batch]
            weights, state, loss = step(
                weights, state, jnp.asarray(times[idx]), jnp.asarray(labels[idx])
            )
            losses.append(float(loss))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        acc = float(
            yy.evaluate(
                with_weights(weights), jnp.asarray(times[te]), jnp.asarray(labels[te]), gradient
            )
        )
        history.append(
            dict(
                epoch=epoch + 1,
                loss=float(np.mean(losses)),
                test_accuracy=acc,
                seconds=wall,
                cpu_seconds=cpu,
            )
        )
        log(
            f"epoch {epoch + 1:3d}  loss {np.mean(losses):.4f}  test accuracy {acc:.4f}  "
            f"({wall:.1f} s, {cpu:.1f} CPU s)"
        )
    return with_weights(weights), history


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gradient", choices=["eventprop", "surrogate"], default="eventprop")
    ap.add_argument("--json", help="write the per-epoch history to this JSON file")
    args = ap.parse_args()
    _, hist = train(epochs=args.epochs, lr=args.lr, seed=args.seed, gradient=args.gradient)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), history=hist), f, indent=1)
    print(f"final test accuracy: {hist[-1]['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
