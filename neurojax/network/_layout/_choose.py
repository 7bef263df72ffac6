"""From a projection's `method` to its layout class."""

import inspect
from typing import Any

from ._base import Layout
from ._bcoo import BCOOLayout
from ._dense import DenseLayout
from ._event import EventLayout
from ._procedural import ProceduralLayout

__all__ = ["LAYOUTS", "DENSE_AUTO_MAX", "layout_class"]

# The layouts a projection names by string; any other `Layout` subclass is passed as itself.
LAYOUTS: dict[str, type[Layout]] = {
    "event": EventLayout,
    "dense": DenseLayout,
    "bcoo": BCOOLayout,
    "procedural": ProceduralLayout,
}
# `method="auto"` takes the dense layout up to this many (n_pre x n_post) entries.
DENSE_AUTO_MAX = 1 << 16


def _auto(n_pre: int, n_post: int, per_synapse_delays: bool, plastic: bool) -> type[Layout]:
    small = n_pre * n_post <= DENSE_AUTO_MAX
    return DenseLayout if small and not per_synapse_delays and not plastic else EventLayout


def layout_class(
    method: Any, *, n_pre: int, n_post: int, per_synapse_delays: bool, plastic: bool
) -> type[Layout]:
    """The layout class `method` stands for (`"auto"` decides from the sizes and needs)."""
    if isinstance(method, type) and issubclass(method, Layout):
        if inspect.isabstract(method):
            raise ValueError(
                f"Projection: layout={method.__name__} is an abstract layout; pass a concrete "
                "subclass that implements from_bcoo, to_bcoo, nbytes and product"
            )
        return method
    allowed = ("auto", *LAYOUTS)
    if not isinstance(method, str) or method not in allowed:
        raise ValueError(
            f"Projection: layout must be one of {allowed} or a subclass of "
            f"nj.network.Layout, got {method!r}"
        )
    if method in LAYOUTS:
        return LAYOUTS[method]
    return _auto(n_pre, n_post, per_synapse_delays, plastic)
