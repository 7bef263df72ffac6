r"""The phases of one network step, shared by `nj.Network` and the sharded network.

A step is four phases, called in this order by `Network.step` and by the local step of
`nj.parallel.shard_network` (which adds the exchange of spikes between devices before the
last one):

1. `arrivals`: read the weight arriving now from every ring buffer and advance every
   projection's synaptic kinetics (the slot read is zeroed by `delivery`, see below);
2. `integrate`: step every group of populations with its total input current
   (`total_current`), spike sources with their own step;
3. `plasticity`: update the plastic weights from this step's arrivals and spikes;
4. `delivery`: add this step's spikes into the ring buffers of the outgoing projections,
   each projection through its layout (`neurojax.network._layout`). A projection with
   short-term plasticity first turns its presynaptic spikes into releases (`short_term`,
   `nj.TsodyksMarkram`), which it delivers instead of the 0/1 spikes; a projection with
   learnable delays delivers each spike at the two whole-step delays around its delay, with
   linearly interpolated weights (`split_delays`).

**Rings in place.** A ring is read in phase 1 and written in phase 4. XLA updates it in
place (instead of copying the whole ring every step) only if it can see that every reader
of the slot runs before the first write, and it sees data dependencies only. So phase 1
only reads; phase 4 zeroes the slot read (`step mod D`) and adds the spikes, both through
values computed from spikes that the readers fed: the sending group's own spikes when the
ring feeds back into its group, and otherwise an exact zero computed from the spikes of the
groups the ring reaches (`neurojax.network._propagation.zero_after`). A layout whose
delivery is a compiled call on an aliased buffer zeroes the slot inside that call
(`Layout.clears_slot`).

What a phase needs of the network's structure is a `Plan` (static: groups, sizes, who
projects where, ring offsets); what differs between the single-device and the sharded
network (the sizes of the local blocks, the layouts and parameters each device holds, the
padding mask, the per-device step of a spike source) is handed in by the caller.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from ._layout import Delivery, Layout
from ._plastic import plastic_step
from ._propagation import clear_slot, zero_after
from ._sources import SpikeSource

__all__ = [
    "Plan",
    "arrivals",
    "total_current",
    "integrate",
    "plasticity",
    "short_term",
    "split_delays",
    "delivery",
    "peaks",
]


class Plan(NamedTuple):
    """The static structure one step walks over.

    Attributes:
        groups: names of the populations stepped together, per group.
        sizes: neurons per population in the arrays of this step (on a device of a sharded
            network, its block).
        pre, post: presynaptic and postsynaptic population of every projection.
        ring_of: per projection, `(ring index, column offset)` of its targets.
        senders: per ring, `(sending group index, projection indices)`.
        delay_steps: per projection, its delay in steps when homogeneous, else None.
        capacity: the spike buffer of one trial in the pure-JAX event path (spikes per step
            of a group, arrivals and postsynaptic spikes of a plastic projection), or None for
            the whole group (see `nj.Network.fit_capacity`).
        synapse_of: per projection, the projection whose ring columns and synaptic state it
            shares (itself when it has its own; `nj.Network(..., merge_synapses=True)`), or
            None when every projection has its own. Only the first projection of a shared set
            advances the kinetics and contributes a current; the state of the others stays
            at zero.
    """

    groups: tuple[tuple[str, ...], ...]
    sizes: Mapping[str, int]
    pre: tuple[str, ...]
    post: tuple[str, ...]
    ring_of: tuple[tuple[int, int], ...]
    senders: tuple[tuple[int, tuple[int, ...]], ...]
    delay_steps: tuple[int | None, ...]
    capacity: int | None = None
    synapse_of: tuple[int, ...] | None = None

    def shares(self, i: int) -> bool:
        """Whether projection `i` delivers into another projection's columns and state."""
        return self.synapse_of is not None and self.synapse_of[i] != i

    def offset(self, name: str) -> int:
        """Where population `name` starts in the spike vector of its group."""
        for names in self.groups:
            if name in names:
                return sum(self.sizes[n] for n in names[: names.index(name)])
        raise KeyError(name)

    def group_of(self, name: str) -> int:
        """Index of the group that holds population `name`."""
        return next(gi for gi, names in enumerate(self.groups) if name in names)


