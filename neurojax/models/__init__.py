"""Ready-made models: the Brette et al. (2007) benchmark networks, an Izhikevich lattice and
the Potjans and Diesmann (2014) cortical microcircuit.

Each builder returns `(network, state)` ready for `nj.simulate`.
"""

from ._brette import COBA_PARAMS as COBA_PARAMS
from ._brette import CUBA_PARAMS as CUBA_PARAMS
from ._brette import coba as coba
from ._brette import cuba as cuba
from ._lattice import izhikevich_lattice as izhikevich_lattice
from ._microcircuit import MICROCIRCUIT_PARAMS as MICROCIRCUIT_PARAMS
from ._microcircuit import microcircuit as microcircuit
from ._microcircuit import microcircuit_dc as microcircuit_dc
from ._microcircuit import microcircuit_synapse_numbers as microcircuit_synapse_numbers
from ._microcircuit import microcircuit_weights as microcircuit_weights
