"""The interface every storage layout of a projection's synapses implements."""

import abc
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import sparse
from jaxtyping import Array, Float

from .._propagation import arrival_slot, zeros_after

__all__ = ["Layout", "Delivery", "check_csr"]


class Delivery(NamedTuple):
    """What one projection delivers in one step, in the ring buffer of its sending group.

    The spikes handed to `Layout.deliver_group` are those of the whole sending group of
    populations; the projection's presynaptic population is `[pre_offset, pre_offset + n_pre)`
    of them, and its postsynaptic neurons own the ring's columns
    `[target_offset, target_offset + n_post)`.

    Attributes:
        layout: the projection's layout.
        pre_offset: where the presynaptic population starts in the group's spike vector.
        target_offset: where the projection's columns start in the group's ring buffer.
        delay_steps: the delay in steps when all synapses share it, else None.
        delays: per-synapse delays in steps (in the layout's synapse order), or None.
        weights: the current weights `(*batch, n_synapses)` of a plastic projection (in the
            layout's synapse order), or None to use the layout's own.
        capacity: the spikes per trial and step a layout with a bounded spike buffer handles
            (the event layout's pure-JAX path), or None for all of the group's neurons. Such
            a layout's `deliver_group` returns `(ring, needed)`, with `needed` the buffer
            each trial lacked this step (0 when it held every spike), so that the network
            can rerun with a larger one; a layout without a buffer returns the ring alone.
    """

    layout: "Layout"
    pre_offset: int
    target_offset: int
    delay_steps: int | None
    delays: jax.Array | None
    weights: jax.Array | None
    capacity: int | None = None


