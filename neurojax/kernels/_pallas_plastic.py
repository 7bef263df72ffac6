r"""The GPU implementation of the registry entry `plastic_update`: any plasticity rule's
event updates as Pallas Triton kernels whose bodies trace the rule's own element-wise
`on_pre` and `on_post`.

A rule (`nj.plasticity.PlasticityRule`) states its weight updates as element-wise `jnp`
functions of the weight, the traces of the synapse's two neurons and the event's spike value.
Those functions are called inside the kernel body on the tile of synapses it holds, so a rule
written in Python, by a user, gets a GPU kernel with no kernel code of its own. The rule's
array parameters (`a_plus`, `w_max`, ...) enter the kernel as scalar inputs and the rule is
rebuilt from them inside the body (`equinox.combine`), so a swept or differentiated parameter
does not recompile the kernel.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from . import _pallas

__all__ = ["plastic_gpu", "plastic_gpu_supports"]


def plastic_gpu_supports(rule, *args, sizes) -> bool:
    """The kernel takes a rule whose array parameters are scalars (each is one kernel input)."""
    params = eqx.filter(rule, eqx.is_array)
    return all(jnp.ndim(x) == 0 for x in jtu.tree_leaves(params))


def _store(ref, idx, val, ok, size: int, interpret: bool) -> None:
    """`ref[idx] = val` where `ok`. Under interpret mode Pallas turns a masked vector store
    into a gather and a scatter that also writes the masked lanes (their old values), which
    could overwrite a live lane aiming at the same element; there the masked lanes aim past
    the end instead (the scatter drops them). The GPU gets a masked store."""
    from jax.experimental.pallas import triton as plgpu

    if interpret:
        ref[jnp.where(ok, idx, size)] = val
    else:
        plgpu.store(ref.at[idx], val, mask=ok)


def _phase(
    w_flat,
    events,
    own_traces,
    other_traces,
    ptr,
    syn_of,
    other_of,
    leaves,
    rebuild,
    *,
    post_side: bool,
    n_own: int,
    n_other: int,
    width: int,
    n_trials: int,
    block_spikes: int,
    block_synapses: int,
    num_warps: int,
    num_stages: int,
):
    """One Pallas call: the rule's `on_pre` (`post_side=False`: events are arrivals, rows of
    the CSR layout) or `on_post` (`post_side=True`: postsynaptic spikes, CSC columns) on the
    synapses of the spiking neurons, weights updated in place.

    The grid is `(trial, P)`, `P` programs per trial (about 1024 programs in the grid), fixed
    whatever the spike count: program `g` walks the tiles `g, g + P, ...` of `block_spikes`
    neurons inside the kernel, skips a tile without an event (one load) and applies the rule
    to the rows (columns) of the tile's spiking neurons. No spike list is built outside the
    kernel. **Barriers**: none inside; a synapse is in one row and one column, so no two
    lanes of a phase write the same weight, and the `on_post` phase is a second kernel, which
    XLA starts after the `on_pre` one has finished (its input is the first one's output).

    `events` `(T, n_own)`: the spike values; `own_traces`, `other_traces`: flat `(T * n)`
    traces of the spiking side and the other side; `ptr` `(n_own + 1,)` the row (column)
    pointers; `syn_of` `(nnz,)` the synapse at each position (None: the position itself,
    CSR order) and `other_of` `(nnz,)` the neuron on the other side.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    interpret = _pallas.pallas_interpret()
    size = w_flat.shape[0]
    nnz = other_of.shape[0]
    bs = _pallas.next_pow2(min(block_spikes, n_own))
    n_tiles = -(-n_own // bs)
    n_prog = max(1, min(-(-1024 // n_trials), n_tiles))
    rounds = -(-n_tiles // n_prog)
    bc = _pallas.next_pow2(min(block_synapses, width))
    n_chunks = -(-width // bc)
    n_own_tr, n_other_tr = len(own_traces), len(other_traces)
    tables = [ptr.astype(jnp.int32), other_of.astype(jnp.int32)]
    if syn_of is not None:
        tables.append(syn_of.astype(jnp.int32))
    inputs = [
        events.reshape(-1).astype(w_flat.dtype),
        *tables,
        *(jnp.reshape(x, (1,)) for x in leaves),
        *own_traces,
        *other_traces,
        w_flat,
    ]

    def update_tile(refs, t, i, s, live):
        ptr_ref, other_ref = refs[1:3]
        pos = 3
        syn_ref = None
        if syn_of is not None:
            syn_ref, pos = refs[3], 4
        leaf_refs = refs[pos : pos + len(leaves)]
        pos += len(leaves)
        own_refs = refs[pos : pos + n_own_tr]
        other_refs = refs[pos + n_own_tr : pos + n_own_tr + n_other_tr]
        w_ref = refs[-1]  # aliased with refs[-2], the weights handed in
        rule = rebuild([r[0] for r in leaf_refs])
        s = s[:, None]
        mine = tuple(r[t * n_own + i][:, None] for r in own_refs)
        start = ptr_ref[i]
        end = ptr_ref[i + 1]
        lane = jnp.arange(bc, dtype=jnp.int32)

        def chunk(c, carry):
            j = start[:, None] + c * bc + lane[None, :]
            ok = live[:, None] & (j < end[:, None])
            jc = jnp.clip(j, 0, nnz - 1)
            syn = syn_ref[jc] if syn_ref is not None else jc
            where = t * nnz + syn
            wv = w_ref[where]
            other_at = t * n_other + other_ref[jc]
            theirs = tuple(r[other_at] for r in other_refs)
            if post_side:
                new = rule.on_post(wv, theirs, mine, s)
            else:
                new = rule.on_pre(wv, mine, theirs, s)
            _store(w_ref, where, new.astype(wv.dtype), ok, size, interpret)
            return carry

        lax.fori_loop(0, n_chunks, chunk, 0)

    def kernel(*refs):
        ev_ref = refs[0]
        t = pl.program_id(0).astype(jnp.int32)
        g = pl.program_id(1).astype(jnp.int32)
        lane = jnp.arange(bs, dtype=jnp.int32)

        def tile(r, carry):
            k = (g + r * n_prog) * bs + lane
            inside = k < n_own
            i = jnp.minimum(k, n_own - 1)
            s = jnp.where(inside, ev_ref[t * n_own + i], 0)
            live = inside & (s != 0)
            lax.cond(
                jnp.sum(live.astype(jnp.int32)) > 0,  # Triton has no reduce_or
                lambda: update_tile(refs, t, i, s, live),
                lambda: None,
            )
            return carry

        lax.fori_loop(0, rounds, tile, 0)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(w_flat.shape, w_flat.dtype),
        grid=(n_trials, n_prog),
        input_output_aliases={len(inputs) - 1: 0},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="nj_plastic_on_post" if post_side else "nj_plastic_on_pre",
    )(*inputs)


def plastic_gpu(
    rule,
    lay,
    w,
    pre_old,
    post_old,
    s_arr,
    s_post,
    pre_decay,
    post_decay,
    *,
    sizes,
    block_spikes: int = 16,
    block_synapses: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """One step of `rule` on a plastic projection, its weight updates in Pallas Triton.

    The traces decay and take the step's spikes in XLA (one element-wise pass over neurons);
    the weight updates are two kernels, in the order of `neurojax.plasticity._base`: first
    `on_pre` on the CSR rows of the arriving presynaptic neurons (with the traces before this
    step's spikes), then `on_post` on the CSC columns of the spiking postsynaptic neurons
    (with the presynaptic traces including this step's arrivals). Each kernel's grid is
    `(trial, block of block_spikes spiking neurons)`; a program walks its neurons' rows (or
    columns) `block_synapses` synapses at a time over `ceil(max_fan_out / block_synapses)`
    chunks, loads the weights and the traces of both neurons, calls the rule's function and
    stores the new weights. A synapse belongs to one row and one column, so the stores of a
    kernel never collide: no atomics are needed, and the results equal the reference's up to
    the rounding of the rule's arithmetic.

    Arguments as the entry's reference (`neurojax.network._plastic._event_update`); leading
    dimensions of the weights, traces and spikes are trials.
    """
    n_pre, n_post, max_out, max_in, arr_offset, post_offset = sizes
    s_arr = s_arr[..., arr_offset : arr_offset + n_pre]
    s_post = s_post[..., post_offset : post_offset + n_post]
    pre = tuple(t * d for t, d in zip(pre_old, pre_decay, strict=True))
    post = tuple(t * d for t, d in zip(post_old, post_decay, strict=True))
    pre_new = rule.update_pre_traces(pre, s_arr)
    post_new = rule.update_post_traces(post, s_post)
    nnz = w.shape[-1]
    if nnz == 0:
        return w, pre_new, post_new
    w2, _ = _pallas.flat_trials(w)
    n_trials = w2.shape[0]
    params, static_rule = eqx.partition(rule, eqx.is_array)
    leaves, treedef = jtu.tree_flatten(params)

    def rebuild(values):
        return eqx.combine(jtu.tree_unflatten(treedef, values), static_rule)

    def flat(traces, n):
        return tuple(jnp.broadcast_to(x, (*w.shape[:-1], n)).reshape(-1) for x in traces)

    common = dict(
        n_trials=n_trials,
        block_spikes=block_spikes,
        block_synapses=block_synapses,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    w_flat = w2.reshape(-1)
    post_flat = flat(post, n_post)
    if max_out and n_pre:
        events = jnp.broadcast_to(s_arr, (*w.shape[:-1], n_pre)).reshape(n_trials, n_pre)
        w_flat = _phase(
            w_flat,
            events.astype(w.dtype),
            flat(pre, n_pre),
            post_flat,
            lay.indptr,
            None,
            lay.indices,
            leaves,
            rebuild,
            post_side=False,
            n_own=n_pre,
            n_other=n_post,
            width=max_out,
            **common,
        )
    if max_in and n_post:
        events = jnp.broadcast_to(s_post, (*w.shape[:-1], n_post)).reshape(n_trials, n_post)
        w_flat = _phase(
            w_flat,
            events.astype(w.dtype),
            post_flat,
            flat(pre_new, n_pre),
            lay.col_ptr,
            lay.col_syn,
            lay.col_pre,
            leaves,
            rebuild,
            post_side=True,
            n_own=n_post,
            n_other=n_pre,
            width=max_in,
            **common,
        )
    return w_flat.reshape(w.shape), pre_new, post_new
