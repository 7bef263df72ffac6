"""Storage layouts of a projection's synapses: one interface (`Layout`), one class each."""

from ._base import Delivery as Delivery
from ._base import Layout as Layout
from ._bcoo import BCOOLayout as BCOOLayout
from ._choose import DENSE_AUTO_MAX as DENSE_AUTO_MAX
from ._choose import LAYOUTS as LAYOUTS
from ._choose import layout_class as layout_class
from ._dense import DenseLayout as DenseLayout
from ._event import EventLayout as EventLayout
from ._procedural import ProceduralLayout as ProceduralLayout
