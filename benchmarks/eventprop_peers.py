"""Training time per Yin-Yang batch and epoch: neurojax (EventProp and surrogate gradients)
against eventax, jaxsnn and snnTorch, interleaved in one process.

Network as in `examples/train_yinyang.py`: 5 inputs (x, y, 1 - x, 1 - y and a bias spike,
time-to-first-spike coded between 2 and 27 ms), 120 hidden and 3 output LIF neurons
(tau_m 20 ms, exponential synapses of 5 ms, threshold 1), 40 ms per sample, batches of 32,
Adam. One Yin-Yang epoch is 5000 samples: 156 batches.

- `neurojax-eventprop`: the example's jitted step (exact event-driven run, EventProp
  gradient), vmapped over the batch;
- `neurojax-surrogate`: the same step on the 0.1 ms grid (400 steps, surrogate spikes, BPTT);
- `snntorch`: `snn.Synaptic` layers on the same 0.1 ms grid (400 steps), `fast_sigmoid`
  surrogate, BPTT by torch autograd, the loss on the spike-weighted output time as the
  surrogate path uses; timing only (snnTorch's discrete update has no (1 - beta) factor, so
  its weights mean something else and its accuracy is not compared);
- `jaxsnn`: jaxsnn 0.3.0's own EventProp recipe for Yin-Yang (`jaxsnn_runner`: its network,
  time scale, encoding, loss and optimiser at 120 hidden neurons and batches of 32);
- `eventax` and `eventax-eventprop`: eventax 0.1.0's `FFEvNN` (layers 120 and 3, its `LIF`
  neuron: current-based, tau_m 20 ms, tau_syn 5 ms, threshold 1, reset to 0 by subtracting
  the threshold, no bias current) started from the example's weights, the first output
  spike times from `FFEvNN.ttfs` vmapped over the batch, float32, the example's loss
  (`first_spike_cross_entropy`, a silent output at 40 ms) and only the weights trained by
  Adam. eventax integrates between events with diffrax (explicit Euler at a fixed step,
  `--eventax-step`, 0.01 ms by default) and finds each threshold crossing with optimistix's
  Newton root finder (eventax's default tolerances 1e-2), so its spike times carry an error
  of the order of the step where neurojax's are exact. `eventax` takes the gradient with
  eventax's default adjoint (diffrax's `RecursiveCheckpointAdjoint`: backpropagation
  through the solver's steps, as eventax's own Yin-Yang example does); `eventax-eventprop`
  with `eventax.adjoint.EventPropAdjoint` (adjoint equations solved backwards between the
  events). Other differences from neurojax: the run stops once every output has fired
  (neurojax runs the full 40 ms), one loop pass per event with at most
  `EVENTAX_MAX_EVENTS` events per sample (eventax raises if that is reached; neurojax
  bounds the spikes per neuron, 16), the weights are one masked (128, 123) matrix, and
  one neuron fires per event (another one past threshold at that moment is held just
  below it and fires about a solver step later). On the first batch at the example's
  initial weights, eventax's loss is neurojax's to 0.1 % and its gradient (either adjoint)
  differs from neurojax's by 25 % (input weights) and 1.3-1.6 % (output weights) in norm
  at a 0.01 ms step, by 5 % and 0.3 % at 0.001 ms (`EventPropAdjoint`; measured once,
  float32, while writing this).

The rounds alternate between the libraries (`--rounds` of `--batches` batches each), so a
change in the machine's load reaches all of them; the figure is the median round. CPU
seconds (`time.process_time`, all threads of the process) are given beside wall seconds.
One JSON line per library with the median round, the per-round figures and the 1-minute load
average at the start and end:

    python -m benchmarks.eventprop_peers --rounds 5 --batches 10
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from neurojax import training as nt

BATCH, N_TRAIN = 32, 5000
EVENTAX_MAX_EVENTS = 200  # loop passes per sample; as eventax's Yin-Yang example
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_yinyang.py"


def _example():
    spec = importlib.util.spec_from_file_location("_example_train_yinyang", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data(n):
    ex = _example()
    x, y = nt.yin_yang(n, seed=1)
    return ex, ex.encode(x), y


def _adam_runner(loss, params, times, labels):
    """`run(b)`: one jitted gradient of `loss(params, times, labels)` and Adam step (5e-3) on
    batch `b`, blocked on; the parameters and the optimiser's state carried between calls."""
    opt = optax.adam(5e-3)

    @jax.jit
    def step(params, state, t, y):
        value, g = jax.value_and_grad(loss)(params, t, y)
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, value

    box = [params, opt.init(params)]

    def run(b):
        sl = slice(b * BATCH, (b + 1) * BATCH)
        box[0], box[1], value = step(
            box[0], box[1], jnp.asarray(times[sl]), jnp.asarray(labels[sl])
        )
        jax.block_until_ready(value)

    return run


