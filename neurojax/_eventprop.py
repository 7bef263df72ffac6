r"""Exact event-driven simulation of current-based LIF networks and its EventProp gradient.

The forward pass is event driven: between two events (a spike arriving at a synapse, a
membrane crossing the threshold, the end of the run) every neuron follows the closed-form
solution of

$$\tau_m \dot u = -u + r_m I,\qquad \tau_s \dot I = -I,$$

with `u = v - v_rest`. A spike arriving through a synapse of weight `w` makes `I` jump by
`w` (`nj.Exponential(tau_s)`) or `u` jump by `r_m w / tau_m` (`nj.Delta()`, the limit
`tau_s -> 0`). Threshold crossings are located on this exact solution: the sub-threshold
trajectory is a sum of two exponentials with at most one turning point (closed form), which
brackets the first upward crossing on a monotone stretch, and a safeguarded Newton iteration
finds it to the last bits of the float type. Spike times therefore carry no grid error.

The backward pass is the adjoint method of Wunderlich and Pehle (2021, Sci. Rep. 11:12829),
written as a `jax.custom_vjp` over the whole run: the adjoint state is carried from event to
event backwards in time; between events it follows the adjoint ODE, solved exactly (the
transpose of the closed-form propagator), and at each event it jumps as the paper's jump
conditions say: at a spike, through the implicit derivative of the spike time
(`dt_k = -(du - d theta) / u'(t_k)`), and at an arrival, by the change of the derivatives of
`u` and `I` that a shifted arrival causes, which is also the gradient with respect to the
delay (Meszaros et al. 2025, arXiv 2501.07331). The residuals kept for the backward pass are
the list of events (their time, their kind and the state of the network just before each),
so memory grows with the number of events, never with a number of time steps.
"""

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._validation import as_float, is_concrete
from .neurons import LIF
from .synapses import ConductanceOutput, CurrentOutput, Delta, Exponential

__all__ = [
    "EventProjection",
    "EventNetwork",
    "EventRecording",
    "eventprop_run",
    "default_max_events",
    "check_eventprop_model",
    "simulate_eventprop",
]

_NEWTON_BISECT = 20  # bisection steps before Newton: the bracket shrinks by 2^20
_NEWTON_STEPS = 8  # safeguarded Newton steps: quadratic convergence from there
# the earliest crossing of an event is searched in two stages: `_SCREEN_STEPS` bisection
# steps on every neuron with a bracket narrow each bracket 2^6-fold, which rules out every
# neuron whose bracket starts after the earliest narrowed bracket ends; the rest (in
# Yin-Yang's 5-200-3 network one to a few, where tens have a bracket after an input spike)
# are searched in full, up to `_SEARCH_K` of them before falling back to all
_SCREEN_STEPS = 6
_SEARCH_K = 8


def check_eventprop_model(owner: str, model: Any) -> None:
    """Raise a `TypeError` naming what EventProp needs when `model` is not a neuron model
    with an exact spike time (`nj.LIF`): Izhikevich, AdEx and Hodgkin-Huxley neurons have no
    closed-form sub-threshold solution and no threshold at which a spike time is defined by
    the state alone, so EventProp's jump conditions do not apply to them."""
    if type(model) is not LIF:
        raise TypeError(
            f"{owner}: EventProp needs current-based LIF neurons (nj.LIF), whose spike time is "
            f"exact; got {type(model).__name__}. Izhikevich, AdEx and Hodgkin-Huxley neurons have "
            "no exact spike time: use gradient='surrogate' for them"
        )


class EventProjection(eqx.Module):
    """Synapses from population `pre` to population `post` for an `EventNetwork`.

    Args:
        pre: name of the presynaptic population (a neuron population or an input).
        post: name of the postsynaptic neuron population.
        weight: `(n_pre, n_post)` weights [nA for `nj.Exponential`, nA ms for `nj.Delta`].
        delay: transmission delay [ms], >= 0: a scalar (one for the projection) or one per
            synapse, shape `(n_pre, n_post)`. Exact: a spike at `t` arrives at `t + delay`.
        synapse: `nj.Exponential(tau)` (current jumps by `w` and decays with `tau`) or
            `nj.Delta()` (the membrane jumps by `r_m w / tau_m`).
        mask: `(n_pre, n_post)` of 0/1 (or bool): which synapses exist (default all). Absent
            synapses carry no spike and get a zero gradient.
        output: `nj.CurrentOutput()` (the default, the only one EventProp supports).

    Weights, delays and the synapse's `tau` are array leaves: all three get gradients.
    """

    pre: str = eqx.field(static=True)
    post: str = eqx.field(static=True)
    weight: Float[Array, "n_pre n_post"]
    delay: Float[Array, "..."]
    mask: Float[Array, "n_pre n_post"]
    synapse: Any
    per_synapse_delay: bool = eqx.field(static=True)

    def __init__(
        self,
        pre: str,
        post: str,
        weight: Any,
        *,
        delay: Any = 0.0,
        synapse: Any = None,
        mask: Any = None,
        output: Any = None,
    ):
        owner = "EventProjection"
        if not isinstance(pre, str) or not isinstance(post, str):
            raise TypeError(
                f"{owner}: pre and post must be population names (str), got {pre!r}, {post!r}"
            )
        if output is not None and not isinstance(output, CurrentOutput):
            kind = "conductance" if isinstance(output, ConductanceOutput) else type(output).__name__
            raise TypeError(
                f"{owner}: EventProp supports current-based synapses only (nj.CurrentOutput), "
                f"got a {kind} output; a conductance synapse makes the input depend on v and "
                "the sub-threshold solution is no longer closed form. Use gradient='surrogate'"
            )
        synapse = Exponential(5.0) if synapse is None else synapse
        if type(synapse) not in (Exponential, Delta):
            raise TypeError(
                f"{owner}: synapse must be nj.Exponential(tau) or nj.Delta() for EventProp, got "
                f"{type(synapse).__name__}"
            )
        w = as_float(weight)
        if w.ndim != 2:
            raise ValueError(
                f"{owner}: weight must have shape (n_pre, n_post), got shape {w.shape}"
            )
        d = as_float(delay)
        if d.ndim not in (0, 2) or (d.ndim == 2 and d.shape != w.shape):
            raise ValueError(
                f"{owner}: delay must be a scalar or have the weight's shape {w.shape}, got "
                f"shape {d.shape}"
            )
        if is_concrete(d) and not np.all(np.asarray(d) >= 0):
            raise ValueError(
                f"{owner}: delay must be >= 0 ms, got minimum {float(np.min(np.asarray(d)))}"
            )
        if mask is None:
            m = jnp.ones(w.shape, w.dtype)
        else:
            m = jnp.asarray(mask)
            if m.shape != w.shape:
                raise ValueError(
                    f"{owner}: mask must have the weight's shape {w.shape}, got {m.shape}"
                )
            m = m.astype(w.dtype)
        self.pre, self.post = pre, post
        self.weight, self.delay, self.mask, self.synapse = w, d, m, synapse
        self.per_synapse_delay = d.ndim == 2

    @property
    def n_pre(self) -> int:
        return self.weight.shape[0]

    @property
    def n_post(self) -> int:
        return self.weight.shape[1]


