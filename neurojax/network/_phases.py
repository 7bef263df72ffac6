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

**The GPU per-step path.** Where the GPU slots run (a GPU backend, or
`nj.kernels.interpret("gpu")`), phase 1 is one Pallas kernel for every projection (it also
zeroes the slot it read, and gives the ring the flag `CLEARED` instead of `fresh`), and phase
2 is one Pallas kernel per group (`neurojax.kernels._pallas_step`): the kinetics' and the
neuron model's own `step` traced into the kernel, constant parameters baked in, the state
never concatenated or split. A step of COBA is then 6 kernels (see `docs/guides/gpu.md`). A
phase the kernels cannot take (a traced `dt`, state or parameters of other shapes, a sharded
network's padding mask) keeps the XLA path below, with the same results; the kernels'
derivative is that of the XLA path.

What a phase needs of the network's structure is a `Plan` (static: groups, sizes, who
projects where, ring offsets); what differs between the single-device and the sharded
network (the sizes of the local blocks, the layouts and parameters each device holds, the
padding mask, the per-device step of a spike source) is handed in by the caller.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from ..kernels import _pallas
from ..kernels._pallas_step import Operands, segments_call, store, with_reference_jvp
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
    "CLEARED",
]

CLEARED = "cleared"
"""The `fresh` flag `arrivals` gives a ring whose read slot it has already zeroed (the GPU
per-step path): `delivery` then neither zeroes it nor takes it as fresh."""


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
    content no longer counts; `CLEARED` on the GPU per-step path, whose kernel returns the
    rings with the slot read already zeroed), the new kinetics states and `g` per
    projection (None for a projection that shares another's columns and state,
    `Plan.synapse_of`: its arrivals are in the other's `g`).
    """
    if _pallas.gpu_path():
        fused = _arrivals_gpu(plan, kinetics, synapse_states, buffers, step, dt)
        if fused is not None:
            return fused
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


def _lead(shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """The trial dimensions of a `(*trials, n)` shape and their product."""
    lead = tuple(shape[:-1])
    return lead, int(np.prod(lead, dtype=np.int64))


def _arrivals_gpu(plan, kinetics, synapse_states, buffers, step, dt):
    """Phase 1 as one Pallas kernel for every ring and projection (the GPU per-step path,
    `neurojax.kernels._pallas_step`): each projection's program reads its columns of the
    slot `step mod D`, advances its kinetics there, writes the new state and `g`, and zeroes
    what it read, so the rings come back with the slot cleared (`CLEARED`).

    None (the caller keeps the XLA path) unless every ring's columns are exactly its owning
    projections' targets, every synaptic state leaf is `(*trials, n_post)` with the rings'
    trials, every kinetics parameter a scalar or a vector of `n_post`, and `dt` a number."""
    if not buffers or isinstance(dt, jax.core.Tracer):
        return None
    lead, n_trials = _lead(buffers[0].shape[:-1])
    if any(tuple(b.shape[:-2]) != lead for b in buffers):
        return None
    owners = [i for i in range(len(kinetics)) if not plan.shares(i)]
    for si, buf in enumerate(buffers):
        at = 0
        mine = [i for i in owners if plan.ring_of[i][0] == si]
        for off, n in sorted((plan.ring_of[i][1], plan.sizes[plan.post[i]]) for i in mine):
            if off != at:
                return None
            at += n
        if at != buf.shape[-1]:
            return None
    ops = Operands()
    now = ops.step(step, lead)
    if now is None:
        return None
    ring_at = [ops.add(b) for b in buffers]
    out_shapes, segments, layout = [], [], []
    for i in owners:
        syn, st, n = kinetics[i], synapse_states[i], plan.sizes[plan.post[i]]
        si, off = plan.ring_of[i]
        leaves, treedef = jtu.tree_flatten(st)
        if any(not isinstance(x, jax.Array) or x.shape != lead + (n,) for x in leaves):
            return None
        params, static = eqx.partition(syn, eqx.is_array)
        p_leaves, p_def = jtu.tree_flatten(params)
        st_specs = [ops.leaf(x, n, lead) for x in leaves]
        p_specs = [ops.leaf(x, n, lead) for x in p_leaves]
        if any(spec is None for spec in st_specs + p_specs):
            return None
        x_abs = jax.ShapeDtypeStruct(lead + (n,), buffers[si].dtype)
        new_abs, g_abs = jax.eval_shape(lambda s_, x_, syn=syn: syn.step(s_, x_, dt), st, x_abs)
        if jtu.tree_structure(new_abs) != treedef or g_abs.shape != lead + (n,):
            return None
        if any(
            a.shape != x.shape or a.dtype != x.dtype
            for a, x in zip(jtu.tree_leaves(new_abs), leaves, strict=True)
        ):
            return None
        first = len(out_shapes)
        out_shapes += [jax.ShapeDtypeStruct((n_trials * n,), x.dtype) for x in leaves]
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * n,), g_abs.dtype))
        shapes = ([x.shape for x in leaves], [x.shape for x in p_leaves])
        layout.append((i, treedef, first, n, si, off, st_specs, p_specs, p_def, static, shapes))
        d_slots, width = buffers[si].shape[-2:]

        def body(
            t,
            lane,
            ic,
            ok,
            ins,
            outs,
            n=n,
            si=si,
            off=off,
            st_specs=st_specs,
            p_specs=p_specs,
            treedef=treedef,
            p_def=p_def,
            static=static,
            first=first,
            d_slots=d_slots,
            width=width,
        ):
            slot = 0 if d_slots == 1 else lax.rem(now.load(ins, t, ic), jnp.int32(d_slots))
            row = (t * d_slots + slot) * width + off
            x = ins[ring_at[si]][row + ic]
            state = jtu.tree_unflatten(treedef, [sp.load(ins, t, ic) for sp in st_specs])
            model = eqx.combine(
                jtu.tree_unflatten(p_def, [sp.load(ins, t, ic) for sp in p_specs]), static
            )
            new, g = model.step(state, x, dt)
            new_leaves = jtu.tree_leaves(new)
            for j, value in enumerate(new_leaves):
                store(outs[first + j], t * n + lane, value, ok)
            store(outs[first + len(new_leaves)], t * n + lane, g, ok)
            store(outs[n_out + si], row + lane, jnp.zeros((), x.dtype), ok)

        segments.append((n, body))
    n_out = len(out_shapes)
    out_shapes += [jax.ShapeDtypeStruct((b.size,), b.dtype) for b in buffers]

    def fused(arrays):
        return segments_call(
            segments,
            arrays,
            out_shapes,
            n_trials=n_trials,
            aliases={pos: n_out + si for si, pos in enumerate(ring_at)},
            name="nj_arrivals",
        )

    def reference(arrays):
        # The same arrivals in XLA (the kernel's derivative): read the slot, step the
        # kinetics, zero the slot.
        k = now.whole(arrays, jnp.shape(step))
        rings = [arrays[pos].reshape(b.shape) for pos, b in zip(ring_at, buffers, strict=True)]
        out = []
        for _, treedef, _, n, si, off, st_specs, p_specs, p_def, static, shapes in layout:
            ring = rings[si]
            d_slots = ring.shape[-2]
            slot = (k % d_slots).astype(jnp.int32)
            if jnp.ndim(slot):  # one step per trial
                row = jnp.take_along_axis(ring, slot[..., None, None], axis=-2)[..., 0, :]
            else:
                row = lax.dynamic_index_in_dim(ring, slot, axis=ring.ndim - 2, keepdims=False)
            x = row[..., off : off + n]
            state = jtu.tree_unflatten(
                treedef, [sp.whole(arrays, sh) for sp, sh in zip(st_specs, shapes[0], strict=True)]
            )
            params = [sp.whole(arrays, sh) for sp, sh in zip(p_specs, shapes[1], strict=True)]
            syn = eqx.combine(jtu.tree_unflatten(p_def, params), static)
            new, g = syn.step(state, x, dt)
            out += [leaf.reshape(-1) for leaf in jtu.tree_leaves(new)] + [g.reshape(-1)]
        for ring in rings:
            here = jnp.arange(ring.shape[-2], dtype=jnp.int32) == (k % ring.shape[-2])[..., None]
            here = jnp.broadcast_to(here[..., None], ring.shape)
            cleared = jnp.where(here, jnp.zeros((), ring.dtype), ring)
            out.append(cleared.reshape(-1))
        return tuple(out)

    outs = with_reference_jvp(fused, reference, ops.arrays)
    synapses, g = list(synapse_states), [None] * len(kinetics)
    for i, treedef, first, n, *_ in layout:
        k = treedef.num_leaves
        synapses[i] = jtu.tree_unflatten(
            treedef, [o.reshape(lead + (n,)) for o in outs[first : first + k]]
        )
        g[i] = outs[first + k].reshape(lead + (n,))
    rings = [o.reshape(b.shape) for o, b in zip(outs[n_out:], buffers, strict=True)]
    return rings, [CLEARED] * len(buffers), synapses, g


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
    neurons of a sharded network never spike). On the GPU per-step path a group without
    `valid` is one Pallas kernel (`_group_gpu`), with the same results.

    Returns the new population states, the spikes per population and per group.
    """
    pops, spikes, group_spikes = {}, {}, []
    for gi, (names, model) in enumerate(zip(plan.groups, group_models, strict=True)):
        if isinstance(model, SpikeSource):
            (name,) = names
            pops[name], s_group = source_step(name, model, populations[name])
        elif (
            fused := (
                _group_gpu(plan, names, model, populations, current, dt)
                if valid is None and _pallas.gpu_path()
                else None
            )
        ) is not None:
            new_pops, new_spikes, s_group = fused
            pops.update(new_pops)
            spikes.update(new_spikes)
            group_spikes.append(s_group)
            continue
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


def _group_gpu(plan, names, model, populations, current, dt):
    """Phase 2 of one group as one Pallas kernel (the GPU per-step path,
    `neurojax.kernels._pallas_step`): one segment per population, whose programs read the
    population's state, its input current and the group model's parameters at the
    population's offset, run the model's own `step` on them, and write the new state, the
    population's spikes and (for a group of several) the group's spike vector, so neither
    the state nor the current is ever concatenated or split.

    Returns `(states, spikes, group spikes)`, or None (the caller keeps the XLA path) unless
    every state leaf is `(*trials, n)` with the same trials, every current a scalar, a vector
    or `(*trials, n)`, every parameter of the group model a scalar, a vector of the group or
    `(*trials, n_group)`, the step's results shaped like its state, and `dt` a number."""
    if isinstance(dt, jax.core.Tracer):
        return None
    members = [populations[n] for n in names]
    leaves0, treedef = jtu.tree_flatten(members[0])
    if not leaves0 or not isinstance(leaves0[0], jax.Array) or leaves0[0].ndim < 1:
        return None
    lead, n_trials = _lead(leaves0[0].shape)
    sizes = [plan.sizes[n] for n in names]
    n_group, several = sum(sizes), len(names) > 1
    like = _neuron_leaf(members[0])
    dtype = like.dtype
    ops = Operands()
    params, static = eqx.partition(model, eqx.is_array)
    p_leaves, p_def = jtu.tree_flatten(params)
    p_specs = [ops.leaf(x, n_group, lead) for x in p_leaves]
    if any(spec is None for spec in p_specs):
        return None
    currents = [current(n) for n in names]
    none = all(c is None for c in currents)
    out_shapes, segments, layout = [], [], []
    spikes_abs = None
    off = 0
    for name, state, c, n in zip(names, members, currents, sizes, strict=True):
        leaves, tdef = jtu.tree_flatten(state)
        if tdef != treedef or any(
            not isinstance(x, jax.Array) or x.shape != lead + (n,) for x in leaves
        ):
            return None
        if c is not None and not isinstance(c, (jax.Array, np.ndarray)):
            c = np.asarray(c, dtype)
        c_spec = None if c is None else ops.leaf(c, n, lead)
        st_specs = [ops.leaf(x, n, lead) for x in leaves]
        if (c is not None and c_spec is None) or any(sp is None for sp in st_specs):
            return None
        c_abs = None if none else jax.ShapeDtypeStruct(lead + (n,), dtype if several else c.dtype)
        new_abs, s_abs = jax.eval_shape(
            lambda st, cc, off=off, n=n: _part(model, off, n, n_group).step(st, cc, dt),
            state,
            c_abs,
        )
        if jtu.tree_structure(new_abs) != treedef or s_abs.shape != lead + (n,):
            return None
        if any(
            a.shape != x.shape or a.dtype != x.dtype
            for a, x in zip(jtu.tree_leaves(new_abs), leaves, strict=True)
        ):
            return None
        spikes_abs = s_abs
        first = len(out_shapes)
        out_shapes += [jax.ShapeDtypeStruct((n_trials * n,), x.dtype) for x in leaves]
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * n,), s_abs.dtype))
        c_shape = None if c is None else jnp.shape(c)
        layout.append((name, first, n, off, st_specs, [x.shape for x in leaves], c_spec, c_shape))

        def body(
            t,
            lane,
            ic,
            ok,
            ins,
            outs,
            n=n,
            off=off,
            c=c,
            c_spec=c_spec,
            st_specs=st_specs,
            first=first,
        ):
            state = jtu.tree_unflatten(treedef, [sp.load(ins, t, ic) for sp in st_specs])
            if none:
                cur = None
            elif c_spec is None:
                cur = jnp.zeros((), dtype)
            else:
                cur = c_spec.load(ins, t, ic)
                cur = cur.astype(dtype) if several else cur
            loaded = [sp._replace(offset=off).load(ins, t, ic) for sp in p_specs]
            m = eqx.combine(jtu.tree_unflatten(p_def, loaded), static)
            new, s = m.step(state, cur, dt)
            new_leaves = jtu.tree_leaves(new)
            for j, value in enumerate(new_leaves):
                store(outs[first + j], t * n + lane, value, ok)
            store(outs[first + len(new_leaves)], t * n + lane, s, ok)
            if several:
                store(outs[-1], t * n_group + off + lane, s, ok)

        segments.append((n, body))
        off += n
    if several:
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * n_group,), spikes_abs.dtype))

    def fused(arrays):
        return segments_call(segments, arrays, out_shapes, n_trials=n_trials, name="nj_group_step")

    def reference(arrays):
        # Each population's step in XLA on its slice of the group model (the derivative).
        params = [sp.whole(arrays, x.shape) for sp, x in zip(p_specs, p_leaves, strict=True)]
        group = eqx.combine(jtu.tree_unflatten(p_def, params), static)
        out, parts = [], []
        for _, _, n, off, st_specs, shapes, c_spec, c_shape in layout:
            state = jtu.tree_unflatten(
                treedef, [sp.whole(arrays, sh) for sp, sh in zip(st_specs, shapes, strict=True)]
            )
            if none:
                cur = None
            elif c_spec is None:
                cur = jnp.zeros((), dtype)
            else:
                cur = c_spec.whole(arrays, c_shape)
                cur = cur.astype(dtype) if several else cur
            new, s = _part(group, off, n, n_group).step(state, cur, dt)
            s = jnp.broadcast_to(s, lead + (n,))
            out += [jnp.broadcast_to(x, lead + (n,)).reshape(-1) for x in jtu.tree_leaves(new)]
            out.append(s.reshape(-1))
            parts.append(s)
        if several:
            out.append(jnp.concatenate(parts, axis=-1).reshape(-1))
        return tuple(out)

    outs = with_reference_jvp(fused, reference, ops.arrays)
    pops, spikes = {}, {}
    for name, first, n, *_ in layout:
        k = treedef.num_leaves
        pops[name] = jtu.tree_unflatten(
            treedef, [o.reshape(lead + (n,)) for o in outs[first : first + k]]
        )
        spikes[name] = outs[first + k].reshape(lead + (n,))
    s_group = outs[-1].reshape(lead + (n_group,)) if several else spikes[names[0]]
    return pops, spikes, s_group


def _part(model, off: int, n: int, n_group: int):
    """The group model restricted to neurons `[off, off + n)` (its per-neuron parameters
    sliced; used only abstractly, to know the shapes of a population's step)."""

    def cut(x):
        if eqx.is_array(x) and x.ndim and x.shape[-1] == n_group:
            return x[..., off : off + n]
        return x

    return jtu.tree_map(cut, model)


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

    A ring whose flag is `CLEARED` (the GPU per-step path's arrivals zeroed its slot) is
    neither zeroed again nor taken as fresh.

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
        cleared = first is CLEARED  # arrivals zeroed the slot read (the GPU per-step path)
        if cleared:
            first = False
        send = sending[si]
        if group_spikes is not None and not cleared:
            send = _after_targets(plan, si, send, group_spikes)
        if extra:
            parts = [send] + [releases[i].astype(send.dtype) for i in extra]
            batch = jnp.broadcast_shapes(*(p.shape[:-1] for p in parts))
            parts = [jnp.broadcast_to(p, batch + p.shape[-1:]) for p in parts]
            send_ext = jnp.concatenate(parts, axis=-1)
        pending = not first and not cleared  # the slot read still holds its arrivals
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
