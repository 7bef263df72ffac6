"""The `neurojax` command line.

```text
neurojax info [--json]
neurojax run MODEL [--duration MS] [--dt MS] [--batch N] [--seed S] [--plot FILE] [--json]
                   [model-specific flags]
```

`info` prints the versions of neurojax and its main dependencies, the platform, the JAX
devices, the default backend and the default floating dtype.

`run` runs a ready-made model from a registry (`RUN_MODELS`). Every model accepts the same
common flags (`--duration`, `--dt`, `--batch`, `--seed`, `--plot`, `--json`) with its own
defaults, and may add flags of its own. All flags are validated before any model is built, and
a bad value exits with code 2 and a message naming the flag, the rule and the value (the
`argparse` convention). Runtime failures (for example a non-finite membrane potential because
`--dt` is too large for the integrator) exit with code 1; success exits with 0.

With `--json`, stdout holds exactly one JSON object and nothing else; without it, a table and
a summary are printed, and a progress bar is shown on stderr when stdout is a terminal.
"""

import argparse
import importlib.metadata
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._cli_common import (  # noqa: F401  (the argument types and RunError, re-exported)
    RunError,
    _int_at_least,
    _parse_float,
    _steps,
    finite_float,
    nonnegative_int,
    positive_int,
    positive_ms,
    print_rows,
)
from ._system import env_flag

__all__ = ["main", "build_parser", "RUN_MODELS", "RunModel"]

PROG = "neurojax"


# Models whose run can be partitioned over devices by `--devices` (the networks without gap
# junctions, through `nj.parallel.shard_network`).
_SHARDABLE = ("coba", "cuba")


def _request_devices(n: int, argv: Sequence[str] | None) -> None:
    """Make `n` devices available to a CPU run of the console command.

    XLA creates its host devices when the backend starts, which importing neurojax already
    does; so when fewer than `n` exist and the command was started from the shell (`argv`
    is None), the process restarts itself once with XLA's forced host device count set.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if n <= 1 or "xla_force_host_platform_device_count" in flags or argv is not None:
        return
    if jax.device_count() >= n or jax.default_backend() != "cpu":
        return
    # In front: XLA stops reading flags after the bare `intra_op_parallelism_threads=1`
    # token that --threads 1 adds.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n} {flags}".strip()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "neurojax", *sys.argv[1:]])


def _restrict_threads(n: int) -> None:
    """Run on `n` cores (0: unchanged); before JAX's CPU backend starts its thread pools."""
    if n == 0 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cpus[-n:]))
    if n == 1 and "intra_op_parallelism_threads" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()


def _enable_cache() -> None:
    """JAX's persistent compilation cache in neurojax's cache folder: a repeated command
    loads its compiled programs instead of compiling them. A folder that cannot be written
    leaves the cache off with a warning; the run goes on."""
    from ._compilation_cache import enable_compilation_cache

    try:
        enable_compilation_cache()
    except ValueError as err:
        print(f"neurojax: compilation cache off: {err}", file=sys.stderr)


