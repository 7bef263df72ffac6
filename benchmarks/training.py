"""Benchmark: training speed of one dense layer of LIF neurons, neurojax against snnTorch, Norse
and Spyx (the Open Neuromorphic "SNN library benchmarks" setup).

**Setup** (Lenz, Heckel, Shrestha, Barker and Pedersen, open-neuromorphic.org, "SNN library
benchmarks", 2023/24): one fully connected layer `n -> n` (weights and bias) into `n` LIF
neurons, a batch of 16, 500 time steps, float32; one *training step* is timed: the forward
pass over the whole sequence, the loss `sum of all output spikes`, and the backward pass to the
layer's weight and bias (`run_s`, the median of `--repeats`, after an untimed warm-up).

**Scaling.** The original uses n = 16384 on a GPU. The dense products alone cost
`2 T B n^2` FLOP forward and as much again for the weight gradient (the input is data, so no
input gradient is formed): 4.4e12 FLOP per step at n = 16384, tens of seconds per step on
two CPU cores. The default sizes are n in {512, 2048, 4096} (`--sizes`); `--quick` runs n = 512 with
100 steps (`--steps` overrides the 500 steps).

**Identical problem.** Every framework gets the same NumPy-built inputs (`problem`: Bernoulli
spikes with p = 0.1, weights uniform in `+-GAIN / sqrt(n)`, zero bias, seed 0), built before
any timer starts and passed to the peers by seed. GAIN = 30 gives about 6 % firing; the spike
count and the weight-gradient norm of every row are reported, so that the rows can be checked
to compute the same thing (`n_spikes`, `grad_norm`; `spikes_vs_neurojax` is the relative
difference of the spike counts).

**Neuron physics.** LIF with `beta = exp(-dt / tau)`, tau = 10 ms, dt = 1 ms, threshold 1,
reset to 0, fast-sigmoid surrogate `1 / (1 + 25 |v - 1|)^2`, matched per library as far as
each allows (each record's `note` says how):

- neurojax: `nj.training.SpikingDense(n, n, neuron=nj.LIF(tau_m=10, v_rest=0, v_reset=0,
  v_th=1, r_m=1))`, whose exact integration is `v <- beta v + (1 - beta) I` with `I = x W + b`;
  spike `v >= 1`, detached reset. The layer computes the currents of all steps as one matrix
  product and runs the neurons under `nj.simulate` (`lax.scan`). A second row runs it with
  `checkpoint=True` (each step rematerialised in the backward pass), a third with
  `sparse_input=True`: the forward product and the weight gradient are formed from the input
  spikes only (`nj.training.spike_matmul`: each input spike adds one weight row, about a tenth
  of a dense product's work at this input rate), the same numbers up to rounding. The peers
  multiply densely; `over_neurojax_sparse` compares them with this row (`--variants` picks
  neurojax's rows; the first one run is the reference of `over_neurojax`).
- snnTorch: `snn.Leaky(beta, reset_mechanism="zero", spike_grad=fast_sigmoid(slope=25))`
  integrates `mem <- beta mem + I'`; it gets `W' = (1 - beta) W` (and bias), so its membrane
  equals neurojax's `v` (its weight gradient is reported as `(1 - beta) dL/dW'` so that the
  gradient norms compare). Same surrogate, same detached reset.
- Norse: `LIFBoxCell` (the LIF without synaptic current) with `tau_mem_inv = (1 - beta) / dt`,
  so that its forward-Euler step is exactly `beta v + (1 - beta) I`; reset to 0. Norse 1.1's
  SuperSpike backward is `1 / (1 + |x|)^2` whatever `alpha` is (slope 1, not 25), and its reset
  is not detached: its gradient differs, its work does not.
- Spyx (JAX + Flax NNX): `spyx.nn.LIF(beta, activation=superspike(k=25))` with
  `nnx.Linear(W' = (1 - beta) W)`. Spyx's LIF has no reset-to-zero: it resets by subtracting
  the threshold, and it emits the spike of the membrane *before* adding the step's input, so
  its spike trains differ from the others (about 13 % more spikes on this input); the work is
  the same.

**Variants**, as each library's users write the model: snnTorch and Norse in a Python loop
over time with the `Linear` called on each step's input (`loop`, the tutorial style and the
Open Neuromorphic code) and with the `Linear` applied once to the whole sequence before the
loop (`hoisted`, as neurojax does); Spyx with `spyx.nn.Sequential(Linear, LIF)` scanned by
`spyx.nn.run` (`scan`, the `Linear` inside the scan) and `hoisted`. In PyTorch's `loop`
variant every step's `Linear` backward returns a fresh `n x n` weight-gradient buffer; above
glibc's largest mmap threshold (32 MiB, n > 2896) each one is mapped and faulted in anew
(`page_faults_per_call` shows it).

**Protocol** (`benchmarks._harness`): JAX rows are compiled ahead of time (`compile_s`), the
first call is an untimed warm-up (`first_call_s`; for PyTorch, `compile_s` is the first call's
excess over the median). Peers run in their own processes with the same thread pinning;
`--threads 2` also calls `torch.set_num_threads(2)`. `over_neurojax` is a row's `run_s` over
the neurojax (default) row's at the same n.

**Work.** `matmul_flops = 4 T B n^2` (forward product and weight gradient);
`frac_peak_flops` divides `matmul_flops / run_s` by the machine's measured float32 matmul peak
(`benchmarks.tools.machine`, `--machine FILE`). The LIF updates themselves are O(T B n), small
at these n. `xla_matmul_floor_s` is the best time of the two products alone in XLA at the same
shapes (`matmul_floor`, `--no-floor` to skip), and `over_matmul_floor` a row's `run_s` over it
(for the JAX rows, its excess over 1 is the cost of everything except the products; PyTorch's
BLAS can beat XLA's products, so its rows can fall below 1). `sparse_matmul_floor_s` is the
same for the two products through `spike_matmul` (the floor of the `sparse_input` row).
`matmul_flops` and `frac_peak_flops` count the dense products' operations for every row, so
the `sparse_input` row, which skips the zero inputs, can exceed 1 (a dense-equivalent rate).

**Memory.** `peak_rss_delta_bytes`: the process's peak resident memory during the warm-up and
timed calls minus its resident memory just before them (the kernel's high-water mark, reset
through `/proc/self/clear_refs` after `malloc_trim`), i.e. what the training step adds on top
of the inputs, weights and runtime; memory freed earlier but still mapped could be reused
without being counted, so it is a lower bound. `page_faults_per_call`: minor page faults per
timed call (fresh memory mapped in). JAX rows also report XLA's own accounting of the compiled step
(`xla_temp_bytes`, `xla_output_bytes`, `xla_argument_bytes` from `memory_analysis()`).

Run: `python -m benchmarks.training [--quick] [--sizes 512,2048] [--steps T] [--threads 1|2]
[--repeats R] [--budget S] [--no-peers] [--no-floor] [--variants default,checkpoint,sparse_input]
[--frameworks neurojax,snntorch,norse,spyx] [--machine FILE]`.
"""