class EventNetwork(eqx.Module):
    r"""A network of current-based LIF populations driven by input spike times, simulated
    event by event with exact spike times, for exact (EventProp) gradients.

    Args:
        populations: `{name: (nj.LIF(...), size)}`, neuron populations. Each needs
            `t_ref = 0` and `v_rest < v_th` (no spontaneous firing) and must not use
            `method="euler"` (the dynamics are solved exactly).
        inputs: `{name: size}`, input populations whose spike times are given at each run.
        projections: a sequence of `EventProjection`. All projections onto one population
            use the same synapse type and time constant (the neuron keeps one current).
        readouts: names of populations that integrate but never spike (leaky readouts,
            whose voltage maximum or integral a loss reads).

    Any population may project onto any other, itself included (recurrent networks).

    Example:
    ```python
    lif = nj.LIF(tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0)
    net = EventNetwork(
        populations={"hid": (lif, 10), "out": (lif, 3)},
        inputs={"in": 4},
        projections=[EventProjection("in", "hid", w1, synapse=nj.Exponential(5.0)),
                     EventProjection("hid", "out", w2, synapse=nj.Exponential(5.0))],
    )
    rec = eventprop_run(net, {"in": times}, t_max=50.0)
    rec.spike_times["out"]       # (3, max_spikes), +inf where no spike
    ```
    """

    populations: dict[str, LIF]
    sizes: dict[str, int] = eqx.field(static=True)
    inputs: dict[str, int] = eqx.field(static=True)
    readouts: tuple[str, ...] = eqx.field(static=True)
    projections: tuple[EventProjection, ...]

    def __init__(
        self,
        populations: Mapping[str, Any],
        inputs: Mapping[str, int],
        projections: Any,
        readouts: Any = (),
    ):
        owner = "EventNetwork"
        if not isinstance(populations, Mapping) or not populations:
            raise TypeError(
                f"{owner}: populations must be a non-empty dict {{name: (nj.LIF, size)}}, got "
                f"{populations!r}"
            )
        if not isinstance(inputs, Mapping):
            raise TypeError(f"{owner}: inputs must be a dict {{name: size}}, got {inputs!r}")
        pops, sizes = {}, {}
        for name, entry in populations.items():
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(
                    f"{owner}: populations[{name!r}] must be (model, size), got {entry!r}"
                )
            model, size = entry
            check_eventprop_model(f"{owner}: populations[{name!r}]", model)
            _check_size(owner, f"populations[{name!r}]", size)
            _check_lif(owner, name, model)
            pops[name], sizes[name] = model, int(size)
        ins = {}
        for name, size in inputs.items():
            if name in sizes:
                raise ValueError(f"{owner}: input {name!r} has the name of a neuron population")
            _check_size(owner, f"inputs[{name!r}]", size)
            ins[name] = int(size)
        readouts = tuple(readouts)
        for name in readouts:
            if name not in sizes:
                raise ValueError(
                    f"{owner}: readout {name!r} is not a neuron population; populations are "
                    f"{list(sizes)}"
                )
        projections = tuple(projections)
        kinds: dict[str, Any] = {}
        for k, p in enumerate(projections):
            if not isinstance(p, EventProjection):
                raise TypeError(
                    f"{owner}: projections[{k}] must be an EventProjection, got {type(p).__name__}"
                )
            n_pre = sizes.get(p.pre, ins.get(p.pre))
            if n_pre is None:
                raise ValueError(
                    f"{owner}: projections[{k}].pre = {p.pre!r} is neither a population nor an "
                    "input"
                )
            if p.post not in sizes:
                raise ValueError(
                    f"{owner}: projections[{k}].post = {p.post!r} is not a neuron population "
                    "(inputs take no synapses)"
                )
            if (p.n_pre, p.n_post) != (n_pre, sizes[p.post]):
                raise ValueError(
                    f"{owner}: projections[{k}] ({p.pre} -> {p.post}) has weight shape "
                    f"{(p.n_pre, p.n_post)}, populations have ({n_pre}, {sizes[p.post]})"
                )
            first = kinds.setdefault(p.post, (k, p.synapse))
            if type(first[1]) is not type(p.synapse):
                raise ValueError(
                    f"{owner}: projections[{first[0]}] and [{k}] onto {p.post!r} use different "
                    f"synapse types ({type(first[1]).__name__}, {type(p.synapse).__name__}); "
                    "EventProp keeps one current per neuron"
                )
        for name, (k, syn) in kinds.items():
            if isinstance(syn, Exponential):
                tau = np.asarray(syn.tau) if is_concrete(syn.tau) else None
                if tau is not None and tau.ndim:
                    raise ValueError(
                        f"{owner}: projections[{k}]: synapse tau must be a scalar for EventProp, "
                        f"got shape {tau.shape}"
                    )
                if (
                    tau is not None
                    and is_concrete(pops[name].tau_m)
                    and np.any(np.isclose(np.asarray(pops[name].tau_m), tau, rtol=1e-6))
                ):
                    raise ValueError(
                        f"{owner}: population {name!r}: tau_m equals the synapse tau "
                        f"({float(tau)} ms); "
                        "the closed-form solution needs tau_m != tau_s"
                    )
                for j, q in enumerate(projections):
                    if (
                        q.post == name
                        and j != k
                        and is_concrete(q.synapse.tau)
                        and tau is not None
                        and not np.array_equal(np.asarray(q.synapse.tau), tau)
                    ):
                        raise ValueError(
                            f"{owner}: projections[{k}] and [{j}] onto {name!r} have different "
                            "synapse "
                            f"tau ({float(tau)}, {float(np.asarray(q.synapse.tau))} ms); "
                            "EventProp keeps one current per neuron"
                        )
        self.populations, self.sizes, self.inputs = pops, sizes, ins
        self.readouts, self.projections = readouts, projections


def _check_size(owner, what, size):
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"{owner}: {what} size must be a positive int, got {size!r}")


def _check_lif(owner, name, m: LIF):
    if m.method != "exact":
        raise ValueError(
            f"{owner}: populations[{name!r}] uses method={m.method!r}; EventProp solves the "
            "dynamics exactly (method='exact')"
        )
    if is_concrete(m.t_ref) and np.any(np.asarray(m.t_ref) != 0):
        raise ValueError(
            f"{owner}: populations[{name!r}] has t_ref={np.asarray(m.t_ref)}; EventProp needs "
            "t_ref = 0"
        )
    if (
        is_concrete(m.v_th)
        and is_concrete(m.v_rest)
        and np.any(np.asarray(m.v_th) <= np.asarray(m.v_rest))
    ):
        raise ValueError(
            f"{owner}: populations[{name!r}] needs v_rest < v_th (no spontaneous firing), got "
            f"v_rest={np.asarray(m.v_rest)}, v_th={np.asarray(m.v_th)}"
        )


