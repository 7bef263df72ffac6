r"""Connectivity with a fixed total number of synapses between two populations.

The rule of NEST's `fixed_total_number` connection rule (Senk et al. 2022, "fixed total
number"): exactly `n` synapses are placed between `n_pre` presynaptic and `n_post`
postsynaptic neurons. With multapses (the default, as in NEST and in the Potjans and
Diesmann 2014 microcircuit) every synapse picks its presynaptic and its postsynaptic neuron
independently and uniformly, so the in-degrees follow
$\mathrm{Multinomial}(n; 1/n_{post}, \dots)$ (mean $n / n_{post}$, variance
$n (1/n_{post})(1 - 1/n_{post})$), the out-degrees likewise, and a pair receives
$\mathrm{Binomial}(n, 1/(n_{pre} n_{post}))$ synapses.
"""

from typing import Any

import jax.random as jr
import numpy as np
from jax.experimental import sparse
from jaxtyping import PRNGKeyArray

from ._builders import _finish
from ._checks import check_count, check_flag, check_key, check_same_population, check_size
from ._sampling import decode_keys

__all__ = ["fixed_total_number", "fixed_total_pairs", "fixed_total_csr"]


def _rng(key) -> np.random.Generator:
    """A NumPy generator seeded with the data of the JAX key `key`: a key fixes the draw, and
    no JAX program is compiled per array size (the sizes of the pathways of a network all
    differ)."""
    return np.random.default_rng(np.asarray(jr.key_data(key)).ravel())


def _distinct_keys(rng, n: int, n_pre: int, n_post: int, allow_self: bool) -> np.ndarray:
    """`n` distinct pair keys `pre * n_post + post` (sorted), a uniform n-subset of the
    candidate pairs: i.i.d. uniform pairs are drawn and the first `n` distinct ones kept (the
    duplicates of each round are redrawn), which is exactly uniform."""
    kept = np.empty(0, np.int64)
    while kept.size < n:
        need = n - kept.size
        pre = rng.integers(0, n_pre, need, dtype=np.int64)
        post = rng.integers(0, n_post - (not allow_self), need, dtype=np.int64)
        if not allow_self:
            post += post >= pre
        new = np.unique(pre * n_post + post)
        # a key drawn in this round that was kept before is a duplicate: only new ones count
        new = new[~np.isin(new, kept, assume_unique=True)]
        kept = np.union1d(kept, new)
    return kept


def fixed_total_pairs(
    key: PRNGKeyArray, n_pre: int, n_post: int, n: int, allow_self: bool, allow_multapses: bool
) -> np.ndarray:
    """The `(n, 2)` int32 indices (row-major) of `fixed_total_number`, arguments checked."""
    rng = _rng(key)
    if allow_multapses:
        pre, post = _draw_multapses(rng, n, n_pre, n_post, allow_self)
        return _sorted_pairs(pre, post, n_pre, n_post)
    return decode_keys(_distinct_keys(rng, n, n_pre, n_post, allow_self), n_post)


_CHUNK = 1 << 18  # synapses per block of the decoding of sorted keys


def _draw_multapses(rng, n: int, n_pre: int, n_post: int, allow_self: bool):
    """The i.i.d. uniform `pre` and `post` (int32) of `n` synapses with multapses, in the
    generator's order (all `pre`, then all `post`)."""
    pre = rng.integers(0, n_pre, n, dtype=np.int32)
    post = rng.integers(0, n_post - (not allow_self), n, dtype=np.int32)
    if not allow_self:
        post += post >= pre
    return pre, post


def _sorted_keys(pre: np.ndarray, post: np.ndarray, n_pre: int, n_post: int) -> np.ndarray:
    """The sorted keys `pre * n_post + post`: int32, computed in `pre`'s buffer (which is
    consumed), when every key fits (`n_pre * n_post < 2**31`; half the memory and about twice
    the speed of an int64 sort), int64 otherwise. The same order either way."""
    if n_pre * n_post < 2**31:
        keys = pre
        keys *= n_post
        keys += post
    else:
        keys = pre.astype(np.int64)
        keys *= n_post
        keys += post
    keys.sort()
    return keys