def arrivals(
    plan: Plan,
    kinetics: Sequence[Any],
    synapse_states: Sequence[Any],
    buffers: Sequence[jax.Array],
    step: jax.Array,
    dt: float,
) -> tuple[list[jax.Array], list[bool], list[Any], list[jax.Array]]:
    """Phase 1: read slot `step mod D` of every ring `(*batch, D, W)` and advance the
    kinetics of every projection with the weight that arrives for its targets.

    Returns the rings (unchanged: `delivery` zeroes the slot read before it adds this
    step's spikes), per ring whether it has one slot (handed to delivery as "fresh": its
    content no longer counts), the new kinetics states and `g` per projection (None for a
    projection that shares another's columns and state, `Plan.synapse_of`: its arrivals are
    in the other's `g`).
    """
    rings, rows, fresh = list(buffers), [], []
    for buf in buffers:
        fresh.append(buf.shape[-2] == 1)
        if buf.shape[-2] == 1:
            rows.append(buf[..., 0, :])
        else:
            slot = step % buf.shape[-2]
            rows.append(lax.dynamic_index_in_dim(buf, slot, axis=buf.ndim - 2, keepdims=False))
    synapses, g = [], []
    for i, (syn, syn_state) in enumerate(zip(kinetics, synapse_states, strict=True)):
        if plan.shares(i):
            synapses.append(syn_state)
            g.append(None)
            continue
        si, off = plan.ring_of[i]
        x = rows[si][..., off : off + plan.sizes[plan.post[i]]]
        syn_state, g_i = syn.step(syn_state, x, dt)
        synapses.append(syn_state)
        g.append(g_i)
    return rings, fresh, synapses, g


def total_current(
    plan: Plan,
    name: str,
    state: Any,
    outputs: Sequence[Any],
    g: Sequence[jax.Array],
    inputs: Mapping[str, Any],
    ext: Mapping[str, Any] | None,
    gaps: Mapping[str, Any],
    t: jax.Array,
) -> Any:
    """The input current of population `name` (None if nothing reaches it), summed in a fixed
    order: projections onto it (in the network's order), constant or `t -> current` input,
    external current, gap junctions. Only the terms that need it read the state's `v` (the
    network checks at construction that those populations have one)."""
    v = getattr(state, "v", None)
    terms = [
        outputs[i](g[i], v) for i, post in enumerate(plan.post) if post == name and g[i] is not None
    ]
    if name in inputs:
        value = inputs[name]
        terms.append(value(t) if callable(value) else value)
    if ext is not None and name in ext:
        terms.append(ext[name])
    if name in gaps:
        terms.append(gaps[name].current(v))
    current = None
    for term in terms:
        current = term if current is None else current + term
    return current


def _neuron_leaf(state: Any) -> jax.Array:
    """A per-neuron float leaf of a state (its `v` when it has one): batch shape and dtype."""
    v = getattr(state, "v", None)
    if v is not None:
        return v
    return next(
        x for x in jtu.tree_leaves(state) if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim
    )


