r"""Whole runs of uncoupled populations as one Pallas Triton program grid: the GPU slots of
the registry entries `lif_run` and `hh_run` (`neurojax.neurons._lif_fused`,
`neurojax.neurons._hh_fused`) are this kernel with the model's update passed in.

**Design** (the seeds' CuPy Hodgkin-Huxley batch simulator, in Pallas): the grid is
`(trial, block of `block` neurons)`, one lane per neuron. Each program loads its block of
the state and of the parameters once, runs every step in a loop inside the kernel with the
state in registers, and writes, once per record window of `every` steps, the window's spikes
(the bool raster when `every == 1`, else the counts) and the recorded state fields (their
values at the end of the window, as `nj.simulate` records them). The final state is written
once, at the end. A run of `n_steps` steps is one kernel launch; the memory traffic is the
state twice, the parameters once and the record.

**Barriers.** None are needed: neurons are independent, each lane reads and writes only its
own neuron's state and record entries, and no program reads what another writes. The record
stores of one window and those of the next never overlap (different rows of the record).

**Parameters** come in three kinds, chosen by the caller per argument: `"scalar"` (one value
for every trial and neuron, a `(1,)` array read once as a scalar: never broadcast to an
array), `"neuron"` (one value per neuron, shared by the trials, `(n,)`) and `"full"` (one
value per trial and neuron, `(T, n)`).

The model's update is any elementwise function
`update(states, params) -> (states, spike)` of tuples of `(block,)` arrays (or scalars, for
scalar parameters) returning a bool `spike`; it is traced into the kernel body, so it must
use only elementwise operations Triton lowers (arithmetic, `exp`, `where`, comparisons).
"""

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from . import _pallas

__all__ = ["PARAM_KINDS", "whole_run_gpu"]

PARAM_KINDS = ("scalar", "neuron", "full")


