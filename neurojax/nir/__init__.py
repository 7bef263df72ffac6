"""Exchange of networks with other tools through NIR, the Neuromorphic Intermediate
Representation (<https://neuroir.org>).

- `to_nir(model, path=None, *, time_scale=None)`: neurojax layers (`SpikingDense`,
  `SpikingRecurrent`, `LeakyReadout`, convolutional and pooling layers, `Sequential`) or an
  imported `NIRNetwork` as a `nir.NIRGraph`, time constants in seconds by default (the
  unit other NIR tools assume, stated in `graph.metadata["time_unit"]`).
- `from_nir(graph, *, dt, method="exact")`: a NIR graph (or `.nir` file) as a `NIRNetwork`,
  a steppable neurojax model that works under `jit`, `vmap` and `grad`; `dt` is in the
  graph's time unit (seconds for graphs of snnTorch, Norse and `to_nir`), and a `dt` orders
  of magnitude away from the graph's time constants is warned about.

The `nir` package is optional (`pip install 'neurojax[nir]'`) and imported only when one of
these functions is called.
"""

from ._export import to_nir as to_nir
from ._graph import NIRNetwork as NIRNetwork
from ._graph import NIRState as NIRState
from ._graph import from_nir as from_nir
from ._nodes import NodeState as NodeState
