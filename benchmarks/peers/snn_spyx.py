"""Spyx peer of `benchmarks.training`: one training step of Linear + LIF in Spyx (JAX, Flax NNX).

The problem is `benchmarks.training.problem` drawn from the spec's seed, as for neurojax.
The model is `flax.nnx.Linear(n, n)` holding `(1 - beta) W` and zero bias, and
`spyx.nn.LIF((n,), beta=beta, threshold=1, activation=spyx.axn.superspike(k=25))`;
the step is `jax.value_and_grad` of `sum of spikes` with respect to every `nnx.Param` (the
Linear's kernel and bias, and the LIF's scalar `beta`, which Spyx stores as a parameter),
compiled ahead of time with `jax.jit(...).lower(...).compile()`.

Spyx's LIF (`spikes = H(V - 1); V <- beta V + x - spikes`) resets by subtracting the
threshold (it has no reset-to-zero LIF) and emits the spike of the membrane before the step's
input is added, so its spike trains differ slightly from the other frameworks'; the work per
step is the same.

Variants: `scan` runs `spyx.nn.Sequential(Linear, LIF)` with `spyx.nn.run` (the Linear
inside the `lax.scan`, as Spyx's tutorials write it); `hoisted` applies the Linear to the
whole sequence first and scans only the LIF.

Usage: `python -m benchmarks.peers.snn_spyx SPEC_JSON` with keys `variant`, `n`, `batch`,
`steps`, `seed`, `threads`, `repeats`, `budget_s`.
"""

import time
from typing import Any

from .._harness import peer_main, time_compiled

VARIANTS = ("scan", "hoisted")


def build(w, *, beta: float, slope: float = 25.0):
    """`(linear, lif)`: Spyx/NNX modules with `(1 - beta) w` as kernel and zero bias."""
    import jax.numpy as jnp
    import numpy as np
    import spyx
    from flax import nnx

    n_in, n_out = w.shape
    rngs = nnx.Rngs(0)
    linear = nnx.Linear(n_in, n_out, rngs=rngs)
    linear.kernel[...] = jnp.asarray(w * np.float32(1.0 - beta))
    linear.bias[...] = jnp.zeros((n_out,), jnp.float32)
    lif = spyx.nn.LIF(
        (n_out,), beta=beta, threshold=1.0, activation=spyx.axn.superspike(k=slope), rngs=rngs
    )
    return linear, lif


def make_step(variant: str, linear, lif):
    """`(step, params)`: `step(params, x) -> (loss, grads)` and the initial parameters."""
    import jax
    import spyx
    from flax import nnx

    if variant == "scan":
        model = spyx.nn.Sequential(linear, lif)
    elif variant == "hoisted":
        model = nnx.List([linear, lif])
    else:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x):
        m = nnx.merge(graphdef, params, rest)
        if variant == "scan":
            spikes, _ = spyx.nn.run(m, x)
        else:
            spikes, _ = spyx.nn.run(m[1], m[0](x))
        return spikes.sum()

    return jax.value_and_grad(loss), params


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import spyx

    from ..training import (
        BETA,
        FaultCounter,
        peak_rss_bytes,
        problem,
        reset_peak_rss,
        rss_bytes,
    )

    variant = spec["variant"]
    n, steps = int(spec["n"]), int(spec["steps"])
    x_np, w_np = problem(n, batch=int(spec["batch"]), steps=steps, seed=int(spec["seed"]))
    x = jnp.asarray(x_np)
    del x_np
    linear, lif = build(w_np, beta=BETA)
    del w_np
    step, params = make_step(variant, linear, lif)

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(params, x).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    peak_ok = reset_peak_rss()
    baseline = rss_bytes()
    counted = FaultCounter(lambda *a: jax.block_until_ready(compiled(*a)))
    timing, (loss, grads) = time_compiled(
        counted,
        (params, x),
        compile_s=compile_s,
        repeats=int(spec["repeats"]),
        budget_s=float(spec["budget_s"]),
    )
    peak = peak_rss_bytes() if peak_ok else None
    kernel_grads = [
        np.asarray(g, np.float64)
        for g in jax.tree.leaves(grads)
        if getattr(g, "shape", ()) == (n, n)
    ]
    return {
        "impl": "spyx",
        "variant": variant,
        **{k: v for k, v in timing.as_dict().items() if k in ("compile_s", "first_call_s")},
        "times_s": timing.times,
        "cpu_util": timing.cpu_util,
        "n_spikes": float(loss),
        # In neurojax's parametrisation (I = x W): the kernel holds (1 - beta) W.
        "grad_norm": float(np.linalg.norm(kernel_grads[0]) * (1.0 - BETA))
        if len(kernel_grads) == 1
        else None,
        "page_faults_per_call": counted.timed_mean(),
        "rss_baseline_bytes": baseline,
        "peak_rss_delta_bytes": None
        if peak is None or baseline is None
        else max(peak - baseline, 0),
        "xla_temp_bytes": getattr(mem, "temp_size_in_bytes", None),
        "xla_output_bytes": getattr(mem, "output_size_in_bytes", None),
        "xla_argument_bytes": getattr(mem, "argument_size_in_bytes", None),
        "versions": {"jax": jax.__version__, "spyx": spyx.__version__},
        "note": (
            "spyx.nn.LIF(beta, superspike(25)): reset by subtracting the threshold (no "
            "reset-to-zero LIF in spyx), spike from the membrane before the step's input; "
            "nnx.Linear holds (1-beta) W; grads of all nnx.Params (incl. the LIF's scalar beta); "
            + (
                "Sequential(Linear, LIF) scanned by spyx.nn.run"
                if variant == "scan"
                else "Linear applied once to the sequence, LIF scanned by spyx.nn.run"
            )
        ),
    }


if __name__ == "__main__":
    peer_main(run)
