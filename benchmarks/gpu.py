"""Benchmark: every GPU figure of neurojax and its GPU peers in one run of at most 7 minutes.

`python -m benchmarks.gpu --out DIR` (what `make bench-gpu` runs) measures, on the device JAX
sees, in this order of priority:

1. `machine`: float32 matmul FLOP/s (precision "highest", and JAX's default precision, which
   may use TF32 on NVIDIA GPUs) and the bandwidth of a triad `a = b + s c` (3 words per
   element, output buffer donated);
2. `scan_floor`: the cost of one step of a `lax.scan` whose body does almost nothing (a scalar
   carry, and a carry of 4000 floats): the per-step floor of every `nj.simulate` run;
3. `coba_one`: the COBA network (`nj.models.coba`, 1 s at dt = 0.1 ms) as one trial, with the
   full bool raster and with `record_every=10`, and its rates (~21 Hz on the CPU);
4. `coba_batch`: batches of 64, 256, 1024 and 4096 trials (`batch=(B,)`, spike counts per
   100 ms window), time per trial;
5. `coba_stdp`: COBA with additive STDP on E->E (built as `benchmarks.stdp_overhead` does);
6. `network_scale`: 10^6 LIF neurons with 10^8 synapses, 100 ms (`benchmarks.network_scale`);
7. `hh`: 10^5 Hodgkin-Huxley neurons, RK4, 50 ms at dt = 0.01 ms;
8. `lif`: 10^6 LIF neurons, 1000 steps (`benchmarks.lif_population`'s population);
9. `assembly`: assembly projection n = 10^5, k = 317, p = 0.01, 100 steps, one brain and a
   vmapped batch of 64 brains (`benchmarks.assembly`);
10. `training`: one training step of `benchmarks.training` (n = 4096, batch 16, 500 steps);
11. `coba_scales`: COBA scaled by 10 and 100 (populations times s, p / s: ~80 inputs per
    neuron), the neurojax side of the BrainPy comparison;
12. `coba_vmap`: `jax.vmap` over 64 full COBA states (what a user writes for a sweep);
13. `microcircuit`: the per-step path on the cortical microcircuit at scales 0.1 and 1
    (real-time factor);
14. `coba_cmdbuf` (its own child, `XLA_FLAGS` += `CMDBUF_FLAGS`: XLA:GPU's WHILE and
    CONDITIONAL command buffers): COBA one trial and 1024 trials, to compare with
    `coba_one` and `coba_batch`;
15. `step_cmdbuf` (GPU only): the per-step path (microcircuit at scales 0.1 and 1, 10^6 LIF
    neurons) with command buffers off, at XLA's default and with WHILE and CONDITIONAL
    (`STEP_CMDBUF_VARIANTS`), one process per setting.

15. `network_run` (third, after `gpu_check`): the whole-network kernel (one program per trial
    runs every step, `Network.fused_run`): its spike counts against the CPU kernels' on COBA
    and on COBA with STDP first, then COBA 1 s as one trial (and the same kept per step with
    `nj.kernels.whole_networks(False)`), 1024 trials, `jax.vmap` over 64 full states and COBA
    with STDP, each line naming the path that ran (`nj.kernels.explain`). Since this kernel
    landed, the COBA sections above (`coba_one`, `coba_batch`, `coba_vmap`, `coba_cmdbuf`)
    take it on a GPU too (full-size COBA builds the event layout and fits one program).
Before any timing, `gpu_check` (second, after `machine`) runs the whole-run LIF and HH kernels
and COBA's per-step kernels on the GPU and on the CPU on the same inputs and compares the
spike counts of every neuron; a mismatch is written as `"match": false` and logged in
capitals (without a GPU it runs the GPU slots in Pallas interpret mode: the section's logic is
tested by `--quick` on any machine).

Then the peers, each in its own process on the same GPU, each guarded (a missing package, a
crash or a timeout leaves a line with `error`, and the script goes on):
`peer_brainpy` (brainpy.state + brainevent COBA at scales 1, 10 and 100,
`benchmarks.peers.brainpy_coba` with `platform="gpu"`), `peer_cupy_hh` (a CuPy `RawKernel`
RK4 Hodgkin-Huxley batch, one thread per neuron and one launch per step, `CUPY_HH_SOURCE`),
`peer_torch_assembly` (a dense PyTorch assembly projection: `torch.sum(connectome[winners])`
and `torch.topk`) and `peer_snntorch` (`benchmarks.peers.snn_torch` on CUDA). After each peer,
a `ratio` line gives `neurojax_over_peer` (neurojax's time / the peer's) for each figure both
measured.

**Time limits.** Every section has a limit; the sections run in a child process that the
parent watches, and a section still running at its limit is abandoned (the child is killed, a
line with `"status": "abandoned"` is written, and a fresh child goes on with the next
section). The whole run has a budget (`--total`, 400 s by default); each section's limit is
cut so that every later section keeps its minimum, and a section left with no time is
`"status": "skipped"`.

**Timing.** Inputs are built before the timer; JAX computations are compiled ahead of time
(`compile_s`), called once untimed, then timed with `block_until_ready` (`run_s`: the median of
up to `--repeats` calls within a share of the section's limit; `times_s`: all of them).
Peers time the same way with their own synchronisation.

**Output.** One JSON line per figure in `DIR/results.jsonl` (also printed on stdout), with
`section`, `figure`, `impl`, `status` (`ok`, `error`, `abandoned`, `skipped`); progress and
the children's stderr go to stderr and `DIR/log.txt`.

`--quick` runs every section at tiny sizes (on the CPU backend when there is no GPU; the
peers that need CUDA are `"skipped: no GPU"`), in about 2-4 min on two cores.

`--dry-run` times nothing, on any machine: it prints the sections with their limits, the
`XLA_FLAGS` of each command-buffer variant and the proxy count of the kernels one step
launches on a GPU (`tests/_kernel_count.py`: COBA, COBA with STDP, the smallest microcircuit).

Run: `python -m benchmarks.gpu --out DIR [--quick] [--sections a,b] [--total S]
[--repeats R] [--dry-run]`.
"""

import argparse
import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _harness

# Numbers not imported here: the peer children must be able to pin threads before NumPy and
# JAX load (benchmarks.peers.brainpy_coba), and the parent never needs them.

TOTAL_S = 400.0  # the whole run, peers included: 6 min 40 s, under the 7-minute target
QUICK_TOTAL_S = 330.0  # issue #37: gpu_check and network_run interpret the GPU kernels
STARTUP_MARGIN_S = 2.0
QUICK_FLOOR_S = 5.0


@dataclass(frozen=True)
class Section:
    name: str
    group: str  # sections of one group run one after the other in the same child process
    limit_s: float
    floor_s: float  # kept free for this section by the limits of the sections before it
    quick_limit_s: float


SECTIONS = (
    Section("machine", "neurojax", 20, 8, 25),
    Section("gpu_check", "neurojax", 40, 15, 40),
    Section("network_run", "neurojax", 90, 20, 70),
    Section("scan_floor", "neurojax", 15, 5, 15),
    Section("coba_one", "neurojax", 40, 15, 30),
    Section("coba_batch", "neurojax", 75, 15, 30),
    Section("coba_stdp", "neurojax", 30, 10, 25),
    Section("network_scale", "neurojax", 60, 15, 25),
    Section("hh", "neurojax", 20, 8, 15),
    Section("lif", "neurojax", 20, 8, 15),
    Section("assembly", "neurojax", 45, 10, 30),
    Section("training", "neurojax", 30, 10, 20),
    Section("coba_scales", "neurojax", 50, 10, 20),
    Section("coba_vmap", "neurojax", 30, 10, 20),
    Section("microcircuit", "neurojax", 60, 15, 45),
    Section("coba_cmdbuf", "cmdbuf", 45, 15, 30),
    Section("step_cmdbuf", "neurojax", 90, 20, 40),
    Section("peer_brainpy", "brainpy", 90, 30, 40),
    Section("peer_cupy_hh", "cupy", 20, 10, 10),
    Section("peer_torch_assembly", "torch", 40, 15, 20),
    Section("peer_snntorch", "snntorch", 30, 15, 25),
)
BY_NAME = {s.name: s for s in SECTIONS}

