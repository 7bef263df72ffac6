r"""Spatial connectivity: positions, predicate-based and distance-based builders.

Positions are float arrays of shape `(n, d)` (default float dtype), one row per neuron, in
the neuron order of the population. Two engines evaluate connection rules without ever holding
`n_pre * n_post` values:

- **tiles** (`from_predicate`, `gaussian_connect` without cutoff): the pair space is cut into
  `block_size x block_size` tiles, each evaluated by one jitted kernel with its own key
  `fold_in(key, tile_index)`; only the accepted pairs of a tile are kept, so memory is
  O(synapses + block_size^2). Time is O(n_pre * n_post).
- **cell lists** (`distance_connect`, `gaussian_connect` with a cutoff, d <= 3): neurons are
  binned into cells at least one radius wide, and only pairs in neighbouring cells are
  evaluated, so time and memory are O(synapses) for roughly uniform densities.

Distances use the minimum-image convention when `periodic` gives the box lengths: the
displacement $\Delta$ along a periodic axis of length $L$ is replaced by
$\Delta - L\,\mathrm{round}(\Delta / L)$, so a pair is close if any periodic image is.
Random draws depend only on the key, the inputs and (for tiles) `block_size`.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax
from jax.experimental import sparse
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._validation import default_float
from ._checks import (
    MAX_SIZE,
    check_box,
    check_count,
    check_flag,
    check_key,
    check_positions,
    check_positive_real,
    check_probability,
    check_same_population,
    check_size,
)
from ._sampling import cap_in_degree, make_bcoo, sort_pairs
from ._weights import resolve_weights

__all__ = [
    "grid_positions",
    "lattice",
    "random_positions",
    "from_predicate",
    "distance_connect",
    "gaussian_connect",
]

# Candidate pairs evaluated per kernel call by the cell-list engine.
_PAIRS_PER_CALL = 1 << 21
# Pre neurons whose neighbour cells are looked up at once.
_PRE_CHUNK = 1 << 15
# Cells per axis at most, so linear cell ids fit comfortably in int64.
_MAX_CELLS_PER_AXIS = 1 << 20


def grid_positions(shape: Sequence[int], spacing: Any = 1.0) -> Float[Array, "n d"]:
    """Positions of a regular lattice of `shape` (e.g. `(rows, cols)` or `(x, y, z)`).

    Neuron `i` sits at `np.unravel_index(i, shape) * spacing` (row-major, last axis fastest,
    origin at 0), so a lattice of shape `(h, w)` is numbered row by row. The box that makes
    the lattice periodic without a seam is `np.array(shape) * spacing`.

    Args:
        shape: a tuple of positive ints, one per dimension (1-D, 2-D and 3-D are typical).
        spacing: distance between neighbours, a positive scalar or one value per dimension.

    Example:
    ```python
    nj.connect.grid_positions((2, 3)).tolist()
    # [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]] (as floats)
    ```
    """
    owner = "grid_positions"
    if not isinstance(shape, (tuple, list)) or len(shape) == 0:
        raise TypeError(f"{owner}: shape must be a non-empty tuple of positive ints, got {shape!r}")
    dims = [check_size(owner, f"shape[{i}]", s) for i, s in enumerate(shape)]
    if math.prod(dims) > MAX_SIZE:
        raise ValueError(f"{owner}: the lattice has {math.prod(dims)} sites, more than 2**30")
    step = check_box(owner, "spacing", spacing, len(dims))
    coords = np.indices(dims).reshape(len(dims), -1).T
    return jnp.asarray(coords * step, default_float())


# The name SPEC.md gives the lattice position helper; the same function.
lattice = grid_positions


def random_positions(key: PRNGKeyArray, n: int, extent: Sequence[float]) -> Float[Array, "n d"]:
    """`n` positions drawn uniformly in the box `[0, extent[0]) x ... x [0, extent[d-1])`.

    Example:
    ```python
    pos = nj.connect.random_positions(jax.random.key(0), 1000, (10.0, 10.0))   # (1000, 2)
    ```
    """
    owner = "random_positions"
    key = check_key(owner, key, eager=True)
    n = check_size(owner, "n", n)
    if isinstance(extent, (int, float, np.number)) or np.ndim(extent) != 1:
        raise TypeError(
            f"{owner}: extent must be a sequence of box lengths, one per dimension (e.g. (10.0,"
            f" 10.0)), got {extent!r}"
        )
    box = check_box(owner, "extent", extent, len(extent))
    u = jr.uniform(key, (n, box.size), default_float())
    return u * jnp.asarray(box, default_float())


class _Radial(eqx.Module):
    """Connection probability as a function of squared distance (internal predicate)."""

    p: Float[Array, ""]
    r2: Float[Array, ""]  # squared radius (ball) or squared cutoff (gaussian), inf if none
    inv_two_s2: Float[Array, ""]  # 1 / (2 sigma^2); 0 for the ball
    box: Float[Array, " d"] | None
    gaussian: bool = eqx.field(static=True)

    def __call__(self, xi, xj, key):
        delta = xi - xj
        if self.box is not None:
            delta = delta - self.box * jnp.round(delta / self.box)
        d2 = jnp.sum(delta * delta, axis=-1)
        prob = jnp.where(d2 <= self.r2, self.p, jnp.zeros((), d2.dtype))
        if self.gaussian:
            prob = prob * jnp.exp(-d2 * self.inv_two_s2)
        # Draws stay float32 with or without x64, so the same key gives the same synapses.
        return jr.uniform(key, d2.shape, jnp.float32) < prob.astype(jnp.float32)


def _radial(p, r2, inv_two_s2, box, gaussian) -> _Radial:
    f = default_float()
    return _Radial(
        jnp.asarray(p, f),
        jnp.asarray(r2, f),
        jnp.asarray(inv_two_s2, f),
        None if box is None else jnp.asarray(box, f),
        gaussian,
    )


@eqx.filter_jit
def _tile_kernel(fn, key, t, i0, j0, pos_pre, pos_post, n_pre, n_post, bi, bj, allow_self):
    xi = lax.dynamic_slice_in_dim(pos_pre, i0, bi)
    xj = lax.dynamic_slice_in_dim(pos_post, j0, bj)
    mask = jnp.broadcast_to(fn(xi[:, None, :], xj[None, :, :], jr.fold_in(key, t)), (bi, bj))
    rows = i0 + jnp.arange(bi, dtype=jnp.int32)
    cols = j0 + jnp.arange(bj, dtype=jnp.int32)
    mask = mask & (rows < n_pre)[:, None] & (cols < n_post)[None, :]
    if not allow_self:
        mask = mask & (rows[:, None] != cols[None, :])
    return mask


def _check_fn_output(owner: str, fn: Callable, key, bi: int, bj: int, d: int, dtype) -> None:
    xi = jax.ShapeDtypeStruct((bi, 1, d), dtype)
    xj = jax.ShapeDtypeStruct((1, bj, d), dtype)
    out = jax.eval_shape(fn, xi, xj, key)
    shape, out_dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    ok_shape = shape is not None
    if ok_shape:
        try:
            ok_shape = jnp.broadcast_shapes(shape, (bi, bj)) == (bi, bj)
        except ValueError:
            ok_shape = False
    if not ok_shape or out_dtype != jnp.bool_:
        got = repr(out) if shape is None else f"dtype {out_dtype} and shape {tuple(shape)}"
        raise TypeError(
            f"{owner}: fn must return a boolean array broadcastable to ({bi}, {bj}) when called"
            f" with pos_i of shape ({bi}, 1, {d}) and pos_j of shape (1, {bj}, {d}), got {got}"
        )


def _tile_pairs(
    owner: str,
    key: jax.Array,
    pos_pre: jax.Array,
    pos_post: jax.Array,
    fn: Callable,
    block_size: int,
    allow_self: bool,
    check_output: bool,
) -> np.ndarray:
    n_pre, n_post = pos_pre.shape[0], pos_post.shape[0]
    bi, bj = min(block_size, n_pre), min(block_size, n_post)
    ti, tj = -(-n_pre // bi), -(-n_post // bj)
    d = pos_pre.shape[1]
    if check_output:
        _check_fn_output(owner, fn, key, bi, bj, d, pos_pre.dtype)
    pad_pre = jnp.concatenate([pos_pre, jnp.zeros((ti * bi - n_pre, d), pos_pre.dtype)])
    pad_post = jnp.concatenate([pos_post, jnp.zeros((tj * bj - n_post, d), pos_post.dtype)])

    def launch(t):
        a, b = divmod(t, tj)
        i0, j0 = jnp.int32(a * bi), jnp.int32(b * bj)
        return (a * bi, b * bj), _tile_kernel(
            fn, key, jnp.int32(t), i0, j0, pad_pre, pad_post, n_pre, n_post, bi, bj, allow_self
        )

    pres, posts = [], []
    pending = launch(0)
    for t in range(ti * tj):
        # Dispatch the next tile before reading this one so that device work and host
        # compaction overlap.
        nxt = launch(t + 1) if t + 1 < ti * tj else None
        (r0, c0), mask = pending
        r, c = np.nonzero(np.asarray(mask))
        pres.append((r + r0).astype(np.int32))
        posts.append((c + c0).astype(np.int32))
        pending = nxt
    return sort_pairs(np.concatenate(pres), np.concatenate(posts), n_post)


@eqx.filter_jit
def _pair_kernel(fn, key, pos_pre, pos_post, pre_idx, post_idx, n_valid, allow_self):
    keep = fn(pos_pre[pre_idx], pos_post[post_idx], key)
    keep = keep & (jnp.arange(pre_idx.shape[0], dtype=jnp.int32) < n_valid)
    if not allow_self:
        keep = keep & (pre_idx != post_idx)
    return keep


def _cells(pos: np.ndarray, origin: np.ndarray, size: np.ndarray, n_c: np.ndarray, box):
    x = pos - origin if box is None else np.mod(pos, box)
    return np.clip(np.floor(x / size).astype(np.int64), 0, n_c - 1)


def _cell_pairs(
    key: jax.Array,
    pos_pre: jax.Array,
    pos_post: jax.Array,
    radius: float,
    box: np.ndarray | None,
    fn: _Radial,
    allow_self: bool,
) -> np.ndarray:
    """Pairs accepted by `fn` among those closer than `radius`, by cell lists."""
    xp, xq = np.asarray(pos_pre, np.float64), np.asarray(pos_post, np.float64)
    d = xp.shape[1]
    if box is None:
        origin = np.minimum(xp.min(0), xq.min(0))
        extent = np.maximum(xp.max(0), xq.max(0)) - origin
        size = np.maximum(radius, extent / _MAX_CELLS_PER_AXIS)
        n_c = np.floor(extent / size).astype(np.int64) + 1
    else:
        origin = np.zeros(d)
        n_c = np.clip(np.floor(box / radius).astype(np.int64), 1, _MAX_CELLS_PER_AXIS)
        size = box / n_c
    stride = np.ones(d, np.int64)
    for a in range(d - 2, -1, -1):
        stride[a] = stride[a + 1] * n_c[a + 1]
    cq = _cells(xq, origin, size, n_c, box) @ stride
    order = np.argsort(cq, kind="stable").astype(np.int32)
    uniq, first, count = np.unique(cq[order], return_index=True, return_counts=True)

    # Neighbour cells along each axis: relative offsets -1, 0, 1, except on a periodic axis
    # with fewer than 3 cells, where every cell is a neighbour (listing each once).
    axes = []
    for a in range(d):
        if box is not None and n_c[a] <= 2:
            axes.append([("abs", v) for v in range(int(n_c[a]))])
        else:
            axes.append([("rel", v) for v in (-1, 0, 1)])
    combos = np.array(np.meshgrid(*[range(len(ax)) for ax in axes], indexing="ij")).reshape(d, -1).T

    n_pre = xp.shape[0]
    pres, posts = [], []
    call = 0
    for c0 in range(0, n_pre, _PRE_CHUNK):
        cp = _cells(xp[c0 : c0 + _PRE_CHUNK], origin, size, n_c, box)
        lin = np.zeros((cp.shape[0], combos.shape[0]), np.int64)
        valid = np.ones(lin.shape, bool)
        for a in range(d):
            kinds = [axes[a][i] for i in combos[:, a]]
            rel = np.array([v if k == "rel" else 0 for k, v in kinds])
            absolute = np.array([k == "abs" for k, _ in kinds])
            coord = np.where(absolute, np.array([v for _, v in kinds]), cp[:, a : a + 1] + rel)
            if box is None:
                valid &= (coord >= 0) & (coord < n_c[a])
            else:
                coord = np.mod(coord, n_c[a])
            lin += coord * stride[a]
        loc = np.minimum(np.searchsorted(uniq, lin), max(uniq.size - 1, 0))
        found = valid & (uniq[loc] == lin)
        n_cand = np.where(found, count[loc], 0)
        s_cand = np.where(found, first[loc], 0)
        totals = n_cand.sum(axis=1)
        cum = np.cumsum(totals)
        i, base = 0, 0
        while i < cp.shape[0]:
            j = max(i + 1, int(np.searchsorted(cum, base + _PAIRS_PER_CALL, side="right")))
            nc, sc = n_cand[i:j].ravel(), s_cand[i:j].ravel()
            total = int(nc.sum())
            base = int(cum[j - 1])
            if total:
                seg = np.cumsum(nc) - nc
                cand_post = order[np.repeat(sc - seg, nc) + np.arange(total)]
                cand_pre = np.repeat(np.arange(c0 + i, c0 + j, dtype=np.int32), totals[i:j])
                padded = max(1024, 1 << (total - 1).bit_length())
                pre_idx = np.zeros(padded, np.int32)
                post_idx = np.zeros(padded, np.int32)
                pre_idx[:total], post_idx[:total] = cand_pre, cand_post
                keep = _pair_kernel(
                    fn,
                    jr.fold_in(key, call),
                    pos_pre,
                    pos_post,
                    jnp.asarray(pre_idx),
                    jnp.asarray(post_idx),
                    jnp.int32(total),
                    allow_self,
                )
                keep = np.asarray(keep)[:total]
                pres.append(cand_pre[keep])
                posts.append(cand_post[keep])
            call += 1
            i = j
    if not pres:
        return np.empty((0, 2), np.int32)
    n_post = xq.shape[0]
    return sort_pairs(np.concatenate(pres), np.concatenate(posts), n_post)


def _check_common(owner, key, pos_pre, pos_post, allow_self, max_per_post):
    key = check_key(owner, key, eager=True)
    pos_pre = check_positions(owner, "pos_pre", pos_pre)
    pos_post = check_positions(owner, "pos_post", pos_post)
    if pos_pre.shape[1] != pos_post.shape[1]:
        raise ValueError(
            f"{owner}: pos_pre and pos_post must have the same number of dimensions d, got"
            f" {pos_pre.shape[1]} and {pos_post.shape[1]}"
        )
    allow_self = check_flag(owner, "allow_self", allow_self)
    if not allow_self:
        check_same_population(owner, pos_pre.shape[0], pos_post.shape[0])
    if max_per_post is not None:
        max_per_post = check_count(owner, "max_per_post", max_per_post)
        if max_per_post == 0:
            raise ValueError(f"{owner}: max_per_post must be a positive int or None, got 0")
    return key, pos_pre, pos_post, allow_self, max_per_post


def _finish(owner, indices, key, shape, weight, max_per_post):
    k_cap, k_weight = jr.split(key)
    if max_per_post is not None:
        indices = cap_in_degree(k_cap, indices, shape[1], max_per_post)
    data = resolve_weights(owner, weight, k_weight, indices[:, 0], indices[:, 1])
    return make_bcoo(indices, data, shape, True)


def from_predicate(
    key: PRNGKeyArray,
    pos_pre: Float[Array, "n_pre d"],
    pos_post: Float[Array, "n_post d"],
    fn: Callable[..., Bool[Array, "..."]],
    weight: Any = 1.0,
    max_per_post: int | None = None,
    block_size: int = 1024,
    allow_self: bool = True,
) -> sparse.BCOO:
    r"""Connect every pair `(i, j)` for which a user predicate on positions is true.

    `fn(pos_i, pos_j, key)` is vectorised by broadcasting: it is called, under `jit`, with
    `pos_i` of shape `(b_pre, 1, d)` and `pos_j` of shape `(1, b_post, d)` (a tile of
    presynaptic and postsynaptic positions) and a PRNG key, and must return a boolean array
    broadcastable to `(b_pre, b_post)`. Randomness inside `fn` must come from its `key`; each
    tile gets its own key `fold_in(key, tile_index)`, so the result depends only on `key`, the
    positions, `fn` and `block_size` (not on the device or on earlier calls). Size random draws
    by the broadcast shape, e.g. `jr.uniform(key, (pos_i - pos_j).shape[:-1])`.

    Memory stays O(synapses + block_size^2): tiles of `block_size x block_size` pairs are
    evaluated one at a time and only their accepted pairs are kept. Time is
    O(n_pre n_post); for radius-limited rules `distance_connect` is O(synapses).

    `max_per_post` caps the in-degree: a post neuron with more accepted sources keeps a
    uniformly random subset of `max_per_post` of them (every subset of that size equally
    likely, independently across post neurons); neurons at or below the cap keep all theirs.
    The cap is applied after all pairs are found, so memory is O(synapses before the cap).

    Args:
        key: a JAX PRNG key.
        pos_pre: presynaptic positions, shape `(n_pre, d)`.
        pos_post: postsynaptic positions, shape `(n_post, d)`.
        fn: the predicate `(pos_i, pos_j, key) -> bool array`.
        weight: scalar, per-synapse array, callable `(pre, post) -> w` or distribution
            (row-major order).
        max_per_post: None or a positive int, the largest in-degree kept.
        block_size: tile edge (pairs per tile = block_size^2), a positive int.
        allow_self: if False, pairs `i == j` are never connected (one population).

    Example:
    ```python
    pos = nj.connect.grid_positions((20, 20))
    near = lambda a, b, key: jnp.sum((a - b) ** 2, axis=-1) <= 2.0   # 8 neighbours + self
    conn = nj.connect.from_predicate(jax.random.key(0), pos, pos, near, allow_self=False)
    ```
    """
    owner = "from_predicate"
    key, pos_pre, pos_post, allow_self, max_per_post = _check_common(
        owner, key, pos_pre, pos_post, allow_self, max_per_post
    )
    if not callable(fn):
        raise TypeError(f"{owner}: fn must be callable as fn(pos_i, pos_j, key), got {fn!r}")
    block_size = check_size(owner, "block_size", block_size)
    k_struct, k_rest = jr.split(key)
    indices = _tile_pairs(owner, k_struct, pos_pre, pos_post, fn, block_size, allow_self, True)
    return _finish(
        owner, indices, k_rest, (pos_pre.shape[0], pos_post.shape[0]), weight, max_per_post
    )


def distance_connect(
    key: PRNGKeyArray,
    pos_pre: Float[Array, "n_pre d"],
    pos_post: Float[Array, "n_post d"],
    radius: float,
    p: float = 1.0,
    weight: Any = 1.0,
    periodic: Any = None,
    allow_self: bool = True,
    max_per_post: int | None = None,
) -> sparse.BCOO:
    r"""Connect pairs closer than `radius`, each independently with probability `p`.

    A pair is a candidate when $\lVert x_i - x_j \rVert \le$ `radius` (squared distances
    compared, so lattice neighbours at exactly the radius are included); each candidate is
    kept with probability `p`. With `periodic` (box lengths), distances follow the
    minimum-image convention. For d <= 3 the candidates are found with cell lists (cells at
    least one radius wide), so time and memory are O(synapses); higher dimensions fall back to
    tiles over all pairs.

    Args:
        key: a JAX PRNG key.
        pos_pre: presynaptic positions, shape `(n_pre, d)`.
        pos_post: postsynaptic positions, shape `(n_post, d)`.
        radius: connection radius, > 0 (same unit as the positions).
        p: connection probability within the radius, in [0, 1].
        weight: scalar, per-synapse array, callable `(pre, post) -> w` or distribution
            (row-major order). A distance-dependent weight is a callable that looks up the
            positions of `pre` and `post`.
        periodic: None, or the box lengths (a scalar or one per dimension) of a periodic box.
        allow_self: if False, no neuron connects to itself (one population).
        max_per_post: None or a positive int capping the in-degree (see `from_predicate`).

    Example:
    ```python
    pos = nj.connect.grid_positions((50, 50))
    # 4 nearest neighbours on a torus
    conn = nj.connect.distance_connect(jax.random.key(0), pos, pos, 1.0,
                                       periodic=(50.0, 50.0), allow_self=False)
    ```
    """
    owner = "distance_connect"
    key, pos_pre, pos_post, allow_self, max_per_post = _check_common(
        owner, key, pos_pre, pos_post, allow_self, max_per_post
    )
    radius = check_positive_real(owner, "radius", radius)
    p = check_probability(owner, "p", p)
    box = check_box(owner, "periodic", periodic, pos_pre.shape[1])
    fn = _radial(p, radius * radius, 0.0, box, gaussian=False)
    k_struct, k_rest = jr.split(key)
    if pos_pre.shape[1] <= 3:
        indices = _cell_pairs(k_struct, pos_pre, pos_post, radius, box, fn, allow_self)
    else:
        indices = _tile_pairs(owner, k_struct, pos_pre, pos_post, fn, 1024, allow_self, False)
    return _finish(
        owner, indices, k_rest, (pos_pre.shape[0], pos_post.shape[0]), weight, max_per_post
    )


def gaussian_connect(
    key: PRNGKeyArray,
    pos_pre: Float[Array, "n_pre d"],
    pos_post: Float[Array, "n_post d"],
    p_max: float,
    sigma: float,
    weight: Any = 1.0,
    periodic: Any = None,
    allow_self: bool = True,
    cutoff: float | None = None,
    max_per_post: int | None = None,
    block_size: int = 1024,
) -> sparse.BCOO:
    r"""Distance-dependent connectivity with a Gaussian profile.

    Each pair is connected independently with probability
    $p(d) = p_{max} \exp(-d^2 / 2\sigma^2)$, $d$ the (minimum-image, with `periodic`)
    distance. On a 2-D lattice of unit spacing the expected in-degree far from borders is
    close to $p_{max}\,2\pi\sigma^2$ (minus $p_{max}$ without autapses).

    With `cutoff=None` every pair is evaluated (tiles, O(n_pre n_post) time, exact). A
    `cutoff` radius restricts connections to $d \le$ `cutoff` and uses cell lists
    (O(synapses)); this changes the rule by the neglected tail mass, e.g. $e^{-c^2/2}$ of the
    probability for a cutoff of $c\sigma$ in 2-D, so the truncation is explicit, never
    implied.

    Args:
        key: a JAX PRNG key.
        pos_pre: presynaptic positions, shape `(n_pre, d)`.
        pos_post: postsynaptic positions, shape `(n_post, d)`.
        p_max: probability at distance 0, in [0, 1].
        sigma: width of the profile, > 0 (unit of the positions).
        weight: scalar, per-synapse array, callable `(pre, post) -> w` or distribution.
        periodic: None, or the box lengths of a periodic box.
        allow_self: if False, no neuron connects to itself (one population).
        cutoff: None (exact), or a radius > 0 beyond which pairs are never connected.
        max_per_post: None or a positive int capping the in-degree (see `from_predicate`).
        block_size: tile edge when `cutoff` is None.

    Example:
    ```python
    pos = nj.connect.grid_positions((64, 64))
    conn = nj.connect.gaussian_connect(jax.random.key(0), pos, pos, 0.5, 3.0,
                                       periodic=64.0, cutoff=18.0, allow_self=False)
    ```
    """
    owner = "gaussian_connect"
    key, pos_pre, pos_post, allow_self, max_per_post = _check_common(
        owner, key, pos_pre, pos_post, allow_self, max_per_post
    )
    p_max = check_probability(owner, "p_max", p_max)
    sigma = check_positive_real(owner, "sigma", sigma)
    if cutoff is not None:
        cutoff = check_positive_real(owner, "cutoff", cutoff)
    block_size = check_size(owner, "block_size", block_size)
    box = check_box(owner, "periodic", periodic, pos_pre.shape[1])
    r2 = math.inf if cutoff is None else cutoff * cutoff
    fn = _radial(p_max, r2, 1.0 / (2.0 * sigma * sigma), box, gaussian=True)
    k_struct, k_rest = jr.split(key)
    if cutoff is not None and pos_pre.shape[1] <= 3:
        indices = _cell_pairs(k_struct, pos_pre, pos_post, cutoff, box, fn, allow_self)
    else:
        indices = _tile_pairs(owner, k_struct, pos_pre, pos_post, fn, block_size, allow_self, False)
    return _finish(
        owner, indices, k_rest, (pos_pre.shape[0], pos_post.shape[0]), weight, max_per_post
    )
