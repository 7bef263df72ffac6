r"""Electrical synapses (gap junctions) over sparse connectivity."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float, Int

from .._validation import as_float, check_nonnegative

__all__ = ["GapJunction"]


class GapJunction(eqx.Module):
    r"""Ohmic coupling between the membrane potentials of pairs of neurons.

    $$I_i = g \sum_j c_{ij} (v_j - v_i)$$

    where $c_{ij} = c_{ji}$ is the weight of the pair. Each stored entry `(i, j, c)` of `conn`
    couples **both** neurons (current `g c (v_j - v_i)` into `i` and the opposite into `j`), so
    give each pair once: a pair stored in both orientations is rejected, as is a neuron coupled
    to itself. The current is computed with one gather and one scatter per stored pair, so its
    cost grows with the number of pairs, not with `n^2`.

    **Time step.** In a `nj.Network` the current is computed from the potentials at the start
    of a step and held over it (explicit coupling), whatever the neuron's own scheme: the
    coupling is first-order in `dt`, and strongly coupled neurons need a `dt` well below the
    time in which the coupling alone equalises their potentials (for `dv/dt = I / C`, about
    `C / (g sum_j c_ij)`). Check a result by halving `dt`: in the Izhikevich lattice
    (notebook 07) dt = 0.5 and 0.25 ms give different spike trains at `g` = 0.1-0.2.

    Args:
        conn: `jax.experimental.sparse.BCOO` of shape `(n, n)` (for example from
            `nj.connect.distance_connect(..., allow_self=False)` keeping only `i < j`, or
            `nj.connect.from_arrays`); its data are the pair weights `c` (dimensionless).
        g: coupling conductance, >= 0 (scalar). With `v` in mV, `g` in uS gives currents in
            nA (`nj.LIF`, `nj.AdEx`); in mS/cm^2 it gives uA/cm^2 (`nj.HodgkinHuxley`).

    Example:
    ```python
    conn = nj.connect.from_arrays(jnp.array([0]), jnp.array([1]), 1.0, 2, 2)
    gap = nj.GapJunction(conn, g=0.5)
    gap.current(jnp.array([-60.0, -70.0]))   # [-5.,  5.]
    ```
    """

    pre: Int[Array, " nnz"]
    post: Int[Array, " nnz"]
    weight: Float[Array, " nnz"]
    g: Float[Array, ""]
    n: int = eqx.field(static=True)

    def __init__(self, conn: sparse.BCOO, g: float = 1.0):
        if not isinstance(conn, sparse.BCOO):
            raise TypeError(
                f"GapJunction: conn must be a jax.experimental.sparse.BCOO, got {type(conn)!r}"
            )
        if conn.ndim != 2 or conn.shape[0] != conn.shape[1]:
            raise ValueError(f"GapJunction: conn must have shape (n, n), got {conn.shape}")
        if conn.n_batch or conn.n_dense:
            raise ValueError(
                "GapJunction: conn must be a plain 2-D BCOO without batch or dense dimensions, "
                f"got n_batch={conn.n_batch}, n_dense={conn.n_dense}"
            )
        idx = np.asarray(conn.indices)
        pre, post = idx[:, 0].astype(np.int32), idx[:, 1].astype(np.int32)
        self_pairs = pre == post
        if np.any(self_pairs):
            raise ValueError(
                "GapJunction: conn couples a neuron to itself (index "
                f"{int(pre[self_pairs][0])}); a gap junction needs two distinct neurons"
            )
        n = int(conn.shape[0])
        key = np.minimum(pre, post).astype(np.int64) * n + np.maximum(pre, post)
        uniq, counts = np.unique(key, return_counts=True)
        if np.any(counts > 1):
            k = int(uniq[counts > 1][0])
            raise ValueError(
                f"GapJunction: the pair ({k // n}, {k % n}) is stored more than once (both "
                "orientations or duplicates); each stored entry couples both neurons, so give "
                "each pair once, e.g. only the entries with i < j"
            )
        self.pre = jnp.asarray(pre)
        self.post = jnp.asarray(post)
        self.weight = as_float(conn.data)
        self.g = as_float(g)
        self.n = n
        check_nonnegative("GapJunction", "g", self.g)
        if self.g.ndim:
            raise ValueError(f"GapJunction: g must be a scalar, got shape {self.g.shape}")

    def current(self, v: Float[Array, "*batch n"]) -> Float[Array, "*batch n"]:
        """The coupling current into each neuron, given membrane potentials `v` [mV]."""
        flow = (self.g * self.weight) * (v[..., self.pre] - v[..., self.post])
        out = jnp.zeros_like(v)
        return out.at[..., self.post].add(flow).at[..., self.pre].add(-flow)

    def __call__(self, v: Float[Array, "*batch n"]) -> Float[Array, "*batch n"]:
        return self.current(v)

    def dense(self) -> Float[Array, "n n"]:
        """The symmetric coupling matrix `g c` as a dense array (for small networks and tests)."""
        m = jnp.zeros((self.n, self.n), self.weight.dtype)
        m = m.at[self.pre, self.post].add(self.g * self.weight)
        return m + m.T
