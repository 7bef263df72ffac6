"""`Network.fused_run` and `Network.explain_run`: a network that fits one GPU program runs a
whole chunk of `nj.simulate` in the registry entry `network_run`
(`neurojax.kernels._pallas_network`), one program per trial.

`plan` turns a network, its state and the run's options into the entry's static `RunSpec`
and flat arguments, or into the sentence that says why the network does not fit (then
`fused_run` answers None and `simulate` scans `Network.step`, the per-step path).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

from .. import kernels
from .._recording import count_dtype
from ..kernels import _pallas, _pallas_network
from ..kernels._pallas_network import PopSpec, ProjSpec, RunSpec
from ..neurons import LIF, AdEx, Izhikevich
from ..plasticity import STDP
from ..plasticity._base import replace_state
from ..synapses import TsodyksMarkram
from ..synapses._short_term import _release_reference
from ._sources import PoissonSource

__all__ = ["fused_run", "explain_run", "plan", "platform_reason"]

# The neuron models whose own `step` the kernel traces: elementwise, float state. A subclass
# that overrides `step` is not in the set (its maths may not be elementwise).
_STEPS = {LIF.step: "LIF", Izhikevich.step: "Izhikevich", AdEx.step: "AdEx"}


class _Plan:
    """What `plan` found: the spec, the arguments and how to rebuild the results."""

    def __init__(self, spec, args, batch, unpack):
        self.spec, self.args, self.batch, self.unpack = spec, args, batch, unpack


def _lanes(n: int) -> int:
    return _pallas.next_pow2(n)


def _as_lanes(x: Any, n: int, npad: int, batch: tuple[int, ...], dtype, what: str):
    """A parameter or input as a `(1 or T, 1 or npad)` argument (edge-padded lanes), or the
    reason it cannot be one."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return f"{what} is not a float array ({x.dtype})"
    x = x.astype(dtype)
    if x.size == 1:
        return x.reshape(1, 1)
    if x.ndim == 1 and x.shape[0] == n:
        return jnp.pad(x[None], ((0, 0), (0, npad - n)), mode="edge")
    try:
        fits = x.ndim > 1 and jnp.broadcast_shapes(x.shape, (*batch, n)) == (*batch, n)
    except ValueError:
        fits = False
    if not fits:
        want = (*batch, n)
        return f"{what} of shape {x.shape} is neither one value, one per neuron ({n}) nor {want}"
    x = jnp.broadcast_to(x, (*batch, n)).reshape(-1, n)
    return jnp.pad(x, ((0, 0), (0, npad - n)), mode="edge")


def _state_rows(x: jax.Array, n: int, npad: int, batch: tuple[int, ...]):
    """A state leaf `(*batch, n)` as `(T, npad)` (edge-padded: padding lanes stay finite)."""
    x = jnp.broadcast_to(x, (*batch, n)).reshape(-1, n)
    return jnp.pad(x, ((0, 0), (0, npad - n)), mode="edge")


def platform_reason() -> tuple[bool, str]:
    """Whether this trace may take `network_run`, and why (the mode and the platform)."""
    if kernels.mode() == "reference":
        return False, "nj.kernels.use('reference') is in force: the pure-JAX per-step path runs"
    if not _pallas_network.whole_networks_enabled():
        return False, "nj.kernels.whole_networks(False) is in force: networks run per step"
    if _pallas.interpret_mode() == "gpu":
        return True, "nj.kernels.interpret('gpu') runs the GPU slot on the CPU, interpreted"
    if jax.default_backend() in ("gpu", "cuda"):
        return True, "a GPU backend"
    if kernels._config.cross_platform_enabled():
        return True, "nj.kernels.cross_platform() traces the GPU slot for a CUDA lowering"
    return False, "the CPU keeps the per-step path and its compiled C++ kernels"


