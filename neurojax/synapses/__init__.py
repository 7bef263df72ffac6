"""Synaptic kinetics, current and conductance outputs, and electrical synapses."""

from ._base import ShortTermRule as ShortTermRule
from ._base import SynapseDynamics as SynapseDynamics
from ._base import SynapseOutput as SynapseOutput
from ._gap_junction import GapJunction as GapJunction
from ._kinetics import Alpha as Alpha
from ._kinetics import AlphaState as AlphaState
from ._kinetics import Delta as Delta
from ._kinetics import DeltaState as DeltaState
from ._kinetics import DualExponential as DualExponential
from ._kinetics import DualExponentialState as DualExponentialState
from ._kinetics import Exponential as Exponential
from ._kinetics import ExponentialState as ExponentialState
from ._outputs import ConductanceOutput as ConductanceOutput
from ._outputs import CurrentOutput as CurrentOutput
from ._short_term import TsodyksMarkram as TsodyksMarkram
from ._short_term import TsodyksMarkramState as TsodyksMarkramState
