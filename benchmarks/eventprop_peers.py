"""Training time per Yin-Yang batch and epoch: neurojax (EventProp and surrogate gradients)
against snnTorch, interleaved in one process; jaxsnn and eventax run their own scripts.

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
  its weights mean something else and its accuracy is not compared).

The rounds alternate between the libraries (`--rounds` of `--batches` batches each), so a
change in the machine's load reaches all of them; the figure is the median round. CPU
seconds (`time.process_time`, all threads of the process) are given beside wall seconds.
One JSON line per library and round summary:

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


def neurojax_runner(gradient, times, labels):
    ex = _example()
    net = ex.build(0)
    # only the weights learn, as in the example (delays and time constants stay fixed)
    params = [q.weight for q in net.projections]
    opt = optax.adam(5e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, t, y):
        def f(w):
            full = eqx.tree_at(lambda n: [q.weight for q in n.projections], net, w)
            return ex.loss_fn(full, t, y, gradient)[0]

        loss, g = jax.value_and_grad(f)(params)
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, loss

    box = [params, state]

    def run(b):
        sl = slice(b * BATCH, (b + 1) * BATCH)
        box[0], box[1], loss = step(box[0], box[1], jnp.asarray(times[sl]), jnp.asarray(labels[sl]))
        jax.block_until_ready(loss)

    return run


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


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument(
        "--libraries", nargs="+", default=["neurojax-eventprop", "neurojax-surrogate", "snntorch"]
    )
    args = ap.parse_args(argv)
    _, times, labels = _data(BATCH * args.batches)
    runners = {}
    for lib in args.libraries:
        if lib == "snntorch":
            try:
                runners[lib] = snntorch_runner(times, labels)
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
                    loadavg=os.getloadavg(),
                    backend=jax.default_backend(),
                )
            ),
            flush=True,
        )
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
