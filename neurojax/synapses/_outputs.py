"""How a synaptic variable becomes a current: current-based and conductance-based synapses."""

import equinox as eqx
from jaxtyping import Array, Float

from .._validation import as_float, check_finite
from ._base import SynapseOutput

__all__ = ["CurrentOutput", "ConductanceOutput"]


class CurrentOutput(SynapseOutput):
    """Current-based synapse: the synaptic variable is the current, `I = g`.

    `g` then carries the neuron's current unit (nA for `nj.LIF` and `nj.AdEx`, uA/cm^2 for
    `nj.HodgkinHuxley`, the model's own unit for `nj.Izhikevich`).
    """

    def __call__(self, g: Float[Array, "..."], v: Float[Array, "..."]) -> Float[Array, "..."]:
        return g


class ConductanceOutput(SynapseOutput):
    r"""Conductance-based synapse: $I = g (E_{rev} - v)$.

    Args:
        e_rev: reversal potential [mV] (scalar or one per postsynaptic neuron), finite.

    Units: with `g` in uS the current is in nA (uS x mV = nA), as `nj.LIF` expects with
    `r_m` in MOhm; with `g` in units of the leak conductance and `r_m = 1`, `I` is in mV, as
    in the formulation of the Brette et al. (2007) COBA benchmark.
    """

    e_rev: Float[Array, "..."] = eqx.field(default=0.0, converter=as_float)

    def __check_init__(self):
        check_finite("ConductanceOutput", "e_rev", self.e_rev)

    def __call__(self, g: Float[Array, "..."], v: Float[Array, "..."]) -> Float[Array, "..."]:
        return g * (self.e_rev - v)