def plan(
    net,
    state,
    inputs: Any,
    dt: float,
    n_rec: int,
    every: int,
    *,
    kind: str = "none",
    record: Any = None,
    spike_dtype: str | None = "bool",
    check: bool = False,
    checkpoint: bool = False,
    truncate_backprop: int | None = None,
    limits: "_pallas_network.Limits | None" = None,
) -> "_Plan | str":
    """The `network_run` call for this chunk of `simulate`, or why there is none."""
    if spike_dtype != "bool":
        return f"spike_dtype={spike_dtype!r} (the kernel records the bool raster or counts)"
    if check or checkpoint or truncate_backprop is not None:
        return "check, checkpoint or truncate_backprop is asked for"
    if kind not in ("none", "const", "series"):
        return f"inputs of kind {kind!r} (a function of time is not traced into the kernel)"
    if net.gap_junctions:
        return "the network has gap junctions"
    if net.dt is not None and abs(net.dt - dt) > 1e-9 * net.dt:
        return f"dt={dt} differs from the network's dt={net.dt}"
    models = net.populations
    names = list(net.sizes)
    # ---- populations
    first = jtu.tree_leaves(state.populations[names[0]])
    lead = None
    for name in names:
        st = state.populations[name]
        if isinstance(models[name], PoissonSource):
            leaf = st.spikes
        else:
            leaf = getattr(st, "v", None)
            if leaf is None:
                return f"population {name!r}'s state has no v"
        lead = leaf.shape[:-1] if lead is None else lead
        if leaf.shape[:-1] != lead:
            return "the populations' states have different batch shapes"
    batch = tuple(lead or ())
    n_trials = int(np.prod(batch, dtype=np.int64))
    dtype = first[0].dtype if first else jnp.float32
    if isinstance(models[names[0]], PoissonSource):
        dtype = state.populations[names[0]].spikes.dtype
    if dtype not in (jnp.float32, jnp.float64):
        return f"the state's dtype is {dtype} (float32 or float64 are served)"
    ext = {}
    if kind != "none":
        if not isinstance(inputs, Mapping):
            return "simulate's inputs are not a dict {population: current}"
        for name, value in inputs.items():
            if name not in net.sizes or isinstance(models[name], PoissonSource):
                return f"simulate's inputs name {name!r}, not a neuron population"
            ext[name] = value
    offsets, off = {}, 0
    for name in names:
        offsets[name] = off
        off += net.sizes[name]
    pop_index = {name: p for p, name in enumerate(names)}
    args: list[Any] = []
    words_of = []  # registers per population and projection: one per lane of each array
    counting = int(every > 1)  # spike counts carried through a window (not for the raster)
    pop_specs = []
    pop_treedefs = []
    projs = net.projections
    for name in names:
        model, st, n = models[name], state.populations[name], net.sizes[name]
        npad = _lanes(n)
        if isinstance(model, PoissonSource):
            if type(model).step is not PoissonSource.step:
                return f"population {name!r}: a PoissonSource subclass with its own step"
            model.check_dt(dt)
            key = st.key
            if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
                return f"population {name!r}: the source's key is not a typed PRNG key"
            words = jr.key_data(key)
            if words.shape[-1:] != (2,):
                return f"population {name!r}: the key has {words.shape[-1]} words (threefry: 2)"
            words = words.astype(jnp.uint32).reshape(-1, 2)
            if words.shape[0] not in (1, n_trials):
                words = (
                    jnp.broadcast_to(jr.key_data(key), (*batch, 2))
                    .reshape(-1, 2)
                    .astype(jnp.uint32)
                )
            # each trial's words, its index in this call mixed in (not the kernel's program
            # id: a vmap of such calls folds them into one launch, each drawing as alone)
            words = _pallas_network.trial_key_words(words, n_trials)
            rate = _as_lanes(model.rate, n, npad, batch, dtype, f"population {name!r}: rate")
            if isinstance(rate, str):
                return rate
            args += [_state_rows(st.spikes.astype(dtype), n, npad, batch), words, rate]
            words_of.append(npad * (1 + counting + (rate.shape[-1] > 1)))
            pop_specs.append(PopSpec(n, npad, True, None, 1, None, 0, (), offsets[name]))
            pop_treedefs.append(None)
            continue
        if type(model).step not in _STEPS:
            return (
                f"population {name!r}: {type(model).__name__}'s step is not one the kernel "
                f"traces ({', '.join(_STEPS.values())})"
            )
        leaves, st_def = jtu.tree_flatten(st)
        for leaf in leaves:
            if leaf.dtype != dtype or leaf.shape != (*batch, n):
                return (
                    f"population {name!r}: a state leaf of shape {leaf.shape} {leaf.dtype}, "
                    f"not {(*batch, n)} {dtype}"
                )
        m_leaves, m_def = jtu.tree_flatten(model)
        m_args = []
        for j, x in enumerate(m_leaves):
            a = _as_lanes(x, n, npad, (), dtype, f"population {name!r}: parameter {j}")
            if isinstance(a, str):
                return a
            m_args.append(a)
        terms = [("proj", i) for i, pr in enumerate(projs) if pr.post == name]
        in_args = []
        if name in net.inputs:
            value = net.inputs[name]
            if callable(value) and not isinstance(value, (jax.Array, np.ndarray)):
                return f"inputs[{name!r}] is a function of time (not traced into the kernel)"
            a = _as_lanes(value, n, npad, batch, dtype, f"inputs[{name!r}]")
            if isinstance(a, str):
                return a
            terms.append(("const", len(in_args)))
            in_args.append(a)
        if name in ext:
            value = jnp.asarray(ext[name])
            if kind == "const":
                a = _as_lanes(value, n, npad, batch, dtype, f"simulate's inputs[{name!r}]")
                if isinstance(a, str):
                    return a
                terms.append(("const", len(in_args)))
            else:
                a = _series(value, n, npad, batch, n_trials, dtype, name, n_rec * every)
                if isinstance(a, str):
                    return a
                terms.append(("series", len(in_args)))
            in_args.append(a)
        args += [_state_rows(x, n, npad, batch) for x in leaves] + m_args + in_args
        per_neuron = sum(a.shape[-1] > 1 for a in m_args + in_args)
        words_of.append(npad * (counting + len(leaves) + per_neuron))
        pop_specs.append(
            PopSpec(
                n,
                npad,
                False,
                m_def,
                len(m_args),
                st_def,
                len(leaves),
                tuple(terms),
                offsets[name],
            )
        )
        pop_treedefs.append(st_def)
    # ---- projections
    proj_specs = []
    for i, pr in enumerate(projs):
        where = f"projections[{i}] ({pr.pre} -> {pr.post})"
        if net.synapse_of[i] != i:
            return f"{where} shares another's synaptic state (merge_synapses=True)"
        if pr.learnable_delays:
            return f"{where} has learnable delays"
        lay = pr.layout
        if getattr(lay, "name", None) != "event" or not hasattr(lay, "indptr"):
            return (
                f"{where} has the {getattr(lay, 'name', type(lay).__name__)!r} layout "
                "(the kernel walks the event layout's rows: build it with layout='event')"
            )
        if lay.indptr.ndim != 1 or lay.weights.ndim != 1:
            return f"{where}: its tables are split per device"
        limits = limits or _pallas_network.device_limits()
        if lay.max_fan_out > limits.max_fan_out:
            return f"{where}: fan-out {lay.max_fan_out} > {limits.max_fan_out} ({limits.source})"
        n_post = pr.n_post
        npad_post = _lanes(n_post)
        s_leaves, s_def = jtu.tree_flatten(state.synapses[i])
        for leaf in s_leaves:
            if leaf.dtype != dtype or leaf.shape != (*batch, n_post):
                return f"{where}: a synapse state leaf of shape {leaf.shape} {leaf.dtype}"
        k_leaves, k_def = jtu.tree_flatten(pr.synapse)
        o_leaves, o_def = jtu.tree_flatten(pr.output)
        k_args, o_args = [], []
        for what, src, dst in (("synapse", k_leaves, k_args), ("output", o_leaves, o_args)):
            for j, x in enumerate(src):
                a = _as_lanes(x, n_post, npad_post, (), dtype, f"{where}: {what} parameter {j}")
                if isinstance(a, str):
                    return a
                dst.append(a)
        args += [_state_rows(x, n_post, npad_post, batch) for x in s_leaves] + k_args + o_args
        per_neuron = sum(a.shape[-1] > 1 for a in k_args + o_args)
        words_of.append(npad_post * (len(s_leaves) + per_neuron))
        stp = None
        if pr.short_term is not None:
            found = _stp_args(pr.short_term, state.short_term[i], batch, dtype, where)
            if isinstance(found, str):
                return found
            stp_args, stp_words = found
            args += stp_args
            words_of.append(stp_words)
            stp = _release_reference
        rule_def, n_rule = None, 0
        weights = lay.weights.astype(dtype)[None]
        if pr.plasticity is not None:
            found = _stdp_args(pr, state.plastic[i], batch, dtype, where)
            if isinstance(found, str):
                return found
            rule_args, rule_def, n_rule, weights, stdp_words = found
            args += rule_args
            words_of.append(stdp_words)
        delay = net.homogeneous_delay_steps[i]
        args += [
            lay.indptr.astype(jnp.int32)[None],
            lay.indices.astype(jnp.int32)[None],
            weights,
        ]
        if delay is None:
            args.append(pr.delay_steps.astype(jnp.int32)[None])
        ring, col = net.ring_of[i]
        proj_specs.append(
            ProjSpec(
                pop_index[pr.pre],
                pop_index[pr.post],
                ring,
                col,
                delay,
                pr.n_pre,
                lay.max_fan_out,
                k_def,
                len(k_args),
                s_def,
                len(s_leaves),
                o_def,
                len(o_args),
                stp,
                rule_def,
                n_rule,
                pr.max_fan_in if rule_def is not None else 0,
            )
        )
    for buf, (d_slots, width) in zip(state.buffers, net.ring_shape, strict=True):
        if buf.dtype != dtype:
            return f"a ring buffer is {buf.dtype}, the state {dtype}"
        args.append(jnp.broadcast_to(buf, (*batch, d_slots, width)).reshape(n_trials, -1))
    step = jnp.asarray(state.step, jnp.int32)
    args.append(jnp.broadcast_to(step, batch).reshape(n_trials))
    # ---- what fits one program
    limits = limits or _pallas_network.device_limits()
    words = sum(words_of)
    if words > limits.registers:
        return (
            f"the network needs {words} registers per program (state, synapses, per-neuron "
            f"parameters, one word per lane each) > {limits.registers} ({limits.source})"
        )
    ring_bytes = n_trials * sum(d * w for d, w in net.ring_shape) * jnp.dtype(dtype).itemsize
    if ring_bytes > limits.ring_bytes:
        return f"its rings take {ring_bytes} bytes > {limits.ring_bytes} ({limits.source})"
    # ---- records
    rec = []
    if record is not None:
        if callable(record) or not isinstance(record, tuple):
            return "record is a function or a per-run field list (not per population)"
        for entry in record:
            if not (isinstance(entry, tuple) and len(entry) == 3):
                return "record names top-level state fields"
            field, pop, sel = entry
            if sel is not None:
                return f"record selects a subset of {pop!r}'s neurons"
            p = pop_index[pop]
            if pop_specs[p].source:
                return f"record reads the spike source {pop!r}"
            paths = [
                jtu.keystr(path).lstrip(".")
                for path, _ in jtu.tree_flatten_with_path(state.populations[pop])[0]
            ]
            if field not in paths:
                return f"record names {field!r}, not a leaf of {pop!r}'s state"
            rec.append((p, paths.index(field)))
    spec = RunSpec(
        pops=tuple(pop_specs),
        projs=tuple(proj_specs),
        rings=tuple(net.ring_shape),
        dt=float(dt),
        n_rec=int(n_rec),
        every=int(every),
        record=tuple(rec),
        spikes_dtype="bool" if every == 1 else jnp.dtype(count_dtype(every)).name,
    )

    def unpack(out):
        out = list(out)
        pops = {}
        for name, pop, st_def in zip(names, pop_specs, pop_treedefs, strict=True):
            st = state.populations[name]
            if pop.source:
                spikes = out.pop(0)[:, : pop.n].reshape(*batch, pop.n)
                pops[name] = type(st)(key=st.key, spikes=spikes)
                continue
            leaves = [out.pop(0)[:, : pop.n].reshape(*batch, pop.n) for _ in range(pop.n_state)]
            pops[name] = jtu.tree_unflatten(st_def, leaves)
        synapses = []
        for pr in proj_specs:
            n_post = pop_specs[pr.post].n
            leaves = [out.pop(0)[:, :n_post].reshape(*batch, n_post) for _ in range(pr.n_syn_state)]
            synapses.append(jtu.tree_unflatten(pr.syn_state, leaves))
        rings = [out.pop(0).reshape(*batch, d_slots, width) for d_slots, width in net.ring_shape]
        spikes = {}
        for name, pop in zip(names, pop_specs, strict=True):
            x = out.pop(0)[:, :, : pop.n]
            spikes[name] = jnp.moveaxis(x, 1, 0).reshape(n_rec, *batch, pop.n)
        values: dict[str, dict[str, Any]] = {}
        for (field, pop, _), (p, _) in zip(record or (), rec, strict=True):
            x = out.pop(0)[:, :, : pop_specs[p].n]
            values.setdefault(field, {})[pop] = jnp.moveaxis(x, 1, 0).reshape(
                n_rec, *batch, pop_specs[p].n
            )
        short = list(state.short_term)
        for i, pr in enumerate(proj_specs):
            if pr.stp is None:
                continue
            n_pre = pop_specs[pr.pre].n
            u, r, last = (out.pop(0)[:, :n_pre].reshape(*batch, n_pre) for _ in range(3))
            short[i] = type(state.short_term[i])(u=u, r=r, last=last)
        plastic = list(state.plastic)
        for i, pr in enumerate(proj_specs):
            if pr.rule is None:
                continue
            ps = state.plastic[i]
            n_pre, n_post = pop_specs[pr.pre].n, pop_specs[pr.post].n
            w = out.pop(0).reshape(*batch, -1)
            x = out.pop(0)[:, :n_pre].reshape(*batch, n_pre)
            y = out.pop(0)[:, :n_post].reshape(*batch, n_post)
            plastic[i] = replace_state(ps, weights=w, pre_traces=(x,), post_traces=(y,))
        new = type(state)(
            pops,
            tuple(synapses),
            tuple(rings),
            state.step + n_rec * every,
            tuple(plastic),
            state.peak,
            tuple(short),
        )
        return new, spikes, values

    return _Plan(spec, tuple(args), batch, unpack)


