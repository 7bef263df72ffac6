"""`spike_matmul`: the product `x @ w` of a mostly-zero input (spikes) with a weight matrix, at a
cost proportional to the input's non-zero entries.

A dense layer fed with spikes multiplies a matrix that is mostly zeros: at an input rate of
10 % a dense product spends nine tenths of its operations on zeros, in the forward pass and
again in the weight gradient `x^T @ g`. On CPU, with the compiled kernels available
(`neurojax.network._kernel`), `spike_matmul` adds, for every row of `x`, the weight rows of its
non-zero entries only (`nj_spike_matmul` in `_spike_kernel.cc`), and forms the weight gradient
the same way from the columns of `x` (`nj_spike_matmul_t`). The gradient with respect to `x`
(needed when `x` comes from an earlier spiking layer) is the dense `g @ w^T`, since `g` has no
zeros to skip. Other platforms (GPU, TPU), and CPUs without the kernels, use XLA's dense
products, which their matrix units run faster than any gather.

Values equal the dense product up to rounding: the kernel sums in ascending input position,
a dense product in an order of its own (for 0/1 inputs and integer-valued weights both are
exact). The kernel's results do not depend on the number of threads.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jaxtyping import Array, ArrayLike, Float

__all__ = ["spike_matmul"]


def spike_matmul(x: ArrayLike, w: ArrayLike) -> Float[Array, "... n_out"]:
    """`x @ w` for a mostly-zero `x`, skipping its zero entries (see the module docstring).

    Args:
        x: inputs of shape `(..., n_in)`: spikes as bool or as 0/1 floats, or any real values
            (graded spikes); zeros are skipped, every other value is multiplied in. A bool
            `x` gets no gradient; a float `x` gets the dense `g @ w^T`.
        w: weights of shape `(n_in, n_out)`, float32 or float64.

    Returns:
        `x @ w`, of shape `(..., n_out)`, computed in `w`'s dtype.

    A zero input contributes nothing, even against an infinite or NaN weight (where a dense
    product gives NaN); a non-zero input meets every weight of its row as in `x @ w`.

    Differentiable in `w` (and in a float `x`) with reverse-mode `jax.grad` (first order;
    forward mode and second derivatives are not defined); works under `jit` and `vmap`.
    The cost on CPU is proportional to the number of non-zero inputs times `n_out`: with 10 %
    of the inputs non-zero the forward product and weight gradient took 2.3-2.7x less time than
    XLA's dense products (`benchmarks/RESULTS.md`, "Training step"). Mostly non-zero inputs are
    faster through the dense product.

    Example:
    ```python
    spikes = jr.bernoulli(key, 0.05, (500, 16, 1024))      # (time, batch, n_in) bools
    currents = nj.training.spike_matmul(spikes, w)          # (500, 16, n_out)
    ```
    """
    w = jnp.asarray(w)
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"spike_matmul: w must be a float array, got dtype {w.dtype}")
    if w.ndim != 2:
        raise ValueError(f"spike_matmul: w must have shape (n_in, n_out), got shape {w.shape}")
    x = jnp.asarray(x)
    if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.floating)):
        raise TypeError(
            f"spike_matmul: x must be bool (spikes) or a float array, got dtype {x.dtype}"
        )
    if x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"spike_matmul: x must have shape (..., {w.shape[0]}) to match w of shape "
            f"{w.shape}, got shape {x.shape}"
        )
    lead = x.shape[:-1]
    # Computed in w's dtype (a bool x has no tangent, so it gets no gradient).
    x2 = x.reshape(-1, x.shape[-1]).astype(w.dtype)
    return _product(x2, w).reshape(*lead, w.shape[1])


def _dense(x, w):
    return jnp.matmul(x, w, precision=lax.Precision.HIGHEST)


def _dense_t(x, g):
    return jnp.matmul(x.T, g, precision=lax.Precision.HIGHEST)


def _on_cpu(target, out_shape, dense_fn, a, b):
    """`dense_fn(a, b)`, computed on CPU by the kernel `target` when it is available."""
    from ..network import _kernel

    if (
        a.size == 0
        or b.size == 0
        or a.dtype not in (jnp.float32, jnp.float64)
        or not _kernel.available()
    ):
        return dense_fn(a, b)
    # No vmap rule on the call: `_forward` and `_forward_t` batch themselves (custom_vmap).
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(out_shape, b.dtype))
    return lax.platform_dependent(a, b, cpu=call, default=dense_fn)


@custom_vmap
def _forward(x, w):
    """`x @ w` for x (M, K), w (K, N)."""
    from ..network import _kernel

    return _on_cpu(_kernel.SPIKE_MATMUL_TARGET, (x.shape[0], w.shape[1]), _dense, x, w)


@_forward.def_vmap
def _forward_vmap(axis_size, in_batched, x, w):
    x_batched, w_batched = in_batched
    if not w_batched:
        # Shared weights: the batch's rows are more rows of one product.
        b, m, k = x.shape
        return _forward(x.reshape(b * m, k), w).reshape(b, m, w.shape[-1]), True
    if not x_batched:
        x = jnp.broadcast_to(x, (axis_size, *x.shape))
    return lax.map(lambda xw: _forward(*xw), (x, w)), True


@custom_vmap
def _forward_t(x, g):
    """`x^T @ g` for x (M, K), g (M, N)."""
    from ..network import _kernel

    return _on_cpu(_kernel.SPIKE_MATMUL_T_TARGET, (x.shape[1], g.shape[1]), _dense_t, x, g)


@_forward_t.def_vmap
def _forward_t_vmap(axis_size, in_batched, x, g):
    x_batched, g_batched = in_batched
    if not x_batched:
        # Shared inputs: the batch's cotangents are more columns of one product.
        b, m, n = g.shape
        d = _forward_t(x, jnp.moveaxis(g, 0, 1).reshape(m, b * n))
        return jnp.moveaxis(d.reshape(x.shape[1], b, n), 1, 0), True
    if not g_batched:
        g = jnp.broadcast_to(g, (axis_size, *g.shape))
    return lax.map(lambda xg: _forward_t(*xg), (x, g)), True


@jax.custom_vjp
def _product(x, w):
    return _forward(x, w)


def _product_fwd(x, w):
    return _forward(x, w), (x, w)


def _product_bwd(res, g):
    x, w = res
    g = g.astype(w.dtype)
    return _dense(g, w.T), _forward_t(x, g)


_product.defvjp(_product_fwd, _product_bwd)
