"""Summary statistics of synaptic weights."""

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import sparse

from ._base import PlasticState

__all__ = ["weight_stats"]


def _weights_of(x: Any) -> jax.Array:
    if isinstance(x, sparse.BCOO):
        return x.data
    if isinstance(x, PlasticState):
        return x.weights
    if hasattr(x, "conn") and hasattr(x, "weights"):  # a projection, read by its fields
        if x.weights is not None:
            return x.weights
        return x.conn.data
    return jnp.asarray(x)


def weight_stats(
    weights: Any, *, bins: int = 20, range: tuple[float, float] | None = None
) -> dict[str, jax.Array]:
    """Mean, standard deviation, minimum, maximum and histogram of a set of weights.

    Args:
        weights: an array of weights (any shape; a batch of trials is pooled), a BCOO
            connectivity, an `nj.Projection` (its initial weights) or the plastic state of a
            projection (`state.plastic[i]`, its current weights).
        bins: number of histogram bins (static int).
        range: `(lo, hi)` of the histogram; default the weights' own minimum and maximum.
            Give fixed bounds (e.g. the STDP rule's `(w_min, w_max)`) to compare histograms.

    Returns:
        dict with `mean`, `std`, `min`, `max` (scalars), `counts` (`bins` ints) and `edges`
        (`bins + 1` floats). Works under `jit` and `vmap`.

    Example:
    ```python
    st = nj.plasticity.weight_stats(state.plastic[0], bins=40, range=(0.0, 0.01))
    ```
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"weight_stats: bins must be a positive int, got {bins!r}")
    w = _weights_of(weights).reshape(-1)
    if w.size == 0:
        raise ValueError("weight_stats: there are no weights (no synapses)")
    lo, hi = (w.min(), w.max()) if range is None else range
    counts, edges = jnp.histogram(w, bins=bins, range=(lo, hi))
    return {
        "mean": w.mean(),
        "std": w.std(),
        "min": w.min(),
        "max": w.max(),
        "counts": counts.astype(jnp.int32),
        "edges": edges,
    }
