"""Train a 5-120-3 LIF network on Yin-Yang with time-to-first-spike coding, by EventProp
(exact gradients) or by surrogate gradients on a time grid, and print the test accuracy.

    python examples/train_yinyang.py                   # EventProp, 15 epochs
    python examples/train_yinyang.py --gradient surrogate
    python examples/train_yinyang.py --epochs 2 --n-train 500   # a quick look
    python examples/train_yinyang.py --recipe published          # 5-200-3, 100 epochs
    python examples/train_yinyang.py --recipe published --x64    # in float64, as the paper
    python examples/train_yinyang.py --recipe published --data yin_yang_data_set/publication_data

Network and loss follow Wunderlich and Pehle (2021, Sci. Rep. 11:12829, Yin-Yang section):
inputs (x, y, 1 - x, 1 - y) as one spike each between `T_EARLY` and `T_LATE` plus a bias
spike, LIF neurons with exponential current synapses (tau_m = 20 ms, tau_s = 5 ms,
threshold 1), the class given by the earliest output spike, trained with the cross-entropy
over first-spike times and its early-spike regulariser, Adam, batches of 32.

Two recipes. `default`: 5-120-3, inputs between 2 and 27 ms, output weights drawn by the
fan-in, 15 epochs (about 20 CPU s per epoch on one core), a silent output given a time past
the end of the run (`SILENT_RULES`), a new data set per seed. `published`: the settings of
Wunderlich and Pehle's Yin-Yang run as their code sets them (5-200-3, inputs between 0 and
30 ms, output weights N(0.93, 0.1), 100 epochs, silent outputs left out of the loss and a
sample whose label output is silent left without gradient, runs of 100 ms standing in for
their runs without an end, one data set for every seed, each epoch ending with the samples
left over, the learning rate decayed from the end of the second epoch; `--data` trains and
tests on their very sets, `--x64` in their float64), whose published test accuracy is
98.1 +- 0.2 % over 10 seeds; its outputs fire up to about 27 times per sample at the start,
so it keeps 48 spikes per neuron and 768 events per run; its first epoch costs about 90
CPU s and, once training has thinned the spikes, an epoch 22-36 CPU s on one core of this
project's 2-core machine (benchmarks/results/eventprop_yinyang.md).
"""

import argparse
import json
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import neurojax as nj
from neurojax import training as nt

T_EARLY, T_LATE, T_BIAS, T_MAX = 2.0, 27.0, 0.0, 40.0
N_HIDDEN = 120
# per recipe: input window [ms], hidden neurons, output weights (mean, s.d.; None: by the
# fan-in, see `build`), spikes kept per neuron, events per run (None: the bound), epochs,
# what a silent output does in the loss (`SILENT_RULES`), the seeds of the training and test
# sets (None: `seed + 1` and `seed + 2`, a new data set per seed) and the epochs run at the
# full learning rate before it decays by `lr_decay` per epoch, the run's duration [ms] and
# whether an epoch ends with a smaller batch of the samples left over
RECIPES = {
    "default": dict(
        t_early=T_EARLY,
        t_late=T_LATE,
        n_hidden=N_HIDDEN,
        w_out=None,
        max_spikes=16,
        max_events=None,
        epochs=15,
        silent="extend",
        data_seeds=None,
        decay_after=0,
        t_max=T_MAX,
        partial_batch=False,
    ),
    "published": dict(
        t_early=0.0,
        t_late=30.0,
        n_hidden=200,
        w_out=(0.93, 0.1),
        max_spikes=48,
        max_events=768,
        epochs=100,
        silent="skip",
        data_seeds=(1, 2),
        decay_after=1,
        # Wunderlich and Pehle's event-driven runs have no end: a neuron fires whenever its
        # voltage crosses the threshold, however late. 100 ms stands in for that: after its
        # last input a neuron's voltage has at most one maximum left, a few ms later, and on
        # this recipe's networks runs of 100 and 1000 ms give the same spikes
        # (benchmarks/results/eventprop_yinyang.md)
        t_max=100.0,
        # their epoch ends with the samples left over (8 of 5000 in batches of 32)
        partial_batch=True,
    ),
}
LIF = dict(tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0)
TAU_S = 5.0


