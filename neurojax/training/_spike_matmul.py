"""`spike_matmul`: the product `x @ w` of a mostly-zero input (spikes) with a weight matrix, at a
cost proportional to the input's non-zero entries.

A dense layer fed with spikes multiplies a matrix that is mostly zeros: at an input rate of
10 % a dense product spends nine tenths of its operations on zeros, in the forward pass and
again in the weight gradient `x^T @ g`. The two products are the kernels `"spike_matmul"`
and `"spike_matmul_t"` of the registry (`neurojax.kernels`). On CPU, with the compiled
library available, `spike_matmul` adds, for every row of `x`, the weight rows of its non-zero
entries only (`nj_spike_matmul` in `neurojax/kernels/spike_matmul.cc`), and forms the weight
gradient the same way from the columns of `x` (`nj_spike_matmul_t`). The gradient with
respect to `x` (needed when `x` comes from an earlier spiking layer) is the dense
`g @ w^T`, since `g` has no zeros to skip. Other platforms (GPU, TPU), CPUs without the
library and `nj.kernels.use("reference")` use the kernels' references, XLA's dense products,
which the matrix units of accelerators run faster than any gather.

Values equal the dense product up to rounding: the kernel sums in ascending input position,
a dense product in an order of its own (for 0/1 inputs and integer-valued weights both are
exact). The kernel's results do not depend on the number of threads.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float

from .. import kernels

__all__ = ["spike_matmul", "SPIKE_MATMUL", "SPIKE_MATMUL_T"]


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


def _compiled(a, b) -> bool:
    """Whether the compiled kernels handle these operands (float32/float64, not empty)."""
    return a.size > 0 and b.size > 0 and a.dtype in (jnp.float32, jnp.float64)


def _forward_cpu(x, w):
    return jax.ffi.ffi_call(
        "nj_spike_matmul", jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), w.dtype)
    )(x, w)


def _forward_t_cpu(x, g):
    return jax.ffi.ffi_call(
        "nj_spike_matmul_t", jax.ShapeDtypeStruct((x.shape[1], g.shape[1]), g.dtype)
    )(x, g)


def _forward_batching(axis_size, in_batched, args, apply):
    x, w = args
    if not in_batched[1]:
        # Shared weights: the batch's rows are more rows of one product.
        b, m, k = x.shape
        return apply(x.reshape(b * m, k), w).reshape(b, m, w.shape[-1]), True
    return kernels.Sequential()(axis_size, in_batched, args, apply)


def _forward_t_batching(axis_size, in_batched, args, apply):
    x, g = args
    if not in_batched[0]:
        # Shared inputs: the batch's cotangents are more columns of one product.
        b, m, n = g.shape
        d = apply(x, jnp.moveaxis(g, 0, 1).reshape(m, b * n))
        return jnp.moveaxis(d.reshape(x.shape[1], b, n), 1, 0), True
    return kernels.Sequential()(axis_size, in_batched, args, apply)


def _operands(m: int, k: int, n: int, seed: int, rate: float = 0.1):
    rng = np.random.default_rng(seed)
    x = (rng.random((m, k)) < rate).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(rng.normal(size=(k, n)).astype(np.float32))


def _forward_examples():
    x, w = _operands(24, 70, 33, seed=0)
    yield kernels.Example((x, w), grad_argnums=(0, 1), vmap_argnums=(0,), label="shared-w")
    yield kernels.Example((x, w), grad_argnums=(1,), label="batched-both")


def _forward_t_examples():
    x, _ = _operands(24, 70, 33, seed=1)
    g = jnp.asarray(np.random.default_rng(2).normal(size=(24, 33)).astype(np.float32))
    yield kernels.Example((x, g), grad_argnums=(1,), vmap_argnums=(1,), label="shared-x")
    yield kernels.Example((x, g), label="batched-both")


# The kernels sum in ascending input position, a dense product in an order of its own: equal
# to rounding (exactly for 0/1 inputs and integer-valued weights).
SPIKE_MATMUL = kernels.register(
    kernels.Kernel(
        name="spike_matmul",
        reference=_dense,
        cpu=_forward_cpu,
        ffi_targets=(("nj_spike_matmul", "NjSpikeMatmul"),),
        batching=_forward_batching,
        supports=_compiled,
        rtol=1e-5,
        atol=1e-5,
        examples=_forward_examples,
        doc="`x @ w` for x (M, K) mostly zeros, w (K, N): the rows of w of the non-zeros.",
    )
)
SPIKE_MATMUL_T = kernels.register(
    kernels.Kernel(
        name="spike_matmul_t",
        reference=_dense_t,
        cpu=_forward_t_cpu,
        ffi_targets=(("nj_spike_matmul_t", "NjSpikeMatmulT"),),
        batching=_forward_t_batching,
        supports=_compiled,
        rtol=1e-5,
        atol=1e-5,
        examples=_forward_t_examples,
        doc="`x^T @ g` for x (M, K) mostly zeros, g (M, N): the weight gradient.",
    )
)


def _forward(x, w):
    """`x @ w` for x (M, K), w (K, N)."""
    return kernels.call(SPIKE_MATMUL, x, w)


def _forward_t(x, g):
    """`x^T @ g` for x (M, K), g (M, N)."""
    return kernels.call(SPIKE_MATMUL_T, x, g)


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
