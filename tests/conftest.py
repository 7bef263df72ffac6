"""Test-session settings: strict dtype promotion, as the style guide asks.

Implicit promotion between different array dtypes (say float32 with int32 arrays) raises
during the tests, so that a model never silently computes in an unexpected precision.
Python scalars stay weakly typed and are allowed.
"""

import os

# `make test` runs two pytest-xdist workers; on a GPU each would otherwise preallocate 75 % of
# the device's memory at its first JAX call, and the second would fail. No effect on CPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402  (after the environment is set)

jax.config.update("jax_numpy_dtype_promotion", "strict")

# Float32 matrix products at full precision on every backend. On recent NVIDIA GPUs JAX's
# default lets XLA use TF32 (10-bit mantissa) for float32 matmuls, and the tests compare
# batched, looped, checkpointed and reference runs to within 1e-5 or exactly. On CPU this
# changes nothing.
jax.config.update("jax_default_matmul_precision", "highest")