def _indptr(keys: np.ndarray, n_pre: int, n_post: int) -> np.ndarray:
    """The int64 row pointers of the sorted keys `pre * n_post + post`: row `r` starts at
    the first key >= `r * n_post` (a binary search per row; no pass over the synapses)."""
    indptr = np.empty(n_pre + 1, np.int64)
    starts = np.arange(n_pre, dtype=np.int64) * n_post
    indptr[:-1] = np.searchsorted(keys, starts.astype(keys.dtype), side="left")
    indptr[-1] = keys.shape[0]
    return indptr


def _block_rows(indptr: np.ndarray, s: int, e: int) -> np.ndarray:
    """The row (int32) of each entry `s <= i < e` of compressed rows `indptr`."""
    r0 = int(np.searchsorted(indptr, s, side="right")) - 1
    r1 = int(np.searchsorted(indptr, e, side="left"))
    lo = np.maximum(indptr[r0:r1], s)
    hi = np.minimum(indptr[r0 + 1 : r1 + 1], e)
    return np.repeat(np.arange(r0, r1, dtype=np.int32), hi - lo)


def _sorted_pairs(pre: np.ndarray, post: np.ndarray, n_pre: int, n_post: int) -> np.ndarray:
    """`sort_pairs(pre, post, n_post)`: the `(n, 2)` int32 pairs sorted row-major by one sort
    of the keys `pre * n_post + post` (see `_sorted_keys`; `pre` is consumed), decoded without
    a division: the rows come from the row counts (sorted keys hold each row's entries
    together), the columns as `key - row * n_post`, a cache-sized block at a time."""
    keys = _sorted_keys(pre, post, n_pre, n_post)
    del pre, post
    indptr = _indptr(keys, n_pre, n_post)
    out = np.empty((keys.shape[0], 2), np.int32)
    for s in range(0, keys.shape[0], _CHUNK):
        e = min(s + _CHUNK, keys.shape[0])
        rows = _block_rows(indptr, s, e)
        out[s:e, 0] = rows
        block = rows.astype(keys.dtype)
        block *= n_post
        np.subtract(keys[s:e], block, out=block)
        out[s:e, 1] = block
    return out


def aligned_empty(n: int, dtype) -> np.ndarray:
    """An uninitialised array of `n` values whose data start on a 64-byte boundary: JAX's CPU
    client then takes it over without a copy (`jax.device_put` aliases it), so a table built
    on the host is never held twice."""
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + n * dtype.itemsize].view(dtype)