def _check(states, params, kinds, n_rec, every, record, spikes_dtype, block):
    if not states:
        raise ValueError("whole_run_gpu: states must hold at least one array, got none")
    n_trials, n = states[0].shape
    for i, x in enumerate(states):
        if x.shape != (n_trials, n) or x.dtype != states[0].dtype:
            raise ValueError(
                f"whole_run_gpu: states[{i}] must be {(n_trials, n)} {states[0].dtype}, "
                f"got {x.shape} {x.dtype}"
            )
    if len(kinds) != len(params):
        raise ValueError(
            f"whole_run_gpu: kinds must give one kind per parameter ({len(params)}), "
            f"got {len(kinds)}"
        )
    want = {"scalar": (1,), "neuron": (n,), "full": (n_trials, n)}
    for i, (p, kind) in enumerate(zip(params, kinds, strict=True)):
        if kind not in PARAM_KINDS:
            raise ValueError(
                f"whole_run_gpu: kinds[{i}] must be one of {PARAM_KINDS}, got {kind!r}"
            )
        if p.shape != want[kind]:
            raise ValueError(
                f"whole_run_gpu: params[{i}] of kind {kind!r} must have shape {want[kind]}, "
                f"got {p.shape}"
            )
    for name, value in (("n_rec", n_rec), ("every", every), ("block", block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"whole_run_gpu: {name} must be an int >= 1, got {value!r}")
    for j in record:
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < len(states):
            raise ValueError(
                f"whole_run_gpu: record must hold state indices in [0, {len(states)}), "
                f"got {record!r}"
            )
    if every == 1 and jnp.dtype(spikes_dtype) != jnp.bool_:
        raise ValueError(
            f"whole_run_gpu: spikes_dtype must be bool when every == 1, got {spikes_dtype}"
        )


def whole_run_gpu(
    update: Callable,
    states: Sequence[jax.Array],
    params: Sequence[jax.Array],
    kinds: Sequence[str],
    *,
    n_rec: int,
    every: int,
    record: Sequence[int] = (),
    spikes_dtype=jnp.bool_,
    block: int = 128,
    num_warps: int = 4,
    num_stages: int = 1,
    name: str = "nj_whole_run",
):
    """`n_rec * every` steps of `update` on `n_trials` trials of `n` neurons in one Pallas
    Triton kernel (module docstring).

    Args:
        update: `update(states, params) -> (states, spike)`, elementwise (module docstring).
        states: the state arrays, each `(n_trials, n)`, one dtype.
        params: the parameters, shaped by their kind.
        kinds: one of `PARAM_KINDS` per parameter.
        n_rec: number of record windows.
        every: steps per window.
        record: indices of the states whose values at the end of each window are recorded.
        spikes_dtype: the record's dtype: bool for `every == 1`, else the counts' dtype.
        block: neurons per program (rounded up to a power of two, at most `n`'s).

    Returns:
        `(states, spikes, fields)`: the final states `(n_trials, n)`, the spike record
        `(n_trials, n_rec, n)` and one `(n_trials, n_rec, n)` array per recorded state.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    states, params, kinds, record = tuple(states), tuple(params), tuple(kinds), tuple(record)
    _check(states, params, kinds, n_rec, every, record, spikes_dtype, block)
    interpret = _pallas.pallas_interpret()
    n_trials, n = states[0].shape
    dtype = states[0].dtype
    bn = _pallas.next_pow2(min(block, n))
    n_blocks = -(-n // bn)
    size = n_trials * n_rec * n
    ns, npar = len(states), len(params)
    spikes_dtype = jnp.dtype(spikes_dtype)

    def kernel(*refs):
        st_refs = refs[:ns]
        p_refs = refs[ns : ns + npar]
        st_out = refs[ns + npar : 2 * ns + npar]
        spikes_out = refs[2 * ns + npar]
        field_out = refs[2 * ns + npar + 1 :]
        t = pl.program_id(0).astype(jnp.int32)
        b = pl.program_id(1).astype(jnp.int32)
        k = b * bn + jnp.arange(bn, dtype=jnp.int32)
        inside = k < n
        ps = tuple(r[0] if kind == "scalar" else r[...] for r, kind in zip(p_refs, kinds))
        st = tuple(r[...] for r in st_refs)

        def store(ref, at, value):
            if interpret:
                # Pallas's interpreted masked store also writes its masked lanes: aim them
                # past the end, where the scatter drops them.
                ref[jnp.where(inside, at, size)] = value
            else:
                plgpu.store(ref.at[at], value, mask=inside)

        def window(w, st):
            if every == 1:
                st, spike = update(st, ps)
                rec = spike
            else:

                def inner(_, carry):
                    st, counts = carry
                    st, spike = update(st, ps)
                    return st, counts + spike.astype(jnp.int32)

                st, rec = lax.fori_loop(0, every, inner, (st, jnp.zeros((bn,), jnp.int32)))
            at = (t * n_rec + w) * n + k
            store(spikes_out, at, rec.astype(spikes_dtype))
            for ref, j in zip(field_out, record, strict=True):
                store(ref, at, st[j])
            return tuple(st)

        st = lax.fori_loop(0, n_rec, window, st)
        for ref, x in zip(st_out, st, strict=True):
            ref[...] = x.astype(ref.dtype)

    blocked = pl.BlockSpec((None, bn), lambda t, b: (t, b))
    per_neuron = pl.BlockSpec((bn,), lambda t, b: (b,))
    whole = pl.no_block_spec
    spec = {"scalar": whole, "neuron": per_neuron, "full": blocked}
    flat = jax.ShapeDtypeStruct((size,), dtype)
    out = pl.pallas_call(
        kernel,
        out_shape=(
            *(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in states),
            jax.ShapeDtypeStruct((size,), spikes_dtype),
            *(flat for _ in record),
        ),
        grid=(n_trials, n_blocks),
        in_specs=[blocked] * ns + [spec[kind] for kind in kinds],
        out_specs=(*([blocked] * ns), whole, *(whole for _ in record)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name=name,
    )(*states, *params)
    final = out[:ns]
    spikes = out[ns].reshape(n_trials, n_rec, n)
    fields = tuple(x.reshape(n_trials, n_rec, n) for x in out[ns + 1 :])
    return final, spikes, fields


def param_kind(p: jax.Array, lead: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """The cheapest kind that carries `p` (broadcastable to `(*lead, *shape)`): `"scalar"`
    for one value, `"neuron"` when it has no trial axes, else `"full"`."""
    if p.size == 1:
        return "scalar"
    if p.ndim <= len(shape):
        return "neuron"
    return "full"


def as_kind(p: jax.Array, kind: str, lead: tuple[int, ...], shape: tuple[int, ...], dtype):
    """`p` in the layout of `kind` (see `param_kind`) for `whole_run_gpu`."""
    p = jnp.asarray(p, dtype)
    if kind == "scalar":
        return p.reshape(1)
    if kind == "neuron":
        return jnp.broadcast_to(p, shape).reshape(-1)
    return jnp.broadcast_to(p, (*lead, *shape)).reshape(-1, math.prod(shape))
