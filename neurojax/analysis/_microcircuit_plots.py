"""The figure of the Potjans and Diesmann (2014) microcircuit: raster and per-neuron rates.

Used by `neurojax run microcircuit --plot FILE`: on the left the spikes of all eight
populations (layer 2/3 at the top, excitatory and inhibitory alternating in colour, a
fraction of the neurons shown), on the right a box plot of the per-neuron firing rates of
each population, the two panels of the paper's Fig. 6 (and of the reference implementation's
`plot_raster` and `boxplot`).
"""

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["plot_microcircuit"]

_COLORS = ("#595289", "#af143c")  # excitatory, inhibitory (the reference's colours)


def plot_microcircuit(
    spikes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    sizes: Mapping[str, int],
    duration_ms: float,
    path: str,
    *,
    window_ms: tuple[float, float] | None = None,
    max_shown: int = 2000,
    title: str = "",
) -> None:
    """Save the raster and rate box plot of the populations to `path`.

    Args:
        spikes: population -> `(times_ms, neuron_ids)` of its spikes (ids from 0).
        sizes: population -> number of neurons, in the order drawn (top to bottom).
        duration_ms: length of the run the rates are computed over [ms].
        path: file to write (PNG, PDF or SVG).
        window_ms: time window of the raster (default the last 200 ms of the run, or all).
        max_shown: about how many neurons the raster shows in all (each population in
            proportion to its size); the box plot uses every neuron.
        title: figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: Sequence[str] = list(sizes)
    total = sum(sizes.values())
    frac = min(1.0, max_shown / total)
    if window_ms is None:
        window_ms = (max(0.0, duration_ms - 200.0), duration_ms)
    fig, (ax_r, ax_b) = plt.subplots(
        1, 2, figsize=(10.0, 5.0), width_ratios=(3, 2), layout="constrained"
    )
    top = 0
    ticks, labels = [], []
    for i, name in enumerate(names):
        t, ids = spikes[name]
        shown = max(1, round(sizes[name] * frac))
        sel = (ids < shown) & (t >= window_ms[0]) & (t < window_ms[1])
        ax_r.plot(
            t[sel], -(top + ids[sel]), ".", ms=1.5, color=_COLORS[i % 2], mew=0, rasterized=True
        )
        ticks.append(-(top + shown / 2))
        labels.append(name.replace("23", "2/3"))
        top += shown
    ax_r.set_yticks(ticks, labels)
    ax_r.set_xlim(*window_ms)
    ax_r.set_ylim(-top, 0)
    ax_r.set_xlabel("time [ms]")
    ax_r.set_title(f"{round(frac * 100, 1):g} % of the neurons", fontsize=9)
    rates = []
    for name in names:
        _, ids = spikes[name]
        counts = np.bincount(ids, minlength=sizes[name])
        rates.append(counts / (duration_ms * 1e-3))
    box = ax_b.boxplot(
        rates[::-1],
        orientation="horizontal",
        showmeans=True,
        meanline=True,
        showfliers=False,
        patch_artist=True,
        medianprops={"color": "black", "linewidth": 2},
        meanprops={"color": "lightgray", "linestyle": "--", "linewidth": 2},
    )
    for j, patch in enumerate(box["boxes"]):
        patch.set_facecolor(_COLORS[(len(names) - 1 - j) % 2])
    ax_b.set_yticks(range(1, len(names) + 1), [n.replace("23", "2/3") for n in names[::-1]])
    ax_b.set_xlabel("firing rate [spikes/s]")
    ax_b.set_title("per-neuron rates (mean dashed, median solid)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=150)
    plt.close(fig)
