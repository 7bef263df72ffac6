"""Ready-made models: the Brette et al. (2007) benchmark networks and an Izhikevich lattice.

Each builder returns `(network, state)` ready for `nj.simulate`.
"""

from ._brette import COBA_PARAMS as COBA_PARAMS
from ._brette import CUBA_PARAMS as CUBA_PARAMS
from ._brette import coba as coba
from ._brette import cuba as cuba
from ._lattice import izhikevich_lattice as izhikevich_lattice
