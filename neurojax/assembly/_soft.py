r"""Differentiable k-cap: a smooth relaxation, a straight-through estimator and losses.

The k-cap of assembly calculus keeps the `k` neurons with the largest input and silences
the rest. As a function of the input it is piecewise constant, so its derivative is zero
almost everywhere. This module provides the pieces needed to train through it:

| name | forward | gradient |
| --- | --- | --- |
| `kcap` | 0/1 indicator of the `k` largest entries | none (piecewise constant) |
| `soft_kcap` | $y_i = \sigma((x_i - \tau) / T)$, $\sum_i y_i = k$ | implicit function theorem |
| `kcap_st` | `kcap(x, k)` | that of `soft_kcap` (straight-through) |
| `assembly_loss` | Fenchel-Young or soft-overlap loss | closed form |
| `soft_overlap` | $\langle y, t \rangle / \sum_i t_i$ | autodiff |

`soft_kcap` is the regularised k-cap of Amos, Koltun and Kolter (2019): the maximiser of
$\langle x, y \rangle - \Omega(y)$ over the capped polytope
$\mathcal{C}_k = \{ y : 0 \le y_i \le 1, \sum_i y_i = k \}$ with the binary-entropy
regulariser $\Omega(y) = T \sum_i [y_i \log y_i + (1 - y_i) \log (1 - y_i)]$. The
stationarity condition gives the sigmoid form above; the threshold $\tau$ is the Lagrange
multiplier of the sum constraint and is found by bisection. As $T \to 0$ the soft cap tends
to the hard one whenever the `k`-th and `(k+1)`-th largest inputs differ.

Conventions: these functions act on one example along the last axis; `soft_kcap`, `kcap`
and `kcap_st` also accept leading batch axes, the losses take one example and are batched
with `jax.vmap`. `k` is a static Python int; `temperature` is an array leaf (changing its
value never recompiles, and it can be differentiated or vmapped).

Example:
```python
import jax, jax.numpy as jnp
from neurojax.assembly._soft import kcap, soft_kcap, assembly_loss
x = jnp.array([0.3, 2.0, -1.0, 1.5, 0.9])
kcap(x, 2)                                   # [0., 1., 0., 1., 0.]
soft_kcap(x, 2, 0.1)                         # close to the above, sums to 2
jax.grad(assembly_loss)(x, jnp.array([0, 1]), 2, 0.1)   # soft_kcap(x) - indicator
```

References:
    - Papadimitriou, Vempala, Mitropolsky, Collins and Maass (2020), "Brain computation by
      assemblies of neurons", PNAS 117(25).
    - Amos, Koltun and Kolter (2019), "The limited multi-label projection layer",
      arXiv:1906.08707.
    - Blondel, Martins and Niculae (2020), "Learning with Fenchel-Young losses", JMLR 21.
    - Bengio, Leonard and Courville (2013), "Estimating or propagating gradients through
      stochastic neurons for conditional computation", arXiv:1308.3432.
"""

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from .._validation import as_float, default_float, is_concrete

__all__ = ["soft_kcap", "kcap", "kcap_st", "assembly_loss", "soft_overlap", "LOSS_KINDS"]

LOSS_KINDS = ("fenchel_young", "overlap")
"""The values of `assembly_loss(..., kind=...)`: `"fenchel_young"` (the Fenchel-Young loss of
`soft_kcap`) and `"overlap"` (one minus the soft overlap with the target)."""

# An indicator target is accepted when its sum is within this relative distance of k, so
# that a soft target produced in float32 (for example by `soft_kcap`) passes validation.
_TARGET_SUM_RTOL = 1e-3


# ---------------------------------------------------------------------------------------
# Validation (runs once at the entry point, on concrete values only)
# ---------------------------------------------------------------------------------------


def _show(a: Any) -> str:
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(a.item())
    if a.size <= 8:
        return np.array2string(a, separator=", ")
    return f"array of shape {a.shape}"


