r"""A whole network run as one Pallas Triton program per trial: the registry entry
`network_run`, which `nj.Network.fused_run` calls for a network that fits one program.

**Design.** The grid is `(trial,)`: program `t` holds every neuron of trial `t` (each
population padded to a power of two, one lane per neuron), runs every step of the chunk in a
loop inside the kernel with the neurons' and synapses' state in registers, and writes the
spikes and the recorded fields of each record window of `every` steps. A step is:

1. *arrivals*: each projection reads its columns of slot `step mod D` of its ring (global
   memory, `(trial, D, W)`) and advances its kinetics with the model's own
   `synapse.step` (exponential, alpha, delta: any elementwise kinetics); the slot read is
   zeroed;
2. *integration*: each population's input current is summed in the order of
   `neurojax.network._phases.total_current` (projections' outputs `output(g, v)` in the
   network's order, the constant input, the external input: a constant or this step's row of
   a time series) and the model's own `step` runs on it (traced into the kernel, as the
   plasticity rules' `on_pre`/`on_post` are); a Poisson source draws its spikes from a
   counter-based generator (`poisson_uniform`) keyed by the trial's key words (the key's
   words mixed with the trial's index in its call, `trial_key_words`), the global step and
   the neuron; the spikes are stored to a per-trial spike row in global
   memory; a projection with short-term plasticity turns its presynaptic spikes into
   releases (Tsodyks-Markram's elementwise `release`, traced into the kernel, its state
   `u, r, last` in registers) and stores them to a row of its own;
3. *plasticity* (pair STDP, when a projection has it): the traces `x, y` are updated in
   registers in phase 2 and stored as rows (`x` decayed and after this step's arrivals, `y`
   decayed); depression walks the compressed rows of the arriving presynaptic neurons
   (`on_pre`, traced in), then potentiation the columns of the spiking postsynaptic ones
   (`on_post`), reading and writing the trial's weights in global memory with plain stores
   (a synapse is in one row and one column: no two lanes of a phase write one weight);
4. *delivery*: each projection walks its presynaptic population's spike row (or its
   release row) in tiles of `block_spikes` neurons; a tile without a spike costs one load
   (`lax.cond`), a tile with spikes walks the compressed rows of its spiking neurons
   `block_synapses` synapses at a time and adds `s * w` (`s` the spike, or the release) into
   the ring at `(trial, (step + 1 + delay) mod D, column)` with atomic adds (per-projection
   or per-synapse delays). There is no spike list to size and no capacity: a burst costs
   more tiles with work, never a rerun.

**Barriers.** Inside one program the lanes of phases 1-2 and of phases 3-4 are different
threads, and they meet in global memory, so `debug_barrier`s (CUDA `__syncthreads`, which
also makes the block's global writes visible to the block) separate the phases of a step:
- barrier A, after phase 2, before phases 3 and 4: the zeroing of the slot read in phase 1
  is done before any atomic add of phase 4 can target that slot (a delay of `D - 1` steps
  lands in it), and the spike, release and trace rows stored in phase 2 are visible to the
  tile loads of phases 3 and 4;
- barriers P1 and P2 (only with STDP), after depression and after potentiation: the weights
  depression wrote are the ones potentiation reads, and the weights of this step are the
  ones delivery reads;
- barrier B, after phase 4, before the next step's phase 1: every atomic add of this step
  has landed before the next step reads its slot (a delay of 0 lands in it), and every tile
  load of this step's rows is done before the next step overwrites them.
Programs never touch another trial's memory, so no barrier between programs is needed.
Interpret mode runs the lanes in order and cannot see a missing barrier: these (two, or
four with STDP) are the kernel's whole synchronisation, and a change of phases must keep
them.

**Arguments** are flat arrays, one per state leaf, parameter leaf, table and ring
(`arg_kinds` lists them); each has a *base* rank (its rank for one trial) and is per trial
when it has one more, leading, axis. The batching rule (`FoldTrials`) turns a `jax.vmap`ped
argument into more trials of one launch: a vmapped weight or rate becomes a per-trial
argument, read at the program's trial, never a loop over trials.

The entry's reference (`network_run_reference`) is the same step in pure JAX (`lax.scan`,
the ring updated by scatter-adds in synapse order), with the same counter-based generator,
so it equals the kernel's spikes exactly and its voltages to rounding (the atomics add in
no fixed order on a GPU).
"""

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from . import _pallas
from ._config import jax_option
from ._registry import Batching, Example, Kernel, register

__all__ = [
    "PopSpec",
    "ProjSpec",
    "RunSpec",
    "FoldTrials",
    "Limits",
    "arg_kinds",
    "device_limits",
    "network_run_gpu",
    "network_run_reference",
    "poisson_uniform",
    "trial_key_words",
    "whole_networks",
    "whole_networks_enabled",
    "NETWORK_RUN",
]

_WHOLE = jax_option(
    "neurojax_whole_networks",
    True,
    "neurojax: let a network that fits one GPU program run whole (network_run).",
)
_WHOLE_FALLBACK = [True]


def whole_networks_enabled() -> bool:
    """Whether a network that fits may run whole in `network_run` (read at trace time)."""
    return _WHOLE_FALLBACK[0] if _WHOLE is None else bool(_WHOLE.value)


@contextlib.contextmanager
def whole_networks(enabled: bool = True) -> Iterator[None]:
    """Let (True, the default) or stop (False) `nj.simulate` running a network that fits
    one GPU program in the whole-network kernel (`network_run`, `Network.fused_run`) in the
    enclosed code; stopped, every network runs step by step, as on the CPU. Part of
    `jax.jit`'s cache key, like the kernel mode.

    Example:
    ```python
    with nj.kernels.whole_networks(False):   # time or test the per-step GPU path
        _, rec = nj.simulate(net, state, dt=0.1, n_steps=1000)
    ```
    """
    if not isinstance(enabled, bool):
        raise TypeError(
            f"nj.kernels.whole_networks: enabled must be True or False, got {enabled!r}"
        )
    if _WHOLE is None:
        old = _WHOLE_FALLBACK[0]
        _WHOLE_FALLBACK[0] = enabled
        jax.clear_caches()
        try:
            yield
        finally:
            _WHOLE_FALLBACK[0] = old
            jax.clear_caches()
        return
    with _WHOLE(enabled):
        yield


class PopSpec(NamedTuple):
    """Static description of one population of a `network_run`.

    Attributes:
        n: neurons; `npad`: lanes (a power of two >= n). Lanes past `n` never spike.
        source: True for a Poisson source (`rate` its one parameter), False for a neuron model.
        model: treedef of the model (or source); `n_params` its array leaves.
        state: treedef of the neuron model's state (None for a source); `n_state` its leaves.
        terms: the input terms in summation order: `("proj", i)` (projection `i`'s output),
            `("const", j)` or `("series", j)` (input argument `j` of the population).
        offset: where its neurons start in the network's numbering (the generator's counter).
    """

    n: int
    npad: int
    source: bool
    model: Any
    n_params: int
    state: Any
    n_state: int
    terms: tuple[tuple[str, int], ...]
    offset: int