def build(seed: int = 0, n_hidden: int = N_HIDDEN, w_out=None) -> nt.EventNetwork:
    """The 5 -> n_hidden -> 3 network with weights drawn so that most neurons fire;
    `w_out` = (mean, s.d.) of the output weights replaces the fan-in rule below."""
    rng = np.random.default_rng(seed)
    lif = nj.LIF(**LIF)
    # input weights as Wunderlich and Pehle (2021) and mlGeNN's Yin-Yang example draw them;
    # output weights large enough that every output fires on nearly every sample (a silent
    # output has no first-spike time to differentiate), scaled with the fan-in: 0.2 +- 0.2
    # at 200 hidden neurons gives 2-3 output spikes per trial at the start
    w1 = rng.normal(1.5, 0.78, (5, n_hidden))
    w2 = rng.normal(40.0 / n_hidden, 0.2 * np.sqrt(200.0 / n_hidden), (n_hidden, 3))
    if w_out is not None:  # drawn from the same stream, in place of the fan-in rule
        w2 = w_out[0] + w_out[1] * (w2 - 40.0 / n_hidden) / (0.2 * np.sqrt(200.0 / n_hidden))
    syn = nj.Exponential(TAU_S)
    return nt.EventNetwork(
        populations={"hidden": (lif, n_hidden), "out": (lif, 3)},
        inputs={"in": 5},
        projections=[
            nt.EventProjection("in", "hidden", w1, synapse=syn),
            nt.EventProjection("hidden", "out", w2, synapse=syn),
        ],
    )


def encode(features: np.ndarray, t_early: float = T_EARLY, t_late: float = T_LATE) -> np.ndarray:
    return nt.ttfs_encode(features, t_early=t_early, t_late=t_late, bias_time=T_BIAS)


def load_data(folder):
    """Training and test sets from `folder`, laid out as Kriener et al.'s published Yin-Yang
    files (`publication_data` of github.com/lkriener/yin_yang_data_set, the sets Wunderlich
    and Pehle trained and tested on): `train_samples.npy` and `test_samples.npy`, features
    `(n, 4)` in [0, 1]; `train_labels.npy` and `test_labels.npy`, classes 0, 1, 2."""
    root = pathlib.Path(folder)
    if not root.is_dir():
        raise ValueError(f"load_data: data must be a folder of .npy files, got {str(folder)!r}")
    sets = []
    for part in ("train", "test"):
        paths = [root / f"{part}_{kind}.npy" for kind in ("samples", "labels")]
        for path in paths:
            if not path.is_file():
                raise ValueError(f"load_data: {str(path)!r} is missing")
        x, y = (np.load(path, allow_pickle=False) for path in paths)
        if x.ndim != 2 or x.shape[1] != 4 or not np.issubdtype(x.dtype, np.floating):
            raise ValueError(
                f"load_data: {part}_samples.npy must hold floats of shape (n, 4), got "
                f"{x.dtype} {x.shape}"
            )
        if not np.all((x >= 0) & (x <= 1)):
            raise ValueError(f"load_data: {part}_samples.npy must lie in [0, 1]")
        if (
            y.shape != (len(x),)
            or not np.issubdtype(y.dtype, np.integer)
            or not np.all((y >= 0) & (y <= 2))
        ):
            raise ValueError(
                f"load_data: {part}_labels.npy must hold {len(x)} classes 0, 1 or 2, got "
                f"{y.dtype} {y.shape}"
            )
        sets.append((x.astype(np.float64), y.astype(np.int64)))
    return sets