class Layout(eqx.Module):
    r"""How a projection stores its synapses and turns spikes into arriving weight.

    A layout is chosen once, when the projection is built (`nj.Projection(method=...)`), and
    the network only ever asks it the questions below; it never tests which layout it holds.
    A new storage scheme (procedural connectivity, blocked or quantised weights) is one new
    subclass, usable as `nj.Projection(..., method=MyLayout)`.

    A subclass implements:

    - `from_bcoo(conn, *, delay=None, plastic=False)` (class method): the layout of the
      connectivity `conn` (a 2-D BCOO whose data are the weights) and the per-synapse delays
      `delay` reordered to the layout's synapse order;
    - `to_bcoo()`: the synapses back as a BCOO `(n_pre, n_post)`;
    - `nbytes()`: bytes of the arrays it holds;
    - `product(s)`: `s @ W`, the summed weight each postsynaptic neuron receives from the 0/1
      spikes `s` `(*batch, n_pre)`.

    and may override:

    - `deliver_group(deliveries, s, step, ring, *, fresh)` (class method): add this step's
      spikes of a sending group into its ring buffer for every projection of this layout
      class in the group at once. The default adds `product` at each projection's arrival
      slot; the event layout overrides it with one compacted, scattered pass for all of them;
    - `local_tables(n_devices, block_post, n_pre_padded)`: the synapses onto each device's
      block of postsynaptic neurons for `nj.parallel.shard_network` (the default reads
      `to_bcoo()`).

    Class attributes (capabilities the projection asks before building):

    - `name`: what `nj.Projection.method` reports;
    - `per_synapse_delays`: whether synapses may have different delays;
    - `plastic`: whether the weights may be plastic (the rules of `neurojax.network._plastic`
      read the event layout's row and column tables);
    - `clears_slot`: whether `deliver_group` takes `clear=True`, asking it to zero the slot
      `step mod D` of the ring (the one the network read at the start of this step) before
      it adds anything; otherwise the network zeroes that slot before calling it. A layout
      whose delivery writes the ring through a compiled call with an aliased buffer says
      True and clears in the same call: XLA runs an update made just before such a call on
      a copy of the whole ring.

    Example:
    ```python
    class Transposed(nj.network.Layout):
        # Stores W^T; spikes reach the targets through W^T's rows.
        name: ClassVar[str] = "transposed"
        n_pre: int = eqx.field(static=True)
        n_post: int = eqx.field(static=True)
        w_t: jax.Array

        @classmethod
        def from_bcoo(cls, conn, *, delay=None, plastic=False):
            return cls(conn.shape[0], conn.shape[1], conn.todense().T), delay

        def to_bcoo(self):
            return jax.experimental.sparse.BCOO.fromdense(self.w_t.T)

        def nbytes(self):
            return int(self.w_t.nbytes)

        def product(self, s):
            return s @ self.w_t.T

    proj = nj.Projection("A", "B", conn, method=Transposed)
    ```
    """

    name: eqx.AbstractClassVar[str]
    per_synapse_delays: ClassVar[bool] = False
    plastic: ClassVar[bool] = False
    clears_slot: ClassVar[bool] = False

    n_pre: eqx.AbstractVar[int]
    n_post: eqx.AbstractVar[int]

    @classmethod
    @abc.abstractmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["Layout", np.ndarray | None]:
        """The layout of `conn` and the per-synapse `delay` (or None) in its synapse order."""

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
    ) -> tuple["Layout", np.ndarray | None]:
        """The layout of synapses given as compressed rows, and `delay` (one per synapse, in
        row order, or None) reordered to the layout's synapse order, as `from_bcoo` gives.

        Row `r` holds the synapses `indptr[r]:indptr[r + 1]` of `indices` (postsynaptic
        neurons) and `weights`: the form a connectivity builder that draws row by row makes
        without an `(nnz, 2)` index array. Checked before anything is built: `indptr` has
        `n_pre + 1` non-decreasing entries from 0 to the number of synapses, `indices` are
        integers in `[0, n_post)` and `weights` finite, one per synapse. The default builds
        a BCOO and calls `from_bcoo`; a layout that stores rows (`EventLayout`) takes them
        as they are.

        Example:
        ```python
        indptr = np.array([0, 2, 3])            # 2 presynaptic neurons
        indices = np.array([0, 2, 1], np.int32)  # their postsynaptic targets
        layout, _ = nj.network.EventLayout.from_csr(2, 3, indptr, indices, np.ones(3))
        ```
        """
        indptr, indices, weights, delay = check_csr(
            f"{cls.__name__}.from_csr", n_pre, n_post, indptr, indices, weights, delay
        )
        rows = np.repeat(np.arange(n_pre, dtype=np.int32), np.diff(indptr))
        conn = sparse.BCOO(
            (jnp.asarray(weights), jnp.asarray(np.stack([rows, indices], axis=1))),
            shape=(n_pre, n_post),
        )
        return cls.from_bcoo(conn, delay=delay)

    @abc.abstractmethod
    def to_bcoo(self) -> sparse.BCOO:
        """The synapses as a BCOO `(n_pre, n_post)` whose data are the weights."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the layout's arrays."""

    @abc.abstractmethod
    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ W`: the weight each postsynaptic neuron receives from the spikes `s`."""

    def check_invariants(
        self, owner: str = "Layout.check_invariants", *, thorough: bool = True
    ) -> list[tuple[jax.Array, str]]:
        """Check what `from_bcoo` establishes, on a layout that may not have been built by it
        (edited with `eqx.tree_at`, rebuilt by `nj.load` from a file's values).

        Concrete arrays that break an invariant raise `ValueError` naming `owner`, the layout
        and the field. Traced arrays (a layout inside the caller's `jit`) cannot be read: the
        checks a delivery needs to stay inside its arrays come back as `(bad, message)`
        pairs, `bad` a boolean scalar that is True where the invariant fails, for one
        `equinox.error_if` after the run. `thorough=False` (what `nj.simulate` asks at the
        start of a run) may skip what costs more than a pass over the arrays (a sort), as
        long as what a delivery reads stays checked; `nj.load` asks `thorough=True`. A
        layout of your own overrides it (the default checks nothing).
        """
        return []

    @classmethod
    def deliver_group(
        cls,
        deliveries: Sequence[Delivery],
        s: Float[Array, "*batch n_source"],
        step: jax.Array,
        ring: Float[Array, "*batch d w"],
        *,
        fresh: bool,
    ) -> Float[Array, "*batch d w"]:
        """Add the weight the group's spikes `s` send through each delivery into `ring`.

        `ring` `(*batch, D, W)` holds the next `D` steps of arriving weight; a spike emitted
        during `step` with a delay of `d` steps lands in slot `arrival_slot(step, d, D)`.
        With `fresh=True` the content of `ring` is taken as zeros (a one-slot ring that
        has just been read).
        """
        if fresh:
            ring = zeros_after(ring, s)
        n_slots = ring.shape[-2]
        start = (jnp.zeros((), jnp.int32),) * (ring.ndim - 2)
        for dl in deliveries:
            lay = dl.layout
            x = lay.product(s[..., dl.pre_offset : dl.pre_offset + lay.n_pre])
            at = start + (arrival_slot(step, dl.delay_steps, n_slots), jnp.int32(dl.target_offset))
            cur = lax.dynamic_slice(ring, at, ring.shape[:-2] + (1, lay.n_post))
            ring = lax.dynamic_update_slice(ring, cur + x[..., None, :], at)
        return ring

    def local_tables(self, n_devices: int, block_post: int, n_pre_padded: int) -> "Layout":
        """Per device, the compressed-row table of the synapses onto its block of
        postsynaptic neurons (`[d * block_post, (d + 1) * block_post)`), with rows over the
        global presynaptic ids `0 .. n_pre_padded - 1`, in ascending presynaptic id and then
        the order of `to_bcoo()` within a row.

        Returns an event layout whose arrays carry a leading device axis (padded to the
        device with most synapses) and whose `n_pre` is `n_pre_padded`, `n_post` is
        `block_post` and `max_fan_out` the largest over the devices: slicing device `d` out
        of every array gives that device's layout.
        """
        from ._event import EventLayout

        conn = self.to_bcoo()
        idx = np.asarray(conn.indices)
        w = np.asarray(conn.data)
        pre, post = idx[:, 0].astype(np.int64), idx[:, 1].astype(np.int64)
        if pre.size > 1 and np.any(pre[1:] < pre[:-1]):
            order = np.argsort(pre, kind="stable")  # the order of the event layout's rows
            pre, post, w = pre[order], post[order], w[order]
        dev = post // block_post
        indptrs, indices, weights, fan = [], [], [], 0
        for d in range(n_devices):
            sel = dev == d
            counts = np.bincount(pre[sel], minlength=n_pre_padded)
            fan = max(fan, int(counts.max()) if counts.size else 0)
            ptr = np.zeros(n_pre_padded + 1, np.int64)
            np.cumsum(counts, out=ptr[1:])
            indptrs.append(ptr)
            indices.append((post[sel] - d * block_post).astype(np.int32))
            weights.append(w[sel])
        nnz = max(1, max(len(x) for x in indices))
        if max(int(p[-1]) for p in indptrs) >= 2**31:
            raise ValueError("shard_network: more than 2**31 synapses per device in one projection")
        ind = np.zeros((n_devices, nnz), np.int32)
        wts = np.zeros((n_devices, nnz), w.dtype)
        for d in range(n_devices):
            ind[d, : len(indices[d])] = indices[d]
            wts[d, : len(weights[d])] = weights[d]
        return EventLayout(
            n_pre=n_pre_padded,
            n_post=block_post,
            max_fan_out=max(fan, 1),
            indptr=jnp.asarray(np.stack(indptrs).astype(np.int32)),
            indices=jnp.asarray(ind),
            weights=jnp.asarray(wts),
        )


def _count(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return int(value)


def check_csr(owner, n_pre, n_post, indptr, indices, weights, delay=None):
    """Refuse compressed rows that are not what they claim, naming the argument: returns
    `indptr` as int64, `indices` as int32, `weights` as a float array and `delay` (or None)
    as arrays, each with one entry per synapse."""
    n_pre = _count(owner, "n_pre", n_pre)
    n_post = _count(owner, "n_post", n_post)
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    weights = np.asarray(weights)
    if indptr.dtype.kind not in "iu" or indptr.shape != (n_pre + 1,):
        raise ValueError(
            f"{owner}: indptr must be n_pre + 1 = {n_pre + 1} integers, got "
            f"{indptr.dtype}{list(indptr.shape)}"
        )
    indptr = indptr.astype(np.int64, copy=False)
    nnz = int(indptr[-1])
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError(
            f"{owner}: indptr must start at 0 and never decrease (row r holds the synapses "
            f"indptr[r]:indptr[r + 1]); got first {int(indptr[0])}, and "
            f"{int(np.sum(np.diff(indptr) < 0))} decreasing step(s)"
        )
    if indices.dtype.kind not in "iu" or indices.shape != (nnz,):
        raise ValueError(
            f"{owner}: indices must be indptr[-1] = {nnz} integers, got "
            f"{indices.dtype}{list(indices.shape)}"
        )
    if nnz and (int(indices.min()) < 0 or int(indices.max()) >= n_post):
        raise ValueError(
            f"{owner}: indices must lie in [0, n_post = {n_post}), got "
            f"[{int(indices.min())}, {int(indices.max())}]"
        )
    if nnz >= 2**31:
        raise ValueError(
            f"{owner}: {nnz} synapses exceed the int32 layout (< 2**31 per projection); split "
            "the projection"
        )
    if weights.dtype.kind not in "fiu" or weights.shape != (nnz,):
        raise ValueError(
            f"{owner}: weights must be {nnz} real numbers (one per synapse), got "
            f"{weights.dtype}{list(weights.shape)}"
        )
    if not np.all(np.isfinite(weights)):
        raise ValueError(
            f"{owner}: weights must be finite, got {int(np.sum(~np.isfinite(weights)))} "
            "NaN or infinite value(s)"
        )
    if delay is not None:
        delay = np.asarray(delay)
        if delay.shape != (nnz,) or delay.dtype.kind not in "fiu":
            raise ValueError(
                f"{owner}: delay must be {nnz} real numbers (one per synapse, in row order) "
                f"or None, got {delay.dtype}{list(delay.shape)}"
            )
    return indptr, indices.astype(np.int32, copy=False), weights, delay