def integrate(
    plan: Plan,
    group_models: Sequence[Any],
    populations: Mapping[str, Any],
    current: Callable[[str], Any],
    dt: float,
    *,
    source_step: Callable[[str, SpikeSource, Any], tuple[Any, jax.Array]],
    valid: Sequence[jax.Array] | None = None,
) -> tuple[dict[str, Any], dict[str, jax.Array], list[jax.Array]]:
    """Phase 2: step every group of populations.

    A group of several populations is stepped as one concatenated population. `current(name)`
    gives a population's input (see `total_current`); `source_step(name, source, state)`
    steps a spike source; `valid[g]` (optional) masks the spikes of group `g` (padding
    neurons of a sharded network never spike).

    Returns the new population states, the spikes per population and per group.
    """
    pops, spikes, group_spikes = {}, {}, []
    for gi, (names, model) in enumerate(zip(plan.groups, group_models, strict=True)):
        if isinstance(model, SpikeSource):
            (name,) = names
            pops[name], s_group = source_step(name, model, populations[name])
        elif len(names) == 1:
            (name,) = names
            pops[name], s_group = model.step(populations[name], current(name), dt)
        else:
            currents = [current(n) for n in names]
            members = [populations[n] for n in names]
            joined = jtu.tree_map(lambda *xs: jnp.concatenate(xs, axis=-1), *members)
            if all(c is None for c in currents):
                joined_current = None
            else:
                like = _neuron_leaf(members[0])
                batch, dtype = like.shape[:-1], like.dtype
                joined_current = jnp.concatenate(
                    [
                        jnp.broadcast_to(
                            jnp.zeros((), dtype) if c is None else jnp.asarray(c, dtype),
                            batch + (plan.sizes[n],),
                        )
                        for c, n in zip(currents, names, strict=True)
                    ],
                    axis=-1,
                )
            new, s_group = model.step(joined, joined_current, dt)
            off = 0
            for n in names:
                size = plan.sizes[n]
                pops[n] = jtu.tree_map(lambda x, o=off, m=size: x[..., o : o + m], new)
                off += size
        if valid is not None:
            s_group = jnp.where(valid[gi], s_group, jnp.zeros((), s_group.dtype))
        group_spikes.append(s_group)
        if len(names) == 1 and valid is None:
            spikes[names[0]] = s_group
            continue
        off = 0
        for n in names:
            spikes[n] = s_group[..., off : off + plan.sizes[n]]
            off += plan.sizes[n]
    return pops, spikes, group_spikes


def plasticity(
    plan: Plan,
    projections: Sequence[Any],
    plastic_states: Sequence[Any],
    group_spikes: Sequence[jax.Array],
    step: jax.Array,
    dt: float,
    modulators: Mapping[str, Any] | None = None,
) -> tuple[tuple[Any, ...], list[tuple[int, jax.Array]]]:
    """Phase 3: the plastic states after this step's arrivals and spikes.

    The rule reads this step's spikes out of the whole group's spike vector (the one that
    delivery reads too) at the population's offset, so that XLA computes them once.
    `modulators` holds this step's value of every neuromodulator a rule reads (by name).

    Returns the states and `(group index, needed)` pairs: the spike buffer each plastic
    projection needed beyond `plan.capacity` for the arrivals from its presynaptic group and
    the spikes of its postsynaptic group (0 when it held them all).
    """
    out = list(plastic_states)
    needs = []
    for i, proj in enumerate(projections):
        if proj.plasticity is None:
            continue
        out[i], (need_pre, need_post) = plastic_step(
            proj,
            plastic_states[i],
            group_spikes[plan.group_of(plan.pre[i])],
            plan.offset(plan.pre[i]),
            group_spikes[plan.group_of(plan.post[i])],
            plan.offset(plan.post[i]),
            step,
            dt,
            plan.capacity,
            (modulators or {}).get(proj.plasticity.modulator_name()),
        )
        needs += [(plan.group_of(plan.pre[i]), need_pre), (plan.group_of(plan.post[i]), need_post)]
    return tuple(out), needs


def short_term(
    plan: Plan,
    projections: Sequence[Any],
    states: Sequence[Any],
    group_spikes: Sequence[jax.Array],
    step: jax.Array,
    dt: float,
) -> tuple[tuple[Any, ...], list[jax.Array | None]]:
    """Short-term plasticity of every projection that has it (`nj.TsodyksMarkram`): the new
    states and, per projection, its presynaptic population's releases `s u+ R-` (None
    without short-term plasticity), which delivery sends instead of the spikes. Elementwise
    over the presynaptic neurons."""
    out, releases = list(states), [None] * len(projections)
    for i, proj in enumerate(projections):
        if proj.short_term is None:
            continue
        pre = plan.pre[i]
        off, n = plan.offset(pre), plan.sizes[pre]
        s = group_spikes[plan.group_of(pre)][..., off : off + n]
        out[i], releases[i] = proj.short_term.release(states[i], s, step, dt)
    return tuple(out), releases


