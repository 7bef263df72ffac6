"""Networks: projections between populations, event-driven propagation, delays, spike sources.

- `Projection`: synapses from one population onto another (kinetics, output, delays), stored
  in a `Layout` chosen at construction: `EventLayout` (compressed rows, propagated event by
  event), `DenseLayout` (a matrix product, for small networks) or `BCOOLayout` (a reference).
- `Network`: populations, projections, inputs and gap junctions stepped as one pure function.
- `SpikeSource`: the interface of populations that emit spikes without an input;
  `PoissonSource` draws independent Poisson spike trains.
"""

from ._layout import BCOOLayout as BCOOLayout
from ._layout import DenseLayout as DenseLayout
from ._layout import EventLayout as EventLayout
from ._layout import Layout as Layout
from ._layout import ProceduralLayout as ProceduralLayout
from ._memory import MemoryPlanError as MemoryPlanError
from ._memory import MemoryReport as MemoryReport
from ._memory import ProjectionPlan as ProjectionPlan
from ._memory import available_memory as available_memory
from ._memory import plan_memory as plan_memory
from ._network import Network as Network
from ._network import NetworkState as NetworkState
from ._network import SpikeCapacityError as SpikeCapacityError
from ._network import default_capacity as default_capacity
from ._projection import Projection as Projection
from ._sources import PoissonSource as PoissonSource
from ._sources import PoissonState as PoissonState
from ._sources import SpikeSource as SpikeSource
