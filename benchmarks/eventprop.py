"""Memory of the backward pass: EventProp against backpropagation through time (BPTT).

The same 5 -> 120 -> 3 LIF network (tau_m 20 ms, exponential synapses of 5 ms, threshold 1)
and the same inputs (one spike per input neuron in the first 27 ms, time-to-first-spike
coding as in the Yin-Yang example), run for `steps` steps of `dt = 0.1` ms:

- `eventprop`: `jax.grad` through `nj.training.eventprop_run` (exact event-driven run, adjoint
  pass over the recorded events); its memory is set by the event capacity, not by the steps;
- `bptt`: `jax.grad` through a `lax.scan` of `nj.LIF.step` and `nj.Exponential.step` on the
  grid (what `nj.simulate` scans; surrogate spikes), which keeps residuals for every step.

The figure is XLA's compiled memory analysis of the jitted gradient (`temp_size_in_bytes`:
everything the program allocates besides its arguments and outputs), one JSON line per
configuration:

    python -m benchmarks.eventprop --steps 1000 10000 100000
"""

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import neurojax as nj
from neurojax import training as nt

DT = 0.1
N_IN, N_HID, N_OUT = 5, 120, 3


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(1.5, 1.2, (N_IN, N_HID)), rng.normal(0.1, 0.3, (N_HID, N_OUT))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(2.0, 27.0, (N_IN, 1))


def eventprop_grad(steps, max_spikes=4, max_events=None):
    w1, w2 = _weights()
    lif = nj.LIF(tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0)
    syn = nj.Exponential(5.0)
    net = nt.EventNetwork(
        {"hidden": (lif, N_HID), "out": (lif, N_OUT)},
        {"in": N_IN},
        [
            nt.EventProjection("in", "hidden", w1, synapse=syn),
            nt.EventProjection("hidden", "out", w2, synapse=syn),
        ],
    )
    times = jnp.asarray(_inputs())

    def loss(net):
        rec = nt.eventprop_run(
            net, {"in": times}, t_max=steps * DT, max_spikes=max_spikes, max_events=max_events
        )
        return nt.first_spike_times(rec.spike_times["out"], t_max=steps * DT).sum()

    return jax.jit(jax.grad(loss)), (net,)


def bptt_grad(steps):
    w1, w2 = _weights()
    lif = nj.LIF(tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0)
    syn = nj.Exponential(5.0)
    raster = np.zeros((steps, N_IN))
    idx = np.minimum((_inputs()[:, 0] / DT).astype(int), steps - 1)
    raster[idx, np.arange(N_IN)] = 1.0
    raster = jnp.asarray(raster)

    def loss(params):
        w1, w2 = params

        def step(c, x):
            hs, hg, os_, og = c
            hg, ih = syn.step(hg, x @ w1, DT)
            hs, sh = lif.step(hs, ih, DT)
            og, io = syn.step(og, sh @ w2, DT)
            os_, so = lif.step(os_, io, DT)
            return (hs, hg, os_, og), so

        c0 = (
            lif.init_state(N_HID),
            syn.init_state(N_HID),
            lif.init_state(N_OUT),
            syn.init_state(N_OUT),
        )
        _, out = jax.lax.scan(step, c0, raster)
        # a smooth stand-in for the first-spike time: the spike-weighted time
        t = jnp.arange(steps, dtype=out.dtype)[:, None] * DT
        return jnp.sum(out * t)

    return jax.jit(jax.grad(loss)), ((jnp.asarray(w1), jnp.asarray(w2)),)


def events_used(steps, max_spikes=4):
    """Events the forward run of the benchmark network needs (the capacity to give)."""
    f, (net,) = eventprop_grad(steps, max_spikes)
    rec = nt.eventprop_run(
        net, {"in": jnp.asarray(_inputs())}, t_max=steps * DT, max_spikes=max_spikes
    )
    return int(rec.n_events)


def measure(kind, steps, max_events=None):
    if kind == "eventprop":
        f, args = eventprop_grad(steps, max_events=max_events)
    else:
        f, args = bptt_grad(steps)
    t0 = time.perf_counter()
    compiled = f.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    return dict(
        benchmark="eventprop_memory",
        method=kind,
        steps=steps,
        dt_ms=DT,
        temp_bytes=int(mem.temp_size_in_bytes),
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        compile_s=round(compile_s, 2),
        max_events=max_events if kind == "eventprop" else None,
        backend=jax.default_backend(),
    )


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument(
        "--methods", nargs="+", default=["eventprop", "bptt"], choices=["eventprop", "bptt"]
    )
    ap.add_argument(
        "--max-events",
        type=int,
        default=0,
        help="EventProp's event capacity (0, the default: eventprop_run's default, "
        "nj.training.default_max_events); the run needs n_events",
    )
    args = ap.parse_args(argv)
    for steps in args.steps:
        for kind in args.methods:
            cap = args.max_events or None
            row = measure(kind, steps, cap)
            if kind == "eventprop":
                row["n_events"] = events_used(steps)
            print(json.dumps(row), flush=True)
            print(f"done {kind} {steps}", file=sys.stderr)


if __name__ == "__main__":
    main()
