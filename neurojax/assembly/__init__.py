"""Assembly calculus: brain areas with a k-cap, random synapses, Hebbian plasticity and a
differentiable k-cap (Papadimitriou et al. 2020)."""

from ._brain import Brain as Brain
from ._brain import BrainState as BrainState
from ._brain import ProjectionTrace as ProjectionTrace
from ._brain import overlap as overlap
from ._operations import associate as associate
from ._operations import convergence_step as convergence_step
from ._operations import merge as merge
from ._operations import pattern_complete as pattern_complete
from ._operations import project_until_stable as project_until_stable
from ._operations import reciprocal_project as reciprocal_project
from ._soft import LOSS_KINDS as LOSS_KINDS
from ._soft import assembly_loss as assembly_loss
from ._soft import kcap as kcap
from ._soft import kcap_st as kcap_st
from ._soft import soft_kcap as soft_kcap
from ._soft import soft_overlap as soft_overlap
from ._synapses import FanOut as FanOut
