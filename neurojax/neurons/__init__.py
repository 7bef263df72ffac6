"""Neuron models. Each is an `equinox.Module` with `init_state` and a pure `step`."""

from ._adex import AdEx as AdEx
from ._adex import AdExState as AdExState
from ._base import NeuronModel as NeuronModel
from ._hodgkin_huxley import HHState as HHState
from ._hodgkin_huxley import HodgkinHuxley as HodgkinHuxley
from ._izhikevich import Izhikevich as Izhikevich
from ._izhikevich import IzhikevichState as IzhikevichState
from ._lif import LIF as LIF
from ._lif import LIFState as LIFState