# Sizes of the full run and of --quick.
FULL = {
    "matmul_sizes": (4096, 8192),
    "triad_elements": 2**28,
    "scan_steps": 100_000,
    "coba_steps": 10_000,
    "coba_batches": (64, 256, 1024, 4096),
    "batch_record_every": 1000,
    "network_n": 1_000_000,
    "network_steps": 1000,
    "hh_n": 100_000,
    "hh_steps": 5000,
    "lif_n": 1_000_000,
    "lif_steps": 1000,
    "assembly_n": 100_000,
    "assembly_k": 317,
    "assembly_steps": 100,
    "assembly_batch": 64,
    "training_n": 4096,
    "training_steps": 500,
    "coba_scales": (10, 100),
    "brainpy_scales": (1, 10, 100),
    "check_steps": 1000,
    "check_lif_n": 10_000,
    "check_hh_n": 1000,
    "vmap_trials": 64,
    "microcircuit_scales": (0.1, 1.0),
    "microcircuit_steps": 1000,
    "cmdbuf_batch": 1024,
    "nr_check_coba": (3200, 800, 0.02),
    "nr_batch": 1024,
    "nr_vmap": 64,
    "step_cmdbuf_scales": (0.1, 1.0),
    "step_cmdbuf_steps": 1000,
    "step_cmdbuf_network_n": 1_000_000,
}
QUICK = {
    "matmul_sizes": (256, 512),
    "triad_elements": 2**20,
    "scan_steps": 1000,
    "coba_steps": 200,
    "coba_batches": (2, 4),
    "batch_record_every": 100,
    "network_n": 10_000,
    "network_steps": 100,
    "hh_n": 100,
    "hh_steps": 500,
    "lif_n": 10_000,
    "lif_steps": 100,
    "assembly_n": 10_000,
    "assembly_k": 100,
    "assembly_steps": 20,
    "assembly_batch": 4,
    "training_n": 256,
    "training_steps": 50,
    "coba_scales": (2,),
    "brainpy_scales": (1,),
    "check_steps": 100,
    "check_lif_n": 200,
    "check_hh_n": 50,
    "vmap_trials": 2,
    "microcircuit_scales": (0.01,),
    "microcircuit_steps": 20,
    "cmdbuf_batch": 2,
    "nr_check_coba": (160, 40, 0.1),
    "nr_batch": 2,
    "nr_vmap": 2,
    "step_cmdbuf_scales": (0.01,),
    "step_cmdbuf_steps": 20,
    "step_cmdbuf_network_n": 10_000,
}
# XLA:GPU's command buffers (CUDA graphs) for the kinds of commands a step uses, WHILE and
# CONDITIONAL included (off by default): the `coba_cmdbuf` section runs in a child with them.
CMDBUF_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUSTOM_CALL,WHILE,CONDITIONAL"
# The command-buffer settings the per-step path is timed under (`step_cmdbuf`, one grandchild
# process each, as XLA reads its flags once per process). The flag takes a list of command
# types, or `+TYPE`/`-TYPE` edits of XLA's default list (FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL,
# CUDNN, DYNAMIC_SLICE_FUSION, with WHILE and CONDITIONAL off; `xla/debug_options_flags.cc`);
# an empty list turns command buffers off.
STEP_CMDBUF_VARIANTS = {
    "off": "--xla_gpu_enable_command_buffer=",
    "default": "",
    "while_conditional": "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",
}
COBA_DT = 0.1  # ms
HH_DT = 0.01  # ms
LIF_DT = 0.1  # ms
SEED = 0
COBA_CPU_RATE_HZ = 21.0  # the mean COBA rate neurojax gives on the CPU (benchmarks/RESULTS.md)


def cuda_present() -> bool:
    """Whether an NVIDIA GPU is visible, without importing any framework."""
    import shutil

    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


# --------------------------------------------------------------------------------------
# The child: runs sections, prints `@@start NAME`, JSON lines and `@@end NAME` on stdout.
# --------------------------------------------------------------------------------------


class Context:
    """What a section sees: its sizes, its time left, the emitter and earlier results."""

    def __init__(self, quick: bool, repeats: int, deadline: float, cuda: bool):
        self.quick = quick
        self.size = QUICK if quick else FULL
        self.repeats = repeats
        self.global_deadline = deadline
        self.cuda = cuda
        self.section = ""
        self.section_end = 0.0
        self.results: dict[tuple[str, str], dict[str, Any]] = {}

    def left(self) -> float:
        return max(self.section_end - time.time(), 0.0)

    def budget(self, share: float = 0.3) -> float:
        """Seconds of timed repeats allowed to the next figure: a share of the time left."""
        return max(share * self.left(), 0.05)

    def emit(self, figure: str, record: dict[str, Any]) -> None:
        rec = {"section": self.section, "figure": figure, "status": "ok", **record}
        self.results[self.section, figure] = rec
        print(json.dumps(_harness._clean(rec), allow_nan=False), flush=True)

    def guard(self, figure: str, impl: str, fn: Callable[[], dict[str, Any] | None]) -> None:
        """Run one figure; an exception becomes an `error` line and the section goes on."""
        try:
            record = fn()
        except Exception as exc:  # a failure of one figure must not lose the others
            _harness.log(f"gpu: {self.section}/{figure} failed: {exc!r}")
            record = {"impl": impl, "status": "error", "error": _short(exc)}
        if record is not None:
            self.emit(figure, {"impl": impl, **record})


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + "..."


def effective_limit(name: str, now: float, deadline: float, quick: bool, names: list[str]) -> float:
    """The limit of section `name` started at `now`: its own limit, cut so that the sections
    after it in `names` keep their minimum before the run's deadline."""
    sec = BY_NAME[name]
    own = sec.quick_limit_s if quick else sec.limit_s
    later = names[names.index(name) + 1 :]
    # --quick keeps a token minimum: its sections take seconds, and its budget only guards.
    reserve = sum(QUICK_FLOOR_S if quick else BY_NAME[n].floor_s for n in later)
    return min(own, deadline - now - reserve)


def _timing(timing) -> dict[str, Any]:
    return timing.as_dict()


def _device_fields() -> dict[str, Any]:
    import jax

    dev = jax.devices()[0]
    return {"platform": dev.platform, "device_kind": dev.device_kind}


# ---- neurojax sections ----------------------------------------------------------------


def sec_machine(ctx: Context) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    def median_time(call, repeats: int) -> list[float]:
        call()  # warm-up, compilation included
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return times

    def matmul() -> dict[str, Any]:
        out: dict[str, Any] = {"matmul_sizes": list(ctx.size["matmul_sizes"])}
        rng = np.random.default_rng(SEED)
        for label, precision in (("f32", jax.lax.Precision.HIGHEST), ("default", None)):
            best = 0.0
            for n in ctx.size["matmul_sizes"]:
                a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
                b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
                mm = jax.jit(lambda a, b, p=precision: jnp.matmul(a, b, precision=p))
                times = median_time(lambda mm=mm, a=a, b=b: mm(a, b).block_until_ready(), 5)
                best = max(best, 2.0 * n**3 / float(np.median(times)))
            out[f"matmul_{label}_flops"] = best
        return out

    def triad() -> dict[str, Any]:
        size = ctx.size["triad_elements"]
        fn = jax.jit(lambda a, b, c: b + np.float32(1.5) * c, donate_argnums=0)
        b = jnp.ones(size, jnp.float32)
        c = jnp.ones(size, jnp.float32)
        holder = [jnp.zeros(size, jnp.float32)]

        def run():
            holder[0] = fn(holder[0], b, c)
            holder[0].block_until_ready()

        times = median_time(run, 10)
        return {
            "triad_elements": size,
            "triad_bytes_per_s": 3 * 4 * size / float(np.median(times)),
            "triad_times_s": times,
        }

    record = {"impl": "jax", **_device_fields(), "jax": jax.__version__}
    record["devices"] = [str(d) for d in jax.devices()]
    try:
        import neurojax as nj

        record["neurojax"] = nj.__version__
        record["neurojax_path"] = str(Path(nj.__file__).parent)
    except Exception as exc:  # reported, so that a GPU image without a dependency shows it
        record["neurojax_import_error"] = _short(exc)
    record.update(matmul())
    record.update(triad())
    ctx.emit("limits", record)


def sec_scan_floor(ctx: Context) -> None:
    import jax
    import jax.numpy as jnp

    steps = ctx.size["scan_steps"]

    def scalar(x):
        return jax.lax.scan(lambda c, _: (c + 1.0, None), x, None, length=steps)[0]

    def vector(x):
        return jax.lax.scan(lambda c, _: (c * 0.999 + 1.0, None), x, None, length=steps)[0]

    for figure, fn, arg in (
        ("scalar", scalar, jnp.float32(0.0)),
        ("vector_4000", vector, jnp.zeros(4000, jnp.float32)),
    ):

        def one(fn=fn, arg=arg) -> dict[str, Any]:
            timing, _, _ = _harness.time_jax(
                fn, (arg,), repeats=ctx.repeats, budget_s=ctx.budget(0.3)
            )
            return {
                "steps": steps,
                "us_per_step": timing.run_s / steps * 1e6,
                **_timing(timing),
                **_device_fields(),
            }

        ctx.guard(figure, "neurojax", one)


