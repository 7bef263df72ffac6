"""Networks: populations wired by projections, stepped as one pure function."""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._validation import (
    as_float,
    check_dt,
    check_key,
    check_positive_int,
    default_float,
    fmt_list,
    is_concrete,
    normalize_shape,
    zeros,
)
from ..kernels._ranges import out_of_range
from ..neurons import NeuronModel, check_state_fields
from ..synapses import GapJunction
from . import _checks, _cpu_run, _network_run, _phases
from ._memory import MemoryReport, RingRow, plan_memory
from ._plastic import plastic_init, plastic_weights
from ._projection import Projection, delay_steps
from ._sources import SpikeSource

__all__ = ["Network", "NetworkState", "SpikeCapacityError", "default_capacity"]


class NetworkState(eqx.Module):
    """State of a `Network`.

    Attributes:
        populations: population name -> that population's state (e.g. `nj.LIFState`).
        synapses: one kinetics state per projection, in the order of `network.projections`.
        buffers: one ring buffer `(*batch, D, T)` per sending group of populations (see
            `Network.senders`) holding the weight that arrives in each of the next `D` steps
            (`D` = longest delay in steps + 1) for the `T` postsynaptic neurons of all its
            projections side by side.
        step: number of steps taken (int32); `step * dt` is the time in ms.
        plastic: per projection, its `STDPState` (current weights and traces) when it is
            plastic, else None.
        peak: per group of populations (`Network.groups`), per trial, the largest spike
            buffer a step has needed beyond the network's capacity (int32, 0 while every
            buffer held its spikes); see `Network.fit_capacity`.
        short_term: when a projection has short-term plasticity, per projection its
            `nj.synapses.TsodyksMarkramState` (None for the others); empty otherwise.
    """

    populations: dict[str, Any]
    synapses: tuple[Any, ...]
    buffers: tuple[Float[Array, "*batch d n"], ...]
    step: Int[Array, ""]
    plastic: tuple[Any, ...]
    peak: tuple[Int[Array, "*batch"], ...] = ()
    short_term: tuple[Any, ...] = ()


def _is_source(model: Any) -> bool:
    return isinstance(model, SpikeSource)


def _reads_v(output: Any, n: int) -> bool:
    """Whether the synaptic output `output(g, v)` depends on `v` (traced abstractly once)."""
    dyn, static = eqx.partition(output, eqx.is_array)
    avals = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), dyn)
    x = jax.ShapeDtypeStruct((n,), default_float())
    closed = jax.make_jaxpr(lambda d, g, v: eqx.combine(d, static)(g, v))(avals, x, x)
    v = closed.jaxpr.invars[-1]
    used = [var for eqn in closed.jaxpr.eqns for var in eqn.invars]
    return any(var is v for var in used + list(closed.jaxpr.outvars))


def _check_state_fields(models, sizes, projections, gaps) -> None:
    """Raise when a population lacks a state field that a projection or gap junction reads.

    Conductance outputs (`output(g, v)` that depends on `v`) and gap junctions read the
    membrane potential `v` of their population's state (`NeuronModel.required_state_fields`);
    the state's structure comes from `init_state` traced abstractly (nothing is allocated).
    """
    needs: dict[str, str] = {}
    for i, proj in enumerate(projections):
        if proj.post not in needs and _reads_v(proj.output, proj.n_post):
            needs[proj.post] = (
                f"projections[{i}] ({proj.pre} -> {proj.post}, output "
                f"{type(proj.output).__name__}) of the Network"
            )
    for name in gaps:
        needs.setdefault(name, f"gap_junctions[{name!r}] of the Network")
    for name, who in needs.items():
        model = models[name]
        state = eqx.filter_eval_shape(
            lambda m, n=sizes[name]: m.init_state(n, key=jr.key(0)), model
        )
        check_state_fields(model, state, ("v",), needed_by=f"{who} (population {name!r})")


def _array_leaves_if_alike(a: Any, b: Any) -> tuple[list, list] | None:
    """The array leaves of `a` and `b` when they are modules of one type with the same
    structure and equal static fields, else None."""
    if type(a) is not type(b):
        return None
    dyn_a, static_a = eqx.partition(a, eqx.is_array)
    dyn_b, static_b = eqx.partition(b, eqx.is_array)
    if jtu.tree_structure(dyn_a) != jtu.tree_structure(dyn_b):
        return None
    try:
        if not eqx.tree_equal(static_a, static_b):
            return None
    except Exception:  # static fields that cannot be compared: keep apart
        return None
    return jtu.tree_leaves(dyn_a), jtu.tree_leaves(dyn_b)


def _mergeable(a: Any, b: Any) -> bool:
    """Whether two neuron models can be stepped as one concatenated population."""
    leaves = _array_leaves_if_alike(a, b) if isinstance(a, NeuronModel) else None
    return leaves is not None and all(x.ndim <= 1 for x in leaves[0] + leaves[1])


def _same_synapse(a: Any, b: Any) -> bool | None:
    """Whether two projections' kinetics (or outputs) are the same: one type, equal static
    fields and equal parameters; None when that depends on traced parameters."""
    leaves = _array_leaves_if_alike(a, b)
    if leaves is None:
        return False
    if not all(is_concrete(x) for x in leaves[0] + leaves[1]):
        return None
    return all(
        np.shape(x) == np.shape(y)
        and np.asarray(x).dtype == np.asarray(y).dtype
        and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(*leaves, strict=True)
    )


def _shared_synapses(
    projections: Sequence[Projection], senders: Mapping[int, Sequence[int]]
) -> tuple[int, ...]:
    """Per projection, the first projection of its sending group onto the same population
    whose kinetics and output equal its own (itself if none): the one whose ring columns and
    synaptic state it shares under `merge_synapses=True`. Only the built-in outputs, which
    are linear in `g`, are merged (kinetics are linear by `SynapseDynamics`' contract)."""
    from ..synapses import ConductanceOutput, CurrentOutput

    out = list(range(len(projections)))
    for idx in senders.values():
        leaders: list[int] = []
        for i in idx:
            p = projections[i]
            if type(p.output) in (CurrentOutput, ConductanceOutput):
                for j in leaders:
                    q = projections[j]
                    if (
                        q.post == p.post
                        and _same_synapse(q.synapse, p.synapse) is True
                        and _same_synapse(q.output, p.output) is True
                    ):
                        out[i] = j
                        break
            if out[i] == i:
                leaders.append(i)
    return tuple(out)