class EventRecording(eqx.Module):
    """What `eventprop_run` returns (per neuron population unless said otherwise).

    Attributes:
        spike_times: `(n, max_spikes)` spike times [ms] in increasing order, `+inf` after the
            last spike.
        counts: number of spikes per neuron (int32).
        v_max: maximum membrane potential over `[0, t_max]` [mV].
        v_integral: time integral of the membrane potential over `[0, t_max]` [mV ms].
        v_final: membrane potential at `t_max` [mV].
        n_events: number of events the run processed (int32, per trial).
        t_max: duration [ms].
    """

    spike_times: dict[str, Float[Array, "n k"]]
    counts: dict[str, Int[Array, " n"]]
    v_max: dict[str, Float[Array, " n"]]
    v_integral: dict[str, Float[Array, " n"]]
    v_final: dict[str, Float[Array, " n"]]
    n_events: Int[Array, ""]
    t_max: Float[Array, ""]


@dataclasses.dataclass(frozen=True)
class _Proj:
    pre_input: int  # index into the input list, or -1
    pre_off: int  # offset among neurons when pre is a neuron population
    n_pre: int
    post_off: int
    n_post: int
    per_synapse: bool
    delta: bool


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int
    k: int
    max_events: int
    projs: tuple[_Proj, ...]
    delta: tuple[bool, ...]  # per neuron
    spiking: tuple[bool, ...]  # per neuron


def _exprel_diff(dt, tau_s, tau_m):
    """`exp(-dt/tau_s) - exp(-dt/tau_m)`, without cancellation for small `dt`."""
    return jnp.expm1(-dt / tau_s) - jnp.expm1(-dt / tau_m)


def _u_at(s, u, i, tau_m, tau_s, r):
    c = tau_s / (tau_s - tau_m)
    return jnp.exp(-s / tau_m) * u + r * i * c * _exprel_diff(s, tau_s, tau_m)


def _du_at(s, u, i, tau_m, tau_s, r):
    return (-_u_at(s, u, i, tau_m, tau_s, r) + r * i * jnp.exp(-s / tau_s)) / tau_m


def _turning_point(u, i, tau_m, tau_s, r):
    """Time of the single turning point of the free trajectory and whether it is ahead."""
    b = r * i * tau_s / (tau_s - tau_m)
    a = u - b
    a_safe = jnp.where(a == 0, 1.0, a)
    arg = -(b * tau_m) / (a_safe * tau_s)
    ok = (a != 0) & (arg > 0)
    s = jnp.log(jnp.where(ok, arg, 1.0)) / (1.0 / tau_s - 1.0 / tau_m)
    return s, ok & (s > 0)


def _bracket(u, i, tau_m, tau_s, r, theta, horizon):
    """A stretch `[lo, hi]` of `[0, horizon]` on which `u` rises and ends at or above
    `theta`, and whether there is one (then the first crossing lies in it)."""
    s_star, ahead = _turning_point(u, i, tau_m, tau_s, r)
    rising = (-u + r * i) > 0
    within = ahead & (s_star < horizon)
    lo = jnp.where(rising, 0.0, jnp.where(within, s_star, horizon))
    hi = jnp.where(rising & within, s_star, horizon)
    found = (_u_at(hi, u, i, tau_m, tau_s, r) >= theta) & (rising | within)
    now = u >= theta
    lo = jnp.where(now, 0.0, lo)
    hi = jnp.where(now, 0.0, hi)
    return lo, hi, found | now


def _solve(p, lo, hi):
    u, i, tau_m, tau_s, r, theta = p

    def body(_, c):
        lo, hi, s = c
        f = _u_at(s, u, i, tau_m, tau_s, r) - theta
        lo = jnp.where(f < 0, s, lo)
        hi = jnp.where(f < 0, hi, s)
        return lo, hi, 0.5 * (lo + hi)

    lo, hi, s = jax.lax.fori_loop(0, _NEWTON_BISECT, body, (lo, hi, 0.5 * (lo + hi)))

    def newton(_, c):
        lo, hi, s = c
        f = _u_at(s, u, i, tau_m, tau_s, r) - theta
        lo = jnp.where(f < 0, s, lo)
        hi = jnp.where(f < 0, hi, s)
        d = _du_at(s, u, i, tau_m, tau_s, r)
        step = jnp.where(d > 0, f / jnp.where(d > 0, d, 1.0), jnp.inf)
        t = s - step
        t = jnp.where((t >= lo) & (t <= hi) & jnp.isfinite(t), t, 0.5 * (lo + hi))
        return lo, hi, jnp.where(f == 0, s, t)

    return jax.lax.fori_loop(0, _NEWTON_STEPS, newton, (lo, hi, s))[2]


def _earliest_all(found, lo, hi, p):
    """Index and time from now of the earliest crossing among the neurons `found` (whose
    first crossing lies in `[lo, hi]`), every neuron searched; `inf` if none."""
    s = jnp.where(found, _solve(p, lo, hi), jnp.inf)
    i = jnp.argmin(s).astype(jnp.int32)
    return i, s[i]


def _candidates(found, lo, hi, p):
    """The neurons `found` that may cross first: after `_SCREEN_STEPS` bisection steps on
    each bracket, those whose narrowed bracket starts no later than the earliest narrowed
    bracket ends (a neuron left out crosses strictly after some other neuron)."""
    u, i, tau_m, tau_s, r, theta = p

    def body(_, c):
        a, b = c
        mid = 0.5 * (a + b)
        below = _u_at(mid, u, i, tau_m, tau_s, r) < theta
        return jnp.where(below, mid, a), jnp.where(below, b, mid)

    lo2, hi2 = jax.lax.fori_loop(0, _SCREEN_STEPS, body, (lo, hi))
    first_end = jnp.min(jnp.where(found, hi2, jnp.inf))
    return found & (lo2 <= first_end)


def _earliest_few(found, lo, hi, p):
    """`_earliest_all` for the first `_SEARCH_K` neurons `found` only (right when no more
    are found), on arrays of that length: the same iteration per neuron from the same
    bracket (XLA may round a vector of 8 differently from one of 203 in the last bit), and
    the same neuron on a tie (the lowest index)."""
    kk = min(_SEARCH_K, found.shape[0])
    (idx,) = jnp.nonzero(found, size=kk, fill_value=0)
    sub = tuple(a[idx] for a in p)
    s = _solve(sub, lo[idx], hi[idx])
    s = jnp.where(jnp.arange(kk) < jnp.sum(found), s, jnp.inf)
    m = jnp.argmin(s)
    return idx[m].astype(jnp.int32), s[m]


@jax.custom_batching.custom_vmap
def _earliest_crossing(found, lo, hi, p):
    """The next threshold crossing of the network: `(neuron, time from now)`, time `inf`
    if no neuron reaches threshold in its bracket. Usually a few neurons have a bracket, so
    only those are searched; all are where more have one. Batched (`jax.vmap`), the choice
    is made once for the batch: a per-trial `cond` would become a select that searches every
    neuron of every trial anyway."""
    found = _candidates(found, lo, hi, p)
    many = jnp.sum(found) > min(_SEARCH_K, found.shape[0])
    return jax.lax.cond(many, _earliest_all, _earliest_few, found, lo, hi, p)


