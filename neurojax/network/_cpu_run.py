"""A whole chunk of `nj.simulate` of a network in one compiled CPU call on the kernels'
threads (`neurojax/kernels/network_run.cc`, FFI target `nj_network_run`).

On the CPU, `Network.fused_run` hands a chunk here when the network is one the kernel runs
with the per-step path's numbers, bit for bit: populations of `nj.LIF` (its own `step`,
float32), spike sources that draw their counts as `nj.models.PoissonCounts` does (the
source says so with a `cpu_run_counts` method), projections without short-term plasticity
or learnable delays whose kinetics are `nj.Exponential` with `nj.CurrentOutput` or
`nj.ConductanceOutput`, through the event layout (from neurons) or the input layout (from a
source), with one or per-synapse delays, static or with pair STDP (`nj.STDP`, both modes and
pairings, the rule reading this step's presynaptic spikes: no delay history); the network's
constant inputs (a scalar or one value per neuron; not a function of time), no input
through `simulate`, no gap junctions, no bounded spike buffer; spikes recorded as the bool
raster or window counts and nothing else; one trial per call (a `vmap` runs one call per trial). The
Potjans-Diesmann microcircuit with its Poisson background (`nj.models.microcircuit`) and
COBA (`nj.models.coba` with `method="event"`, or its default on networks large enough
that "auto" picks the event layout), also with pair STDP on E -> E, are such networks.

Why: a step of the per-step path is some eighty XLA operations (the group's update written
output by output, the kinetics, the recording, the kernels' calls), most of them on one
thread; here a thread owns a range of neurons and the ring columns that feed them, and a
step costs one barrier between its neurons' update and its delivery (see the kernel's
header for the order of every sum).

`explain` says why a network or a run is not taken; `nj.kernels.whole_networks(False)` and
`nj.kernels.use("reference")` keep the per-step path. Derivatives are the per-step path's:
the call is wrapped in a `jax.custom_jvp` whose tangent is the JVP of the per-step scan.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

from .._recording import count_dtype
from ..kernels import _build, _config, _pallas, _pallas_network
from ..neurons import LIF
from ..neurons._lif import LIFState
from ..synapses import ConductanceOutput, CurrentOutput, Exponential
from ..synapses._kinetics import ExponentialState
from ._sources import SpikeSource

__all__ = ["explain", "fused_run", "TARGET"]

TARGET = "nj_network_run"
_TARGETS = ((TARGET, "NjNetworkRun"),)


def _platform() -> str | None:
    """Why this trace may not take the CPU whole run, or None."""
    if _config.mode() == "reference":
        return "nj.kernels.use('reference') is in force"
    if not _pallas_network.whole_networks_enabled():
        return "nj.kernels.whole_networks(False) is in force"
    if _pallas.interpret_mode() != "off" or _config.cross_platform_enabled():
        return "a GPU slot is being traced (interpret or cross_platform)"
    if jax.default_backend() != "cpu":
        return f"the backend is {jax.default_backend()!r}, not the CPU"
    if not _build.register_targets(_TARGETS):
        return "the compiled CPU kernels are unavailable"
    return None


def _is_f32(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray) and x.dtype == jnp.float32


def _network_reason(net, state, inputs, dt, every, options) -> str | None:
    """Why the network, its state or the run's options do not fit the kernel, or None."""
    if options.get("spike_dtype", "bool") != "bool":
        return f"spike_dtype={options.get('spike_dtype')!r} (the kernel records the raster)"
    if options.get("record") is not None:
        return "state fields are recorded"
    if options.get("check") or options.get("checkpoint"):
        return "check or checkpoint is asked for"
    if options.get("truncate_backprop") is not None:
        return "truncate_backprop is asked for"
    if options.get("kind", "none") != "none" or inputs is not None:
        return "simulate is given inputs"
    for name, value in net.inputs.items():
        if callable(value):
            return f"the network's input to {name!r} is a function of time"
        if not _is_f32(jnp.asarray(value)) or jnp.ndim(value) > 1:
            return f"the network's input to {name!r} is not a float32 scalar or vector"
    if net.gap_junctions:
        return "the network has gap junctions"
    if net.dt is not None and abs(net.dt - dt) > 1e-9 * net.dt:
        return f"dt={dt} differs from the network's dt={net.dt}"
    if every > 255:
        return f"record_every={every} (counts above 255 per window)"
    if jnp.ndim(state.step) != 0:
        return "the state is batched (one trial per call)"
    for gi, (names, model) in enumerate(zip(net.groups, net.group_models, strict=True)):
        if isinstance(model, SpikeSource):
            if not callable(getattr(model, "cpu_run_counts", None)):
                return f"spike source {names[0]!r} ({type(model).__name__}) has no CPU whole run"
            if model.cpu_run_counts(state.populations[names[0]], dt) is None:
                return f"spike source {names[0]!r} cannot be drawn by the kernel"
            continue
        if not isinstance(model, LIF) or type(model).step is not LIF.step:
            return f"group {gi} is not an nj.LIF ({type(model).__name__})"
        for n in names:
            st = state.populations[n]
            if type(st) is not LIFState:
                return f"population {n!r} has a {type(st).__name__}, not an nj.LIFState"
            if not (_is_f32(st.v) and _is_f32(st.refractory)):
                return f"population {n!r}'s state is not float32"
            if st.v.shape != (net.sizes[n],) or st.refractory.shape != (net.sizes[n],):
                return f"population {n!r}'s state is batched (one trial per call)"
        for p in (model.tau_m, model.v_rest, model.v_reset, model.v_th, model.r_m, model.t_ref):
            if not _is_f32(jnp.asarray(p)):
                return f"group {gi}'s parameters are not float32"
    methods = {m.method for m in net.group_models if not isinstance(m, SpikeSource)}
    if len(methods) > 1:
        return f"the LIF groups integrate by different methods ({sorted(methods)})"
    for i, pr in enumerate(net.projections):
        where = f"projection {i} ({pr.pre} -> {pr.post})"
        if pr.short_term is not None or pr.learnable_delays:
            return f"{where} has short-term plasticity or learnable delays"
        if pr.plasticity is not None:
            why = _plastic_reason(pr, state.plastic[i])
            if why is not None:
                return f"{where}: {why}"
        if type(pr.synapse) is not Exponential or type(pr.output) not in (
            CurrentOutput,
            ConductanceOutput,
        ):
            return f"{where}: kinetics {type(pr.synapse).__name__} with {type(pr.output).__name__}"
        if type(pr.output) is ConductanceOutput:
            e_rev = jnp.asarray(pr.output.e_rev)
            if not _is_f32(e_rev) or e_rev.shape not in ((), (net.sizes[pr.post],)):
                return f"{where}'s reversal potential is not a float32 scalar or vector"
        st = state.synapses[i]
        if type(st) is not ExponentialState or not _is_f32(st.g):
            return f"{where}'s synaptic state is not a float32 ExponentialState"
        if st.g.shape != (net.sizes[pr.post],):
            return f"{where}'s synaptic state is batched (one trial per call)"
        from_source = isinstance(net.group_models[net._plan.group_of(pr.pre)], SpikeSource)
        name = getattr(pr.layout, "name", None)
        if from_source and name != "input":
            return f"{where}: a source's projection through the {name!r} layout"
        if not from_source and name != "event":
            return f"{where}: the {name!r} layout (the kernel delivers the event layout)"
        if name == "event" and not _is_f32(pr.layout.weights):
            return f"{where}'s weights are not float32"
    for buf in state.buffers:
        if not _is_f32(buf) or buf.ndim != 2:
            return "a ring buffer is batched or not float32"
    return None