def _stp_args(rule, st, batch, dtype, where):
    """A Tsodyks-Markram projection's short-term arguments `(u, r, last, u_par, rate_rec,
    rate_facil)` as `TsodyksMarkram.release` computes its rates, and its register words; or
    why it cannot be one."""
    if type(rule).release is not TsodyksMarkram.release:
        return f"{where}: {type(rule).__name__}'s release is not Tsodyks-Markram's"
    n = st.u.shape[-1]
    npad = _lanes(n)
    for name, leaf, want in (("u", st.u, dtype), ("r", st.r, dtype), ("last", st.last, jnp.int32)):
        if leaf.dtype != want or leaf.shape != (*batch, n):
            return f"{where}: short-term {name} of shape {leaf.shape} {leaf.dtype}"
    tau_f = jnp.asarray(rule.tau_facil).astype(dtype)
    facil = tau_f > 0
    rate_f = jnp.where(facil, 1 / jnp.where(facil, tau_f, 1), jnp.inf)
    rate_r = 1 / jnp.asarray(rule.tau_rec).astype(dtype)
    params = []
    for what, x in (("u", rule.u), ("rate_rec", rate_r), ("rate_facil", rate_f)):
        a = _as_lanes(x, n, npad, (), dtype, f"{where}: short-term {what}")
        if isinstance(a, str):
            return a
        params.append(a)
    rows = [_state_rows(x, n, npad, batch) for x in (st.u, st.r, st.last)]
    words = npad * (3 + sum(a.shape[-1] > 1 for a in params))
    return rows + params, words