@_earliest_crossing.def_vmap
def _earliest_crossing_batched(axis_size, in_batched, found, lo, hi, p):
    leaves, tree = jax.tree_util.tree_flatten((found, lo, hi, tuple(p)))
    flags = jax.tree_util.tree_leaves(in_batched)
    leaves = [
        a if b else jnp.broadcast_to(a, (axis_size, *jnp.shape(a))) for a, b in zip(leaves, flags)
    ]
    found, lo, hi, p = jax.tree_util.tree_unflatten(tree, leaves)
    found = jax.vmap(_candidates)(found, lo, hi, p)
    args = (found, lo, hi, p)
    many = jnp.any(jnp.sum(found, axis=-1) > min(_SEARCH_K, found.shape[-1]))
    out = jax.lax.cond(
        many,
        lambda a: jax.vmap(_earliest_all)(*a),
        lambda a: jax.vmap(_earliest_few)(*a),
        args,
    )
    return out, (True, True)


@jax.custom_jvp
def _crossing_at(p, s):
    """`s`, the first time with `u(s; p) = theta` (found by `_solve`), with its
    implicit-function derivative."""
    return s


def _crossing_tangent(p, dp, s):
    # Implicit function theorem on u(s; p) - theta = 0: ds = -(du(s)|_s fixed - dtheta) / u'(s),
    # the spike-time derivative behind EventProp's jump conditions.
    u, i, tau_m, tau_s, r, theta = p

    def g(q):
        return _u_at(s, *q[:5]) - q[5]

    _, dg = jax.jvp(g, (p,), (dp,))
    return -dg / _du_at(s, u, i, tau_m, tau_s, r)


@_crossing_at.defjvp
def _crossing_at_jvp(primals, tangents):
    p, s = primals
    return s, _crossing_tangent(p, tangents[0], s)


def _advance(x, dt, tau_m, tau_s, r):
    """The closed-form solution over `dt` for every neuron, with the running integral and
    maximum of `u` (the maximum inside the interval at the turning point, closed form)."""
    u, i, vint, vmax = x
    a = jnp.exp(-dt / tau_m)
    c = tau_s / (tau_s - tau_m)
    u1 = a * u + r * i * c * _exprel_diff(dt, tau_s, tau_m)
    i1 = jnp.exp(-dt / tau_s) * i
    one_a = -jnp.expm1(-dt / tau_m)
    one_b = -jnp.expm1(-dt / tau_s)
    vint1 = vint + tau_m * one_a * u + r * i * c * (tau_s * one_b - tau_m * one_a)
    s_star, ahead = _turning_point(u, i, tau_m, tau_s, r)
    inside = ahead & (s_star < dt)
    u_star = _u_at(jnp.where(inside, s_star, 0.0), u, i, tau_m, tau_s, r)
    vmax1 = jnp.maximum(jnp.maximum(vmax, jnp.maximum(u, u1)), jnp.where(inside, u_star, -jnp.inf))
    return u1, i1, vint1, vmax1


def _pre_times(cfg, pj: _Proj, s_all, s_in):
    if pj.pre_input >= 0:
        t = s_in[pj.pre_input]
    else:
        t = s_all[pj.pre_off : pj.pre_off + pj.n_pre]
    return jnp.concatenate([t, jnp.full((t.shape[0], 1), jnp.inf, t.dtype)], axis=1)


def _arrival_args(cfg: _Cfg, j, k, i, s_all, s_in, prm):
    """What an arrival at spike `k` of presynaptic neuron `j` (synapse `(j, i)` where delays
    are per synapse) reads, for every projection: the spike time (`inf` past the last),
    the weight row or synapse, its mask and the delay. Indices are clipped into each
    projection's range; only the projection of the event's branch is used."""
    out = []
    for p, pj in enumerate(cfg.projs):
        jj = jnp.clip(j, 0, pj.n_pre - 1)
        if pj.pre_input >= 0:
            src, row = s_in[pj.pre_input], jj
        else:
            src, row = s_all, pj.pre_off + jj
        t_pre = jnp.where(k < src.shape[1], src[row, jnp.clip(k, 0, src.shape[1] - 1)], jnp.inf)
        w, m, d = prm["w"][p], prm["mask"][p], prm["d"][p]
        if pj.per_synapse:
            ii = jnp.clip(i, 0, pj.n_post - 1)
            out.append((t_pre, w[jj, ii], m[jj, ii], d[jj, ii]))
        else:
            out.append((t_pre, w[jj], m[jj], d))
    return tuple(out)


def _event(
    cfg: _Cfg,
    branch,
    j,
    k,
    i,
    x,
    t_prev,
    arr,
    prm,
    t_max,
    s_known,
    spiked=None,
):
    """One event, differentiable in `x`, `t_prev`, what the arrival reads (`arr`, from
    `_arrival_args`), the neuron parameters and `t_max`.

    `branch`: projection index for an arrival, `P` for a threshold crossing of neuron `i`
    after `s_known` ms (the forward pass's root, differentiated implicitly), `P + 1` for the
    end of the run. Returns `(x_after, t_event, spiked)`.
    """
    n = cfg.n
    n_p = len(cfg.projs)
    tau_m, tau_s, r, theta, u_r = prm["tau_m"], prm["tau_s"], prm["r"], prm["theta"], prm["u_r"]
    zero = jnp.zeros((n,), x[0].dtype)

    def arrival(p):
        pj = cfg.projs[p]

        def fn():
            t_pre, w, m, d = arr[p]
            t_e = t_pre + d
            if pj.per_synapse:
                w = jnp.zeros((pj.n_post,), w.dtype).at[i].set(w * m)
            else:
                w = w * m
            full = jax.lax.dynamic_update_slice(zero, w, (pj.post_off,))
            if pj.delta:
                return t_e, zero, full
            return t_e, full, zero

        return fn

    def threshold():
        q = (x[0][i], x[1][i], tau_m[i], tau_s[i], r[i], theta[i])
        return t_prev + _crossing_at(q, s_known), zero, zero

    def end():
        return t_max.astype(zero.dtype), zero, zero

    branches = [arrival(p) for p in range(n_p)] + [threshold, end]
    t_e, jump_i, jump_w = jax.lax.switch(branch, [lambda f=f: f() for f in branches])
    u, i_syn, vint, vmax = _advance(x, t_e - t_prev, tau_m, tau_s, r)
    u = u + r * jump_w / tau_m
    i_syn = i_syn + jump_i
    if spiked is None:
        delta = jnp.asarray(cfg.delta)
        spiking = jnp.asarray(cfg.spiking)
        crossed = (jnp.arange(n, dtype=jnp.int32) == i) & (branch == n_p)
        jumped = delta & spiking & (u >= theta) & (branch < n_p)
        spiked = crossed | jumped
    u = jnp.where(spiked, u_r, u)
    return (u, i_syn, vint, vmax), t_e, spiked