def _plastic_reason(pr, ps) -> str | None:
    """Why the plastic projection `pr` (state `ps`) is not one the kernel updates, or None:
    pair STDP (`pair_kernel()`, `nj.STDP` in both modes and pairings) through the event
    layout, float32, one trial, without a delay history."""
    rule = pr.plasticity
    pair = rule.pair_kernel()
    if pair is None:
        return f"the rule {type(rule).__name__} is not pair STDP (the kernel runs nj.STDP)"
    if getattr(pr.layout, "name", None) != "event" or pr.layout.col_ptr is None:
        return "plastic through a layout without columns"
    if getattr(ps, "history", None) is not None:
        return "its presynaptic spikes reach the rule through a delay history"
    for x in (pair.a_plus, pair.a_minus, pair.w_min, pair.w_max):
        if not _is_f32(jnp.asarray(x)) or jnp.ndim(x) != 0:
            return "its rule's parameters are not float32 scalars"
    w, pre, post = ps.weights, ps.pre_traces, ps.post_traces
    if not (_is_f32(w) and w.shape == pr.layout.indices.shape):
        return "its plastic weights are not float32, one per synapse (one trial per call)"
    if len(pre) != 1 or len(post) != 1:
        return "its rule keeps other traces than one per side"
    if not (_is_f32(pre[0]) and pre[0].shape == (pr.layout.n_pre,)):
        return "its presynaptic trace is not float32, one per neuron (one trial per call)"
    if not (_is_f32(post[0]) and post[0].shape == (pr.layout.n_post,)):
        return "its postsynaptic trace is not float32, one per neuron (one trial per call)"
    return None