def first_spikes(net, times, max_spikes=16, silent_slope=None, max_events=None, t_max=T_MAX):
    """First output spike times of a batch of input spike times `(batch, 5, 1)` in a run of
    `t_max` ms (`t_max` for an output that did not fire). With `silent_slope` [ms per unit of
    voltage], an output that did not fire gets `t_max + silent_slope * (threshold - its
    voltage maximum)` instead (see `nj.training.first_spike_times`), so that the loss can
    bring it back to firing."""

    def one(t):
        rec = nt.eventprop_run(
            net, {"in": t}, t_max=t_max, max_spikes=max_spikes, max_events=max_events
        )
        if silent_slope is None:
            return nt.first_spike_times(rec.spike_times["out"], t_max=t_max)
        return nt.first_spike_times(
            rec.spike_times["out"],
            t_max=t_max,
            v_max=rec.v_max["out"],
            v_th=LIF["v_th"],
            silent_slope=silent_slope,
        )

    return jax.vmap(one)(times)


# ms per unit of voltage below threshold added to the run's end for an output that did not fire, so
# that the exact gradient reaches silent outputs (the rule "extend")
SILENT_SLOPE = 10.0
# what an output that did not fire contributes to the loss:
#   extend: its time is t_max + SILENT_SLOPE x (threshold - voltage maximum), with the exact
#           gradient of that (neurojax's extension, `nt.first_spike_times`);
#   skip:   it leaves the softmax, and a sample whose label output is silent gives no
#           gradient at all (Wunderlich and Pehle's code, `nt.first_spike_cross_entropy`'s
#           `t_max`);
#   none:   its time is t_max (the run's end), with no gradient of its own, in the softmax.
SILENT_RULES = ("extend", "skip", "none")

DT = 0.1  # grid step of the surrogate-gradient run [ms]


def first_spikes_grid(net, times, t_max=T_MAX):
    """The same network on the `DT` grid over `t_max` ms (`nj.LIF.step` and
    `nj.Exponential.step` scanned as `nj.simulate` scans them, surrogate spikes), input spikes
    rounded to the grid; the first spike time of each output is estimated as `sum_t t s_t`
    over its first spike (`t_max` without one), so that surrogate derivatives reach it."""
    n_steps = int(round(t_max / DT))
    hidden, out = net.populations["hidden"], net.populations["out"]
    p1, p2 = net.projections
    syn = p1.synapse
    w1, w2 = p1.weight * p1.mask, p2.weight * p2.mask

    def one(t):
        idx = jnp.clip(jnp.round(t[:, 0] / DT).astype(jnp.int32), 0, n_steps - 1)
        raster = (
            jnp.zeros((n_steps, t.shape[0]), w1.dtype)
            .at[idx, jnp.arange(t.shape[0])]
            .set(jnp.isfinite(t[:, 0]).astype(w1.dtype))
        )

        def step(c, x):
            hs, hg, os_, og = c
            hg, ih = syn.step(hg, x @ w1, DT)
            hs, sh = hidden.step(hs, ih, DT)
            og, io = p2.synapse.step(og, sh @ w2, DT)
            os_, so = out.step(os_, io, DT)
            return (hs, hg, os_, og), so

        n_h, n_o = w1.shape[1], w2.shape[1]
        c0 = (hidden.init_state(n_h), syn.init_state(n_h), out.init_state(n_o), syn.init_state(n_o))
        _, s = jax.lax.scan(step, c0, raster)
        first = s * (jnp.cumsum(s, axis=0) - s == 0)
        t_grid = (jnp.arange(n_steps, dtype=s.dtype)[:, None] + 1) * DT
        return jnp.sum(first * t_grid, axis=0) + t_max * (1 - jnp.sum(first, axis=0))

    return jax.vmap(one)(times)


def loss_fn(net, times, labels, gradient="eventprop", silent_slope=None, runs=None, skip=False):
    """`runs`: `first_spikes`' max_spikes, max_events and t_max (the default recipe's if
    None); `skip`: the rule "skip" of `SILENT_RULES` (then `silent_slope` must be None)."""
    runs = runs or {}
    t_max = runs.get("t_max", T_MAX)
    t_first = (
        first_spikes(net, times, silent_slope=silent_slope, **runs)
        if gradient == "eventprop"
        else first_spikes_grid(net, times, t_max)
    )
    loss = nt.first_spike_cross_entropy(t_first, labels, t_max=t_max if skip else None)
    return loss, t_first