def neurojax_runner(gradient, times, labels):
    ex = _example()
    net = ex.build(0)
    # only the weights learn, as in the example (delays and time constants stay fixed)
    params = [q.weight for q in net.projections]

    def loss(w, t, y):
        full = eqx.tree_at(lambda n: [q.weight for q in n.projections], net, w)
        return ex.loss_fn(full, t, y, gradient)[0]

    return _adam_runner(loss, params, times, labels)


def eventax_runner(adjoint, times, labels, step_ms=0.01):
    """One jitted gradient + Adam step of eventax's `FFEvNN` on a batch (see the module
    docstring); `adjoint` is `"default"` (diffrax's `RecursiveCheckpointAdjoint`, eventax's
    default) or `"eventprop"` (`eventax.adjoint.EventPropAdjoint`)."""
    from eventax.evnn import FFEvNN
    from eventax.neuron_models.lif import LIF

    ex = _example()
    net0 = ex.build(0)
    w1, w2 = (np.asarray(q.weight, np.float32) for q in net0.projections)
    n_in, n_h = w1.shape
    n_o = w2.shape[1]
    n = n_h + n_o
    # eventax's weight matrix: rows are the neurons (hidden, output) then the inputs,
    # columns the neurons
    w = np.zeros((n + n_in, n), np.float32)
    w[:n_h, n_h:] = w2
    w[n:, :n_h] = w1
    kwargs = {}
    if adjoint == "eventprop":
        from eventax.adjoint import EventPropAdjoint

        kwargs["adjoint"] = EventPropAdjoint()
    elif adjoint != "default":
        raise ValueError(f"eventax_runner: unknown adjoint {adjoint!r}")
    lif = ex.LIF
    net = FFEvNN(
        layers=[n_h, n_o],
        in_size=n_in,
        neuron_model=LIF,
        max_solver_time=ex.T_MAX,
        key=jax.random.PRNGKey(0),
        init_weights=jnp.asarray(w),
        init_bias=0.0,
        thresh=lif["v_th"],
        tsyn=ex.TAU_S,
        tmem=lif["tau_m"],
        vreset=lif["v_reset"],
        dtype=jnp.float32,
        solver_stepsize=step_ms,
        max_event_steps=EVENTAX_MAX_EVENTS,
        **kwargs,
    )

    def loss(w, t, y):
        full = eqx.tree_at(lambda m: m.neuron_model.weights, net, w)
        t_first = jax.vmap(full.ttfs)(t)
        # a silent output: T_MAX without gradient, as `nt.first_spike_times`
        t_first = jnp.where(
            jnp.isfinite(t_first), t_first, jax.lax.stop_gradient(jnp.float32(ex.T_MAX))
        )
        return nt.first_spike_cross_entropy(t_first, y)

    # only the weights learn, as in the example
    return _adam_runner(loss, net.neuron_model.weights, times, labels)


