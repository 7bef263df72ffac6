"""Synapse storage of an assembly brain: dense matrices and padded fan-out lists.

Both layouts answer the two questions a projection step asks of the synapses from one area
to another: the summed input that a set of firing source neurons sends to every target
neuron, and the Hebbian update that multiplies the synapses from the firing sources onto the
new winners by `1 + beta`.

- dense: a `(n_src, n_tgt)` float matrix. Sparse-mode areas use it over their support
  capacity; explicit areas use it while the matrix is small.
- fan-out lists (`FanOut`): for each source neuron the targets of its synapses, in increasing
  order and padded with the sentinel `n_tgt`, and their weights. Explicit areas with many
  neurons use it (about `8 n p` bytes per source neuron instead of `4 n`).

On CPU the two dense operations of a projection step, the input sum (`dense_inputs`) and the
update of the synapses of first-time winners plus the Hebbian factor (`dense_update`), run in
the compiled kernels of `_dense_kernel.cc` (built on first use with the network kernels, see
`neurojax.network._kernel`): work in proportion to the winners, weights updated in place.
`dense_update_inputs` runs an update and the next step's input sum in one kernel, which reads
once the rows that both touch.
The update gives exactly the numbers of the pure-JAX path, which other platforms use; the
input sum adds the rows in list order where XLA reduces in its own order, so with
non-integer weights a sum may differ in its last bit. XLA:CPU's scatter costs a few
nanoseconds per index even for indices it drops, and a step without first-time winners
would still pay for a `k x k` scatter of them.
"""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from ..network import _kernel

__all__ = [
    "FanOut",
    "random_dense",
    "random_fanout",
    "fanout_width",
    "inputs",
    "dense_inputs",
    "dense_update",
    "dense_update_inputs",
    "hebbian",
    "hebbian_vector",
    "winner_mask",
]


class FanOut(eqx.Module):
    """Synapses as padded fan-out lists.

    `targets[i, j]` is the target of the `j`-th synapse of source neuron `i` (increasing in
    `j`; the sentinel `n_tgt` marks padding) and `weights[i, j]` its weight (0 on padding).
    """

    targets: Int[Array, "n_src width"]
    weights: Float[Array, "n_src width"]
    n_tgt: int = eqx.field(static=True)

    def nbytes(self) -> int:
        """Bytes held by the two arrays."""
        return int(self.targets.nbytes + self.weights.nbytes)


def random_dense(key: PRNGKeyArray, n_src: int, n_tgt: int, p: float) -> Float[Array, "a b"]:
    """A `(n_src, n_tgt)` matrix of independent Bernoulli(p) weights (0.0 or 1.0)."""
    return jr.bernoulli(key, p, (n_src, n_tgt)).astype(jnp.result_type(float))


def fanout_width(n_tgt: int, p: float) -> int:
    """Padded fan-out: the Binomial(n_tgt, p) mean plus 10 standard deviations, and a margin.

    A row that needs more is reported by `random_fanout` as an error; at this width that
    happens with probability below 1e-20 per row.
    """
    mean = n_tgt * p
    sd = math.sqrt(n_tgt * p * (1.0 - p))
    return int(min(n_tgt, math.ceil(mean + 10.0 * sd + 16.0)))