def _stdp_args(pr, ps, batch, dtype, where):
    """A pair-STDP projection's arguments (the rule's parameters, its traces `x, y`, the
    columns), its rule's treedef and parameter count, its per-trial weights and its register
    words; or why it cannot run in the kernel."""
    rule = pr.plasticity
    if not isinstance(rule, STDP) or rule.pair_kernel() is None:
        return f"{where}: its rule {type(rule).__name__} is not pair STDP (nj.STDP's own maths)"
    if ps.history is not None:
        return f"{where}: a plastic projection with a delay (its arrivals' history)"
    if pr.col_ptr is None or pr.col_syn is None or pr.col_pre is None:
        return f"{where}: its layout holds no columns"
    leaves, rule_def = jtu.tree_flatten(rule)
    params = []
    for j, leaf in enumerate(leaves):
        leaf = jnp.asarray(leaf)
        if leaf.size != 1 or not jnp.issubdtype(leaf.dtype, jnp.floating):
            return f"{where}: STDP parameter {j} of shape {leaf.shape} (one value is served)"
        params.append(leaf.astype(dtype).reshape(1, 1))
    (x,), (y,) = ps.pre_traces, ps.post_traces
    n_pre, n_post = pr.n_pre, pr.n_post
    for name, leaf, n in (("x", x, n_pre), ("y", y, n_post)):
        if leaf.dtype != dtype or leaf.shape != (*batch, n):
            return f"{where}: the STDP trace {name} of shape {leaf.shape} {leaf.dtype}"
    nnz = pr.layout.indices.shape[0]
    w = ps.weights
    if w.dtype != dtype or w.shape[-1:] != (nnz,):
        return f"{where}: plastic weights of shape {w.shape} {w.dtype}"
    weights = jnp.broadcast_to(w, (*batch, nnz)).reshape(-1, nnz)
    npad_pre, npad_post = _lanes(n_pre), _lanes(n_post)
    rows = [_state_rows(x, n_pre, npad_pre, batch), _state_rows(y, n_post, npad_post, batch)]
    cols = [c.astype(jnp.int32)[None] for c in (pr.col_ptr, pr.col_syn, pr.col_pre)]
    return params + rows + cols, rule_def, len(params), weights, npad_pre + npad_post


