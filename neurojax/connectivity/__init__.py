"""Sparse connectivity builders (`nj.connect`): BCOO matrices of shape (n_pre, n_post).

Rows are presynaptic neurons, columns postsynaptic neurons, `data` the weights; indices are
int32 and sorted row-major (pre, then post). See the docstring of `_builders` for the contract
shared by every builder and `_weights` for the accepted forms of `weight`.
"""

from . import _procedural as procedural  # noqa: F401  (nj.connect.procedural.fixed_prob, ...)
from ._builders import all_to_all as all_to_all
from ._builders import block as block
from ._builders import fixed_indegree as fixed_indegree
from ._builders import fixed_outdegree as fixed_outdegree
from ._builders import fixed_prob as fixed_prob
from ._builders import from_arrays as from_arrays
from ._builders import from_dense as from_dense
from ._builders import one_to_one as one_to_one
from ._fixed_total import fixed_total_number as fixed_total_number
from ._lattice import distance_connect as distance_connect
from ._lattice import from_predicate as from_predicate
from ._lattice import gaussian_connect as gaussian_connect
from ._lattice import grid_positions as grid_positions
from ._lattice import lattice as lattice
from ._lattice import random_positions as random_positions
from ._stats import stats as stats
from ._weights import Distribution as Distribution
from ._weights import LogNormal as LogNormal
from ._weights import Normal as Normal
from ._weights import Uniform as Uniform
from ._weights import lognormal as lognormal
from ._weights import normal as normal
from ._weights import uniform as uniform
