r"""Reward-modulated STDP with eligibility traces (Izhikevich 2007).

Every synapse `i -> j` carries an eligibility trace `c` that pair STDP writes to, instead of
the weight, and a neuromodulator concentration `d(t)` (dopamine: an input of the network,
one value per trial) that turns eligibility into weight change:

$$\frac{dc}{dt} = -\frac{c}{\tau_c} + \mathrm{STDP}(\tau)\,\delta(t - t_{pre/post}),\qquad
  \frac{dw}{dt} = c\,d(t).$$

`STDP(tau)` is the pair window of `nj.STDP` with traces `x` (presynaptic arrivals, `tau_plus`)
and `y` (postsynaptic spikes, `tau_minus`): an arrival adds `-a_minus * y_j` to `c`, a
postsynaptic spike adds `+a_plus * x_i` (traces add 1 per spike, or are set to 1 with
`pairing="nearest"`). A pre-post pairing therefore leaves a decaying "tag" on the synapse,
and a reward that comes seconds later (within a few `tau_c`) still credits it: the
distal-reward problem of the paper.

**Exact, event-driven integration.** `d` is constant over each step (`d_k` on step `k`). Between
two updates of a synapse its eligibility only decays, so the weight change from step `m0` to
`m1` is, exactly,

$$\Delta w = c(m_0)\,\tau_c\,(1 - a) \sum_{m=m_0}^{m_1 - 1} a^{m - m_0} d_m,\qquad
  a = e^{-\Delta t/\tau_c}.$$

The network keeps one running sum per trial, `acc = sum_{m >= S} a^{m - S} d_m` since the start
`S` of the current block of steps, and each synapse keeps its eligibility referred to `S`
(`eligibility = c(t) a^{-(t - S)/dt}`) and the value of `acc` at its last update (`stamp`).
A synapse is brought up to date (`w += tau_c (1 - a) eligibility (acc - stamp)`, clipped to
`[w_min, w_max]`) only when it has an event: its presynaptic spike is emitted or arrives,
or its postsynaptic neuron spikes. The cost stays spikes x fan-out. Every
`sweep_interval` ms a block ends: every synapse is brought up to date once and the block
restarts (`acc = 0`), which keeps `a^{-(t - S)/dt} <= e^{sweep_interval / tau_c}` bounded
(one pass over the synapses per block, not per step). With `d >= 0` the weight is
monotonic between updates, so clipping at the update equals clipping the continuous
trajectory.

`state.weights` holds every synapse's weight at its last update; the weights a spike
delivers are always up to date (the emitting neuron's synapses are updated first);
`RewardSTDP.current_weights(state, dt)` brings every synapse to the present.

On CPU a step runs in the compiled kernel `nj_reward_update`
(`neurojax/kernels/plastic_trace.cc`: weights, eligibilities and stamps updated in place),
elsewhere on the pure-JAX event path; both compute the same operations in the same order, and
gradients are those of the dense definition on both.

Reference: E. M. Izhikevich (2007), Solving the distal reward problem through linkage of STDP
and dopamine signaling, Cerebral Cortex 17(10):2443-2452 (its parameters: `a_plus = 1`,
`a_minus = 1.5`, `tau_plus = tau_minus = 20 ms`, `tau_c = 1 s`, `d` with `tau_d = 0.2 s`).
"""

from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._validation import (
    as_float,
    check_choice,
    check_less,
    check_nonnegative,
    check_positive,
    is_concrete,
)
from ._base import ModulatedRule, PlasticState

__all__ = ["RewardSTDP", "RewardSTDPState"]

_PAIRINGS = ("all_to_all", "nearest")


class RewardSTDPState(PlasticState):
    """The plastic state of a projection under `nj.RewardSTDP`.

    Attributes:
        weights: each synapse's weight at its last update, `(*batch, nnz)` (CSR order).
        pre_traces: `(x,)`, the trace of the presynaptic arrivals, `(*batch, n_pre)`.
        post_traces: `(y,)`, the postsynaptic trace, `(*batch, n_post)`.
        history: presynaptic spikes of the last `d` steps for a delay of `d` steps, or None.
        eligibility: each synapse's eligibility referred to the start of the current block,
            `(*batch, nnz)`.
        stamp: the block's neuromodulator sum `acc` at each synapse's last update,
            `(*batch, nnz)`.
        acc: the neuromodulator sum of the current block, `(*batch,)`.
    """

    eligibility: Float[Array, "*batch nnz"]
    stamp: Float[Array, "*batch nnz"]
    acc: Float[Array, "*batch"]