class ProjSpec(NamedTuple):
    """Static description of one projection of a `network_run` (event layout).

    Attributes:
        pre, post: population indices.
        ring, col: its ring and where its columns start in it.
        delay: its delay in steps when homogeneous, None when per synapse (a table).
        n_pre, max_fan_out: rows and widest row of the compressed-row table.
        synapse, n_syn_params, syn_state, n_syn_state: kinetics treedef and leaf counts,
            and those of its state.
        output, n_out_params: treedef of the output (current or conductance) and its leaves.
        stp: short-term plasticity, None without: the elementwise release function
            `stp(s, step, u, r, last, u_par, rate_rec, rate_facil, dt) -> (u, r, last,
            release)` (Tsodyks-Markram's), traced into the kernel; its state `(u, r, last)`
            (per presynaptic neuron; `last` int32) and parameters are arguments.
        rule, n_rule_params, max_fan_in: pair STDP (None without): the rule's treedef (its
            `trace_decays`, `update_pre_traces`, `update_post_traces`, `on_pre`, `on_post`
            traced into the kernel) and array leaves, and the widest column; its weights
            are per trial and written, its traces `x, y` and columns `col_ptr, col_syn,
            col_pre` are arguments.
    """

    pre: int
    post: int
    ring: int
    col: int
    delay: int | None
    n_pre: int
    max_fan_out: int
    synapse: Any
    n_syn_params: int
    syn_state: Any
    n_syn_state: int
    output: Any
    n_out_params: int
    stp: Any = None
    rule: Any = None
    n_rule_params: int = 0
    max_fan_in: int = 0


class RunSpec(NamedTuple):
    """Static description of a `network_run` call: populations, projections, rings
    `(D, W)`, `dt` [ms], `n_rec` windows of `every` steps, the recorded fields
    `(population, state leaf)`, the spike record's dtype name, and the block sizes."""

    pops: tuple[PopSpec, ...]
    projs: tuple[ProjSpec, ...]
    rings: tuple[tuple[int, int], ...]
    dt: float
    n_rec: int
    every: int
    record: tuple[tuple[int, int], ...] = ()
    spikes_dtype: str = "bool"
    block_spikes: int = 16
    block_synapses: int = 32


def _as_spec(spec: Any) -> RunSpec:
    """`spec` as a `RunSpec` (the registry hands static arguments over as plain tuples)."""
    if not isinstance(spec, tuple) or len(spec) != len(RunSpec._fields):
        raise ValueError(f"network_run: spec must be a RunSpec, got {type(spec).__name__}")
    spec = RunSpec(*spec)
    return spec._replace(
        pops=tuple(PopSpec(*p) for p in spec.pops),
        projs=tuple(ProjSpec(*q) for q in spec.projs),
    )


def _inputs_of(pop: PopSpec) -> list[str]:
    """The kinds of the population's input arguments, in argument order."""
    kinds = {}
    for kind, j in pop.terms:
        if kind in ("const", "series"):
            kinds[j] = kind
    return [kinds[j] for j in range(len(kinds))]


_STP_ARGS = ("u", "r", "last", "u_par", "rate_rec", "rate_facil")
_RULE_ARGS = ("x", "y", "col_ptr", "col_syn", "col_pre")


def arg_kinds(spec: RunSpec) -> list[tuple[str, int]]:
    """`(name, base rank)` of every argument of the entry, in order: per population its
    state leaves (a source: its spikes and its key's two words), parameters and inputs; per
    projection its synapse state, kinetics and output parameters, (short-term plasticity)
    its state `u, r, last` and parameters `u_par, rate_rec, rate_facil`, (pair STDP) the
    rule's parameters, its traces `x, y` and columns `col_ptr, col_syn, col_pre`, `indptr`,
    `indices`,
    `weights` and (per-synapse delays) `delays`; the rings `(T, D * W)`; the step `(T,)`."""
    out = []
    for p, pop in enumerate(spec.pops):
        if pop.source:
            out += [(f"pop{p}.spikes", 1), (f"pop{p}.key", 1)]
        else:
            out += [(f"pop{p}.state{j}", 1) for j in range(pop.n_state)]
        out += [(f"pop{p}.param{j}", 1) for j in range(pop.n_params)]
        for j, kind in enumerate(_inputs_of(pop)):
            out.append((f"pop{p}.{kind}{j}", 2 if kind == "series" else 1))
    for i, pr in enumerate(spec.projs):
        out += [(f"proj{i}.syn_state{j}", 1) for j in range(pr.n_syn_state)]
        out += [(f"proj{i}.syn_param{j}", 1) for j in range(pr.n_syn_params)]
        out += [(f"proj{i}.out_param{j}", 1) for j in range(pr.n_out_params)]
        if pr.stp is not None:
            out += [(f"proj{i}.stp_{name}", 1) for name in _STP_ARGS]
        if pr.rule is not None:
            out += [(f"proj{i}.rule_param{j}", 1) for j in range(pr.n_rule_params)]
            out += [(f"proj{i}.{name}", 1) for name in _RULE_ARGS]
        out += [(f"proj{i}.indptr", 1), (f"proj{i}.indices", 1), (f"proj{i}.weights", 1)]
        if pr.delay is None:
            out.append((f"proj{i}.delays", 1))
    out += [(f"ring{r}", 1) for r in range(len(spec.rings))]
    out.append(("step", 0))
    return out


def _check_args(args, spec: RunSpec) -> int:
    """The number of trials `T` (the step's length); `ValueError` naming the argument when
    one is not `(1 or T, *base shape)`."""
    kinds = arg_kinds(spec)
    if len(args) != len(kinds):
        raise ValueError(f"network_run: expected {len(kinds)} arguments, got {len(args)}")
    step = args[-1]
    if step.ndim != 1:
        raise ValueError(f"network_run: step must have shape (trials,), got {step.shape}")
    n_trials = int(step.shape[0])
    for x, (name, base) in zip(args, kinds, strict=True):
        if x.ndim != base + 1 or x.shape[0] not in (1, n_trials):
            raise ValueError(
                f"network_run: argument {name} must have a leading axis of 1 (shared) or "
                f"{n_trials} (per trial) and rank {base + 1}, got shape {x.shape}"
            )
    for name in ("n_rec", "every", "block_spikes", "block_synapses"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"network_run: {name} must be an int >= 1, got {value!r}")
    if spec.every == 1 and spec.spikes_dtype != "bool":
        raise ValueError(
            f"network_run: spikes_dtype must be 'bool' when every == 1, got {spec.spikes_dtype!r}"
        )
    return n_trials


# ---------------------------------------------------------------- the generator


def _mix(x: jax.Array) -> jax.Array:
    # lowbias32, a 32-bit integer hash with low bias (C. Wellons, "Prospecting for hash
    # functions", 2018, https://nullprogram.com/blog/2018/07/31/): shifts, xors and two
    # multiplies, all of which Triton lowers.
    x = x ^ lax.shift_right_logical(x, jnp.uint32(16))
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ lax.shift_right_logical(x, jnp.uint32(15))
    x = x * jnp.uint32(0x846CA68B)
    return x ^ lax.shift_right_logical(x, jnp.uint32(16))


