"""The compressed-row layout of event-driven propagation."""

from collections.abc import Sequence
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float, Int

from ..._validation import as_float, fmt_list, is_concrete
from ...connectivity._checks import check_finite_weights, csr_problem
from ...kernels._ranges import out_of_range
from .._propagation import EventArrays, EventSpec, deliver
from ._base import Delivery, Layout, check_csr

__all__ = ["EventLayout"]


def rows_sorted(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether every row of the compressed rows lists its postsynaptic indices in ascending
    order (equal ones allowed): one vectorised pass over the synapses."""
    indices = np.asarray(indices)
    indptr = np.asarray(indptr)
    if indices.ndim != 1 or indices.shape[0] < 2:
        return indices.ndim == 1
    falls = np.flatnonzero(indices[1:] < indices[:-1]) + 1  # synapses below the one before
    if falls.size == 0:
        return True
    # a fall is allowed only where a row starts
    starts = np.zeros(indices.shape[0] + 1, bool)
    starts[np.clip(indptr, 0, indices.shape[0])] = True
    return bool(np.all(starts[falls]))


class EventLayout(Layout):
    r"""Synapses sorted by presynaptic neuron (compressed rows), delivered event by event.

    `indptr` (`n_pre + 1`, int32) delimits the rows, `indices` (int32) holds each synapse's
    postsynaptic neuron and `weights` its weight: 8 bytes per synapse. Each step only the rows
    of the neurons that spiked are read (see `neurojax.network._propagation`), so the cost
    grows with spikes x maximum fan-out, never with the number of synapses. It is the only
    built-in layout with per-synapse delays and plastic weights; for plasticity it also holds
    the synapses grouped by postsynaptic neuron (`col_ptr`, `col_syn`, `col_pre`: 8 more
    bytes per synapse) so that potentiation costs spikes x fan-in.

    Synapses keep the order of the connectivity within a row (a stable sort by presynaptic
    neuron), which fixes the order in which the arrivals at a neuron are summed. Where every
    row happens to list its targets in ascending order (`sorted_rows`, found when the layout
    is built: `nj.models.microcircuit`'s pathways, connectivity drawn row by row), the
    compiled CPU kernel splits a step's delivery between threads by target neurons, each
    thread adding straight into its own part of the ring; otherwise it gathers each thread's
    share of the synapses into bins first. Both give the same sums in the same order.

    Chosen by `nj.Projection(..., layout="event")`, and by `layout="auto"` above 65536
    (pre, post) pairs or with per-synapse delays or plasticity.

    Example:
    ```python
    conn = nj.connect.fixed_prob(jax.random.key(0), 1000, 1000, 0.02, weight=0.5)
    proj = nj.Projection("E", "E", conn, layout="event")
    proj.layout.max_fan_out, proj.nbytes()   # widest row, 8 bytes per synapse + 4004
    ```
    """

    name: ClassVar[str] = "event"
    per_synapse_delays: ClassVar[bool] = True
    plastic: ClassVar[bool] = True
    clears_slot: ClassVar[bool] = True

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    max_fan_out: int = eqx.field(static=True)
    indptr: Int[Array, " n_pre_plus_1"]
    indices: Int[Array, " nnz"]
    weights: Float[Array, " nnz"]
    col_ptr: Int[Array, " n_post_plus_1"] | None = None
    col_syn: Int[Array, " nnz"] | None = None
    col_pre: Int[Array, " nnz"] | None = None
    max_fan_in: int = eqx.field(static=True, default=0)
    sorted_rows: bool = eqx.field(static=True, default=False)

    @classmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["EventLayout", np.ndarray | None]:
        """The rows of `conn` (stable order within a row); `plastic` adds the columns."""
        n_pre, n_post = (int(d) for d in conn.shape)
        idx = np.asarray(conn.indices)
        # contiguous copies of the two columns: every pass below then reads 4 bytes per
        # synapse in order instead of strided rows of 8
        pre = np.ascontiguousarray(idx[:, 0])
        post = np.ascontiguousarray(idx[:, 1])
        if idx.shape[0] and (
            pre.min() < 0 or pre.max() >= n_pre or post.min() < 0 or post.max() >= n_post
        ):
            raise ValueError(
                f"Projection: conn has indices outside its shape {conn.shape} "
                f"(pre in [{pre.min()}, {pre.max()}], post in [{post.min()}, {post.max()}])"
            )
        weights = as_float(conn.data)
        if idx.shape[0] > 1 and np.any(pre[1:] < pre[:-1]):
            order = np.argsort(pre, kind="stable")
            pre, post = pre[order], post[order]
            weights = weights[jnp.asarray(order)]
            if delay is not None:
                delay = delay[order]
        # rows sorted: row r starts at the first entry >= r (a binary search per row, no
        # int64 copy of the rows as `np.bincount` would make)
        indptr = np.searchsorted(pre, np.arange(n_pre + 1, dtype=np.int64)).astype(np.int64)
        counts = np.diff(indptr)
        if indptr[-1] >= 2**31:
            raise ValueError(
                f"Projection: {indptr[-1]} synapses exceed the int32 layout (< 2**31 per "
                "projection); split the projection"
            )
        layout = cls(
            n_pre=n_pre,
            n_post=n_post,
            max_fan_out=int(counts.max()) if counts.size else 0,
            sorted_rows=rows_sorted(indptr, post),
            # device_put, not jnp.asarray: no program compiled per array shape.
            indptr=jax.device_put(indptr.astype(np.int32)),
            indices=jax.device_put(post.astype(np.int32, copy=False)),
            weights=weights,
        )
        return (layout.with_columns() if plastic else layout), delay

    @classmethod
    def from_csr(
        cls,
        n_pre: int,
        n_post: int,
        indptr: np.ndarray,
        indices: np.ndarray,
        weights: np.ndarray,
        *,
        delay: np.ndarray | None = None,
    ) -> tuple["EventLayout", np.ndarray | None]:
        """The compressed rows as they are (see `Layout.from_csr`; checked, no sort), and
        `delay` unchanged: this layout's synapse order is the row order."""
        indptr, indices, weights, delay = check_csr(
            "EventLayout.from_csr", n_pre, n_post, indptr, indices, weights, delay
        )
        counts = np.diff(indptr)
        layout = cls(
            n_pre=int(n_pre),
            n_post=int(n_post),
            max_fan_out=int(counts.max()) if counts.size else 0,
            sorted_rows=rows_sorted(indptr, indices),
            # device_put, not jnp.asarray: no program compiled per array shape.
            indptr=jax.device_put(indptr.astype(np.int32)),
            indices=jax.device_put(indices),
            weights=as_float(weights),
        )
        return layout, delay

    def with_columns(self) -> "EventLayout":
        """The same layout plus the synapse ids grouped by postsynaptic neuron (for STDP)."""
        post = np.asarray(self.indices)
        counts = np.diff(np.asarray(self.indptr))
        pre = np.repeat(np.arange(self.n_pre, dtype=np.int32), counts)
        order = np.argsort(post, kind="stable").astype(np.int32)
        col_counts = np.bincount(post, minlength=self.n_post)
        col_ptr = np.zeros(self.n_post + 1, np.int64)
        np.cumsum(col_counts, out=col_ptr[1:])
        return EventLayout(
            n_pre=self.n_pre,
            n_post=self.n_post,
            max_fan_out=self.max_fan_out,
            indptr=self.indptr,
            indices=self.indices,
            weights=self.weights,
            col_ptr=jnp.asarray(col_ptr.astype(np.int32)),
            col_syn=jnp.asarray(order),
            col_pre=jnp.asarray(pre[order]),
            max_fan_in=int(col_counts.max()) if col_counts.size else 0,
            sorted_rows=self.sorted_rows,
        )

    def _rows(self) -> np.ndarray:
        counts = np.diff(np.asarray(self.indptr))
        return np.repeat(np.arange(self.n_pre, dtype=np.int32), counts)

    def to_bcoo(self) -> sparse.BCOO:
        """The synapses as a BCOO `(n_pre, n_post)` in row order (its data are the
        layout's weights, so gradients flow through)."""
        idx = np.stack([self._rows(), np.asarray(self.indices)], axis=1)
        return sparse.BCOO((self.weights, jnp.asarray(idx)), shape=(self.n_pre, self.n_post))

    def nbytes(self) -> int:
        """Bytes of the rows (`8 nnz + 4 (n_pre + 1)`) and, when plastic, of the columns
        (`8 nnz + 4 (n_post + 1)`)."""
        leaves = (self.indptr, self.indices, self.weights, self.col_ptr, self.col_syn, self.col_pre)
        return int(sum(x.nbytes for x in leaves if x is not None))

    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ W` as one segment sum over all synapses (the function that the event
        delivery computes, and differentiates)."""
        rows = jnp.repeat(
            jnp.arange(self.n_pre, dtype=jnp.int32),
            self.indptr[1:] - self.indptr[:-1],
            total_repeat_length=self.indices.shape[0],
        )
        contrib = s[..., rows] * self.weights.astype(s.dtype)
        out = jnp.zeros(s.shape[:-1] + (self.n_post,), s.dtype)
        return out.at[..., self.indices].add(contrib)

    @classmethod
    def deliver_group(
        cls,
        deliveries: Sequence[Delivery],
        s: Float[Array, "*batch n_source"],
        step: jax.Array,
        ring: Float[Array, "*batch d w"],
        *,
        fresh: bool,
        clear: bool = False,
    ) -> tuple[Float[Array, "*batch d w"], jax.Array]:
        """All projections of the group in one compaction of `s` into a buffer of
        `capacity` spikes per trial and one scatter (or one call of the compiled CPU kernel),
        through `neurojax.network._propagation.deliver`: the ring and the buffer each trial
        lacked (see `Delivery.capacity`). With `clear=True` slot `step mod D` is zeroed
        first, by the compiled kernel in place (see `Layout.clears_slot`)."""
        specs, arrays = [], []
        for dl in deliveries:
            lay = dl.layout
            specs.append(
                EventSpec(
                    s.shape[-1],
                    dl.pre_offset,
                    lay.n_pre,
                    lay.n_post,
                    lay.max_fan_out,
                    ring.shape[-2],
                    dl.delay_steps,
                    ring.shape[-1],
                    dl.target_offset,
                    lay.sorted_rows,
                )
            )
            weights = lay.weights if dl.weights is None else dl.weights
            arrays.append(EventArrays(lay.indptr, lay.indices, weights, dl.delays))
        capacity = deliveries[0].capacity
        return deliver(specs, s, step, arrays, ring, fresh=fresh, capacity=capacity, clear=clear)

    def check_invariants(
        self, owner: str = "EventLayout.check_invariants", *, thorough: bool = True
    ) -> list:
        """Compressed rows over `[0, n_post)` whose widest row is `max_fan_out`, columns (when
        plastic) that are those of the rows, finite weights (see `Layout.check_invariants`).

        Traced arrays give two flags: a postsynaptic index outside `[0, n_post)` and a row
        pointer outside `[0, nnz]` (what the pure-JAX delivery would otherwise drop or read
        past, and the compiled kernel refuses)."""
        name = "EventLayout"
        arrays = (self.indptr, self.indices, self.weights, self.col_ptr, self.col_syn, self.col_pre)
        if not all(x is None or is_concrete(x) for x in arrays):
            nnz = self.indices.shape[-1]
            # over every synapse: the compiled kernel's threads share the pass on the CPU
            bad_idx = out_of_range(self.indices, 0, self.n_post)
            bad_ptr = jnp.any((self.indptr < 0) | (self.indptr > nnz))
            if self.indptr.ndim == 1 and self.indptr.shape[0] > 1:
                bad_ptr = bad_ptr | jnp.any(self.indptr[1:] < self.indptr[:-1])
                bad_ptr = bad_ptr | jnp.any(self.indptr[1:] - self.indptr[:-1] > self.max_fan_out)
            return [
                (
                    bad_idx,
                    f"{owner}: {name}: indices hold a postsynaptic index outside "
                    f"[0, {self.n_post})",
                ),
                (
                    bad_ptr,
                    f"{owner}: {name}: indptr is not a compressed-row pointer over the "
                    f"{nnz} synapses with rows of at most max_fan_out={self.max_fan_out}",
                ),
            ]
        indptr = np.asarray(self.indptr)
        indices = np.asarray(self.indices)
        weights = np.asarray(self.weights)
        if indptr.ndim == 2:  # one table per device (`local_tables`): each on its own
            for d in range(indptr.shape[0]):
                part = EventLayout(
                    n_pre=self.n_pre,
                    n_post=self.n_post,
                    max_fan_out=self.max_fan_out,
                    indptr=indptr[d],
                    indices=indices[d, : int(indptr[d, -1])],
                    weights=weights[d, : int(indptr[d, -1])],
                )
                part._check_rows(f"{owner} (device {d})", name, False, thorough)
            return []
        self._check_rows(owner, name, True, thorough)
        return []

    def _check_rows(self, owner: str, name: str, widest_is_max: bool, thorough: bool) -> None:
        indptr = np.asarray(self.indptr)
        indices = np.asarray(self.indices)
        weights = np.asarray(self.weights)
        nnz = indices.shape[0] if indices.ndim == 1 else -1
        if indices.ndim != 1 or weights.shape[-1:] != (nnz,):
            raise ValueError(
                f"{owner}: {name}: indices of shape {indices.shape} and weights of shape "
                f"{weights.shape} do not hold one entry per synapse"
            )
        why = csr_problem(indptr, self.n_pre, nnz)
        if why is not None:
            raise ValueError(f"{owner}: {name}: indptr {why} (compressed rows of {nnz} synapses)")
        if nnz and (indices.min() < 0 or indices.max() >= self.n_post):
            bad = (indices < 0) | (indices >= self.n_post)
            raise ValueError(
                f"{owner}: {name}: {int(bad.sum())} postsynaptic indices outside [0, "
                f"{self.n_post}), e.g. {fmt_list(indices[bad])}"
            )
        # Traced arrays are not checked for it (a pass over every synapse at each run's
        # start): the kernel finds a row out of order where it relies on the order (a
        # shared call) and fails; a call on one thread delivers any order correctly.
        if self.sorted_rows and not rows_sorted(indptr, indices):
            raise ValueError(
                f"{owner}: {name}: sorted_rows is True, but a row lists its postsynaptic "
                "indices out of ascending order (the compiled kernel would split its "
                "delivery by target on that promise)"
            )
        counts = np.diff(indptr.astype(np.int64))
        widest = int(counts.max()) if counts.size else 0
        if widest != self.max_fan_out and (widest_is_max or widest > self.max_fan_out):
            raise ValueError(
                f"{owner}: {name}: max_fan_out is {self.max_fan_out}, but the widest row has "
                f"{widest} synapses"
            )
        if self.col_ptr is not None:
            col_ptr = np.asarray(self.col_ptr)
            col_syn = np.asarray(self.col_syn)
            col_pre = np.asarray(self.col_pre)
            why = csr_problem(col_ptr, self.n_post, nnz)
            if why is not None:
                raise ValueError(f"{owner}: {name}: col_ptr {why}")
            if col_syn.shape != (nnz,) or col_pre.shape != (nnz,):
                same = False
            elif thorough:
                pre = np.repeat(np.arange(self.n_pre), counts)
                order = np.argsort(indices, kind="stable")
                same = np.array_equal(col_syn, order) and np.array_equal(col_pre, pre[order])
            else:  # what a delivery needs to stay inside its arrays, without a sort
                same = not nnz or (
                    col_syn.min() >= 0
                    and col_syn.max() < nnz
                    and col_pre.min() >= 0
                    and col_pre.max() < self.n_pre
                )
            if not same:
                raise ValueError(
                    f"{owner}: {name}: the columns (col_syn, col_pre) are not those of the rows "
                    "(indptr, indices)"
                )
            col_widest = int(np.diff(col_ptr.astype(np.int64)).max()) if col_ptr.size > 1 else 0
            if col_widest != self.max_fan_in:
                raise ValueError(
                    f"{owner}: {name}: max_fan_in is {self.max_fan_in}, but the widest column "
                    f"has {col_widest} synapses"
                )
        check_finite_weights(owner, name, "weights", weights)