def _next_arrival(cfg, ptrs, s_all, s_in, prm):
    """Earliest undelivered arrival of every projection: (time, j, k, i) each."""
    out = []
    for p, pj in enumerate(cfg.projs):
        pre = _pre_times(cfg, pj, s_all, s_in)
        exists = prm["mask"][p] != 0
        if pj.per_synapse:
            ptr = ptrs[p]
            t = jnp.take_along_axis(pre, ptr, axis=1) + prm["d"][p]
            t = jnp.where(exists, t, jnp.inf)
            flat = jnp.argmin(t).astype(jnp.int32)
            j, i = flat // pj.n_post, flat % pj.n_post
            out.append((t[j, i], j, ptr[j, i], i))
        else:
            ptr = ptrs[p]
            t = pre[jnp.arange(pj.n_pre), ptr] + prm["d"][p]
            t = jnp.where(exists.any(axis=1), t, jnp.inf)
            j = jnp.argmin(t).astype(jnp.int32)
            out.append((t[j], j, ptr[j], jnp.zeros((), jnp.int32)))
    return out


# The residual buffers (one row per event) are written in place at row `e`. Under `jax.vmap`
# a while loop whose predicate differs between trials selects every carried array between
# its old and new value at every iteration, which for these buffers costs
# O(max_events * n) per event: 18x the whole gradient of a Yin-Yang batch at the default
# capacity. `_forward` therefore has its own batching rule: one loop over the batch that
# runs while any trial is active, selects only the small per-trial state, and lets a
# finished trial write its (never read) row `e` past its last event.
_BUFFERS = ("branch", "j", "kk", "i", "ts", "xs")


def _forward(cfg: _Cfg, prm, s_in, t_max):
    @jax.custom_batching.custom_vmap
    def run(prm, s_in, t_max):
        c0 = _forward_init(cfg, prm["tau_m"].dtype)
        return jax.lax.while_loop(
            lambda c: _forward_active(cfg, c),
            lambda c: _forward_body(cfg, c, prm, s_in, t_max),
            c0,
        )

    @run.def_vmap
    def _run_batched(axis_size, in_batched, prm, s_in, t_max):
        axes = jax.tree_util.tree_map(lambda b: 0 if b else None, in_batched)
        c0 = _forward_init(cfg, prm["tau_m"].dtype)
        c0 = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (axis_size, *a.shape)), c0)
        active = jax.vmap(functools.partial(_forward_active, cfg))
        body = jax.vmap(functools.partial(_forward_body, cfg), in_axes=(0, *axes))

        def step(c):
            on = active(c)
            new = body(c, prm, s_in, t_max)

            def keep(a, b):
                return jnp.where(on.reshape(on.shape + (1,) * (a.ndim - 1)), a, b)

            return {
                key: new[key] if key in _BUFFERS else jax.tree_util.tree_map(keep, new[key], c[key])
                for key in new
            }

        c = jax.lax.while_loop(lambda c: jnp.any(active(c)), step, c0)
        return c, jax.tree_util.tree_map(lambda _: True, c)

    return run(prm, s_in, t_max)


def _forward_active(cfg: _Cfg, c):
    return ~c["done"] & (c["e"] < cfg.max_events)


def _forward_init(cfg: _Cfg, dtype):
    n, k, e_max = cfg.n, cfg.k, cfg.max_events
    zero = jnp.zeros((n,), dtype)
    x0 = (zero, zero, zero, zero)
    ptrs0 = tuple(
        jnp.zeros((pj.n_pre, pj.n_post) if pj.per_synapse else (pj.n_pre,), jnp.int32)
        for pj in cfg.projs
    )
    ints = jnp.zeros((e_max,), jnp.int32)
    carry0 = dict(
        e=jnp.zeros((), jnp.int32),
        t=jnp.zeros((), dtype),
        x=x0,
        s=jnp.full((n, k), jnp.inf, dtype),
        eidx=jnp.full((n, k), -1, jnp.int32),
        counts=jnp.zeros((n,), jnp.int32),
        ptrs=ptrs0,
        overflow=jnp.zeros((), bool),
        done=jnp.zeros((), bool),
        branch=ints,
        j=ints,
        kk=ints,
        i=ints,
        ts=jnp.zeros((e_max,), dtype),
        xs=jnp.zeros((e_max, 2, n), dtype),
        vmax_e=jnp.full((n,), -1, jnp.int32),
    )
    return carry0


def _forward_body(cfg: _Cfg, c, prm, s_in, t_max):
    """One event of the forward run: find the next arrival or crossing, apply it, and
    write its row of the residual buffers."""
    n, k, n_p = cfg.n, cfg.k, len(cfg.projs)
    dtype = prm["tau_m"].dtype
    spiking = jnp.asarray(cfg.spiking) & ~jnp.asarray(cfg.delta)
    t, x = c["t"], c["x"]
    arr = _next_arrival(cfg, c["ptrs"], c["s"], s_in, prm)
    if arr:
        t_arr = jnp.stack([a[0] for a in arr])
        p_star = jnp.argmin(t_arr).astype(jnp.int32)
        t_a = t_arr[p_star]
        pick = lambda q: jnp.stack([jnp.asarray(a[q], jnp.int32) for a in arr])[p_star]  # noqa: E731
        j, kk, i_a = pick(1), pick(2), pick(3)
    else:
        t_a = jnp.asarray(jnp.inf, dtype)
        p_star = j = kk = i_a = jnp.zeros((), jnp.int32)
    bound = jnp.minimum(t_a, t_max)
    horizon = jnp.maximum(bound - t, 0.0)
    lo, hi, found = _bracket(
        x[0], x[1], prm["tau_m"], prm["tau_s"], prm["r"], prm["theta"], horizon
    )
    found = found & spiking
    p_now = (x[0], x[1], prm["tau_m"], prm["tau_s"], prm["r"], prm["theta"])
    i_c, s_c = _earliest_crossing(found, lo, hi, p_now)
    t_c = t + s_c
    is_cross = t_c < t_a
    is_arr = ~is_cross & (t_a <= t_max)
    branch = jnp.where(is_cross, n_p, jnp.where(is_arr, p_star, n_p + 1)).astype(jnp.int32)
    i_ev = jnp.where(is_cross, i_c, i_a)
    # the crossing time just found is reused (no second search inside the event)
    arr_args = _arrival_args(cfg, j, kk, i_ev, c["s"], s_in, prm)
    x1, t_e, spiked = _event(cfg, branch, j, kk, i_ev, x, t, arr_args, prm, t_max, s_c)
    e = c["e"]
    slot = jnp.minimum(c["counts"], k - 1)
    room = c["counts"] < k
    rows = jnp.arange(n)
    write = spiked & room
    s_new = c["s"].at[rows, slot].set(jnp.where(write, t_e, c["s"][rows, slot]))
    eidx = c["eidx"].at[rows, slot].set(jnp.where(write, e, c["eidx"][rows, slot]))
    ptrs = list(c["ptrs"])
    for p, pj in enumerate(cfg.projs):
        hit = is_arr & (p_star == p)
        if pj.per_synapse:
            ptrs[p] = ptrs[p].at[j, i_a].add(hit.astype(jnp.int32))
        else:
            ptrs[p] = ptrs[p].at[j].add(hit.astype(jnp.int32))
    out = dict(c)
    out.update(
        e=e + 1,
        t=t_e,
        x=x1,
        s=s_new,
        eidx=eidx,
        counts=c["counts"] + spiked.astype(jnp.int32),
        ptrs=tuple(ptrs),
        overflow=c["overflow"] | jnp.any(spiked & ~room),
        done=branch == n_p + 1,
        branch=c["branch"].at[e].set(branch),
        j=c["j"].at[e].set(j),
        kk=c["kk"].at[e].set(kk),
        i=c["i"].at[e].set(i_ev),
        ts=c["ts"].at[e].set(t_e),
        xs=c["xs"].at[e].set(jnp.stack((x[0], x[1]))),
        # the event at which each neuron's running maximum was last raised: the backward
        # pass routes the maximum's cotangent to that event alone, so the maximum itself
        # needs no row per event
        vmax_e=jnp.where(x1[3] > x[3], e, c["vmax_e"]),
    )
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _run(cfg, prm, s_in, t_max):
    c = _forward(cfg, prm, s_in, t_max)
    return _outputs(c)


