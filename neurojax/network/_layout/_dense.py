"""The dense weight-matrix layout."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float

from ..._validation import as_float, is_concrete
from ...connectivity._checks import check_finite_weights
from ._base import Layout

__all__ = ["DenseLayout"]


class DenseLayout(Layout):
    r"""A dense `(n_pre, n_post)` weight matrix; one matrix product per step.

    Absent synapses are zeros. Costs `4 n_pre n_post` bytes and a product over every pair each
    step, whatever the activity, so it suits small networks and gradient training (the
    gradient with respect to `matrix` is the dense `(n_pre, n_post)` array). One delay for
    all synapses; no plasticity.

    Chosen by `nj.Projection(..., method="dense")`, and by `method="auto"` up to 65536
    (pre, post) pairs when the delay is homogeneous and the weights static.

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 100, 50, 0.1, weight=0.5)
    proj = nj.Projection("A", "B", conn, method="dense")
    proj.layout.matrix.shape   # (100, 50)
    ```
    """

    name: ClassVar[str] = "dense"

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    matrix: Float[Array, "n_pre n_post"]

    @classmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["DenseLayout", np.ndarray | None]:
        """The dense matrix of `conn` (duplicate entries are summed)."""
        n_pre, n_post = (int(d) for d in conn.shape)
        return cls(n_pre=n_pre, n_post=n_post, matrix=as_float(conn.todense())), delay

    def to_bcoo(self) -> sparse.BCOO:
        """The nonzero entries of the matrix as a BCOO, in row-major order."""
        return sparse.BCOO.fromdense(self.matrix)

    def nbytes(self) -> int:
        """Bytes of the matrix, `4 n_pre n_post` in float32."""
        return int(self.matrix.nbytes)

    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ matrix` at full float32 precision."""
        # Full float32 precision on every backend: JAX's default lets recent NVIDIA GPUs
        # round the weights to TF32 (a 10-bit mantissa), which would make a GPU run's
        # synaptic input differ from the CPU's by ~1e-3 relative.
        return jnp.matmul(s, self.matrix.astype(s.dtype), precision=jax.lax.Precision.HIGHEST)

    def check_invariants(
        self, owner: str = "DenseLayout.check_invariants", *, thorough: bool = True
    ) -> list:
        """The matrix is `(n_pre, n_post)` and its concrete weights finite (see
        `Layout.check_invariants`)."""
        if tuple(self.matrix.shape) != (self.n_pre, self.n_post):
            raise ValueError(
                f"{owner}: DenseLayout: matrix has shape {tuple(self.matrix.shape)}, expected "
                f"({self.n_pre}, {self.n_post})"
            )
        if is_concrete(self.matrix):
            check_finite_weights(owner, "DenseLayout", "matrix entries", np.asarray(self.matrix))
        return []