def trial_key_words(words: jax.Array, n_trials: int) -> jax.Array:
    """The key words `(n_trials, 2)` of a source's trials: the words of each trial's key
    (`(1, 2)`: one key for every trial, or `(n_trials, 2)`), the first mixed with the
    trial's index in its own call, so that the trials of a batch draw independent trains.

    The index is mixed here, outside the kernel, and not from the program's id inside it:
    a `jax.vmap` over such calls folds them into one launch with more programs
    (`FoldTrials`), and each trial must still draw what it draws in a call of its own."""
    words = jnp.asarray(words, jnp.uint32).reshape(-1, 2)
    words = jnp.broadcast_to(words, (n_trials, 2))
    mix = _mix(jnp.arange(n_trials, dtype=jnp.uint32) + jnp.uint32(0x9E3779B9))
    return jnp.stack([words[:, 0] ^ mix, words[:, 1]], axis=-1)


def poisson_uniform(key0, key1, step, neuron, dtype) -> jax.Array:
    """Uniform numbers in `[0, 1)` of the counter-based generator of `network_run`: a hash
    of the trial's key words (`trial_key_words`), the global step and the neuron (24 bits
    of mantissa). Counter-based: any step of any neuron is drawn without state, so a program
    draws its own trial's numbers and a run in chunks draws what one run draws."""
    u32 = jnp.uint32
    h = _mix(neuron.astype(u32) ^ u32(0x9E3779B9))
    h = _mix(h ^ _mix(step.astype(u32) ^ u32(0x85EBCA6B)))
    h = _mix(h ^ key0.astype(u32))
    h = _mix(h ^ key1.astype(u32))
    return lax.shift_right_logical(h, u32(8)).astype(dtype) * dtype(1.0 / (1 << 24))


# ---------------------------------------------------------------- one step, shared


class _Ops(NamedTuple):
    """What differs between the kernel and the reference: how the step reads a ring row,
    zeroes a slot, stores and reads a spike row, and delivers a projection."""

    read_row: Callable  # (ring, slot, col, npost) -> (npost,) arrivals
    zero_slot: Callable  # (ring, slot)
    deliver: Callable  # (proj index, spikes (npad,), step) -> None
    barrier: Callable  # () -> None
    store_spikes: Callable  # (spikes, releases per STP projection, STDP trace rows) -> None
    depress: Callable  # (proj, rule, s_arr, s_post, x_dec, x_new, y_dec) -> None
    potentiate: Callable  # the same arguments -> None


def _step(spec: RunSpec, dtype, ops: _Ops, params, carry, k, ls, read_input):
    """One network step on the registers `carry = (pop states, syn states)`; `params` the
    loaded parameters; `k` the global step (int32), `ls` the step in the chunk. Returns the
    new carry and the spikes per population (float 0/1, lanes past `n` zero)."""
    pops_st, syn_st, stp_st, rule_st = carry
    # 1. arrivals and kinetics
    syn_new, g = [], []
    for i, pr in enumerate(spec.projs):
        d_slots, _ = spec.rings[pr.ring]
        slot = lax.rem(k, jnp.int32(d_slots))
        x = ops.read_row(pr.ring, slot, pr.col, spec.pops[pr.post].npad, spec.pops[pr.post].n)
        syn = jtu.tree_unflatten(pr.synapse, params["syn"][i])
        st = jtu.tree_unflatten(pr.syn_state, syn_st[i])
        st, gi = syn.step(st, x, spec.dt)
        syn_new.append(tuple(jtu.tree_leaves(st)))
        g.append(gi)
    for r, (d_slots, _) in enumerate(spec.rings):
        ops.zero_slot(r, lax.rem(k, jnp.int32(d_slots)))
    # 2. integration
    pops_new, spikes = [], []
    for p, pop in enumerate(spec.pops):
        lane = jnp.arange(pop.npad, dtype=jnp.int32)
        inside = lane < pop.n
        if pop.source:
            (rate,) = params["pop"][p]
            key0, key1 = params["key"][p]
            u = poisson_uniform(key0, key1, k, lane + pop.offset, dtype)
            s = jnp.where(inside & (u < rate * dtype(spec.dt * 1e-3)), dtype(1), dtype(0))
            pops_new.append((s,))
            spikes.append(s)
            continue
        model = jtu.tree_unflatten(pop.model, params["pop"][p])
        st = jtu.tree_unflatten(pop.state, pops_st[p])
        v = getattr(st, "v", None)
        current = None
        for kind, j in pop.terms:
            if kind == "proj":
                out = jtu.tree_unflatten(spec.projs[j].output, params["out"][j])
                term = out(g[j], v)
            elif kind == "const":
                term = params["input"][p][j]
            else:
                term = read_input(p, j, ls)
            current = term if current is None else current + term
        st, s = model.step(st, current, spec.dt)
        # The model's 0/1 spikes as they are (their surrogate gradient reaches the
        # reference's derivative); padding lanes never spike.
        s = jnp.where(inside, s.astype(dtype), dtype(0))
        pops_new.append(tuple(jtu.tree_leaves(st)))
        spikes.append(s)
    # short-term plasticity: the releases that replace a projection's spikes in delivery
    stp_new, sent = [], [spikes[pr.pre] for pr in spec.projs]
    for i, pr in enumerate(spec.projs):
        if pr.stp is None:
            continue
        u, r, last = stp_st[len(stp_new)]
        u_par, rate_rec, rate_facil = params["stp"][i]
        u, r, last, release = pr.stp(
            spikes[pr.pre], k, u, r, last, u_par, rate_rec, rate_facil, dtype(spec.dt)
        )
        stp_new.append((u, r, last))
        sent[i] = release
    # pair STDP: the traces (elementwise); the weights change in phase 3
    rule_new, trace_rows, plastic = [], [], []
    for i, pr in enumerate(spec.projs):
        if pr.rule is None:
            continue
        x_old, y_old = rule_st[len(rule_new)]
        rule = jtu.tree_unflatten(pr.rule, params["rule"][i])
        (dx,), (dy,) = rule.trace_decays(spec.dt)
        x_dec, y_dec = x_old * dx, y_old * dy
        s_arr, s_post = spikes[pr.pre], spikes[pr.post]
        (x_new,) = rule.update_pre_traces((x_dec,), s_arr)
        (y_new,) = rule.update_post_traces((y_dec,), s_post)
        rule_new.append((x_new, y_new))
        trace_rows.append((x_dec, x_new, y_dec))
        plastic.append((i, rule, s_arr, s_post, x_dec, x_new, y_dec))
    ops.store_spikes(
        spikes, [sent[i] for i, pr in enumerate(spec.projs) if pr.stp is not None], trace_rows
    )
    ops.barrier()  # barrier A (module docstring)
    if plastic:
        for args in plastic:
            ops.depress(*args)
        ops.barrier()  # barrier P1: depression's weights before potentiation reads them
        for args in plastic:
            ops.potentiate(*args)
        ops.barrier()  # barrier P2: the step's weights before delivery reads them
    # 3. delivery
    for i in range(len(spec.projs)):
        ops.deliver(i, sent[i], k)
    ops.barrier()  # barrier B
    return (tuple(pops_new), tuple(syn_new), tuple(stp_new), tuple(rule_new)), spikes


