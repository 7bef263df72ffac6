"""The BCOO layout: JAX's own sparse product, a reference."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float

from ..._validation import as_float, is_concrete
from ...connectivity._checks import check_conn_entries
from ._base import Layout

__all__ = ["BCOOLayout"]


class BCOOLayout(Layout):
    r"""The connectivity kept as given, a BCOO `(n_pre, n_post)`; `s @ conn` each step.

    JAX's sparse kernels serve as a reference for the other layouts: slow inside a loop
    (each step touches every synapse), 12 bytes per synapse. One delay for all synapses; no
    plasticity. Chosen by `nj.Projection(..., method="bcoo")`.

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 100, 50, 0.1, weight=0.5)
    proj = nj.Projection("A", "B", conn, method="bcoo")
    proj.layout.conn.nse == conn.nse   # True
    ```
    """

    name: ClassVar[str] = "bcoo"

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    conn: sparse.BCOO

    @classmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["BCOOLayout", np.ndarray | None]:
        """`conn` itself, its weights in the default float dtype."""
        n_pre, n_post = (int(d) for d in conn.shape)
        kept = sparse.BCOO(
            (as_float(conn.data), conn.indices),
            shape=conn.shape,
            indices_sorted=conn.indices_sorted,
            unique_indices=conn.unique_indices,
        )
        return cls(n_pre=n_pre, n_post=n_post, conn=kept), delay

    def to_bcoo(self) -> sparse.BCOO:
        """The stored BCOO itself."""
        return self.conn

    def nbytes(self) -> int:
        """Bytes of the indices and weights, 12 per synapse in float32."""
        return int(self.conn.indices.nbytes + self.conn.data.nbytes)

    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ conn` through JAX's sparse kernels (trials flattened into one product)."""
        flat = s.reshape(-1, self.n_pre)
        out = (self.conn.T @ flat.T).T
        return out.reshape(s.shape[:-1] + (self.n_post,)).astype(s.dtype)

    def check_invariants(
        self, owner: str = "BCOOLayout.check_invariants", *, thorough: bool = True
    ) -> list:
        """Every synapse inside `(n_pre, n_post)` and every concrete weight finite; traced
        indices give one flag (see `Layout.check_invariants`)."""
        conn = self.conn
        if tuple(conn.shape) != (self.n_pre, self.n_post):
            raise ValueError(
                f"{owner}: BCOOLayout: conn has shape {tuple(conn.shape)}, expected "
                f"({self.n_pre}, {self.n_post})"
            )
        if is_concrete(conn.indices) and is_concrete(conn.data):
            check_conn_entries(f"{owner}: BCOOLayout", tuple(conn.shape), conn.indices, conn.data)
            return []
        idx = conn.indices
        bad = jnp.any((idx < 0) | (idx >= jnp.asarray([self.n_pre, self.n_post], idx.dtype)))
        return [
            (
                bad,
                f"{owner}: BCOOLayout: conn.indices hold a synapse outside "
                f"({self.n_pre}, {self.n_post})",
            )
        ]
