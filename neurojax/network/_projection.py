"""Projections: synapses from one population onto another, with kinetics, output and delays."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float, Int

from .._validation import _fmt, as_float, check_choice
from ..synapses import CurrentOutput, Delta
from ..synapses._base import SynapseDynamics, SynapseOutput
from ._plastic import check_initial_weights, check_rule

__all__ = ["Projection", "delay_steps"]

_METHODS = ("auto", "event", "dense", "bcoo")
# `method="auto"` takes the dense path up to this many (n_pre x n_post) entries.
DENSE_AUTO_MAX = 1 << 16


def delay_steps(delay_ms: Any, dt: float) -> np.ndarray:
    """Delays in ms rounded to whole steps of `dt` (half-way cases round up).

    A relative tolerance of 1e-6 absorbs the float error of `delay / dt` so that, for example,
    0.3 ms at dt = 0.1 ms is 3 steps, never 2.
    """
    ratio = np.asarray(delay_ms, np.float64) / dt
    return np.floor(ratio + 0.5 + 1e-6 * np.maximum(ratio, 1.0)).astype(np.int64)


def _check_conn(conn: Any) -> sparse.BCOO:
    if isinstance(conn, jax.core.Tracer):
        raise TypeError("Projection: conn is a traced value; build projections outside jit")
    if isinstance(conn, (np.ndarray, jax.Array, list)):
        from ..connectivity import from_dense

        try:
            return from_dense(conn)
        except (TypeError, ValueError) as err:
            raise type(err)(f"Projection: conn given as a dense matrix: {err}") from None
    if not isinstance(conn, sparse.BCOO):
        raise TypeError(
            "Projection: conn must be a jax.experimental.sparse.BCOO of shape (n_pre, n_post) "
            f"(see nj.connect) or a dense 2-D array, got {type(conn).__name__}"
        )
    if conn.ndim != 2 or conn.n_batch or conn.n_dense:
        raise ValueError(
            "Projection: conn must be a plain 2-D BCOO (n_pre, n_post) without batch or dense "
            f"dimensions, got shape {conn.shape}, n_batch={conn.n_batch}, n_dense={conn.n_dense}"
        )
    if not jnp.issubdtype(conn.indices.dtype, jnp.integer):
        raise TypeError(f"Projection: conn.indices must be integers, got {conn.indices.dtype}")
    return conn


def _csr(conn: sparse.BCOO, delay: Any):
    """CSR arrays (sorted by presynaptic neuron, stable) and the delays in the same order."""
    n_pre, n_post = (int(d) for d in conn.shape)
    idx = np.asarray(conn.indices)
    pre, post = idx[:, 0], idx[:, 1]
    if idx.shape[0] and (
        pre.min() < 0 or pre.max() >= n_pre or post.min() < 0 or post.max() >= n_post
    ):
        raise ValueError(
            f"Projection: conn has indices outside its shape {conn.shape} "
            f"(pre in [{pre.min()}, {pre.max()}], post in [{post.min()}, {post.max()}])"
        )
    weights = as_float(conn.data)
    order = None
    if idx.shape[0] > 1 and np.any(pre[1:] < pre[:-1]):
        order = np.argsort(pre, kind="stable")
        pre, post = pre[order], post[order]
        weights = weights[jnp.asarray(order)]
        if isinstance(delay, np.ndarray):
            delay = delay[order]
    counts = np.bincount(pre, minlength=n_pre)
    indptr = np.zeros(n_pre + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    if indptr[-1] >= 2**31:
        raise ValueError(
            f"Projection: {indptr[-1]} synapses exceed the int32 layout (< 2**31 per projection);"
            " split the projection"
        )
    return (
        jnp.asarray(indptr.astype(np.int32)),
        jnp.asarray(post.astype(np.int32)),
        weights,
        delay,
        int(counts.max()) if counts.size else 0,
    )


class Projection(eqx.Module):
    r"""Synapses from population `pre` onto population `post` of a `nj.Network`.

    Each spike of presynaptic neuron `i` adds the weight `w_ij` of every synapse `(i, j)` to
    the synaptic kinetics of neuron `j` after the synapse's delay; the kinetics (`synapse`) turn
    the summed arrivals into a variable `g` per postsynaptic neuron and `output` turns `g` into
    a current (`CurrentOutput`: `I = g`; `ConductanceOutput(e_rev)`: `I = g (e_rev - v)`).

    **Timing.** A spike emitted during step `k` (dated at the end of that step) with a delay of
    `d` steps reaches the kinetics at the start of step `k + 1 + d` and drives the membrane
    from that step on. `delay = 0` is therefore the shortest causal delay on the grid, the same
    order as Brian2's default schedule; a delay of `d` ms acts `round(d / dt)` steps later.

    **Propagation** (`method`):
    - `"event"`: event-driven over a compressed-row layout built here; the cost per step grows
      with spikes x maximum fan-out, never with the number of synapses (see
      `neurojax.network._propagation`). 8 bytes per synapse, plus the delay when it varies.
    - `"dense"`: a dense `(n_pre, n_post)` weight matrix and one matrix product per step, for
      small networks and gradient training; homogeneous delay only.
    - `"bcoo"`: `spikes @ conn` with JAX's BCOO kernels; a reference, slow in a loop.
    - `"auto"` (default): `"dense"` when `n_pre * n_post <= 65536` and the delay is
      homogeneous, else `"event"`.
    All paths deliver the same values and, through `jax.grad`, the same gradients.

    Args:
        pre: name of the presynaptic population in the network.
        post: name of the postsynaptic population.
        conn: `jax.experimental.sparse.BCOO` of shape `(n_pre, n_post)` whose data are the
            weights (see `nj.connect`), or a dense `(n_pre, n_post)` array (nonzero entries are
            synapses). Weights carry the unit of `g` (nA for current synapses on `nj.LIF`,
            uS, or units of the leak conductance with `r_m = 1` as in `nj.models.coba`).
        synapse: kinetics, an `nj.Exponential`, `nj.Alpha`, `nj.DualExponential` or
            `nj.Delta` (default: `nj.Delta()`, each spike acts during one step).
        output: `nj.CurrentOutput()` (default) or `nj.ConductanceOutput(e_rev)`.
        delay: transmission delay [ms], >= 0: a scalar, or one value per synapse in the order
            of `conn`'s stored entries. Rounded to whole steps of the network's `dt`.
        plasticity: `None` (static weights) or an `nj.STDP` rule: the weights then live in the
            network state and change inside the simulation (needs the event path and one delay
            for all synapses; initial weights must lie within the rule's bounds). A plastic
            projection also stores its synapses by postsynaptic neuron (8 more bytes per
            synapse) so that potentiation costs spikes x fan-in.
        method: `"auto"`, `"event"`, `"dense"` or `"bcoo"` (see Propagation).

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 3200, 4000, 0.02, weight=0.6)
    exc = nj.Projection("E", "all", conn, synapse=nj.Exponential(5.0),
                        output=nj.ConductanceOutput(0.0))
    ```
    """

    pre: str = eqx.field(static=True)
    post: str = eqx.field(static=True)
    synapse: SynapseDynamics
    output: SynapseOutput
    method: str = eqx.field(static=True)
    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    n_synapses: int = eqx.field(static=True)
    max_fan_out: int = eqx.field(static=True)
    delay: float | Float[Array, " nnz"] | None  # ms: static float, or per synapse (CSR order)
    max_delay: float = eqx.field(static=True)
    indptr: Int[Array, " n_pre_plus_1"] | None
    indices: Int[Array, " nnz"] | None
    weights: Float[Array, " nnz"] | None
    matrix: Float[Array, "n_pre n_post"] | None
    conn_bcoo: sparse.BCOO | None
    plasticity: Any
    col_ptr: Int[Array, " n_post_plus_1"] | None
    col_syn: Int[Array, " nnz"] | None
    col_pre: Int[Array, " nnz"] | None
    max_fan_in: int = eqx.field(static=True)

    def __init__(
        self,
        pre: str,
        post: str,
        conn: Any,
        synapse: SynapseDynamics | None = None,
        output: SynapseOutput | None = None,
        delay: Any = 0.0,
        plasticity: Any = None,
        *,
        method: str = "auto",
    ):
        for name, value in (("pre", pre), ("post", post)):
            if not isinstance(value, str) or not value:
                raise TypeError(
                    f"Projection: {name} must be the name (a non-empty str) of a population, "
                    f"got {value!r}"
                )
        synapse = Delta() if synapse is None else synapse
        output = CurrentOutput() if output is None else output
        if not isinstance(synapse, SynapseDynamics):
            raise TypeError(
                "Projection: synapse must be nj.Exponential, nj.Alpha, nj.DualExponential, "
                f"nj.Delta or another SynapseDynamics, got {type(synapse).__name__}"
            )
        if not isinstance(output, SynapseOutput):
            raise TypeError(
                "Projection: output must be nj.CurrentOutput() or nj.ConductanceOutput(e_rev), "
                f"got {type(output).__name__}"
            )
        check_rule("Projection", plasticity)
        check_choice("Projection", "method", method, _METHODS)
        if plasticity is not None and method not in ("auto", "event"):
            raise ValueError(
                f"Projection: plastic weights need method='event' (or 'auto'), got {method!r}"
            )
        conn = _check_conn(conn)
        n_pre, n_post = (int(d) for d in conn.shape)
        nnz = int(conn.nse)

        if isinstance(delay, jax.core.Tracer):
            raise TypeError("Projection: delay is a traced value; build projections outside jit")
        d = np.asarray(delay, np.float64) if not isinstance(delay, bool) else None
        if d is None or d.dtype.kind not in "fiu":
            raise TypeError(
                f"Projection: delay must be a real number or array in ms, got {delay!r}"
            )
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            bad = d[~(np.isfinite(d) & (d >= 0))] if d.ndim else d
            raise ValueError(f"Projection: delay must be finite and >= 0 ms, got {_fmt(bad)}")
        if d.ndim == 0 or (d.size and np.all(d == d.reshape(-1)[0]) and d.shape == (nnz,)):
            homogeneous = float(d.reshape(-1)[0]) if d.size else 0.0
            d_arr = None
        elif d.shape == (nnz,):
            homogeneous, d_arr = None, d
        else:
            raise ValueError(
                f"Projection: delay must be a scalar or have one value per synapse, shape "
                f"({nnz},), got shape {d.shape}"
            )
        if plasticity is not None and d_arr is not None:
            raise ValueError(
                "Projection: a plastic projection needs one delay for all its synapses (the "
                "presynaptic spike reaches every synapse at the same time); got per-synapse "
                "delays"
            )
        if method == "auto":
            dense_ok = n_pre * n_post <= DENSE_AUTO_MAX and d_arr is None and plasticity is None
            method = "dense" if dense_ok else "event"
        if method in ("dense", "bcoo") and d_arr is not None:
            raise ValueError(
                f"Projection: method={method!r} needs one delay for all synapses; per-synapse "
                "delays need method='event' (or 'auto')"
            )

        self.pre, self.post = pre, post
        self.synapse, self.output = synapse, output
        self.method = method
        self.n_pre, self.n_post, self.n_synapses = n_pre, n_post, nnz
        self.max_delay = float(d.max()) if d.size else 0.0
        self.indptr = self.indices = self.weights = self.matrix = self.conn_bcoo = None
        self.max_fan_out = self.max_fan_in = 0
        self.col_ptr = self.col_syn = self.col_pre = None
        self.plasticity = plasticity
        if method == "event":
            indptr, indices, weights, d_arr, fmax = _csr(conn, d_arr)
            self.indptr, self.indices, self.weights = indptr, indices, weights
            self.max_fan_out = fmax
            if plasticity is not None:
                check_initial_weights("Projection", plasticity, weights)
                self._build_columns()
        elif method == "dense":
            self.matrix = as_float(conn.todense())
        else:
            self.conn_bcoo = sparse.BCOO(
                (as_float(conn.data), conn.indices),
                shape=conn.shape,
                indices_sorted=conn.indices_sorted,
                unique_indices=conn.unique_indices,
            )
        self.delay = homogeneous if d_arr is None else jnp.asarray(d_arr, jnp.float32)

    def _build_columns(self) -> None:
        """The CSC view used by plasticity: synapse ids grouped by postsynaptic neuron."""
        post = np.asarray(self.indices)
        counts = np.diff(np.asarray(self.indptr))
        pre = np.repeat(np.arange(self.n_pre, dtype=np.int32), counts)
        order = np.argsort(post, kind="stable").astype(np.int32)
        col_counts = np.bincount(post, minlength=self.n_post)
        col_ptr = np.zeros(self.n_post + 1, np.int64)
        np.cumsum(col_counts, out=col_ptr[1:])
        self.col_ptr = jnp.asarray(col_ptr.astype(np.int32))
        self.col_syn = jnp.asarray(order)
        self.col_pre = jnp.asarray(pre[order])
        self.max_fan_in = int(col_counts.max()) if col_counts.size else 0

    @property
    def conn(self) -> sparse.BCOO:
        """The synapses as a BCOO `(n_pre, n_post)` (rebuilt from the internal layout)."""
        if self.conn_bcoo is not None:
            return self.conn_bcoo
        if self.matrix is not None:
            return sparse.BCOO.fromdense(self.matrix)
        counts = np.diff(np.asarray(self.indptr))
        pre = np.repeat(np.arange(self.n_pre, dtype=np.int32), counts)
        idx = np.stack([pre, np.asarray(self.indices)], axis=1)
        return sparse.BCOO((self.weights, jnp.asarray(idx)), shape=(self.n_pre, self.n_post))

    def nbytes(self) -> int:
        """Bytes held by the synapse arrays of this projection (layout, weights, delays)."""
        leaves = [self.indptr, self.indices, self.weights, self.matrix]
        leaves += [self.col_ptr, self.col_syn, self.col_pre]
        if self.conn_bcoo is not None:
            leaves += [self.conn_bcoo.indices, self.conn_bcoo.data]
        if isinstance(self.delay, jax.Array):
            leaves.append(self.delay)
        return int(sum(x.nbytes for x in leaves if x is not None))

    def deliver_dense(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ W` through the dense or BCOO path (homogeneous delay)."""
        if self.matrix is not None:
            # Full float32 precision on every backend: JAX's default lets recent NVIDIA GPUs
            # round the weights to TF32 (a 10-bit mantissa), which would make a GPU run's
            # synaptic input differ from the CPU's by ~1e-3 relative.
            return jnp.matmul(s, self.matrix.astype(s.dtype), precision=jax.lax.Precision.HIGHEST)
        flat = s.reshape(-1, self.n_pre)
        out = (self.conn_bcoo.T @ flat.T).T
        return out.reshape(s.shape[:-1] + (self.n_post,)).astype(s.dtype)