def explain(net, state, inputs=None, *, dt: float, every: int = 1, **options) -> str:
    """One sentence: whether the CPU runs this chunk in `nj_network_run`, and why."""
    why = _platform() or _network_reason(net, state, inputs, dt, every, options)
    if why is None:
        return "network_run (CPU): the whole run in one compiled call on the kernels' threads"
    return f"per-step: {why}"


def _args(net, state, dt: float):
    """The kernel's arrays and static metadata for `net` and `state`."""
    plan = net._plan
    lif_off, n_lif = {}, 0  # population -> first neuron in the LIF vector
    src_off, n_src, sources = {}, 0, []
    for names, model in zip(net.groups, net.group_models, strict=True):
        if isinstance(model, SpikeSource):
            src_off[names[0]] = (len(sources), n_src)
            sources.append((names[0], model))
            n_src += net.sizes[names[0]]
            continue
        for n in names:
            lif_off[n] = n_lif
            n_lif += net.sizes[n]
    # LIF state and parameters, per neuron, in group order
    v, r, params = [], [], []
    for names, model in zip(net.groups, net.group_models, strict=True):
        if isinstance(model, SpikeSource):
            continue
        size = sum(net.sizes[n] for n in names)
        v += [state.populations[n].v for n in names]
        r += [state.populations[n].refractory for n in names]
        c = dt / model.tau_m if model.method == "euler" else jnp.exp(-dt / model.tau_m)
        rows = (model.v_rest, model.r_m, c, model.v_reset, model.v_th, model.t_ref)
        rows = [jnp.broadcast_to(jnp.asarray(x, jnp.float32), (size,)) for x in rows]
        bias = [
            jnp.broadcast_to(jnp.asarray(net.inputs.get(n, 0.0), jnp.float32), (net.sizes[n],))
            for n in names
        ]
        params.append(jnp.stack(rows + [jnp.concatenate(bias)]))
    euler = any(not isinstance(m, SpikeSource) and m.method == "euler" for m in net.group_models)
    v = jnp.concatenate(v) if v else jnp.zeros((0,), jnp.float32)
    r = jnp.concatenate(r) if r else jnp.zeros((0,), jnp.float32)
    params = jnp.concatenate(params, axis=1) if params else jnp.zeros((7, 0), jnp.float32)
    dts = jnp.asarray([dt, 0.5 * dt], jnp.float32)
    # synaptic states (projections that have their own), current terms
    syn_index, g, decay, e_rev, syn_meta, g_off = {}, [], [], [], [], 0
    for i, pr in enumerate(net.projections):
        if plan.shares(i):
            continue
        ring, col0 = plan.ring_of[i]
        n_post = net.sizes[pr.post]
        conductance = type(pr.output) is ConductanceOutput
        syn_index[i] = len(syn_meta) // 6
        syn_meta += [g_off, ring, col0, n_post, lif_off[pr.post], int(conductance)]
        g.append(state.synapses[i].g)
        decay.append(jnp.broadcast_to(jnp.exp(-dt / pr.synapse.tau).astype(jnp.float32), (n_post,)))
        reversal = pr.output.e_rev if conductance else 0.0
        e_rev.append(jnp.broadcast_to(jnp.asarray(reversal, jnp.float32), (n_post,)))
        g_off += n_post
    pop_meta, terms = [], []
    for names, model in zip(net.groups, net.group_models, strict=True):
        if isinstance(model, SpikeSource):
            continue
        for n in names:
            mine = [
                syn_index[i]
                for i, pr in enumerate(net.projections)
                if pr.post == n and i in syn_index
            ]
            pop_meta += [lif_off[n], net.sizes[n], len(terms), len(mine), int(n in net.inputs)]
            terms += mine
    g = jnp.concatenate(g) if g else jnp.zeros((0,), jnp.float32)
    decay = jnp.concatenate(decay) if decay else jnp.zeros((0,), jnp.float32)
    e_rev = jnp.concatenate(e_rev) if e_rev else jnp.zeros((0,), jnp.float32)
    # rings
    ring_meta = []
    for slots, width in net.ring_shape:
        ring_meta += [slots, width]
    rings = jnp.concatenate([b.reshape(-1) for b in state.buffers])
    # sources
    keys, levels, tables, counts, source_meta, t_off = [], [], [], [], [], 0
    for name, model in sources:
        key_data, level, table = model.cpu_run_counts(state.populations[name], dt)
        keys.append(key_data.reshape(2))
        levels.append(level.astype(jnp.int32))
        tables.append(table.reshape(-1))
        counts.append(state.populations[name].spikes)
        source_meta += [src_off[name][1], net.sizes[name], t_off, table.shape[-1]]
        t_off += table.size
    keys = jnp.stack(keys) if keys else jnp.zeros((0, 2), jnp.uint32)
    levels = jnp.concatenate(levels) if levels else jnp.zeros((0,), jnp.int32)
    tables = jnp.concatenate(tables) if tables else jnp.zeros((0,), jnp.float32)
    counts = jnp.concatenate(counts) if counts else jnp.zeros((0,), jnp.float32)
    # projections
    event_meta, input_meta, extra, plastic_meta, plastic_extra = [], [], [], [], []
    for i, pr in enumerate(net.projections):
        ring, col0 = plan.ring_of[i]
        lay = pr.layout
        n_post = net.sizes[pr.post]
        if lay.name == "event" and pr.plasticity is not None:
            # pair STDP: its state, columns and parameters (the decays as the per-step path
            # computes them, `plastic_step`)
            ps = state.plastic[i]
            pair = pr.plasticity.pair_kernel()
            (decay_x,), (decay_y,) = pr.plasticity.trace_decays(dt)
            rule_params = jnp.stack(
                [
                    jnp.asarray(x).astype(jnp.float32)
                    for x in (pair.a_plus, pair.a_minus, pair.w_min, pair.w_max, decay_x, decay_y)
                ]
            )
            plastic_meta += [len(event_meta) // 9, int(pair.multiplicative), int(pair.nearest)]
            plastic_extra += [
                ps.weights,
                ps.pre_traces[0],
                ps.post_traces[0],
                lay.col_ptr.astype(jnp.int32),
                lay.col_syn.astype(jnp.int32),
                lay.col_pre.astype(jnp.int32),
                rule_params,
            ]
        if lay.name == "event":
            per = net.delay_steps[i] is not None
            d = net.delay_steps[i] if per else jnp.zeros((1,), jnp.int32)
            homo = 0 if per else int(plan.delay_steps[i] or 0)
            event_meta += [
                lif_off[pr.pre],
                lay.n_pre,
                ring,
                col0,
                n_post,
                lif_off[pr.post],
                homo,
                int(per),
                int(lay.sorted_rows),
            ]
            extra += [lay.indptr, lay.indices, lay.weights, d]
    for i, pr in enumerate(net.projections):
        ring, col0 = plan.ring_of[i]
        lay = pr.layout
        if lay.name == "input":
            k, _ = src_off[pr.pre]
            input_meta += [
                k,
                ring,
                col0,
                net.sizes[pr.post],
                lif_off[pr.post],
                int(plan.delay_steps[i] or 0),
            ]
            extra += [lay.pre.astype(jnp.int32), lay.weight.astype(jnp.float32)]
    extra += plastic_extra
    meta = dict(
        euler=np.int64(euler),
        pop_meta=np.asarray(pop_meta, np.int64),
        terms=np.asarray(terms, np.int64),
        syn_meta=np.asarray(syn_meta, np.int64),
        ring_meta=np.asarray(ring_meta, np.int64),
        event_meta=np.asarray(event_meta, np.int64),
        input_meta=np.asarray(input_meta, np.int64),
        source_meta=np.asarray(source_meta, np.int64),
        plastic_meta=np.asarray(plastic_meta, np.int64),
    )
    arrays = (
        v,
        r,
        params,
        dts,
        g,
        decay,
        e_rev,
        rings,
        jnp.asarray(state.step, jnp.int32),
        keys,
        levels,
        tables,
        counts,
        *extra,
    )
    layout = dict(
        lif_off=lif_off,
        n_lif=n_lif,
        src_off=src_off,
        n_src=n_src,
        syn_index=syn_index,
        sources=sources,
        plastic=[i for i, pr in enumerate(net.projections) if pr.plasticity is not None],
    )
    return arrays, meta, layout


def _kernel(net, state, dt: float, n_rec: int, every: int):
    """The kernel's call: the new state and `{population: record}`."""
    arrays, meta, lay = _args(net, state, dt)
    n_steps = n_rec * every
    spike_t = jnp.bool_ if every == 1 else count_dtype(every)
    src_t = (
        count_dtype(max(m.max_spikes_per_step for _, m in lay["sources"]) * every)
        if lay["sources"]
        else jnp.uint8
    )
    v, r, g, rings, keys, counts = arrays[0], arrays[1], arrays[4], arrays[7], arrays[9], arrays[12]
    shapes = (
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(r.shape, r.dtype),
        jax.ShapeDtypeStruct(g.shape, g.dtype),
        jax.ShapeDtypeStruct(rings.shape, rings.dtype),
        jax.ShapeDtypeStruct(keys.shape, keys.dtype),
        jax.ShapeDtypeStruct(counts.shape, counts.dtype),
        # per plastic projection its weights and traces
        *(
            jax.ShapeDtypeStruct(x.shape, jnp.float32)
            for i in lay["plastic"]
            for x in (
                state.plastic[i].weights,
                state.plastic[i].pre_traces[0],
                state.plastic[i].post_traces[0],
            )
        ),
        # one raster per LIF population (in the kernel's order), then one per source
        *(jax.ShapeDtypeStruct((n_rec, net.sizes[n]), spike_t) for n in lay["lif_off"]),
        *(jax.ShapeDtypeStruct((n_rec, net.sizes[n]), src_t) for n, _ in lay["sources"]),
    )
    call = jax.ffi.ffi_call(TARGET, shapes, input_output_aliases={7: 3}, vmap_method="sequential")
    v, r, g, rings, keys, counts, *rest = call(
        *arrays, n_steps=np.int64(n_steps), every=np.int64(every), **meta
    )
    n_plastic = len(lay["plastic"])
    plastic_out, rasters = rest[: 3 * n_plastic], rest[3 * n_plastic :]
    plastic = list(state.plastic)
    for q, i in enumerate(lay["plastic"]):
        w, x, y = plastic_out[3 * q : 3 * q + 3]
        plastic[i] = eqx.tree_at(
            lambda s: (s.weights, s.pre_traces, s.post_traces), plastic[i], (w, (x,), (y,))
        )
    # the new state
    pops = dict(state.populations)
    for n, off in lay["lif_off"].items():
        size = net.sizes[n]
        pops[n] = LIFState(v=v[off : off + size], refractory=r[off : off + size])
    for si, (name, _) in enumerate(lay["sources"]):
        _, off = lay["src_off"][name]
        st = state.populations[name]
        key = keys[si]
        if jnp.issubdtype(st.key.dtype, jax.dtypes.prng_key):
            key = jr.wrap_key_data(key, impl=jr.key_impl(st.key))
        pops[name] = type(st)(key=key, spikes=counts[off : off + net.sizes[name]])
    synapses = list(state.synapses)
    g_off = 0
    for i, pr in enumerate(net.projections):
        if i in lay["syn_index"]:
            n_post = net.sizes[pr.post]
            synapses[i] = ExponentialState(g=g[g_off : g_off + n_post])
            g_off += n_post
    buffers, off = [], 0
    for slots, width in net.ring_shape:
        buffers.append(rings[off : off + slots * width].reshape(slots, width))
        off += slots * width
    peak = state.peak
    if len(peak) == len(net.groups):
        sends_events = {
            gi
            for gi, idx in net.senders
            if any(net.projections[i].layout.name == "event" for i in idx)
        }
        peak = tuple(jnp.maximum(p, 0) if gi in sends_events else p for gi, p in enumerate(peak))
    else:
        peak = tuple(jnp.zeros((), jnp.int32) for _ in net.groups)
    new = type(state)(
        pops,
        tuple(synapses),
        tuple(buffers),
        state.step + n_steps,
        tuple(plastic),
        peak,
        state.short_term,
    )
    names = list(lay["lif_off"]) + [name for name, _ in lay["sources"]]
    spikes = dict(zip(names, rasters, strict=True))
    spikes = {n: spikes[n] for n in net.sizes}
    return new, spikes


def _per_step(net, state, dt: float, n_steps: int):
    """The final state of `n_steps` steps of `Network.step` (the per-step path): the
    function whose JVP is the kernel's."""

    def body(st, _):
        st, _ = net.step(st, None, dt)
        return st, None

    return jax.lax.scan(body, state, None, length=n_steps)[0]


def fused_run(net, state, inputs, dt, n_rec, record_every, **options):
    """The chunk in `nj_network_run`, or None (see the module docstring). The derivative is
    the per-step path's: the JVP of `n_rec * record_every` steps of `Network.step` (the
    recorded spikes, booleans or counts, have none)."""
    if _platform() is not None:
        return None
    if _network_reason(net, state, inputs, dt, record_every, options) is not None:
        return None
    # Every array is an argument of the custom JVP (integer ones get float0 tangents), so
    # that nothing traced is closed over; the rest (Python values) is static.
    arrays, rest = eqx.partition((net, state), eqx.is_array)

    @jax.custom_jvp
    def run(arrays):
        n, s = eqx.combine(arrays, rest)
        return _kernel(n, s, dt, n_rec, record_every)

    @run.defjvp
    def _jvp(primals, tangents):
        out = run(*primals)

        def final(a):
            n, s = eqx.combine(a, rest)
            return eqx.filter(_per_step(n, s, dt, n_rec * record_every), eqx.is_inexact_array)

        _, dstate = jax.jvp(final, primals, tangents)
        new, spikes = out
        zeros = jtu.tree_map(
            lambda x: (
                jnp.zeros_like(x)
                if jnp.issubdtype(x.dtype, jnp.inexact)
                else np.zeros(x.shape, jax.dtypes.float0)
            ),
            (new, spikes),
        )
        # the state's float leaves take the per-step tangent, the rest none
        d_new = eqx.combine(dstate, eqx.filter(zeros[0], eqx.is_inexact_array, inverse=True))
        return out, (d_new, zeros[1])

    return run(arrays)
