"""Neuron models. Each is an `equinox.Module` with `init_state` and a pure `step`.

`NeuronModel` is the base of every model; `check_state_fields` checks that a model's state
has the fields a network reads, and `input_current`, `refractory_clamped` and
`refractory_next` are the pieces of `step` that the built-in models share (parameter
conversion and checks are in `neurojax.validation`).
"""

from ._adex import AdEx as AdEx
from ._adex import AdExState as AdExState
from ._base import NeuronModel as NeuronModel
from ._base import check_state_fields as check_state_fields
from ._base import input_current as input_current
from ._base import refractory_clamped as refractory_clamped
from ._base import refractory_next as refractory_next
from ._hodgkin_huxley import HHState as HHState
from ._hodgkin_huxley import HodgkinHuxley as HodgkinHuxley
from ._izhikevich import Izhikevich as Izhikevich
from ._izhikevich import IzhikevichState as IzhikevichState
from ._lif import LIF as LIF
from ._lif import LIFState as LIFState