def random_fanout(key: PRNGKeyArray, n_src: int, n_tgt: int, p: float) -> FanOut:
    """Bernoulli(p) synapses from `n_src` to `n_tgt` neurons as fan-out lists.

    Each row is drawn exactly by geometric skipping: the gaps between consecutive connected
    targets are independent Geometric(p) variables, so the targets whose cumulative gap stays
    inside the row form a Bernoulli(p) pattern. A row whose `width` gaps all fit inside
    `n_tgt` may have more synapses than the width holds; that raises (also under `jit`)
    instead of dropping synapses.
    """
    width = fanout_width(n_tgt, p)
    gaps = jr.geometric(key, p, (n_src, width), dtype=jnp.int32)
    # Gaps are >= 1; the first connected target is gap_1 - 1. Cumulative sums can only run
    # past int32 when n_tgt is near 2**31, which the Brain refuses.
    pos = jnp.cumsum(jnp.minimum(gaps, n_tgt + 1), axis=1) - 1
    full = pos[:, -1] < n_tgt
    pos = eqx.error_if(
        pos,
        jnp.any(full) & (width < n_tgt),
        f"assembly: a neuron drew more than {width} synapses onto an area of {n_tgt}; the "
        "padded fan-out is too narrow for this p (please report)",
    )
    valid = pos < n_tgt
    targets = jnp.where(valid, pos, n_tgt).astype(jnp.int32)
    weights = valid.astype(jnp.result_type(float))
    return FanOut(targets=targets, weights=weights, n_tgt=n_tgt)


def _safe(idx: Int[Array, "..."], size: int) -> Int[Array, "..."]:
    """Map the `-1` padding of winner lists to `size`, an index every gather fills and every
    scatter drops."""
    return jnp.where(idx < 0, size, idx)


def inputs(conn: Float[Array, "a b"] | FanOut, sources: Int[Array, " k"]) -> Float[Array, " b"]:
    """Summed weight from the firing `sources` (indices, `-1` = none) onto every target."""
    if isinstance(conn, FanOut):
        n_src = conn.targets.shape[0]
        src = _safe(sources, n_src)
        tgt = jnp.take(conn.targets, src, axis=0, mode="fill", fill_value=conn.n_tgt)
        w = jnp.take(conn.weights, src, axis=0, mode="fill", fill_value=0.0)
        zero = jnp.zeros((conn.n_tgt,), conn.weights.dtype)
        return zero.at[tgt.reshape(-1)].add(w.reshape(-1), mode="drop")
    rows = jnp.take(conn, _safe(sources, conn.shape[0]), axis=0, mode="fill", fill_value=0.0)
    return jnp.sum(rows, axis=0)


def hebbian(
    conn: Float[Array, "a b"] | FanOut,
    sources: Int[Array, " ks"],
    targets: Int[Array, " kt"],
    target_mask: Bool[Array, " b"] | None,
    factor: Float[Array, ""],
) -> Float[Array, "a b"] | FanOut:
    """Multiply every synapse from `sources` onto `targets` by `factor` (indices, `-1` = none).

    `target_mask` (fan-out layout only) marks the targets as a boolean vector over the target
    area, which is how the fan-out rows are tested.
    """
    if isinstance(conn, FanOut):
        n_src = conn.targets.shape[0]
        src = _safe(sources, n_src)
        tgt = jnp.take(conn.targets, src, axis=0, mode="fill", fill_value=conn.n_tgt)
        hit = jnp.take(target_mask, tgt, mode="fill", fill_value=False)
        w = jnp.take(conn.weights, src, axis=0, mode="fill", fill_value=0.0)
        w = jnp.where(hit, w * factor, w)
        return FanOut(
            targets=conn.targets,
            weights=conn.weights.at[src].set(w, mode="drop"),
            n_tgt=conn.n_tgt,
        )
    n_src, n_tgt = conn.shape
    if n_src * n_tgt >= 2**31 - 1:
        rows = _safe(sources, n_src)[:, None]
        cols = _safe(targets, n_tgt)[None, :]
        return conn.at[rows, cols].multiply(factor, mode="drop")
    # One flat index per synapse: XLA's CPU scatter is about a quarter faster on a vector
    # than on a matrix indexed by row and column.
    rows = _safe(sources, n_src)[:, None]
    cols = _safe(targets, n_tgt)[None, :]
    flat = jnp.where((rows < n_src) & (cols < n_tgt), rows * n_tgt + cols, n_src * n_tgt)
    out = conn.reshape(-1).at[flat.reshape(-1)].multiply(factor, mode="drop")
    return out.reshape(n_src, n_tgt)


