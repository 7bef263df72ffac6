"""Random draws of the sparse assembly model: the binomial-tail threshold and the candidates.

In sparse mode a target area does not represent its never-fired neurons. Each of them receives
`Binomial(total_k, p)` input from the `total_k` neurons that fire into the area; only the `k`
largest of those `n - w` inputs can enter the cap, and they are drawn directly from the upper
tail (Papadimitriou et al. 2020; reference code `dmitropolsky/assemblies`, `brain.py`):

$$
\\alpha = F^{-1}_{\\mathrm{Bin}(total_k, p)}\\!\\left(\\frac{n - w - k}{n - w}\\right),\\quad
\\mu = total_k\\,p,\\quad \\sigma = \\sqrt{total_k\\,p\\,(1-p)},
$$
$$
X = \\mathrm{round}\\big(\\mu + \\sigma Z\\big),\\quad
Z \\sim \\mathcal{N}(0, 1)\\ \\text{truncated to}\\
\\big[(\\alpha-\\mu)/\\sigma,\\ (total_k-\\mu)/\\sigma\\big].
$$

`total_k` and `w` are traced values (a source may fire a subset of its assembly, the support
grows), so the binomial quantile is read from a table of log survival probabilities built once
per `(largest total_k, p, smallest tail)` on the host in float64 with SciPy.
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax.scipy.special import ndtr, ndtri
from jaxtyping import Array, Float, Int, PRNGKeyArray, UInt32

__all__ = ["binom_tail_table", "binom_ppf", "truncated_normal", "sample_candidates", "max_input"]


@functools.lru_cache(maxsize=64)
def _table(total_max: int, p: float, min_tail: float) -> np.ndarray:
    from scipy.stats import binom

    # sf grows with the number of trials, so the largest total_k needs the most columns; every
    # x beyond the last column has sf(x) <= min_tail <= any tail asked for and is never counted.
    width = int(binom.isf(min_tail, total_max, p)) + 2
    width = max(2, min(width, total_max + 2))
    trials = np.arange(total_max + 1)[:, None]
    x = np.arange(width)[None, :]
    with np.errstate(divide="ignore"):
        table = binom.logsf(x, trials, p)
    return table.astype(np.float32)


def binom_tail_table(total_max: int, p: float, min_tail: float) -> jax.Array:
    """Log survival table `log P(Bin(N, p) > x)` for `N = 0..total_max`, `x = 0..width-1`.

    `min_tail` is the smallest tail probability that will be asked for (`k / n`); columns
    stop where the survival probability of the largest `N` falls below it.
    """
    return jnp.asarray(_table(int(total_max), float(p), float(min_tail)))


def binom_ppf(
    table: Float[Array, "N x"], total: Int[Array, ""], log_tail: Float[Array, ""]
) -> Int[Array, ""]:
    """`scipy.stats.binom.ppf(1 - tail, total, p)` from a `binom_tail_table`.

    The quantile is the smallest `x` with `cdf(x) >= 1 - tail`, that is with `sf(x) <= tail`;
    since `sf` falls with `x`, it equals the number of `x` whose `sf(x)` is still above `tail`.
    """
    row = table[total].astype(jnp.result_type(log_tail))
    return jnp.sum(row > log_tail).astype(jnp.int32)


def truncated_normal(
    key: PRNGKeyArray | UInt32[Array, "..."],
    lower: Float[Array, ""],
    upper: Float[Array, ""],
    shape: tuple[int, ...],
) -> Float[Array, "..."]:
    """Standard normal samples truncated to `[lower, upper]`, accurate far into the tails.

    Inverse-CDF sampling through the upper-tail probability `Q(z) = Phi(-z)` when `lower >= 0`
    (in float32 `Phi(5)` is 1 to within a few ulps, while `Q(5) = 2.9e-7` keeps full relative
    precision) and through `Phi` otherwise. `key` is a PRNG key, or uint32 random words of
    `shape` already drawn (one word per sample).
    """
    dtype = jnp.result_type(float)
    words = _words(key, shape)
    # Midpoints of the 2**-23 grid of uniforms (the top 23 bits of each word): u is never 0
    # or 1, where the inverse CDF would return an infinite z (then clipped to the upper
    # bound, an impossible draw).
    u = ((words >> 9).astype(dtype) + 0.5) * 2.0**-23
    # With s = -1 (lower >= 0) the draw is -ndtri(Q(upper) + u (Q(lower) - Q(upper))), with
    # s = 1 it is ndtri(Phi(lower) + u (Phi(upper) - Phi(lower))): one CDF pair and one
    # inverse CDF, whichever side is accurate.
    s = jnp.where(lower >= 0, -1.0, 1.0).astype(dtype)
    at_lower, at_upper = ndtr(s * lower), ndtr(s * upper)
    start = jnp.where(s < 0, at_upper, at_lower)
    end = jnp.where(s < 0, at_lower, at_upper)
    z = s * ndtri(start + u * (end - start))
    # Rounding in the last ulp may step just outside the interval; the interval is the model.
    return jnp.clip(z, lower, upper)


def _words(key: Any, shape: tuple[int, ...]) -> Array:
    """uint32 words of `shape`: drawn from `key` if it is a PRNG key, else `key` itself."""
    if jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        return jr.bits(key, shape, jnp.uint32)
    words = jnp.asarray(key)
    if words.dtype != jnp.uint32 or words.shape != tuple(shape):
        raise ValueError(
            f"truncated_normal: random words must be uint32 of shape {tuple(shape)}, got "
            f"{words.dtype} of shape {words.shape}"
        )
    return words


def sample_candidates(
    key: PRNGKeyArray | UInt32[Array, " k"],
    table: Float[Array, "N x"],
    total: Int[Array, ""],
    n: int,
    k: int,
    support: Int[Array, ""],
    p: float,
) -> Float[Array, " k"]:
    """Inputs of the `k` best never-fired neurons of an area of `n` with `support` fired ones.

    Returns rounded values (float, as inputs are compared with float synaptic sums). An area
    with no input at all (`total == 0`) returns zeros. `key` is a PRNG key or `k` uint32
    random words (see `truncated_normal`).
    """
    dtype = jnp.result_type(float)
    total_f = total.astype(dtype)
    effective_n = (n - support).astype(dtype)
    log_tail = jnp.log(jnp.asarray(k, dtype)) - jnp.log(effective_n)
    alpha = binom_ppf(table, total, log_tail).astype(dtype)
    mu = total_f * p
    sd = jnp.sqrt(total_f * (p * (1.0 - p)))
    safe_sd = jnp.where(sd > 0, sd, jnp.ones_like(sd))
    lower = (alpha - mu) / safe_sd
    upper = (total_f - mu) / safe_sd
    lower = jnp.minimum(lower, upper)
    z = truncated_normal(key, lower, upper, (k,))
    x = jnp.round(mu + safe_sd * z)
    return jnp.where(sd > 0, x, jnp.zeros_like(x))


def max_input(total_max: int, p: float, table_width: int) -> int:
    """A bound on any candidate's input, used as the static width of the input selection.

    A candidate is at least the threshold `alpha` (below `table_width`, the table's column
    count) and at most `total_max`; given the truncation its excess over `alpha` falls off
    faster than a Gaussian tail, so `alpha + 14 sigma` is exceeded with probability below
    1e-40. A larger value is reported as an error by the caller, never cut.
    """
    mu = total_max * p
    sd = math.sqrt(total_max * p * (1.0 - p))
    bound = max(mu, table_width) + 14.0 * sd + 2.0
    return int(min(total_max, math.ceil(bound)))