def fixed_total_csr(
    key: PRNGKeyArray, n_pre: int, n_post: int, n: int, allow_self: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The synapses of `fixed_total_number` with multapses as compressed rows: `indptr`
    (int64, `n_pre + 1`) and the postsynaptic `indices` (int32, sorted within each row, in a
    64-byte aligned buffer, see `aligned_empty`). Exactly the synapses of
    `fixed_total_pairs(key, ..., allow_multapses=True)`, in 4 bytes per synapse in all when
    `n_pre * n_post < 2**31`: the presynaptic and postsynaptic draws (the same generator
    stream, a block at a time) are combined into the keys `pre * n_post + post` in one
    buffer, sorted in place and decoded in place. For trusted internal builders; the
    arguments are not checked."""
    rng = _rng(key)
    small = n_pre * n_post < 2**31
    keys = aligned_empty(n, np.int32 if small else np.int64)
    for s in range(0, n, _CHUNK):
        keys[s : s + _CHUNK] = rng.integers(0, n_pre, min(_CHUNK, n - s), dtype=np.int32)
    for s in range(0, n, _CHUNK):
        block = keys[s : s + _CHUNK]
        post = rng.integers(0, n_post - (not allow_self), block.shape[0], dtype=np.int32)
        if not allow_self:
            post += post >= block
        block *= n_post
        block += post
    keys.sort()
    indptr = _indptr(keys, n_pre, n_post)
    for s in range(0, n, _CHUNK):
        e = min(s + _CHUNK, n)
        rows = _block_rows(indptr, s, e)
        if small:
            rows *= np.int32(n_post)  # row * n_post <= key < 2**31
            keys[s:e] -= rows
        else:
            keys[s:e] -= rows.astype(np.int64) * n_post
    if small:
        return indptr, keys
    indices = aligned_empty(n, np.int32)
    indices[...] = keys
    return indptr, indices


def fixed_total_number(
    key: PRNGKeyArray,
    n_pre: int,
    n_post: int,
    n: int,
    weight: Any = 1.0,
    allow_self: bool = True,
    allow_multapses: bool = True,
) -> sparse.BCOO:
    r"""Exactly `n` synapses between random pairs of `n_pre` x `n_post` neurons.

    With `allow_multapses=True` (default, NEST's default for this rule) each of the `n`
    synapses draws its presynaptic neuron uniformly from `n_pre` and its postsynaptic neuron
    uniformly from `n_post` (from the `n_post - 1` others without autapses), independently:
    the in-degree of a neuron is $\mathrm{Binomial}(n, 1/n_{post})$ (jointly multinomial), the
    out-degree $\mathrm{Binomial}(n, 1/n_{pre})$, and a pair may carry several synapses
    (multapses, adjacent duplicate entries). Without multapses the synapses are a uniform
    random `n`-subset of the candidate pairs (i.i.d. draws, duplicates redrawn).

    The pairs are drawn by NumPy's generator seeded with the key's data (a key fixes the
    result) and sorted row-major with one key sort (int32 keys when `n_pre * n_post <
    2**31`); the result takes 12 bytes per synapse (int32 indices, float32 weights).

    Args:
        key: a JAX PRNG key.
        n_pre: number of presynaptic neurons (positive int).
        n_post: number of postsynaptic neurons (positive int).
        n: total number of synapses (non-negative int; at most the number of candidate pairs
            without multapses).
        weight: scalar, per-synapse array, callable `(pre, post) -> w` or distribution
            (row-major order, see `nj.connect`).
        allow_self: if False, no autapses (requires `n_pre == n_post`).
        allow_multapses: if False, no pair carries two synapses.

    Returns:
        BCOO `(n_pre, n_post)`, indices sorted row-major; duplicates (multapses) adjacent.

    Example:
    ```python
    conn = nj.connect.fixed_total_number(jax.random.key(0), 1000, 800, 50000)
    conn.nse                                  # 50000
    nj.connect.stats(conn)["mean_fan_in"]     # 62.5
    ```

    References:
        J. Senk et al. (2022), Connectivity concepts in neuronal network modeling, PLoS
        Comput Biol 18(9): e1010086. NEST's `fixed_total_number` rule.
    """
    owner = "fixed_total_number"
    key = check_key(owner, key, eager=True)
    n_pre = check_size(owner, "n_pre", n_pre)
    n_post = check_size(owner, "n_post", n_post)
    n = check_count(owner, "n", n)
    allow_self = check_flag(owner, "allow_self", allow_self)
    allow_multapses = check_flag(owner, "allow_multapses", allow_multapses)
    if not allow_self:
        check_same_population(owner, n_pre, n_post)
    candidates = n_pre * (n_post - (0 if allow_self else 1))
    if n > 0 and candidates == 0:
        raise ValueError(
            f"{owner}: n must be 0 when there is no candidate pair (n_pre = n_post = 1 and "
            f"allow_self=False), got {n}"
        )
    if not allow_multapses and n > candidates:
        raise ValueError(
            f"{owner}: n must be <= {candidates} (the candidate pairs) without multapses, got {n}"
        )
    if n >= 2**31:
        raise ValueError(f"{owner}: n must be < 2**31 (int32 synapse ids), got {n}")
    k_struct, k_weight = jr.split(key)
    indices = fixed_total_pairs(k_struct, n_pre, n_post, n, allow_self, allow_multapses)
    return _finish(owner, indices, (n_pre, n_post), weight, k_weight, unique=not allow_multapses)
