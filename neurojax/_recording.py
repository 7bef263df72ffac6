"""How `simulate` stores recorded spikes, shared by the driver and the models' fused runs."""

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu

__all__ = ["count_dtype", "most_spikes", "recorded_spikes"]


def count_dtype(record_every: int):
    """The integer dtype of spike counts over windows of `record_every` steps: `uint8` while a
    window cannot hold more than 255 spikes of one neuron, else `int32`."""
    return jnp.uint8 if record_every <= 255 else jnp.int32


def _most(model: Any) -> int:
    most = getattr(model, "max_spikes_per_step", 1)
    return most if isinstance(most, int) and most > 1 else 1


def most_spikes(model: Any, out: Any) -> Any:
    """Per leaf of a step's outputs `out`, the most spikes one neuron emits in one step: the
    `max_spikes_per_step` of the model that emits it (1 where the model does not say, as
    neuron models and 0/1 spike sources). A network (an object with `groups` and
    `group_models`, as `nj.Network`) emits `{population: spikes}`, each population's limit
    from its group's model."""
    groups, models = getattr(model, "groups", None), getattr(model, "group_models", None)
    if isinstance(out, Mapping) and groups is not None and models is not None:
        by_name = {n: _most(m) for names, m in zip(groups, models) for n in names}
        return {k: _fill(v, by_name.get(k, 1)) for k, v in out.items()}
    return _fill(out, _most(model))


def _fill(tree: Any, value: int) -> Any:
    return jtu.tree_map(lambda _: value, tree)


def recorded_spikes(out: Any, most: Any) -> Any:
    """A step's outputs as `simulate` records them (`nj.Record(spikes="raster")`): booleans where at
    most one spike per step is possible, and the counts themselves (`count_dtype(most)`)
    where a source emits several (`most` from `most_spikes`), so that none is lost."""

    def one(o, k):
        if k > 1:
            return o.astype(count_dtype(k))
        return o > 0 if jnp.issubdtype(o.dtype, jnp.floating) else o.astype(bool)

    return jtu.tree_map(one, out, most)
