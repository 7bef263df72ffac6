"""Parallel execution: batched sweeps over parameter sets and trials, sharded over devices.

- `sweep(fn, params, *, batch_size=None, mesh=None)`: `fn` over a leading batch of
  parameter PyTrees or keys, with `vmap`, in chunks of bounded memory, and split over the
  devices of a `jax.sharding.Mesh` along the batch axis.
"""

from ._sweep import sweep as sweep