@eqx.filter_jit
def evaluate(net, times, labels, gradient="eventprop", max_spikes=16, max_events=None, t_max=T_MAX):
    if gradient == "eventprop":
        t = first_spikes(net, times, max_spikes=max_spikes, max_events=max_events, t_max=t_max)
    else:
        t = first_spikes_grid(net, times, t_max)
    # a sample whose label output stayed silent counts as wrong
    return nt.first_spike_accuracy(t, labels, t_max=t_max)


def train(
    *,
    epochs=None,
    n_train=None,
    n_test=None,
    data=None,
    batch=32,
    lr=5e-3,
    seed=0,
    n_hidden=None,
    gradient="eventprop",
    lr_decay=0.95,
    silent=None,
    silent_slope=SILENT_SLOPE,
    recipe="default",
    log=print,
):
    """Train and return `(network, history)`; `gradient` is `"eventprop"` (exact run and
    gradient) or `"surrogate"` (the grid run of `first_spikes_grid`, evaluated on the grid);
    `recipe` one of `RECIPES`, whose epochs, hidden size and silent-output rule `epochs`,
    `n_hidden` and `silent` (one of `SILENT_RULES`) replace where given; `silent_slope`
    applies to the rule "extend". The data: `n_train` and `n_test` samples (5000 and 1000 by
    default) drawn by `nj.training.yin_yang`, or the sets in the folder `data`
    (`load_data`)."""
    if gradient not in ("eventprop", "surrogate"):
        raise ValueError(f"train: gradient must be 'eventprop' or 'surrogate', got {gradient!r}")
    if recipe not in RECIPES:
        raise ValueError(f"train: recipe must be one of {sorted(RECIPES)}, got {recipe!r}")
    rc = RECIPES[recipe]
    epochs = rc["epochs"] if epochs is None else epochs
    n_hidden = rc["n_hidden"] if n_hidden is None else n_hidden
    silent = rc["silent"] if silent is None else silent
    if silent not in SILENT_RULES:
        raise ValueError(f"train: silent must be one of {SILENT_RULES} or None, got {silent!r}")
    runs = dict(max_spikes=rc["max_spikes"], max_events=rc["max_events"], t_max=rc["t_max"])
    if silent == "extend" and not (
        isinstance(silent_slope, (int, float)) and 0 < silent_slope < float("inf")
    ):
        raise ValueError(
            "train: silent_slope must be a finite number of ms per unit of voltage > 0 with "
            f"silent='extend', got {silent_slope!r}"
        )
    slope = silent_slope if silent == "extend" else None
    skip = silent == "skip"
    if data is None:
        s_train, s_test = rc["data_seeds"] or (seed + 1, seed + 2)
        x_train, y_train = nt.yin_yang(5000 if n_train is None else n_train, seed=s_train)
        x_test, y_test = nt.yin_yang(1000 if n_test is None else n_test, seed=s_test)
    else:
        (x_train, y_train), (x_test, y_test) = load_data(data)
        for name, want, got in (
            ("n_train", n_train, len(y_train)),
            ("n_test", n_test, len(y_test)),
        ):
            if want is not None and want != got:
                raise ValueError(
                    f"train: {name}={want} but the data in {data!r} has {got} samples; "
                    "leave it out with data"
                )
    n_train = len(y_train)
    t_train = encode(x_train, rc["t_early"], rc["t_late"])
    t_test = encode(x_test, rc["t_early"], rc["t_late"])
    net = build(seed, n_hidden, rc["w_out"])
    params, static = eqx.partition(net, eqx.is_inexact_array)
    trainable = jax.tree_util.tree_map(lambda _: False, params)
    trainable = eqx.tree_at(
        lambda p: [q.weight for q in p.projections],
        trainable,
        replace=[True] * len(net.projections),
    )
    # the learning rate decays by `lr_decay` every epoch (mlGeNN's Yin-Yang example: 0.95),
    # after `decay_after` epochs at the full rate (Wunderlich and Pehle's code decays it
    # from the end of the second epoch on)
    n_batches = -(-n_train // batch) if rc["partial_batch"] else n_train // batch
    if n_batches == 0:
        raise ValueError(
            f"train: {n_train} training samples make no batch of {batch}; give at least {batch}"
        )
    opt = optax.adam(
        optax.exponential_decay(
            lr, n_batches, lr_decay, staircase=True, transition_begin=rc["decay_after"] * n_batches
        )
    )
    opt_state = opt.init(params)

    @eqx.filter_jit
    def step(params, opt_state, times, labels):
        def f(p):
            return loss_fn(eqx.combine(p, static), times, labels, gradient, slope, runs, skip)

        (loss, t_first), g = jax.value_and_grad(f, has_aux=True)(params)
        # only the weights learn here; time constants, thresholds and delays stay fixed
        g = jax.tree_util.tree_map(lambda x, m: x if m else jnp.zeros_like(x), g, trainable)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    history = []
    for epoch in range(epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        order = rng.permutation(n_train)
        losses = []
        for b in range(n_batches):
            idx = order[b * batch : (b + 1) * batch]
            params, opt_state, loss = step(
                params, opt_state, jnp.asarray(t_train[idx]), jnp.asarray(y_train[idx])
            )
            losses.append(float(loss))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        acc = float(
            evaluate(
                eqx.combine(params, static),
                jnp.asarray(t_test),
                jnp.asarray(y_test),
                gradient,
                **runs,
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
    return eqx.combine(params, static), history


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # 15 epochs: five seeds end at 96.8 +- 0.9 %; at 40, one seed in five broke down in epoch
    # 20 (benchmarks/results/eventprop_yinyang.md)
    ap.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="default",
        help="default: 5-120-3, 15 epochs; published: Wunderlich and Pehle's settings",
    )
    ap.add_argument("--epochs", type=int, help="default: the recipe's (15 or 100)")
    ap.add_argument("--n-train", type=int, help="samples drawn for training (default 5000)")
    ap.add_argument("--n-test", type=int, help="samples drawn for testing (default 1000)")
    ap.add_argument(
        "--data",
        help="a folder with Kriener et al.'s published Yin-Yang sets (train_samples.npy, "
        "train_labels.npy, test_samples.npy, test_labels.npy) to train and test on in place "
        "of sets drawn by nj.training.yin_yang",
    )
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gradient", choices=["eventprop", "surrogate"], default="eventprop")
    ap.add_argument("--n-hidden", type=int, help="default: the recipe's (120 or 200)")
    ap.add_argument("--lr-decay", type=float, default=0.95)
    ap.add_argument(
        "--silent",
        choices=SILENT_RULES,
        help="what an output that did not fire gives the loss (default: the recipe's, "
        "extend or skip; see SILENT_RULES in this file)",
    )
    ap.add_argument(
        "--silent-slope",
        type=float,
        default=SILENT_SLOPE,
        help="with --silent extend: ms per unit of voltage below threshold for an output that "
        "did not fire (0: the rule none, the earlier recipe)",
    )
    ap.add_argument(
        "--x64",
        action="store_true",
        help="run in float64 (as Wunderlich and Pehle's code does) instead of float32",
    )
    ap.add_argument("--json", help="write the per-epoch history to this JSON file")
    ap.add_argument(
        "--save",
        help="write the trained network to this file (equinox.tree_serialise_leaves; read it "
        "back with equinox.tree_deserialise_leaves into build(seed, n_hidden))",
    )
    args = ap.parse_args()
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    net, hist = train(
        gradient=args.gradient,
        epochs=args.epochs,
        n_train=args.n_train,
        n_test=args.n_test,
        data=args.data,
        lr=args.lr,
        seed=args.seed,
        n_hidden=args.n_hidden,
        lr_decay=args.lr_decay,
        silent="none" if args.silent is None and args.silent_slope == 0 else args.silent,
        silent_slope=args.silent_slope,
        recipe=args.recipe,
    )
    if args.save:
        eqx.tree_serialise_leaves(args.save, net)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), history=hist), f, indent=1)
    print(f"final test accuracy: {hist[-1]['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