import argparse
import math
import sys
import time
from typing import Any

from . import _harness

SIZES = (512, 2048, 4096)
QUICK_SIZES = (512,)
STEPS = 500
QUICK_STEPS = 100
BATCH = 16
DT = 1.0  # ms
TAU = 10.0  # ms
V_TH = 1.0
BETA = math.exp(-DT / TAU)
SLOPE = 25.0  # fast-sigmoid surrogate slope
P_INPUT = 0.1  # Bernoulli probability of an input spike per step
GAIN = 30.0  # weights uniform in +-GAIN / sqrt(n)
SEED = 0
FRAMEWORKS = ("neurojax", "snntorch", "norse", "spyx")
# neurojax's rows: (checkpoint, sparse_input) of the layer
NJ_VARIANTS = {
    "default": (False, False),
    "checkpoint": (True, False),
    "sparse_input": (False, True),
}
PEER_VARIANTS = {
    "snntorch": ("loop", "hoisted"),
    "norse": ("loop", "hoisted"),
    "spyx": ("scan", "hoisted"),
}
PEER_MODULES = {
    "snntorch": "benchmarks.peers.snn_torch",
    "norse": "benchmarks.peers.snn_torch",
    "spyx": "benchmarks.peers.snn_spyx",
}
NOTES = {
    "neurojax": (
        "nj.training.SpikingDense + nj.LIF(tau_m=10, v_rest=0, v_reset=0, v_th=1, r_m=1): "
        "exact v <- beta v + (1-beta) I, spike v >= 1, detached reset to 0, fast sigmoid 25; "
        "input product hoisted out of the scan; LIF also carries a refractory state (t_ref=0)"
    ),
}