def _coba_rates(spikes: dict[str, Any], n_exc: int, n_inh: int, trials: int, ms: float):
    import numpy as np

    seconds = ms * 1e-3
    n_e = int(np.asarray(spikes["E"]).sum(dtype=np.int64))
    n_i = int(np.asarray(spikes["I"]).sum(dtype=np.int64))
    return {
        "rate_exc_hz": n_e / (n_exc * trials * seconds),
        "rate_inh_hz": n_i / (n_inh * trials * seconds),
        "rate_hz": (n_e + n_i) / ((n_exc + n_inh) * trials * seconds),
        "n_spikes": n_e + n_i,
    }


def _coba_figure(
    ctx: Context, *, batch: int, every: int, scale: int = 1, share: float = 0.3
) -> dict[str, Any]:
    import jax

    import neurojax as nj

    steps = ctx.size["coba_steps"]
    n_exc, n_inh = 3200 * scale, 800 * scale
    t0 = time.perf_counter()
    net, state = nj.models.coba(
        jax.random.key(SEED),
        n_exc=n_exc,
        n_inh=n_inh,
        p=0.02 / scale,
        batch=() if batch == 1 else (batch,),
    )
    jax.block_until_ready(state)
    build_s = time.perf_counter() - t0
    net = _harness.fit_spike_capacity(net, state, dt=COBA_DT, n_steps=steps)

    def run(net, state):
        final, rec = nj.simulate(net, state, dt=COBA_DT, n_steps=steps, record_every=every)
        return final, rec.spikes

    # The per-step path: COBA fits one program, so on a GPU `simulate` would otherwise run it
    # whole (`network_run`, timed in its own section).
    with nj.kernels.whole_networks(False):
        timing, (_, spikes), _ = _harness.time_jax(
            run, (net, state), repeats=ctx.repeats, budget_s=ctx.budget(share)
        )
    rates = _coba_rates(spikes, n_exc, n_inh, batch, steps * COBA_DT)
    return {
        "model": "coba",
        "path": "per-step",
        "scale": scale,
        "n_neurons": n_exc + n_inh,
        "n_synapses": net.n_synapses,
        "batch": batch,
        "record_every": every,
        "steps": steps,
        "dt": COBA_DT,
        "duration_ms": steps * COBA_DT,
        "build_s": build_s,
        **_timing(timing),
        "run_per_trial_s": timing.run_s / batch,
        "steps_per_s": steps / timing.run_s,
        **rates,
        **_device_fields(),
    }


def sec_coba_one(ctx: Context) -> None:
    for every in (1, 10):

        def one(every=every) -> dict[str, Any]:
            rec = _coba_figure(ctx, batch=1, every=every, share=0.25)
            rec["rate_cpu_hz"] = COBA_CPU_RATE_HZ
            # Over 1 s the mean rate of a correct run lies within a few Hz of the CPU's.
            rec["rate_matches_cpu"] = abs(rec["rate_hz"] - COBA_CPU_RATE_HZ) < 4.0
            return rec

        ctx.guard(f"record_every_{every}", "neurojax", one)


def sec_coba_batch(ctx: Context) -> None:
    every = ctx.size["batch_record_every"]
    sizes = ctx.size["coba_batches"]
    for i, batch in enumerate(sizes):
        share = 0.5 / (len(sizes) - i)  # later (larger) batches get more of what is left
        ctx.guard(
            f"batch_{batch}",
            "neurojax",
            lambda batch=batch, share=share: _coba_figure(
                ctx, batch=batch, every=every, share=share
            ),
        )