def split_delays(delay: jax.Array, dt: float, max_delay: float) -> tuple[jax.Array, jax.Array]:
    r"""Learnable delays `delay` [ms] as whole steps `k` (int32) and a fraction `f` in
    `[0, 1)`: `delay / dt = k + f`, clamped to `[0, max_delay / dt]`.

    A ratio within a relative 1e-5 of a whole number counts as that whole number (the float
    error of `delay / dt`, as `delay_steps` absorbs it for fixed delays), through a
    straight-through correction that keeps the gradient `d f / d delay = 1 / dt`.
    """
    d = jnp.clip(delay / dt, 0.0, max_delay / dt)
    whole = jnp.round(d)
    snapped = jnp.where(jnp.abs(d - whole) <= 1e-5 * jnp.maximum(d, 1.0), whole, d)
    d = d + lax.stop_gradient(snapped - d)
    k = lax.stop_gradient(jnp.floor(d))
    return k.astype(jnp.int32), d - k


def delivery(
    plan: Plan,
    layouts: Sequence[Layout],
    buffers: Sequence[jax.Array],
    fresh: Sequence[bool],
    sending: Sequence[jax.Array],
    step: jax.Array,
    *,
    pre_offsets: Sequence[int],
    delays: Sequence[jax.Array | None],
    weights: Sequence[jax.Array | None],
    releases: Sequence[jax.Array | None] | None = None,
    fractional: Sequence[tuple[jax.Array, jax.Array] | None] | None = None,
    group_spikes: Sequence[jax.Array] | None = None,
) -> tuple[list[jax.Array], list[tuple[int, jax.Array]]]:
    """Phase 4: zero the slot `step mod D` that `arrivals` read from each ring of more than
    one slot, then add the spikes `sending[r]` of ring `r`'s sending group into ring `r`.

    Every projection delivers through its layout; the projections of one layout class in a
    group are handed to that class's `deliver_group` together (the event layout compacts the
    spikes once for all of them). Each projection owns its columns of the ring unless it
    shares another's (`Plan.synapse_of`); only then does the order of the classes change the
    order of the additions into a column (and the last bits of its sum). `pre_offsets[i]`
    locates projection `i`'s presynaptic population in its group's spike vector; `delays[i]`
    and `weights[i]` are its per-synapse delays in steps and its current plastic weights (or
    None).

    `releases[i]` (optional) replaces the spikes of projection `i`'s presynaptic population
    by its short-term releases: the releases are appended to the group's spike vector, as a
    population of their own that only projection `i` reads, so that the projection is
    delivered in the same call as the other projections of its layout class in the group
    (one scan of the spikes, one kernel call), and these deliver exactly as without it (each
    projection owns its ring columns). In the pure-JAX event path the spikes of such a
    population therefore count twice against the spike buffer (`plan.capacity`).
    `fractional[i]` (optional), `(k, f)` from `split_delays`, delivers projection `i`'s
    weights `(1 - f) w` at `k` steps and `f w` at `k + 1` steps (two deliveries of its layout
    in the same call).

    `group_spikes` (optional): this step's spikes of every group (`integrate`'s third
    result). A ring that reaches groups other than its sender then waits for their spikes
    before it is written, so that XLA updates it in place (see the module docstring);
    without them the values are the same, but XLA may copy that ring every step.

    Returns the rings and `(group index, needed)` pairs: the spike buffer a layout with a
    bounded buffer (the event layout's pure-JAX path, `plan.capacity`) needed beyond it.
    """
    rings = list(buffers)
    needs = []
    n_proj = len(layouts)
    releases = [None] * n_proj if releases is None else releases
    fractional = [None] * n_proj if fractional is None else fractional
    for si, (_, idx) in enumerate(plan.senders):
        by_class: dict[type, list[Delivery]] = {}
        # Where each projection's releases start, past the group's own spikes.
        n_send = sending[si].shape[-1]
        extra = [i for i in idx if releases[i] is not None]
        widths = [releases[i].shape[-1] for i in extra]
        at = {i: n_send + sum(widths[:q]) for q, i in enumerate(extra)}
        with_releases = {type(layouts[i]) for i in extra}
        for i in idx:
            group = by_class.setdefault(type(layouts[i]), [])
            pre = at.get(i, pre_offsets[i])
            if fractional[i] is None:
                group.append(
                    Delivery(
                        layouts[i],
                        pre,
                        plan.ring_of[i][1],
                        plan.delay_steps[i],
                        delays[i],
                        weights[i],
                        plan.capacity,
                    )
                )
                continue
            k, f = fractional[i]
            w = layouts[i].weights if weights[i] is None else weights[i]
            f = f.astype(w.dtype)
            for d, wd in ((k, w * (1 - f)), (k + 1, w * f)):
                group.append(
                    Delivery(
                        layouts[i],
                        pre,
                        plan.ring_of[i][1],
                        None,
                        d,
                        wd,
                        plan.capacity,
                    )
                )
        ring, first = rings[si], fresh[si]
        send = sending[si]
        if group_spikes is not None:
            send = _after_targets(plan, si, send, group_spikes)
        if extra:
            parts = [send] + [releases[i].astype(send.dtype) for i in extra]
            batch = jnp.broadcast_shapes(*(p.shape[:-1] for p in parts))
            parts = [jnp.broadcast_to(p, batch + p.shape[-1:]) for p in parts]
            send_ext = jnp.concatenate(parts, axis=-1)
        pending = not first  # the slot read this step still holds its arrivals
        for cls, group in by_class.items():
            s = send_ext if cls in with_releases else send
            if pending and getattr(cls, "clears_slot", False):
                ring = cls.deliver_group(group, s, step, ring, fresh=first, clear=True)
            else:
                if pending:
                    ring = clear_slot(ring, step, s)
                ring = cls.deliver_group(group, s, step, ring, fresh=first)
            pending = False
            if isinstance(ring, tuple):  # a bounded buffer says what it lacked
                ring, need = ring
                needs.append((plan.senders[si][0], need))
            first = False
        rings[si] = ring
    return rings, needs