def hebbian_vector(
    weights: Float[Array, " b"], targets: Int[Array, " k"], factor: Float[Array, ""]
) -> Float[Array, " b"]:
    """Multiply the stimulus weights onto `targets` (`-1` = none) by `factor`."""
    return weights.at[_safe(targets, weights.shape[0])].multiply(factor, mode="drop")


def winner_mask(winners: Int[Array, " k"], size: int) -> Bool[Array, " size"]:
    """Boolean vector over an area marking `winners` (`-1` entries ignored)."""
    return jnp.zeros((size,), bool).at[_safe(winners, size)].set(True, mode="drop")


# -- dense operations of a projection step: compiled CPU kernel or pure JAX ------------------


def _rowsum_jax(conn: Array, rows: Array, limit: Array) -> Array:
    x = inputs(conn, rows)
    return jnp.where(jnp.arange(conn.shape[-1], dtype=jnp.int32) < limit, x, jnp.zeros_like(x))


def _rowsum_kernel(conn: Array, rows: Array, limit: Array) -> Array:
    def raw(conn, rows, limit):
        call = jax.ffi.ffi_call(
            _kernel.ASM_ROWSUM_TARGET,
            jax.ShapeDtypeStruct((*conn.shape[:-2], conn.shape[-1]), conn.dtype),
            vmap_method="sequential",
        )
        return call(conn, rows, limit)

    # The kernel treats leading dimensions as brains: under vmap over brains (the weights
    # batched) one call does them all; with shared weights, one call per batch entry.
    @jax.custom_batching.custom_vmap
    def rowsum(conn, rows, limit):
        return raw(conn, rows, limit)

    @rowsum.def_vmap
    def _batched(axis_size, in_batched, conn, rows, limit):
        if not in_batched[0]:
            axes = (None, 0 if in_batched[1] else None, 0 if in_batched[2] else None)
            return jax.vmap(raw, in_axes=axes)(conn, rows, limit), True
        rows, limit = (
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip((rows, limit), in_batched[1:], strict=True)
        )
        return raw(conn, rows, limit), True

    return rowsum(conn, rows, limit)


@jax.custom_jvp
def _rowsum(conn: Array, rows: Array, limit: Array) -> Array:
    if _kernel.available():
        return jax.lax.platform_dependent(
            conn, rows, limit, cpu=_rowsum_kernel, default=_rowsum_jax
        )
    return _rowsum_jax(conn, rows, limit)


@_rowsum.defjvp
def _rowsum_jvp(primals, tangents):
    # Linear in the weights: the tangent is the pure-JAX sum of the weight tangents (which
    # reverse mode can transpose; the kernel is never differentiated).
    _, d_out = jax.jvp(_rowsum_jax, primals, tangents)
    return _rowsum(*primals), d_out


def dense_inputs(
    conn: Float[Array, "a b"], sources: Int[Array, " k"], limit: Int[Array, ""] | int | None = None
) -> Float[Array, " b"]:
    """`inputs` of a dense matrix, summed over the first `limit` targets only (0 beyond).

    `limit=None` sums every target. In sparse mode `limit` is the target area's support: the
    columns beyond it hold synapses of neurons that have not fired, which the caller masks.
    """
    limit = conn.shape[-1] if limit is None else limit
    return _rowsum(conn, _safe(sources, conn.shape[0]), jnp.asarray(limit, jnp.int32))


def _compact(rows: Int[Array, " k"]) -> Int[Array, " k"]:
    """The valid (`>= 0`) entries of a list first, in order, then `-1`s."""
    valid = rows >= 0
    dest = jnp.where(valid, jnp.cumsum(valid.astype(jnp.int32)) - 1, rows.shape[0])
    return jnp.full_like(rows, -1).at[dest].set(rows, mode="drop")