def _split(args, spec: RunSpec):
    """The arguments by role (lists of arrays), following `arg_kinds`."""
    it = iter(args)
    pops, pop_params, keys, inputs = [], [], [], []
    for pop in spec.pops:
        if pop.source:
            pops.append((next(it),))
            keys.append(next(it))
        else:
            pops.append(tuple(next(it) for _ in range(pop.n_state)))
            keys.append(None)
        pop_params.append(tuple(next(it) for _ in range(pop.n_params)))
        inputs.append(tuple(next(it) for _ in _inputs_of(pop)))
    syn_st, syn_p, out_p, tables, stp_st, stp_p = [], [], [], [], [], []
    rule_p, rule_st, cols = [], [], []
    for pr in spec.projs:
        syn_st.append(tuple(next(it) for _ in range(pr.n_syn_state)))
        syn_p.append(tuple(next(it) for _ in range(pr.n_syn_params)))
        out_p.append(tuple(next(it) for _ in range(pr.n_out_params)))
        if pr.stp is not None:
            stp_st.append(tuple(next(it) for _ in range(3)))
            stp_p.append(tuple(next(it) for _ in range(3)))
        else:
            stp_p.append(None)
        if pr.rule is not None:
            rule_p.append(tuple(next(it) for _ in range(pr.n_rule_params)))
            rule_st.append((next(it), next(it)))
            cols.append(tuple(next(it) for _ in range(3)))
        else:
            rule_p.append(None)
            cols.append(None)
        indptr, indices, weights = next(it), next(it), next(it)
        delays = next(it) if pr.delay is None else None
        tables.append((indptr, indices, weights, delays))
    rings = [next(it) for _ in spec.rings]
    step = next(it)
    return (
        (pops, pop_params, keys, inputs, syn_st, syn_p, out_p, tables, rings, step, stp_st),
        (stp_p, rule_p, rule_st, cols),
    )


def _param_value(x: jax.Array) -> jax.Array:
    """A parameter as the step uses it: a scalar for one value, else the lane vector."""
    return x.reshape(()) if x.size == 1 else x


def _spikes_dtype(spec: RunSpec):
    return jnp.dtype(spec.spikes_dtype)


# ---------------------------------------------------------------- the reference


def _reference_trial(spec: RunSpec, *args):
    """One trial of the run in pure JAX (every argument without its trial axis)."""
    first, (stp_p, rule_p, rule_st, _) = _split(args, spec)
    pops, pop_params, keys, inputs, syn_st, syn_p, out_p, tables, rings, step, stp_st = first
    plastic_idx = [i for i, pr in enumerate(spec.projs) if pr.rule is not None]
    dtype = jnp.dtype(args[0].dtype).type
    params = {
        "pop": [tuple(_param_value(x) for x in ps) for ps in pop_params],
        "syn": [tuple(_param_value(x) for x in ps) for ps in syn_p],
        "out": [tuple(_param_value(x) for x in ps) for ps in out_p],
        "input": [tuple(_param_value(x) if x.ndim == 1 else x for x in ins) for ins in inputs],
        "key": [None if k is None else (k[0], k[1]) for k in keys],
        "stp": [None if ps is None else tuple(_param_value(x) for x in ps) for ps in stp_p],
        "rule": [None if ps is None else tuple(_param_value(x) for x in ps) for ps in rule_p],
    }
    rows = []
    for indptr, indices, _, _ in tables:
        counts = indptr[1:] - indptr[:-1]
        rows.append(
            jnp.repeat(
                jnp.arange(counts.shape[0], dtype=jnp.int32),
                counts,
                total_repeat_length=indices.shape[0],
            )
        )

    def run_window(carry, w):
        def one(c, q):
            state, rings_, counts = c
            ls = w * spec.every + q
            k = step + ls
            box = {"rings": list(rings_[: len(spec.rings)])}
            box["w"] = dict(zip(plastic_idx, rings_[len(spec.rings) :], strict=True))

            def read_row(r, slot, col, npad, n):
                d_slots, width = spec.rings[r]
                row = box["rings"][r].reshape(d_slots, width)[slot, col : col + n]
                return jnp.pad(row, (0, npad - n))

            def zero_slot(r, slot):
                d_slots, width = spec.rings[r]
                ring = box["rings"][r].reshape(d_slots, width)
                box["rings"][r] = ring.at[slot].set(0).reshape(-1)

            def deliver(i, s, k_):
                pr = spec.projs[i]
                indptr, indices, weights, delays = tables[i]
                d_slots, width = spec.rings[pr.ring]
                d = pr.delay if delays is None else delays
                slot = lax.rem(k_ + 1 + d, jnp.int32(d_slots))
                target = slot * width + pr.col + indices
                if i in box["w"]:
                    weights = box["w"][i]
                val = s[rows[i]] * weights
                box["rings"][pr.ring] = box["rings"][pr.ring].at[target].add(val)

            def depress(i, rule, s_arr, s_post, x_dec, x_new, y_dec):
                w, pre, post = box["w"][i], rows[i], tables[i][1]
                new = rule.on_pre(w, (x_dec[pre],), (y_dec[post],), s_arr[pre])
                box["w"][i] = jnp.where(s_arr[pre] > 0, new, w)

            def potentiate(i, rule, s_arr, s_post, x_dec, x_new, y_dec):
                w, pre, post = box["w"][i], rows[i], tables[i][1]
                new = rule.on_post(w, (x_new[pre],), (y_dec[post],), s_post[post])
                box["w"][i] = jnp.where(s_post[post] > 0, new, w)

            def read_input(p, j, ls_):
                return params["input"][p][j][ls_]

            ops = _Ops(
                read_row,
                zero_slot,
                deliver,
                lambda: None,
                lambda spikes, sent, traces: None,
                depress,
                potentiate,
            )
            state, spikes = _step(spec, dtype, ops, params, state, k, ls, read_input)
            counts = tuple(c_ + s_.astype(jnp.int32) for c_, s_ in zip(counts, spikes))
            memory = (*box["rings"], *(box["w"][i] for i in plastic_idx))
            return (state, memory, counts), None

        state, rings_ = carry
        zero = tuple(jnp.zeros((pop.npad,), jnp.int32) for pop in spec.pops)
        (state, rings_, counts), _ = lax.scan(
            one, (state, rings_, zero), jnp.arange(spec.every, dtype=jnp.int32)
        )
        fields = tuple(state[0][p][j] for p, j in spec.record)
        rec = tuple(c.astype(_spikes_dtype(spec)) for c in counts)
        return (state, rings_), (rec, fields)

    w0 = tuple(tables[i][2] for i in plastic_idx)
    carry = ((tuple(pops), tuple(syn_st), tuple(stp_st), tuple(rule_st)), (*rings, *w0))
    ((pops_f, syn_f, stp_f, rule_f), memory_f), (rec, fields) = lax.scan(
        run_window, carry, jnp.arange(spec.n_rec, dtype=jnp.int32)
    )
    return (
        tuple(x for st in pops_f for x in st),
        tuple(x for st in syn_f for x in st),
        tuple(memory_f[: len(spec.rings)]),
        rec,
        fields,
        tuple(x for st in stp_f for x in st),
        tuple(
            x
            for w_i, (x_i, y_i) in zip(memory_f[len(spec.rings) :], rule_f, strict=True)
            for x in (w_i, x_i, y_i)
        ),
    )


def _outputs_flat(out):
    pops, syns, rings, rec, fields, stps, rules = out
    return (*pops, *syns, *rings, *rec, *fields, *stps, *rules)


