r"""The abstract plasticity rule and the state it owns.

A rule of this family changes the weight of a synapse `i -> j` at two kinds of events, and
nowhere else:

- when a spike of presynaptic neuron `i` **arrives** at the synapse (after the projection's
  delay): `w <- on_pre(w, pre_i, post_j, s)`;
- when postsynaptic neuron `j` **spikes**: `w <- on_post(w, pre_i, post_j, s)`;

where `pre_i` are the presynaptic traces of neuron `i` and `post_j` the postsynaptic traces of
neuron `j` (each a tuple, one value per declared trace) and `s` the event's spike value (1).
Every trace decays by a constant factor per step (`trace_decays`) and is then updated by this
step's spikes (`update_pre_traces`, `update_post_traces`: an increment, a reset, ...).

One step, in this order (what the event path, the dense reference and the compiled kernel all
compute):

1. every trace decays to the step's end;
2. arrivals: `on_pre` with the presynaptic traces not yet updated by this step's arrivals and
   the postsynaptic traces not yet updated by this step's postsynaptic spikes;
3. the presynaptic traces take this step's arrivals;
4. postsynaptic spikes: `on_post` with the presynaptic traces **including** this step's
   arrivals (a pair in the same step counts as pre before post) and the postsynaptic traces
   not yet updated by this step's spikes;
5. the postsynaptic traces take this step's spikes.
"""

import abc
import dataclasses
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["PlasticState", "PlasticityRule", "ModulatedRule", "PairKernel", "TraceKernel"]

Traces = tuple[Float[Array, "..."], ...]


class PlasticState(eqx.Module):
    """The state of one plastic projection: its current weights, the rule's traces, the delay
    line of the presynaptic spikes.

    Attributes:
        weights: current weights, `(*batch, nnz)` in the projection's CSR order.
        pre_traces: the rule's presynaptic traces, a tuple of `n_pre_traces` arrays
            `(*batch, n_pre)` (traces of the spikes' arrivals at the synapses).
        post_traces: the rule's postsynaptic traces, a tuple of `n_post_traces` arrays
            `(*batch, n_post)`.
        history: presynaptic spikes of the last `d` steps for a delay of `d` steps,
            `(*batch, d, n_pre)`, or None without delay.

    A network keeps one per plastic projection in `NetworkState.plastic[i]`; it is saved,
    vmapped and differentiated like any other state.
    """

    weights: Float[Array, "*batch nnz"]
    pre_traces: Traces
    post_traces: Traces
    history: Float[Array, "*batch d n_pre"] | None


class PairKernel(NamedTuple):
    """Parameters of the compiled pair-STDP kernel, returned by `PlasticityRule.pair_kernel`.

    A rule that returns them states that its step is exactly trace-based pair STDP with one
    presynaptic and one postsynaptic trace: depression `w - a_minus * f_-(w) * y` on an
    arrival and potentiation `w + a_plus * f_+(w) * x` on a postsynaptic spike, each clipped
    to `[w_min, w_max]`, with `f_+ = f_- = 1` (additive) or `f_+ = w_max - w`,
    `f_- = w - w_min` (`multiplicative`), and traces that add 1 per spike or, with
    `nearest`, are set to 1.
    """

    a_plus: Float[Array, ""]
    a_minus: Float[Array, ""]
    w_min: Float[Array, ""]
    w_max: Float[Array, ""]
    multiplicative: bool
    nearest: bool


TRACE_KINDS = ("triplet", "vogels")


class TraceKernel(NamedTuple):
    """Parameters of the compiled trace-rule kernel, returned by `PlasticityRule.trace_kernel`.

    A rule that returns them states that its step is exactly one of the kernel's rule kinds,
    with traces that decay by the rule's `trace_decays` and add 1 per spike or, with
    `nearest`, are set to 1, and every event clipped to `[w_min, w_max]`:

    - `kind="triplet"`, traces `(r1, r2)` and `(o1, o2)` (`nj.TripletSTDP`): on an arrival
      `w - o1 (a_pre + b_pre r2)`, on a postsynaptic spike `w + r1 (a_post + b_post o2)`;
    - `kind="vogels"`, one trace `x` per side (`nj.VogelsSTDP`): on an arrival
      `w + a_pre (x_j - b_pre)`, on a postsynaptic spike `w + a_post x_i` (`b_post` unused).

    The traces are read as `on_pre` and `on_post` read them (see this module's docstring),
    and the products associate as written, left to right.
    """

    kind: str
    a_pre: Float[Array, ""]
    b_pre: Float[Array, ""]
    a_post: Float[Array, ""]
    b_post: Float[Array, ""]
    w_min: Float[Array, ""]
    w_max: Float[Array, ""]
    nearest: bool