def _outputs(c):
    # overflow code: 1 a neuron fired more than max_spikes, 2 the run needed more events
    code = jnp.where(c["overflow"], 1, jnp.where(c["done"], 0, 2)).astype(jnp.int32)
    return c["s"], c["counts"], c["x"], c["e"], code


def _run_fwd(cfg, prm, s_in, t_max):
    c = _forward(cfg, prm, s_in, t_max)
    keys = ("s", "eidx", "e", "branch", "j", "kk", "i", "ts", "xs", "vmax_e")
    res = {key: c[key] for key in keys}
    return _outputs(c), (prm, s_in, t_max, res)


_NEURON_KEYS = ("tau_m", "tau_s", "r", "theta", "u_r")


def _run_bwd(cfg, saved, cts):
    prm, s_in, t_max, res = saved
    ct_s, _, ct_x, _, _ = cts
    zeros_like = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)  # noqa: E731
    ct_x = tuple(ct_x)
    s_all = res["s"]
    eidx = res["eidx"]
    e_max = cfg.max_events
    # a spike's time is read at its arrivals and set at the event that made it: its
    # cotangent is gathered per making event (one number per event, not one per neuron and
    # spike slot), from the loss here and from each arrival as the backward pass meets it
    ct_s = jnp.where(jnp.isfinite(s_all), ct_s, 0.0)
    ct_ev = (
        jnp.zeros((e_max,), ct_s.dtype).at[jnp.where(eidx >= 0, eidx, e_max)].add(ct_s, mode="drop")
    )
    nprm = {key: prm[key] for key in _NEURON_KEYS}

    def cond(c):
        return c["e"] >= 0

    def body(c):
        e = c["e"]
        br, j, kk, ii = res["branch"][e], res["j"][e], res["kk"][e], res["i"][e]
        # the running integral never changes a derivative (it only adds), so it is not
        # stored: zeros stand in for it
        u_b, i_b = res["xs"][e, 0], res["xs"][e, 1]
        # the running maximum before this event stands in as -inf where the final maximum
        # was reached at this event (its cotangent goes to this event's candidates) and as
        # +inf elsewhere (the cotangent passes on to earlier events, or was spent later)
        vmax_b = jnp.where(res["vmax_e"] == e, -jnp.inf, jnp.inf).astype(u_b.dtype)
        x_b = (u_b, i_b, jnp.zeros_like(u_b), vmax_b)
        t_prev = jnp.where(e > 0, res["ts"][jnp.maximum(e - 1, 0)], 0.0).astype(res["ts"].dtype)
        spiked = (eidx == e).any(axis=1)
        ct_te = c["ct_t"] + c["ct_ev"][e]
        # a crossing's time is not searched again: the forward's value, a constant here
        s_known = res["ts"][e] - t_prev
        arr = _arrival_args(cfg, j, kk, ii, s_all, s_in, prm)

        def f(x_b, t_prev, arr, nprm, t_max):
            x1, t_e, _ = _event(
                cfg, br, j, kk, ii, x_b, t_prev, arr, nprm, t_max, s_known, spiked=spiked
            )
            return x1, t_e

        _, vjp = jax.vjp(f, x_b, t_prev, arr, nprm, t_max)
        gx, gt, garr, gn, gtmax = vjp((c["ct_x"], ct_te))
        # the arrival's cotangents go to the one spike, row or synapse and delay it read
        ct_ev, ct_sin = c["ct_ev"], list(c["ct_sin"])
        ct_w, ct_d = list(c["ct_w"]), list(c["ct_d"])
        for p, pj in enumerate(cfg.projs):
            on = br == p
            g_pre, g_w, _, g_d = (jnp.where(on, g, jnp.zeros_like(g)) for g in garr[p])
            jj = jnp.clip(j, 0, pj.n_pre - 1)
            if pj.pre_input >= 0:
                ct_sin[pj.pre_input] = ct_sin[pj.pre_input].at[jj, kk].add(g_pre, mode="drop")
            else:
                src = eidx[pj.pre_off + jj, jnp.clip(kk, 0, cfg.k - 1)]
                at = jnp.where(on & (kk < cfg.k) & (src >= 0), src, e_max)
                ct_ev = ct_ev.at[at].add(g_pre, mode="drop")
            if pj.per_synapse:
                i_c = jnp.clip(ii, 0, pj.n_post - 1)
                ct_w[p] = ct_w[p].at[jj, i_c].add(g_w)
                ct_d[p] = ct_d[p].at[jj, i_c].add(g_d)
            else:
                ct_w[p] = ct_w[p].at[jj].add(g_w)
                ct_d[p] = ct_d[p] + g_d
        add = lambda a, b: jax.tree_util.tree_map(jnp.add, a, b)  # noqa: E731
        return dict(
            e=e - 1,
            ct_x=gx,
            ct_t=gt,
            ct_ev=ct_ev,
            ct_sin=type(c["ct_sin"])(ct_sin),
            ct_w=ct_w,
            ct_d=ct_d,
            ct_n=add(c["ct_n"], gn),
            ct_tmax=c["ct_tmax"] + gtmax,
        )

    c0 = dict(
        e=res["e"] - 1,
        ct_x=ct_x,
        ct_t=jnp.zeros((), res["ts"].dtype),
        ct_ev=ct_ev,
        ct_sin=zeros_like(s_in),
        ct_w=zeros_like(prm["w"]),
        ct_d=zeros_like(prm["d"]),
        ct_n=zeros_like(nprm),
        ct_tmax=jnp.zeros_like(t_max),
    )
    c = jax.lax.while_loop(cond, body, c0)
    ct_prm = dict(c["ct_n"], w=c["ct_w"], d=c["ct_d"], mask=zeros_like(prm["mask"]))
    return ct_prm, c["ct_sin"], c["ct_tmax"]


_run.defvjp(_run_fwd, _run_bwd)

