"""`neurojax run coba | cuba | izhikevich-lattice | microcircuit`: the ready-made networks.

Each run builds the network (`nj.models`), compiles one program (timed apart), runs it once,
and reports neurons, synapses, mean rate per population, compile time, run time and simulated
seconds per wall-clock second. Spikes are recorded as counts per neuron in 1 ms bins (exact
rates, a raster at 1 ms resolution), so that a batch of trials fits in memory.
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["network_models"]

_NET_DESCRIPTION = """\
{title}

{body}
The run uses --batch independent trials (vmap-free batch dimension: the same connectivity,
independent initial states{inputs}). Printed: neurons, synapses, the mean firing rate of each
population over the whole run and all trials, the compile time (building the program, once),
the run time, and simulated seconds per wall-clock second. --plot FILE saves a raster of the
first trial with the distribution of per-neuron rates of each population.

Units: time ms, rate Hz.
"""

_BODIES = {
    "coba": (
        "COBA benchmark network of Brette et al. (2007)",
        "4000 conductance-based LIF neurons (3200 excitatory, 800 inhibitory), 2 % random\n"
        "connectivity, exponential conductances (5 ms / 10 ms) in units of the leak conductance\n"
        "(jumps 0.6 / 6.7), 20 mV drive, forward Euler, 5 ms refractory period. Brian2 gives\n"
        "mean rates near 22-23 Hz.\n",
    ),
    "cuba": (
        "CUBA benchmark network of Brette et al. (2007)",
        "4000 current-based LIF neurons (3200 excitatory, 800 inhibitory), 2 % random\n"
        "connectivity, exponential currents (5 ms / 10 ms) as voltage jumps of 1.62 mV / -9 mV,\n"
        "E_L = -49 mV above threshold, exact integration, 5 ms refractory period.\n",
    ),
    "izhikevich-lattice": (
        "A 2-D lattice of Izhikevich neurons with gap junctions",
        "Regular-spiking excitatory and fast-spiking inhibitory neurons (parameters drawn as in\n"
        "Izhikevich 2003) on a lattice, with local chemical synapses (radius 3 sites), gap\n"
        "junctions between neighbouring inhibitory neurons and one Poisson input train per\n"
        "neuron. Use dt = 0.5 ms (Izhikevich's half step) or less.\n",
    ),
}


def _build(name: str, args: argparse.Namespace) -> tuple[Any, Any]:
    import neurojax as nj

    key = jax.random.key(args.seed)
    batch = () if args.batch == 1 else (args.batch,)
    if name == "coba":
        return nj.models.coba(key, batch=batch)
    if name == "cuba":
        return nj.models.cuba(key, batch=batch)
    return nj.models.izhikevich_lattice(key, batch=batch, side=args.side)


def _bin_steps(dt: float) -> int:
    """Steps per 1 ms recording bin (1 when 1 ms is not a whole number of steps)."""
    n = round(1.0 / dt)
    return n if n >= 1 and abs(n * dt - 1.0) < 1e-9 else 1


def _run_network(name: str, args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    import neurojax as nj
    from neurojax._cli_common import RunError, _steps

    from .network import SpikeSource

    t0 = time.perf_counter()
    net, state = _build(name, args)
    build_s = time.perf_counter() - t0
    n_steps = _steps(args.duration, args.dt)
    every = _bin_steps(args.dt)
    if n_steps % every:
        every = 1

    # Trials run in blocks of up to 4 (the largest divisor of --batch not above 4): a block
    # stays in cache, which makes a batch ~2x cheaper per trial than one big block.
    block = max(b for b in range(1, min(4, args.batch) + 1) if args.batch % b == 0)

    if args.devices > 1:
        final, counts, info = _run_sharded(net, state, args, n_steps, every, progress)
    else:
        # neurojax's one run loop: chunks with a progress bar on a terminal, a chunk rerun
        # with a larger spike buffer when a burst did not fit, compile time apart.
        final, rec = nj.simulate(
            net,
            state,
            dt=args.dt,
            n_steps=n_steps,
            record_every=every,
            run=nj.Execution(batch_block=block if args.batch > block else None, progress=progress),
        )
        counts = {k: np.asarray(v) for k, v in rec.spikes.items()}
        info = rec.info
    compile_s, run_s = info.compile_s, info.run_s
    for pname, st in final.populations.items():
        v = getattr(st, "v", None)
        if v is not None and not bool(np.isfinite(np.asarray(v)).all()):
            raise RunError(
                f"the membrane potential of population {pname} became non-finite; --dt "
                f"{args.dt:g} ms is probably too large for this model"
            )
    seconds = n_steps * args.dt / 1000.0
    rates = {k: float(c.sum(axis=0).mean() / seconds) for k, c in counts.items()}
    sources = [k for k, m in net.populations.items() if isinstance(m, SpikeSource)]
    neurons = {k: n for k, n in net.sizes.items() if k not in sources}
    first = {k: (c if args.batch == 1 else c[:, 0]) for k, c in counts.items()}
    return {
        "model": name,
        "n_neurons": sum(neurons.values()),
        "n_synapses": net.n_synapses,
        "duration_ms": args.duration,
        "dt_ms": args.dt,
        "batch": args.batch,
        "batch_block": block,
        "seed": args.seed,
        "populations": neurons,
        "sources": {k: net.sizes[k] for k in sources},
        "rates_hz": rates,
        "build_s": build_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "n_steps": n_steps,
        "steps_per_s": n_steps / max(run_s, 1e-9),
        "sim_s_per_wall_s": seconds * args.batch / max(run_s, 1e-9),
        "devices": args.devices,
        "backend": jax.default_backend(),
        "dtype": str(np.dtype(jax.numpy.result_type(float))),
        "_raster": {k: v for k, v in first.items() if k in neurons},
        "_bin_ms": every * args.dt,
    }


def _run_sharded(net, state, args: argparse.Namespace, n_steps: int, every: int, progress: bool):
    """The run partitioned over `--devices` devices, through `nj.simulate`; returns the final
    state (in the network's own layout), the spike counts per `every` steps and the run's
    `nj.RunInfo`."""
    import neurojax as nj
    from neurojax._cli_common import RunError

    if jax.device_count() < args.devices:
        raise RunError(
            f"--devices {args.devices} needs {args.devices} devices, JAX has "
            f"{jax.device_count()} ({jax.default_backend()}); on CPU the devices are created "
            "only when the flag is given before JAX starts"
        )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[: args.devices]), ("devices",))
    sharded = nj.parallel.shard_network(net, mesh)
    final, rec = nj.simulate(
        sharded,
        sharded.shard_state(state),
        dt=args.dt,
        n_steps=n_steps,
        record_every=every,
        progress=progress,
    )
    counts = sharded.to_host(rec.spikes)
    return sharded.unshard_state(final), counts, rec.info


def _report(result: dict[str, Any]) -> None:
    print(
        f"{result['model']}: {result['n_neurons']} neurons, {result['n_synapses']} synapses, "
        f"{result['duration_ms']:g} ms at dt {result['dt_ms']:g} ms, batch {result['batch']}"
        + (f", {result['devices']} devices" if result.get("devices", 1) > 1 else "")
    )
    print(f"{'population':>12}  {'neurons':>8}  {'rate [Hz]':>10}")
    sizes = {**result["populations"], **result["sources"]}
    for k, r in result["rates_hz"].items():
        tag = " (source)" if k in result["sources"] else ""
        print(f"{k:>12}  {sizes[k]:>8d}  {r:>10.2f}{tag}")
    print()
    rows = [
        ("build time", f"{result['build_s']:.2f} s"),
        ("compile time", f"{result['compile_s']:.2f} s"),
        ("run time", f"{result['run_s']:.3f} s"),
        ("steps/s", f"{result['steps_per_s']:.3g}"),
        ("simulated s / wall s", f"{result['sim_s_per_wall_s']:.3g}"),
        ("backend", f"{result['backend']} ({result['dtype']})"),
    ]
    from neurojax._cli_common import print_rows

    print_rows(rows, result)


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raster = result["_raster"]
    bin_ms = result["_bin_ms"]
    seconds = result["duration_ms"] / 1000.0
    names = list(raster)
    colors = dict(zip(names, ["tab:red", "tab:blue", "tab:green", "tab:orange"], strict=False))
    fig = plt.figure(figsize=(9.0, 5.0), layout="constrained")
    grid = fig.add_gridspec(len(names), 2, width_ratios=(3, 1))
    ax_r = fig.add_subplot(grid[:, 0])
    # At most ~500 neurons in the raster (each population in proportion to its size), so that
    # single spikes stay visible; the histograms use every neuron.
    total = sum(raster[k].shape[1] for k in names)
    offset = 0
    for k in names:
        shown = max(1, round(raster[k].shape[1] * min(1.0, 500 / total)))
        counts = raster[k][:, :shown]
        t_idx, n_idx = np.nonzero(counts)
        ax_r.scatter(
            (t_idx + 0.5) * bin_ms, n_idx + offset, s=0.3, c=colors[k], label=k, rasterized=True
        )
        offset += counts.shape[1]
    ax_r.set_xlabel("time [ms]")
    ax_r.set_ylabel(f"neuron (first {min(total, 500)} of {total})")
    ax_r.set_xlim(0, result["duration_ms"])
    ax_r.set_ylim(0, offset)
    ax_r.legend(loc="upper right", markerscale=6, fontsize=8)
    ax_r.set_title(
        f"{result['model']}: {result['n_neurons']} neurons, {result['n_synapses']} synapses "
        f"(trial 1 of {result['batch']})",
        fontsize=10,
    )
    for i, k in enumerate(names):
        ax = fig.add_subplot(grid[i, 1])
        per_neuron = raster[k].sum(axis=0) / seconds
        ax.hist(per_neuron, bins=30, color=colors[k])
        ax.set_title(f"{k}: mean {per_neuron.mean():.1f} Hz", fontsize=9)
        ax.set_xlabel("rate [Hz]" if i == len(names) - 1 else "")
        ax.set_ylabel("neurons")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _lattice_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("izhikevich-lattice options")
    from neurojax._cli_common import positive_int

    g.add_argument(
        "--side",
        type=positive_int,
        default=40,
        metavar="N",
        help="lattice side: N*N neurons (default 40)",
    )


def _no_arguments(p: argparse.ArgumentParser) -> None:
    return None


def _lattice_validate(args: argparse.Namespace) -> str | None:
    if args.side < 2:
        return f"argument --side: must be >= 2, got {args.side}"
    return None


def network_models(run_model: Callable[..., Any]) -> dict[str, Any]:
    """The `RunModel` entries of the network models (`run_model` is the dataclass)."""
    out = {}
    for name, dt in (("coba", 0.1), ("cuba", 0.1), ("izhikevich-lattice", 0.5)):
        title, body = _BODIES[name]
        inputs = " and Poisson inputs" if name == "izhikevich-lattice" else ""
        out[name] = run_model(
            name=name,
            help=title,
            description=_NET_DESCRIPTION.format(title=title, body=body, inputs=inputs),
            duration_ms=1000.0,
            dt_ms=dt,
            batch=1,
            add_arguments=_lattice_arguments if name == "izhikevich-lattice" else _no_arguments,
            validate=_lattice_validate if name == "izhikevich-lattice" else (lambda a: None),
            run=lambda args, progress, _n=name: _run_network(_n, args, progress),
            report=_report,
            plot=_plot,
        )
    out.update(microcircuit_model(run_model))
    return out


# ------------------------------------------------------------------ microcircuit

_MICRO_DESCRIPTION = """\
Cortical microcircuit of Potjans and Diesmann (2014)

About 77 000 current-based LIF neurons (iaf_psc_exp) in the excitatory and inhibitory
populations of layers 2/3, 4, 5 and 6, ~3e8 synapses at full scale (fixed total number per
pathway, normal weights and delays), Poisson or DC background, dt = 0.1 ms; parameters of the
INM-6 reference implementation (see nj.models.microcircuit). --scale scales the neuron
numbers (in-degrees kept), --k-scale the in-degrees (weights / sqrt(k), DC compensation).

Printed: per-population mean rate and mean CV of the interspike intervals (neurons with at
least 3 spikes) over the run after --skip MS, build, compile and run times, and the real-time
factor (wall seconds per simulated second). --plot FILE saves the raster of the 8 populations
and the box plot of per-neuron rates. --batch must be 1.

Units: time ms, rate Hz.
"""


def _micro_arguments(p: argparse.ArgumentParser) -> None:
    from neurojax._cli_common import positive_ms

    g = p.add_argument_group("microcircuit options")
    g.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="S",
        help="factor on the neuron numbers, in (0, 1] (default 1)",
    )
    g.add_argument(
        "--k-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="factor on the in-degrees, in (0, 1] (default 1)",
    )
    g.add_argument(
        "--background",
        choices=("poisson", "dc"),
        default="poisson",
        help="background input (default poisson)",
    )
    g.add_argument(
        "--thalamus", action="store_true", help="thalamic pulse (902 neurons, 120 Hz, 700-710 ms)"
    )
    g.add_argument(
        "--skip",
        type=positive_ms,
        default=None,
        metavar="MS",
        help="initial transient left out of the statistics (default: 500 ms when "
        "the run is longer than 1000 ms, else none)",
    )


def _micro_validate(args: argparse.Namespace) -> str | None:
    import math

    for flag, value in (("--scale", args.scale), ("--k-scale", args.k_scale)):
        if not math.isfinite(value) or not 0.0 < value <= 1.0:
            return f"argument {flag}: must be in (0, 1], got {value:g}"
    if args.batch != 1:
        return f"argument --batch: the microcircuit runs one trial, got {args.batch}"
    if args.scale * 1065 < 0.5:
        return (
            "argument --scale: at least 1/1065 (every population keeps a neuron), got "
            f"{args.scale:g}"
        )
    if args.skip is not None and args.skip >= args.duration:
        return (
            f"argument --skip: must be below --duration ({args.duration:g} ms), got {args.skip:g}"
        )
    return None


def _micro_stats(times, ids, n, t0, t1):
    """Mean rate [Hz] in [t0, t1) and the mean CV ISI of neurons with >= 3 spikes there."""
    sel = (times >= t0) & (times < t1)
    times, ids = times[sel], ids[sel]
    rate = times.size / n / ((t1 - t0) * 1e-3)
    order = np.lexsort((times, ids))
    times, ids = times[order], ids[order]
    if ids.size == 0:
        return rate, None, 0
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], ids.size]
    cvs = []
    for s, e in zip(starts, ends, strict=True):
        if e - s >= 3:
            isi = np.diff(times[s:e])
            cvs.append(isi.std() / isi.mean())
    return rate, (float(np.mean(cvs)) if cvs else None), len(cvs)


def _run_microcircuit(args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    import neurojax as nj
    from neurojax._cli_common import RunError, _steps
    from neurojax.models._microcircuit import POPULATIONS, run_spike_ids

    n_steps = _steps(args.duration, args.dt)
    t0 = time.perf_counter()
    net, state = nj.models.microcircuit(
        jax.random.key(args.seed),
        scale=args.scale,
        k_scale=args.k_scale,
        background=args.background,
        thalamus=args.thalamus,
        dt=args.dt,
    )
    jax.block_until_ready(state)
    build_s = time.perf_counter() - t0
    final, ids, counts, compile_s, run_s = run_spike_ids(net, state, n_steps, args.dt, progress)
    v = np.concatenate([np.asarray(final.populations[p].v) for p in POPULATIONS])
    if not np.isfinite(v).all():
        raise RunError(f"the membrane potential became non-finite (--dt {args.dt:g} ms)")
    step = np.repeat(np.arange(n_steps), counts)
    gid = ids
    times = (step + 1) * args.dt  # a spike of step k is dated at the end of the step
    sizes = {p: net.sizes[p] for p in POPULATIONS}
    offsets = np.concatenate([[0], np.cumsum(list(sizes.values()))])
    skip = args.skip if args.skip is not None else (500.0 if args.duration > 1000.0 else 0.0)
    rates, cvs, spikes = {}, {}, {}
    for a, p in enumerate(POPULATIONS):
        sel = (gid >= offsets[a]) & (gid < offsets[a + 1])
        spikes[p] = (times[sel], gid[sel] - offsets[a])
        rates[p], cvs[p], _ = _micro_stats(times[sel], gid[sel], sizes[p], skip, args.duration)
    seconds = n_steps * args.dt / 1000.0
    return {
        "model": "microcircuit",
        "scale": args.scale,
        "k_scale": args.k_scale,
        "background": args.background,
        "thalamus": args.thalamus,
        "n_neurons": int(sum(sizes.values())),
        "n_synapses": net.n_synapses,
        "synapse_bytes": net.nbytes(),
        "duration_ms": args.duration,
        "dt_ms": args.dt,
        "seed": args.seed,
        "stats_window_ms": [skip, args.duration],
        "populations": sizes,
        "rates_hz": rates,
        "cv_isi": cvs,
        "build_s": build_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "n_steps": n_steps,
        "real_time_factor": run_s / seconds,
        "backend": jax.default_backend(),
        "_spikes": spikes,
    }


def _micro_report(result: dict[str, Any]) -> None:
    print(
        f"microcircuit (scale {result['scale']:g}, k_scale {result['k_scale']:g}, "
        f"{result['background']} background{', thalamus' if result['thalamus'] else ''}): "
        f"{result['n_neurons']} neurons, {result['n_synapses']} synapses, "
        f"{result['duration_ms']:g} ms at dt {result['dt_ms']:g} ms"
    )
    lo, hi = result["stats_window_ms"]
    print(f"statistics over {lo:g}-{hi:g} ms")
    print(f"{'population':>10}  {'neurons':>8}  {'rate [Hz]':>10}  {'CV ISI':>7}")
    for p, r in result["rates_hz"].items():
        cv = result["cv_isi"][p]
        cv_s = "-" if cv is None else f"{cv:.3f}"
        print(f"{p:>10}  {result['populations'][p]:>8d}  {r:>10.3f}  {cv_s:>7}")
    print()
    rows = [
        ("build time", f"{result['build_s']:.2f} s"),
        ("compile time", f"{result['compile_s']:.2f} s"),
        ("run time", f"{result['run_s']:.3f} s"),
        ("real-time factor", f"{result['real_time_factor']:.3g} (wall s per simulated s)"),
        ("synapse memory", f"{result['synapse_bytes'] / result['n_synapses']:.2f} bytes/synapse"),
        ("backend", result["backend"]),
    ]
    from neurojax._cli_common import print_rows

    print_rows(rows, result)


def _micro_plot(result: dict[str, Any], path: str) -> None:
    from neurojax.analysis._microcircuit_plots import plot_microcircuit

    plot_microcircuit(
        result["_spikes"],
        result["populations"],
        result["duration_ms"],
        path,
        title=(
            f"microcircuit, scale {result['scale']:g}, k_scale {result['k_scale']:g}, "
            f"{result['background']} background, seed {result['seed']}"
        ),
    )


def microcircuit_model(run_model: Callable[..., Any]) -> dict[str, Any]:
    """The `RunModel` entry of `neurojax run microcircuit`."""
    return {
        "microcircuit": run_model(
            name="microcircuit",
            help="cortical microcircuit of Potjans and Diesmann (2014)",
            description=_MICRO_DESCRIPTION,
            duration_ms=1000.0,
            dt_ms=0.1,
            batch=1,
            add_arguments=_micro_arguments,
            validate=_micro_validate,
            run=_run_microcircuit,
            report=_micro_report,
            plot=_micro_plot,
        )
    }