def _update_jax(plastic, conn, src_rows, cols, chosen, start, count, heb_rows, heb_cols, factor):
    n_src, n_tgt = conn.shape
    k_src = src_rows.shape[0]
    if cols.shape[0]:
        src_rows = _compact(src_rows)
        slot = chosen - start
        ok = (slot >= 0) & (slot < count)
        rows = jnp.arange(cols.shape[0], dtype=jnp.int32)[:, None]
        hit = jnp.zeros((cols.shape[0], k_src), conn.dtype)
        hit = hit.at[rows, jnp.where(ok, slot, k_src)].set(1.0, mode="drop")
        conn = conn.at[_safe(src_rows, n_src)[None, :], _safe(cols, n_tgt)[:, None]].set(
            hit, mode="drop"
        )
    if plastic:
        conn = hebbian(conn, heb_rows, heb_cols, None, factor)
    return conn


def _update_ffi(target, plastic, conn, *args):
    """The call of an update kernel: `nj_asm_update` (result: the weights) or
    `nj_asm_update_sum` (two more arguments, the rows and limit of the sum; results: the
    weights and the sum)."""
    with_sum = target == _kernel.ASM_UPDATE_SUM_TARGET

    def raw(*args):
        w = jax.ShapeDtypeStruct(args[0].shape, args[0].dtype)
        x = jax.ShapeDtypeStruct(args[0].shape[:-2] + args[0].shape[-1:], args[0].dtype)
        call = jax.ffi.ffi_call(
            target,
            (w, x) if with_sum else w,
            input_output_aliases={0: 0},
            vmap_method="sequential",
        )
        return call(*args, plastic=np.int64(plastic))

    # Leading dimensions are brains; the result is one matrix per brain, so under vmap every
    # argument is broadcast to the batch and one call updates all of them in place.
    @jax.custom_batching.custom_vmap
    def update(*args):
        return raw(*args)

    @update.def_vmap
    def _batched(axis_size, in_batched, *args):
        args = [
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched, strict=True)
        ]
        return raw(*args), ((True, True) if with_sum else True)

    return update(conn, *args)


def _on_platform(plastic, kernel_target, pure, *args):
    """`_update_ffi` with `kernel_target` on CPU when the kernels are built, else `pure`."""
    if _kernel.available():
        return jax.lax.platform_dependent(
            *args,
            cpu=functools.partial(_update_ffi, kernel_target, plastic),
            default=functools.partial(pure, plastic),
        )
    return pure(plastic, *args)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _update(plastic, *args):
    return _on_platform(plastic, _kernel.ASM_UPDATE_TARGET, _update_jax, *args)


def _update_differentiable(plastic, conn, src_rows, cols, chosen, start, count, *hebb):
    """`_update_jax` written with gathers and scatter-sets only, which JAX differentiates
    (its scatter-multiply has no gradient): the tangent rule of `_update`."""
    n_src, n_tgt = conn.shape
    if cols.shape[0]:
        created = (src_rows, cols, chosen, start, count, *hebb)
        zero = _update_jax(False, jnp.zeros_like(conn), *created)
        one = _update_jax(False, jnp.ones_like(conn), *created)
        # Created synapses are constants: zero (or one) whatever the old weight was.
        conn = jnp.where(zero == one, jax.lax.stop_gradient(zero), conn)
    if plastic:
        heb_rows, heb_cols, factor = hebb
        rows = _safe(heb_rows, n_src)[:, None]
        cols_t = _safe(heb_cols, n_tgt)[None, :]
        block = conn.at[rows, cols_t].get(mode="fill", fill_value=0.0)
        conn = conn.at[rows, cols_t].set(block * factor, mode="drop")
    return conn


@_update.defjvp
def _update_jvp(plastic, primals, tangents):
    f = functools.partial(_update_differentiable, plastic)
    _, d_out = jax.jvp(f, primals, tangents)
    return _update(plastic, *primals), d_out