def _merge(models: list[Any], sizes: list[int]) -> Any:
    """One model whose parameters are the members' parameters concatenated per neuron.

    A parameter that is the same scalar in every member stays a scalar.
    """
    dyns = [eqx.partition(m, eqx.is_array)[0] for m in models]
    static = eqx.partition(models[0], eqx.is_array)[1]

    def cat(*leaves):
        if (
            all(x.ndim == 0 for x in leaves)
            and all(is_concrete(x) for x in leaves)
            and all(np.asarray(x) == np.asarray(leaves[0]) for x in leaves)
        ):
            return leaves[0]
        return jnp.concatenate(
            [jnp.broadcast_to(x, (n,)) for x, n in zip(leaves, sizes, strict=True)]
        )

    return eqx.combine(jtu.tree_map(cat, *dyns), static)


class Network(eqx.Module):
    r"""Populations, projections, external inputs and gap junctions as one steppable model.

    **Update order of one step** (`step(state, ext, dt)`, time `t = state.step * dt`):
    1. every projection reads the weight arriving now from its ring buffer and advances its
       kinetics: `g <- synapse.step(g, arrivals, dt)`;
    2. every population integrates over `[t, t + dt]` with the current
       `sum over projections onto it of output(g, v) + inputs[name] + ext[name] + gap`, all
       evaluated with the membrane potential `v` at `t`, and emits its spikes (dated `t + dt`);
    3. plastic projections update their weights from this step's presynaptic arrivals and
       postsynaptic spikes (see `nj.STDP`);
    4. the spikes are delivered into the ring buffers of the outgoing projections, each through
       its layout (`nj.network.Layout`), with the weights after step 3, to be read
       `1 + round(delay / dt)` steps later.
    These are the phases of `neurojax.network._phases`, which the sharded network of
    `nj.parallel.shard_network` runs too.
    A spike therefore acts on its targets from the next step on (after its delay), and all
    populations update synchronously from the same state.

    `step` returns `(state, {population name: spikes})`, so `nj.simulate(net, state, ...)`
    records one spike raster per population.

    Args:
        populations: `{name: (model, size)}` where `model` is a neuron model (`nj.LIF`, ...)
            or a spike source (an `nj.network.SpikeSource` such as `nj.PoissonSource`) and
            `size` the number of neurons. A population that a conductance output or a gap
            junction reads needs a state with a field `v` (checked here).
        projections: a sequence of `nj.Projection` between named populations.
        inputs: `{name: current}` added to a population's input every step: a constant
            (scalar or one value per neuron), or a function `t_ms -> current` traced inside the
            step. Time-varying inputs can also come through `simulate`'s `inputs` as
            `{name: array with a leading time axis}` (the `ext` argument of `step`).
            A neuromodulator that a plasticity rule reads (`nj.RewardSTDP`'s `modulator`,
            `"dopamine"` by default) is an input under its own name, in either place: a
            scalar or `t_ms -> value` here, or `{"dopamine": d}` in `simulate`'s inputs with
            `d` of shape `(n_steps,)` or `(n_steps, *batch)` (one value per trial and step).
        gap_junctions: `{name: nj.GapJunction}` electrical coupling within a population.
        dt: step [ms]; required when a projection has a delay (it fixes the ring buffers'
            length and the delays in steps), and then every `step` must use it.
        merge_synapses: let projections from one group of populations onto one population
            whose kinetics and output are the same (equal type and parameters, a built-in
            output) share their ring columns and one synaptic state, as a NEST neuron holds
            one synaptic current per receptor type whatever the sources. Linear synapses
            superpose, so the currents are the same up to the order of float additions,
            while the ring and the per-step kinetics shrink from one block per projection
            to one per target and synapse type (for the cortical microcircuit about 7x smaller).
            The first projection of a shared set then holds the sum in `state.synapses`,
            and the others' entries stay at zero; their kinetics and outputs must stay equal
            to the first's (checked at each `step` outside a transformation: edit all the
            projections of a set alike, or build the network again). `net.synapse_of` says
            who shares whose.
            Default False: every projection has its own columns and state.
        spike_capacity: the spikes per trial and step that the pure-JAX event path (what
            GPUs and TPUs run, and `nj.kernels.use("reference")`) handles for one group of
            populations; None picks `default_capacity` of the largest group. The buffer is
            fixed for a run, so a step has no branch or loop that waits on the host. A step
            that needs more records it in `state.peak`; `nj.simulate` then reruns the chunk
            with a larger capacity (`fit_capacity`), so no spike is lost and the result does
            not depend on it. The CPU kernel reads every spike and never needs more.

    Example:
    ```python
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=5.0)
    conn = nj.connect.fixed_prob(jax.random.key(1), 100, 100, 0.1, weight=2.0)
    net = nj.Network(
        populations={"exc": (lif, 100)},
        projections=[nj.Projection("exc", "exc", conn, synapse=nj.Exponential(5.0))],
        inputs={"exc": 0.6},
    )
    state = net.init_state(jax.random.key(0))
    state, rec = nj.simulate(net, state, dt=0.1, n_steps=1000)
    rec.spikes["exc"].shape   # (1000, 100)
    ```
    """

    sizes: dict[str, int] = eqx.field(static=True)
    projections: tuple[Projection, ...]
    inputs: dict[str, Any]
    gap_junctions: dict[str, GapJunction]
    dt: float | None = eqx.field(static=True)
    n_slots: tuple[int, ...] = eqx.field(static=True)
    senders: tuple[tuple[int, tuple[int, ...]], ...] = eqx.field(static=True)
    ring_shape: tuple[tuple[int, int], ...] = eqx.field(static=True)
    ring_of: tuple[tuple[int, int], ...] = eqx.field(static=True)
    synapse_of: tuple[int, ...] = eqx.field(static=True)
    homogeneous_delay_steps: tuple[int | None, ...] = eqx.field(static=True)
    groups: tuple[tuple[str, ...], ...] = eqx.field(static=True)
    group_models: tuple[Any, ...]
    spike_capacity: int | None = eqx.field(static=True, default=None)

    def __init__(
        self,
        populations: Mapping[str, tuple[Any, int]],
        projections: Sequence[Projection] = (),
        inputs: Mapping[str, Any] | None = None,
        gap_junctions: Mapping[str, GapJunction] | None = None,
        *,
        dt: float | None = None,
        merge_synapses: bool = False,
        spike_capacity: int | None = None,
    ):
        self.spike_capacity = _checked_capacity("Network", spike_capacity)
        if not isinstance(merge_synapses, (bool, np.bool_)):
            raise TypeError(
                f"Network: merge_synapses must be True or False, got {merge_synapses!r}"
            )
        if not isinstance(populations, Mapping) or not populations:
            raise TypeError(
                "Network: populations must be a non-empty dict {name: (model, size)}, got "
                f"{populations!r}"
            )
        models, sizes = {}, {}
        for name, entry in populations.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"Network: population names must be non-empty str, got {name!r}")
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(
                    f"Network: populations[{name!r}] must be a pair (model, size), got {entry!r}"
                )
            model, size = entry
            if not (hasattr(model, "init_state") and hasattr(model, "step")):
                raise TypeError(
                    f"Network: populations[{name!r}] model must be a neuron model or spike "
                    f"source with init_state and step, got {type(model).__name__}"
                )
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise ValueError(
                    f"Network: populations[{name!r}] size must be a positive int, got {size!r}"
                )
            models[name], sizes[name] = model, int(size)

        projections = tuple(projections)
        for i, proj in enumerate(projections):
            if not isinstance(proj, Projection):
                raise TypeError(
                    f"Network: projections[{i}] must be an nj.Projection, got {type(proj).__name__}"
                )
            for end, n in (("pre", proj.n_pre), ("post", proj.n_post)):
                name = getattr(proj, end)
                if name not in sizes:
                    raise ValueError(
                        f"Network: projections[{i}].{end} = {name!r} is not a population; "
                        f"populations are {list(sizes)}"
                    )
                if sizes[name] != n:
                    raise ValueError(
                        f"Network: projections[{i}] ({proj.pre} -> {proj.post}) has n_{end}={n} "
                        f"but population {name!r} has {sizes[name]} neurons"
                    )
            if _is_source(models[proj.post]):
                raise ValueError(
                    f"Network: projections[{i}] targets {proj.post!r}, a spike source, which "
                    "takes no input"
                )

        inputs = dict(inputs or {})
        modulators = _modulator_names(projections)
        for name in modulators:
            if name in sizes:
                raise ValueError(
                    f"Network: the neuromodulator {name!r} read by a plasticity rule has the "
                    "name of a population; give the rule another modulator name"
                )
        for name, value in list(inputs.items()):
            if name in modulators:  # a neuromodulator: one value per trial, or t -> value
                if not (callable(value) and not isinstance(value, (jax.Array, np.ndarray))):
                    arr = as_float(value)
                    if arr.ndim or not bool(jnp.isfinite(arr)):
                        raise ValueError(
                            f"Network: inputs[{name!r}] (a neuromodulator) must be a finite "
                            f"scalar or a function t_ms -> value, got {value!r}"
                        )
                    inputs[name] = arr
                continue
            if name not in sizes:
                raise ValueError(
                    f"Network: inputs names unknown population {name!r}; populations are "
                    f"{list(sizes)}"
                )
            if _is_source(models[name]):
                raise ValueError(f"Network: inputs[{name!r}]: a spike source takes no input")
            if callable(value) and not isinstance(value, (jax.Array, np.ndarray)):
                continue
            try:
                arr = as_float(value)
            except TypeError as err:
                raise TypeError(f"Network: inputs[{name!r}]: {err}") from None
            if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] not in (1, sizes[name])):
                raise ValueError(
                    f"Network: inputs[{name!r}] must be a scalar or have shape ({sizes[name]},), "
                    f"got shape {arr.shape}"
                )
            if is_concrete(arr) and not np.all(np.isfinite(np.asarray(arr))):
                raise ValueError(f"Network: inputs[{name!r}] must be finite")
            inputs[name] = arr

        gaps = dict(gap_junctions or {})
        for name, gap in gaps.items():
            if name not in sizes:
                raise ValueError(
                    f"Network: gap_junctions names unknown population {name!r}; populations "
                    f"are {list(sizes)}"
                )
            if not isinstance(gap, GapJunction):
                raise TypeError(
                    f"Network: gap_junctions[{name!r}] must be an nj.GapJunction, got "
                    f"{type(gap).__name__}"
                )
            if gap.n != sizes[name]:
                raise ValueError(
                    f"Network: gap_junctions[{name!r}] couples {gap.n} neurons but population "
                    f"{name!r} has {sizes[name]}"
                )
            if _is_source(models[name]):
                raise ValueError(f"Network: gap_junctions[{name!r}]: a spike source has no v")

        _check_state_fields(models, sizes, projections, gaps)

        if dt is not None:
            dt = check_dt("Network", dt)
        n_slots, homog = [], []
        kept = []  # the projections as the network keeps them: per-synapse delays in steps
        for i, proj in enumerate(projections):
            if proj.max_delay > 0 and dt is None:
                raise ValueError(
                    f"Network: projections[{i}] ({proj.pre} -> {proj.post}) has a delay of up to "
                    f"{proj.max_delay} ms; pass dt= (ms) so that delays become whole steps"
                )
            if proj.learnable_delays:
                if dt is None:
                    raise ValueError(
                        f"Network: projections[{i}] ({proj.pre} -> {proj.post}) has learnable "
                        "delays; pass dt= (ms) so that they can be placed on the ring buffer"
                    )
                ratio = proj.max_delay / dt
                d_max = int(np.floor(ratio + 1e-6 * max(ratio, 1.0))) + 1  # k + 1 at most
                homog.append(None)
            elif proj.delay_steps is not None or isinstance(proj.delay_ms, jax.Array):
                # Kept as whole steps, in the projection: no float32 copy in ms beside them.
                if dt is None:
                    raise ValueError(
                        f"Network: projections[{i}] ({proj.pre} -> {proj.post}) has per-synapse "
                        "delays; pass dt= (ms) so that delays become whole steps"
                    )
                proj = proj.with_delay_steps(dt)
                steps = np.asarray(proj.delay_steps)  # on the host (a view on CPU)
                d_max = int(steps.max()) if steps.size else 0
                homog.append(None)
            else:
                d_max = int(delay_steps(proj.delay, dt)) if proj.delay > 0 else 0
                homog.append(d_max)
            kept.append(proj)
            n_slots.append(d_max + 1)
        projections = tuple(kept)

        # Populations of the same neuron model (type, static fields, parameter shapes) are
        # stepped as one concatenated population, and their spikes compacted once: on CPU the
        # cost of a step is dominated by the number of operations, not by their size.
        groups: list[list[str]] = []
        for name, model in models.items():
            for g in groups:
                if _mergeable(models[g[0]], model):
                    g.append(name)
                    break
            else:
                groups.append([name])
        self.groups = tuple(tuple(g) for g in groups)
        self.group_models = tuple(
            models[g[0]] if len(g) == 1 else _merge([models[n] for n in g], [sizes[n] for n in g])
            for g in groups
        )
        # One ring buffer per group that sends spikes, shared by its outgoing projections.
        group_of = {n: gi for gi, g in enumerate(groups) for n in g}
        senders: dict[int, list[int]] = {}
        for i, proj in enumerate(projections):
            senders.setdefault(group_of[proj.pre], []).append(i)
        # With merge_synapses, projections of one sender onto one population with the same
        # kinetics and output share one block of columns (and one synaptic state).
        synapse_of = (
            _shared_synapses(projections, senders)
            if merge_synapses
            else tuple(range(len(projections)))
        )
        ring_of = [None] * len(projections)
        ring_shape = []
        for si, idx in enumerate(senders.values()):
            off = 0
            for i in idx:
                if synapse_of[i] != i:
                    continue
                ring_of[i] = (si, off)
                off += projections[i].n_post
            for i in idx:
                ring_of[i] = ring_of[synapse_of[i]]
            ring_shape.append((max(n_slots[i] for i in idx), off))
        self.synapse_of = synapse_of
        self.senders = tuple((gi, tuple(idx)) for gi, idx in senders.items())
        self.ring_shape = tuple(ring_shape)
        self.ring_of = tuple(ring_of)
        self.sizes = sizes
        self.projections = projections
        self.inputs = inputs
        self.gap_junctions = gaps
        self.dt = dt
        self.n_slots = tuple(n_slots)
        self.homogeneous_delay_steps = tuple(homog)

    # ------------------------------------------------------------------ populations

    def _where(self, name: str) -> tuple[int, int]:
        """(group index, offset in the group) of population `name`."""
        for gi, names in enumerate(self.groups):
            off = 0
            for n in names:
                if n == name:
                    return gi, off
                off += self.sizes[n]
        raise KeyError(f"Network: no population {name!r}; populations are {list(self.sizes)}")

    @property
    def populations(self) -> dict[str, Any]:
        """Population name -> its model (read-only view).

        Populations of the same model type are stepped as one group whose parameters are
        concatenated per neuron (`group_models`); this view slices them back. To change a
        population's parameters use `net.with_population(name, model)`: editing the view
        (e.g. with `eqx.tree_at`) would not reach the network.
        """
        out = {}
        for gi, names in enumerate(self.groups):
            model = self.group_models[gi]
            if len(names) == 1:
                out[names[0]] = model
                continue
            off = 0
            for n in names:
                size = self.sizes[n]
                out[n] = jtu.tree_map(
                    lambda x, o=off, m=size: x[o : o + m] if x.ndim == 1 else x, model
                )
                off += size
        return out

    def with_population(self, name: str, model: Any) -> "Network":
        """A copy of the network whose population `name` has the neuron model `model`.

        Works under `jit`, `vmap` and `grad` (for example to sweep or differentiate a
        population's parameters). The new model must be of the same type as the old one and,
        when the population is stepped together with others (`net.groups`), have the same
        static fields (integration method, surrogate type) as they do.
        """
        gi, _ = self._where(name)
        names = self.groups[gi]
        views = self.populations
        old = views[name]
        if type(model) is not type(old):
            raise TypeError(
                f"Network.with_population: population {name!r} is a {type(old).__name__}; the "
                f"new model must have the same type, got {type(model).__name__}"
            )
        if len(names) == 1:
            merged = model
        else:
            if not _mergeable(views[names[0]] if names[0] != name else model, model):
                raise ValueError(
                    f"Network.with_population: the new model of {name!r} differs in its static "
                    "fields from the other populations stepped with it; build a new Network"
                )
            members = [model if n == name else views[n] for n in names]
            merged = _merge(members, [self.sizes[n] for n in names])
        models = list(self.group_models)
        models[gi] = merged
        return eqx.tree_at(lambda net: net.group_models, self, tuple(models))

    # ------------------------------------------------------------------ sizes and state

    @property
    def n_neurons(self) -> int:
        """Total number of neurons (spike sources included)."""
        return sum(self.sizes.values())

    @property
    def n_synapses(self) -> int:
        """Total number of chemical synapses over all projections."""
        return sum(p.n_synapses for p in self.projections)

    @property
    def delay_steps(self) -> tuple[Int[Array, " nnz"] | None, ...]:
        """Per projection, its per-synapse delays in steps (int8, int16 or int32, kept by the
        projection: `Projection.delay_steps`), or None (one delay, or learnable delays)."""
        return tuple(p.delay_steps for p in self.projections)

    def nbytes(self) -> int:
        """Bytes held by the synapse arrays of all projections (layouts, weights, delays)."""
        return sum(p.nbytes() for p in self.projections)

    def memory(self, *, batch: int | tuple[int, ...] = ()) -> "MemoryReport":
        """The bytes of this network by part, before its state is allocated: per population
        its state per neuron, per projection its tables per synapse and its kinetics, per
        ring buffer one delay slot (`nj.network.MemoryReport`; `print` it for a table).
        `batch` are the state's trial dimensions. See `nj.network.plan_memory`."""
        n_trials = math.prod(normalize_shape("Network.memory", batch))
        sizes = {n: (m, self.sizes[n]) for n, m in self.populations.items()}
        report = plan_memory(sizes, self.projections, dt=self.dt, batch=n_trials)
        rings = tuple(
            RingRow("+".join(self.groups[gi]), slots, width, 4 * width * n_trials)
            for (gi, _), (slots, width) in zip(self.senders, self.ring_shape, strict=True)
        )
        return dataclasses.replace(report, rings=rings)

    def init_state(
        self, key: PRNGKeyArray | None = None, *, batch: int | tuple[int, ...] = ()
    ) -> NetworkState:
        """The initial state, with optional leading `batch` dimensions.

        With a `key`, each population gets its own sub-key (split in the order of
        `populations`) and draws its random initial state (for `nj.LIF`, voltages uniform
        between reset and threshold; spike sources need a key). Without a key neuron models
        start at rest. Synaptic variables and ring buffers start at zero. Replace parts with
        `eqx.tree_at`, e.g. `eqx.tree_at(lambda s: s.populations["E"].v, state, v0)`.
        """
        batch = normalize_shape("Network.init_state", batch)
        if key is not None:
            check_key("Network.init_state", key)
        self.memory(batch=batch).check("Network.init_state")  # refused before allocating
        keys = [None] * len(self.sizes) if key is None else list(jr.split(key, len(self.sizes)))
        pops = {}
        for (name, model), k in zip(self.populations.items(), keys, strict=True):
            if k is None and _is_source(model):
                raise ValueError(
                    f"Network.init_state: population {name!r} is a spike source and needs a key;"
                    " pass key=jax.random.key(seed)"
                )
            pops[name] = model.init_state(batch + (self.sizes[name],), key=k)
        synapses = tuple(p.synapse.init_state(batch + (p.n_post,)) for p in self.projections)
        buffers = tuple(zeros(batch + shape, default_float()) for shape in self.ring_shape)
        plastic = tuple(
            None
            if p.plasticity is None
            else plastic_init(p, batch, self.homogeneous_delay_steps[i], default_float())
            for i, p in enumerate(self.projections)
        )
        peak = tuple(zeros(batch, np.int32) for _ in self.groups)
        # Empty without short-term plasticity: the state of a static network keeps its
        # structure (and equals the one a sharded network gathers).
        short = ()
        if any(p.short_term is not None for p in self.projections):
            short = tuple(
                None if p.short_term is None else p.short_term.init_state(batch + (p.n_pre,))
                for p in self.projections
            )
        return NetworkState(pops, synapses, buffers, zeros((), np.int32), plastic, peak, short)

    def expected_state(self, state: Any) -> Any:
        """The abstract state (`jax.ShapeDtypeStruct` leaves) that `init_state` makes for the
        trial dimensions of `state`, or None when `state` gives none. `ValueError` when
        `state` holds other populations than this network's (a state of another network).
        `nj.simulate` compares a state with it before anything is compiled."""
        if not isinstance(state, NetworkState):
            # a state of another kind (a population's): the type alone tells
            return eqx.filter_eval_shape(lambda k: self.init_state(k), jr.key(0))
        pops = state.populations
        if not isinstance(pops, dict):
            return None
        if set(pops) != set(self.sizes):
            raise ValueError(
                f"the state holds populations {sorted(pops)}, but the network has "
                f"{sorted(self.sizes)}: a state of another network; make it with this "
                "network's init_state"
            )
        first = next(iter(self.sizes))
        leaves = jtu.tree_leaves(pops[first])
        if not leaves or not np.shape(leaves[0]):
            return None
        batch = tuple(np.shape(leaves[0])[:-1])
        return eqx.filter_eval_shape(lambda k: self.init_state(k, batch=batch), jr.key(0))

    def check_invariants(self, owner: str = "Network.check_invariants", *, thorough: bool = True):
        """What the constructor established and an edit (`eqx.tree_at`) or a forged file can
        break, beyond each part's own checks: every per-synapse delay inside its ring buffer
        (`0 <= delay_steps < slots`), learnable delays finite, and the projections that share
        synaptic state (`merge_synapses=True`) with equal kinetics and outputs.

        Concrete values raise `ValueError` naming `owner`, the projection and the field;
        traced ones come back as `(bad, message)` flags (see `Layout.check_invariants`)."""
        flags = []
        for i, p in enumerate(self.projections):
            where = f"{owner}: projections[{i}] ({p.pre} -> {p.post})"
            ring = self.ring_shape[self._ring_index(i)][0]
            d = p.delay_steps
            if d is not None:
                if is_concrete(d):
                    steps = np.asarray(d)
                    if steps.size and (steps.min() < 0 or steps.max() >= ring):
                        bad = (steps < 0) | (steps >= ring)
                        raise ValueError(
                            f"{where}: delay_steps holds {int(bad.sum())} delay(s) outside "
                            f"[0, {ring - 1}] steps, the ring buffer's {ring} slots, e.g. "
                            f"{fmt_list(steps[bad])} (first at synapse {int(np.argmax(bad))}); "
                            "such a spike would arrive at another step"
                        )
                else:
                    # over every synapse when per synapse: the compiled kernel's threads
                    # share the pass on the CPU
                    d = jnp.asarray(d)
                    if jnp.issubdtype(d.dtype, jnp.integer):
                        outside = out_of_range(d, 0, ring)
                    else:
                        outside = jnp.any((d < 0) | (d >= ring))
                    flags.append(
                        (
                            outside,
                            f"{where}: delay_steps holds a delay outside [0, {ring - 1}] steps",
                        )
                    )
            if p.learnable_delays and isinstance(p.delay_ms, jax.Array):
                if is_concrete(p.delay_ms):
                    ms = np.asarray(p.delay_ms)
                    if ms.size and not np.isfinite(ms).all():
                        raise ValueError(
                            f"{where}: the learnable delays hold "
                            f"{int((~np.isfinite(ms)).sum())} NaN or infinite value(s) (first "
                            f"at synapse {int(np.argmax(~np.isfinite(ms)))}); delays must be "
                            "finite"
                        )
                else:
                    flags.append(
                        (
                            jnp.any(~jnp.isfinite(p.delay_ms)),
                            f"{where}: the learnable delays hold NaN or infinity",
                        )
                    )
        for i, j in enumerate(self.synapse_of):
            if i == j:
                continue
            p, q = self.projections[i], self.projections[j]
            for part in ("synapse", "output"):
                a, b = getattr(p, part), getattr(q, part)
                same = _same_synapse(a, b)
                message = (
                    f"{owner}: projections[{i}] ({p.pre} -> {p.post}) shares the synaptic "
                    f"state of projections[{j}] (merge_synapses=True), but its {part} differs"
                )
                if same is False:
                    raise ValueError(
                        f"{message}: {a!r}, not {b!r}; give every projection that shares it "
                        f"the same {part}, or build the network again"
                    )
                if same is None:  # traced parameters: compared when the run executes
                    leaves = _array_leaves_if_alike(a, b)
                    diff = [jnp.any(x != y) for x, y in zip(*leaves, strict=True)]
                    flags.append((jnp.any(jnp.stack(diff)), f"{message} (a traced parameter)"))
        return flags

    def _ring_index(self, i: int) -> int:
        ring = self.ring_of[i]
        return ring[0] if ring is not None else 0

    # ------------------------------------------------------------------ the step

    def _check_step(self, state: NetworkState, ext: Any, dt: float) -> None:
        if self.dt is not None and not math.isclose(dt, self.dt, rel_tol=1e-9):
            raise ValueError(
                f"Network.step: dt={dt} ms but the network was built with dt={self.dt} ms "
                "(its delays are whole steps of that dt)"
            )
        if len(state.buffers) != len(self.ring_shape) or any(
            buf.shape[-2:] != shape for buf, shape in zip(state.buffers, self.ring_shape)
        ):
            raise ValueError(
                "Network.step: the state's ring buffers have shapes "
                f"{[b.shape[-2:] for b in state.buffers]} but this network needs "
                f"{list(self.ring_shape)} (slots, neurons); make the state with this network's "
                "init_state"
            )
        for i, j in enumerate(self.synapse_of):
            if i == j:
                continue
            p, q = self.projections[i], self.projections[j]
            for part in ("synapse", "output"):
                a, b = getattr(p, part), getattr(q, part)
                if _same_synapse(a, b) is False:  # traced parameters cannot be compared
                    raise ValueError(
                        f"Network.step: projections[{i}] ({p.pre} -> {p.post}) shares the "
                        f"synaptic state of projections[{j}] (merge_synapses=True), but its "
                        f"{part} is now {a!r}, not {b!r}; give every projection that shares "
                        f"it the same {part}, or build the network again"
                    )
        has_short_term = any(p.short_term is not None for p in self.projections)
        if has_short_term and len(state.short_term) != len(self.projections):
            raise ValueError(
                "Network.step: the network has short-term plasticity but the state holds no "
                "short-term state per projection; make the state with this network's init_state"
            )
        if ext is not None:
            if not isinstance(ext, Mapping):
                raise TypeError(
                    "Network.step: ext must be None or a dict {population: current}, got "
                    f"{type(ext).__name__}"
                )
            modulators = _modulator_names(self.projections)
            for name in ext:
                if name in modulators:
                    continue
                if name not in self.sizes or _is_source(self.populations[name]):
                    raise ValueError(
                        f"Network.step: ext names {name!r}, which is not a neuron population "
                        f"of the network ({list(self.sizes)})"
                    )

    @property
    def _plan(self) -> _phases.Plan:
        """The static structure a step walks over (see `neurojax.network._phases`)."""
        return _phases.Plan(
            groups=self.groups,
            sizes=self.sizes,
            pre=tuple(p.pre for p in self.projections),
            post=tuple(p.post for p in self.projections),
            ring_of=self.ring_of,
            senders=self.senders,
            delay_steps=self.homogeneous_delay_steps,
            capacity=self.capacity,
            synapse_of=self.synapse_of,
        )

    def step(
        self, state: NetworkState, ext: Mapping[str, Any] | None, dt: float
    ) -> tuple[NetworkState, dict[str, Float[Array, "*batch n"]]]:
        """Advance by `dt` ms in the order of the class docstring.

        Called outside `nj.simulate` (a loop of one's own), the step checks the network as
        `simulate` does where a run starts (`neurojax.network._checks.check_step`): an
        edited or forged index, delay or parameter raises, on the compiled kernels' path
        and the pure-JAX one alike."""
        self._check_step(state, ext, dt)
        state = _checks.check_step(self, state)
        plan = self._plan
        k = state.step
        t = k.astype(default_float()) * dt
        projs = self.projections

        # 1. arrivals and kinetics
        buffers, fresh, synapses, g = _phases.arrivals(
            plan, [p.synapse for p in projs], state.synapses, state.buffers, k, dt
        )

        # 2. populations, group by group
        outputs = [p.output for p in projs]

        def current(name):
            pop = state.populations[name]
            return _phases.total_current(
                plan, name, pop, outputs, g, self.inputs, ext, self.gap_junctions, t
            )

        pops, spikes, group_spikes = _phases.integrate(
            plan,
            self.group_models,
            state.populations,
            current,
            dt,
            source_step=lambda name, source, st: source.step(st, None, dt),
        )

        # 3. plasticity: this step's arrivals and spikes update the plastic weights, which
        # then deliver this step's spikes (updating first lets the compiled kernel work on the
        # weights in place; with delivery first XLA would copy them every step)
        modulators = {}  # this step's neuromodulators (`nj.RewardSTDP`): ext, then inputs
        for name in _modulator_names(projs):
            value = ext.get(name) if ext is not None else None
            if value is None and name in self.inputs:
                value = self.inputs[name]
                value = value(t) if callable(value) else value
            modulators[name] = value
        plastic, plastic_needs = _phases.plasticity(
            plan, projs, state.plastic, group_spikes, k, dt, modulators
        )

        # short-term plasticity: the releases that the projections having it send
        short, releases = state.short_term, None
        if any(p.short_term is not None for p in projs):
            short, releases = _phases.short_term(plan, projs, short, group_spikes, k, dt)
        fractional = [
            _phases.split_delays(p.delay, dt, p.max_delay) if p.learnable_delays else None
            for p in projs
        ]

        # 4. delivery, each projection through its layout
        buffers, delivery_needs = _phases.delivery(
            plan,
            [p.layout for p in projs],
            buffers,
            fresh,
            [group_spikes[gi] for gi, _ in self.senders],
            k,
            pre_offsets=[plan.offset(p.pre) for p in projs],
            delays=self.delay_steps,
            weights=[
                None if p.plasticity is None else plastic_weights(plastic[i])
                for i, p in enumerate(projs)
            ],
            releases=releases,
            fractional=fractional,
            group_spikes=group_spikes,
        )

        previous = state.peak
        if len(previous) != len(self.groups):  # a state made without a peak
            previous = tuple(jnp.zeros(s.shape[:-1], jnp.int32) for s in group_spikes)
        peak = _phases.peaks(previous, plastic_needs + delivery_needs)
        new = NetworkState(pops, tuple(synapses), tuple(buffers), k + 1, plastic, peak, short)
        return new, spikes

    # ------------------------------------------------------------------ whole runs

    def fused_run(
        self, state: NetworkState, inputs: Any, dt: float, n_rec: int, record_every: int, **options
    ) -> tuple[Any, ...] | None:
        """A whole chunk of `nj.simulate` in one GPU kernel launch, one program per trial
        (the registry entry `network_run`), or on the CPU in one compiled call on the
        kernels' threads (`nj_network_run`, `neurojax.network._cpu_run`: LIF populations,
        exponential synapses with current or conductance output through the event layout,
        Poisson count sources, the network's constant inputs and no others, spikes
        recorded, bit for bit the per-step path), or None: `simulate` then scans `step`.

        It serves a network that fits one program (`explain_run` says whether this one does
        and why): populations of `nj.LIF`, `nj.Izhikevich`, `nj.AdEx` (their own `step`) and
        `nj.PoissonSource`; projections with the event layout, any elementwise kinetics
        (`nj.Exponential`, `nj.Alpha`, `nj.Delta`, ...) and current or conductance output,
        per-projection or per-synapse delays, Tsodyks-Markram short-term plasticity, pair
        STDP (`nj.STDP`) on projections without delay; constant inputs and `simulate`'s
        constant or time-series inputs; no other weight plasticity rule, gap junctions,
        shared synapses or learnable delays;
        spikes recorded as the bool raster or window counts, fields of neuron populations;
        and a state, rings and per-neuron parameters within the device's limits
        (`neurojax.kernels._pallas_network.device_limits`: registers of one program, ring
        bytes, fan-out). It runs on a GPU backend, under `nj.kernels.interpret("gpu")` (the
        kernel interpreted on the CPU, for tests) and under `nj.kernels.cross_platform()`
        (to lower for CUDA); elsewhere the CPU keeps the per-step path and its C++ kernels.

        The results equal the per-step path's (spikes exactly, voltages to rounding: the
        atomics add a step's arrivals in no fixed order), except a Poisson source's trains:
        the kernel draws them from its own counter-based generator (keyed by the source's
        key, the trial, the step and the neuron; the key is not split), with the same
        statistics but other draws than `PoissonSource.step`'s.
        """
        out = _network_run.fused_run(self, state, inputs, dt, n_rec, record_every, **options)
        if out is None:
            out = _cpu_run.fused_run(self, state, inputs, dt, n_rec, record_every, **options)
        return out

    def explain_run(
        self,
        state: NetworkState,
        inputs: Any = None,
        *,
        dt: float,
        n_steps: int,
        record_every: int = 1,
        spike_dtype: str | None = "bool",
    ) -> dict[str, str]:
        """Which path `nj.simulate(self, state, inputs, dt=dt, n_steps=n_steps, ...)` takes on
        each platform and why: `{"cpu": ..., "cuda": ..., "tpu": ...}`, each a sentence that
        starts with `"network_run"` (the whole run in one GPU program per trial, or on the
        CPU in one compiled call on the kernels' threads, `fused_run`) or `"per-step"` (the
        scan over `step`). `nj.kernels.explain(net, state,
        ...)` asks the same.

        Example:
        ```python
        net = nj.Network({"E": (nj.LIF(), 50)}, inputs={"E": 1.0})
        net.explain_run(net.init_state(), dt=0.1, n_steps=100)["cuda"]
        # 'network_run: the network fits one program per trial (50 neurons, 0 projections)'
        ```
        """
        owner = "Network.explain_run"
        if not isinstance(state, NetworkState):
            raise TypeError(
                f"{owner}: state must be this network's state (a NetworkState made with "
                f"init_state), got {type(state).__name__}"
            )
        dt = check_dt(owner, dt)
        n_steps = check_positive_int(owner, "n_steps", n_steps)
        record_every = check_positive_int(owner, "record_every", record_every)
        if n_steps % record_every:
            raise ValueError(f"{owner}: record_every={record_every} must divide n_steps={n_steps}")
        if spike_dtype not in ("bool", "ids", None):
            raise ValueError(
                f"{owner}: spike_dtype must be 'bool', 'ids' or None (nj.Record's spikes "
                f"'raster', 'ids', 'float'), got {spike_dtype!r}"
            )
        out = _network_run.explain_run(
            self,
            state,
            inputs,
            dt=dt,
            n_steps=n_steps,
            record_every=record_every,
            spike_dtype=spike_dtype,
        )
        # The CPU's own whole run (`nj_network_run`, neurojax.network._cpu_run), where the
        # GPU slot is not what the CPU runs.
        if not out["cpu"].startswith("network_run"):
            kind = "none" if inputs is None else "const"
            cpu = _cpu_run.explain(
                self, state, inputs, dt=dt, every=record_every, kind=kind,
                spike_dtype=spike_dtype,
            )  # fmt: skip
            if cpu.startswith("network_run"):
                out["cpu"] = cpu
            elif out["cpu"].startswith("per-step: the CPU keeps"):
                why = cpu.removeprefix("per-step: ")
                out["cpu"] += f" (its whole run in one call does not serve it: {why})"
        return out

    # ------------------------------------------------------------------ spike capacity

    @property
    def capacity(self) -> int:
        """The spike buffer of one trial in the pure-JAX event path: `spike_capacity`, or
        `default_capacity` of the largest group."""
        if self.spike_capacity is not None:
            return self.spike_capacity
        return default_capacity(max(sum(self.sizes[n] for n in g) for g in self.groups))

    def with_capacity(self, spike_capacity: int | None) -> "Network":
        """A copy of the network with another `spike_capacity` (same values, another buffer)."""
        checked = _checked_capacity("Network.with_capacity", spike_capacity)
        new = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(new, field.name, getattr(self, field.name))
        object.__setattr__(new, "spike_capacity", checked)
        return new

    def needed_capacity(self, state: NetworkState) -> int:
        """The largest spike buffer any step of `state`'s history needed beyond this
        network's capacity (0 when none did); reads `state.peak` (concrete)."""
        return max(_group_peaks(state), default=0)

    def fit_capacity(self, state: NetworkState) -> "Network":
        """This network, or a copy whose capacity holds every spike count in `state.peak`
        (the next power of two), so that a rerun from before the overflow loses nothing.

        `nj.simulate` calls it after each chunk and reruns a chunk that overflowed with the
        network it returns. With a traced state it returns the network unchanged (see
        `check_capacity`).
        """
        if not state.peak or any(_is_traced(p) for p in state.peak):
            return self
        need = self.needed_capacity(state)
        if need <= self.capacity:
            return self
        return self.with_capacity(1 << (need - 1).bit_length())

    def buffers_may_overflow(self) -> bool:
        """Whether a step of this network may run a bounded spike buffer: the pure-JAX event
        path runs (`nj.kernels.use("reference")`, a GPU or TPU, no C++ compiler) for an
        event-layout projection, or a plasticity rule has no compiled kernel. The compiled
        CPU kernels read every spike and never overflow."""
        from ..kernels import _build, _config, _registry

        events = [p for p in self.projections if getattr(p.layout, "name", "") == "event"]
        if any(getattr(p.layout, "name", "") == "procedural" for p in self.projections):
            if _config.mode() == "reference" or not _registry._may_run_on_cpu():
                return True  # the procedural layout's reference has a bounded buffer too
        if not events:
            return False
        if _config.mode() == "reference" or not _registry._may_run_on_cpu():
            return True
        if _build.library() is None:
            return True
        return any(p.plasticity is not None and p.plasticity.pair_kernel() is None for p in events)

    def check_capacity(self, state: NetworkState) -> NetworkState:
        """Raise `SpikeCapacityError` if a step of `state`'s history had more spikes than this
        network's capacity, naming the populations and the capacity to pass; under a
        transformation (a user's `jit`) the check becomes one `equinox.error_if` on the
        returned state, read once after the run. Returns `state`."""
        if not state.peak:
            return state
        if any(_is_traced(p) for p in state.peak):
            over = [jnp.any(p > self.capacity) for p in state.peak]
            messages = [self._capacity_message(gi, None) for gi in range(len(self.groups))]
            which = jnp.argmax(jnp.stack(over)).astype(jnp.int32)
            # On the step counter alone: a state's PRNG keys cannot pass through the check.
            step = eqx.branched_error_if(state.step, jnp.any(jnp.stack(over)), which, messages)
            return eqx.tree_at(lambda s: s.step, state, step)
        for gi, need in enumerate(_group_peaks(state)):
            if need > self.capacity:
                raise SpikeCapacityError(self._capacity_message(gi, need))
        return state

    def _capacity_message(self, gi: int, need: int | None) -> str:
        names = self.groups[gi]
        projs = [
            f"{p.pre}->{p.post}"
            for p in self.projections
            if p.pre in names or (p.plasticity is not None and p.post in names)
        ]
        count = "more spikes than" if need is None else f"{need} spikes, more than"
        suggestion = (
            "pass a larger Network(..., spike_capacity=...)"
            if need is None
            else f"pass Network(..., spike_capacity={1 << (need - 1).bit_length()})"
        )
        return (
            f"Network: in one step, population(s) {', '.join(map(repr, names))} had {count} "
            f"the spike capacity {self.capacity} of the pure-JAX event path (projections "
            f"{', '.join(projs)}); spikes past it were not delivered. nj.simulate reruns such "
            f"runs itself outside a jit; here {suggestion} (net.with_capacity(...)), or run "
            "nj.simulate outside jit"
        )