def snntorch_runner(times, labels):
    import snntorch as snn
    import torch
    from snntorch import surrogate

    torch.manual_seed(0)
    dt, t_max = 0.1, 40.0
    n_steps = int(round(t_max / dt))
    alpha, beta = float(np.exp(-dt / 5.0)), float(np.exp(-dt / 20.0))
    fc1, fc2 = torch.nn.Linear(5, 120, bias=False), torch.nn.Linear(120, 3, bias=False)
    grad = surrogate.fast_sigmoid()
    lif1 = snn.Synaptic(
        alpha=alpha, beta=beta, threshold=1.0, spike_grad=grad, reset_mechanism="zero"
    )
    lif2 = snn.Synaptic(
        alpha=alpha, beta=beta, threshold=1.0, spike_grad=grad, reset_mechanism="zero"
    )
    opt = torch.optim.Adam(list(fc1.parameters()) + list(fc2.parameters()), lr=5e-3)
    t_grid = torch.arange(1, n_steps + 1, dtype=torch.float32) * dt

    def raster(t):
        r = np.zeros((n_steps, t.shape[0], t.shape[1]), np.float32)
        idx = np.clip(np.round(t[:, :, 0] / dt).astype(int), 0, n_steps - 1)
        b, i = np.meshgrid(np.arange(t.shape[0]), np.arange(t.shape[1]), indexing="ij")
        r[idx, b, i] = 1.0
        return torch.from_numpy(r)

    def run(b):
        sl = slice(b * BATCH, (b + 1) * BATCH)
        x = raster(times[sl])
        y = torch.from_numpy(np.asarray(labels[sl], np.int64))
        syn1, mem1 = lif1.init_synaptic()
        syn2, mem2 = lif2.init_synaptic()
        spikes = []
        for s in range(n_steps):
            s1, syn1, mem1 = lif1(fc1(x[s]), syn1, mem1)
            s2, syn2, mem2 = lif2(fc2(s1), syn2, mem2)
            spikes.append(s2)
        out = torch.stack(spikes)  # (t, batch, 3)
        first = out * (torch.cumsum(out, 0) - out == 0)
        t_first = (first * t_grid[:, None, None]).sum(0) + t_max * (1 - first.sum(0))
        loss = torch.nn.functional.cross_entropy(-t_first / 0.5, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return run


def jaxsnn_runner(n_batches):
    """jaxsnn 0.3.0's own layered EventProp training step, built as its Yin-Yang example
    (`jaxsnn.examples.event.yinyang_layered_event_prop`) builds it, with 120 hidden neurons
    and batches of 32: its LIF neurons (one spike each, `v_reset = -1000`), its time scale
    (tau_mem 12 us, tau_syn 6 us, BrainScaleS-2's), its spike capacities (125 hidden, 103
    output events), its encoding (`spatio_temporal_encode` with `duplication=5`,
    `duplicate_neurons=False`: 5 input neurons), its MSE loss on output spike times and its
    optimiser (scale, clip, Adam 5e-3). Its own
    network and loss, so the figure is the time of the library's own recipe for this task."""
    from functools import partial

    import jaxsnn.examples.event.yinyang_layered_event_prop as yy
    from jaxsnn.base.dataset import data_loader, yinyang_dataset
    from jaxsnn.event.encode import encode, spatio_temporal_encode, target_temporal_encode
    from jaxsnn.event.loss import mse_loss
    from jaxsnn.event.modules import LIF, Linear, Source
    from jaxsnn.event.modules.lif.lif import LIFParameters
    from jaxsnn.event.topology import Topology
    from jaxsnn.event.training import update
    from jaxsnn.event.types import OptState
    from jaxsnn.examples.event.utils import loss_wrapper

    a = yy.get_parser().parse_args(["--hidden-size", "120", "--batch-size", str(BATCH)])
    params = LIFParameters(v_reset=-1000.0, v_th=a.threshold, tau_syn=a.tau_syn, tau_mem=a.tau_mem)
    rng = jax.random.PRNGKey(0)
    param_rng, data_rng, loader_rng = jax.random.split(rng, 3)
    xy = yinyang_dataset(data_rng, BATCH * n_batches, mirror=True, bias_spike=0.0)
    enc_in = jax.jit(
        jax.vmap(
            partial(spatio_temporal_encode, t_late=a.t_late, duplication=5, duplicate_neurons=False)
        )
    )
    enc_out = jax.jit(
        jax.vmap(
            partial(
                target_temporal_encode,
                n_classes=3,
                correct_target_time=a.correct_target_time,
                wrong_target_time=a.wrong_target_time,
            )
        )
    )
    data = encode(xy, enc_in, enc_out)
    batched = data_loader(({"inp": data[0]}, data[1]), BATCH, rng=loader_rng)
    builder = Topology(t_max=4.0 * params.tau_syn, backprop_method="eventprop")
    builder.add(
        {
            "inp": Source(5),
            "lif1": LIF(a.hidden_size, a.n_spikes_hidden, params),
            "lif2": LIF(3, a.n_spikes_output, params),
            "syn1": Linear(mean=3.0 / 5, std=1.6 / 5, min_delay=0.0),
            "syn2": Linear(mean=0.5, std=0.8, min_delay=0.0),
        }
    )
    builder.connect([("inp", "syn1"), ("syn1", "lif1"), ("lif1", "syn2"), ("syn2", "lif2")])
    init_fn, apply_fn = builder.done()
    weights = init_fn(param_rng)
    opt = optax.chain(
        optax.scale(1.0 / a.tau_syn),
        optax.clip(0.01),
        optax.adam(optax.exponential_decay(a.lr, N_TRAIN // BATCH, a.lr_decay)),
    )
    loss_fn = partial(loss_wrapper, apply_fn, mse_loss, params.tau_mem, "lif2", 3)
    update_fn = jax.jit(partial(update, opt, loss_fn))
    box = [OptState(opt.init(weights), weights, rng)]

    def run(b):
        batch = jax.tree_util.tree_map(lambda x: x[b], batched)
        box[0], (value, _) = update_fn(box[0], batch)
        jax.block_until_ready(jax.tree_util.tree_leaves(value))

    return run


LIBRARIES = (
    "neurojax-eventprop",
    "neurojax-surrogate",
    "eventax",
    "eventax-eventprop",
    "jaxsnn",
    "snntorch",
)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument(
        "--libraries",
        nargs="+",
        choices=LIBRARIES,
        default=list(LIBRARIES),
        help="runners, interleaved in this order (default: all; one not importable is skipped)",
    )
    ap.add_argument(
        "--eventax-step", type=float, default=0.01, help="eventax's solver step [ms] (0.01)"
    )
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    _, times, labels = _data(BATCH * args.batches)
    runners = {}
    for lib in args.libraries:
        if lib in ("snntorch", "jaxsnn") or lib.startswith("eventax"):
            try:
                if lib == "snntorch":
                    runners[lib] = snntorch_runner(times, labels)
                elif lib == "jaxsnn":
                    runners[lib] = jaxsnn_runner(args.batches)
                else:
                    adjoint = "eventprop" if lib == "eventax-eventprop" else "default"
                    runners[lib] = eventax_runner(adjoint, times, labels, args.eventax_step)
            except ImportError as e:
                print(json.dumps(dict(library=lib, skipped=f"not importable: {e}")), flush=True)
                continue
        else:
            runners[lib] = neurojax_runner(lib.split("-")[1], times, labels)
        t0, c0 = time.perf_counter(), time.process_time()
        runners[lib](0)  # compilation (jax) or first-call set-up (torch)
        print(
            json.dumps(
                dict(
                    library=lib,
                    first_batch_s=round(time.perf_counter() - t0, 2),
                    first_batch_cpu_s=round(time.process_time() - c0, 2),
                )
            ),
            flush=True,
        )
    rows = {lib: [] for lib in runners}
    for _ in range(args.rounds):
        for lib, run in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for b in range(args.batches):
                run(b)
            rows[lib].append(
                (
                    (time.perf_counter() - t0) / args.batches,
                    (time.process_time() - c0) / args.batches,
                )
            )
    n_batches = N_TRAIN // BATCH
    for lib, r in rows.items():
        wall = statistics.median(w for w, _ in r)
        cpu = statistics.median(c for _, c in r)
        extra = {}
        if lib.startswith("eventax"):
            extra = dict(
                solver="Euler",
                solver_step_ms=args.eventax_step,
                dtype="float32",
                max_event_steps=EVENTAX_MAX_EVENTS,
                adjoint="EventPropAdjoint" if lib == "eventax-eventprop" else "RecursiveCheckpoint",
            )
        print(
            json.dumps(
                dict(
                    benchmark="eventprop_peers",
                    library=lib,
                    batch=BATCH,
                    s_per_batch=round(wall, 4),
                    cpu_s_per_batch=round(cpu, 4),
                    s_per_epoch=round(wall * n_batches, 1),
                    cpu_s_per_epoch=round(cpu * n_batches, 1),
                    rounds=args.rounds,
                    batches_per_round=args.batches,
                    round_s_per_batch=[round(w, 4) for w, _ in r],
                    round_cpu_s_per_batch=[round(c, 4) for _, c in r],
                    loadavg_start=load_start,
                    loadavg=os.getloadavg(),
                    backend=jax.default_backend(),
                    **extra,
                )
            ),
            flush=True,
        )
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