# One compiled program per network layout: called eagerly (outside `jax.jit`), `eventprop_run`
# would otherwise trace and compile its while loops again on every call (about a second each).
# Under an enclosing `jax.jit`, `jax.vmap` or `jax.grad` this is inlined like any jitted call.
_run_jit = jax.jit(_run, static_argnums=0)


def _per_neuron(value, n, dtype):
    return jnp.broadcast_to(jnp.asarray(value, dtype), (n,))


def default_max_events(net: EventNetwork, k_in: Any, max_spikes: int) -> int:
    r"""The event capacity `eventprop_run` uses by default: the most events a run of `net`
    can process when each input neuron of input `q` gives `k_in[q]` spikes and no neuron
    fires more than `max_spikes` times.

    Every spike makes one arrival event per outgoing projection with a scalar delay (all
    its targets at once) and `n_post` arrival events per outgoing projection with a delay
    per synapse; every spike of a neuron fed through `nj.Exponential` synapses is also its
    own threshold-crossing event; one event ends the run:

    $$E = 1 + \sum_{\text{inputs}} n\,k_\text{in}\,a
            + \sum_{\text{populations}} n\,\text{max\_spikes}\,(c + a),$$

    with `a` the arrivals per spike (the sum over the source's projections of 1 or
    `n_post`) and `c` 1 for a spiking population fed through exponential synapses, else 0.
    """
    if isinstance(k_in, (int, np.integer)):
        k_in = [int(k_in)] * len(net.inputs)
    k_in = list(k_in)
    if len(k_in) != len(net.inputs):
        raise ValueError(
            f"default_max_events: k_in must give one count per input {list(net.inputs)}, got "
            f"{k_in!r}"
        )

    def arrivals(name):
        return sum(p.n_post if p.per_synapse_delay else 1 for p in net.projections if p.pre == name)

    syn_of = {p.post: p.synapse for p in net.projections}
    total = 1
    for (name, size), k in zip(net.inputs.items(), k_in, strict=True):
        total += size * int(k) * arrivals(name)
    for name, size in net.sizes.items():
        spiking = name not in net.readouts
        crossing = spiking and isinstance(syn_of.get(name), Exponential)
        if spiking:
            total += size * int(max_spikes) * (int(crossing) + arrivals(name))
    return int(total)


def eventprop_run(
    net: EventNetwork,
    input_spikes: Mapping[str, Any],
    *,
    t_max: float,
    max_spikes: int = 4,
    max_events: int | None = None,
) -> EventRecording:
    r"""Simulate `net` event by event over `[0, t_max]` ms; differentiable with EventProp.

    Every array leaf of `net` (weights, delays, the synapses' `tau`, the neurons' `tau_m`,
    `r_m`, `v_th`, `v_reset`, `v_rest`) and the input spike times get exact gradients
    (`jax.grad` through this function runs the adjoint pass of Wunderlich and Pehle 2021),
    as long as the loss does not depend on the order of coincident events. Works under
    `jax.jit` and `jax.vmap` (one trial per call; vmap over trials).

    Args:
        net: the `EventNetwork`.
        input_spikes: `{input name: times}` with `times` of shape `(n, k_in)` [ms], each
            neuron's spike times (any order), `+inf` for no spike; times must be >= 0.
        t_max: duration [ms] (> 0).
        max_spikes: spikes kept per neuron (static); a neuron that fires more raises.
        max_events: events the run may process (static; arrivals, crossings and the end).
            The default, `default_max_events`, is the most a run can need when no neuron
            fires more than `max_spikes` times, so it is never exceeded (a neuron that fires
            more raises instead). A smaller value saves memory (the backward pass keeps 2
            numbers per neuron per event); a run that needs more than it raises, and
            `EventRecording.n_events` says how many a run used.

    Returns:
        `EventRecording`.
    """
    owner = "eventprop_run"
    if not isinstance(net, EventNetwork):
        raise TypeError(f"{owner}: net must be an EventNetwork, got {type(net).__name__}")
    if (
        isinstance(max_spikes, bool)
        or not isinstance(max_spikes, (int, np.integer))
        or max_spikes < 1
    ):
        raise ValueError(f"{owner}: max_spikes must be a positive int, got {max_spikes!r}")
    if not isinstance(input_spikes, Mapping) or set(input_spikes) != set(net.inputs):
        got = (
            sorted(input_spikes)
            if isinstance(input_spikes, Mapping)
            else type(input_spikes).__name__
        )
        raise ValueError(
            f"{owner}: input_spikes must give times for exactly the inputs {sorted(net.inputs)}, "
            f"got {got}"
        )
    if isinstance(t_max, bool) or not isinstance(
        t_max, (int, float, np.floating, np.integer, jax.Array)
    ):
        raise TypeError(f"{owner}: t_max must be a number of ms, got {t_max!r}")
    if is_concrete(t_max) and not (float(t_max) > 0 and math.isfinite(float(t_max))):
        raise ValueError(f"{owner}: t_max must be a finite number of ms > 0, got {t_max!r}")
    names = list(net.sizes)
    offsets, off = {}, 0
    for name in names:
        offsets[name] = off
        off += net.sizes[name]
    n = off
    in_names = list(net.inputs)
    dtype = (
        jnp.result_type(*[p.weight for p in net.projections])
        if net.projections
        else jnp.result_type(float)
    )
    s_in = []
    for name in in_names:
        t = jnp.asarray(input_spikes[name])
        if t.ndim == 1:
            t = t[:, None]
        if t.ndim != 2 or t.shape[0] != net.inputs[name]:
            raise ValueError(
                f"{owner}: input_spikes[{name!r}] must have shape ({net.inputs[name]}, k_in), got "
                f"{t.shape}"
            )
        if not jnp.issubdtype(t.dtype, jnp.floating):
            t = t.astype(dtype)
        if is_concrete(t):
            a = np.asarray(t)
            if np.any(np.isnan(a)) or np.any(a < 0):
                raise ValueError(
                    f"{owner}: input_spikes[{name!r}] must be >= 0 ms or +inf (no spike), got "
                    f"minimum {np.nanmin(a) if not np.all(np.isnan(a)) else 'nan'}"
                )
        s_in.append(jnp.sort(t.astype(dtype), axis=1))
    if max_events is None:
        max_events = default_max_events(net, [int(t.shape[1]) for t in s_in], max_spikes)
    elif (
        isinstance(max_events, bool)
        or not isinstance(max_events, (int, np.integer))
        or max_events < 2
    ):
        raise ValueError(f"{owner}: max_events must be an int >= 2, got {max_events!r}")

    tau_m, tau_s, r, theta, u_r, v_rest = [], [], [], [], [], []
    delta, spiking = [], []
    syn_of = {p.post: p.synapse for p in net.projections}
    for name in names:
        m, size = net.populations[name], net.sizes[name]
        tm = _per_neuron(m.tau_m, size, dtype)
        syn = syn_of.get(name)
        is_delta = isinstance(syn, Delta) or syn is None
        ts = jax.lax.stop_gradient(0.5 * tm) if is_delta else _per_neuron(syn.tau, size, dtype)
        vr = _per_neuron(m.v_rest, size, dtype)
        tau_m.append(tm)
        tau_s.append(ts)
        r.append(_per_neuron(m.r_m, size, dtype))
        spk = name not in net.readouts
        th = _per_neuron(m.v_th, size, dtype) - vr
        theta.append(th if spk else jnp.full((size,), jnp.inf, dtype))
        u_r.append(_per_neuron(m.v_reset, size, dtype) - vr)
        v_rest.append(vr)
        delta += [is_delta] * size
        spiking += [spk] * size
    cat = jnp.concatenate
    projs = []
    for p in net.projections:
        pre_input = in_names.index(p.pre) if p.pre in net.inputs else -1
        projs.append(
            _Proj(
                pre_input=pre_input,
                pre_off=offsets.get(p.pre, 0),
                n_pre=p.n_pre,
                post_off=offsets[p.post],
                n_post=p.n_post,
                per_synapse=p.per_synapse_delay,
                delta=isinstance(p.synapse, Delta),
            )
        )
    cfg = _Cfg(
        n=n,
        k=int(max_spikes),
        max_events=int(max_events),
        projs=tuple(projs),
        delta=tuple(delta),
        spiking=tuple(spiking),
    )
    d_list = []
    for p in net.projections:
        d = p.delay.astype(dtype)
        d = eqx.error_if(
            d,
            jnp.any(jax.lax.stop_gradient(d) < 0),
            f"{owner}: a delay became negative; delays must stay >= 0 ms",
        )
        d_list.append(d)
    prm = dict(
        w=[p.weight.astype(dtype) for p in net.projections],
        d=d_list,
        mask=[jax.lax.stop_gradient(p.mask.astype(dtype)) for p in net.projections],
        tau_m=cat(tau_m),
        tau_s=cat(tau_s),
        r=cat(r),
        theta=cat(theta),
        u_r=cat(u_r),
    )
    t_max_arr = jnp.asarray(t_max, dtype)
    s, counts, x, n_events, overflow = _run_jit(cfg, prm, s_in, t_max_arr)
    s = eqx.error_if(
        s,
        overflow == 1,
        f"{owner}: a neuron fired more than max_spikes={max_spikes} spikes; raise max_spikes",
    )
    s = eqx.error_if(
        s,
        overflow == 2,
        f"{owner}: the run needed more than max_events={max_events} events; raise max_events",
    )
    vr_all = cat(v_rest)
    u, _, vint, vmax = x
    out = {key: {} for key in ("s", "c", "max", "int", "fin")}
    for name in names:
        sl = slice(offsets[name], offsets[name] + net.sizes[name])
        out["s"][name] = s[sl]
        out["c"][name] = counts[sl]
        out["max"][name] = vmax[sl] + vr_all[sl]
        out["int"][name] = vint[sl] + vr_all[sl] * t_max_arr
        out["fin"][name] = u[sl] + vr_all[sl]
    return EventRecording(
        spike_times=out["s"],
        counts=out["c"],
        v_max=out["max"],
        v_integral=out["int"],
        v_final=out["fin"],
        n_events=n_events,
        t_max=t_max_arr,
    )


