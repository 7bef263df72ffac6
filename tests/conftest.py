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
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

# Float32 matrix products at full precision on every backend. On recent NVIDIA GPUs JAX's
# default lets XLA use TF32 (10-bit mantissa) for float32 matmuls, and the tests compare
# batched, looped, checkpointed and reference runs to within 1e-5 or exactly. On CPU this
# changes nothing.
jax.config.update("jax_default_matmul_precision", "highest")


# Modules that check the GPU and TPU implementations of kernels (their lowering, their
# presence in traced programs) on this CPU machine: kernel calls there trace every platform's
# implementation, as `nj.kernels.cross_platform()` does for a user lowering for another
# platform. Elsewhere the default holds (only the default backend's implementation traced).
_CROSS_PLATFORM_MODULES = {
    "test_lowering",
    "test_pallas",
    "test_kernels",
    "test_assembly_kernels",
    "test_assembly_accelerators",
    "test_round_trips",
}


@pytest.fixture(autouse=True)
def _cross_platform_kernels(request):
    if request.module.__name__.rsplit(".", 1)[-1] in _CROSS_PLATFORM_MODULES:
        import neurojax as nj

        with nj.kernels.cross_platform():
            yield
    else:
        yield
