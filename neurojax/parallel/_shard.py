r"""`shard_network`: one network partitioned along the neuron axis over the devices of a mesh.

**Partition.** Every population of `n` neurons is cut into `n_dev` contiguous blocks of
`b = ceil(n / n_dev)` neurons; device `d` holds neurons `[d b, (d + 1) b)` of every population
(so each device gets its share of excitatory and inhibitory cells alike). When `n_dev` does not
divide `n`, the population is padded to `n_dev * b` with inactive neurons at the end (on the
last devices): they are stepped like the others but their spikes are masked to zero, and no
synapse leaves or reaches them. Global arrays therefore have `n_pad = n_dev * b` entries along
the neuron axis, the real neurons first, in their global order: `x[..., :n]` drops the padding.

**Synapses.** Each device stores the INCOMING synapses of its neurons only (post-partitioned):
for every projection, the synapses whose postsynaptic neuron is local, as a compressed-row
table over the global presynaptic ids (`indptr` over all `n_pre` ids, local postsynaptic
indices, weights), in the projection's own order (ascending presynaptic id, then the
connectivity's order within a row). The projection's layout builds these tables
(`nj.network.Layout.local_tables`, an event layout per device); the tables of the devices
are padded to the longest and stacked along a leading device axis. Connectivity is thus
built once, with global ids, by the ordinary builders, and only cut here: it cannot depend on
the number of devices.

**One step** (inside `jax.shard_map`, each device on its block): the phases of
`nj.Network.step` (`neurojax.network._phases`), called with the local blocks, the local
tables, the padding mask and each spike source's `step_block`, plus the spike exchange:
1. read the ring buffers of the local postsynaptic neurons, advance the synaptic kinetics;
2. integrate the local neurons (same grouping of populations as the network);
3. exchange: the local spikes of every sending population are bit-packed into `uint32`
   words (1 bit per neuron) and all-gathered (`jax.lax.all_gather`), so that every device
   holds the spike vector of the whole network, `4 * n_dev * ceil(n_local / 32)` bytes
   (`exchange_nbytes`);
4. deliver the global spikes through the local tables into the local ring buffers with the
   event-driven kernel of `nj.Network` (`neurojax.network._propagation.deliver`), whose cost
   grows with spikes x local fan-out.

**Determinism.** The synaptic input of a postsynaptic neuron is the sum of the weights of the
spiking presynaptic neurons in ascending global presynaptic id (then connectivity order) on
every device count, which is exactly the order in which the unsharded event-driven path
(`method="event"`, the default above 65536 pairs) adds them; neuron and synapse updates are
elementwise. Spikes are therefore bit-for-bit those of the single-device
`nj.simulate(network, ...)` run and the same on any number of devices (tested on CUBA and
COBA, 1 s, 1-8 devices). Projections on the dense or BCOO paths are also delivered through
the tables here: still independent of the device count, but summed in a different order
from their unsharded matrix product (equal up to rounding). This holds on CPU, where both
the compiled kernel and XLA's scatter add in order; on GPU the pure-JAX path's scatter-add is
atomic and unordered unless XLA runs with `--xla_gpu_deterministic_ops=true`.

Randomness: initial states come from the network's own `init_state` (or any unsharded
state) laid out by `shard_state`; a `nj.PoissonSource` draws the uniform numbers of the whole
population from its key every step and each device keeps its block, the same numbers as the
unsharded run whatever the device count.

**Why a row table and not a padded fan-in (ELL) table.** An ELL table of `max_fan_in`
entries per local neuron also fixes the order, but it reads every synapse every step (CUBA:
320 000 synapses, padded to the largest fan-in, against about 180 synapse updates per step
for the event-driven path at its 5.6 Hz). The row table over the local targets keeps both
the order and the event-driven cost, and reuses the network's delivery kernel.

**Reading sharded results.** With a mesh from `jax.make_mesh` (explicit axis types), slicing
a sharded raster to a length the devices do not divide fails outside `shard_map`; take the
padding off on the host (`ShardedNetwork.to_host(rec.spikes)` or `np.asarray(x)[:, :n]`) or
with `x.at[:, :n].get(out_sharding=...)`.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._recording import count_dtype
from .._simulate import Recording, simulate
from .._validation import check_dt, check_positive_int, default_float
from ..network import Layout, Network, NetworkState, SpikeSource, _phases
from ..neurons import NeuronModel

__all__ = ["shard_network", "ShardedNetwork", "ShardedNetworkState"]

_EXCHANGES = ("bits", "bool", "none")


class ShardedNetworkState(eqx.Module):
    """State of a `ShardedNetwork`, laid out over the devices along the neuron axis.

    Attributes:
        populations: population name -> its state (e.g. `nj.LIFState`) with every per-neuron
            leaf of shape `(n_pad,)` (real neurons first, then padding), sharded along the
            neuron axis; PRNG keys (of spike sources) are replicated.
        synapses: one kinetics state per projection, leaves `(n_pad_post,)`, sharded.
        buffers: one ring buffer per sending group of populations, `(n_dev, D, W)`: device
            `d` holds the next `D` steps of arriving weight for its `W` local targets (its
            block of the postsynaptic population of every projection of the group, side by
            side). Use `ShardedNetwork.unshard_state` to read it in the network's layout.
        step: number of steps taken (int32, replicated).
    """

    populations: dict[str, Any]
    synapses: tuple[Any, ...]
    buffers: tuple[Float[Array, "dev d w"], ...]
    step: Int[Array, ""]


class _Local(eqx.Module):
    """Everything the devices read in the step: every array leaf with a dimension is split
    along its LEADING axis over the devices; scalar leaves are replicated."""

    group_models: tuple[Any, ...]  # per-neuron leaves in the group layout (see `_interleave`)
    valid: tuple[Bool[Array, " n"], ...]  # per group: real (True) or padding neuron
    synapses: tuple[Any, ...]  # kinetics per projection, per-neuron leaves (n_pad_post,)
    outputs: tuple[Any, ...]
    inputs: dict[str, Float[Array, "..."]]  # scalar or (n_pad,)
    # Per projection, the local tables of every device stacked along a leading axis (see
    # `Layout.local_tables`): rows over the global presynaptic ids, local targets.
    layouts: tuple[Layout, ...]


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key)


def _spec_of(axes: tuple[str, ...]) -> P:
    return P(axes[0] if len(axes) == 1 else axes)


def _specs(tree: Any, axes: tuple[str, ...]) -> Any:
    """Split every array with a dimension along its leading axis; replicate scalars."""
    spec = _spec_of(axes)
    return jtu.tree_map(lambda x: spec if jnp.ndim(x) >= 1 else P(), tree)


def _pad(x: jax.Array, n_pad: int) -> jax.Array:
    """Pad the last axis to `n_pad` by repeating the last entry (valid values, never NaN)."""
    n = x.shape[-1]
    if n == n_pad:
        return x
    tail = jnp.broadcast_to(x[..., -1:], x.shape[:-1] + (n_pad - n,))
    return jnp.concatenate([x, tail], axis=-1)


class ShardedNetwork(eqx.Module):
    r"""A `nj.Network` partitioned along the neuron axis over the devices of a mesh.

    Made by `nj.parallel.shard_network`; see the module docstring of
    `neurojax.parallel._shard` for the layout and why results do not depend on the device
    count. Two ways to run it:

    - `run(state, inputs=None, *, dt, n_steps)`: the whole scan inside one `jax.shard_map`
      (one collective per step, nothing else crosses devices). The fast path.
    - `step(state, ext, dt)`: one step (its own `shard_map`), so that
      `nj.simulate(sharded, state, dt=..., n_steps=...)` works as for any model; XLA then
      keeps the scan's carry sharded, at some cost per step for leaving and re-entering the
      manual region.

    Both return spikes `{name: (..., n_pad)}` sharded along the neuron axis: the first
    `sizes[name]` columns are the population's neurons in their global order.

    Attributes:
        mesh, axes: the mesh and the axis (or axes) the neurons are split over.
        n_devices: the number of devices along `axes`.
        names, sizes, padded_sizes, blocks: population names, real sizes, padded sizes and
            neurons per device.
        exchange_nbytes: bytes each device holds after the per-step all-gather of the packed
            spikes (`4 * n_devices * ceil(local sending neurons / 32)`); each device sends
            `exchange_nbytes / n_devices` of them.
    """

    # `nj.simulate` does not rerun the neurons' and layouts' constructor checks on the
    # per-device copies (stacked and padded shapes): `shard_network` built them from a
    # checked `nj.Network`.
    modules_checked_at_build: ClassVar[bool] = True

    local: _Local
    models: dict[str, Any]  # the unpadded population models, for `init_state`
    mesh: Mesh = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    n_devices: int = eqx.field(static=True)
    names: tuple[str, ...] = eqx.field(static=True)
    sizes: tuple[int, ...] = eqx.field(static=True)
    padded_sizes: tuple[int, ...] = eqx.field(static=True)
    blocks: tuple[int, ...] = eqx.field(static=True)
    groups: tuple[tuple[str, ...], ...] = eqx.field(static=True)
    sources: tuple[bool, ...] = eqx.field(static=True)  # per group: a spike source
    proj_ends: tuple[tuple[str, str], ...] = eqx.field(static=True)  # (pre, post)
    ring_of: tuple[tuple[int, int], ...] = eqx.field(static=True)  # local (ring, offset)
    ring_shape: tuple[tuple[int, int], ...] = eqx.field(static=True)  # local (D, W)
    senders: tuple[tuple[int, tuple[int, ...]], ...] = eqx.field(static=True)
    delay_steps: tuple[int, ...] = eqx.field(static=True)
    net_ring_shape: tuple[tuple[int, int], ...] = eqx.field(static=True)
    net_ring_of: tuple[tuple[int, int], ...] = eqx.field(static=True)
    synapse_of: tuple[int, ...] = eqx.field(static=True)  # as `nj.Network.synapse_of`
    dt: float | None = eqx.field(static=True)

    # ------------------------------------------------------------------ sizes

    def _index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(
                f"ShardedNetwork: no population {name!r}; populations are {list(self.names)}"
            ) from None

    def size(self, name: str) -> int:
        """Number of (real) neurons of population `name`."""
        return self.sizes[self._index(name)]

    def block(self, name: str) -> int:
        """Neurons of population `name` held by each device (padding included)."""
        return self.blocks[self._index(name)]

    def padded_size(self, name: str) -> int:
        """Length of population `name`'s sharded arrays: `n_devices * block(name)`."""
        return self.padded_sizes[self._index(name)]

    def to_host(self, spikes: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Sharded rasters `{name: (..., n_pad)}` as NumPy arrays without the padding."""
        return {name: np.asarray(x)[..., : self.size(name)] for name, x in spikes.items()}

    @property
    def _sending_groups(self) -> tuple[int, ...]:
        return tuple(gi for gi, _ in self.senders)

    @property
    def _local_sending(self) -> int:
        """Neurons per device whose spikes are exchanged (the sending groups' blocks)."""
        return sum(self.block(n) for gi in self._sending_groups for n in self.groups[gi])

    @property
    def exchange_nbytes(self) -> int:
        """Bytes of the packed spike vector every device holds after one step's all-gather
        (on a single device the step skips the collective and nothing is exchanged)."""
        return 4 * self.n_devices * (-(-self._local_sending // 32))

    @property
    def _sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, _spec_of(self.axes))

    def _reshard(self, tree: Any) -> Any:
        """Constrain `tree` to the layout `shard_map` expects (a no-op when it has it):
        leading axis split, scalars replicated. Works on traced and concrete arrays."""
        types = dict(zip(self.mesh.axis_names, self.mesh.axis_types, strict=True))
        explicit = any(types[a] == AxisType.Explicit for a in self.axes)
        split, rep = self._sharding, NamedSharding(self.mesh, P())

        def one(x):
            target = split if jnp.ndim(x) >= 1 else rep
            if explicit:  # sharding is part of the type: reshard
                return jax.sharding.reshard(x, target)
            return lax.with_sharding_constraint(x, target)

        return jtu.tree_map(one, tree)

    def _put(self, tree: Any) -> Any:
        """Lay `tree` out on the mesh: leading axis split, scalars replicated."""
        split, rep = self._sharding, NamedSharding(self.mesh, P())
        return jtu.tree_map(lambda x: jax.device_put(x, split if jnp.ndim(x) >= 1 else rep), tree)

    # ------------------------------------------------------------------ states

    def _pad_population(self, name: str, tree: Any) -> Any:
        n, n_pad = self.size(name), self.padded_size(name)

        def lay(x):
            if _is_key(x) and jnp.ndim(x) == 0:
                return x
            x = jnp.asarray(x)
            if x.shape != (n,):
                raise ValueError(
                    f"ShardedNetwork: a state leaf of population {name!r} has shape {x.shape}, "
                    f"expected ({n},) (one value per neuron; batched states are not supported: "
                    "sweep trials with nj.parallel.sweep or vmap the unsharded network)"
                )
            return _pad(x, n_pad)

        return jtu.tree_map(lay, tree)

    def shard_state(self, state: NetworkState) -> ShardedNetworkState:
        """Lay an unsharded `NetworkState` of the network out over the devices.

        The result continues exactly where `state` is: a run resumed from it equals the
        unsharded run from `state`.
        """
        if not isinstance(state, NetworkState):
            raise TypeError(
                f"ShardedNetwork.shard_state: expected an nj.NetworkState, got "
                f"{type(state).__name__}"
            )
        if set(state.populations) != set(self.names):
            raise ValueError(
                f"ShardedNetwork.shard_state: the state has populations {list(state.populations)}"
                f", the network {list(self.names)}"
            )
        if len(state.buffers) != len(self.net_ring_shape) or any(
            tuple(b.shape) != s for b, s in zip(state.buffers, self.net_ring_shape)
        ):
            raise ValueError(
                "ShardedNetwork.shard_state: the state's ring buffers have shapes "
                f"{[tuple(b.shape) for b in state.buffers]}, the network's are "
                f"{list(self.net_ring_shape)} (a batched state, or one of another network)"
            )
        pops = {n: self._pad_population(n, state.populations[n]) for n in self.names}
        synapses = tuple(
            jtu.tree_map(lambda x, post=post: self._pad_post(post, x), s)
            for s, (_, post) in zip(state.synapses, self.proj_ends, strict=True)
        )
        buffers = []
        for si, (_, idx) in enumerate(self.senders):
            buf = jnp.asarray(state.buffers[si])
            d_local = self.ring_shape[si][0]
            parts = []
            for i in idx:
                if self.synapse_of[i] != i:  # shares another projection's columns
                    continue
                post = self.proj_ends[i][1]
                off = self.net_ring_of[i][1]
                cols = _pad(buf[:, off : off + self.size(post)], self.padded_size(post))
                cols = cols.reshape(buf.shape[0], self.n_devices, self.block(post))
                parts.append(cols)
            ring = jnp.concatenate(parts, axis=-1)[:d_local]
            buffers.append(jnp.transpose(ring, (1, 0, 2)))
        new = ShardedNetworkState(pops, synapses, tuple(buffers), jnp.asarray(state.step))
        return self._put(new)

    def _pad_post(self, post: str, x: Any) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != (self.size(post),):
            raise ValueError(
                f"ShardedNetwork: a synapse state leaf onto {post!r} has shape {x.shape}, "
                f"expected ({self.size(post)},) (batched states are not supported)"
            )
        return _pad(x, self.padded_size(post))

    def unshard_state(self, state: ShardedNetworkState) -> NetworkState:
        """The same state in the unsharded network's layout (on one device), padding dropped.

        `network.step` / `nj.simulate(network, ...)` continue from it exactly.
        """
        self._check_state(state, "unshard_state")
        host = jax.device_get(state)

        def cut(name, tree):
            n = self.size(name)
            return jtu.tree_map(lambda x: x if np.ndim(x) == 0 else jnp.asarray(x[:n]), tree)

        pops = {n: cut(n, host.populations[n]) for n in self.names}
        synapses = tuple(cut(post, s) for s, (_, post) in zip(host.synapses, self.proj_ends))
        buffers = []
        for si, (_, idx) in enumerate(self.senders):
            ring = np.transpose(host.buffers[si], (1, 0, 2))  # (D, n_dev, W)
            d_net, width = self.net_ring_shape[si]
            out = np.zeros((d_net, width), ring.dtype)
            for i in idx:
                if self.synapse_of[i] != i:  # shares another projection's columns
                    continue
                post = self.proj_ends[i][1]
                off_local = self.ring_of[i][1]
                b = self.block(post)
                cols = ring[:, :, off_local : off_local + b].reshape(ring.shape[0], -1)
                off = self.net_ring_of[i][1]
                out[: ring.shape[0], off : off + self.size(post)] = cols[:, : self.size(post)]
            buffers.append(jnp.asarray(out))
        plastic = (None,) * len(self.proj_ends)
        step = jnp.asarray(host.step, jnp.int32)
        peak = tuple(jnp.zeros((), jnp.int32) for _ in self.groups)
        return NetworkState(pops, synapses, tuple(buffers), step, plastic, peak)

    def init_state(self, key: PRNGKeyArray | None = None) -> ShardedNetworkState:
        """The initial state of `nj.Network.init_state(key)`, laid out over the devices.

        The population states are drawn for the whole network (each population's sub-key is
        split in the order of the populations, as `Network.init_state` does) and then cut, so
        they do not depend on the number of devices. Synapses and ring buffers start at zero.
        """
        keys = [None] * len(self.names) if key is None else list(jr.split(key, len(self.names)))
        pops = {}
        for name, k in zip(self.names, keys, strict=True):
            model = self.models[name]
            if k is None and isinstance(model, SpikeSource):
                raise ValueError(
                    f"ShardedNetwork.init_state: population {name!r} is a spike source and needs"
                    " a key; pass key=jax.random.key(seed)"
                )
            pops[name] = self._pad_population(name, model.init_state(self.size(name), key=k))
        synapses = tuple(
            syn.init_state(self.padded_size(post))
            for syn, (_, post) in zip(self.local.synapses, self.proj_ends, strict=True)
        )
        buffers = tuple(
            jnp.zeros((self.n_devices, d, w), default_float()) for d, w in self.ring_shape
        )
        state = ShardedNetworkState(pops, synapses, buffers, jnp.zeros((), jnp.int32))
        return self._put(state)

    def _check_state(self, state: Any, owner: str) -> None:
        if not isinstance(state, ShardedNetworkState):
            raise TypeError(
                f"ShardedNetwork.{owner}: expected a ShardedNetworkState (from init_state or "
                f"shard_state), got {type(state).__name__}"
            )
        want = [(self.n_devices, d, w) for d, w in self.ring_shape]
        got = [tuple(b.shape) for b in state.buffers]
        bad = got != want or set(state.populations) != set(self.names)
        for name in self.names if not bad else ():
            for x in jtu.tree_leaves(state.populations[name]):
                if jnp.ndim(x) >= 1 and tuple(x.shape) != (self.padded_size(name),):
                    bad = True
        if bad:
            raise ValueError(
                f"ShardedNetwork.{owner}: the state does not fit this sharded network (ring "
                f"buffers {got}, expected {want} for {self.n_devices} devices); make it with "
                "this object's init_state or shard_state"
            )

    # ------------------------------------------------------------------ the local step

    def _plan(self) -> _phases.Plan:
        """The network's step structure over this device's blocks."""
        return _phases.Plan(
            groups=self.groups,
            sizes=dict(zip(self.names, self.blocks, strict=True)),
            pre=tuple(pre for pre, _ in self.proj_ends),
            post=tuple(post for _, post in self.proj_ends),
            ring_of=self.ring_of,
            senders=self.senders,
            delay_steps=self.delay_steps,
            synapse_of=self.synapse_of,
        )

    def _local_step(self, state: ShardedNetworkState, ext: Any, dt: float, exchange: str):
        """One step of this device's block (called inside `shard_map`, local shapes): the
        phases of `nj.Network.step` on the local blocks, with the spike exchange before the
        delivery."""
        plan = self._plan()
        k = state.step
        loc = self.local

        # 1. arrivals and kinetics (local targets)
        buffers, fresh, synapses, g = _phases.arrivals(
            plan, loc.synapses, state.synapses, [b[0] for b in state.buffers], k, dt
        )

        # 2. populations, group by group; padding neurons never spike
        def current(name):
            pop = state.populations[name]
            return _phases.total_current(plan, name, pop, loc.outputs, g, loc.inputs, ext, {}, None)

        def source_step(name, source, st):
            return source.step_block(
                st,
                dt,
                size=self.size(name),
                padded_size=self.padded_size(name),
                block=self.block(name),
                axis_name=self.axes,
            )

        pops, spikes, group_spikes = _phases.integrate(
            plan,
            loc.group_models,
            state.populations,
            current,
            dt,
            source_step=source_step,
            valid=loc.valid,
        )

        # 3. exchange the sending groups' spikes: every device gets the whole network's, each
        # group's in ascending global id (the order the unsharded network delivers them in)
        sending, pre_offsets = [], [0] * len(self.proj_ends)
        if self.senders:
            send = [group_spikes[gi] > 0 for gi in self._sending_groups]
            gathered = _exchange(
                jnp.concatenate(send) if len(send) > 1 else send[0], self, exchange
            )
        off_send = 0
        for gi, idx in self.senders:
            parts, start, off = [], {}, 0
            for n in self.groups[gi]:
                b = self.block(n)
                parts.append(gathered[:, off_send : off_send + b].reshape(-1))
                start[n] = off
                off += self.padded_size(n)
                off_send += b
            s_global = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
            sending.append(s_global.astype(group_spikes[gi].dtype))
            for i in idx:
                pre_offsets[i] = start[self.proj_ends[i][0]]

        # 4. delivery into the local ring buffers through the local tables
        n_proj = len(self.proj_ends)
        # A sharded plan has no capacity: every buffer holds the whole group (needs are 0).
        buffers, _ = _phases.delivery(
            plan,
            [jtu.tree_map(lambda x: x[0], lay) for lay in loc.layouts],
            buffers,
            fresh,
            sending,
            k,
            pre_offsets=pre_offsets,
            delays=[None] * n_proj,
            weights=[None] * n_proj,
        )

        new = ShardedNetworkState(pops, tuple(synapses), tuple(b[None] for b in buffers), k + 1)
        return new, spikes

    # ------------------------------------------------------------------ public stepping

    def _check_dt(self, dt: float, owner: str) -> float:
        dt = check_dt(f"ShardedNetwork.{owner}", dt)
        if self.dt is not None and not math.isclose(dt, self.dt, rel_tol=1e-9):
            raise ValueError(
                f"ShardedNetwork.{owner}: dt={dt} ms but the network was built with dt="
                f"{self.dt} ms (its delays are whole steps of that dt)"
            )
        for gi, names in enumerate(self.groups):
            if self.sources[gi]:
                self.models[names[0]].check_dt(dt)
        return dt

    def _ext(self, ext: Any, owner: str) -> Any:
        """External currents `{name: scalar or (n,)}` as arrays laid out like the neurons."""
        if ext is None:
            return None
        if not isinstance(ext, Mapping):
            raise TypeError(
                f"ShardedNetwork.{owner}: inputs must be None or a dict {{population: current}},"
                f" got {type(ext).__name__}"
            )
        out = {}
        for name, value in ext.items():
            if name not in self.names or self.sources[self._group_of(name)]:
                raise ValueError(
                    f"ShardedNetwork.{owner}: inputs name {name!r}, which is not a neuron "
                    f"population of the network ({list(self.names)})"
                )
            x = jnp.asarray(value, default_float())
            if x.ndim == 1 and x.shape[0] == 1:
                x = x.reshape(())
            if x.ndim == 1 and x.shape[0] == self.size(name):
                x = _pad(x, self.padded_size(name))
            elif x.ndim != 0 and x.shape != (self.padded_size(name),):
                raise ValueError(
                    f"ShardedNetwork.{owner}: inputs[{name!r}] must be a scalar or have shape "
                    f"({self.size(name)},), got shape {x.shape}"
                )
            out[name] = x
        return out

    def _split(self):
        """The arrays the devices read (`self.local`) and a function rebuilding `self` around
        their per-device blocks (without the unpadded `models`, which stay outside)."""
        dyn, static = eqx.partition(self.local, eqx.is_array)
        shell = dataclasses.replace(self, local=None, models={})

        def rebuild(dyn):
            return dataclasses.replace(shell, local=eqx.combine(dyn, static))

        return dyn, rebuild

    def _group_of(self, name: str) -> int:
        return next(gi for gi, g in enumerate(self.groups) if name in g)

    def step(
        self, state: ShardedNetworkState, ext: Mapping[str, Any] | None, dt: float
    ) -> tuple[ShardedNetworkState, dict[str, Float[Array, " n_pad"]]]:
        """Advance by `dt` ms (one `shard_map`); spikes `{name: (n_pad,)}`, sharded.

        `ext` is `None` or `{population: current}` with a scalar or one value per neuron
        (`(n,)` or `(n_pad,)`), added to the population's input as in `nj.Network.step`.
        """
        dt = self._check_dt(dt, "step")
        self._check_state(state, "step")
        ext = self._ext(ext, "step")
        spec = _spec_of(self.axes)
        dyn, rebuild = self._split()
        dyn, state, ext = self._reshard((dyn, state, ext))

        def body(dyn, state, ext):
            return rebuild(dyn)._local_step(state, ext, dt, "bits")

        out_specs = (_specs(state, self.axes), {n: spec for n in self.names})
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=(_specs(dyn, self.axes), _specs(state, self.axes), _specs(ext, self.axes)),
            out_specs=out_specs,
            check_vma=False,
        )(dyn, state, ext)

    def run(
        self,
        state: ShardedNetworkState,
        inputs: Mapping[str, Any] | None = None,
        *,
        dt: float,
        n_steps: int,
    ) -> tuple[ShardedNetworkState, Recording]:
        """Run `n_steps` steps of `dt` ms with the whole scan inside one `shard_map`.

        Args:
            state: from `init_state` or `shard_state`.
            inputs: `None` or constant external currents `{population: scalar or (n,)}`
                added every step (as `ext` in `nj.Network.step`).
            dt: step [ms] (the network's `dt` when it has delays).
            n_steps: number of steps.

        Returns:
            `(final_state, recording)`: `recording.spikes[name]` is a boolean raster of shape
            `(n_steps, n_pad)`, sharded along the neuron axis (its first `sizes[name]` columns
            are the population), `recording.t` the times [ms] at the end of each step,
            counted from the state's step count (a continued run keeps the clock).

        Example:
        ```python
        net, state = nj.models.cuba(jax.random.key(0))
        sharded = nj.parallel.shard_network(net, jax.make_mesh((8,), ("neurons",)))
        final, rec = sharded.run(sharded.shard_state(state), dt=0.1, n_steps=10000)
        spikes_e = np.asarray(rec.spikes["E"])[:, :3200]
        ```
        """
        dt = self._check_dt(dt, "run")
        n_steps = check_positive_int("ShardedNetwork.run", "n_steps", n_steps)
        self._check_state(state, "run")
        self._ext(inputs, "run")
        # neurojax's one run loop; it takes `fused_run` below: the whole scan in one
        # shard_map. The clock continues from the state's step count.
        final, rec = simulate(self, state, inputs, dt=dt, n_steps=n_steps)
        sources = tuple(n for n, m in self.models.items() if isinstance(m, SpikeSource))
        return final, Recording(t=rec.t, spikes=rec.spikes, values={}, sources=sources)

    def fused_run(
        self,
        state: ShardedNetworkState,
        inputs: Any,
        dt: float,
        n_rec: int,
        record_every: int,
        **options: Any,
    ) -> tuple[ShardedNetworkState, dict[str, Array]] | None:
        """`nj.simulate`'s run of a chunk: the scan of `n_rec * record_every` local steps
        inside one `shard_map` (one collective per step, no per-step dispatch). It serves
        no input or constant currents, spikes as booleans (or counts per window), no
        `record`, `check`, `checkpoint` or `truncate_backprop`; `None` for the rest, which
        `simulate` then runs as a scan over `step`."""
        if (
            options["kind"] not in ("none", "const")
            or options["record"] is not None
            or options["spike_dtype"] != "bool"
            or options["check"]
            or options["checkpoint"]
            or options["truncate_backprop"] is not None
        ):
            return None
        ext = self._ext(inputs if options["kind"] == "const" else None, "simulate")
        # The unpadded models only serve init_state: keep them out of the compiled program.
        shell = dataclasses.replace(self, models={})
        n_steps = n_rec * record_every
        final, spikes = _run(shell, state, ext, dt=dt, n_steps=n_steps, exchange="bits")
        if record_every > 1:
            counts = count_dtype(record_every)
            spikes = {
                k: s.reshape((n_rec, record_every) + s.shape[1:]).sum(axis=1, dtype=counts)
                for k, s in spikes.items()
            }
        return final, spikes


def _exchange(s: Bool[Array, " m"], net: ShardedNetwork, how: str) -> Bool[Array, "dev m"]:
    """All-gather this device's spikes: row `d` of the result holds device `d`'s."""
    n_dev = net.n_devices
    if n_dev == 1:
        return s[None]
    if how == "bool":
        return lax.all_gather(s, net.axes, tiled=False)
    m = s.shape[0]
    words = -(-m // 32)
    bits = jnp.zeros((words * 32,), jnp.uint32).at[:m].set(s.astype(jnp.uint32))
    packed = jnp.sum(
        bits.reshape(words, 32) << jnp.arange(32, dtype=jnp.uint32), axis=1, dtype=jnp.uint32
    )
    if how == "none":  # benchmark variant: same work, no communication (wrong results)
        gathered = jnp.broadcast_to(packed, (n_dev, words))
    else:
        gathered = lax.all_gather(packed, net.axes, tiled=False)
    unpacked = (gathered[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & jnp.uint32(1)
    return unpacked.reshape(n_dev, words * 32)[:, :m].astype(bool)


def _run(net: ShardedNetwork, state, ext, *, dt: float, n_steps: int, exchange: str):
    """The scan of `n_steps` local steps inside one `shard_map`. `exchange`: `"bits"` (the
    default of `run`), `"bool"` (one byte per neuron) or `"none"` (no communication, wrong
    results: the benchmark's measure of the collective's cost)."""
    if exchange not in _EXCHANGES:
        raise ValueError(f"exchange must be one of {_EXCHANGES}, got {exchange!r}")
    spec = _spec_of(net.axes)
    dyn, rebuild = net._split()
    dyn, state, ext = net._reshard((dyn, state, ext))

    def body(dyn, state, ext):
        local = rebuild(dyn)

        def one(st, _):
            st, spikes = local._local_step(st, ext, dt, exchange)
            return st, {n: s > 0 for n, s in spikes.items()}

        return lax.scan(one, state, None, length=n_steps)

    rec_spec = P(None, *spec)
    return jax.shard_map(
        body,
        mesh=net.mesh,
        in_specs=(_specs(dyn, net.axes), _specs(state, net.axes), _specs(ext, net.axes)),
        out_specs=(_specs(state, net.axes), {n: rec_spec for n in net.names}),
        check_vma=False,
    )(dyn, state, ext)


_run_jit = eqx.filter_jit(_run)


# ---------------------------------------------------------------------- construction


def _mesh_axes(mesh: Any, axis: Any) -> tuple[str, ...]:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"shard_network: mesh must be a jax.sharding.Mesh, got {type(mesh)!r}")
    if axis is None:
        return tuple(mesh.axis_names)
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    unknown = [a for a in names if a not in mesh.axis_names]
    if unknown or not names:
        raise ValueError(
            f"shard_network: axis {unknown or names} not in the mesh's axes "
            f"{tuple(mesh.axis_names)}"
        )
    return names


def _check_supported(network: Network) -> None:
    """Raise `ValueError` naming the first feature the sharded step does not implement."""
    if network.gap_junctions:
        raise ValueError(
            "shard_network: gap junctions are not supported (they need the neighbours' "
            f"voltages every step); the network has them on {list(network.gap_junctions)}"
        )
    for i, proj in enumerate(network.projections):
        where = f"projections[{i}] ({proj.pre} -> {proj.post})"
        if proj.plasticity is not None:
            raise ValueError(
                f"shard_network: plasticity is not supported; {where} has "
                f"{type(proj.plasticity).__name__}"
            )
        if getattr(proj, "short_term", None) is not None or getattr(proj, "learnable_delays", 0):
            raise ValueError(
                "shard_network: short-term plasticity and learnable delays are not supported; "
                f"{where} has {'short_term' if proj.short_term is not None else 'learnable delays'}"
            )
        if network.homogeneous_delay_steps[i] is None:
            raise ValueError(
                f"shard_network: per-synapse delays are not supported (one delay per projection "
                f"only); {where} has per-synapse delays"
            )
    for name, model in network.populations.items():
        if not isinstance(model, (NeuronModel, SpikeSource)):
            raise ValueError(
                f"shard_network: population {name!r} is a {type(model).__name__}; only neuron "
                "models (nj.NeuronModel) and spike sources (nj.network.SpikeSource, such as "
                "nj.PoissonSource) are supported"
            )
    for name, value in network.inputs.items():
        if callable(value) and not isinstance(value, jax.Array):
            raise ValueError(
                f"shard_network: time-dependent inputs (a function in network.inputs[{name!r}]) "
                "are not supported; pass currents through run(inputs=...) or step's ext"
            )


def _leaf_layout(owner: str, x: Any, n: int) -> str:
    """'scalar' or 'neuron' for a parameter leaf of a population of `n` neurons."""
    shape = tuple(jnp.shape(x))
    if shape in ((), (1,)):
        return "scalar"
    if shape == (n,):
        return "neuron"
    raise ValueError(
        f"shard_network: {owner} has a parameter of shape {shape}; only scalars and one value "
        f"per neuron ({n},) can be partitioned"
    )


def _lay_params(owner: str, module: Any, n: int, n_pad: int) -> Any:
    """Scalars stay scalars; one value per neuron is padded to `n_pad` (natural order)."""

    def lay(x):
        if not eqx.is_array(x):
            return x
        if _leaf_layout(owner, x, n) == "scalar":
            return jnp.reshape(x, ())
        return _pad(x, n_pad)

    return jtu.tree_map(lay, module)


def _interleave(parts: list[jax.Array], blocks: list[int], n_dev: int) -> jax.Array:
    """Group layout: device `d`'s slice holds block `d` of every member, side by side."""
    tiles = [p.reshape(n_dev, b) for p, b in zip(parts, blocks, strict=True)]
    return jnp.concatenate(tiles, axis=1).reshape(-1) if len(tiles) > 1 else tiles[0].reshape(-1)


def shard_network(
    network: Network, mesh: Mesh, *, axis: str | tuple[str, ...] | None = None
) -> ShardedNetwork:
    r"""Partition `network` along the neuron axis over the devices of `mesh`.

    Each device holds a contiguous block of every population (padded with inactive neurons
    when the device count does not divide a population) and the incoming synapses of its
    neurons; each step it integrates its block, all-gathers the bit-packed spikes of the
    whole network and delivers them through its synapses. Spikes are bit-for-bit those of
    `nj.simulate(network, ...)` on any number of devices (see the module docstring of
    `neurojax.parallel._shard` for the layout and the order of summation).

    Supported: neuron-model populations (`nj.LIF`, ...; populations of the same model are
    stepped together as in `nj.Network`) and `nj.PoissonSource` populations; projections with
    any synaptic kinetics and output and one delay each; constant `inputs`; external currents
    per step. Raises `ValueError`, before any work, for plasticity, gap junctions,
    per-synapse delays, time-dependent `inputs` functions and a population with fewer neurons
    than devices.

    Memory per device: the state of `ceil(n / n_dev)` neurons per population, 8 bytes per
    local incoming synapse (padded to the device with most) plus `4 (n_pre + 1)` bytes of
    row pointers per projection and device, and the gathered spike vector.

    Args:
        network: an `nj.Network`.
        mesh: a `jax.sharding.Mesh` (for example `jax.make_mesh((8,), ("neurons",))`).
        axis: the mesh axis (or axes) to split the neurons over; default all axes. Over the
            other axes of the mesh the network is replicated.

    Returns:
        A `ShardedNetwork`: `init_state(key)` or `shard_state(network_state)`, then
        `run(state, dt=..., n_steps=...)` (or `nj.simulate` over its `step`).

    Example:
    ```python
    import jax, numpy as np, neurojax as nj
    net, state = nj.models.cuba(jax.random.key(0))
    mesh = jax.make_mesh((len(jax.devices()),), ("neurons",))
    sharded = nj.parallel.shard_network(net, mesh)
    final, rec = sharded.run(sharded.shard_state(state), dt=0.1, n_steps=10000)
    np.asarray(rec.spikes["E"])[:, :3200].mean() * 1e4   # excitatory rate [Hz]
    ```
    """
    if not isinstance(network, Network):
        raise TypeError(f"shard_network: network must be an nj.Network, got {type(network)!r}")
    axes = _mesh_axes(mesh, axis)
    n_dev = int(np.prod([mesh.shape[a] for a in axes]))
    _check_supported(network)
    small = {n: s for n, s in network.sizes.items() if s < n_dev}
    if small:
        raise ValueError(
            f"shard_network: {n_dev} devices along {axes} do not fit population(s) {small}: "
            "every device must hold at least one neuron of every population; use a mesh of at "
            f"most {min(network.sizes.values())} devices"
        )

    names = tuple(network.sizes)
    sizes = tuple(network.sizes[n] for n in names)
    blocks = tuple(-(-s // n_dev) for s in sizes)
    padded = tuple(b * n_dev for b in blocks)
    size_of = dict(zip(names, sizes))
    block_of = dict(zip(names, blocks))
    pad_of = dict(zip(names, padded))
    views = network.populations

    group_models, valid, sources = [], [], []
    for names_g, model in zip(network.groups, network.group_models, strict=True):
        owner = f"population(s) {list(names_g)}"
        total = sum(size_of[n] for n in names_g)

        def lay(x, names_g=names_g, owner=owner, total=total):
            if not eqx.is_array(x):
                return x
            if _leaf_layout(owner, x, total) == "scalar":
                return jnp.reshape(x, ())
            parts, off = [], 0
            for n in names_g:
                parts.append(_pad(x[off : off + size_of[n]], pad_of[n]))
                off += size_of[n]
            return _interleave(parts, [block_of[n] for n in names_g], n_dev)

        group_models.append(jtu.tree_map(lay, model))
        masks = [jnp.arange(pad_of[n]) < size_of[n] for n in names_g]
        valid.append(_interleave(masks, [block_of[n] for n in names_g], n_dev))
        sources.append(isinstance(model, SpikeSource))

    synapses, outputs, layouts = [], [], []
    for i, proj in enumerate(network.projections):
        owner = f"projections[{i}] ({proj.pre} -> {proj.post})"
        n_post, n_pad_post = size_of[proj.post], pad_of[proj.post]
        synapses.append(_lay_params(owner, proj.synapse, n_post, n_pad_post))
        outputs.append(_lay_params(owner, proj.output, n_post, n_pad_post))
        layouts.append(proj.layout.local_tables(n_dev, block_of[proj.post], pad_of[proj.pre]))

    inputs = {}
    for name, value in network.inputs.items():
        x = jnp.asarray(value)
        inputs[name] = jnp.reshape(x, ()) if x.size == 1 else _pad(x, pad_of[name])

    # Local ring buffers: one per sending group, as in the network, over local targets;
    # projections that share columns in the network share them here too.
    ring_of, ring_shape = [None] * len(network.projections), []
    share = network.synapse_of
    for _, idx in network.senders:
        off = 0
        for i in idx:
            if share[i] != i:
                continue
            ring_of[i] = (len(ring_shape), off)
            off += block_of[network.projections[i].post]
        for i in idx:
            ring_of[i] = ring_of[share[i]]
        ring_shape.append((max(network.n_slots[i] for i in idx), off))

    local = _Local(
        group_models=tuple(group_models),
        valid=tuple(valid),
        synapses=tuple(synapses),
        outputs=tuple(outputs),
        inputs=inputs,
        layouts=tuple(layouts),
    )
    split, rep = NamedSharding(mesh, _spec_of(axes)), NamedSharding(mesh, P())
    local = jtu.tree_map(lambda x: jax.device_put(x, split if x.ndim >= 1 else rep), local)
    return ShardedNetwork(
        local=local,
        models=dict(views),
        mesh=mesh,
        axes=axes,
        n_devices=n_dev,
        names=names,
        sizes=sizes,
        padded_sizes=padded,
        blocks=blocks,
        groups=tuple(tuple(g) for g in network.groups),
        sources=tuple(sources),
        proj_ends=tuple((p.pre, p.post) for p in network.projections),
        ring_of=tuple(ring_of),
        ring_shape=tuple(ring_shape),
        senders=network.senders,
        delay_steps=tuple(int(d) for d in network.homogeneous_delay_steps),
        net_ring_shape=network.ring_shape,
        net_ring_of=network.ring_of,
        synapse_of=network.synapse_of,
        dt=network.dt,
    )
