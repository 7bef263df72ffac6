r"""Inhibitory spike-timing-dependent plasticity of Vogels et al. (2011).

Every synapse `i -> j` (an inhibitory neuron onto an excitatory one, typically) changes its
weight at both kinds of events, with one symmetric trace per neuron, `x_i` (presynaptic
arrivals) and `x_j` (postsynaptic spikes), each decaying with `tau` and adding 1 per spike:

- a presynaptic spike **arrives**: $w \leftarrow w + \eta\,(x_j - \alpha)$;
- the postsynaptic neuron **spikes**: $w \leftarrow w + \eta\,x_i$;

with $\alpha = 2 \rho_0 \tau$. Near-coincident pre and post spikes (either order, within
about `tau`) potentiate the inhibition; every presynaptic spike alone depresses it by
`eta * alpha`. For uncorrelated Poisson trains of rates `rho_pre` and `rho_post` the mean
drift is `eta * rho_pre * (2 tau rho_post - alpha)`, zero exactly when the postsynaptic
rate is the target `rho_0`: inhibition grows while the excitatory cell fires above `rho_0`
and shrinks while it fires below, so the rule balances excitation and sets the rate.

Weights are clipped to `[w_min, w_max]` after every event (the paper keeps the conductance
non-negative: `w_min = 0`). On CPU the rule runs in the compiled trace-rule kernel
(`trace_kernel`, `neurojax/kernels/plastic_trace.cc`), elsewhere on the generic event path;
both compute the same operations.

Reference: T. P. Vogels, H. Sprekeler, F. Zenke, C. Clopath and W. Gerstner (2011),
Inhibitory plasticity balances excitation and inhibition in sensory pathways and memory
networks, Science 334(6062):1569-1573 (supplementary material: the rule and the network).
"""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._validation import as_float, check_less, check_nonnegative, check_positive
from ._base import PlasticityRule, TraceKernel, redefines

__all__ = ["VogelsSTDP"]


class VogelsSTDP(PlasticityRule):
    r"""Symmetric inhibitory STDP with a target rate (Vogels et al. 2011), as a projection's
    `plasticity` (typically inhibitory -> excitatory).

    $w \mathrel{+}= \eta (x_j - \alpha)$ at a presynaptic arrival and
    $w \mathrel{+}= \eta x_i$ at a postsynaptic spike, traces `x` with time constant `tau`
    adding 1 per spike, $\alpha = 2 \rho_0 \tau$ (the equations are in the module docstring).

    Args:
        eta: learning rate (weight units per unit of trace), >= 0.
        tau: time constant of both traces [ms], > 0 (the paper: 20 ms).
        rho0: target rate of the postsynaptic neurons [Hz], >= 0 (the paper: 3-5 Hz).
        w_min: lower weight bound (the paper: 0).
        w_max: upper weight bound (default: none, `inf`).

    `alpha` (`2 rho0 tau`, dimensionless) is a property. Numeric parameters are array leaves
    (`jax.vmap`, `jax.grad`).

    Example:
    ```python
    istdp = nj.VogelsSTDP(eta=1e-3, tau=20.0, rho0=3.0)
    proj = nj.Projection("I", "E", conn, synapse=nj.Exponential(10.0),
                         output=nj.ConductanceOutput(-80.0), plasticity=istdp)
    ```

    Reference: Vogels, T. P. et al. (2011), Science 334:1569-1573.
    """

    eta: Float[Array, ""] = eqx.field(default=1e-3, converter=as_float)
    tau: Float[Array, ""] = eqx.field(default=20.0, converter=as_float)
    rho0: Float[Array, ""] = eqx.field(default=3.0, converter=as_float)
    w_min: Float[Array, ""] = eqx.field(default=0.0, converter=as_float)
    w_max: Float[Array, ""] = eqx.field(default=float("inf"), converter=as_float)

    n_pre_traces: ClassVar[int] = 1
    n_post_traces: ClassVar[int] = 1

    def __check_init__(self):
        check_nonnegative("VogelsSTDP", "eta", self.eta)
        check_positive("VogelsSTDP", "tau", self.tau, "ms")
        check_nonnegative("VogelsSTDP", "rho0", self.rho0, "Hz")
        check_less("VogelsSTDP", "w_min", self.w_min, "w_max", self.w_max)
        for name in ("eta", "tau", "rho0", "w_min", "w_max"):
            if getattr(self, name).ndim:
                raise ValueError(
                    f"VogelsSTDP: {name} must be a scalar, got shape {getattr(self, name).shape}"
                )

    @property
    def alpha(self) -> Float[Array, ""]:
        """The depression offset `2 rho0 tau` (rho0 in Hz, tau in ms, hence the 1e-3)."""
        return 2.0 * self.rho0 * self.tau * 1e-3

    def trace_decays(self, dt: float):
        """`((e^{-dt/tau},), (e^{-dt/tau},))`."""
        d = jnp.exp(-dt / self.tau)
        return (d,), (d,)

    def update_pre_traces(self, traces, spikes):
        """`x_i` + 1 per arrival."""
        return (traces[0] + spikes,)

    def update_post_traces(self, traces, spikes):
        """`x_j` + 1 per spike."""
        return (traces[0] + spikes,)

    def on_pre(self, w, pre, post, s):
        """At an arrival: `w + eta (x_j - alpha)`, clipped."""
        return self.clip(w + self.eta * (post[0] - self.alpha) * s)

    def on_post(self, w, pre, post, s):
        """At a postsynaptic spike: `w + eta x_i`, clipped."""
        return self.clip(w + self.eta * pre[0] * s)

    def trace_kernel(self) -> TraceKernel | None:
        """This rule's parameters for the compiled trace-rule kernel (`kind="vogels"`,
        `b_pre = alpha`); None for a subclass that redefines an event or trace method (the
        generic event path then runs it)."""
        if redefines(self, VogelsSTDP, _KERNEL_METHODS):
            return None
        return TraceKernel(
            kind="vogels",
            a_pre=self.eta,
            b_pre=self.alpha,
            a_post=self.eta,
            b_post=jnp.zeros_like(self.eta),
            w_min=self.w_min,
            w_max=self.w_max,
            nearest=False,
        )


_KERNEL_METHODS = (
    "alpha",
    "clip",
    "trace_decays",
    "update_pre_traces",
    "update_post_traces",
    "on_pre",
    "on_post",
    "dense_update",
    "pair_kernel",
)
