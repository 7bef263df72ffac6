r"""Procedural connectivity: synapses regenerated from a seed instead of stored.

A procedural description (`fixed_prob`, `fixed_total`, `distance`) keeps, per projection, a
PRNG key, one int32 per presynaptic neuron (its number of synapses, or of candidates for the
distance rule), the parameters of the weight and delay distributions and, for the distance
rule, the positions. Everything else is a function of `(key, presynaptic id)`: when neuron `i`
spikes, its row (targets, weights, delays) is drawn again from keys folded from the projection
key with `i` (`jax.random.fold_in`, counter-based), so memory grows with the number of neurons,
never with the number of synapses (GeNN's procedural connectivity, Knight and Nowotny 2021).
`nj.Projection(pre, post, description)` stores it in an `nj.network.ProceduralLayout`.

**Rows.** Row `i` has `counts[i]` entries, drawn once at construction with NumPy (seeded from
the key) and stored. The row's `j`-th entry (`j < counts[i]`) is:

- `fixed_prob`: `counts[i] ~ Binomial(m, p)` with `m = n_post` candidates (`n_post - 1`
  without autapses), and the targets are the images of `0, 1, ..., counts[i] - 1` under a
  keyed pseudo-random permutation of `[0, m)` (a Feistel network over a mixed-radix domain
  just above `m`, Black and Rogaway 2002, with cycle walking back into `[0, m)`). The targets
  of a row are therefore distinct: a Bernoulli(p) graph, each row a pseudo-random
  `counts[i]`-subset; out-degrees are exactly binomial, in-degrees binomial as far as the
  hash is random.
- `fixed_total`: `counts ~ Multinomial(n_synapses, uniform over the n_pre rows)` (stored, as
  GeNN's `FixedNumberTotalWithReplacement` does) and targets i.i.d. uniform over the
  candidates: the law of NEST's `fixed_total_number` with multapses (each synapse's source
  and target uniform and independent).
- `distance`: candidates as in `fixed_prob` with `p = p_max`, each kept with probability
  `profile(d) / p_max` (an exact thinning): pair `(i, j)` is connected with probability
  `p_max * exp(-d^2 / (2 sigma^2))` (`"gaussian"`) or `p_max * exp(-d / sigma)`
  (`"exponential"`), `d` the (optionally periodic) distance between the positions. The work
  per spike is the `n_post * p_max` candidates, not the kept synapses.

Weights are a scalar or an `nj.connect` distribution (`normal`, `lognormal`, `uniform`),
sampled per row; gradients with respect to the distribution's parameters flow through the
sample (`w = mean + std * z` for a normal). Delays are a scalar on the projection, or a
distribution here, drawn per synapse **conditioned on** `delay_range` (NEST's redraw of
out-of-range values has the same law; nothing is clipped) and rounded to whole steps of `dt`.
Every draw inverts a CDF at a 24-bit uniform in `(0, 1)`, so a normal never reaches beyond
about 5.3 standard deviations: `max_delay_steps`, which sizes the network's ring buffer, is the
longest delay a draw can give (plus one step of margin), not the end of a wide `delay_range`
(for the microcircuit's 1.5 +- 0.75 ms in `[0.05, 31.5]` ms: 56 steps, not 315).

**Order.** `to_bcoo()` lists the synapses by presynaptic neuron and, within a row, in the
order `j` of generation: the order in which the network delivers them, so a stored network
built from `to_bcoo()` (`stored()`) delivers exactly the same values.

References:
    J. C. Knight and T. Nowotny (2021), Larger GPU-accelerated brain simulations with
    procedural connectivity, Nature Computational Science 1: 136-142.
    J. Black and P. Rogaway (2002), Ciphers with arbitrary finite domains, CT-RSA 2002,
    LNCS 2271: 114-130.
"""

import functools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax
from jax.experimental import sparse
from jax.scipy.special import ndtr, ndtri
from jaxtyping import Array, Float, Int

from .._validation import as_float, default_float
from ._checks import (
    check_box,
    check_flag,
    check_key,
    check_positions,
    check_positive_real,
    check_probability,
    check_same_population,
    check_size,
)
from ._threefry import _PARITY, _ROTATIONS
from ._weights import Distribution, LogNormal, Normal, Uniform

__all__ = ["Procedural", "fixed_prob", "fixed_total", "distance", "delay_steps_f32"]