class SpikeCapacityError(RuntimeError):
    """A step had more spikes than the network's spike capacity (see `Network.fit_capacity`)."""


def _modulator_names(projections: Sequence[Projection]) -> set[str]:
    """The neuromodulator inputs read by the projections' plasticity rules."""
    names = set()
    for p in projections:
        name = None if p.plasticity is None else p.plasticity.modulator_name()
        if name is not None:
            names.add(name)
    return names


def default_capacity(n: int) -> int:
    """The default spike buffer for a group of `n` neurons: a power of two, at least 64 and
    about `n / 256` (0.4 % of the group in one step, 39 Hz at dt = 0.1 ms), at most `n`."""
    want = max(64, -(-n // 256))
    return min(n, 1 << (want - 1).bit_length())


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _checked_capacity(owner: str, value: Any) -> int | None:
    """`value` as a spike capacity (None or an int >= 1), or a ValueError naming `owner`."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ):
        raise ValueError(f"{owner}: spike_capacity must be None or an int >= 1, got {value!r}")
    return None if value is None else int(value)


def _group_peaks(state: NetworkState) -> list[int]:
    """Per group, the largest buffer any trial needed beyond the capacity (concrete)."""
    return [int(np.max(np.asarray(p))) if np.size(p) else 0 for p in state.peak]
