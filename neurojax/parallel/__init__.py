"""Parallel execution: batched sweeps over parameter sets and trials, and one network
sharded over devices.

- `sweep(fn, params, *, batch_size=None, mesh=None)`: `fn` over a leading batch of
  parameter PyTrees or keys, with `vmap`, in chunks of bounded memory, and split over the
  devices of a `jax.sharding.Mesh` along the batch axis.
- `shard_network(network, mesh, *, axis=None)`: one `nj.Network` partitioned along the neuron
  axis over the devices of a mesh (`shard_map`), spikes exchanged every step by an all-gather
  of bit-packed spikes; spikes equal the single-device run bit for bit, on any device count.
- `initialize(coordinator_address, num_processes, process_id)`, `global_mesh(axis_name)` and
  `gather_to_host(tree)`: the same two on a mesh that spans several processes or hosts
  (`jax.distributed`), and reading their results back.
"""

from ._distributed import gather_to_host as gather_to_host
from ._distributed import global_mesh as global_mesh
from ._distributed import initialize as initialize
from ._shard import ShardedNetwork as ShardedNetwork
from ._shard import ShardedNetworkState as ShardedNetworkState
from ._shard import shard_network as shard_network
from ._sweep import sweep as sweep