def _float_input(owner: str, name: str, x: Any, min_ndim: int = 1) -> Array:
    """`x` as a floating array: float dtypes are kept, integers become the default float."""
    x = x if isinstance(x, jax.Array) else np.asarray(x)
    if x.dtype == np.bool_ or not (
        jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
    ):
        raise TypeError(f"{owner}: {name} must be a real (float or int) array, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{owner}: {name} must have at least {min_ndim} axis (neurons on the last axis), "
            f"got shape {x.shape}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(default_float())
    return jnp.asarray(x)


def _check_finite(owner: str, name: str, x: Array) -> None:
    if is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        raise ValueError(
            f"{owner}: {name} must be finite, got non-finite entries; mask a neuron out with "
            "a large negative finite value rather than -inf"
        )


def _check_k(owner: str, k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{owner}: k must be a Python int (static), got {k!r}")
    k = int(k)
    if not 0 < k <= n:
        raise ValueError(f"{owner}: k must satisfy 0 < k <= n = {n}, got k = {k}")
    return k


def _check_temperature(owner: str, temperature: Any, dtype: Any) -> Array:
    T = as_float(temperature)
    if T.ndim != 0:
        raise ValueError(
            f"{owner}: temperature must be a scalar, got shape {T.shape}; use jax.vmap for "
            "one temperature per example"
        )
    if is_concrete(T):
        value = float(T)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{owner}: temperature must be finite and > 0, got {value!r}")
    return T.astype(dtype)


def _target_indicator(
    owner: str, target: Any, n: int, dtype: Any, k: int | None
) -> tuple[Array, Array | int]:
    """The target as a float indicator of shape `(n,)`, and its size (`k` or `sum(t)`)."""
    t = target if isinstance(target, jax.Array) else np.asarray(target)
    if jnp.issubdtype(t.dtype, jnp.integer) and t.dtype != np.bool_:
        size = f"k = {k}" if k is not None else "at least 1"
        if t.ndim != 1 or (k is not None and t.shape[0] != k) or t.shape[0] == 0:
            raise ValueError(
                f"{owner}: an integer target is an array of neuron indices and must have "
                f"shape (k,) with {size}, got shape {t.shape}; pass a 0/1 indicator of shape "
                f"(n,) = ({n},) as a float or bool array"
            )
        if t.shape[0] > n:
            raise ValueError(
                f"{owner}: target has {t.shape[0]} indices but there are only n = {n} neurons"
            )
        if is_concrete(t):
            idx = np.asarray(t)
            if idx.min() < 0 or idx.max() >= n:
                raise ValueError(
                    f"{owner}: target indices must lie in [0, n) = [0, {n}), got {_show(idx)}"
                )
            if np.unique(idx).size != idx.size:
                raise ValueError(f"{owner}: target indices must be distinct, got {_show(idx)}")
        indicator = jnp.zeros(n, dtype).at[jnp.asarray(t)].set(1.0)
        return indicator, t.shape[0]
    if not (t.dtype == np.bool_ or jnp.issubdtype(t.dtype, jnp.floating)):
        raise TypeError(
            f"{owner}: target must be an int index array or a float/bool indicator, got dtype "
            f"{t.dtype}"
        )
    if t.shape != (n,):
        raise ValueError(
            f"{owner}: an indicator target must have shape (n,) = ({n},), got shape {t.shape}"
        )
    if is_concrete(t):
        a = np.asarray(t, dtype=np.float64)
        if not np.all((a >= 0) & (a <= 1)):
            raise ValueError(
                f"{owner}: indicator target entries must lie in [0, 1], got {_show(a)}"
            )
        total = a.sum()
        if k is not None and abs(total - k) > _TARGET_SUM_RTOL * k:
            raise ValueError(
                f"{owner}: indicator target must sum to k = {k} (one entry per assembly "
                f"neuron), got sum {total:g}"
            )
        if k is None and total <= 0:
            raise ValueError(f"{owner}: indicator target must not be all zeros")
    indicator = jnp.asarray(t).astype(dtype)
    return indicator, (k if k is not None else jnp.sum(indicator))


# ---------------------------------------------------------------------------------------
# Core: threshold by bisection, derivatives by the implicit function theorem
# ---------------------------------------------------------------------------------------


def _bisection_steps(dtype: Any) -> int:
    # The initial bracket is at most (2 + 2c) * max(max|x|, T) wide, and 2 + 2c < 64 for any
    # n below 10^9, so nmant + 8 halvings shrink it below the float resolution of x - tau;
    # further halvings cannot change the result (31 steps in float32, 60 in float64).
    return int(jnp.finfo(dtype).nmant) + 8


def _threshold(x: Array, T: Array, k: int) -> Array:
    """Solve `sum_i sigmoid((x_i - tau) / T) = k` for `tau` along the last axis (keepdims)."""
    n = x.shape[-1]
    # At tau = min(x) - c T every y_i >= sigmoid(c) > 1 - 1/(e n), so sum(y) > n - 1 >= k;
    # at tau = max(x) + c T every y_i < 1/(e n), so sum(y) < 1 <= k: the root is bracketed.
    c = math.log(n) + 1.0
    lo = jnp.min(x, axis=-1, keepdims=True) - c * T
    hi = jnp.max(x, axis=-1, keepdims=True) + c * T

    def halve(_, bracket):
        lo, hi = bracket
        mid = lo + 0.5 * (hi - lo)
        too_many = jnp.sum(jax.nn.sigmoid((x - mid) / T), axis=-1, keepdims=True) > k
        return jnp.where(too_many, mid, lo), jnp.where(too_many, hi, mid)

    lo, hi = jax.lax.fori_loop(0, _bisection_steps(x.dtype), halve, (lo, hi))
    return lo + 0.5 * (hi - lo)


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _cap(x: Array, T: Array, k: int) -> tuple[Array, Array]:
    """`(y, tau)` of the soft k-cap, `tau` with a trailing axis of size 1."""
    tau = _threshold(x, T, k)
    return jax.nn.sigmoid((x - tau) / T), tau


@_cap.defjvp
def _cap_jvp(k, primals, tangents):
    # Implicit differentiation of F(x, T, tau) = sum_i sigmoid((x_i - tau)/T) - k = 0; the
    # bisection loop itself is never differentiated.
    x, T = primals
    dx, dT = tangents
    y, tau = _cap(x, T, k)
    z = (x - tau) / T
    # sigmoid(z) sigmoid(-z) keeps its precision in the tails, where 1 - y rounds to 0.
    s = jax.nn.sigmoid(z) * jax.nn.sigmoid(-z) / T
    live = s > 0
    # Where s underflows to 0, z may be infinite (T -> 0); its term must then be 0, not nan.
    sz = jnp.where(live, s * jnp.where(live, z, 0.0), 0.0)
    S = jnp.sum(s, axis=-1, keepdims=True)
    S = jnp.where(S > 0, S, 1.0)
    dtau = (jnp.sum(s * dx, axis=-1, keepdims=True) - jnp.sum(sz, axis=-1, keepdims=True) * dT) / S
    dy = s * (dx - dtau) - sz * dT
    return (y, tau), (dy, dtau)


def _binary_xent(p: Array, z: Array) -> Array:
    r"""$-p \log \sigma(z) - (1 - p) \log \sigma(-z)$, elementwise, finite for 0/1 `p`."""
    return jnp.where(p > 0, p * jax.nn.softplus(-z), 0.0) + jnp.where(
        p < 1, (1 - p) * jax.nn.softplus(z), 0.0
    )


def _neg_entropy(t: Array) -> Array:
    """`sum_i t log t + (1 - t) log(1 - t)` (= Omega(t) / T), 0 for a 0/1 vector."""
    return jnp.sum(xlogy(t, t) + xlogy(1 - t, 1 - t))


def _fy_value(x: Array, T: Array, t: Array, k: int) -> tuple[Array, Array, Array]:
    y, tau = _cap(x, T, k)
    z = (x - tau) / T
    # T * sum_i KL(Bernoulli(t_i) || Bernoulli(y_i)): equal to Omega*(x) - <x, t> + Omega(t)
    # when sum(t) = k, and non-negative term by term (no cancellation between large terms).
    value = T * (jnp.sum(_binary_xent(t, z)) + _neg_entropy(t))
    return value, y, z


@partial(jax.custom_jvp, nondiff_argnums=(3,))
def _fenchel_young(x: Array, T: Array, t: Array, k: int) -> Array:
    return _fy_value(x, T, t, k)[0]


@_fenchel_young.defjvp
def _fenchel_young_jvp(k, primals, tangents):
    # dL/dx = y - t and dL/dT = (Omega(t) - Omega(y)) / T = sum_i H(y_i) - H(t_i), both by
    # the envelope theorem (tau is optimal, so its own derivative drops out). y comes from
    # `_cap`, so differentiating this rule again gives the exact Hessian dy/dx. The target
    # is a constant here (the caller stops its gradient).
    x, T, t = primals
    dx, dT, _ = tangents
    value, y, z = _fy_value(x, T, t, k)
    dL_dT = jnp.sum(_binary_xent(y, z)) + _neg_entropy(t)
    return value, jnp.sum((y - t) * dx) + dL_dT * dT


# Entry points call these compiled kernels after validating on the host: `k` is static, so
# an eager call compiles once per (shape, dtype, k) instead of re-tracing the bisection
# loop every time; inside an outer `jit` they are simply inlined.


@partial(jax.jit, static_argnums=2)
def _soft_kcap_kernel(x: Array, T: Array, k: int) -> Array:
    return _cap(x, T, k)[0]


@partial(jax.jit, static_argnums=1)
def _kcap_kernel(x: Array, k: int) -> Array:
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else default_float()
    _, idx = jax.lax.top_k(x, k)
    ones = jnp.ones(idx.shape, dtype)
    return jnp.put_along_axis(jnp.zeros(x.shape, dtype), idx, ones, axis=-1, inplace=False)


@partial(jax.jit, static_argnums=3)
def _overlap_loss_kernel(x: Array, T: Array, t: Array, k: int) -> Array:
    return 1.0 - jnp.sum(_cap(x, T, k)[0] * t) / k


_fenchel_young_kernel = jax.jit(_fenchel_young, static_argnums=3)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def soft_kcap(
    x: Real[ArrayLike, "*batch n"], k: int, temperature: float | Float[ArrayLike, ""]
) -> Float[Array, "*batch n"]:
    r"""Smooth k-cap: sigmoids with a shared threshold, summing to `k`.

    $$ y_i = \sigma\!\left(\frac{x_i - \tau}{T}\right), \qquad
       \sum_{i=1}^{n} y_i = k, \qquad \sigma(u) = \frac{1}{1 + e^{-u}}. $$

    $y$ is the maximiser of $\langle x, y \rangle - \Omega(y)$ over
    $\{0 \le y \le 1, \sum_i y_i = k\}$ with
    $\Omega(y) = T \sum_i [y_i \log y_i + (1 - y_i) \log(1 - y_i)]$; $\tau$ is the
    multiplier of the sum constraint.

    **Solver.** $\sum_i y_i$ decreases strictly in $\tau$, and the root lies in
    $[\min x - cT, \max x + cT]$ with $c = \log n + 1$ (at the ends every $y_i$ is above
    $1 - 1/(en)$, respectively below $1/(en)$). A fixed number of bisection steps,
    `nmant + 8` of the dtype (31 in float32, 60 in float64), shrinks the bracket below the
    float resolution of $x - \tau$. The fixed count keeps the function `jit`/`vmap` friendly.

    **Gradient** (implicit function theorem, `jax.custom_jvp`; the loop is never
    differentiated, and forward and reverse mode both work). With $z_i = (x_i - \tau)/T$,
    $s_i = y_i (1 - y_i)/T$ and $S = \sum_i s_i$:

    $$ \frac{\partial y}{\partial x} = \operatorname{diag}(s) - \frac{s s^\top}{S}, \qquad
       \frac{\partial y_i}{\partial T} = -s_i \left(z_i - \frac{\sum_j s_j z_j}{S}\right). $$

    The Jacobian is symmetric, its rows sum to 0 (the sum stays `k`), and it is positive
    semi-definite, so $y_i$ increases with $x_i$ and decreases with every other input.

    **Limits.** `k == n` returns exactly `1` everywhere (the constraint forces it; the
    threshold is $-\infty$, the gradient is 0). As $T \to 0$ the result tends to `kcap(x, k)`
    whenever the `k`-th and `(k+1)`-th largest inputs differ; at a tie the tied neurons
    share the remaining mass equally. Precision: $\sum_i y_i = k$ holds to the rounding of
    the sum (about $n \varepsilon$), so for small $T$ the threshold may settle anywhere in the
    flat region where the tails stay below that level, and entries that should be
    $e^{-50}$ can come out near $\varepsilon$ instead. In float32, $T$ must also stay well
    above the rounding error of $x$ (about $10^{-7} \max|x|$), or the threshold cannot be
    resolved at all.

    Args:
        x: inputs (any real units), neurons on the last axis, optional leading batch axes;
            finite. Integers are converted to the default float dtype.
        k: cap size, a static Python int with `0 < k <= n`.
        temperature: $T$, in the units of `x`, a scalar `> 0` (an array leaf: it can be
            traced, vmapped and differentiated).

    Returns:
        $y$, same shape and float dtype as `x`, entries in $(0, 1)$, each row summing to `k`.

    Raises:
        ValueError: `x` is 0-d or not finite, `k` out of range, `temperature` not a positive
            finite scalar (values are checked when they are concrete).
        TypeError: `k` is not an int, or `x`/`temperature` are not real numbers.

    Example:
    ```python
    y = soft_kcap(jnp.array([0.1, 2.0, 1.0, -0.5]), 2, 0.05)   # ~[0, 1, 1, 0]
    ```
    """
    x = _float_input("soft_kcap", "x", x)
    k = _check_k("soft_kcap", k, x.shape[-1])
    T = _check_temperature("soft_kcap", temperature, x.dtype)
    _check_finite("soft_kcap", "x", x)
    if k == x.shape[-1]:
        return jnp.ones_like(x)
    return _soft_kcap_kernel(x, T, k)


def kcap(x: Real[ArrayLike, "*batch n"], k: int) -> Float[Array, "*batch n"]:
    r"""Hard k-cap: 0/1 indicator of the `k` largest entries along the last axis.

    $$ \operatorname{cap}_k(x)_i = \begin{cases} 1 & i \in \operatorname{top}_k(x) \\
       0 & \text{otherwise} \end{cases} $$

    Ties are broken toward the lower index (the rule of the assembly-calculus reference
    code), so the result always has exactly `k` ones. Implemented with `jax.lax.top_k`,
    whose order among equal values is by increasing index. Its derivative is zero almost
    everywhere; use `kcap_st` or `soft_kcap` to train through it.

    Args:
        x: inputs, neurons on the last axis, optional leading batch axes. Integer inputs are
            ranked exactly (without conversion).
        k: cap size, a static Python int with `0 < k <= n`.

    Returns:
        The indicator, same shape as `x`, in `x`'s float dtype (the default float for
        integer `x`).

    Example:
    ```python
    kcap(jnp.array([1.0, 3.0, 3.0, 2.0, 3.0]), 2)   # [0., 1., 1., 0., 0.]
    ```
    """
    arr = x if isinstance(x, jax.Array) else np.asarray(x)
    if arr.dtype == np.bool_ or not (
        jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
    ):
        raise TypeError(f"kcap: x must be a real (float or int) array, got dtype {arr.dtype}")
    if arr.ndim < 1:
        raise ValueError(
            f"kcap: x must have at least 1 axis (neurons on the last axis), got shape {arr.shape}"
        )
    k = _check_k("kcap", k, arr.shape[-1])
    return _kcap_kernel(jnp.asarray(arr), k)


def kcap_st(
    x: Real[ArrayLike, "*batch n"], k: int, temperature: float | Float[ArrayLike, ""]
) -> Float[Array, "*batch n"]:
    r"""Straight-through k-cap: forward `kcap(x, k)`, gradient of `soft_kcap(x, k, T)`.

    $$ y = \operatorname{cap}_k(x) + \big(\tilde y - \operatorname{sg}(\tilde y)\big), \qquad
       \tilde y = \texttt{soft\_kcap}(x, k, T), $$

    where $\operatorname{sg}$ stops the gradient. The bracket is exactly 0 in the forward
    pass, so the value is the hard 0/1 indicator bit for bit, while every derivative (with
    respect to `x` and to `temperature`, in forward or reverse mode) is that of the soft cap
    (Bengio et al. 2013). The forward pass computes both caps.

    Args:
        x: inputs, neurons on the last axis, optional leading batch axes; finite.
        k: cap size, a static Python int with `0 < k <= n`.
        temperature: $T$ of the soft cap used for the gradient, a scalar `> 0`.

    Returns:
        The hard indicator, same shape and float dtype as `x`.

    Example:
    ```python
    jax.grad(lambda x: kcap_st(x, 2, 0.5) @ w)(x)  # equals the same with soft_kcap
    ```
    """
    soft = soft_kcap(x, k, temperature)
    hard = kcap(x, k).astype(soft.dtype)
    return hard + (soft - jax.lax.stop_gradient(soft))


def soft_overlap(
    y: Float[ArrayLike, " n"],
    target: Int[ArrayLike, " k"] | Bool[ArrayLike, " n"] | Float[ArrayLike, " n"],
) -> Float[Array, ""]:
    r"""Fraction of the target assembly covered by the (soft) activity `y`.

    $$ \operatorname{overlap}(y, t) = \frac{\langle y, t \rangle}{\sum_i t_i}, $$

    with $t$ the target indicator. For a 0/1 `y` with as many ones as the target this is
    the assembly-calculus overlap $|A \cap B| / k$; for `y = soft_kcap(...)` it is its smooth
    counterpart.

    Args:
        y: activity of one area, shape `(n,)` (batch with `jax.vmap`).
        target: the target assembly, either an int array of distinct neuron indices of shape
            `(k,)`, or an indicator of shape `(n,)` (bool, or float with entries in [0, 1],
            not all zero).

    Returns:
        A scalar; in [0, 1] when `0 <= y <= 1`.

    Example:
    ```python
    soft_overlap(jnp.array([0.2, 0.9, 0.5, 0.4]), jnp.array([1, 2]))   # 0.7
    ```
    """
    y = _float_input("soft_overlap", "y", y)
    if y.ndim != 1:
        raise ValueError(
            f"soft_overlap: y must have shape (n,), got shape {y.shape}; batch with jax.vmap"
        )
    t, size = _target_indicator("soft_overlap", target, y.shape[0], y.dtype, None)
    return jnp.sum(y * t) / size


def assembly_loss(
    x: Real[ArrayLike, " n"],
    target: Int[ArrayLike, " k"] | Bool[ArrayLike, " n"] | Float[ArrayLike, " n"],
    k: int,
    temperature: float | Float[ArrayLike, ""],
    kind: str = "fenchel_young",
) -> Float[Array, ""]:
    r"""Loss that pulls the k-cap of `x` onto a target assembly.

    **`kind="fenchel_young"`** (default; Blondel et al. 2020). With the regulariser
    $\Omega(y) = T \sum_i [y_i \log y_i + (1 - y_i)\log(1 - y_i)]$ restricted to the capped
    polytope $\mathcal{C}_k = \{0 \le y \le 1, \sum_i y_i = k\}$,

    $$ L(x; t) = \Omega^*(x) - \langle x, t \rangle + \Omega(t), \qquad
       \Omega^*(x) = \max_{y \in \mathcal{C}_k} \langle x, y \rangle - \Omega(y). $$

    The maximiser is $y = $ `soft_kcap(x, k, T)`. Writing $z_i = (x_i - \tau)/T$, so that
    $\log\frac{y_i}{1 - y_i} = z_i$ and $\log(1 - y_i) = -\operatorname{softplus}(z_i)$,

    $$ \Omega^*(x) = k\tau + T \sum_i \operatorname{softplus}(z_i), \qquad
       L(x; t) = T \sum_i \operatorname{KL}\big(\mathrm{Bern}(t_i) \,\|\, \mathrm{Bern}(y_i)\big)
       \quad (\textstyle\sum_i t_i = k). $$

    The second form is what is evaluated: every term is non-negative, so $L \ge 0$ with
    equality only when $t = y$ (a 0/1 target is reached only in the limit of an infinite
    margin; then $\Omega(t) = 0$). Gradients are given in closed form (envelope theorem):
    $\nabla_x L = y - t$ and $\partial L / \partial T = \sum_i H(y_i) - H(t_i)$, with $H$
    the binary entropy in nats; differentiating once more gives the exact Hessian
    $\partial y / \partial x$.

    **`kind="overlap"`**: $L = 1 - \langle y, t \rangle / k$ with $y$ = `soft_kcap(x, k, T)`,
    i.e. one minus `soft_overlap`; 0 when the soft cap equals a 0/1 target. Its gradient
    vanishes as the soft cap saturates, so it trains more slowly than the Fenchel-Young loss.

    No gradient flows to `target` (it is treated as data).

    Args:
        x: inputs of one area, shape `(n,)`, finite (batch with `jax.vmap`).
        target: the target assembly: an int array of `k` distinct neuron indices, or an
            indicator of shape `(n,)` (bool, or float with entries in [0, 1] summing to `k`;
            soft targets such as another `soft_kcap` output are allowed).
        k: cap size, a static Python int with `0 < k <= n` (at `k == n` both losses are 0).
        temperature: $T$, a scalar `> 0`, in the units of `x`.
        kind: `"fenchel_young"` or `"overlap"` (static).

    Returns:
        The scalar loss, in `x`'s float dtype.

    Example:
    ```python
    x = jnp.array([0.3, 2.0, -1.0, 1.5, 0.9])
    assembly_loss(x, jnp.array([1, 3]), 2, 0.1)          # small: the cap is already {1, 3}
    jax.grad(assembly_loss)(x, jnp.array([0, 4]), 2, 0.1)  # soft_kcap(x, 2, 0.1) - t
    ```
    """
    owner = "assembly_loss"
    if not isinstance(kind, str) or kind not in LOSS_KINDS:
        raise ValueError(f"{owner}: kind must be one of {LOSS_KINDS}, got {kind!r}")
    x = _float_input(owner, "x", x)
    if x.ndim != 1:
        raise ValueError(
            f"{owner}: x must have shape (n,), got shape {x.shape}; batch with jax.vmap"
        )
    n = x.shape[0]
    k = _check_k(owner, k, n)
    T = _check_temperature(owner, temperature, x.dtype)
    t, _ = _target_indicator(owner, target, n, x.dtype, k)
    _check_finite(owner, "x", x)
    t = jax.lax.stop_gradient(t)
    if k == n:
        # y = 1 exactly: the overlap is sum(t) / k = 1 and Omega*(x) = <x, 1> = <x, t>.
        return jnp.zeros((), x.dtype)
    if kind == "overlap":
        return _overlap_loss_kernel(x, T, t, k)
    return _fenchel_young_kernel(x, T, t, k)