def _describe_refusal(model: Any) -> str:
    """Why `model` cannot run with `gradient="eventprop"`, in one sentence."""
    name = type(model).__name__
    projections = getattr(model, "projections", None)
    if projections is not None and hasattr(model, "sizes"):  # an nj.Network
        for k, p in enumerate(projections):
            out = getattr(p, "output", None)
            if out is not None and not isinstance(out, CurrentOutput):
                return (
                    f"projections[{k}] ({p.pre} -> {p.post}) has a "
                    f"{type(out).__name__}: EventProp supports current-based synapses only (a "
                    "conductance makes the input depend on v and the sub-threshold solution is "
                    "no longer closed form)"
                )
        return (
            "an nj.Network runs on a time grid (delays rounded to steps, spikes dated at the end "
            "of a step); for exact spike times build the same populations and projections as an "
            "nj.training.EventNetwork of nj.training.EventProjection"
        )
    if type(model) is LIF:
        return (
            "an uncoupled nj.LIF population has no synaptic input to learn from; wrap it in an "
            "nj.training.EventNetwork with an input population and projections"
        )
    if hasattr(model, "step") and hasattr(model, "init_state"):
        return (
            f"{name} has no exact spike time (Izhikevich, AdEx and Hodgkin-Huxley neurons have "
            "no closed-form sub-threshold solution and no fixed threshold), so EventProp's jump "
            "conditions do not apply"
        )
    return f"{name} is not an nj.training.EventNetwork"


_GRID_DEFAULTS = dict(
    record=None,
    record_every=1,
    chunk_size=None,
    progress=False,
    check=False,
    unroll=1,
    batch_block=None,
    checkpoint=False,
    truncate_backprop=None,
    start=None,
)


def simulate_eventprop(
    model: Any,
    state: Any,
    inputs: Any,
    *,
    dt: float,
    n_steps: int | None,
    gradient: str = "eventprop",
    options: Mapping[str, Any] | None = None,
    max_spikes: int = 4,
    max_events: int | None = None,
) -> tuple[None, EventRecording]:
    """`nj.simulate(..., gradient="eventprop")`: run an `EventNetwork` for `n_steps * dt` ms
    event by event (see `eventprop_run`); `state` must be `None` (the network starts at
    rest) and `inputs` the input spike times `{input name: (n, k_in) times}`. Options of
    `simulate` that belong to the time grid (`record`, `chunk_size`, `checkpoint`, ...) are
    refused rather than ignored when `options` (their values) differ from the defaults."""
    if gradient != "eventprop":
        raise ValueError(f"simulate: gradient must be 'surrogate' or 'eventprop', got {gradient!r}")
    owner = "simulate(gradient='eventprop')"
    unsupported = {
        k: v
        for k, v in (options or {}).items()
        if not (
            v is _GRID_DEFAULTS[k]
            or (type(v) is type(_GRID_DEFAULTS[k]) and v == _GRID_DEFAULTS[k])
        )
    }
    if not isinstance(model, EventNetwork):
        raise TypeError(f"{owner}: {_describe_refusal(model)}; or use gradient='surrogate'")
    if state is not None:
        raise ValueError(
            f"{owner}: state must be None (an EventNetwork starts at rest), got "
            f"{type(state).__name__}"
        )
    for name, value in unsupported.items():
        raise ValueError(
            f"{owner}: {name}={value!r} belongs to the time-grid simulation and is not "
            "supported with EventProp (which records exact spike times, voltage maxima and "
            "integrals); leave it at its default"
        )
    if n_steps is None:
        raise ValueError(f"{owner}: give n_steps (the run lasts n_steps * dt ms)")
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"{owner}: inputs must be the input spike times {{input name: (n, k_in) array}}, "
            f"got {type(inputs).__name__}"
        )
    return None, eventprop_run(
        model, inputs, t_max=n_steps * dt, max_spikes=max_spikes, max_events=max_events
    )
