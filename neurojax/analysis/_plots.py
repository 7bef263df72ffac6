"""Matplotlib plots of recordings, rates, weights and assembly traces.

Every function draws into `ax` when given one (so that plots compose into the user's own
figures) and otherwise into a new figure from `plt.subplots()`; it returns the Axes and never
calls `plt.show()`. `matplotlib.pyplot` is imported on the first call, not when `neurojax`
is imported, so that no backend is chosen behind the user's back. The raster conventions
(time-major, `dt` and `record_every`, dicts of populations) are those of
`nj.analysis.firing_rates`.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import sparse
from jaxtyping import ArrayLike

from ._inputs import rasters
from ._stats import _Spikes, firing_rates

__all__ = [
    "raster",
    "voltage_traces",
    "rate_histogram",
    "weight_histogram",
    "fi_curve",
    "assembly_overlap",
]


def _axes(owner: str, ax: Any) -> Any:
    from matplotlib.axes import Axes

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
        return ax
    if not isinstance(ax, Axes):
        raise TypeError(f"{owner}: ax must be a matplotlib Axes or None, got {type(ax).__name__}")
    return ax


def _palette(owner: str, colors: Any, keys: list, is_dict: bool) -> dict:
    from matplotlib.colors import is_color_like

    if colors is None:
        return {k: ("k" if not is_dict else f"C{i}") for i, k in enumerate(keys)}
    if isinstance(colors, Mapping):
        if not is_dict:
            raise TypeError(
                f"{owner}: colors is a dict but spikes is a single raster; give one colour "
                "(e.g. 'k')"
            )
        missing = [k for k in keys if k not in colors]
        if missing:
            raise ValueError(
                f"{owner}: colors has no entry for population(s) {missing}; give one colour "
                f"for each of {keys}"
            )
        bad = {k: colors[k] for k in keys if not is_color_like(colors[k])}
        if bad:
            raise ValueError(f"{owner}: colors holds values that are not colours: {bad}")
        return {k: colors[k] for k in keys}
    if not is_color_like(colors):
        raise ValueError(
            f"{owner}: colors must be a matplotlib colour, a dict {{population: colour}} or "
            f"None, got {colors!r}"
        )
    return {k: colors for k in keys}


def _bins(owner: str, bins: Any) -> Any:
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        if bins < 1:
            raise ValueError(f"{owner}: bins must be a positive int or bin edges, got {bins}")
        return int(bins)
    if isinstance(bins, (str, bytes, bool)) or bins is None:
        raise TypeError(f"{owner}: bins must be a positive int or bin edges, got {bins!r}")
    edges = np.asarray(bins, np.float64)
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.diff(edges) > 0):
        raise ValueError(
            f"{owner}: bins given as edges must be 1-D, increasing, with at least 2 values, "
            f"got {bins!r}"
        )
    return edges


def _array(owner: str, name: str, x: Any, ndims: tuple[int, ...], hint: str = "") -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"{owner}: {name} is a traced value; plot outside jit/vmap/grad")
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{owner}: {name} must be a real array, got dtype {a.dtype}")
    if a.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{owner}: {name} must be {want}, got shape {a.shape}{hint}")
    return a.astype(np.float64)


def raster(
    spikes: _Spikes,
    *,
    dt: float,
    record_every: int = 1,
    ax: Any = None,
    colors: Any = None,
    marker_size: float = 2.0,
) -> Any:
    """Raster plot: one point per spike at (time [ms], neuron index).

    A spike in row `i` is drawn at `(i + 1) * dt * record_every` ms (the end of its row, as in
    `Recording.t`); a row holding a count > 1 is drawn as one point. A dict of populations is
    stacked bottom-up in its order, each population in its own colour and labelled in a
    legend.

    Args:
        spikes: raster `(t, n)` of one trial (select a trial of a batch with `spikes[:, 0]`),
            a `Recording`, or a dict `{population: (t, n) raster}`.
        dt: simulation step [ms].
        record_every: steps per raster row, as given to `simulate`.
        ax: matplotlib Axes to draw into; `None` makes a new figure.
        colors: `None` (black, or the colour cycle `C0, C1, ...` for a dict), one colour, or a
            dict `{population: colour}`.
        marker_size: marker area [points^2].

    Returns:
        The Axes, with one scatter collection per population.

    Example:
    ```python
    _, rec = nj.simulate(net, state, dt=0.1, n_steps=5000)
    ax = nj.analysis.raster(rec.spikes, dt=0.1, colors={"E": "tab:red", "I": "tab:blue"})
    ax.figure.savefig("raster.png")
    ```
    """
    owner = "raster"
    data, row_ms, is_dict = rasters(owner, spikes, dt, record_every, min_ndim=2, max_ndim=2)
    palette = _palette(owner, colors, list(data), is_dict)
    if (
        not isinstance(marker_size, (int, float))
        or isinstance(marker_size, bool)
        or not (marker_size > 0)
    ):
        raise ValueError(f"{owner}: marker_size must be a number > 0, got {marker_size!r}")
    ax = _axes(owner, ax)
    offset = 0
    for k, r in data.items():
        row, neuron = np.nonzero(r)
        ax.scatter(
            (row + 1) * row_ms,
            neuron + offset,
            s=marker_size,
            color=palette[k],
            marker=".",
            linewidths=0,
            label=None if k is None else str(k),
        )
        offset += r.shape[1]
    ax.set_xlim(0.0, max(r.shape[0] for r in data.values()) * row_ms)
    ax.set_ylim(-0.5, max(offset, 1) - 0.5)
    ax.set_xlabel("time [ms]")
    ax.set_ylabel("neuron")
    if is_dict:
        ax.legend(loc="upper right", markerscale=4.0)
    return ax


def _neuron_indices(owner: str, neurons: Any, n: int, where: str) -> list[int]:
    """`neurons` (None, an index or a sequence of indices) as indices into `n` neurons."""
    if neurons is None:
        return list(range(n))
    seq = [neurons] if isinstance(neurons, (int, np.integer)) else neurons
    try:
        idx = list(seq)
    except TypeError:
        idx = [None]
    bad = [
        i
        for i in idx
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n
    ]
    if bad or not idx:
        raise ValueError(
            f"{owner}: neurons must be None, an index or a non-empty list of indices in "
            f"[{-n}, {n}) for {where} with {n} neuron(s), got {neurons!r}"
        )
    return [int(i) % n for i in idx]


def voltage_traces(
    t: ArrayLike,
    v: ArrayLike | Mapping[Any, ArrayLike],
    *,
    neurons: int | Sequence[int] | Mapping[Any, Any] | None = None,
    ax: Any = None,
) -> Any:
    """Membrane potential of selected neurons over time, one line each.

    Args:
        t: times [ms], shape `(t,)` (`Recording.t`).
        v: membrane potentials [mV], shape `(t,)` or `(t, n)` (`Recording.v` of one trial;
            select a trial of a batch with `rec.v[:, 0]`), or the per-population dict
            `{population: (t, n) array}` that a network recording holds
            (`record={"E": ("v",)}` gives `rec.v == {"E": ...}`): every population is drawn,
            its lines labelled with its name.
        neurons: index or indices (into the last axis of `v`) to draw; `None` draws all.
            With a dict `v`, the same indices in every population, or a dict
            `{population: indices or None}` that also chooses the populations drawn.
        ax: matplotlib Axes to draw into; `None` makes a new figure.

    Returns:
        The Axes, with one line per neuron (labelled, with a legend for up to 10 lines).

    Example:
    ```python
    _, rec = nj.simulate(lif, lif.init_state(100), 20.0, dt=0.1, n_steps=1000, record=("v",))
    nj.analysis.voltage_traces(rec.t, rec.v, neurons=[0, 1, 2])
    _, rec = nj.simulate(net, state, dt=0.1, n_steps=1000, record={"E": ("v",), "I": ("v",)})
    nj.analysis.voltage_traces(rec.t, rec.v, neurons={"E": [0, 1], "I": [0]})
    ```
    """
    owner = "voltage_traces"
    t_a = _array(owner, "t", t, (1,))
    if isinstance(v, Mapping):
        if not v:
            raise ValueError(f"{owner}: v is an empty dict; give {{population: (t, n) array}}")
        if isinstance(neurons, Mapping):
            missing = [k for k in neurons if k not in v]
            if missing:
                raise ValueError(
                    f"{owner}: neurons names population(s) {missing} that v does not hold; "
                    f"v holds {list(v)}"
                )
            chosen = {k: neurons[k] for k in neurons}
        else:
            chosen = {k: neurons for k in v}
        series = {}
        for k, sel in chosen.items():
            hint = f"; select one trial of a batch, e.g. rec.v[{k!r}][:, 0]"
            series[k] = (_array(owner, f"v[{k!r}]", v[k], (1, 2), hint=hint), sel, f"{k} ")
    else:
        if isinstance(neurons, Mapping):
            raise TypeError(
                f"{owner}: neurons is a dict of populations but v is a single array; give an "
                "index or a list of indices"
            )
        hint = "; select one trial of a batch, e.g. rec.v[:, 0]"
        series = {None: (_array(owner, "v", v, (1, 2), hint=hint), neurons, "")}
    lines = []
    for k, (v_a, sel, prefix) in series.items():
        name = "v" if k is None else f"v[{k!r}]"
        if v_a.shape[0] != t_a.shape[0]:
            raise ValueError(
                f"{owner}: t and {name} must have the same number of time steps, got t of "
                f"shape {t_a.shape} and {name} of shape {v_a.shape}"
            )
        if v_a.ndim == 1:
            v_a = v_a[:, None]
        for i in _neuron_indices(owner, sel, v_a.shape[1], name):
            lines.append((v_a[:, i], f"{prefix}neuron {i}"))
    ax = _axes(owner, ax)
    for trace, lab in lines:
        ax.plot(t_a, trace, label=lab, linewidth=1.0)
    ax.set_xlabel("time [ms]")
    ax.set_ylabel("v [mV]")
    if len(lines) <= 10:
        ax.legend(loc="upper right")
    return ax


def rate_histogram(
    spikes: _Spikes,
    *,
    dt: float,
    record_every: int = 1,
    ax: Any = None,
    bins: int | ArrayLike = 20,
    colors: Any = None,
) -> Any:
    """Histogram of the neurons' mean firing rates [Hz] (`nj.analysis.firing_rates`).

    A batched raster `(t, *batch, n)` pools every trial's neurons. A dict of populations draws
    one translucent histogram per population over shared bin edges, with a legend.

    Args:
        spikes: raster `(t, *batch, n)`, a `Recording`, or a dict `{population: raster}`.
        dt: simulation step [ms].
        record_every: steps per raster row, as given to `simulate`.
        ax: matplotlib Axes to draw into; `None` makes a new figure.
        bins: the most bins to draw (positive int) or the bin edges [Hz]. A run of duration
            `T` gives rates that are multiples of `1 / T`; with an int each bin holds the
            same number of those levels, its edges halfway between two of them, so a finite
            run shows no empty bins between populated ones.
        colors: `None`, one colour, or a dict `{population: colour}`.

    Returns:
        The Axes, with one bar per bin and population.

    Example:
    ```python
    nj.analysis.rate_histogram(rec.spikes, dt=0.1, bins=30)
    ```
    """
    owner = "rate_histogram"
    bins = _bins(owner, bins)
    data, _, is_dict = rasters(owner, spikes, dt, record_every)
    palette = _palette(owner, colors, list(data), is_dict)
    rates = {k: firing_rates(r, dt=dt, record_every=record_every).ravel() for k, r in data.items()}
    if isinstance(bins, int):
        duration_ms = max(r.shape[0] for r in data.values()) * record_every * dt
        bins = _rate_edges(np.concatenate(list(rates.values())), bins, 1000.0 / duration_ms)
    ax = _axes(owner, ax)
    for k, r in rates.items():
        ax.hist(
            r,
            bins=bins,
            color=palette[k] if is_dict or colors is not None else "C0",
            alpha=0.6 if is_dict else 1.0,
            label=None if k is None else str(k),
        )
    ax.set_xlabel("rate [Hz]")
    ax.set_ylabel("neurons")
    if is_dict:
        ax.legend(loc="upper right")
    return ax


def _rate_edges(rates: np.ndarray, bins: int, quantum: float) -> np.ndarray:
    """At most `bins` bins over `rates`, each holding the same whole number of the rate
    levels a run of finite duration can produce (multiples of `quantum` = 1 / duration), the
    edges half a level off them: no bin falls between two levels and stays empty."""
    lo, hi = float(np.min(rates)), float(np.max(rates))
    first, last = round(lo / quantum), round(hi / quantum)
    per_bin = max(1, -(-(last - first + 1) // bins))
    n_bins = -(-(last - first + 1) // per_bin)
    return (first - 0.5 + per_bin * np.arange(n_bins + 1)) * quantum


def _weights(owner: str, weights: Any) -> np.ndarray:
    source = weights
    if isinstance(weights, sparse.BCOO):
        weights = weights.data
    elif hasattr(weights, "weights"):
        w = weights.weights
        if w is None and hasattr(weights, "conn"):
            w = weights.conn.data  # a dense or BCOO projection keeps no separate weight array
        weights = w
    if weights is None or isinstance(weights, (str, bytes)):
        raise TypeError(
            f"{owner}: weights must be an array, a BCOO matrix, or an object with .weights "
            f"(a Projection, an STDPState), got {source!r}"
        )
    if isinstance(weights, jax.core.Tracer):
        raise TypeError(f"{owner}: weights is a traced value; plot outside jit/vmap/grad")
    w = np.asarray(weights)
    if w.dtype.kind not in "biuf":
        raise TypeError(f"{owner}: weights must be real numbers, got dtype {w.dtype}")
    if w.size == 0:
        raise ValueError(f"{owner}: weights is empty (shape {w.shape}); nothing to plot")
    finite = np.isfinite(w)
    if not finite.all():
        raise ValueError(
            f"{owner}: weights must be finite, got {int((~finite).sum())} non-finite value(s) "
            f"of {w.size}"
        )
    return w.astype(np.float64).ravel()


def weight_histogram(
    weights: Any,
    ax: Any = None,
    *,
    bins: int | ArrayLike = 50,
    color: Any = None,
) -> Any:
    """Histogram of synaptic weights.

    Args:
        weights: a weight array of any shape (flattened; a dense `(n_pre, n_post)` matrix
            counts its zeros as weights, so give the BCOO or the projection to see only the
            synapses), a `jax.experimental.sparse.BCOO` (its `.data`, one value per
            synapse), or an object with `.weights`: an `nj.Projection` (its synapses'
            weights, whatever its method), a plastic projection's `STDPState`.
        ax: matplotlib Axes to draw into; `None` makes a new figure.
        bins: number of bins (positive int) or the bin edges.
        color: bar colour (default `C0`).

    Returns:
        The Axes, with one bar per bin.

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 100, 100, p=0.1, weight=0.5)
    nj.analysis.weight_histogram(conn)
    nj.analysis.weight_histogram(final_state.plastic[0])   # the first projection, after STDP
    ```
    """
    owner = "weight_histogram"
    bins = _bins(owner, bins)
    w = _weights(owner, weights)
    if color is None:
        color = "C0"
    else:
        from matplotlib.colors import is_color_like

        if not is_color_like(color):
            raise ValueError(f"{owner}: color must be a matplotlib colour or None, got {color!r}")
    ax = _axes(owner, ax)
    ax.hist(w, bins=bins, color=color)
    ax.set_xlabel("weight")
    ax.set_ylabel("synapses")
    return ax


def fi_curve(
    currents: ArrayLike,
    rates: ArrayLike,
    ax: Any = None,
    *,
    labels: Sequence[str] | None = None,
) -> Any:
    """Firing rate against input current (f-I curve), one line per curve.

    Args:
        currents: input currents, shape `(k,)`, in the model's input units (mV for a LIF with
            `r_m * I`, uA/cm^2 for Hodgkin-Huxley).
        rates: firing rates [Hz], shape `(k,)` or `(k, m)` for `m` curves (e.g. from
            `nj.analysis.firing_rates` of a batch driven by `currents`).
        ax: matplotlib Axes to draw into; `None` makes a new figure.
        labels: `m` names for the curves (shown in a legend).

    Returns:
        The Axes, with one line (with markers) per curve.

    Example:
    ```python
    currents = np.linspace(0.0, 40.0, 41)
    _, rec = nj.simulate(lif, lif.init_state(41), jnp.asarray(currents), dt=0.1, n_steps=5000)
    nj.analysis.fi_curve(currents, nj.analysis.firing_rates(rec.spikes, dt=0.1))
    ```
    """
    owner = "fi_curve"
    i_a = _array(owner, "currents", currents, (1,))
    r_a = _array(owner, "rates", rates, (1, 2))
    if r_a.ndim == 1:
        r_a = r_a[:, None]
    if r_a.shape[0] != i_a.shape[0]:
        raise ValueError(
            f"{owner}: rates must have one row per current: currents of shape {i_a.shape}, "
            f"rates of shape {np.shape(rates)}"
        )
    m = r_a.shape[1]
    if labels is not None:
        labels = [labels] if isinstance(labels, str) else list(labels)
        if len(labels) != m:
            raise ValueError(
                f"{owner}: labels must name each of the {m} curve(s), got {len(labels)} label(s)"
            )
    ax = _axes(owner, ax)
    for j in range(m):
        ax.plot(
            i_a, r_a[:, j], marker="o", markersize=3, label=None if labels is None else labels[j]
        )
    ax.set_xlabel("input current")
    ax.set_ylabel("rate [Hz]")
    if labels is not None:
        ax.legend()
    return ax


_TRACE_FIELDS = (
    ("overlap", "overlap with previous step"),
    ("support", "support (ever fired)"),
    ("new_winners", "new winners"),
)


def _trace_field(owner: str, trace: Any, field: str, area: Any) -> Any:
    value = getattr(trace, field)
    if not isinstance(value, Mapping):
        return value
    if area is None:
        if len(value) != 1:
            raise ValueError(
                f"{owner}: the trace records areas {sorted(value)}; choose one with area=..."
            )
        return next(iter(value.values()))
    if area not in value:
        raise ValueError(
            f"{owner}: area {area!r} is not in the trace, which records areas {sorted(value)}"
        )
    return value[area]


def assembly_overlap(
    overlaps: Any,
    ax: Any = None,
    *,
    area: str | None = None,
    k: int | None = None,
) -> Any:
    """Convergence of an assembly: overlap of consecutive winner sets against the step.

    Args:
        overlaps: an `nj.assembly.ProjectionTrace` (draws its `overlap`, `support` and
            `new_winners` of one area), a 1-D array of overlaps per step, a `(steps, m)` array
            (`m` lines), or a dict `{label: 1-D array}` (one line each). Values are numbers
            of neurons.
        ax: matplotlib Axes to draw into; `None` makes a new figure.
        area: the area of a trace to draw (needed when the trace records several).
        k: the cap size; draws a dashed line at `k`, the overlap of a converged assembly.

    Returns:
        The Axes, with one line per series (plus one for `k`).

    Example:
    ```python
    state, trace = brain.project_rounds(state, stimuli={"s": ["A"]}, areas={"A": ["A"]},
                                        steps=20)
    nj.analysis.assembly_overlap(trace, area="A", k=317)
    ```
    """
    owner = "assembly_overlap"
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise ValueError(f"{owner}: k must be None or a positive int, got {k!r}")
    if area is not None and not all(hasattr(overlaps, f) for f, _ in _TRACE_FIELDS):
        raise ValueError(f"{owner}: area={area!r} applies only to a ProjectionTrace")
    series: dict[str, np.ndarray] = {}
    if all(hasattr(overlaps, f) for f, _ in _TRACE_FIELDS):
        for field, name in _TRACE_FIELDS:
            series[name] = _array(
                owner, f"trace.{field}", _trace_field(owner, overlaps, field, area), (1,)
            )
    elif isinstance(overlaps, Mapping):
        if not overlaps:
            raise ValueError(f"{owner}: overlaps is an empty dict; nothing to plot")
        for name, value in overlaps.items():
            series[str(name)] = _array(owner, f"overlaps[{name!r}]", value, (1,))
    else:
        a = _array(owner, "overlaps", overlaps, (1, 2))
        if a.ndim == 1:
            series["overlap"] = a
        else:
            for j in range(a.shape[1]):
                series[f"overlap {j}"] = a[:, j]
    ax = _axes(owner, ax)
    for name, values in series.items():
        ax.plot(np.arange(1, values.shape[0] + 1), values, marker="o", markersize=3, label=name)
    if k is not None:
        ax.axhline(int(k), color="0.5", linestyle="--", linewidth=1.0, label=f"k = {int(k)}")
    ax.set_xlabel("step")
    ax.set_ylabel("neurons")
    if len(series) > 1 or k is not None:
        ax.legend()
    return ax