def _update_sum_jax(plastic, conn, *args):
    *update_args, sum_rows, sum_limit = args
    conn = _update_jax(plastic, conn, *update_args)
    return conn, _rowsum_jax(conn, sum_rows, sum_limit)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _update_sum(plastic, *args):
    return _on_platform(plastic, _kernel.ASM_UPDATE_SUM_TARGET, _update_sum_jax, *args)


@_update_sum.defjvp
def _update_sum_jvp(plastic, primals, tangents):
    *update_primals, sum_rows, sum_limit = primals
    f = functools.partial(_update_differentiable, plastic)
    _, d_conn = jax.jvp(f, tuple(update_primals), tuple(tangents[:-2]))
    conn, x = _update_sum(plastic, *primals)
    # The sum is linear in the updated weights.
    d_x = _rowsum_jax(d_conn, sum_rows, sum_limit)
    return (conn, x), (d_conn, d_x)


def _update_arguments(conn, created, hebb):
    """`(plastic, args)` of `_update` for `dense_update`'s `created` and `hebb`."""
    if created is None:
        empty = jnp.zeros((0,), jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        created = (empty, empty, jnp.zeros((0, 1), jnp.int32), zero, zero)
    src_rows, cols, chosen, start, count = created
    if hebb is None:
        plastic = False
        empty = jnp.zeros((0,), jnp.int32)
        hebb = (empty, empty, jnp.ones((), conn.dtype))
    else:
        plastic = True
    heb_rows, heb_cols, factor = hebb
    i32 = functools.partial(jnp.asarray, dtype=jnp.int32)
    args = (
        i32(src_rows),
        i32(cols),
        i32(chosen),
        i32(start),
        i32(count),
        i32(heb_rows),
        i32(heb_cols),
        jnp.asarray(factor, conn.dtype),
    )
    return plastic, args


def dense_update(
    conn: Float[Array, "a b"],
    created: tuple[Array, ...] | None,
    hebb: tuple[Array, Array, Array] | None,
) -> Float[Array, "a b"]:
    """Synapses of first-time winners, then the Hebbian factor, on a dense matrix.

    `created = (src_rows, cols, chosen, start, count)` (sparse mode) gives the new synapses
    onto first-time winners: for every row `i` with a valid column `cols[i]` (`-1` or
    `n_tgt` = not new), the synapses from the valid `src_rows` (`-1` = none) onto that column
    become 0, except those from the `(t - start)`-th valid entry of `src_rows` for the items
    `t` of `chosen[i]` with `0 <= t - start < count`, which become 1. `hebb = (sources,
    targets, factor)` then multiplies every synapse from `sources` onto `targets` by
    `factor`, as `hebbian`. Either may be None.
    """
    plastic, args = _update_arguments(conn, created, hebb)
    return _update(plastic, conn, *args)


def dense_update_inputs(
    conn: Float[Array, "a b"],
    created: tuple[Array, ...] | None,
    hebb: tuple[Array, Array, Array] | None,
    sources: Int[Array, " k"],
    limit: Int[Array, ""] | int | None = None,
) -> tuple[Float[Array, "a b"], Float[Array, " b"]]:
    """`dense_update`, then `dense_inputs` of the updated matrix, as one operation.

    Returns `(conn, x)` equal to `(w, dense_inputs(w, sources, limit))` with
    `w = dense_update(conn, created, hebb)`. On CPU one kernel does both: a row that the
    Hebbian factor scales and the sum then reads (a converged projection sums next the rows it
    has just scaled) is read once. `Brain.project_rounds` uses it to compute each step's input
    sum at the end of the step before.
    """
    plastic, args = _update_arguments(conn, created, hebb)
    limit = conn.shape[-1] if limit is None else limit
    rows = _safe(jnp.asarray(sources, jnp.int32), conn.shape[0])
    return _update_sum(plastic, conn, *args, rows, jnp.asarray(limit, jnp.int32))