def redefines(rule: Any, base: type, names: tuple[str, ...]) -> bool:
    """Whether the class of `rule` redefines any of the methods `names` of `base`: a subclass
    of a rule that has a compiled kernel loses the kernel when it changes what the kernel
    computes."""
    return any(getattr(type(rule), name) is not getattr(base, name) for name in names)


def _at(traces: Traces, idx: jax.Array) -> Traces:
    return tuple(t[..., idx] for t in traces)


class PlasticityRule(eqx.Module):
    """Abstract base of the synaptic plasticity rules of `nj.Projection(..., plasticity=...)`.

    A rule is an equinox module: numeric parameters are array leaves (swept by `jax.vmap`,
    differentiated by `jax.grad`), options are static fields. A concrete rule declares:

    - `n_pre_traces`, `n_post_traces` (class variables): how many traces each presynaptic and
      each postsynaptic neuron carries;
    - `w_min`, `w_max`: the weight bounds (initial weights are checked against them);
    - `trace_decays(dt)`: the per-step decay factor of every trace;
    - `update_pre_traces(traces, spikes)`, `update_post_traces(traces, spikes)`: the traces
      after this step's spikes, given the traces decayed to the step's end;
    - `on_pre(w, pre, post, s)`, `on_post(w, pre, post, s)`: a synapse's new weight when its
      presynaptic spike arrives and when its postsynaptic neuron spikes. Both are
      element-wise in `w`, the traces and `s` (they receive arrays of any shape, one entry
      per synapse touched), use only `jnp` operations (so they trace into any kernel body),
      and return `w` unchanged where `s == 0`.

    From these the base class derives `dense_update`, the reference step of every synapse at
    once, which defines gradients and serves tests; the network's event path applies the same
    functions to the synapses of the spiking neurons only. A rule that is exactly pair STDP
    may return its parameters from `pair_kernel` to run in the compiled CPU kernel, and a
    rule of the trace-rule family (triplet, Vogels) its parameters from `trace_kernel`.

    See the concept page "Plasticity" for a worked example.
    """

    n_pre_traces: eqx.AbstractClassVar[int]
    n_post_traces: eqx.AbstractClassVar[int]
    w_min: eqx.AbstractVar[Float[Array, ""]]
    w_max: eqx.AbstractVar[Float[Array, ""]]
    state_class: ClassVar[type[PlasticState]] = PlasticState

    @abc.abstractmethod
    def trace_decays(self, dt: float) -> tuple[Traces, Traces]:
        """Per-step decay factors `(pre, post)`: tuples of `n_pre_traces` and `n_post_traces`
        scalars by which the traces are multiplied at every step of `dt` ms."""

    @abc.abstractmethod
    def update_pre_traces(self, traces: Traces, spikes: Float[Array, "*batch n_pre"]) -> Traces:
        """The presynaptic traces after this step's arrivals `spikes` (0/1), given the traces
        already decayed to the step's end."""

    @abc.abstractmethod
    def update_post_traces(self, traces: Traces, spikes: Float[Array, "*batch n_post"]) -> Traces:
        """The postsynaptic traces after this step's spikes `spikes` (0/1), given the traces
        already decayed to the step's end."""

    @abc.abstractmethod
    def on_pre(self, w: Array, pre: Traces, post: Traces, s: Array) -> Array:
        """A synapse's weight after the arrival of its presynaptic spike (value `s`).

        `pre`: the traces of its presynaptic neuron, decayed, before this step's arrivals;
        `post`: the traces of its postsynaptic neuron, decayed, before this step's spikes.
        Must return `w` where `s == 0`.
        """

    @abc.abstractmethod
    def on_post(self, w: Array, pre: Traces, post: Traces, s: Array) -> Array:
        """A synapse's weight after a spike (value `s`) of its postsynaptic neuron.

        `pre`: the traces of its presynaptic neuron, **including** this step's arrivals;
        `post`: the traces of its postsynaptic neuron, decayed, before this step's spikes.
        Must return `w` where `s == 0`.
        """

    def pair_kernel(self) -> PairKernel | None:
        """The parameters of the compiled pair-STDP kernel when this rule is exactly pair STDP
        (see `PairKernel`), else None (the default): the rule then runs on the generic
        event path, which calls `on_pre` and `on_post`."""
        return None

    def trace_kernel(self) -> TraceKernel | None:
        """The parameters of the compiled trace-rule kernel when this rule is exactly one of
        its kinds (see `TraceKernel`), else None (the default: the generic event path). A
        rule with a `pair_kernel` runs in the pair kernel whatever this returns."""
        return None

    def modulator_name(self) -> str | None:
        """The name of the network input (a neuromodulator, one value per trial and step)
        that this rule reads, or None (the default: the rule reads only spikes). A rule that
        names one runs on the network's neuromodulated path (`nj.RewardSTDP`)."""
        return None

    def clip(self, w: Array) -> Array:
        """`w` clipped to the bounds `[w_min, w_max]`."""
        return jnp.clip(w, self.w_min, self.w_max)

    def dense_update(
        self,
        w: Float[Array, "*batch nnz"],
        pre: Traces,
        post: Traces,
        s_pre: Float[Array, "*batch n_pre"],
        s_post: Float[Array, "*batch n_post"],
        pre_idx: jax.Array,
        post_idx: jax.Array,
    ) -> Float[Array, "*batch nnz"]:
        """The weights after one step's events, every synapse at once: the definition that
        the event path implements and that gradients differentiate.

        `w` `(*batch, nnz)`; `pre`, `post` the traces decayed to the step's end (before this
        step's events); `s_pre` the presynaptic arrivals, `s_post` the postsynaptic spikes;
        `pre_idx`, `post_idx` `(nnz,)` the presynaptic and postsynaptic neuron of each
        synapse.
        """
        post_at = _at(post, post_idx)
        w = self.on_pre(w, _at(pre, pre_idx), post_at, s_pre[..., pre_idx])
        pre_new = self.update_pre_traces(pre, s_pre)
        return self.on_post(w, _at(pre_new, pre_idx), post_at, s_post[..., post_idx])

    def init_state(
        self,
        weights: Float[Array, " nnz"],
        n_pre: int,
        n_post: int,
        batch: tuple[int, ...],
        delay_steps: int | None,
        dtype: Any,
    ) -> PlasticState:
        """The initial state of a projection with initial `weights` (every trial starts from
        them), traces at zero, and an empty delay line for a delay of `delay_steps` steps."""
        d = delay_steps or 0
        return self.state_class(
            weights=jnp.broadcast_to(weights.astype(dtype), batch + weights.shape),
            pre_traces=tuple(jnp.zeros(batch + (n_pre,), dtype) for _ in range(self.n_pre_traces)),
            post_traces=tuple(
                jnp.zeros(batch + (n_post,), dtype) for _ in range(self.n_post_traces)
            ),
            history=jnp.zeros(batch + (d, n_pre), dtype) if d else None,
        )