SPARSE_NOTE = (
    "; sparse_input=True: x W and the weight gradient x^T g add the weight rows of the input "
    "spikes only (nj.training.spike_matmul; the same products, about P_INPUT of the work)"
)

__all__ = [
    "problem",
    "matmul_flops",
    "rss_bytes",
    "reset_peak_rss",
    "peak_rss_bytes",
    "minor_faults",
    "FaultCounter",
    "neurojax_loss",
    "BETA",
]


def problem(n: int, *, batch: int = BATCH, steps: int = STEPS, seed: int = SEED):
    """The shared inputs: spikes `x` (steps, batch, n) and weights `W` (n_in, n_out), float32.

    Built with NumPy from `seed` alone, so that every process draws the same problem.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    bound = GAIN / math.sqrt(n)
    w = rng.uniform(-bound, bound, size=(n, n)).astype(np.float32)
    x = np.empty((steps, batch, n), np.float32)
    for t in range(steps):  # one step at a time: no (steps, batch, n) float64 temporary
        x[t] = rng.random((batch, n), dtype=np.float32) < P_INPUT
    return x, w


def matmul_flops(n: int, batch: int, steps: int) -> float:
    """FLOP of the dense products of one training step: forward and weight gradient."""
    return 4.0 * steps * batch * n * n


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """Resident memory of this process now (Linux; None elsewhere)."""
    return _status_bytes("VmRSS")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (`VmHWM`) to the current RSS; False if unsupported.

    Freed heap memory is first returned to the system (glibc `malloc_trim`), so that memory
    a previous configuration freed is not silently reused uncounted.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def minor_faults() -> int:
    """Minor page faults of this process so far (fresh pages mapped in by the kernel)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss_bytes() -> int | None:
    """Peak resident memory since the last `reset_peak_rss` (or process start)."""
    return _status_bytes("VmHWM")


def neurojax_loss(layer, x, *, checkpoint: bool = False):
    """Sum of the layer's output spikes over a time-major input (the benchmark's loss)."""
    return layer(x, dt=DT, checkpoint=checkpoint).sum()


def neurojax_layer(w, *, key=None, sparse_input: bool = False):
    """`nj.training.SpikingDense(n, n)` with weights `w`, zero bias and the benchmark's LIF
    (`sparse_input=True`: the input product through `nj.training.spike_matmul`)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import neurojax as nj

    n_in, n_out = w.shape
    layer = nj.training.SpikingDense(
        n_in,
        n_out,
        key=jax.random.key(SEED) if key is None else key,
        neuron=nj.LIF(tau_m=TAU, v_rest=0.0, v_reset=0.0, v_th=V_TH, r_m=1.0),
        sparse_input=sparse_input,
    )
    return eqx.tree_at(lambda m: m.weight, layer, jnp.asarray(w, jnp.float32))


def _products_time(products, x, w, repeats: int) -> float:
    """Best time of the compiled `products(x, w, g)`, with `g` of the output's shape."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    g = np.random.default_rng(SEED + 1).random(x.shape[:-1] + w.shape[1:], np.float32)
    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(g))
    compiled = jax.jit(products).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_floor(x, w, *, repeats: int = 3) -> float:
    """Best time of the layer's two dense products alone in XLA, forward `x W` and weight
    gradient `x^T g` (with `g` of the output's shape): what any step of this layer costs at
    least in XLA on this machine."""
    import jax.numpy as jnp

    def products(x, w, g):
        return jnp.einsum("tbi,io->tbo", x, w), jnp.einsum("tbi,tbo->io", x, g)

    return _products_time(products, x, w, repeats)


def sparse_matmul_floor(x, w, *, repeats: int = 3) -> float:
    """Best time of the same two products through `nj.training.spike_matmul` (forward, and
    the weight gradient its VJP forms from the input spikes): the floor of the
    `sparse_input` row."""
    import jax

    import neurojax as nj

    def products(x, w, g):
        y, vjp = jax.vjp(lambda w: nj.training.spike_matmul(x, w), w)
        return y, vjp(g)[0]

    return _products_time(products, x, w, repeats)


