"""Neuron models. Each is an `equinox.Module` with `init_state` and a pure `step`."""

from ._base import NeuronModel as NeuronModel
from ._lif import LIF as LIF
from ._lif import LIFState as LIFState