class ModulatedRule(PlasticityRule):
    """A rule whose weight change is gated by a neuromodulator (a network input, one value
    per trial and step), as in three-factor learning: spike pairs write to a per-synapse
    eligibility, and the weights follow `dw/dt = c d(t)` (`nj.RewardSTDP` is one).

    The network runs such a rule on its neuromodulated path: STDP events go to the
    eligibility (`eligibility_pre`, `eligibility_post`), and every synapse is brought up to
    date in blocks of `sweep_steps(dt)` steps and whenever it is touched (`catch_up`). A
    subclass implements the methods below besides `PlasticityRule`'s traces; `on_pre` and
    `on_post` leave the weight unchanged (the eligibility takes the events).
    """

    @abc.abstractmethod
    def modulator_name(self) -> str:
        """The name of the network input that carries the neuromodulator."""

    @abc.abstractmethod
    def sweep_steps(self, dt: float) -> int:
        """Steps per block: every synapse is brought up to date at multiples of it."""

    @abc.abstractmethod
    def eligibility_decay(self, dt: float) -> Float[Array, ""]:
        """The eligibility's decay factor per step."""

    @abc.abstractmethod
    def eligibility_gain(self, dt: float) -> Float[Array, ""]:
        """The weight change per unit eligibility and unit of the block's summed, decayed
        neuromodulator (`tau_c (1 - a)` for an exponential eligibility)."""

    @abc.abstractmethod
    def eligibility_pre(self, pre: Traces, post: Traces, s: Array) -> Array:
        """Eligibility added at a presynaptic arrival (times the spike value `s`)."""

    @abc.abstractmethod
    def eligibility_post(self, pre: Traces, post: Traces, s: Array) -> Array:
        """Eligibility added at a postsynaptic spike (times `s`)."""

    def catch_up(self, w: Array, eligibility: Array, stamp: Array, acc: Array, dt: float):
        """Weights brought from their last update to the time at which the block's sum is
        `acc`: `clip(w + eligibility_gain(dt) * eligibility * (acc - stamp))`."""
        return self.clip(w + self.eligibility_gain(dt) * eligibility * (acc - stamp))

    def on_pre(self, w: Array, pre: Traces, post: Traces, s: Array) -> Array:
        """An arrival changes no weight at once (it writes to the eligibility)."""
        return w

    def on_post(self, w: Array, pre: Traces, post: Traces, s: Array) -> Array:
        """A postsynaptic spike changes no weight at once (it writes to the eligibility)."""
        return w


def replace_state(state: PlasticState, **changes: Any) -> PlasticState:
    """`state` with some fields replaced, of the same class."""
    return dataclasses.replace(state, **changes)