def seed_int(text: str) -> int:
    """A PRNG seed: an integer in [0, 2**32)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer in [0, 2**32), got {text!r}"
        ) from None
    if not 0 <= n < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32), got {text!r}")
    return n


# --------------------------------------------------------------------------------------------
# `neurojax info`


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def collect_info() -> dict[str, Any]:
    """Versions, platform and JAX devices as a JSON-serialisable dict."""
    import neurojax

    devices = jax.devices()
    return {
        "versions": {
            "neurojax": neurojax.__version__,
            "jax": jax.__version__,
            "jaxlib": _version("jaxlib"),
            "equinox": _version("equinox"),
            "optax": _version("optax"),
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "platform": platform.platform(),
        "machine": platform.machine(),
        "default_backend": jax.default_backend(),
        "device_count": len(devices),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "devices": [
            {"id": d.id, "platform": d.platform, "kind": d.device_kind, "str": str(d)}
            for d in devices
        ],
        # The mesh `neurojax run ... --devices N` builds, at its largest: one axis over every
        # device (neurons for a sharded network, trials for a sweep).
        "mesh": {"axis_names": ["devices"], "shape": [len(devices)]},
        # Respects JAX_ENABLE_X64 from the environment; the CLI never changes the setting.
        "default_float_dtype": str(jnp.result_type(float)),
        "x64_enabled": bool(jax.config.jax_enable_x64),
    }


def _cmd_info(args: argparse.Namespace) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info))
        return 0
    rows = [(f"{name} version", v) for name, v in info["versions"].items()]
    rows += [
        ("platform", info["platform"]),
        ("default backend", info["default_backend"]),
        ("device count", str(info["device_count"])),
        (
            "mesh (--devices)",
            f"('devices': {info['mesh']['shape'][0]}), 1 to {len(info['devices'])}",
        ),
    ]
    rows += [(f"device {d['id']}", f"{d['platform']} ({d['kind']})") for d in info["devices"]]
    rows += [
        ("process count", str(info["process_count"])),
        ("default float dtype", info["default_float_dtype"]),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if not info["x64_enabled"]:
        print("(set JAX_ENABLE_X64=1 for float64)")
    return 0


# --------------------------------------------------------------------------------------------
# `neurojax run MODEL`: a registry of ready-made models sharing the common flags.


_STEP_LIMIT = 2**31 - 1  # the int32 step clock of simulate and of a network's state


@dataclass(frozen=True)
class RunModel:
    """One entry of the `neurojax run` registry.

    Attributes:
        name: the MODEL argument.
        help: one line for `neurojax run --help`.
        description: the model's `--help` text (units, what is printed).
        duration_ms, dt_ms, batch: defaults of the common flags.
        add_arguments: adds the model's own flags to its sub-parser.
        validate: cross-flag checks; returns an error message or None. Runs before any work.
        run: `(args, progress) -> result`, a JSON-serialisable dict.
        report: prints the human-readable table and summary of a result.
        plot: `(result, path)` saves the model's figure.
    """

    name: str
    help: str
    description: str
    duration_ms: float
    dt_ms: float
    batch: int
    add_arguments: Callable[[argparse.ArgumentParser], None]
    validate: Callable[[argparse.Namespace], str | None]
    run: Callable[[argparse.Namespace, bool], dict[str, Any]]
    report: Callable[[dict[str, Any]], None]
    plot: Callable[[dict[str, Any], str], None]


def _add_common_arguments(p: argparse.ArgumentParser, model: RunModel) -> None:
    g = p.add_argument_group("common options (every model)")
    g.add_argument(
        "--duration",
        type=positive_ms,
        default=model.duration_ms,
        metavar="MS",
        help=(
            f"simulated time in ms, > 0 and a whole number of steps (default {model.duration_ms:g})"
        ),
    )
    g.add_argument(
        "--dt",
        type=positive_ms,
        default=model.dt_ms,
        metavar="MS",
        help=f"integration time step in ms, > 0 (default {model.dt_ms:g})",
    )
    g.add_argument(
        "--batch",
        type=positive_int,
        default=model.batch,
        metavar="N",
        help=f"number of independent neurons or trials, >= 1 (default {model.batch})",
    )
    g.add_argument(
        "--seed",
        type=seed_int,
        default=0,
        metavar="S",
        help="PRNG seed, an integer in [0, 2**32) (default 0)",
    )
    g.add_argument(
        "--threads",
        type=nonnegative_int,
        default=1,
        metavar="N",
        help=(
            "CPU cores to run on: N >= 1 restricts the process to N cores (1, the default, is"
            " fastest for XLA:CPU at these sizes: a step is many small operations and"
            " waking a second core costs more than it brings); 0 leaves the process as started"
        ),
    )
    g.add_argument(
        "--no-compilation-cache",
        dest="compilation_cache",
        action="store_false",
        help=(
            "do not keep compiled programs in neurojax's cache folder (by default a repeated"
            " command loads them instead of compiling; NEUROJAX_COMPILATION_CACHE=0 also turns"
            " it off)"
        ),
    )
    g.add_argument(
        "--devices",
        type=positive_int,
        default=1,
        metavar="N",
        help=(
            "spread the run over a mesh of N devices, >= 1 (default 1). Networks (coba, cuba)"
            " are partitioned along the neuron axis and exchange spikes every step; the spikes"
            " equal the one-device run. On CPU, N host devices are created (XLA's forced host"
            " device count), which measures the exchange, not a speed-up"
        ),
    )
    g.add_argument("--plot", metavar="FILE", help="save a figure to FILE (PNG, PDF or SVG)")
    g.add_argument(
        "--json",
        action="store_true",
        help="print exactly one JSON object on stdout instead of the table and summary",
    )


def _validate_common(args: argparse.Namespace) -> str | None:
    if args.devices > 1 and args.model not in _SHARDABLE:
        return (
            f"argument --devices: {args.model} runs on one device; --devices N > 1 applies to "
            f"{', '.join(_SHARDABLE)}, got --devices {args.devices}"
        )
    if args.devices > 1 and args.batch > 1:
        return (
            "argument --devices: a network is sharded along its neurons, one trial at a time;"
            f" use --batch 1 with --devices {args.devices} (got --batch {args.batch})"
        )
    if _steps(args.duration, args.dt) is None:
        return (
            "argument --duration: must be a positive whole multiple of --dt, got"
            f" --duration {args.duration:g} and --dt {args.dt:g}"
            f" ({args.duration / args.dt:g} steps)"
        )
    if _steps(args.duration, args.dt) > _STEP_LIMIT:
        return (
            f"argument --duration: at most 2**31 - 1 steps of --dt {args.dt:g} ms"
            f" ({_STEP_LIMIT * args.dt:.6g} ms), the range of the int32 step clock; got"
            f" --duration {args.duration:g} ({args.duration / args.dt:.3g} steps)"
        )
    if args.plot is not None:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            return f"argument --plot: the folder of the file must exist, got {args.plot!r}"
        from matplotlib.figure import Figure

        formats = sorted(Figure().canvas.get_supported_filetypes())
        ext = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if ext not in formats:
            return (
                f"argument --plot: the file name must end in one of .{', .'.join(formats)},"
                f" got {args.plot!r}"
            )
    return None


# ---- hh ------------------------------------------------------------------------------------

_HH_DESCRIPTION = """\
f-I curve of the classic Hodgkin-Huxley squid-axon model (Hodgkin and Huxley 1952).