def network_run_reference(*args, spec: RunSpec):
    """The run in pure JAX: `lax.scan` over the steps of every trial (vmapped over the trial
    axis of the per-trial arguments), the same step as the kernel.

    Returns a flat tuple: the final state leaves of every population (a source: its spikes),
    of every projection's synapse, the rings, the spike record per population
    `(T, n_rec, npad)`, each recorded field `(T, n_rec, npad)` and the short-term state
    `u, r, last` of every projection that has it `(T, npad of its presynaptic population)`,
    and per STDP projection its weights `(T, nnz)` and traces `x (T, npad pre)`,
    `y (T, npad post)`."""
    spec = _as_spec(spec)
    n_trials = _check_args(args, spec)
    per_trial = [x.shape[0] == n_trials and n_trials > 1 for x in args]
    xs = [x if b else x[0] for x, b in zip(args, per_trial, strict=True)]
    xs[-1] = args[-1] if n_trials > 1 else args[-1][0]

    def trial(*ys):
        return _outputs_flat(_reference_trial(spec, *ys))

    if n_trials == 1:
        return tuple(y[None] for y in trial(*xs))
    axes = [0 if b else None for b in per_trial]
    axes[-1] = 0
    return jax.vmap(trial, in_axes=tuple(axes))(*xs)


# ---------------------------------------------------------------- the kernel