def sec_coba_stdp(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        import jax
        import numpy as np

        import neurojax as nj

        from .peers.brian2_coba_stdp import STDP_PARAMS
        from .stdp_overhead import with_stdp

        steps = ctx.size["coba_steps"]
        net, state = nj.models.coba(jax.random.key(SEED))
        net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
        net = _harness.fit_spike_capacity(net, state, dt=COBA_DT, n_steps=steps)

        def run(net, state):
            final, rec = nj.simulate(net, state, dt=COBA_DT, n_steps=steps)
            return final.plastic, rec.spikes

        timing, (plastic, spikes), _ = _harness.time_jax(
            run, (net, state), repeats=ctx.repeats, budget_s=ctx.budget(0.4)
        )
        w = np.asarray(plastic[0].weights, np.float64)
        rec = {
            "model": "coba",
            "stdp": STDP_PARAMS,
            "steps": steps,
            "dt": COBA_DT,
            "n_plastic": net.projections[0].n_synapses,
            **_timing(timing),
            "steps_per_s": steps / timing.run_s,
            **_coba_rates(spikes, 3200, 800, 1, steps * COBA_DT),
            "w_ee_mean": float(w.mean()),
            "w_ee_std": float(w.std()),
            **_device_fields(),
        }
        static = ctx.results.get(("coba_one", "record_every_1"))
        if static is not None and static.get("status") == "ok":
            rec["stdp_over_static"] = timing.run_s / static["run_s"]
        return rec

    ctx.guard("stdp", "neurojax", one)


def sec_network_scale(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        from . import network_scale

        args = argparse.Namespace(
            sizes=[ctx.size["network_n"]],
            steps=ctx.size["network_steps"],
            record_every=100,
            threads=1,
            repeats=ctx.repeats,
            budget=ctx.budget(0.3),
        )
        rec = network_scale._child(args)
        for key in ("bench", "impl", "threads", "rss_gib", "peak_rss_gib", "cpu_kernel"):
            rec.pop(key, None)
        return {**rec, **_device_fields()}

    ctx.guard(f"n_{ctx.size['network_n']}", "neurojax", one)


def sec_hh(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        import jax.numpy as jnp
        import numpy as np

        import neurojax as nj

        from .peers import _hh

        n, steps = ctx.size["hh_n"], ctx.size["hh_steps"]
        model = nj.HodgkinHuxley(method="rk4")
        state = model.init_state(n)
        currents = jnp.asarray(_hh.batch_currents(n), jnp.float32)

        def run(model, state, currents):
            final, rec = nj.simulate(model, state, currents, dt=HH_DT, n_steps=steps)
            return final, rec.spikes

        timing, (_, raster), _ = _harness.time_jax(
            run, (model, state, currents), repeats=ctx.repeats, budget_s=ctx.budget(0.4)
        )
        y0 = [float(np.asarray(getattr(state, k)).reshape(-1)[0]) for k in "vmhn"]
        return {
            "method": "rk4",
            "n": n,
            "steps": steps,
            "dt": HH_DT,
            "duration_ms": steps * HH_DT,
            **_timing(timing),
            "neuron_steps_per_s": n * steps / timing.run_s,
            "n_spikes": int(np.asarray(raster).sum()),
            "y0": y0,
            **_device_fields(),
        }

    ctx.guard(f"n_{ctx.size['hh_n']}", "neurojax", one)


def sec_lif(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        import jax.numpy as jnp
        import numpy as np

        import neurojax as nj

        from .peers import _lif

        n, steps = ctx.size["lif_n"], ctx.size["lif_steps"]
        model = nj.LIF(**_lif.PARAMS)
        state = model.init_state(n)
        currents = jnp.asarray(_lif.batch_currents(n), jnp.float32)

        def run(model, state, currents):
            final, rec = nj.simulate(model, state, currents, dt=LIF_DT, n_steps=steps)
            return final, rec.spikes

        timing, (_, raster), _ = _harness.time_jax(
            run, (model, state, currents), repeats=ctx.repeats, budget_s=ctx.budget(0.4)
        )
        n_spikes = int(np.asarray(raster).sum())
        updates = n * steps / timing.run_s
        return {
            "n": n,
            "steps": steps,
            "dt": LIF_DT,
            **_timing(timing),
            "updates_per_s": updates,
            "bytes_per_s": updates * _lif.BYTES_PER_NEURON_STEP,
            "rate_hz": n_spikes / (n * steps * LIF_DT * 1e-3),
            "n_spikes": n_spikes,
            **_device_fields(),
        }

    ctx.guard(f"n_{ctx.size['lif_n']}", "neurojax", one)


def sec_assembly(ctx: Context) -> None:
    import jax
    import numpy as np

    from .assembly import _neurojax_run, _state_bytes

    n, k, steps = ctx.size["assembly_n"], ctx.size["assembly_k"], ctx.size["assembly_steps"]
    p, beta = 0.01, 0.05
    common = {"n": n, "k": k, "p": p, "beta": beta, "steps": steps}

    def one_brain() -> dict[str, Any]:
        brain, run = _neurojax_run(n, k, p, beta, steps, SEED)
        state = jax.block_until_ready(brain.init_state())
        timing, out, _ = _harness.time_jax(
            run, [state], repeats=ctx.repeats, budget_s=ctx.budget(0.25)
        )
        support = np.asarray(out[0])
        return {
            **common,
            **_timing(timing),
            "ms_per_step": timing.run_s / steps * 1e3,
            "final_support": int(support[-1]),
            "state_mb": _state_bytes(state) / 2**20,
            **_device_fields(),
        }

    def batch() -> dict[str, Any]:
        size = ctx.size["assembly_batch"]
        brain, run = _neurojax_run(n, k, p, beta, steps, SEED)
        keys = jax.random.split(jax.random.key(1), size)
        states = jax.block_until_ready(jax.vmap(brain.init_state)(keys))
        timing, out, _ = _harness.time_jax(
            jax.vmap(run), [states], repeats=ctx.repeats, budget_s=ctx.budget(0.4)
        )
        support = np.asarray(out[0])[:, -1]
        return {
            **common,
            "batch": size,
            **_timing(timing),
            "s_per_trial": timing.run_s / size,
            "ms_per_trial_step": timing.run_s / size / steps * 1e3,
            "final_support_mean": float(support.mean()),
            "state_mb": _state_bytes(states) / 2**20,
            **_device_fields(),
        }

    ctx.guard("one_brain", "neurojax", one_brain)
    ctx.guard(f"batch_{ctx.size['assembly_batch']}", "neurojax", batch)


def sec_training(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import numpy as np

        import neurojax as nj

        from .training import BATCH, matmul_flops, neurojax_layer, neurojax_loss, problem

        n, steps = ctx.size["training_n"], ctx.size["training_steps"]
        x_np, w_np = problem(n, batch=BATCH, steps=steps, seed=SEED)
        x = jnp.asarray(x_np)
        layer = neurojax_layer(w_np)
        params, static = eqx.partition(layer, nj.training.trainable(layer))

        def step(params, x):
            return jax.value_and_grad(lambda p: neurojax_loss(eqx.combine(p, static), x))(params)

        timing, (loss, grads), _ = _harness.time_jax(
            step, (params, x), repeats=ctx.repeats, budget_s=ctx.budget(0.4)
        )
        flops = matmul_flops(n, BATCH, steps)
        return {
            "n": n,
            "batch": BATCH,
            "steps": steps,
            **_timing(timing),
            "n_spikes": float(loss),
            "grad_norm": float(np.linalg.norm(np.asarray(grads.weight, np.float64))),
            "matmul_flops_per_s": flops / timing.run_s,
            **_device_fields(),
        }

    ctx.guard(f"n_{ctx.size['training_n']}", "neurojax", one)


def sec_coba_scales(ctx: Context) -> None:
    every = ctx.size["batch_record_every"]
    scales = ctx.size["coba_scales"]
    for i, scale in enumerate(scales):
        share = 0.5 / (len(scales) - i)
        ctx.guard(
            f"scale_{scale}",
            "neurojax",
            lambda scale=scale, share=share: _coba_figure(
                ctx, batch=1, every=every, scale=scale, share=share
            ),
        )


# ---- peers --------------------------------------------------------------------------


def sec_peer_brainpy(ctx: Context) -> None:
    platform = "gpu" if ctx.cuda else "cpu"
    steps = ctx.size["coba_steps"]
    for scale in ctx.size["brainpy_scales"]:

        def one(scale=scale) -> dict[str, Any]:
            spec = {
                "model": "coba",
                "seed": SEED,
                "duration_ms": steps * COBA_DT,
                "repeats": ctx.repeats,
                "budget_s": ctx.budget(0.3),
                "threads": 1,
                "scale": scale,
                "platform": platform,
            }
            res = _harness.run_peer(
                "benchmarks.peers.brainpy_coba", spec, threads=1, timeout_s=max(ctx.left(), 1.0)
            )
            if "error" in res:
                return {"status": "error", "error": res["error"], "scale": scale}
            rec = {"scale": scale, "steps": steps, "dt": COBA_DT}
            rec.update(_harness.timing_from_peer(res))
            for key in (
                "build_s",
                "backend",
                "platform",
                "device_kind",
                "n_neurons",
                "n_synapses",
                "rate_exc_hz",
                "rate_inh_hz",
                "rate_hz",
                "float_dtype",
            ):
                if key in res:
                    rec[key] = res[key]
            return rec

        ctx.guard(f"coba_scale_{scale}", "brainpy", one)


# One thread per neuron, one launch per RK4 step, state in structure-of-arrays buffers that
# are swapped between launches; the rate functions are written in the form that stays finite
# at their removable singularities (x / expm1(x)), as in benchmarks/peers/_hh.py.
CUPY_HH_SOURCE = r"""
__device__ __forceinline__ float x_over_expm1(float x) {
    return fabsf(x) < 1e-3f ? 1.0f - 0.5f * x + x * x / 12.0f : x / expm1f(x);
}

__device__ __forceinline__ void hh_rhs(
    float v, float m, float h, float n, float i_ext,
    float c_m, float g_na, float g_k, float g_l, float e_na, float e_k, float e_l,
    float *dv, float *dm, float *dh, float *dn)
{
    float am = x_over_expm1(-(v + 40.0f) / 10.0f);
    float bm = 4.0f * expf(-(v + 65.0f) / 18.0f);
    float ah = 0.07f * expf(-(v + 65.0f) / 20.0f);
    float bh = 1.0f / (1.0f + expf(-(v + 35.0f) / 10.0f));
    float an = 0.1f * x_over_expm1(-(v + 55.0f) / 10.0f);
    float bn = 0.125f * expf(-(v + 65.0f) / 80.0f);
    float m3 = m * m * m;
    float n2 = n * n;
    float i_ion = g_na * m3 * h * (v - e_na) + g_k * n2 * n2 * (v - e_k) + g_l * (v - e_l);
    *dv = (i_ext - i_ion) / c_m;
    *dm = am * (1.0f - m) - bm * m;
    *dh = ah * (1.0f - h) - bh * h;
    *dn = an * (1.0f - n) - bn * n;
}

extern "C" __global__ void hh_rk4_step(
    const float *v_in, const float *m_in, const float *h_in, const float *n_in,
    float *v_out, float *m_out, float *h_out, float *n_out,
    const float *i_ext, unsigned int *spikes, float dt, int batch,
    float c_m, float g_na, float g_k, float g_l, float e_na, float e_k, float e_l)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch) return;
    float v = v_in[i], m = m_in[i], h = h_in[i], n = n_in[i], cur = i_ext[i];
    float v1, m1, h1, n1, v2, m2, h2, n2, v3, m3, h3, n3, v4, m4, h4, n4;
    hh_rhs(v, m, h, n, cur, c_m, g_na, g_k, g_l, e_na, e_k, e_l, &v1, &m1, &h1, &n1);
    float hdt = 0.5f * dt;
    hh_rhs(v + hdt * v1, m + hdt * m1, h + hdt * h1, n + hdt * n1, cur,
           c_m, g_na, g_k, g_l, e_na, e_k, e_l, &v2, &m2, &h2, &n2);
    hh_rhs(v + hdt * v2, m + hdt * m2, h + hdt * h2, n + hdt * n2, cur,
           c_m, g_na, g_k, g_l, e_na, e_k, e_l, &v3, &m3, &h3, &n3);
    hh_rhs(v + dt * v3, m + dt * m3, h + dt * h3, n + dt * n3, cur,
           c_m, g_na, g_k, g_l, e_na, e_k, e_l, &v4, &m4, &h4, &n4);
    float sixth = dt / 6.0f;
    float v_new = v + sixth * (v1 + 2.0f * v2 + 2.0f * v3 + v4);
    v_out[i] = v_new;
    m_out[i] = m + sixth * (m1 + 2.0f * m2 + 2.0f * m3 + m4);
    h_out[i] = h + sixth * (h1 + 2.0f * h2 + 2.0f * h3 + h4);
    n_out[i] = n + sixth * (n1 + 2.0f * n2 + 2.0f * n3 + n4);
    if (v < 0.0f && v_new >= 0.0f) spikes[i] += 1u;  // upward crossing of 0 mV
}
"""


def sec_peer_cupy_hh(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        if not ctx.cuda:
            return {"status": "skipped", "reason": "skipped: no GPU"}
        import cupy as cp
        import numpy as np

        from .peers import _hh

        n, steps = ctx.size["hh_n"], ctx.size["hh_steps"]
        kernel = cp.RawKernel(CUPY_HH_SOURCE, "hh_rk4_step")
        y0 = _hh.rest_state()
        prm = _hh.PARAMS
        params = tuple(
            np.float32(prm[k]) for k in ("c_m", "g_na", "g_k", "g_l", "e_na", "e_k", "e_l")
        )
        i_ext = cp.asarray(_hh.batch_currents(n), dtype=cp.float32)
        threads = 256
        blocks = (n + threads - 1) // threads
        bufs = [cp.empty(n, cp.float32) for _ in range(8)]
        spikes = cp.zeros(n, cp.uint32)

        def run() -> int:
            for buf, value in zip(bufs[:4], y0):
                buf.fill(np.float32(value))
            spikes.fill(0)
            src, dst = bufs[:4], bufs[4:]
            for _ in range(steps):
                kernel(
                    (blocks,),
                    (threads,),
                    (*src, *dst, i_ext, spikes, np.float32(HH_DT), np.int32(n), *params),
                )
                src, dst = dst, src
            cp.cuda.Device().synchronize()
            return int(spikes.sum())

        timing, n_spikes = _harness.time_call(run, repeats=ctx.repeats, budget_s=ctx.budget(0.5))
        return {
            "method": "rk4",
            "n": n,
            "steps": steps,
            "dt": HH_DT,
            **_timing(timing),
            "neuron_steps_per_s": n * steps / timing.run_s,
            "n_spikes": n_spikes,
            "y0": list(y0),
            "threads_per_block": threads,
            "cupy": cp.__version__,
        }

    ctx.guard(f"n_{ctx.size['hh_n']}", "cupy_rawkernel", one)


def sec_peer_torch_assembly(ctx: Context) -> None:
    def one() -> dict[str, Any]:
        import torch

        if not torch.cuda.is_available() and not ctx.quick:
            raise RuntimeError("no CUDA device for PyTorch (a dense 10^5 connectome needs one)")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        n, k, steps = ctx.size["assembly_n"], ctx.size["assembly_k"], ctx.size["assembly_steps"]
        p, beta = 0.01, 0.05
        gen = torch.Generator(device=device).manual_seed(SEED)
        # Dense float16 connectomes (20 GB at n = 10^5), drawn in blocks of rows so that the
        # float32 uniforms of one block stay small; the sums below accumulate in float32.
        t0 = time.perf_counter()
        stim = (torch.rand(k, n, generator=gen, device=device) < p).to(torch.float16)
        recurrent = torch.empty(n, n, dtype=torch.float16, device=device)
        rows = max(1, 2**30 // (4 * n))
        for r in range(0, n, rows):
            block = torch.rand(min(rows, n - r), n, generator=gen, device=device)
            recurrent[r : r + rows] = (block < p).to(torch.float16)
            del block
        stim0, recurrent0 = stim.clone(), recurrent.clone()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        build_s = time.perf_counter() - t0
        grow = 1.0 + beta

        def run() -> int:
            stim.copy_(stim0)
            recurrent.copy_(recurrent0)
            support = torch.zeros(n, dtype=torch.bool, device=device)
            inputs = torch.sum(stim, dim=0, dtype=torch.float32)
            winners = torch.topk(inputs, k).indices
            stim[:, winners] *= grow
            support[winners] = True
            for _ in range(steps - 1):
                inputs = torch.sum(stim, dim=0, dtype=torch.float32) + torch.sum(
                    recurrent[winners], dim=0, dtype=torch.float32
                )
                new = torch.topk(inputs, k).indices
                stim[:, new] *= grow
                recurrent[winners.unsqueeze(1), new.unsqueeze(0)] *= grow
                support[new] = True
                winners = new
            out = int(support.sum())  # a host read: the whole run has finished
            sync()
            return out

        # The reset copies are inside the timed call; time them alone to report the step cost.
        def reset_only() -> None:
            stim.copy_(stim0)
            recurrent.copy_(recurrent0)
            sync()

        reset_timing, _ = _harness.time_call(reset_only, repeats=3, budget_s=5.0)
        timing, final_support = _harness.time_call(
            run, repeats=ctx.repeats, budget_s=ctx.budget(0.5)
        )
        loop_s = max(timing.run_s - reset_timing.run_s, 1e-9)
        return {
            "n": n,
            "k": k,
            "p": p,
            "beta": beta,
            "steps": steps,
            "dtype": "float16 weights, float32 sums",
            "device": str(device),
            "build_s": build_s,
            **_timing(timing),
            "reset_s": reset_timing.run_s,
            "loop_s": loop_s,
            "ms_per_step": loop_s / steps * 1e3,
            "final_support": final_support,
            "torch": torch.__version__,
        }

    ctx.guard("one_brain", "torch_dense", one)


def sec_peer_snntorch(ctx: Context) -> None:
    for variant in ("loop", "hoisted"):

        def one(variant=variant) -> dict[str, Any]:
            import torch

            from .peers import snn_torch
            from .training import BATCH

            cuda = torch.cuda.is_available()
            if not cuda and not ctx.quick:
                raise RuntimeError("no CUDA device for PyTorch")
            spec = {
                "impl": "snntorch",
                "variant": variant,
                "n": ctx.size["training_n"],
                "batch": BATCH,
                "steps": ctx.size["training_steps"],
                "seed": SEED,
                "threads": os.cpu_count() or 1,
                "repeats": ctx.repeats,
                "budget_s": ctx.budget(0.3),
                "device": "cuda" if cuda else "cpu",
            }
            res = snn_torch.run(spec)
            rec = {"n": spec["n"], "batch": BATCH, "steps": spec["steps"], "variant": variant}
            rec.update(_harness.timing_from_peer(res))
            for key in ("n_spikes", "grad_norm", "device", "device_peak_bytes", "versions"):
                rec[key] = res.get(key)
            return rec

        ctx.guard(variant, "snntorch", one)


def sec_gpu_check(ctx: Context) -> None:
    """Each GPU kernel's result against the CPU kernel's on the same inputs, before anything
    is timed: LIF and HH whole runs (`lif_run`, `hh_run`) and COBA (the per-step path, kept
    there with `nj.kernels.whole_networks(False)`; `network_run` checks itself),
    spike counts per neuron compared exactly. Without a GPU the same comparison runs the GPU
    slots on the CPU in Pallas interpret mode (`nj.kernels.interpret("gpu")`), which tests
    this section's logic. A mismatch is an `ok` line with `"match": false` and a line on
    stderr in capitals: the timings after it are of a kernel that disagrees."""
    import contextlib

    import jax
    import jax.numpy as jnp
    import numpy as np

    import neurojax as nj

    from .peers import _hh, _lif

    steps = ctx.size["check_steps"]
    on_gpu = ctx.cuda and jax.default_backend() == "gpu"
    cpu = jax.devices("cpu")[0]

    def gpu_side():
        return contextlib.nullcontext() if on_gpu else nj.kernels.interpret("gpu")

    def compare(name, build, fn):
        args = build()
        with jax.default_device(cpu):
            want = jax.tree.map(np.asarray, jax.jit(fn)(*jax.device_put(args, cpu)))
        with gpu_side():
            got = jax.tree.map(np.asarray, jax.jit(fn)(*args))
        counts = [(g.sum(axis=0), w.sum(axis=0)) for g, w in zip(got, want, strict=True)]
        equal = all(np.array_equal(g, w) for g, w in counts)
        total = sum(int(w.sum()) for _, w in counts)
        diff = sum(int(np.abs(g.astype(np.int64) - w).sum()) for g, w in counts)
        if not equal:
            _harness.log(f"gpu: GPU/CPU MISMATCH in {name}: {diff} of {total} spikes differ")
        return {
            "match": equal,
            "n_spikes_cpu": total,
            "spikes_differing": diff,
            "steps": steps,
            "gpu_path": "device" if on_gpu else "interpret",
            **_device_fields(),
        }

    def lif():
        n = ctx.size["check_lif_n"]
        model = nj.LIF(**_lif.PARAMS)
        currents = jnp.asarray(_lif.batch_currents(n), jnp.float32)
        return compare(
            "lif",
            lambda: (model.init_state(n), currents),
            lambda st, i: (nj.simulate(model, st, i, dt=LIF_DT, n_steps=steps)[1].spikes,),
        )

    def hh():
        n = ctx.size["check_hh_n"]
        model = nj.HodgkinHuxley(method="rk4")
        currents = jnp.asarray(_hh.batch_currents(n), jnp.float32)
        return compare(
            "hh",
            lambda: (model.init_state(n), currents),
            lambda st, i: (nj.simulate(model, st, i, dt=HH_DT, n_steps=steps)[1].spikes,),
        )

    def coba():
        net, state = nj.models.coba(jax.random.key(SEED))

        def run(st):
            spikes = nj.simulate(net, st, dt=COBA_DT, n_steps=steps)[1].spikes
            return spikes["E"], spikes["I"]

        with nj.kernels.whole_networks(False):  # the per-step delivery (network_run: its own)
            return compare("coba", lambda: (state,), run)

    for name, fn in (("lif", lif), ("hh", hh), ("coba", coba)):
        ctx.guard(name, "neurojax", fn)


def sec_coba_vmap(ctx: Context) -> None:
    """`jax.vmap` over full COBA states (keys, voltages, step counters), what a user writes
    for a sweep: the GPU batching rules fold the trials into each kernel's trial axis."""

    def one() -> dict[str, Any]:
        import jax
        import numpy as np

        import neurojax as nj

        trials = ctx.size["vmap_trials"]
        steps = ctx.size["coba_steps"]
        every = ctx.size["batch_record_every"]
        net, _ = nj.models.coba(jax.random.key(SEED))
        keys = jax.random.split(jax.random.key(SEED + 1), trials)
        states = jax.vmap(net.init_state)(keys)

        def run(net, states):
            def one_trial(st):
                return nj.simulate(net, st, dt=COBA_DT, n_steps=steps, record_every=every)[1]

            return jax.vmap(one_trial)(states).spikes

        with nj.kernels.whole_networks(False):  # the per-step path (network_run: own section)
            timing, spikes, _ = _harness.time_jax(
                run, (net, states), repeats=ctx.repeats, budget_s=ctx.budget(0.5)
            )
        n_spikes = sum(int(np.asarray(x).sum(dtype=np.int64)) for x in spikes.values())
        return {
            "path": "per-step",
            "trials": trials,
            "steps": steps,
            "dt": COBA_DT,
            **_timing(timing),
            "run_per_trial_s": timing.run_s / trials,
            "rate_hz": n_spikes / (4000 * trials * steps * COBA_DT * 1e-3),
            **_device_fields(),
        }

    ctx.guard(f"vmap_{ctx.size['vmap_trials']}", "neurojax", one)


def sec_network_run(ctx: Context) -> None:
    """The whole-network kernel (`network_run`: one Pallas Triton program per trial runs every
    step of a network that fits, `Network.fused_run`). First its result against the CPU
    kernels' on the same COBA network and state (spike counts per neuron, exactly; without a
    GPU the kernel runs interpreted, on a smaller COBA): a mismatch is `"match": false` and a
    line in capitals; the same with STDP on E->E. Then COBA 1 s as one trial (and the same
    kept on the per-step path, `nj.kernels.whole_networks(False)`), a batch of `nr_batch`
    trials, `jax.vmap` over `nr_vmap` full states, and COBA with STDP on E->E; each line says
    which path ran (`nj.kernels.explain`: `network_run`, or `per-step` and why)."""
    import contextlib

    import jax
    import numpy as np

    import neurojax as nj

    steps = ctx.size["coba_steps"]
    on_gpu = ctx.cuda and jax.default_backend() == "gpu"
    platform = "cuda" if on_gpu else "cpu"

    def check(stdp: bool = False) -> dict[str, Any]:
        n_exc, n_inh, p = ctx.size["nr_check_coba"]
        net, state = nj.models.coba(
            jax.random.key(SEED), n_exc=n_exc, n_inh=n_inh, p=p, method="event"
        )
        if stdp:
            from .peers.brian2_coba_stdp import STDP_PARAMS
            from .stdp_overhead import with_stdp

            net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
        n_check = ctx.size["check_steps"]

        def run(st):
            spikes = nj.simulate(net, st, dt=COBA_DT, n_steps=n_check)[1].spikes
            return spikes["E"], spikes["I"]

        cpu = jax.devices("cpu")[0]
        with jax.default_device(cpu):
            want = jax.tree.map(np.asarray, jax.jit(run)(jax.device_put(state, cpu)))
        side = contextlib.nullcontext() if on_gpu else nj.kernels.interpret("gpu")
        with side:
            path = nj.kernels.explain(net, state, dt=COBA_DT, n_steps=n_check)
            got = jax.tree.map(np.asarray, jax.jit(run)(state))
        equal = all(
            np.array_equal(g.sum(axis=0), w.sum(axis=0)) for g, w in zip(got, want, strict=True)
        )
        total = sum(int(w.sum()) for w in want)
        diff = sum(
            int(np.abs(g.sum(axis=0).astype(np.int64) - w.sum(axis=0)).sum())
            for g, w in zip(got, want, strict=True)
        )
        if not equal:
            _harness.log(f"gpu: GPU/CPU MISMATCH in network_run: {diff} of {total} spikes differ")
        return {
            "match": equal,
            "stdp": stdp,
            "n_neurons": n_exc + n_inh,
            "n_spikes_cpu": total,
            "spikes_differing": diff,
            "steps": n_check,
            "gpu_path": "device" if on_gpu else "interpret",
            "path": path["cuda" if on_gpu else "cpu"],
            **_device_fields(),
        }

    def timed(
        figure: str, trials: int, *, vmap: bool = False, stdp: bool = False, whole: bool = True
    ):
        def one() -> dict[str, Any]:
            every = 1 if trials == 1 and not vmap else ctx.size["batch_record_every"]
            batch = () if trials == 1 or vmap else (trials,)
            net, state = nj.models.coba(jax.random.key(SEED), batch=batch, method="event")
            if stdp:
                from .peers.brian2_coba_stdp import STDP_PARAMS
                from .stdp_overhead import with_stdp

                net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
            with nj.kernels.whole_networks(whole):
                path = nj.kernels.explain(net, state, dt=COBA_DT, n_steps=steps)[platform]
            if path.startswith("per-step"):
                net = _harness.fit_spike_capacity(net, state, dt=COBA_DT, n_steps=steps)

            def run(net, state):
                return nj.simulate(net, state, dt=COBA_DT, n_steps=steps, record_every=every)[
                    1
                ].spikes

            if vmap:
                state = jax.vmap(net.init_state)(jax.random.split(jax.random.key(SEED + 1), trials))
                single = run

                def run(net, states):  # noqa: F811  (the vmapped form of the same run)
                    return jax.vmap(lambda st: single(net, st))(states)

            with nj.kernels.whole_networks(whole):  # read while `run` is traced
                timing, spikes, _ = _harness.time_jax(
                    run, (net, state), repeats=ctx.repeats, budget_s=ctx.budget(0.3)
                )
            return {
                "model": "coba",
                "trials": trials,
                "vmap": vmap,
                "stdp": stdp,
                "steps": steps,
                "dt": COBA_DT,
                "record_every": every,
                "path": path,
                **_timing(timing),
                "run_per_trial_s": timing.run_s / trials,
                **_coba_rates(spikes, 3200, 800, trials, steps * COBA_DT),
                **_device_fields(),
            }

        ctx.guard(figure, "neurojax", one)

    ctx.guard("check", "neurojax", check)
    ctx.guard("check_stdp", "neurojax", lambda: check(stdp=True))
    timed("coba_one", 1)
    timed("coba_one_per_step", 1, whole=False)  # the same run kept on the per-step path
    timed(f"batch_{ctx.size['nr_batch']}", ctx.size["nr_batch"])
    timed(f"vmap_{ctx.size['nr_vmap']}", ctx.size["nr_vmap"], vmap=True)
    timed("coba_stdp", 1, stdp=True)


def sec_microcircuit(ctx: Context) -> None:
    """The per-step path on the cortical microcircuit (Potjans and Diesmann 2014) at the
    scales of `microcircuit_scales`: real-time factor (wall time / simulated time)."""
    steps = ctx.size["microcircuit_steps"]
    scales = ctx.size["microcircuit_scales"]
    shares = [0.5 / (len(scales) - i) for i in range(len(scales))]  # later, larger: more
    for scale, share in zip(scales, shares, strict=True):

        def one(scale=scale, share=share) -> dict[str, Any]:
            import jax
            import numpy as np

            import neurojax as nj

            t0 = time.perf_counter()
            net, state = nj.models.microcircuit(jax.random.key(SEED), scale=scale)
            jax.block_until_ready(state)
            build_s = time.perf_counter() - t0
            dt = 0.1
            net = _harness.fit_spike_capacity(net, state, dt=dt, n_steps=steps)

            def run(net, state):
                return nj.simulate(net, state, dt=dt, n_steps=steps, record_every=steps)[1]

            timing, rec, _ = _harness.time_jax(
                run, (net, state), repeats=ctx.repeats, budget_s=ctx.budget(share)
            )
            n_spikes = sum(int(np.asarray(x).sum(dtype=np.int64)) for x in rec.spikes.values())
            return {
                "scale": scale,
                "steps": steps,
                "dt": dt,
                "build_s": build_s,
                **_timing(timing),
                "real_time_factor": timing.run_s / (steps * dt * 1e-3),
                "n_spikes": n_spikes,
                **_device_fields(),
            }

        ctx.guard(f"scale_{scale}", "neurojax", one)


def sec_coba_cmdbuf(ctx: Context) -> None:
    """COBA one trial and a batch, in a child run with `CMDBUF_FLAGS` in `XLA_FLAGS` (XLA's
    WHILE and CONDITIONAL command buffers on): compare with `coba_one` and `coba_batch`."""
    rec_flags = {"xla_flags": os.environ.get("XLA_FLAGS", "")}
    ctx.guard(
        "record_every_10",
        "neurojax",
        lambda: {**_coba_figure(ctx, batch=1, every=10, share=0.4), **rec_flags},
    )
    batch = ctx.size["cmdbuf_batch"]
    ctx.guard(
        f"batch_{batch}",
        "neurojax",
        lambda: {
            **_coba_figure(ctx, batch=batch, every=ctx.size["batch_record_every"], share=0.8),
            **rec_flags,
        },
    )


def _step_cmdbuf_figures(size: dict[str, Any], repeats: int, budget_s: float) -> list[dict]:
    """The per-step path's figures under the command-buffer setting of this process: the
    microcircuit at `step_cmdbuf_scales` (real-time factor) and the network of
    `step_cmdbuf_network_n` LIF neurons of `benchmarks.network_scale`."""
    import jax
    import numpy as np

    import neurojax as nj

    from . import network_scale

    out = []
    steps, dt = size["step_cmdbuf_steps"], 0.1
    scales = size["step_cmdbuf_scales"]
    for scale in scales:
        net, state = nj.models.microcircuit(jax.random.key(SEED), scale=scale)
        net = _harness.fit_spike_capacity(net, state, dt=dt, n_steps=steps)

        def run(net, state):
            return nj.simulate(net, state, dt=dt, n_steps=steps, record_every=steps)[1]

        timing, rec, _ = _harness.time_jax(
            run, (net, state), repeats=repeats, budget_s=budget_s / (len(scales) + 1)
        )
        n_spikes = sum(int(np.asarray(x).sum(dtype=np.int64)) for x in rec.spikes.values())
        out.append(
            {
                "figure": f"microcircuit_{scale}",
                "steps": steps,
                "dt": dt,
                **_timing(timing),
                "real_time_factor": timing.run_s / (steps * dt * 1e-3),
                "n_spikes": n_spikes,
            }
        )
    args = argparse.Namespace(
        sizes=[size["step_cmdbuf_network_n"]],
        steps=size["step_cmdbuf_steps"],
        record_every=min(100, size["step_cmdbuf_steps"]),  # must divide the steps
        threads=1,
        repeats=repeats,
        budget=budget_s / (len(scales) + 1),
    )
    rec = network_scale._child(args)
    for key in ("bench", "impl", "threads", "rss_gib", "peak_rss_gib", "cpu_kernel"):
        rec.pop(key, None)
    out.append({"figure": f"network_{size['step_cmdbuf_network_n']}", **rec})
    return out


def step_cmdbuf_child(variant: str, quick: bool, repeats: int, budget_s: float) -> int:
    """A grandchild of `step_cmdbuf`: the figures under `XLA_FLAGS` (set by the parent to
    the variant's flag), one JSON line each on stdout."""
    size = QUICK if quick else FULL
    for rec in _step_cmdbuf_figures(size, repeats, budget_s):
        line = {"variant": variant, "xla_flags": os.environ.get("XLA_FLAGS", ""), **rec}
        print(json.dumps(_harness._clean({**line, **_device_fields()}), allow_nan=False))
    return 0


def sec_step_cmdbuf(ctx: Context) -> None:
    """The per-step path (microcircuit at scales 0.1 and 1, 10^6 LIF neurons) with command
    buffers off, at XLA's default, and with WHILE and CONDITIONAL on (`STEP_CMDBUF_VARIANTS`),
    each in its own process. On a GPU only: the CPU has no command buffers."""
    if not ctx.cuda:
        ctx.emit("variants", {"impl": "neurojax", "status": "skipped", "reason": "no GPU"})
        return
    for i, (variant, flag) in enumerate(STEP_CMDBUF_VARIANTS.items()):
        left = len(STEP_CMDBUF_VARIANTS) - i
        limit = ctx.left() / left
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
        code = (
            "import sys; from benchmarks.gpu import step_cmdbuf_child; "
            f"sys.exit(step_cmdbuf_child({variant!r}, {ctx.quick!r}, {ctx.repeats!r}, "
            f"{0.6 * limit!r}))"
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                env=env,
                capture_output=True,
                text=True,
                timeout=max(limit, 1.0),
            )
        except subprocess.TimeoutExpired:
            ctx.emit(variant, {"impl": "neurojax", "status": "abandoned", "xla_flags": flag})
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            error = (proc.stderr or "no output")[-2000:]
            ctx.emit(variant, {"impl": "neurojax", "status": "error", "error": error})
            continue
        for line in lines:
            rec = json.loads(line)
            ctx.emit(f"{variant}/{rec.pop('figure')}", {"impl": "neurojax", **rec})


def dry_run(size: dict[str, Any], names: list[str], quick: bool) -> list[dict[str, Any]]:
    """What a run would do, without timing anything (`--dry-run`, any machine): the sections
    and their limits, the command-buffer variants' `XLA_FLAGS`, and the proxy count of the
    kernels one step launches on a GPU (`tests/_kernel_count.py`) for COBA, COBA with STDP
    and the smallest microcircuit of the run."""
    import importlib.util

    import jax

    import neurojax as nj

    from .peers.brian2_coba_stdp import STDP_PARAMS
    from .stdp_overhead import with_stdp

    out = [
        {
            "section": name,
            "figure": "plan",
            "group": BY_NAME[name].group,
            "limit_s": BY_NAME[name].quick_limit_s if quick else BY_NAME[name].limit_s,
        }
        for name in names
    ]
    for variant, flag in STEP_CMDBUF_VARIANTS.items():
        out.append({"section": "step_cmdbuf", "figure": f"variant_{variant}", "xla_flags": flag})
    path = _harness.REPO_ROOT / "tests" / "_kernel_count.py"
    spec = importlib.util.spec_from_file_location("_kernel_count", path)
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    coba, state = nj.models.coba(jax.random.key(SEED))
    stdp, stdp_state = with_stdp(coba, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    scale = min(size["step_cmdbuf_scales"])
    micro, micro_state = nj.models.microcircuit(jax.random.key(SEED), scale=scale)
    for figure, net, st in (
        ("coba", coba, state),
        ("coba_stdp", stdp, stdp_state),
        (f"microcircuit_{scale}", micro, micro_state),
    ):
        kernels, triton, _ = counter.kernels_per_step(
            lambda s, net=net: net.step(s, None, COBA_DT), st
        )
        out.append(
            {
                "section": "kernels_per_step",
                "figure": figure,
                "kernels": kernels,
                "triton_kernels": triton,
            }
        )
    return out


SECTION_FUNCS: dict[str, Callable[[Context], None]] = {
    "machine": sec_machine,
    "gpu_check": sec_gpu_check,
    "scan_floor": sec_scan_floor,
    "coba_one": sec_coba_one,
    "coba_batch": sec_coba_batch,
    "coba_stdp": sec_coba_stdp,
    "network_scale": sec_network_scale,
    "hh": sec_hh,
    "lif": sec_lif,
    "assembly": sec_assembly,
    "training": sec_training,
    "coba_scales": sec_coba_scales,
    "coba_vmap": sec_coba_vmap,
    "network_run": sec_network_run,
    "microcircuit": sec_microcircuit,
    "coba_cmdbuf": sec_coba_cmdbuf,
    "step_cmdbuf": sec_step_cmdbuf,
    "peer_brainpy": sec_peer_brainpy,
    "peer_cupy_hh": sec_peer_cupy_hh,
    "peer_torch_assembly": sec_peer_torch_assembly,
    "peer_snntorch": sec_peer_snntorch,
}
assert set(SECTION_FUNCS) == set(BY_NAME)


def child_main(args: argparse.Namespace) -> int:
    names = args.sections.split(",")
    plan = args.plan.split(",")
    ctx = Context(args.quick, args.repeats, args.deadline, args.cuda)
    for name in names:
        ctx.section = name
        now = time.time()
        ctx.section_end = now + effective_limit(name, now, args.deadline, args.quick, plan)
        print(f"@@start {name}", flush=True)
        if name == args.stall:  # tests: a section that never ends
            time.sleep(3600)
        try:
            SECTION_FUNCS[name](ctx)
        except Exception as exc:  # a section's set-up failed: recorded, the next one runs
            _harness.log(f"gpu: section {name} failed: {exc!r}")
            ctx.emit("section", {"impl": "neurojax", "status": "error", "error": _short(exc)})
        print(f"@@end {name}", flush=True)
    return 0


# --------------------------------------------------------------------------------------
# The parent: starts children, enforces the limits, writes the JSON lines and the ratios.
# --------------------------------------------------------------------------------------


# (peer section, peer figure) -> (neurojax section, neurojax figure), for the ratio lines.
def ratio_pairs(size: dict[str, Any]) -> dict[tuple[str, str], tuple[str, str]]:
    pairs = {}
    for scale in size["brainpy_scales"]:
        target = ("coba_one", "record_every_1") if scale == 1 else ("coba_scales", f"scale_{scale}")
        pairs["peer_brainpy", f"coba_scale_{scale}"] = target
    pairs["peer_cupy_hh", f"n_{size['hh_n']}"] = ("hh", f"n_{size['hh_n']}")
    pairs["peer_torch_assembly", "one_brain"] = ("assembly", "one_brain")
    for variant in ("loop", "hoisted"):
        pairs["peer_snntorch", variant] = ("training", f"n_{size['training_n']}")
    return pairs


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results = open(self.out / "results.jsonl", "w")
        self.logfile = open(self.out / "log.txt", "w")
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.cuda = cuda_present()
        self.t_start = time.time()
        total = args.total if args.total is not None else (QUICK_TOTAL_S if args.quick else TOTAL_S)
        self.deadline = self.t_start + total
        self.pairs = ratio_pairs(QUICK if args.quick else FULL)

    def log(self, text: str) -> None:
        line = f"[{time.time() - self.t_start:6.1f} s] {text}"
        print(line, file=sys.stderr, flush=True)
        self.logfile.write(line + "\n")
        self.logfile.flush()

    def write(self, rec: dict[str, Any]) -> None:
        rec.setdefault("elapsed_s", time.time() - self.t_start)
        line = json.dumps(_harness._clean(rec), allow_nan=False)
        self.results.write(line + "\n")
        self.results.flush()
        print(line, flush=True)
        if "figure" in rec:
            self.records[rec["section"], rec["figure"]] = rec

    def status(self, name: str, status: str, **fields: Any) -> None:
        impl = "neurojax" if BY_NAME[name].group == "neurojax" else BY_NAME[name].group
        self.write({"section": name, "figure": "section", "impl": impl, "status": status, **fields})

    def ratios(self, section: str) -> None:
        for (peer_sec, peer_fig), (nj_sec, nj_fig) in self.pairs.items():
            if peer_sec != section:
                continue
            peer = self.records.get((peer_sec, peer_fig))
            mine = self.records.get((nj_sec, nj_fig))
            if not peer or not mine or peer.get("status") != "ok" or mine.get("status") != "ok":
                continue
            self.write(
                {
                    "section": "ratio",
                    "figure": f"{nj_sec}/{nj_fig} vs {peer_sec}/{peer_fig}",
                    "impl": "neurojax",
                    "status": "ok",
                    "peer": peer.get("impl"),
                    "neurojax_s": mine["run_s"],
                    "peer_s": peer["run_s"],
                    "neurojax_over_peer": mine["run_s"] / peer["run_s"],
                }
            )

    def run(self, names: list[str]) -> None:
        self.log(
            f"gpu: sections {names}, budget {self.deadline - self.t_start:.0f} s, "
            f"quick={self.args.quick}, cuda={self.cuda}"
        )
        pending = list(names)
        while pending:
            head = pending[0]
            now = time.time()
            limit = effective_limit(head, now, self.deadline, self.args.quick, names)
            if limit < STARTUP_MARGIN_S:
                self.log(f"gpu: {head} skipped: the run's budget is spent")
                self.status(head, "skipped", reason="out of time: the run's budget is spent")
                pending.pop(0)
                continue
            # The consecutive sections of the head's group share one child.
            batch = []
            for n in pending:
                if BY_NAME[n].group != BY_NAME[head].group:
                    break
                batch.append(n)
            done = self.run_child(batch, names)
            for n in batch:
                if n in done:
                    pending.remove(n)
            if head in pending:  # never started or crashed before its start: drop it
                pending.remove(head)
        total = time.time() - self.t_start
        self.write(
            {
                "section": "summary",
                "figure": "run",
                "impl": "gpu.py",
                "status": "ok",
                "total_s": total,
                "quick": self.args.quick,
                "cuda": self.cuda,
                "sections": names,
            }
        )
        self.log(f"gpu: done in {total:.1f} s; results in {self.out / 'results.jsonl'}")

    def run_child(self, batch: list[str], plan: list[str]) -> set[str]:
        """Run `batch` in one child; returns the sections finished, abandoned or failed."""
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--child",
            "--out",
            str(self.out),
            "--sections",
            ",".join(batch),
            "--plan",
            ",".join(plan),
            "--deadline",
            repr(self.deadline),
            "--repeats",
            str(self.args.repeats),
        ]
        cmd += ["--quick"] if self.args.quick else []
        cmd += ["--cuda"] if self.cuda else []
        cmd += ["--stall", self.args.stall] if self.args.stall else []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = str(_harness.REPO_ROOT)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if any(BY_NAME[name].group == "cmdbuf" for name in batch):
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + CMDBUF_FLAGS).strip()
        self.log(f"gpu: child for {batch}")
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, so that a kill takes its peers too
        )
        lines: queue.Queue[str | None] = queue.Queue()
        tail: collections.deque[str] = collections.deque(maxlen=20)

        def read_stdout() -> None:
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        def read_stderr() -> None:
            for line in proc.stderr:
                tail.append(line.rstrip("\n"))
                sys.stderr.write(line)
                self.logfile.write(line)
            self.logfile.flush()

        threads = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
        for t in threads:
            t.start()
        finished: set[str] = set()
        current = batch[0]
        started = False
        # The child's start-up (imports, device initialisation) counts against its first section.
        limit = effective_limit(current, time.time(), self.deadline, self.args.quick, plan)
        section_end = time.time() + limit
        while True:
            try:
                line = lines.get(timeout=max(section_end - time.time(), 0.0))
            except queue.Empty:
                self.log(f"gpu: {current} abandoned at its limit")
                self.kill(proc)
                self.status(
                    current,
                    "abandoned",
                    reason="past its time limit",
                    limit_s=round(limit, 1),
                )
                finished.add(current)
                break
            if line is None:  # the child exited
                proc.wait()
                if started and current not in finished:
                    self.status(
                        current,
                        "error",
                        error=f"child exited with {proc.returncode}: " + " | ".join(tail),
                    )
                    finished.add(current)
                elif not started:
                    self.status(
                        current,
                        "error",
                        error=f"child exited with {proc.returncode} before starting: "
                        + " | ".join(tail),
                    )
                    finished.add(current)
                break
            if line.startswith("@@start "):
                current = line.split(" ", 1)[1]
                if started:  # a later section: its limit counts from its own start
                    limit = effective_limit(
                        current, time.time(), self.deadline, self.args.quick, plan
                    )
                    section_end = time.time() + limit
                started = True
                self.log(f"gpu: {current} started, limit {section_end - time.time():.0f} s")
            elif line.startswith("@@end "):
                finished.add(line.split(" ", 1)[1])
                self.ratios(current)
                self.log(f"gpu: {current} done")
            elif line.startswith("{"):
                try:
                    self.write(json.loads(line))
                except json.JSONDecodeError:
                    self.log(f"gpu: unreadable line from the child: {line[:200]}")
            else:
                self.log(f"child: {line}")
        for t in threads:
            t.join(timeout=5)
        return finished

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for results.jsonl and log.txt")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument(
        "--sections", default=None, help=f"comma-separated subset of {[s.name for s in SECTIONS]}"
    )
    parser.add_argument("--total", type=float, default=None, help="budget of the whole run [s]")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (5; quick 3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", default="", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--cuda", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stall", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and the proxy kernel counts per step; time nothing",
    )
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    names = [s.name for s in SECTIONS] if args.sections is None else args.sections.split(",")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"--sections: unknown {unknown}; known: {[s.name for s in SECTIONS]}")
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child_main(args)
    if args.dry_run:
        for rec in dry_run(QUICK if args.quick else FULL, args.names, args.quick):
            print(json.dumps(rec), flush=True)
        return 0
    Runner(args).run(args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
