"""snnTorch and Norse peers of `benchmarks.training`: one training step of Linear + LIF.

The problem (`benchmarks.training.problem`: spikes `x` of shape (steps, batch, n), weights `W`
of shape (n_in, n_out), zero bias) is drawn from the seed in the spec, identical to
neurojax's. One call is the forward pass over the sequence, `loss = sum of spikes` and
`loss.backward()` to the Linear's weight and bias.

- **snnTorch** (`impl="snntorch"`): `snn.Leaky(beta, threshold=1, reset_mechanism="zero",
  spike_grad=surrogate.fast_sigmoid(slope=25))`, state initialised by `reset_mem()`. Leaky
  integrates `mem <- beta mem + I`, so the `Linear` holds `(1 - beta) W` and the membrane then
  equals neurojax's `v <- beta v + (1 - beta) x W`. The reported gradient norm is that of
  `(1 - beta) dL/dW'`, the gradient in neurojax's parametrisation.
- **Norse** (`impl="norse"`): `norse.torch.LIFBoxCell` (LIF without synaptic current) with
  `tau_mem_inv = (1 - beta) / dt`, `v_th = 1`, `v_reset = 0`, `dt = 1e-3`, whose Euler step
  `v + dt tau_mem_inv (I - v)` is exactly `beta v + (1 - beta) I`; the `Linear` holds `W`.
  `alpha = 25` is passed, but Norse 1.1's SuperSpike backward ignores it (`1/(1+|x|)^2`).

Variants: `loop` calls the `Linear` on each step's input inside the Python loop over time
(how both libraries' tutorials, and the Open Neuromorphic benchmark, write it); `hoisted`
applies it once to the whole sequence and loops only over the neuron (`unbind(0)`, whose
backward stacks the step gradients instead of scattering each into a full-size zero tensor).

Usage: `python -m benchmarks.peers.snn_torch SPEC_JSON` with keys `impl`, `variant`, `n`,
`batch`, `steps`, `seed`, `threads`, `repeats`, `budget_s`.
"""

import time
from typing import Any

from .._harness import peer_main, time_call

IMPLS = ("snntorch", "norse")
VARIANTS = ("loop", "hoisted")


def build(impl: str, w, *, beta: float, slope: float = 25.0, dt_s: float = 1e-3):
    """The `Linear` (weights from `w`, zero bias) and the neuron of `impl`."""
    import numpy as np
    import torch

    n_in, n_out = w.shape
    fc = torch.nn.Linear(n_in, n_out)
    scale = (1.0 - beta) if impl == "snntorch" else 1.0
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy(np.ascontiguousarray((w * np.float32(scale)).T)))
        fc.bias.zero_()
    if impl == "snntorch":
        import snntorch as snn
        from snntorch import surrogate

        neuron = snn.Leaky(
            beta=beta,
            threshold=1.0,
            reset_mechanism="zero",
            spike_grad=surrogate.fast_sigmoid(slope=slope),
        )
    elif impl == "norse":
        import warnings

        with warnings.catch_warnings():  # norse 1.1 calls the deprecated torch.jit.script
            warnings.simplefilter("ignore", DeprecationWarning)
            import norse.torch as norse

        p = norse.LIFBoxParameters(
            tau_mem_inv=torch.as_tensor((1.0 - beta) / dt_s),
            v_leak=torch.as_tensor(0.0),
            v_th=torch.as_tensor(1.0),
            v_reset=torch.as_tensor(0.0),
            method="super",
            alpha=torch.as_tensor(slope),
        )
        neuron = norse.LIFBoxCell(p, dt=dt_s)
    else:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return fc, neuron


def forward(impl: str, variant: str, fc, neuron, x):
    """The spikes (steps, batch, n) of the layer on `x`, as a graph for `backward`."""
    import torch

    spikes = []
    if variant == "loop":
        inputs = (fc(x[t]) for t in range(x.shape[0]))
    elif variant == "hoisted":
        inputs = fc(x).unbind(0)
    else:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if impl == "snntorch":
        mem = neuron.reset_mem()
        for cur in inputs:
            spk, mem = neuron(cur, mem)
            spikes.append(spk)
    else:
        state = None
        for cur in inputs:
            spk, state = neuron(cur, state)
            spikes.append(spk)
    return torch.stack(spikes)