_RULES = ("fixed_prob", "fixed_total", "distance")
_PROFILES = ("gaussian", "exponential")
# Rows generated per block on the host (to_bcoo) and per scan step of the dense equivalent:
# about this many synapses at a time.
_BLOCK_SYNAPSES = 1 << 18


def delay_steps_f32(d: jax.Array, dt: float) -> jax.Array:
    """Delays [ms] to whole steps (int32), half-way cases up: the rule of
    `neurojax.network._projection.delay_steps`, evaluated in the delay's dtype."""
    ratio = d / dt
    return jnp.floor(ratio + 0.5 + 1e-6 * jnp.maximum(ratio, 1.0)).astype(jnp.int32)


def _mix(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser (a bijection of uint32 with full avalanche)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


_ROUNDS = 4


def permute(j: jax.Array, m: int, key: jax.Array) -> jax.Array:
    """The image of `j` (int, `0 <= j < m`) under the permutation of `[0, m)` keyed by `key`
    (uint32, broadcast against `j`); distinct `j` give distinct images.

    A four-round Feistel network over the mixed-radix domain `Z_a x Z_b` (`a = ceil(sqrt
    m)`, `b = ceil(m / a)`, so `a b - m < a`), its rounds alternating the two radices (Black
    and Rogaway 2002, "Ciphers with arbitrary finite domains"), with MurmurHash3's finaliser
    as round function; images beyond `m` are walked through the permutation again until they
    land in `[0, m)` (cycle walking, less than one step in `sqrt(m)` on average)."""
    a = max(1, math.isqrt(m - 1) + 1) if m > 1 else 1
    b = max(1, -(-m // a))
    round_keys = [
        _mix(key + jnp.uint32((0x9E3779B9 * (r + 1)) & 0xFFFFFFFF)) for r in range(_ROUNDS)
    ]

    def feistel(x):
        left, right = x // jnp.uint32(b), x % jnp.uint32(b)
        radix = (a, b)
        for r in range(_ROUNDS):
            p = radix[r % 2]  # the radix of `left` in this round
            f = _mix(right ^ round_keys[r]) % jnp.uint32(p)
            left, right = right, (left + f) % jnp.uint32(p)
        return left * jnp.uint32(b) + right

    x = feistel(j.astype(jnp.uint32))
    if a * b > m:
        x = lax.while_loop(lambda x: jnp.any(x >= m), lambda x: jnp.where(x >= m, feistel(x), x), x)
    return x.astype(jnp.int32)


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 (20 rounds) of the counters `(x0, x1)` under the keys `(k0, k1)`, all
    uint32 arrays broadcast together, written out round by round: XLA fuses the whole hash
    with what consumes its words (`jax.random` lowers it as a loop on the CPU, whose every
    iteration writes its arrays to memory). The values are `jax.random`'s (tested); the
    host's NumPy version, with the same constants, is `_threefry.threefry2x32`."""
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(_PARITY))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = (x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))
            x1 = x1 ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + ks[(group + 2) % 3] + jnp.uint32(group + 1)
    return x0, x1


def threefry_rows() -> bool:
    """Whether the row words are the fused threefry of `_row_bits` (JAX's default threefry
    key in partitionable mode), the hash that the C++ delivery kernel reproduces."""
    return bool(jax.config.jax_threefry_partitionable) and str(
        jax.config.jax_default_prng_impl
    ) in ("threefry2x32", "threefry")


def _row_bits(key_data: jax.Array, ids: jax.Array, size: int) -> jax.Array:
    """`jax.random.bits(jax.random.fold_in(key, i), (size,), uint32)` for each row id `i` of
    `ids`: uint32 `(len(ids), size)`. With the default threefry key in JAX's partitionable
    mode, `bits` hashes the counters `(0, j)` under the row's key and keeps the XOR of the
    two output words: that hash is computed here (`_threefry2x32`), fused with the draws.
    The row keys themselves come from `jax.random.fold_in`, whose loop leaves them in memory:
    fused into the words, XLA would hash each row's key again for every word (measured: the
    procedural microcircuit's loop 2.3x slower). Any other key implementation or mode goes
    through `jax.random` entirely."""
    key = jr.wrap_key_data(key_data)
    if threefry_rows():
        rows = jax.vmap(lambda i: jr.key_data(jr.fold_in(key, i)))(ids)
        j = jnp.arange(size, dtype=jnp.uint32)[None, :]
        y0, y1 = _threefry2x32(rows[:, :1], rows[:, 1:], jnp.zeros_like(j), j)
        return y0 ^ y1
    return jax.vmap(lambda i: jr.bits(jr.fold_in(key, i), (size,), jnp.uint32))(ids)


def _uniform(bits: jax.Array) -> jax.Array:
    """Uniform values in the open interval (0, 1) from uint32 words (24-bit resolution).

    In float32, `k + 0.5` rounds to an even integer for `k >= 2^23`: the top word
    (`k = 2^24 - 1`) would give exactly 1, where a normal's quantile is infinite (an infinite
    weight, or a delay at the far end of `delay_range`, once in 2^24 draws); it is mapped onto
    the largest float below 1 instead (`1 - 2^-24`, the float nearest its exact value)."""
    u = ((bits >> 8).astype(default_float()) + 0.5) * (1.0 / (1 << 24))
    return jnp.minimum(u, jnp.asarray(1.0 - 2.0**-24, u.dtype))


def _probit(u: jax.Array) -> jax.Array:
    """The standard normal quantile at `u`, as `sqrt(2) erfinv(2u - 1)` (the transform of
    `jax.random.normal`; cheaper than `ndtri`'s three-branch rational approximation)."""
    return jnp.sqrt(2.0).astype(u.dtype) * lax.erf_inv(2.0 * u - 1.0)


def _draw(dist: Distribution, u: jax.Array) -> jax.Array:
    """Weights of `dist` by inverting its CDF at the uniforms `u` (differentiable in the
    distribution's parameters). Normal tails beyond ~5.3 standard deviations are out of reach
    of 24-bit uniforms (probability 1e-7)."""
    if isinstance(dist, Uniform):
        low = jnp.maximum(dist.low, 0.0) if dist.nonnegative else dist.low
        return low + u * (dist.high - low)
    if isinstance(dist, LogNormal):
        return jnp.exp(dist.mean + dist.sigma * _probit(u))
    if isinstance(dist, Normal):
        if not dist.nonnegative:
            return dist.mean + dist.std * _probit(u)
        safe = jnp.where(dist.std > 0, dist.std, 1.0)
        b = jnp.where(dist.std > 0, dist.mean / safe, jnp.inf)
        w = dist.mean - dist.std * ndtri(u * ndtr(b))
        return jnp.maximum(w, 0.0)  # a rounding residue below 0, never a genuine draw
    raise TypeError(
        f"procedural: weight distributions are normal, lognormal and uniform, got "
        f"{type(dist).__name__}"
    )


def _truncated(dist: Distribution, u: jax.Array, low: float, high: float) -> jax.Array:
    """`dist` conditioned on `[low, high]`, by inverting the truncated CDF at `u`."""
    dtype = default_float()
    if isinstance(dist, Uniform):
        a = jnp.maximum(dist.low, low)
        b = jnp.minimum(dist.high, high)
        x = a + u * (b - a)
    else:
        mean = dist.mean
        std = dist.std if isinstance(dist, Normal) else dist.sigma
        lo, hi = (low, high) if isinstance(dist, Normal) else (math.log(low), math.log(high))
        a, b = ndtr((lo - mean) / std), ndtr((hi - mean) / std)
        x = mean + std * ndtri(a + u * (b - a))
        if isinstance(dist, LogNormal):
            x = jnp.exp(x)
    # The inverse CDF lands in [low, high] up to rounding; a residue of a few ulps outside it
    # (never a genuine draw) is mapped onto the bound.
    return jnp.clip(x, low, high).astype(dtype)


class Procedural(eqx.Module):
    r"""A procedural connectivity description: what `nj.Projection` needs to regenerate the
    synapses of any presynaptic neuron (see the module docstring for the rules).

    Build one with `nj.connect.procedural.fixed_prob`, `fixed_total` or `distance`, never
    directly. Memory: `4 n_pre` bytes of row counts, the key, the distribution parameters and,
    for `distance`, the positions (`nbytes()`).

    Attributes:
        rule: `"fixed_prob"`, `"fixed_total"` or `"distance"`.
        n_pre, n_post: the shape `(n_pre, n_post)`.
        n_synapses: the number of synapses (exact: the sum of the rows).
        max_fan_out: the longest row (entries generated per spike, candidates for
            `distance`).
        counts: entries per row, int32 `(n_pre,)`.
        weight: a scalar array or an `nj.connect` distribution.
        delay: None (the projection's scalar delay applies) or a distribution of delays [ms]
            conditioned on `[delay_low, delay_high]`, rounded to steps of `dt` [ms].
        max_delay_steps: the longest delay in steps (0 without a delay distribution).
    """

    rule: str = eqx.field(static=True)
    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    n_synapses: int = eqx.field(static=True)
    max_fan_out: int = eqx.field(static=True)
    allow_self: bool = eqx.field(static=True)
    p: float = eqx.field(static=True)
    key_data: Int[Array, " 2"]
    counts: Int[Array, " n_pre"]
    weight: Any
    delay: Any = None
    delay_low: float = eqx.field(static=True, default=0.0)
    delay_high: float = eqx.field(static=True, default=0.0)
    dt: float | None = eqx.field(static=True, default=None)
    max_delay_steps: int = eqx.field(static=True, default=0)
    pos_pre: Float[Array, "n_pre d"] | None = None
    pos_post: Float[Array, "n_post d"] | None = None
    profile: str = eqx.field(static=True, default="")
    sigma: float = eqx.field(static=True, default=0.0)
    box: tuple[float, ...] | None = eqx.field(static=True, default=None)

    # ------------------------------------------------------------------ generation

    def rows(
        self, ids: Int[Array, " m"]
    ) -> tuple[Int[Array, "m k"], Float[Array, "m k"], Int[Array, "m k"] | None, Array]:
        """The rows of the presynaptic neurons `ids` (int32, each in `[0, n_pre)`), padded to
        `max_fan_out`: targets, weights, delays in steps (None without a delay
        distribution) and which entries are synapses.

        One threefry call per row (`jax.random.bits` of the key folded with the row's id)
        gives every random word of the row: the permutation key, and per entry the words of
        its target (`fixed_total`), weight, delay and acceptance (`distance`)."""
        k = max(1, self.max_fan_out)
        ids = ids.astype(jnp.int32)
        n = ids.shape[0]
        parts = ["perm"] if self.rule != "fixed_total" else ["hi", "lo"]
        parts += ["w"] if isinstance(self.weight, Distribution) else []
        parts += ["d"] if self.delay is not None else []
        parts += ["acc"] if self.rule == "distance" else []
        width = {"perm": 1}
        sizes = [width.get(name, k) for name in parts]
        bits = _row_bits(self.key_data, ids, sum(sizes))
        words, off = {}, 0
        for name, size in zip(parts, sizes, strict=True):
            words[name] = bits[:, off : off + size]
            off += size
        j = jnp.arange(k, dtype=jnp.int32)
        valid = j[None, :] < self.counts[ids][:, None]
        m = max(1, self.n_post - (0 if self.allow_self else 1))
        if self.rule == "fixed_total":
            # Two words per target, reduced as jax.random.randint does.
            span = jnp.uint32(m)
            mult = (jnp.uint32(2**16) % span) * (jnp.uint32(2**16) % span) % span
            post = ((words["hi"] % span) * mult + words["lo"] % span) % span
            post = post.astype(jnp.int32)
        else:
            post = permute(jnp.broadcast_to(j, (n, k)), m, words["perm"])
        if not self.allow_self:
            post = post + (post >= ids[:, None]).astype(jnp.int32)
        if self.rule == "distance":
            valid = valid & (_uniform(words["acc"]) < self._kept(ids, post))
        if isinstance(self.weight, Distribution):
            w = _draw(self.weight, _uniform(words["w"]))
        else:
            w = jnp.broadcast_to(self.weight, (n, k))
        steps = None
        if self.delay is not None:
            d = _truncated(self.delay, _uniform(words["d"]), self.delay_low, self.delay_high)
            # (the clip is the identity for the description as built, see _reachable_steps;
            # it keeps a ring slot from wrapping if the delay parameters are later changed)
            steps = jnp.minimum(delay_steps_f32(d, self.dt), self.max_delay_steps)
        return post, w.astype(default_float()), steps, valid

    def _kept(self, ids, post):
        """Probability `profile(d) / p_max` of keeping candidate `post` of row `ids`."""
        diff = self.pos_pre[ids][:, None, :] - self.pos_post[post]
        if self.box is not None:
            box = jnp.asarray(self.box, diff.dtype)
            diff = diff - box * jnp.round(diff / box)
        d2 = jnp.sum(diff * diff, axis=-1)
        if self.profile == "gaussian":
            return jnp.exp(-d2 / (2.0 * self.sigma**2))
        return jnp.exp(-jnp.sqrt(d2) / self.sigma)

    def _block(self) -> int:
        return max(1, min(self.n_pre, _BLOCK_SYNAPSES // max(1, self.max_fan_out)))

    def _host_rows(self):
        """Yield `(ids, targets, weights, steps, valid)` as NumPy arrays, block by block."""
        block = self._block()
        fn = eqx.filter_jit(lambda c, ids: c.rows(ids))
        for start in range(0, self.n_pre, block):
            ids = np.minimum(np.arange(start, start + block), self.n_pre - 1).astype(np.int32)
            post, w, steps, valid = fn(self, jnp.asarray(ids))
            valid = np.asarray(valid) & (np.arange(start, start + block) < self.n_pre)[:, None]
            yield (
                ids,
                np.asarray(post),
                np.asarray(w),
                None if steps is None else np.asarray(steps),
                valid,
            )

    # ------------------------------------------------------------------ stored forms

    def _stored_arrays(self):
        pre, post, w, d = [], [], [], []
        for ids, p, ww, steps, valid in self._host_rows():
            pre.append(np.broadcast_to(ids[:, None], valid.shape)[valid])
            post.append(p[valid])
            w.append(ww[valid])
            if steps is not None:
                d.append(steps[valid])
        pre, post = np.concatenate(pre), np.concatenate(post)
        w = np.concatenate(w)
        d = np.concatenate(d) if d else None
        return pre, post, w, d

    def to_bcoo(self) -> sparse.BCOO:
        """The synapses as a BCOO `(n_pre, n_post)` whose data are the weights, by
        presynaptic neuron and, within a row, in the order of generation (the order of
        delivery). Regenerates every row: O(synapses) time and memory."""
        pre, post, w, _ = self._stored_arrays()
        idx = np.stack([pre, post], axis=1).astype(np.int32)
        return sparse.BCOO(
            (jnp.asarray(w), jnp.asarray(idx)),
            shape=(self.n_pre, self.n_post),
            indices_sorted=False,
            unique_indices=self.rule != "fixed_total",
        )

    def stored(self) -> tuple[sparse.BCOO, Any]:
        """`(conn, delay)` for a stored `nj.Projection` with exactly these synapses: `conn`
        from `to_bcoo()` and `delay` the per-synapse delays [ms] (whole steps of `dt`, in the
        same order), or None when the delay is the projection's scalar.

        Example: `nj.Projection("E", "E", conn, delay=d)` with `conn, d = desc.stored()`.
        """
        pre, post, w, d = self._stored_arrays()
        idx = np.stack([pre, post], axis=1).astype(np.int32)
        conn = sparse.BCOO((jnp.asarray(w), jnp.asarray(idx)), shape=(self.n_pre, self.n_post))
        return conn, None if d is None else d.astype(np.float64) * self.dt

    def nbytes(self) -> int:
        """Bytes of the arrays kept: counts, key, distribution parameters, positions."""
        return int(sum(x.nbytes for x in jax.tree.leaves(self) if hasattr(x, "nbytes")))

    @property
    def max_delay(self) -> float:
        """The longest delay [ms] the description draws (its step count times `dt`)."""
        return self.max_delay_steps * self.dt if self.delay is not None else 0.0


# ---------------------------------------------------------------------- builders


def _rng(owner: str, key) -> tuple[np.random.Generator, jax.Array]:
    key = check_key(owner, key, eager=True)
    data = jnp.asarray(jr.key_data(key), jnp.uint32).reshape(-1)
    if data.shape != (2,):
        raise ValueError(
            f"{owner}: key must be a threefry2x32 key (jax.random.key(seed)), got key data of "
            f"shape {data.shape}"
        )
    k_count = jr.key_data(jr.fold_in(jr.wrap_key_data(data), 2**31 - 1))  # rows: ids < 2**30
    return np.random.default_rng(np.asarray(k_count, np.uint32).tolist()), data


def _weight(owner: str, weight: Any) -> Any:
    if isinstance(weight, Distribution):
        return weight
    if callable(weight) or np.ndim(weight) != 0:
        raise TypeError(
            f"{owner}: weight must be a real scalar or an nj.connect distribution (normal, "
            f"lognormal, uniform): a procedural projection draws its weights, it cannot take "
            f"per-synapse arrays or callables; got {type(weight).__name__}"
        )
    try:
        w = as_float(weight)
    except TypeError as err:
        raise TypeError(f"{owner}: weight: {err}") from None
    if not bool(jnp.isfinite(w)):
        raise ValueError(f"{owner}: weight must be finite, got {float(w)!r}")
    return w


def _delay(owner: str, delay: Any, dt: Any, delay_range: Any) -> dict:
    if delay is None:
        if dt is not None or delay_range is not None:
            raise ValueError(
                f"{owner}: dt and delay_range describe a delay distribution; pass delay=... "
                "too, or give a scalar delay to nj.Projection instead"
            )
        return {}
    if not isinstance(delay, (Normal, LogNormal, Uniform)):
        raise TypeError(
            f"{owner}: delay must be None (the projection's scalar delay) or an nj.connect "
            f"distribution (normal, lognormal, uniform) of delays in ms, got {delay!r}"
        )
    if dt is None:
        raise ValueError(
            f"{owner}: a delay distribution needs dt= (ms), the network's step, to round the "
            "delays to whole steps"
        )
    dt = check_positive_real(owner, "dt", dt, "ms")
    if delay_range is None:
        if not isinstance(delay, Uniform):
            raise ValueError(
                f"{owner}: a {type(delay).__name__} delay is unbounded; pass delay_range=(low, "
                "high) in ms (the delays are drawn conditioned on it)"
            )
        delay_range = (float(delay.low), float(delay.high))
    if not (isinstance(delay_range, (tuple, list)) and len(delay_range) == 2):
        raise ValueError(
            f"{owner}: delay_range must be a pair (low, high) in ms, got {delay_range!r}"
        )
    low, high = (float(x) for x in delay_range)
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low < high):
        raise ValueError(
            f"{owner}: delay_range must satisfy 0 <= low < high (finite, ms), got {delay_range!r}"
        )
    if isinstance(delay, LogNormal) and low <= 0:
        raise ValueError(f"{owner}: a lognormal delay needs delay_range low > 0, got {low!r}")
    if isinstance(delay, Uniform) and not (float(delay.low) < high and float(delay.high) > low):
        raise ValueError(
            f"{owner}: the uniform delay [{float(delay.low)}, {float(delay.high)}) does not meet "
            f"delay_range {delay_range!r}"
        )
    top = int(delay_steps_f32(jnp.asarray(high, default_float()), dt))
    top = min(top, _reachable_steps(delay, low, high, dt))
    return dict(delay=delay, delay_low=low, delay_high=high, dt=dt, max_delay_steps=top)


_TOP_WORDS = 4096


def _reachable_steps(delay: Distribution, low: float, high: float, dt: float) -> int:
    """The longest delay in steps that a draw can give, plus one step of margin.

    A delay is the truncated inverse CDF at a 24-bit uniform (`_uniform`), whose largest
    value is `1 - 2^-25`: a normal delay never goes beyond ~5.3 standard deviations, however
    wide `delay_range` is. The ring buffer needs slots up to this delay only (the microcircuit's
    `delay_range` reaches 41 standard deviations: 316 slots where 57 are ever written). The
    inverse CDF rises with `u`; it is evaluated at the top `_TOP_WORDS` uniforms, compiled as
    `rows` compiles it, and one step is added in case a draw inside `rows` rounds one ulp
    higher onto the next step. Returns a huge number when the parameters are traced (the
    bound `high` then applies)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(delay)):
        return 2**31 - 1
    return int(_top_steps(delay, low=low, high=high, dt=dt)) + 1


@functools.partial(jax.jit, static_argnames=("low", "high", "dt"))
def _top_steps(delay: Distribution, *, low: float, high: float, dt: float) -> jax.Array:
    words = (jnp.uint32((1 << 24) - 1) - jnp.arange(_TOP_WORDS, dtype=jnp.uint32)) << 8
    return jnp.max(delay_steps_f32(_truncated(delay, _uniform(words), low, high), dt))


def _finish(
    owner,
    rule,
    n_pre,
    n_post,
    counts,
    key_data,
    weight,
    delay,
    dt,
    delay_range,
    allow_self,
    p,
    n_synapses=None,
    **extra,
) -> Procedural:
    counts = np.asarray(counts, np.int64)
    if counts.max(initial=0) >= 2**31:
        raise ValueError(f"{owner}: a row of more than 2**31 synapses is not supported")
    return Procedural(
        rule=rule,
        n_pre=n_pre,
        n_post=n_post,
        n_synapses=int(counts.sum()) if n_synapses is None else n_synapses,
        max_fan_out=int(counts.max(initial=0)),
        allow_self=allow_self,
        p=p,
        key_data=key_data,
        counts=jnp.asarray(counts.astype(np.int32)),
        weight=_weight(owner, weight),
        **_delay(owner, delay, dt, delay_range),
        **extra,
    )


def fixed_prob(
    key: Any,
    n_pre: int,
    n_post: int,
    p: float,
    *,
    weight: Any = 1.0,
    delay: Distribution | None = None,
    dt: float | None = None,
    delay_range: tuple[float, float] | None = None,
    allow_self: bool = True,
) -> Procedural:
    r"""Procedural pairwise-Bernoulli connectivity: each pair connected with probability `p`.

    Row `i` has $c_i \sim \mathrm{Binomial}(m, p)$ synapses ($m = n_{post}$, or
    $n_{post} - 1$ without autapses), drawn now and kept (4 bytes per presynaptic neuron);
    its targets are distinct, the images of $0 \ldots c_i - 1$ under a permutation of the
    candidates keyed by `(key, i)`, regenerated at every spike (module docstring).

    Args:
        key: a JAX PRNG key (threefry, `jax.random.key(seed)`).
        n_pre: number of presynaptic neurons.
        n_post: number of postsynaptic neurons.
        p: connection probability in [0, 1].
        weight: a real scalar or a distribution (`nj.connect.normal`, `lognormal`,
            `uniform`), the unit of the projection's `g`.
        delay: None (use `nj.Projection(..., delay=scalar)`) or a distribution of delays [ms].
        dt: the network's step [ms]; required with a delay distribution.
        delay_range: `(low, high)` [ms]: delays are drawn conditioned on it (required for
            normal and lognormal delays; a uniform's own bounds by default).
        allow_self: False excludes autapses (needs `n_pre == n_post`).

    Returns:
        A `Procedural` description for `nj.Projection`.

    Example:
    ```python
    desc = nj.connect.procedural.fixed_prob(jax.random.key(0), 4000, 4000, 0.02,
                                            weight=nj.connect.normal(0.6, 0.06))
    proj = nj.Projection("E", "E", desc)      # proj.method == "procedural"
    ```
    """
    owner = "procedural.fixed_prob"
    n_pre = check_size(owner, "n_pre", n_pre)
    n_post = check_size(owner, "n_post", n_post)
    p = check_probability(owner, "p", p)
    allow_self = check_flag(owner, "allow_self", allow_self)
    if not allow_self:
        check_same_population(owner, n_pre, n_post)
    rng, key_data = _rng(owner, key)
    m = n_post - (0 if allow_self else 1)
    counts = rng.binomial(m, p, size=n_pre)
    return _finish(
        owner,
        "fixed_prob",
        n_pre,
        n_post,
        counts,
        key_data,
        weight,
        delay,
        dt,
        delay_range,
        allow_self,
        p,
    )


def fixed_total(
    key: Any,
    n_pre: int,
    n_post: int,
    n_synapses: int,
    *,
    weight: Any = 1.0,
    delay: Distribution | None = None,
    dt: float | None = None,
    delay_range: tuple[float, float] | None = None,
    allow_self: bool = True,
) -> Procedural:
    r"""Procedural fixed total number of synapses, with multapses (NEST's
    `fixed_total_number`, the rule of the Potjans-Diesmann microcircuit).

    Each of the `n_synapses` synapses has a presynaptic neuron uniform over the `n_pre` and a
    postsynaptic neuron uniform over the candidates, independently: the rows' counts
    $\sim \mathrm{Multinomial}(n_{syn}, 1/n_{pre})$ are drawn now and kept (one int32 per
    presynaptic neuron, as GeNN does), the targets regenerated at each spike.

    Args: as `fixed_prob`, with `n_synapses` (a non-negative int) in place of `p`.

    Example:
    ```python
    desc = nj.connect.procedural.fixed_total(jax.random.key(0), 2000, 500, 40_000,
                                             weight=0.1)
    desc.n_synapses   # 40000
    ```
    """
    owner = "procedural.fixed_total"
    n_pre = check_size(owner, "n_pre", n_pre)
    n_post = check_size(owner, "n_post", n_post)
    if (
        isinstance(n_synapses, bool)
        or not isinstance(n_synapses, (int, np.integer))
        or (n_synapses < 0)
    ):
        raise ValueError(f"{owner}: n_synapses must be a non-negative int, got {n_synapses!r}")
    allow_self = check_flag(owner, "allow_self", allow_self)
    if not allow_self:
        check_same_population(owner, n_pre, n_post)
        if n_post == 1 and n_synapses > 0:
            raise ValueError(f"{owner}: without autapses a 1-neuron population has no candidate")
    rng, key_data = _rng(owner, key)
    counts = rng.multinomial(int(n_synapses), np.full(n_pre, 1.0 / n_pre))
    return _finish(
        owner,
        "fixed_total",
        n_pre,
        n_post,
        counts,
        key_data,
        weight,
        delay,
        dt,
        delay_range,
        allow_self,
        0.0,
        n_synapses=int(n_synapses),
    )


def distance(
    key: Any,
    pos_pre: Any,
    pos_post: Any,
    p_max: float,
    sigma: float,
    *,
    profile: str = "gaussian",
    box: Any = None,
    weight: Any = 1.0,
    delay: Distribution | None = None,
    dt: float | None = None,
    delay_range: tuple[float, float] | None = None,
    allow_self: bool = True,
) -> Procedural:
    r"""Procedural distance-dependent connectivity over positions.

    Pair `(i, j)` is connected independently with probability
    $p(d) = p_{max} e^{-d^2 / 2\sigma^2}$ (`profile="gaussian"`) or $p_{max} e^{-d/\sigma}$
    (`"exponential"`), with $d$ the Euclidean distance between `pos_pre[i]` and
    `pos_post[j]` (on a torus of side lengths `box` when given). Generated as Bernoulli
    candidates of probability `p_max` (as `fixed_prob`, counts kept) thinned with
    probability $p(d)/p_{max}$; the positions are kept (`4 d` bytes per neuron). The number
    of synapses is counted once here by regenerating every row.

    Args:
        key: a JAX PRNG key.
        pos_pre: presynaptic positions `(n_pre, d)` (any unit, that of `sigma`).
        pos_post: postsynaptic positions `(n_post, d)`.
        p_max: the probability at distance 0, in [0, 1].
        sigma: the length scale (> 0).
        profile: `"gaussian"` or `"exponential"`.
        box: None, or the periodic box's side lengths (a scalar or one per dimension).
        weight: as `fixed_prob`.
        delay: as `fixed_prob`.
        dt: as `fixed_prob`.
        delay_range: as `fixed_prob`.
        allow_self: as `fixed_prob`.

    Example:
    ```python
    pos = nj.connect.grid_positions((20, 20))
    desc = nj.connect.procedural.distance(jax.random.key(0), pos, pos, 0.5, 2.0,
                                          box=20.0, allow_self=False)
    ```
    """
    owner = "procedural.distance"
    pos_pre = check_positions(owner, "pos_pre", pos_pre)
    pos_post = check_positions(owner, "pos_post", pos_post)
    if pos_pre.shape[1] != pos_post.shape[1]:
        raise ValueError(
            f"{owner}: pos_pre and pos_post must have the same dimension, got "
            f"{pos_pre.shape[1]} and {pos_post.shape[1]}"
        )
    p_max = check_probability(owner, "p_max", p_max)
    sigma = check_positive_real(owner, "sigma", sigma)
    if profile not in _PROFILES:
        raise ValueError(f"{owner}: profile must be one of {_PROFILES}, got {profile!r}")
    b = check_box(owner, "box", box, pos_pre.shape[1])
    allow_self = check_flag(owner, "allow_self", allow_self)
    n_pre, n_post = int(pos_pre.shape[0]), int(pos_post.shape[0])
    if not allow_self:
        check_same_population(owner, n_pre, n_post)
    rng, key_data = _rng(owner, key)
    counts = rng.binomial(n_post - (0 if allow_self else 1), p_max, size=n_pre)
    desc = _finish(
        owner,
        "distance",
        n_pre,
        n_post,
        counts,
        key_data,
        weight,
        delay,
        dt,
        delay_range,
        allow_self,
        p_max,
        n_synapses=0,
        pos_pre=pos_pre,
        pos_post=pos_post,
        profile=profile,
        sigma=sigma,
        box=None if b is None else tuple(float(x) for x in b),
    )
    total = sum(int(valid.sum()) for *_, valid in desc._host_rows())
    return _replace_total(desc, total)


def _replace_total(desc: Procedural, total: int) -> Procedural:
    new = object.__new__(Procedural)
    for name in desc.__dataclass_fields__:
        object.__setattr__(new, name, getattr(desc, name))
    object.__setattr__(new, "n_synapses", int(total))
    return new