def _after_targets(
    plan: Plan, si: int, s: jax.Array, group_spikes: Sequence[jax.Array]
) -> jax.Array:
    """The sending spikes `s` of ring `si`, computed after the spikes of every other group
    its projections reach (`s + 0`, exactly `s`): see the module docstring."""
    sender, idx = plan.senders[si]
    targets = sorted({plan.group_of(plan.post[i]) for i in idx} - {sender})
    for gi in targets:
        zero = zero_after(group_spikes[gi], s.dtype)
        extra = zero.ndim - (s.ndim - 1)
        if extra > 0:  # a group with more batch axes than the sender
            zero = jnp.min(zero, axis=tuple(range(extra)))
        s = s + zero[..., None]
    return s


def peaks(previous: Sequence[jax.Array], needs: Sequence[tuple[int, jax.Array]]) -> tuple:
    """Per group, the largest spike buffer any step has needed so far (`previous`, updated
    with this step's `needs`); all zeros while every buffer held its spikes."""
    out = list(previous)
    for g, need in needs:
        need = need.astype(out[g].dtype)
        # A state whose peak has fewer batch axes than the spikes (a batch of population
        # states under an unbatched network state) keeps its shape: the most over the rest.
        extra = need.ndim - out[g].ndim
        if extra > 0:
            need = jnp.max(need, axis=tuple(range(extra)))
        out[g] = jnp.maximum(out[g], need)
    return tuple(out)