A batch of N independent neurons (nj.HodgkinHuxley, classic parameters, rest near -65 mV)
receives constant currents linspace(I_MIN, I_MAX, N) switched on at t = 0 and is run with
nj.simulate, recording spikes only (upward crossings of 0 mV). For each current the table gives
the spike count over the whole run, the firing rate over the second half of the run (so that
the onset transient is excluded: the inverse of the mean interspike interval of the spikes in
that window, as an f-I curve is measured; a neuron with fewer than two spikes there gets its
count over the window), and the latency of the first spike. With the classic parameters
repetitive firing starts abruptly near 6.26 uA/cm^2 at about 52 Hz (class 2 excitability) and
reaches about 68 Hz at 10 uA/cm^2.

Units: time ms, current density uA/cm^2, rate Hz. --seed has no effect on hh (the neurons
start from rest and receive no noise); it is accepted for uniformity with the other models.
"""


def _hh_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hh options")
    g.add_argument(
        "--i-min",
        type=finite_float,
        default=0.0,
        metavar="UA_CM2",
        help="smallest injected current density in uA/cm^2 (default 0)",
    )
    g.add_argument(
        "--i-max",
        type=finite_float,
        default=20.0,
        metavar="UA_CM2",
        help="largest injected current density in uA/cm^2, >= --i-min (default 20)",
    )
    g.add_argument(
        "--method",
        choices=("rk4", "exp_euler"),
        default="rk4",
        help="integration scheme of nj.HodgkinHuxley (default rk4)",
    )


def _hh_validate(args: argparse.Namespace) -> str | None:
    if args.i_min > args.i_max:
        return (
            f"argument --i-min: must be <= --i-max, got --i-min {args.i_min:g}"
            f" and --i-max {args.i_max:g}"
        )
    return None


def _hh_run(args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    import neurojax as nj

    _check_raster(args, args.batch)  # one neuron per trial, before the resting state is solved
    model = nj.HodgkinHuxley(method=args.method)
    currents = np.linspace(args.i_min, args.i_max, args.batch)
    state = model.init_state(args.batch)
    drive = jnp.asarray(currents, state.v.dtype)
    # A constant array lets an uncoupled population take its fused run (one compiled kernel
    # for the whole run on CPU). Only when the batch equals a chunk's number of steps could
    # simulate read the array as a time series; then the input goes as a function.
    chunk, rem = _chunking(_steps(args.duration, args.dt), args.batch)
    inputs = _ConstantInput(drive) if args.batch in (chunk, rem) else drive
    sim = _timed_simulate(model, state, inputs, args, progress)
    spikes = sim["spikes"]
    n_steps = sim["n_steps"]
    # Spikes are dated at the end of their step, so step i belongs to the window when it
    # ends after the midpoint: the window is exactly the second half when n_steps is even.
    half = n_steps // 2
    window_ms = (n_steps - half) * args.dt
    counts = spikes.sum(axis=0)
    late = spikes[half:].sum(axis=0)
    # The rate of repetitive firing is the inverse of the mean interspike interval of the
    # spikes in the window, (n - 1) / (t_last - t_first): not quantised like a count over
    # the window. With fewer than two spikes there is no interval; the count over the
    # window (0 or 1 spike) stands.
    rates = []
    for j in range(spikes.shape[1]):
        steps = np.flatnonzero(spikes[half:, j])
        if steps.size >= 2:
            rates.append(1000.0 * (steps.size - 1) / ((steps[-1] - steps[0]) * args.dt))
        else:
            rates.append(float(late[j]) * 1000.0 / window_ms)
    fired = spikes.any(axis=0)
    first = np.where(fired, (spikes.argmax(axis=0) + 1) * args.dt, np.nan)
    return {
        "model": "hh",
        "model_class": "HodgkinHuxley",
        "method": args.method,
        "n_neurons": args.batch,
        "duration_ms": args.duration,
        "dt_ms": args.dt,
        "seed": args.seed,
        "currents": currents.tolist(),
        "current_unit": "uA/cm^2",
        "spike_counts": [int(c) for c in counts],
        "rates_hz": [float(r) for r in rates],
        "rate_method": "inverse mean interspike interval over the window",
        "rate_window_ms": [half * args.dt, n_steps * args.dt],
        # Rounded to 1e-9 ms to drop the float noise of (index + 1) * dt from the output.
        "first_spike_ms": [None if math.isnan(x) else round(float(x), 9) for x in first],
        **sim["summary"],
    }


def _hh_report(result: dict[str, Any]) -> None:
    print(
        f"Hodgkin-Huxley f-I curve ({result['method']}, dt {result['dt_ms']:g} ms,"
        f" {result['duration_ms']:g} ms; rate over"
        f" {result['rate_window_ms'][0]:g}-{result['rate_window_ms'][1]:g} ms)"
    )
    print(f"{'I [uA/cm^2]':>12}  {'spikes':>7}  {'rate [Hz]':>10}  {'first spike [ms]':>16}")
    for i, n, r, lat in zip(
        result["currents"],
        result["spike_counts"],
        result["rates_hz"],
        result["first_spike_ms"],
        strict=True,
    ):
        lat_s = "-" if lat is None else f"{lat:.2f}"
        print(f"{i:>12.3f}  {n:>7d}  {r:>10.1f}  {lat_s:>16}")
    print()
    _print_summary(result)


def _hh_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.0), layout="constrained")
    # Markers only: class-2 HH jumps from 0 to ~52 Hz, which a line would hide.
    ax.plot(result["currents"], result["rates_hz"], "o", ms=4)
    ax.set_xlabel(r"injected current [$\mu$A/cm$^2$]")
    ax.set_ylabel("firing rate [Hz]")
    lo, hi = result["rate_window_ms"]
    ax.set_title(
        f"Hodgkin-Huxley f-I curve ({result['method']}, dt = {result['dt_ms']:g} ms)\n"
        f"rate over {lo:g}-{hi:g} ms of a {result['duration_ms']:g} ms run",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)


RUN_MODELS: dict[str, RunModel] = {
    "hh": RunModel(
        name="hh",
        help="f-I curve of a batch of Hodgkin-Huxley neurons",
        description=_HH_DESCRIPTION,
        duration_ms=1000.0,
        dt_ms=0.01,
        batch=41,
        add_arguments=_hh_arguments,
        validate=_hh_validate,
        run=_hh_run,
        report=_hh_report,
        plot=_hh_plot,
    ),
}


def _register_networks() -> None:
    from ._cli_networks import network_models

    RUN_MODELS.update(network_models(RunModel))
    from ._cli_assembly import assembly_model

    RUN_MODELS.update(assembly_model(RunModel))


_register_networks()


class _ConstantInput(eqx.Module):
    """The same input at every step, as an `inputs` function of `nj.simulate`.

    A module rather than an array so that it is never mistaken for a time series (when
    `--batch` equals the number of steps), and rather than a lambda so that its array is a
    traced leaf and repeated calls reuse the compiled program.
    """

    value: jax.Array

    def __call__(self, t_ms: Any, step: Any) -> jax.Array:
        return self.value


def _chunking(n_steps: int, batch: int) -> tuple[int, int]:
    """`(chunk, remainder)`: the chunk length and the length of a last, shorter chunk (or 0).

    About 20 chunks, so that the progress bar moves, of 1 000 to 100 000 steps each, each
    recording at most 16 Mi spike booleans on the device. A divisor of `n_steps` close to that
    target is preferred, so that one program is compiled.
    """
    target = min(n_steps, max(1000, math.ceil(n_steps / 20)), 100_000)
    target = max(1, min(target, (16 << 20) // batch))
    for d in range(target, (target + 1) // 2 - 1, -1):
        if n_steps % d == 0:
            return d, 0
    return target, n_steps % target


def _check_raster(args: argparse.Namespace, size: int) -> None:
    """The raster of a run comes back to the host whole (one byte per neuron and step):
    refuse, before anything is built or compiled, one that cannot fit in the memory
    available (exit code 2, as for any argument that asks too much)."""
    from ._simulate import RecordingTooLarge
    from ._system import available_bytes as _available_bytes

    n_steps = _steps(args.duration, args.dt)
    need = n_steps * size
    available = _available_bytes(on_host=True)
    if available is not None and need > available:
        raise RecordingTooLarge(
            f"argument --duration: the spike raster of {n_steps} steps x {size} neurons would "
            f"take {need / 1e9:.3g} GB, more than the {available / 1e9:.3g} GB of memory "
            f"available; use a shorter --duration (at most about "
            f"{available // max(size, 1) * args.dt:.3g} ms here) or a smaller --batch"
        )


def _step_outputs(model: Any, state: Any) -> Any:
    """The abstract outputs (spikes) of one step of `model` (traced, not run)."""
    import equinox as eqx

    leaves = jax.tree_util.tree_leaves(state)
    probe = None
    if not hasattr(model, "sizes") and leaves:
        v = getattr(state, "v", leaves[0])
        probe = jax.ShapeDtypeStruct(v.shape, v.dtype)
    _, out = eqx.filter_eval_shape(lambda m, s, x: m.step(s, x, 0.1), model, state, probe)
    return out


def _timed_simulate(
    model: Any, state: Any, inputs: Any, args: argparse.Namespace, progress: bool
) -> dict[str, Any]:
    """Run `nj.simulate` recording spikes only; compile and run times from its
    `recording.info` (the one run loop measures them apart)."""
    import neurojax as nj

    n_steps = _steps(args.duration, args.dt)
    size = sum(
        int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(_step_outputs(model, state))
    )
    _check_raster(args, size)
    chunk, _ = _chunking(n_steps, args.batch)
    final, rec = nj.simulate(
        model, state, inputs, dt=args.dt, n_steps=n_steps, chunk_size=chunk, progress=progress
    )
    compile_s, run_s = rec.info.compile_s, rec.info.run_s

    bad = [
        jax.tree_util.keystr(path).lstrip(".")
        for path, x in jax.tree_util.tree_leaves_with_path(final)
        if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(np.isfinite(x).all())
    ]
    if bad:
        raise RunError(
            f"state field(s) {', '.join(bad)} became non-finite; --dt {args.dt:g} ms is probably"
            " too large for this model and integration method"
        )
    device = jax.devices()[0]
    return {
        "spikes": np.asarray(rec.spikes),
        "n_steps": n_steps,
        "summary": {
            "n_steps": n_steps,
            "chunk_size": chunk,
            "compile_s": compile_s,
            "run_s": run_s,
            "steps_per_s": n_steps / max(run_s, 1e-9),
            "neuron_steps_per_s": n_steps * args.batch / max(run_s, 1e-9),
            "backend": jax.default_backend(),
            "device": f"{device.platform} ({device.device_kind})",
            "dtype": str(jnp.result_type(float)),
        },
    }


def _print_summary(result: dict[str, Any]) -> None:
    rows = [
        ("neurons", f"{result['n_neurons']}"),
        ("steps", f"{result['n_steps']}"),
        ("device", f"{result['device']}"),
        ("dtype", f"{result['dtype']}"),
        ("compile time", f"{result['compile_s']:.2f} s"),
        ("run time", f"{result['run_s']:.2f} s"),
        ("steps/s", f"{result['steps_per_s']:.3g}"),
        ("neuron-steps/s", f"{result['neuron_steps_per_s']:.3g}"),
    ]
    print_rows(rows, result)


def _build_kernels() -> float:
    """Build (or load) the C++ CPU kernels before the model's timers start, so that a first
    run reports their one-time build as such, not as network build or XLA compile time; the
    seconds spent building (0.0 when they were cached or are not used)."""
    from .kernels import mode
    from .kernels._build import build_seconds, library

    if jax.default_backend() == "cpu" and mode() == "auto":
        library()
    return build_seconds()


def _cmd_run(args: argparse.Namespace) -> int:
    from ._simulate import RecordingTooLarge

    model = RUN_MODELS[args.model]
    progress = sys.stdout.isatty() and not args.json
    try:
        kernel_build_s = _build_kernels()
        result = model.run(args, progress)
        result["kernel_build_s"] = kernel_build_s
        if args.plot is not None:
            model.plot(result, args.plot)
            result["plot"] = args.plot
    except (RunError, OSError) as e:
        print(f"{PROG} run {model.name}: error: {e}", file=sys.stderr)
        return 1
    except RecordingTooLarge as e:  # refused before compiling: the arguments ask too much
        print(f"{PROG} run {model.name}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        # Keys starting with "_" carry arrays for the plot only.
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}))
    else:
        model.report(result)
    return 0


# --------------------------------------------------------------------------------------------


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and the `run` sub-parser of each registered model."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="neurojax: JAX-native spiking-neural-network simulation.",
        epilog="Units: time ms, voltage mV, current nA (LIF) or uA/cm^2 (Hodgkin-Huxley), rate Hz.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p_info = sub.add_parser(
        "info", help="versions, devices and default dtype", description=collect_info.__doc__
    )
    p_info.add_argument("--json", action="store_true", help="print one JSON object")
    p_info.set_defaults(handler=_cmd_info)

    p_run = sub.add_parser(
        "run",
        help="run a ready-made model",
        description="Run a ready-made model and print a table and a summary.",
        epilog="`neurojax run MODEL --help` lists the flags and units of MODEL.",
    )
    models = p_run.add_subparsers(dest="model", metavar="MODEL", required=True)
    model_parsers = {}
    for m in RUN_MODELS.values():
        p = models.add_parser(
            m.name,
            help=m.help,
            description=m.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_common_arguments(p, m)
        m.add_arguments(p)
        p.set_defaults(handler=_cmd_run)
        model_parsers[m.name] = p

    from ._cli_bench import add_bench_parser

    add_bench_parser(sub)
    return parser, model_parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `neurojax` console script; returns the exit code."""
    parser, model_parsers = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        p = model_parsers[args.model]
        for check in (_validate_common, RUN_MODELS[args.model].validate):
            msg = check(args)
            if msg is not None:
                p.error(msg)
        _restrict_threads(args.threads)
        # The command is a program of its own: it sizes the kernels' and XLA's thread pools
        # to the cores it runs on (`--threads`, else all), as a script would with
        # `nj.use_cpu_threads()`, before JAX starts its CPU client. A user's
        # NEUROJAX_CPU_THREADS (read at import) or PJRT_NPROC is kept.
        if "NEUROJAX_CPU_THREADS" not in os.environ:
            from ._jax_private import cpu_backend_started
            from ._threads import use_cpu_threads

            # main() called from a Python process that already runs JAX: the kernels only
            use_cpu_threads(args.threads or None, xla=not cpu_backend_started())
        _request_devices(args.devices, argv)
        try:
            cache = env_flag("NEUROJAX_COMPILATION_CACHE", True)
        except ValueError as err:
            p.error(str(err))
        if args.compilation_cache and cache:
            _enable_cache()
    try:
        code = args.handler(args)
        if argv is None and args.command == "run":
            # The console command: its results are printed and its files written and closed.
            # End the process here rather than tear the interpreter down (unloading JAX and
            # XLA's runtime takes 0.3-2 s that the user waits for at the prompt).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except BrokenPipeError:
        # stdout was closed early (`neurojax info | head -1`): exit quietly like POSIX tools,
        # pointing stdout at devnull so that the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