def _extra(parser) -> None:
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the bare XLA products (xla_matmul_floor_s; default: yes)",
    )
    parser.add_argument("--steps", type=int, default=None, help="time steps (500; quick 100)")
    parser.add_argument(
        "--variants",
        default=",".join(NJ_VARIANTS),
        help=f"comma-separated subset of neurojax's rows {tuple(NJ_VARIANTS)} (the first "
        "one run is the reference of over_neurojax)",
    )
    parser.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help=f"comma-separated subset of {FRAMEWORKS}",
    )


class FaultCounter:
    """Wrap a (blocking) callable and record the minor page faults of each call.

    The first call is the harness's warm-up; `timed_mean` averages the later ones.
    """

    def __init__(self, fn):
        self.fn = fn
        self.faults: list[int] = []

    def __call__(self, *args):
        f0 = minor_faults()
        out = self.fn(*args)
        self.faults.append(minor_faults() - f0)
        return out

    def timed_mean(self) -> float | None:
        timed = self.faults[1:]
        return sum(timed) / len(timed) if timed else None


def _device_peak_bytes() -> int | None:
    """Peak bytes in use on JAX's first device so far in this process (GPU/TPU allocators
    report it; CPU: None). JAX cannot reset it, so a row's figure is the largest of every
    configuration run before it in the process (sizes run in the order of `--sizes`)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _memory_fields(baseline: int | None, peak_ok: bool) -> dict[str, Any]:
    peak = peak_rss_bytes() if peak_ok else None
    delta = None if peak is None or baseline is None else max(peak - baseline, 0)
    return {"rss_baseline_bytes": baseline, "peak_rss_delta_bytes": delta}


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=SIZES, quick_sizes=QUICK_SIZES, argv=argv, extra=_extra
    )
    frameworks = tuple(f for f in args.frameworks.split(",") if f)
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        raise SystemExit(f"--frameworks must name frameworks from {FRAMEWORKS}, got {unknown}")
    nj_variants = tuple(v for v in args.variants.split(",") if v)
    unknown = [v for v in nj_variants if v not in NJ_VARIANTS]
    if unknown or not nj_variants:
        raise SystemExit(
            f"--variants must name neurojax rows from {tuple(NJ_VARIANTS)}, got {args.variants!r}"
        )
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import neurojax as nj

    machine = _harness.load_machine(args)
    if args.machine is None:
        _harness.emit(machine)
    peak_flops = machine.get("peak_flops")
    base = {
        "bench": "training",
        "batch": BATCH,
        "steps": steps,
        "dt": DT,
        "tau_m": TAU,
        "beta": BETA,
        "threads": args.threads,
        "seed": SEED,
        "p_input": P_INPUT,
        "gain": GAIN,
    }

    floors: dict[int, float] = {}
    sparse_floors: dict[int, float] = {}

    def work_fields(rec: dict[str, Any], n: int) -> None:
        flops = matmul_flops(n, BATCH, steps)
        rec["matmul_flops"] = flops
        rec["matmul_flops_per_s"] = flops / rec["run_s"]
        rec["frac_peak_flops"] = flops / rec["run_s"] / peak_flops if peak_flops else None
        if n in floors:
            rec["xla_matmul_floor_s"] = floors[n]
            rec["over_matmul_floor"] = rec["run_s"] / floors[n]
        if n in sparse_floors:
            rec["sparse_matmul_floor_s"] = sparse_floors[n]

    summary: list[str] = []
    for n in args.sizes:
        x_np, w_np = problem(n, steps=steps)
        ref: dict[str, Any] | None = None
        sparse_ref: dict[str, Any] | None = None
        if args.floor:
            _harness.log(f"training: XLA matmul floor n={n}")
            floors[n] = matmul_floor(x_np, w_np, repeats=min(args.repeats, 3))
            if "neurojax" in frameworks and "sparse_input" in nj_variants:
                sparse_floors[n] = sparse_matmul_floor(x_np, w_np, repeats=min(args.repeats, 3))
        if "neurojax" in frameworks:
            x = jnp.asarray(x_np)
            for variant in nj_variants:
                checkpoint, sparse_input = NJ_VARIANTS[variant]
                layer = neurojax_layer(w_np, sparse_input=sparse_input)
                params, static = eqx.partition(layer, nj.training.trainable(layer))
                _harness.log(f"training: neurojax {variant} n={n}")

                def step(params, x, static=static, checkpoint=checkpoint):
                    return jax.value_and_grad(
                        lambda p: neurojax_loss(eqx.combine(p, static), x, checkpoint=checkpoint)
                    )(params)

                t0 = time.perf_counter()
                compiled = jax.jit(step).lower(params, x).compile()
                compile_s = time.perf_counter() - t0
                mem = compiled.memory_analysis()
                peak_ok = reset_peak_rss()
                baseline = rss_bytes()
                counted = FaultCounter(lambda *a, c=compiled: jax.block_until_ready(c(*a)))
                timing, (loss, grads) = _harness.time_compiled(
                    counted,
                    (params, x),
                    compile_s=compile_s,
                    repeats=args.repeats,
                    budget_s=args.budget,
                )
                rec = {
                    **base,
                    "impl": "neurojax",
                    "variant": variant,
                    "n": n,
                    "dtype": "float32",
                    **timing.as_dict(),
                    "n_spikes": float(loss),
                    "spike_rate": float(loss) / (steps * BATCH * n),
                    "grad_norm": float(np.linalg.norm(np.asarray(grads.weight, np.float64))),
                    **_memory_fields(baseline, peak_ok),
                    "page_faults_per_call": counted.timed_mean(),
                    "device_peak_bytes": _device_peak_bytes(),
                    "xla_temp_bytes": getattr(mem, "temp_size_in_bytes", None),
                    "xla_output_bytes": getattr(mem, "output_size_in_bytes", None),
                    "xla_argument_bytes": getattr(mem, "argument_size_in_bytes", None),
                    "versions": {"jax": jax.__version__, "neurojax": nj.__version__},
                    "note": NOTES["neurojax"]
                    + ("; checkpoint=True" if checkpoint else "")
                    + (SPARSE_NOTE if sparse_input else ""),
                }
                work_fields(rec, n)
                if ref is None:
                    ref = rec
                else:
                    rec["over_neurojax"] = rec["run_s"] / ref["run_s"]
                    rec["spikes_vs_neurojax"] = rec["n_spikes"] / ref["n_spikes"] - 1.0
                if sparse_input:
                    sparse_ref = rec
                _harness.emit(rec)
                del compiled, counted, loss, grads, layer, params
            del x
        del x_np, w_np
        if not args.peers:
            continue
        for impl in frameworks:
            if impl == "neurojax":
                continue
            for variant in PEER_VARIANTS[impl]:
                _harness.log(f"training: {impl} {variant} n={n}")
                spec = {
                    "impl": impl,
                    "variant": variant,
                    "n": n,
                    "batch": BATCH,
                    "steps": steps,
                    "seed": SEED,
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "budget_s": args.budget,
                    "device": "cuda" if jax.default_backend() == "gpu" else "cpu",
                }
                res = _harness.run_peer(PEER_MODULES[impl], spec, threads=args.threads)
                rec = {**base, "impl": impl, "variant": variant, "n": n, "dtype": "float32"}
                if "error" in res:
                    rec["error"] = res["error"]
                    _harness.log(f"training: {impl} {variant} n={n} failed: {res['error']}")
                else:
                    rec.update(_harness.timing_from_peer(res))
                    for key, value in res.items():
                        if key not in rec and key not in ("times_s", "first_call_s"):
                            rec[key] = value
                    rec["spike_rate"] = rec["n_spikes"] / (steps * BATCH * n)
                    work_fields(rec, n)
                    line = f"n={n} {impl} {variant}: {rec['run_s']:.3g} s"
                    if ref is not None:
                        rec["over_neurojax"] = rec["run_s"] / ref["run_s"]
                        rec["spikes_vs_neurojax"] = rec["n_spikes"] / ref["n_spikes"] - 1.0
                        line += f", {rec['over_neurojax']:.2f}x neurojax {ref['variant']}"
                    if sparse_ref is not None:
                        rec["over_neurojax_sparse"] = rec["run_s"] / sparse_ref["run_s"]
                        line += f", {rec['over_neurojax_sparse']:.2f}x neurojax sparse_input"
                    if ref is not None or sparse_ref is not None:
                        summary.append(line)
                _harness.emit(rec)
    if summary:
        _harness.log("training: " + "; ".join(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