def _num_warps(spec: RunSpec) -> int:
    """Warps per program: about 8 lanes of neurons per thread, 4 to 32 warps."""
    lanes = sum(pop.npad for pop in spec.pops)
    return int(min(32, max(4, _pallas.next_pow2(-(-lanes // 256)))))


def network_run_gpu(*args, spec: RunSpec, num_stages: int = 1):
    """The run as one Pallas Triton kernel, one program per trial (module docstring);
    the arguments and results of `network_run_reference`."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    spec = _as_spec(spec)
    n_trials = _check_args(args, spec)
    interpret = _pallas.pallas_interpret()
    kinds = arg_kinds(spec)
    ring_pos = [len(kinds) - 1 - len(spec.rings) + r for r in range(len(spec.rings))]
    dtype_np = jnp.dtype(args[0].dtype)
    per_trial = [x.shape[0] == n_trials and n_trials > 1 for x in args]
    per_trial[-1] = True
    args = list(args)
    plastic_idx = [i for i, pr in enumerate(spec.projs) if pr.rule is not None]
    w_pos = {}
    pos = 0
    for name, _ in kinds:
        if name.endswith(".weights"):
            i = int(name[4 : name.index(".")])
            if spec.projs[i].rule is not None:
                w_pos[i] = pos
        pos += 1
    # the rings and plastic weights are written: one per trial, aliased with the output
    for pos in [*ring_pos, *w_pos.values()]:
        args[pos] = jnp.broadcast_to(args[pos], (n_trials, *args[pos].shape[1:]))
        per_trial[pos] = True
    flat_in = [x.reshape(-1) for x in args[:-1]] + [args[-1].astype(jnp.int32)]
    shapes = [x.shape[1:] for x in args]
    n_in = len(flat_in)
    dtype = dtype_np.type
    rec_dtype = _spikes_dtype(spec)

    # outputs: population and synapse state leaves, rings (aliased), records, spike rows
    pop_leaves = [
        (p, j) for p, pop in enumerate(spec.pops) for j in range(1 if pop.source else pop.n_state)
    ]
    syn_leaves = [(i, j) for i, pr in enumerate(spec.projs) for j in range(pr.n_syn_state)]
    stp_projs = [i for i, pr in enumerate(spec.projs) if pr.stp is not None]
    out_shapes = []
    for p, _ in pop_leaves:
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * spec.pops[p].npad,), dtype_np))
    for i, _ in syn_leaves:
        npad = spec.pops[spec.projs[i].post].npad
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * npad,), dtype_np))
    for d_slots, width in spec.rings:
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * d_slots * width,), dtype_np))
    for pop in spec.pops:
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * spec.n_rec * pop.npad,), rec_dtype))
    for p, _ in spec.record:
        npad = spec.pops[p].npad
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * spec.n_rec * npad,), dtype_np))
    for i in stp_projs:  # short-term state u, r, last
        npad = spec.pops[spec.projs[i].pre].npad
        for dt_ in (dtype_np, dtype_np, jnp.dtype(jnp.int32)):
            out_shapes.append(jax.ShapeDtypeStruct((n_trials * npad,), dt_))
    for i in plastic_idx:  # STDP: weights, x, y
        pr = spec.projs[i]
        nnz = args[w_pos[i]].shape[1]
        for size in (nnz, spec.pops[pr.pre].npad, spec.pops[pr.post].npad):
            out_shapes.append(jax.ShapeDtypeStruct((n_trials * size,), dtype_np))
    for pop in spec.pops:  # this step's spikes, read back by delivery's tiles
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * pop.npad,), dtype_np))
    for i in stp_projs:  # this step's releases of a projection with short-term plasticity
        npad = spec.pops[spec.projs[i].pre].npad
        out_shapes.append(jax.ShapeDtypeStruct((n_trials * npad,), dtype_np))
    for i in plastic_idx:  # this step's STDP trace rows: x decayed, x new, y decayed
        pr = spec.projs[i]
        for p_ in (pr.pre, pr.pre, pr.post):
            out_shapes.append(jax.ShapeDtypeStruct((n_trials * spec.pops[p_].npad,), dtype_np))
    n_pop_out, n_syn_out, n_ring = len(pop_leaves), len(syn_leaves), len(spec.rings)
    ring_out0 = n_pop_out + n_syn_out
    rec_out0 = ring_out0 + n_ring
    field_out0 = rec_out0 + len(spec.pops)
    stp_out0 = field_out0 + len(spec.record)
    plastic_out0 = stp_out0 + 3 * len(stp_projs)
    row_out0 = plastic_out0 + 3 * len(plastic_idx)
    rel_out0 = row_out0 + len(spec.pops)
    trace_out0 = rel_out0 + len(stp_projs)
    aliases = {ring_pos[r]: ring_out0 + r for r in range(n_ring)}
    for q, i in enumerate(plastic_idx):
        aliases[w_pos[i]] = plastic_out0 + 3 * q
    bs_of = [_pallas.next_pow2(min(spec.block_spikes, pop.npad)) for pop in spec.pops]

    def kernel(*refs):
        ins, outs = refs[:n_in], refs[n_in:]
        t = pl.program_id(0).astype(jnp.int32)

        def load(pos, length=None):
            """Argument `pos` for this trial: a scalar for one value, else a vector."""
            ref, shape = ins[pos], shapes[pos]
            size = math.prod(shape)
            base = t * size if per_trial[pos] else jnp.int32(0)
            if size == 1:
                return ref[base]
            return ref[base + jnp.arange(size, dtype=jnp.int32)]

        def store(ref, at, value):
            ref[at] = value

        pos = 0
        pops0, keys, pop_params, inputs, inp_pos = [], [], [], [], []
        for pop in spec.pops:
            if pop.source:
                pops0.append((load(pos),))
                kb = t * 2 if per_trial[pos + 1] else jnp.int32(0)
                keys.append((ins[pos + 1][kb], ins[pos + 1][kb + 1]))
                pos += 2
            else:
                pops0.append(tuple(load(pos + j) for j in range(pop.n_state)))
                keys.append(None)
                pos += pop.n_state
            pop_params.append(tuple(load(pos + j) for j in range(pop.n_params)))
            pos += pop.n_params
            ins_p, pos_p = [], []
            for kind in _inputs_of(pop):
                ins_p.append(load(pos) if kind == "const" else None)
                pos_p.append(pos)
                pos += 1
            inputs.append(tuple(ins_p))
            inp_pos.append(pos_p)
        syn0, syn_p, out_p, table_pos, stp0, stp_p = [], [], [], [], [], []
        rule0, rule_p, col_pos = [], [], []
        for pr in spec.projs:
            syn0.append(tuple(load(pos + j) for j in range(pr.n_syn_state)))
            pos += pr.n_syn_state
            syn_p.append(tuple(load(pos + j) for j in range(pr.n_syn_params)))
            pos += pr.n_syn_params
            out_p.append(tuple(load(pos + j) for j in range(pr.n_out_params)))
            pos += pr.n_out_params
            if pr.stp is not None:
                stp0.append(tuple(load(pos + j) for j in range(3)))
                stp_p.append(tuple(load(pos + 3 + j) for j in range(3)))
                pos += 6
            else:
                stp_p.append(None)
            if pr.rule is not None:
                rule_p.append(tuple(load(pos + j) for j in range(pr.n_rule_params)))
                pos += pr.n_rule_params
                rule0.append((load(pos), load(pos + 1)))
                col_pos.append(pos + 2)
                pos += 5
            else:
                rule_p.append(None)
                col_pos.append(None)
            table_pos.append(pos)
            pos += 3 if pr.delay is not None else 4
        k0 = ins[n_in - 1][t]
        params = {
            "pop": pop_params,
            "syn": syn_p,
            "out": out_p,
            "input": inputs,
            "key": keys,
            "stp": stp_p,
            "rule": rule_p,
        }
        ring_refs = outs[ring_out0 : ring_out0 + n_ring]

        def read_row(r, slot, col, npad, n):
            d_slots, width = spec.rings[r]
            lane = jnp.arange(npad, dtype=jnp.int32)
            at = (t * d_slots + slot) * width + col + jnp.minimum(lane, n - 1)
            x = ring_refs[r][at]
            return jnp.where(lane < n, x, dtype(0))

        def zero_slot(r, slot):
            d_slots, width = spec.rings[r]
            wpad = _pallas.next_pow2(width)
            lane = jnp.arange(wpad, dtype=jnp.int32)
            at = (t * d_slots + slot) * width + lane
            ok = lane < width
            if interpret:
                # The interpreted masked store writes its masked lanes too: aim them past
                # the end, where the scatter drops them.
                ring_refs[r][jnp.where(ok, at, n_trials * d_slots * width)] = jnp.zeros(
                    (wpad,), dtype
                )
            else:
                plgpu.store(ring_refs[r].at[at], jnp.zeros((wpad,), dtype), mask=ok)

        def deliver(i, s, k):
            pr = spec.projs[i]
            pre = spec.pops[pr.pre]
            if pr.stp is None:
                row_ref = outs[row_out0 + pr.pre]
            else:
                row_ref = outs[rel_out0 + stp_projs.index(i)]
            tp = table_pos[i]
            indptr_ref, indices_ref, w_ref = ins[tp], ins[tp + 1], ins[tp + 2]
            if pr.rule is not None:  # the weights as this step's plasticity left them
                w_ref = outs[plastic_out0 + 3 * plastic_idx.index(i)]
            delay_ref = ins[tp + 3] if pr.delay is None else None
            nnz = shapes[tp + 1][0]
            w_per_trial = per_trial[tp + 2]
            d_slots, width = spec.rings[pr.ring]
            if pr.max_fan_out == 0 or nnz == 0:
                return
            bs = bs_of[pr.pre]
            bc = _pallas.next_pow2(min(spec.block_synapses, pr.max_fan_out))
            n_chunks = -(-pr.max_fan_out // bc)
            n_tiles = -(-pre.n // bs)
            lane_s = jnp.arange(bs, dtype=jnp.int32)
            lane_c = jnp.arange(bc, dtype=jnp.int32)

            def tile(j, carry):
                idx = j * bs + lane_s
                sv = row_ref[t * pre.npad + idx]
                live = sv != 0

                def work():
                    local = jnp.minimum(idx, pr.n_pre - 1)
                    start = indptr_ref[local]
                    end = indptr_ref[local + 1]

                    def chunk(c, cc):
                        syn = start[:, None] + c * bc + lane_c[None, :]
                        ok = live[:, None] & (syn < end[:, None])
                        sc = jnp.clip(syn, 0, nnz - 1)
                        post = indices_ref[sc]
                        if d_slots == 1:
                            slot = jnp.zeros_like(sc)
                        else:
                            d = delay_ref[sc] if delay_ref is not None else pr.delay
                            slot = lax.rem(k + 1 + d, jnp.int32(d_slots))
                        target = (t * d_slots + slot) * width + pr.col + post
                        w = w_ref[t * nnz + sc] if w_per_trial else w_ref[sc]
                        _pallas.atomic_add(
                            ring_refs[pr.ring], target, sv[:, None] * w, ok, interpret
                        )
                        return cc

                    lax.fori_loop(0, n_chunks, chunk, 0)

                lax.cond(jnp.max(sv) > 0, work, lambda: None)
                return carry

            lax.fori_loop(0, n_tiles, tile, 0)

        def barrier():
            if not interpret:
                plgpu.debug_barrier()

        def read_input(p, j, ls):
            pos_ = inp_pos[p][j]
            s_len, npad = shapes[pos_]
            base = t * (s_len * npad) if per_trial[pos_] else jnp.int32(0)
            return ins[pos_][base + ls * npad + jnp.arange(npad, dtype=jnp.int32)]

        def spikes_store(spikes, sent, traces):
            for q, rows3 in enumerate(traces):
                pr = spec.projs[plastic_idx[q]]
                for j, (p_, x) in enumerate(zip((pr.pre, pr.pre, pr.post), rows3, strict=True)):
                    npad = spec.pops[p_].npad
                    at = t * npad + jnp.arange(npad, dtype=jnp.int32)
                    store(outs[trace_out0 + 3 * q + j], at, x)
            for p, pop in enumerate(spec.pops):
                at = t * pop.npad + jnp.arange(pop.npad, dtype=jnp.int32)
                store(outs[row_out0 + p], at, spikes[p])
            for q, i in enumerate(stp_projs):
                npad = spec.pops[spec.projs[i].pre].npad
                at = t * npad + jnp.arange(npad, dtype=jnp.int32)
                store(outs[rel_out0 + q], at, sent[q])

        def masked_store(ref, at, value, ok, size):
            if interpret:  # masked lanes aimed past the end, where the scatter drops them
                ref[jnp.where(ok, at, size)] = value
            else:
                plgpu.store(ref.at[at], value, mask=ok)

        def plastic_walk(i, rule, depressing):
            """Depression (rows of the arriving presynaptic neurons) or potentiation
            (columns of the spiking postsynaptic neurons) of STDP projection `i`, in tiles
            of spiking neurons; each synapse is in one row and one column, so no two lanes
            write one weight in a phase."""
            pr = spec.projs[i]
            q = plastic_idx.index(i)
            tp, cp = table_pos[i], col_pos[i]
            nnz = shapes[tp + 1][0]
            if nnz == 0:
                return
            w_ref = outs[plastic_out0 + 3 * q]
            xdec_ref, xnew_ref, ydec_ref = (outs[trace_out0 + 3 * q + j] for j in range(3))
            own, other = (pr.pre, pr.post) if depressing else (pr.post, pr.pre)
            npad_own, npad_other = spec.pops[own].npad, spec.pops[other].npad
            n_own = pr.n_pre if depressing else spec.pops[pr.post].n
            width = pr.max_fan_out if depressing else pr.max_fan_in
            if width == 0:
                return
            ptr_ref = ins[tp] if depressing else ins[cp]
            spike_ref = outs[row_out0 + own]
            bs = bs_of[own]
            bc = _pallas.next_pow2(min(spec.block_synapses, width))
            n_chunks = -(-width // bc)
            lane_s = jnp.arange(bs, dtype=jnp.int32)
            lane_c = jnp.arange(bc, dtype=jnp.int32)

            def tile(j, carry):
                idx = j * bs + lane_s
                sv = spike_ref[t * npad_own + idx]
                live = sv != 0

                def work():
                    local = jnp.minimum(idx, n_own - 1)
                    start = ptr_ref[local]
                    end = ptr_ref[local + 1]
                    if depressing:
                        mine = xdec_ref[t * npad_own + idx]
                    else:
                        mine = ydec_ref[t * npad_own + idx]

                    def chunk(c, cc):
                        at = start[:, None] + c * bc + lane_c[None, :]
                        ok = live[:, None] & (at < end[:, None])
                        ac = jnp.clip(at, 0, nnz - 1)
                        if depressing:
                            syn, partner = ac, ins[tp + 1][ac]
                        else:
                            syn, partner = ins[cp + 1][ac], ins[cp + 2][ac]
                        w = w_ref[t * nnz + syn]
                        if depressing:
                            y = ydec_ref[t * npad_other + partner]
                            new = rule.on_pre(w, (mine[:, None],), (y,), sv[:, None])
                        else:
                            x = xnew_ref[t * npad_other + partner]
                            new = rule.on_post(w, (x,), (mine[:, None],), sv[:, None])
                        masked_store(w_ref, t * nnz + syn, new, ok, n_trials * nnz)
                        return cc

                    lax.fori_loop(0, n_chunks, chunk, 0)

                lax.cond(jnp.max(sv) > 0, work, lambda: None)
                return carry

            lax.fori_loop(0, -(-n_own // bs), tile, 0)

        def depress(i, rule, *_):
            plastic_walk(i, rule, True)

        def potentiate(i, rule, *_):
            plastic_walk(i, rule, False)

        ops = _Ops(read_row, zero_slot, deliver, barrier, spikes_store, depress, potentiate)

        def window(w, carry):
            def one(q, c):
                state, counts = c
                ls = w * spec.every + q
                k = k0 + ls
                state, spikes = _step(spec, dtype, ops, params, state, k, ls, read_input)
                counts = tuple(c_ + s_.astype(jnp.int32) for c_, s_ in zip(counts, spikes))
                return state, counts

            if spec.every == 1:  # the raster: this step's spikes, no counts carried
                state, counts = _step(spec, dtype, ops, params, carry, k0 + w, w, read_input)
                counts = tuple(c_ > 0 for c_ in counts)
            else:
                zero = tuple(jnp.zeros((pop.npad,), jnp.int32) for pop in spec.pops)
                state, counts = lax.fori_loop(0, spec.every, one, (carry, zero))
            for p, pop in enumerate(spec.pops):
                at = (t * spec.n_rec + w) * pop.npad + jnp.arange(pop.npad, dtype=jnp.int32)
                store(outs[rec_out0 + p], at, counts[p].astype(rec_dtype))
            for q, (p, j) in enumerate(spec.record):
                npad = spec.pops[p].npad
                at = (t * spec.n_rec + w) * npad + jnp.arange(npad, dtype=jnp.int32)
                store(outs[field_out0 + q], at, state[0][p][j])
            return state

        state = lax.fori_loop(
            0, spec.n_rec, window, (tuple(pops0), tuple(syn0), tuple(stp0), tuple(rule0))
        )
        q = 0
        for p, st in enumerate(state[0]):
            npad = spec.pops[p].npad
            for x in st:
                store(outs[q], t * npad + jnp.arange(npad, dtype=jnp.int32), x.astype(dtype))
                q += 1
        for i, st in enumerate(state[1]):
            npad = spec.pops[spec.projs[i].post].npad
            for x in st:
                store(outs[q], t * npad + jnp.arange(npad, dtype=jnp.int32), x.astype(dtype))
                q += 1
        for q, (i, st) in enumerate(zip(stp_projs, state[2], strict=True)):
            npad = spec.pops[spec.projs[i].pre].npad
            at = t * npad + jnp.arange(npad, dtype=jnp.int32)
            for j, x in enumerate(st):
                store(outs[stp_out0 + 3 * q + j], at, x)
        for q, (i, (x, y)) in enumerate(zip(plastic_idx, state[3], strict=True)):
            pr = spec.projs[i]
            for j, (p_, v) in enumerate(((pr.pre, x), (pr.post, y))):
                npad = spec.pops[p_].npad
                at = t * npad + jnp.arange(npad, dtype=jnp.int32)
                store(outs[plastic_out0 + 3 * q + 1 + j], at, v.astype(dtype))

    whole = pl.no_block_spec
    out = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shapes),
        grid=(n_trials,),
        in_specs=[whole] * n_in,
        out_specs=tuple(whole for _ in out_shapes),
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=_num_warps(spec), num_stages=num_stages),
        interpret=interpret,
        name="nj_network_run",
    )(*flat_in)
    res = []
    for q, (p, _) in enumerate(pop_leaves):
        res.append(out[q].reshape(n_trials, spec.pops[p].npad))
    for q, (i, _) in enumerate(syn_leaves):
        npad = spec.pops[spec.projs[i].post].npad
        res.append(out[n_pop_out + q].reshape(n_trials, npad))
    for r, (d_slots, width) in enumerate(spec.rings):
        res.append(out[ring_out0 + r].reshape(n_trials, d_slots * width))
    for p, pop in enumerate(spec.pops):
        res.append(out[rec_out0 + p].reshape(n_trials, spec.n_rec, pop.npad))
    for q, (p, _) in enumerate(spec.record):
        res.append(out[field_out0 + q].reshape(n_trials, spec.n_rec, spec.pops[p].npad))
    for q in range(3 * len(stp_projs)):
        res.append(out[stp_out0 + q].reshape(n_trials, -1))
    for q in range(3 * len(plastic_idx)):
        res.append(out[plastic_out0 + q].reshape(n_trials, -1))
    return tuple(res)


# ---------------------------------------------------------------- batching


@dataclasses.dataclass(frozen=True)
class FoldTrials(Batching):
    """`network_run`'s batching rule: a vmapped axis of `B` becomes `B` times more trials of
    one launch, whatever is vmapped. Every argument has a leading axis of 1 (shared by the
    `T` trials) or `T` (the step's length). A vmapped argument `(B, 1 or T, ...)` becomes
    `(B * T, ...)` (a vmapped weight scale, rate or key becomes a per-trial argument); an
    unvmapped per-trial one is repeated for each element; a shared one stays one copy. The
    results, trial axis first, are split back into `(B, T, ...)`. No argument sends the
    rule to `Sequential`."""

    def __call__(self, axis_size, in_batched, args, apply):
        step, step_b = args[-1], _batched(in_batched[-1])
        n_inner = step.shape[1] if step_b else step.shape[0]
        total = axis_size * n_inner
        out_args = []
        for x, b in zip(args, in_batched, strict=True):
            if _batched(b):  # (B, 1 or T, ...)
                x = jnp.broadcast_to(x, (axis_size, n_inner, *x.shape[2:]))
                x = x.reshape((total, *x.shape[2:]))
            elif x.shape[0] == n_inner and n_inner > 1:  # per trial, the same for every element
                x = jnp.broadcast_to(x[None], (axis_size, *x.shape))
                x = x.reshape((total, *x.shape[2:]))
            out_args.append(x)  # else shared: one copy for every trial
        # The step is always per trial (an unvmapped one is the same for every element).
        out_args[-1] = jnp.broadcast_to(out_args[-1], (total,)) if not step_b else out_args[-1]
        out = apply(*out_args)
        out = tuple(y.reshape((axis_size, n_inner, *y.shape[1:])) for y in out)
        return out, tuple(True for _ in out)


def _batched(flag) -> bool:
    return any(jtu.tree_leaves(flag))


# ---------------------------------------------------------------- what fits one program


class Limits(NamedTuple):
    """What a network must stay within for `network_run` on one device, and where each
    bound comes from (`device_limits`).

    Attributes:
        registers: 32-bit registers one program may hold its neurons' state in: half the
            register file of a streaming multiprocessor (65536 registers on every NVIDIA GPU
            from compute capability 5.0 to 9.0, CUDA C++ Programming Guide, "Technical
            Specifications per Compute Capability"), the other half left to the step's
            temporaries. A network needs `words per neuron x lanes` of them (`fits`).
        ring_bytes: bytes of the rings of all trials together: a quarter of the device's
            memory (`memory_stats()["bytes_limit"]`; 80 GB, an H100's, where the device does
            not say, as on a CPU in interpret mode), the rest left to states, tables and
            records.
        max_fan_out: the widest row a program walks per spike (16384 synapses): one program
            walks a spike's row alone, in chunks of `block_synapses`; wider rows are faster
            spread over the whole GPU by the per-step path.
        source: where the figures come from (the device, or the defaults).
    """

    registers: int
    ring_bytes: int
    max_fan_out: int
    source: str


_REGISTER_FILE = 65536
_DEFAULT_MEMORY = 80 * 10**9
MAX_FAN_OUT = 16384


def device_limits(device: Any = None) -> Limits:
    """The `Limits` of `device` (default: the first GPU, else the defaults of an H100)."""
    if device is None:
        gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
        device = gpus[0] if gpus else None
    memory, source = _DEFAULT_MEMORY, "defaults of an NVIDIA H100 (no GPU in this process)"
    if device is not None and device.platform in ("gpu", "cuda"):
        try:
            memory = int(device.memory_stats()["bytes_limit"])
            source = f"{device.device_kind} (memory_stats)"
        except Exception:  # noqa: BLE001  (a backend without memory statistics)
            source = f"{device.device_kind} (no memory_stats: the H100's memory assumed)"
    return Limits(_REGISTER_FILE // 2, memory // 4, MAX_FAN_OUT, source)


# ---------------------------------------------------------------- the entry


class _LeakState(eqx.Module):
    v: jax.Array
    refractory: jax.Array


class _Leak(eqx.Module):
    """The registry example's neuron (the kernel layer knows no neuron model): a leaky
    integrator, reset to -70 mV at `v_th`, then 1 ms refractory."""

    tau: jax.Array
    v_th: jax.Array

    def step(self, state, current, dt):
        clamped = state.refractory > 0
        v = state.v + (dt / self.tau) * (-65.0 - state.v) + current
        v = jnp.where(clamped, -70.0, v)
        s = (v >= self.v_th).astype(v.dtype)
        refractory = jnp.where(s > 0, 1.0, jnp.maximum(state.refractory - dt, 0.0))
        return _LeakState(jnp.where(s > 0, -70.0, v), refractory), s


class _DecayState(eqx.Module):
    g: jax.Array


class _Decay(eqx.Module):
    tau: jax.Array

    def step(self, state, x, dt):
        g = state.g * jnp.exp(-dt / self.tau) + x
        return _DecayState(g), g


class _Current(eqx.Module):
    def __call__(self, g, v):
        return g


def _examples():
    """One small run: 40 leaky neurons (`_Leak`) fed by 24 Poisson sources through an
    exponential synapse with per-synapse delays; two trials, per-trial and shared arguments
    mixed, counts over windows of 2 steps."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_src, n, fan = 24, 40, 6
    f32 = jnp.float32
    one = jnp.ones((), f32)
    leak = jtu.tree_structure(_Leak(one, one))
    leak_state = jtu.tree_structure(_LeakState(one, one))
    decay, decay_state = jtu.tree_structure(_Decay(one)), jtu.tree_structure(_DecayState(one))
    current = jtu.tree_structure(_Current())
    spec = RunSpec(
        pops=(
            PopSpec(n_src, 32, True, None, 1, None, 0, (), 0),
            PopSpec(n, 64, False, leak, 2, leak_state, 2, (("proj", 0), ("const", 0)), n_src),
        ),
        projs=(ProjSpec(0, 1, 0, 0, None, n_src, fan, decay, 1, decay_state, 1, current, 0),),
        rings=((3, n),),
        dt=0.5,
        n_rec=4,
        every=2,
        spikes_dtype="uint8",
    )
    args = (
        jnp.zeros((2, 32), f32),  # source spikes, per trial
        trial_key_words(jnp.asarray([[1, 2]], jnp.uint32), 2),  # key words, per trial
        jnp.asarray([[400.0]], f32),  # rate [Hz]
        jnp.asarray(rng.uniform(-70.0, -50.0, (2, 64)), f32),  # v
        jnp.zeros((2, 64), f32),  # time left refractory
        jnp.asarray([[20.0]], f32),  # tau of the leak
        jnp.asarray([[-50.0]], f32),  # threshold
        jnp.asarray([[0.3]], f32),  # constant input
        jnp.zeros((2, 64), f32),  # synaptic g
        jnp.asarray([[5.0]], f32),  # tau of the synapse
        jnp.asarray(np.arange(0, (n_src + 1) * fan, fan, dtype=np.int32))[None],
        jnp.asarray(rng.integers(0, n, n_src * fan).astype(np.int32))[None],
        jnp.asarray(rng.uniform(0.5, 3.0, n_src * fan).astype(np.float32))[None],
        jnp.asarray(rng.integers(0, 3, n_src * fan).astype(np.int32))[None],
        jnp.zeros((2, 3 * n), f32),
        jnp.asarray([0, 7], jnp.int32),
    )
    yield Example(args, {"spec": spec}, vmap_argnums=(3, 12), label="poisson-leak-delays")


NETWORK_RUN = register(
    Kernel(
        name="network_run",
        reference=network_run_reference,
        gpu=network_run_gpu,
        batching=FoldTrials(),
        # The atomics add a step's arrivals in no fixed order on a GPU: equal to rounding.
        rtol=1e-5,
        atol=1e-5,
        examples=_examples,
        doc="A whole network run, one program per trial (`Network.fused_run`).",
    )
)