def _series(value, n, npad, batch, n_trials, dtype, name, n_steps):
    """A time series `(S, ...)` as `(1, S, npad)` (shared) or `(T, S, npad)` (per trial)."""
    if not jnp.issubdtype(value.dtype, jnp.floating):
        return f"simulate's inputs[{name!r}] is not a float array ({value.dtype})"
    if value.ndim < 1 or value.shape[0] != n_steps:
        return f"simulate's inputs[{name!r}] has no leading time axis of {n_steps} steps"
    rest = value.shape[1:]
    value = value.astype(dtype)
    try:
        full = jnp.broadcast_shapes(rest, (*batch, n))
    except ValueError:
        return f"simulate's inputs[{name!r}] of shape {value.shape} does not fit {(*batch, n)}"
    if full != (*batch, n):
        return f"simulate's inputs[{name!r}] of shape {value.shape} does not fit {(*batch, n)}"
    if len(rest) <= 1:
        x = jnp.broadcast_to(value.reshape(n_steps, -1), (n_steps, n))[None]
    else:
        x = jnp.broadcast_to(value, (n_steps, *batch, n)).reshape(n_steps, n_trials, n)
        x = jnp.moveaxis(x, 1, 0)
    return jnp.pad(x, ((0, 0), (0, 0), (0, npad - n)), mode="edge")


