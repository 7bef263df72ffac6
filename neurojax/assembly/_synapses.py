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
"""

import math

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

__all__ = [
    "FanOut",
    "random_dense",
    "random_fanout",
    "fanout_width",
    "inputs",
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