def train_step(impl: str, variant: str, fc, neuron, x):
    """One forward and backward pass; returns the loss (the spike count) as a float."""
    fc.zero_grad(set_to_none=True)
    loss = forward(impl, variant, fc, neuron, x).sum()
    loss.backward()
    return float(loss.detach())


def grad_norm(impl: str, fc, *, beta: float) -> float:
    """Norm of the weight gradient in neurojax's parametrisation (`I = x W`)."""
    g = fc.weight.grad.double()
    if impl == "snntorch":
        g = g * (1.0 - beta)
    return float(g.norm())


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ..training import (
        BETA,
        FaultCounter,
        peak_rss_bytes,
        problem,
        reset_peak_rss,
        rss_bytes,
    )

    impl, variant = spec["impl"], spec["variant"]
    if impl not in IMPLS or variant not in VARIANTS:
        raise ValueError(f"unknown impl/variant {impl!r}/{variant!r}")
    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    # "cuda" when neurojax's own rows ran on a GPU: each framework on the same accelerator.
    device = torch.device(spec.get("device", "cpu"))
    n, steps = int(spec["n"]), int(spec["steps"])
    x_np, w_np = problem(n, batch=int(spec["batch"]), steps=steps, seed=int(spec["seed"]))
    x = torch.from_numpy(x_np).to(device)
    fc, neuron = build(impl, w_np, beta=BETA)
    fc, neuron = fc.to(device), neuron.to(device)
    del w_np
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    result: dict[str, Any] = {"impl": impl, "variant": variant}
    peak_ok = reset_peak_rss()
    baseline = rss_bytes()
    t0 = time.perf_counter()
    counted = FaultCounter(lambda: train_step(impl, variant, fc, neuron, x))
    timing, loss = time_call(
        counted,
        repeats=int(spec["repeats"]),
        budget_s=float(spec["budget_s"]),
    )
    wall = time.perf_counter() - t0
    peak = peak_rss_bytes() if peak_ok else None
    result.update(
        compile_s=timing.compile_s,
        first_call_s=timing.first_call_s,
        times_s=timing.times,
        cpu_util=timing.cpu_util,
        wall_s=wall,
        n_spikes=loss,
        grad_norm=grad_norm(impl, fc, beta=BETA),
        page_faults_per_call=counted.timed_mean(),
        rss_baseline_bytes=baseline,
        peak_rss_delta_bytes=None if peak is None or baseline is None else max(peak - baseline, 0),
        torch_threads=torch.get_num_threads(),
        device=str(device),
        device_peak_bytes=(
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        ),
        versions={"torch": torch.__version__, impl: _version(impl)},
        note=NOTES[impl, variant],
    )
    return result


def _version(impl: str) -> str:
    from importlib.metadata import version

    return version(impl)


NOTES = {
    ("snntorch", "loop"): (
        "snn.Leaky(beta, reset_mechanism='zero', fast_sigmoid(25)); Linear holds (1-beta) W; "
        "spike mem > 1; detached reset applied at the next step (same trajectory); "
        "Linear called per step in a Python loop"
    ),
    ("snntorch", "hoisted"): (
        "snn.Leaky(beta, reset_mechanism='zero', fast_sigmoid(25)); Linear holds (1-beta) W; "
        "Linear applied once to the sequence, Python loop over the neuron"
    ),
    ("norse", "loop"): (
        "LIFBoxCell, tau_mem_inv=(1-beta)/dt (Euler step = beta v + (1-beta) I); spike v > 1; "
        "reset (1-z) v not detached; SuperSpike backward 1/(1+|x|)^2 (norse 1.1 ignores alpha"
        "=25); Linear called per step in a Python loop"
    ),
    ("norse", "hoisted"): (
        "LIFBoxCell as in loop; Linear applied once to the sequence, Python loop over the neuron"
    ),
}


if __name__ == "__main__":
    peer_main(run)