def fused_run(net, state, inputs, dt, n_rec, record_every, **options):
    """`Network.fused_run`: the chunk in `network_run`, or None (see the module docstring)."""
    ok, _ = platform_reason()
    if not ok:
        return None
    net._check_step(state, inputs if options.get("kind") in ("const", "series") else None, dt)
    found = plan(net, state, inputs, dt, n_rec, record_every, **options)
    if isinstance(found, str):
        return None
    out = kernels.call(_pallas_network.NETWORK_RUN, *found.args, spec=found.spec)
    new, spikes, values = found.unpack(out)
    return (new, spikes, values) if options.get("record") is not None else (new, spikes)


def explain_run(
    net,
    state,
    inputs: Any = None,
    *,
    dt: float,
    n_steps: int,
    record_every: int = 1,
    spike_dtype: str | None = "bool",
) -> dict[str, str]:
    """Which path `nj.simulate(net, state, inputs, dt=dt, n_steps=n_steps, ...)` takes on
    each platform, and why: `{"cpu": ..., "cuda": ..., "tpu": ...}`, each a sentence that
    starts with `"network_run"` (the whole run in one GPU program per trial) or
    `"per-step"` (the scan over `Network.step`)."""
    kind = "none" if inputs is None else "const"
    if isinstance(inputs, Mapping) and any(
        np.ndim(v) >= 1 and np.shape(v)[0] == n_steps and np.ndim(v) > 1 for v in inputs.values()
    ):
        kind = "series"
    found = plan(
        net,
        state,
        inputs,
        dt,
        max(n_steps // record_every, 1),
        record_every,
        kind=kind,
        spike_dtype=spike_dtype,
    )
    if isinstance(found, str):
        why = f"per-step: the network does not fit one program: {found}"
        return {"cpu": why, "cuda": why, "tpu": why}
    ok, reason = platform_reason()
    cpu = (
        f"network_run: {reason}"
        if ok and _pallas.interpret_mode() == "gpu"
        else "per-step: the CPU keeps the per-step path and its compiled C++ kernels"
    )
    if kernels.mode() == "reference" or not _pallas_network.whole_networks_enabled():
        return {p: f"per-step: {reason}" for p in ("cpu", "cuda", "tpu")}
    return {
        "cpu": cpu,
        "cuda": "network_run: the network fits one program per trial "
        f"({sum(p.n for p in found.spec.pops)} neurons, {len(found.spec.projs)} projections)",
        "tpu": "per-step: network_run has no TPU (Mosaic) slot",
    }
