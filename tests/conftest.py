"""Test-session settings: strict dtype promotion, as the style guide asks.

Implicit promotion between different array dtypes (say float32 with int32 arrays) raises
during the tests, so that a model never silently computes in an unexpected precision.
Python scalars stay weakly typed and are allowed.
"""

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
