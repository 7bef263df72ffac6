"""Networks: projections between populations, event-driven propagation, delays, spike sources.

- `Projection`: synapses from one population onto another (kinetics, output, delays), stored
  in a compressed-row layout and propagated event by event (or densely for small networks).
- `Network`: populations, projections, inputs and gap junctions stepped as one pure function.
- `PoissonSource`: independent Poisson spike trains, usable as a population.
"""

from ._network import Network as Network
from ._network import NetworkState as NetworkState
from ._projection import Projection as Projection
from ._sources import PoissonSource as PoissonSource
from ._sources import PoissonState as PoissonState
