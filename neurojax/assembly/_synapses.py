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
the compiled kernels of `neurojax/kernels/assembly.cc` (registered kernels, see
`neurojax.kernels`): work in proportion to the winners, weights updated in place.
`dense_update_inputs` runs an update and the next step's input sum in one kernel, which reads
once the rows that both touch.
Both give exactly the numbers of the pure-JAX path, which other platforms use: the update
sets and multiplies each synapse once, and the input sum adds the firing rows as one fixed
balanced binary tree (`pairwise_sum`) on every path, so the k-cap sees bit-identical inputs
and a seed gives the same assemblies on CPU, GPU and TPU, with or without the kernels (a sum
in list order against XLA's own reduction order differed in the last bit and flipped
near-ties). XLA:CPU's scatter costs a few nanoseconds per index even for indices it drops,
and a step without first-time winners would still pay for a `k x k` scatter of them.
"""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .. import kernels

__all__ = [
    "FanOut",
    "random_dense",
    "random_fanout",
    "fanout_width",
    "inputs",
    "pairwise_sum",
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
    """A `(n_src, n_tgt)` matrix of independent Bernoulli(p) weights (0.0 or 1.0).

    Row `i` is drawn from `fold_in(key, i)`, so with a threefry key (JAX's default, whose
    draws of a vector are prefix-consistent) the synapse `(i, j)` does not depend on the
    matrix's size: a larger matrix extends a smaller one. A sparse-mode brain relies on it to
    grow its capacity with the results it would have had with the larger capacity.
    """
    rows = jnp.arange(n_src, dtype=jnp.uint32)
    draw = jax.vmap(lambda i: jr.bernoulli(jr.fold_in(key, i), p, (n_tgt,)))
    return draw(rows).astype(jnp.result_type(float))


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
    return pairwise_sum(rows)


def pairwise_sum(rows: Float[Array, "k b"]) -> Float[Array, " b"]:
    """The sum of `rows` over the first axis as a fixed balanced binary tree.

    Neighbouring pairs are added level by level (an odd row out at the end of a level goes
    up unchanged), which is the tree whose node over positions `[lo, hi)` adds the nodes over
    `[lo, lo + h)` and `[lo + h, hi)`, `h` the largest power of two below `hi - lo`. Every
    addition is explicit, so XLA cannot reorder it, and float addition is commutative: the
    result is the same bit for bit on every backend and equals the CPU kernels' sums
    (`neurojax/kernels/assembly.cc`, `PairwiseSum`). The rounding error grows with
    `log2(k)`, not `k`.
    """
    if rows.shape[0] == 0:
        return jnp.zeros(rows.shape[1:], rows.dtype)
    while rows.shape[0] > 1:
        odd = rows[-1:] if rows.shape[0] % 2 else rows[:0]
        even = rows.shape[0] - odd.shape[0]
        rows = jnp.concatenate([rows[0:even:2] + rows[1:even:2], odd])
    return rows[0]


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
    """`_rowsum_jax` on CPU: one call for every leading (brain) dimension."""
    call = jax.ffi.ffi_call(
        "nj_asm_rowsum",
        jax.ShapeDtypeStruct((*conn.shape[:-2], conn.shape[-1]), conn.dtype),
        vmap_method="sequential",
    )
    return call(conn, rows, limit)


def _rowsum_examples():
    key = jr.key(0)
    conn = jr.uniform(key, (2, 9, 7), jnp.float32)
    rows = jnp.asarray([[0, 3, 9, 8], [9, 9, 9, 9]], jnp.int32)  # 9: padding (no row)
    for b in range(2):
        yield kernels.Example((conn[b], rows[b], jnp.int32(5)), label=f"rows{b}")
    yield kernels.Example((conn[0], rows[0], jnp.int32(7)), grad_argnums=(0,), label="grad")


# The input sum of a projection step: rows of the firing sources added as `pairwise_sum`'s tree.
# Leading dimensions are brains: a vmapped batch of weights is one call; with shared weights
# (broadcasting them would copy every matrix) one call per batch entry.
ROWSUM = kernels.register(
    kernels.Kernel(
        "assembly_rowsum",
        reference=_rowsum_jax,
        cpu=_rowsum_kernel,
        ffi_targets=(("nj_asm_rowsum", "NjAsmRowSum"),),
        batching=kernels.Fold(trial=(0, 1, 2), only_if_batched=(0,)),
        # The same tree of additions on both paths: equal bit for bit.
        examples=_rowsum_examples,
    )
)


def _rowsum(conn: Array, rows: Array, limit: Array) -> Array:
    return kernels.call(ROWSUM, conn, rows, limit)


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


def _update_ffi(target, with_sum, conn, *args, plastic):
    """The call of an update kernel: `nj_asm_update` (result: the weights) or
    `nj_asm_update_sum` (two more arguments, the rows and limit of the sum; results: the
    weights and the sum). Leading dimensions are brains, one matrix each, updated in place."""
    w = jax.ShapeDtypeStruct(conn.shape, conn.dtype)
    x = jax.ShapeDtypeStruct(conn.shape[:-2] + conn.shape[-1:], conn.dtype)
    call = jax.ffi.ffi_call(
        target, (w, x) if with_sum else w, input_output_aliases={0: 0}, vmap_method="sequential"
    )
    return call(conn, *args, plastic=np.int64(plastic))


def _update_differentiable(conn, src_rows, cols, chosen, start, count, *hebb, plastic):
    """`_update_jax` written with gathers and scatter-sets only, which JAX differentiates
    (its scatter-multiply has no gradient): the tangent rule of the update kernels."""
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


def _update_sum_jax(conn, *args, plastic):
    *update_args, sum_rows, sum_limit = args
    conn = _update_jax(plastic, conn, *update_args)
    return conn, _rowsum_jax(conn, sum_rows, sum_limit)


def _update_sum_differentiable(conn, *args, plastic):
    """`_update_sum_jax` through `_update_differentiable`: the tangent rule of the fused
    kernel (the sum is linear in the updated weights)."""
    *update_args, sum_rows, sum_limit = args
    conn = _update_differentiable(conn, *update_args, plastic=plastic)
    return conn, _rowsum_jax(conn, sum_rows, sum_limit)


def _update_examples(with_sum):
    def examples():
        rng = np.random.default_rng(0)
        conn = jnp.asarray(rng.uniform(0.0, 1.0, (8, 6)), jnp.float32)
        i32 = functools.partial(jnp.asarray, dtype=jnp.int32)
        created = (i32([1, -1, 4, 6]), i32([2, 6, 5]), i32([[0, 1], [2, 9], [1, 3]]))
        created += (i32(0), i32(3))
        hebb = (i32([1, 4, -1]), i32([2, 3, 0]), jnp.float32(1.25))
        tail = (i32([1, 4, 8]), i32(5)) if with_sum else ()
        for plastic in (False, True):
            yield kernels.Example(
                (conn, *created, *hebb, *tail),
                {"plastic": plastic},
                grad_argnums=(0, 8) if plastic else (0,),
                vmap_argnums=(0,),
                label=f"plastic={plastic}",
            )

    return examples


# The update of a projection step (synapses of first-time winners, the Hebbian factor), and
# the same update followed by the next step's input sum. Every argument is broadcast to the
# vmapped batch: one call updates every brain's matrix in place.
UPDATE = kernels.register(
    kernels.Kernel(
        "assembly_update",
        reference=lambda conn, *args, plastic: _update_jax(plastic, conn, *args),
        cpu=functools.partial(_update_ffi, "nj_asm_update", False),
        ffi_targets=(("nj_asm_update", "NjAsmUpdate"),),
        batching=kernels.Fold(trial=tuple(range(9))),
        differentiable=_update_differentiable,
        examples=_update_examples(False),
    )
)
UPDATE_SUM = kernels.register(
    kernels.Kernel(
        "assembly_update_sum",
        reference=_update_sum_jax,
        cpu=functools.partial(_update_ffi, "nj_asm_update_sum", True),
        ffi_targets=(("nj_asm_update_sum", "NjAsmUpdateSum"),),
        batching=kernels.Fold(trial=tuple(range(11))),
        differentiable=_update_sum_differentiable,
        examples=_update_examples(True),
    )
)


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
    return kernels.call(UPDATE, conn, *args, plastic=plastic)


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
    limit = jnp.asarray(limit, jnp.int32)
    return kernels.call(UPDATE_SUM, conn, *args, rows, limit, plastic=plastic)
