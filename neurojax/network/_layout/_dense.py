"""The dense weight-matrix layout."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float, UInt8

from ..._validation import as_float, is_concrete
from ...connectivity._checks import check_finite_weights
from ._base import Layout

__all__ = ["DenseLayout"]


@jax.custom_jvp
def _on_synapses(matrix: jax.Array, packed: jax.Array) -> jax.Array:
    """`matrix` itself; its tangent (so its gradient) is kept on the synapses of the bit mask
    `packed` only."""
    return matrix


@_on_synapses.defjvp
def _on_synapses_jvp(primals, tangents):
    matrix, packed = primals
    d_matrix, _ = tangents
    mask = _unpack(packed, matrix.shape[-1])
    # `where`, not a product: a NaN or inf cotangent off the synapses is dropped too
    return matrix, jnp.where(mask, d_matrix, jnp.zeros_like(d_matrix))


def _unpack(packed: jax.Array, n_post: int) -> jax.Array:
    """The boolean `(n_pre, n_post)` mask of the bits `packed` (`jnp.packbits` along rows)."""
    return jnp.unpackbits(packed, axis=-1, count=n_post).astype(bool)


class DenseLayout(Layout):
    r"""A dense `(n_pre, n_post)` weight matrix; one matrix product per step.

    Absent synapses are zeros of `matrix`; which pairs are synapses is kept apart, as one bit
    per pair (`synapses`, the rows of `jnp.packbits`; None when every pair is a synapse), so
    that a synapse of weight 0 stays a synapse and an absent one stays absent through
    training: the gradient with respect to `matrix` is zero off the synapses (exactly, in
    every transformation: `grad`, `jacrev`, `jvp`), so an optax update leaves absent
    synapses at zero and the network keeps its connectivity. The forward product uses
    `matrix` as it is (no masking per step, nothing slower); writing nonzero values off the
    synapses by hand (`eqx.tree_at`) makes them act, but never learn.

    Costs `4 n_pre n_post` bytes (plus `n_pre ceil(n_post / 8)` for the bits) and a product
    over every pair each step, whatever the activity, so it suits small networks and
    gradient training. One delay for all synapses; no plasticity.

    Chosen by `nj.Projection(..., layout="dense")`, and by `layout="auto"` up to 65536
    (pre, post) pairs when the delay is homogeneous and the weights static.

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 100, 50, 0.1, weight=0.5)
    proj = nj.Projection("A", "B", conn, layout="dense")
    proj.layout.matrix.shape   # (100, 50)
    proj.layout.mask().sum() == conn.nse   # True: one entry per synapse
    ```
    """

    name: ClassVar[str] = "dense"

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    matrix: Float[Array, "n_pre n_post"]
    # one bit per (pre, post) pair, set on the synapses (`jnp.packbits` of each row); None:
    # every pair is a synapse
    synapses: UInt8[Array, "n_pre n_bytes"] | None = None

    @classmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["DenseLayout", np.ndarray | None]:
        """The dense matrix of `conn` (duplicate entries are summed) and the bits of its
        synapses (every stored entry is a synapse, whatever its weight)."""
        n_pre, n_post = (int(d) for d in conn.shape)
        idx = np.asarray(conn.indices)
        mask = np.zeros((n_pre, n_post), bool)
        mask[idx[:, 0], idx[:, 1]] = True
        packed = None if mask.all() else jax.device_put(np.packbits(mask, axis=-1))
        layout = cls(n_pre=n_pre, n_post=n_post, matrix=as_float(conn.todense()), synapses=packed)
        return layout, delay

    def mask(self) -> jax.Array:
        """The boolean `(n_pre, n_post)` array of the pairs that are synapses."""
        if self.synapses is None:
            return jnp.ones((self.n_pre, self.n_post), bool)
        return _unpack(self.synapses, self.n_post)

    def to_bcoo(self) -> sparse.BCOO:
        """The synapses (zero weights included) as a BCOO, in row-major order; its data are
        the matrix's entries, so gradients flow through."""
        pre, post = np.nonzero(np.asarray(self.mask()))
        idx = np.stack([pre, post], axis=1).astype(np.int32)
        data = self.matrix[jnp.asarray(pre), jnp.asarray(post)]
        return sparse.BCOO(
            (data, jnp.asarray(idx)),
            shape=(self.n_pre, self.n_post),
            indices_sorted=True,
            unique_indices=True,
        )

    def nbytes(self) -> int:
        """Bytes of the matrix, `4 n_pre n_post` in float32, and of the synapses' bits."""
        bits = 0 if self.synapses is None else int(self.synapses.nbytes)
        return int(self.matrix.nbytes) + bits

    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ matrix` at full float32 precision; the gradient reaches the synapses only."""
        matrix = self.matrix if self.synapses is None else _on_synapses(self.matrix, self.synapses)
        # Full float32 precision on every backend: JAX's default lets recent NVIDIA GPUs
        # round the weights to TF32 (a 10-bit mantissa), which would make a GPU run's
        # synaptic input differ from the CPU's by ~1e-3 relative.
        return jnp.matmul(s, matrix.astype(s.dtype), precision=jax.lax.Precision.HIGHEST)

    def check_invariants(
        self, owner: str = "DenseLayout.check_invariants", *, thorough: bool = True
    ) -> list:
        """The matrix is `(n_pre, n_post)`, its synapse bits (when stored) one bit per pair
        and its concrete weights finite (see `Layout.check_invariants`)."""
        if tuple(self.matrix.shape) != (self.n_pre, self.n_post):
            raise ValueError(
                f"{owner}: DenseLayout: matrix has shape {tuple(self.matrix.shape)}, expected "
                f"({self.n_pre}, {self.n_post})"
            )
        if self.synapses is not None:
            want = (self.n_pre, -(-self.n_post // 8))
            if tuple(self.synapses.shape) != want or self.synapses.dtype != jnp.uint8:
                raise ValueError(
                    f"{owner}: DenseLayout: synapses (the bits of which pairs are synapses) "
                    f"is {self.synapses.dtype}{list(self.synapses.shape)}, expected "
                    f"uint8{list(want)}"
                )
        if is_concrete(self.matrix):
            check_finite_weights(owner, "DenseLayout", "matrix entries", np.asarray(self.matrix))
        return []