class RewardSTDP(ModulatedRule):
    r"""Reward-modulated (dopamine-gated) STDP with eligibility traces (Izhikevich 2007).

    `dc/dt = -c / tau_c + STDP`, `dw/dt = c d(t)`, integrated exactly and event-driven (see the
    module docstring). The neuromodulator `d` is an input of the network named `modulator`:
    `nj.simulate(net, state, inputs={"dopamine": d})` with `d` of shape `(n_steps,)` (or
    `(n_steps, *batch)`, one value per trial), or `nj.Network(..., inputs={"dopamine": f})`
    with a constant or a function `t_ms -> d`. A network whose modulated projection gets no
    value raises an error.

    Args:
        a_plus: eligibility added per pre-before-post pair (at unit trace), >= 0.
        a_minus: eligibility removed per post-before-pre pair, >= 0.
        tau_plus: presynaptic trace time constant [ms], > 0.
        tau_minus: postsynaptic trace time constant [ms], > 0.
        tau_c: eligibility time constant [ms], > 0 (the paper: 1000 ms).
        w_min: lower weight bound, `< w_max`.
        w_max: upper weight bound.
        pairing: `"all_to_all"` or `"nearest"`.
        modulator: the name of the network input that carries `d` (default `"dopamine"`);
            `d` is in weight units per ms per unit eligibility.
        sweep_interval: how often [ms] every synapse is brought up to date (see the module
            docstring); <= 20 `tau_c` keeps the arithmetic well scaled.

    Example:
    ```python
    rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.15, tau_c=1000.0, w_max=4.0)
    proj = nj.Projection("E", "E", conn, synapse=nj.Delta(), delay=1.0, plasticity=rule)
    net = nj.Network({"E": (nj.LIF(), 100)}, [proj], dt=1.0)
    final, rec = nj.simulate(net, net.init_state(), {"dopamine": d_series}, dt=1.0)
    ```

    Reference: Izhikevich, E. M. (2007), Cereb. Cortex 17:2443-2452.
    """

    a_plus: Float[Array, ""] = eqx.field(default=0.1, converter=as_float)
    a_minus: Float[Array, ""] = eqx.field(default=0.15, converter=as_float)
    tau_plus: Float[Array, ""] = eqx.field(default=20.0, converter=as_float)
    tau_minus: Float[Array, ""] = eqx.field(default=20.0, converter=as_float)
    tau_c: Float[Array, ""] = eqx.field(default=1000.0, converter=as_float)
    w_min: Float[Array, ""] = eqx.field(default=0.0, converter=as_float)
    w_max: Float[Array, ""] = eqx.field(default=4.0, converter=as_float)
    pairing: str = eqx.field(default="all_to_all", static=True)
    modulator: str = eqx.field(default="dopamine", static=True)
    sweep_interval: float = eqx.field(default=1000.0, static=True)

    n_pre_traces: ClassVar[int] = 1
    n_post_traces: ClassVar[int] = 1
    state_class: ClassVar[type[PlasticState]] = RewardSTDPState

    def __check_init__(self):
        check_choice("RewardSTDP", "pairing", self.pairing, _PAIRINGS)
        check_nonnegative("RewardSTDP", "a_plus", self.a_plus)
        check_nonnegative("RewardSTDP", "a_minus", self.a_minus)
        for name in ("tau_plus", "tau_minus", "tau_c"):
            check_positive("RewardSTDP", name, getattr(self, name), "ms")
        check_less("RewardSTDP", "w_min", self.w_min, "w_max", self.w_max)
        for name in ("a_plus", "a_minus", "tau_plus", "tau_minus", "tau_c", "w_min", "w_max"):
            if getattr(self, name).ndim:
                raise ValueError(
                    f"RewardSTDP: {name} must be a scalar, got shape {getattr(self, name).shape}"
                )
        if not isinstance(self.modulator, str) or not self.modulator:
            raise TypeError(
                f"RewardSTDP: modulator must be a non-empty str, got {self.modulator!r}"
            )
        sweep = self.sweep_interval
        if isinstance(sweep, bool) or not isinstance(sweep, (int, float)) or not sweep > 0:
            raise ValueError(f"RewardSTDP: sweep_interval must be > 0 ms, got {sweep!r}")
        if is_concrete(self.tau_c) and sweep > 20.0 * float(self.tau_c):
            raise ValueError(
                f"RewardSTDP: sweep_interval={sweep} ms must be <= 20 tau_c = "
                f"{20.0 * float(self.tau_c)} ms (the eligibility referred to a block start "
                "grows as exp(sweep_interval / tau_c))"
            )

    # ---------------------------------------------------------------- the network's interface

    def modulator_name(self) -> str:
        """The network input that carries the neuromodulator `d`."""
        return self.modulator

    def sweep_steps(self, dt: float) -> int:
        """Steps per block: every synapse is brought up to date at multiples of it."""
        return max(1, int(round(self.sweep_interval / dt)))

    def eligibility_decay(self, dt: float) -> Float[Array, ""]:
        """`a = exp(-dt / tau_c)`, the eligibility's decay per step."""
        return jnp.exp(-dt / self.tau_c)

    def trace_decays(self, dt: float):
        """`((exp(-dt / tau_plus),), (exp(-dt / tau_minus),))`."""
        return (jnp.exp(-dt / self.tau_plus),), (jnp.exp(-dt / self.tau_minus),)

    def _trace(self, trace, spikes):
        if self.pairing == "nearest":
            return jnp.where(spikes > 0, jnp.ones_like(trace), trace)
        return trace + spikes

    def update_pre_traces(self, traces, spikes):
        """`x` after this step's arrivals."""
        return (self._trace(traces[0], spikes),)

    def update_post_traces(self, traces, spikes):
        """`y` after this step's postsynaptic spikes."""
        return (self._trace(traces[0], spikes),)

    def eligibility_pre(self, pre, post, s):
        """Eligibility added at an arrival: `-a_minus * y_j` (times the spike value `s`)."""
        return -self.a_minus * post[0] * s

    def eligibility_post(self, pre, post, s):
        """Eligibility added at a postsynaptic spike: `a_plus * x_i` (times `s`)."""
        return self.a_plus * pre[0] * s

    def eligibility_gain(self, dt: float) -> Float[Array, ""]:
        """`tau_c (1 - a)`: the weight change per unit eligibility and unit of the block's
        summed, decayed reward."""
        return self.tau_c * (1.0 - self.eligibility_decay(dt))

    def current_weights(self, state: RewardSTDPState, dt: float) -> Float[Array, "*batch nnz"]:
        """Every synapse's weight now (after the steps run so far): one pass over the
        synapses, for read-out."""
        return self.catch_up(
            state.weights, state.eligibility, state.stamp, state.acc[..., None], dt
        )

    def init_state(self, weights, n_pre, n_post, batch, delay_steps, dtype) -> RewardSTDPState:
        """Weights `weights`, traces, eligibilities and the block's sum at zero."""
        d = delay_steps or 0
        nnz = weights.shape[-1]
        return RewardSTDPState(
            weights=jnp.broadcast_to(weights.astype(dtype), batch + weights.shape),
            pre_traces=(jnp.zeros(batch + (n_pre,), dtype),),
            post_traces=(jnp.zeros(batch + (n_post,), dtype),),
            history=jnp.zeros(batch + (d, n_pre), dtype) if d else None,
            eligibility=jnp.zeros(batch + (nnz,), dtype),
            stamp=jnp.zeros(batch + (nnz,), dtype),
            acc=jnp.zeros(batch, dtype),
        )


def block_factors(rule: RewardSTDP, k: Any, dt: float) -> tuple[Any, Any]:
    """`(a^{k - S}, a^{k + 1 - S})` for step `k` of its block (`S` the block's first step):
    the weight of `d_k` in the block's sum and the factor that refers an eligibility jump at
    the end of step `k` to the block's start."""
    a = rule.eligibility_decay(dt)
    phase = (k % rule.sweep_steps(dt)).astype(a.dtype)
    return a**phase, a ** (phase + 1.0)
