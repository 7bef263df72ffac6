r"""The procedural layout: no synapses kept, each spiking neuron's row regenerated.

A projection built from a procedural description (`nj.connect.procedural`) stores, instead
of its synapses, the description (a key, one int32 per presynaptic neuron, the parameters of
the weight and delay distributions, positions for the distance rule). When neuron `i` spikes,
its row (targets, weights, delays) is drawn again from keys folded with `i`; memory grows with
the neurons, never with the synapses (Knight and Nowotny 2021).

**One step.** Per projection, a running count of its presynaptic population's spikes
(one cumulative sum) locates the `k`-th spike by binary search, chunk by chunk: first chunks
of about 2^14 synapses (rows x `max_fan_out`), then the remainder in chunks 16 times smaller,
inside `lax.while_loop`s that stop after the last spike. The work grows with spikes x fan-out
(at most a small chunk of empty rows per step; XLA's CPU scatter pays for every entry, dropped
or not) and an idle step costs the cumulative sum. Each chunk regenerates its rows and
scatter-adds `spike * w` into the ring at `(arrival slot, target)`, in the order (ascending
neuron, then the row's generation order) that `to_bcoo()` lists them: a stored projection
built from `Procedural.stored()` delivers the same values, bit for bit.

**Kernel entry `procedural_deliver`.** Its reference handles at most the network's spike
capacity per trial and step (`Delivery.capacity`) and reports what a step lacked, the
machinery of the event layout (`nj.Network.fit_capacity`): a GPU or TPU step keeps static
shapes and never waits on the host. GPU and TPU run the reference. Its CPU slot is a C++
kernel (`neurojax/kernels/procedural.cc`, FFI target `nj_procedural_deliver`) that takes
every spike and never needs a larger buffer: one call for the consecutive projections of a
group it supports, which regenerates each spiking neuron's row (threefry row key and words,
Feistel permutation with cycle walking or `fixed_total`'s uniform targets, the draws) and adds
`spike * w` into the ring in the reference's order. It supports `fixed_prob` and
`fixed_total` descriptions on one device with scalar, uniform or normal weights and no,
uniform or normal delays, in float32 (`_native`); a lognormal weight or delay, the distance
rule (its `exp`), a device's share of a sharded projection (`post_start`) or float64 stay on
the XLA walk (`_walk` over every spike), called in the group's order between the kernel's
calls. Exactness against the XLA walk (`tests/test_procedural_kernel.py`): targets, slots and
scalar or uniform weights are identical; normal draws go through XLA's own `log`/`log1p` on
one side and Cephes' `log` in C++ on the other, so a normal weight may differ by float32
rounding (a few ulps, relative to the distribution's scale) and, over all 2^24 uniforms, a
handful of delays (14 for the microcircuit's excitatory delay distribution, 4 for its
inhibitory one, 2 for a uniform delay) round to the neighbouring step. The entry's stated
tolerance is therefore `rtol=1e-5`. Where every projection runs in C++, the reference that
`lax.platform_dependent` traces but a CPU backend never runs is replaced by the CPU slot
(`_reference`): tracing the row generators cost most of the microcircuit's compilation.

**Gradients** are those of the same delivery written over every row (a `lax.scan` over
blocks of rows, built only under differentiation): with respect to the spikes of every
presynaptic neuron (surrogate gradients) and to the parameters of the weight distribution.

**Sharding** (`nj.parallel.shard_network`): each device keeps the description and the start
of its block of postsynaptic neurons, regenerates the rows of every spike it receives and
keeps the targets in its block (`local_tables`); memory per device stays O(neurons), the
work of generating a row is repeated on every device.
"""

import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.experimental import sparse
from jax.scipy.special import ndtr
from jaxtyping import Array, Float, Int

from ..._validation import default_float, fmt_list, is_concrete
from ...connectivity._procedural import Procedural, threefry_rows
from ...connectivity._weights import Distribution, Normal, Uniform
from ...kernels import Example, Sequential, call, implementations, register
from ...kernels import Kernel as _Kernel
from ...kernels._config import cross_platform_enabled
from .._propagation import arrival_slot, capacity_for, needed
from ._base import Delivery, Layout

__all__ = ["ProceduralLayout", "procedural_parts"]

_CHUNK_SYNAPSES = 1 << 14


class ProceduralLayout(Layout):
    r"""A projection whose synapses are regenerated from a procedural description.

    Built by `nj.Projection(pre, post, desc)` with `desc` from `nj.connect.procedural`
    (`fixed_prob`, `fixed_total`, `distance`); `method` is then `"procedural"` (or `"auto"`).
    Keeps `desc.nbytes()` bytes (about 4 per presynaptic neuron). Per-synapse delays come from
    the description; weights are static: a plastic projection needs stored synapses
    (`method="event"`), and a procedural one refuses `plasticity=`.

    `to_bcoo()` regenerates every synapse (O(synapses)), for inspection;
    `conn.stored()` gives the BCOO and per-synapse delays of the equivalent stored projection.

    Example:
    ```python
    desc = nj.connect.procedural.fixed_prob(jax.random.key(0), 3200, 4000, 0.02, weight=0.6)
    proj = nj.Projection("E", "all", desc, synapse=nj.Exponential(5.0))
    proj.method, proj.nbytes()   # "procedural", 12812 (4 bytes per presynaptic neuron + key)
    ```
    """

    name: ClassVar[str] = "procedural"
    per_synapse_delays: ClassVar[bool] = True
    plastic: ClassVar[bool] = False

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    conn: Procedural
    post_start: Int[Array, ""] | None = None

    @classmethod
    def from_bcoo(
        cls, conn: sparse.BCOO, *, delay: np.ndarray | None = None, plastic: bool = False
    ) -> tuple["ProceduralLayout", np.ndarray | None]:
        """Refused: a stored connectivity has nothing to regenerate."""
        raise ValueError(
            "Projection: method='procedural' needs a procedural description from "
            "nj.connect.procedural (fixed_prob, fixed_total, distance) as conn, got a stored "
            "BCOO; use method='event' for stored synapses"
        )

    @classmethod
    def from_procedural(cls, conn: Procedural) -> "ProceduralLayout":
        """The layout of the description `conn`."""
        return cls(n_pre=conn.n_pre, n_post=conn.n_post, conn=conn)

    @property
    def max_fan_out(self) -> int:
        """Entries generated per spike (the longest row; candidates for the distance rule)."""
        return self.conn.max_fan_out

    def to_bcoo(self) -> sparse.BCOO:
        """Every synapse, regenerated (see `Procedural.to_bcoo`)."""
        if self.post_start is not None:
            raise ValueError("ProceduralLayout.to_bcoo: not available on one device's share")
        return self.conn.to_bcoo()

    def nbytes(self) -> int:
        """Bytes of the description's arrays (no synapse is stored)."""
        return self.conn.nbytes()

    def product(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ W` over every regenerated row (the delays are not applied)."""
        ring = jnp.zeros(s.shape[:-1] + (1, self.n_post), s.dtype)
        spec = (self.n_pre, 0, self.n_pre, self.n_post, 1, 0, self.n_post, 0)
        out, _ = _dense(
            s,
            jnp.zeros((), jnp.int32),
            ring,
            (self._leaves(),),
            specs=(spec,),
            treedefs=(self._treedef(),),
            fresh=True,
            capacity=None,
            ignore_delays=True,
        )
        return out[..., 0, :]

    def _leaves(self):
        return tuple(jtu.tree_leaves(self._view()))

    def _treedef(self):
        return jtu.tree_structure(self._view())

    def _view(self):
        return (self.conn, self.post_start)

    def check_invariants(
        self, owner: str = "ProceduralLayout.check_invariants", *, thorough: bool = True
    ) -> list:
        """The description's row lengths: `counts` of shape `(n_pre,)`, each in
        `[0, max_fan_out]` (the rows the delivery regenerates are `max_fan_out` wide, and a
        longer one would be cut short on the pure-JAX path), the longest `max_fan_out`, and
        for `fixed_prob`/`fixed_total` summing to `n_synapses` (see
        `Layout.check_invariants`). Traced counts give one flag."""
        conn = self.conn
        counts = conn.counts
        if counts.shape[-1:] != (conn.n_pre,):
            raise ValueError(
                f"{owner}: ProceduralLayout: conn.counts has shape {tuple(counts.shape)}, "
                f"expected ({conn.n_pre},), one row length per presynaptic neuron"
            )
        if not is_concrete(counts):
            bad = jnp.any((counts < 0) | (counts > conn.max_fan_out))
            return [
                (
                    bad,
                    f"{owner}: ProceduralLayout: conn.counts holds a row length outside "
                    f"[0, max_fan_out={conn.max_fan_out}]",
                )
            ]
        c = np.asarray(counts).astype(np.int64)
        if c.size and (c.min() < 0 or c.max() > conn.max_fan_out):
            bad = (c < 0) | (c > conn.max_fan_out)
            raise ValueError(
                f"{owner}: ProceduralLayout: conn.counts holds {int(bad.sum())} row length(s) "
                f"outside [0, max_fan_out={conn.max_fan_out}], e.g. {fmt_list(c[bad])} (first "
                f"at presynaptic neuron {int(np.argmax(bad))})"
            )
        if c.ndim == 1 and c.size and int(c.max()) != conn.max_fan_out:
            raise ValueError(
                f"{owner}: ProceduralLayout: max_fan_out is {conn.max_fan_out}, but the longest "
                f"row of conn.counts has {int(c.max())} synapses"
            )
        if c.ndim == 1 and conn.rule != "distance" and int(c.sum()) != conn.n_synapses:
            raise ValueError(
                f"{owner}: ProceduralLayout: conn.counts sums to {int(c.sum())} synapses, but "
                f"n_synapses is {conn.n_synapses}"
            )
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
    ) -> tuple[Float[Array, "*batch d w"], jax.Array]:
        """Every procedural projection of the group in one compaction of `s` and one walk
        over its spikes (kernel entry `procedural_deliver`): the ring and the buffer each
        trial lacked (see `Delivery.capacity`)."""
        specs, leaves, treedefs = [], [], []
        for dl in deliveries:
            lay = dl.layout
            if dl.weights is not None or dl.delays is not None:
                raise ValueError(
                    "ProceduralLayout: a procedural projection has neither plastic weights nor "
                    "stored per-synapse delays"
                )
            own = lay.conn.delay is not None
            if own and dl.delay_steps != lay.conn.max_delay_steps:
                raise ValueError(
                    f"ProceduralLayout: the projection's delays were drawn for dt = "
                    f"{lay.conn.dt} ms (up to {lay.conn.max_delay_steps} steps) but the network "
                    f"gives {dl.delay_steps} steps for its longest delay: build the description "
                    "with the network's dt"
                )
            specs.append(
                (
                    s.shape[-1],
                    dl.pre_offset,
                    lay.n_pre,
                    lay.n_post,
                    ring.shape[-2],
                    -1 if own else int(dl.delay_steps or 0),
                    ring.shape[-1],
                    dl.target_offset,
                )
            )
            leaves.append(lay._leaves())
            treedefs.append(lay._treedef())
        cap = deliveries[0].capacity
        cap = None if cap is None else capacity_for(cap, s.shape[-1])
        if cap is not None and cap >= s.shape[-1]:
            cap = None
        return call(
            DELIVER,
            s,
            step,
            ring,
            tuple(leaves),
            specs=tuple(specs),
            treedefs=tuple(treedefs),
            fresh=bool(fresh),
            capacity=cap,
        )

    def local_tables(self, n_devices: int, block_post: int, n_pre_padded: int) -> "Layout":
        """Per device, this description (replicated) and the start of the device's block of
        postsynaptic neurons: the device regenerates each spiking neuron's row and keeps the
        targets in `[d * block_post, (d + 1) * block_post)`."""
        conn = jtu.tree_map(lambda x: jnp.broadcast_to(x, (n_devices,) + x.shape), self.conn)
        starts = jnp.arange(n_devices, dtype=jnp.int32) * block_post
        return ProceduralLayout(n_pre=n_pre_padded, n_post=block_post, conn=conn, post_start=starts)


def procedural_parts(
    owner: str, conn: Procedural, delay: Any, plasticity: Any, method: Any
) -> tuple[ProceduralLayout, float]:
    """The layout of a projection built from a procedural description and its delay [ms]
    (the projection's scalar, or the longest drawn delay, which sizes the ring buffer)."""
    if plasticity is not None:
        raise ValueError(
            f"{owner}: a procedural projection cannot be plastic: its weights are regenerated "
            "at every spike, so a learned weight has nowhere to live; build it stored (pass "
            "desc.to_bcoo(), method='event') to make it plastic"
        )
    if not (method == "auto" or method == "procedural" or method is ProceduralLayout):
        raise ValueError(
            f"{owner}: conn is a procedural description, which needs method='procedural' (or "
            f"'auto'), got method={method!r}; for a stored layout pass desc.to_bcoo()"
        )
    if isinstance(delay, jax.core.Tracer):
        raise TypeError(f"{owner}: delay is a traced value; build projections outside jit")
    d = np.asarray(delay, np.float64) if not isinstance(delay, bool) else None
    if d is None or d.dtype.kind not in "fiu" or d.ndim != 0:
        raise TypeError(
            f"{owner}: with a procedural conn, delay must be a real scalar in ms (per-synapse "
            f"delays come from the description's delay distribution), got {delay!r}"
        )
    if not (math.isfinite(float(d)) and float(d) >= 0):
        raise ValueError(f"{owner}: delay must be finite and >= 0 ms, got {float(d)!r}")
    if conn.delay is not None:
        if float(d) != 0.0:
            raise ValueError(
                f"{owner}: the procedural description draws its own delays; leave delay at 0, "
                f"got {float(d)!r}"
            )
        return ProceduralLayout.from_procedural(conn), conn.max_delay
    return ProceduralLayout.from_procedural(conn), float(d)


# ---------------------------------------------------------------------- the kernel entry


def _conns(leaves, treedefs):
    return [jtu.tree_unflatten(td, list(lv)) for td, lv in zip(treedefs, leaves, strict=True)]


def _rows(conn, post_start, n_post_local, ids):
    """Rows of `ids` (valid only below the description's n_pre), restricted to the targets
    `[post_start, post_start + n_post_local)` on one device's share."""
    inside = ids < conn.n_pre
    post, w, steps, ok = conn.rows(jnp.minimum(ids, conn.n_pre - 1))
    ok = ok & inside[:, None]
    if post_start is not None:
        local = post - post_start
        ok = ok & (local >= 0) & (local < n_post_local)
        post = jnp.clip(local, 0, n_post_local - 1)
    return post, w, steps, ok


def _targets(spec, step, trial, post, steps, ok, oob, ignore_delays=False):
    _, _, _, _, n_slots, delay_steps, n_targets, target_offset = spec
    if ignore_delays or steps is None:
        d = 0 if ignore_delays else delay_steps
    else:
        d = steps
    slot = arrival_slot(step, d, n_slots)
    target = (trial * n_slots + slot) * n_targets + target_offset + post
    return jnp.where(ok, target, oob)


def _walk(s, step, ring, leaves, *, specs, treedefs, fresh, capacity, every):
    n_source = s.shape[-1]
    batch = s.shape[:-1]
    s_rows = s.reshape(-1, n_source)
    n_trials = s_rows.shape[0]
    flat = (jnp.zeros_like(ring) if fresh else ring).reshape(-1)
    oob = flat.shape[0]
    mask = s_rows > 0
    count = jnp.sum(mask, axis=-1, dtype=jnp.int32)
    size = n_source if every else capacity_for(capacity, n_source)
    trial = jnp.arange(n_trials, dtype=jnp.int32)[:, None]
    # Each projection compacts the spikes of its own presynaptic population, so that no row
    # is generated for a spike of another population of the group.
    for spec, (conn, start) in zip(specs, _conns(leaves, treedefs), strict=True):
        _, pre_offset, n_pre, n_post, *_ = spec
        sub = mask[:, pre_offset : pre_offset + n_pre]
        sub_size = min(size, n_pre)
        # The k-th spike of a trial is where the running count first reaches k + 1: found by
        # a binary search per chunk, so a step costs one cumulative sum over the neurons, not
        # a compaction (a scatter over every neuron on XLA:CPU).
        csum = jnp.cumsum(sub, axis=-1, dtype=jnp.int32)
        n_sub = csum[:, -1]
        n_here = jnp.minimum(jnp.max(n_sub), sub_size)
        big = max(1, min(sub_size, _CHUNK_SYNAPSES // (max(1, conn.max_fan_out) * n_trials)))
        small = max(1, big // 16)

        def body(
            c,
            flat,
            base,
            chunk,
            csum=csum,
            n_sub=n_sub,
            conn=conn,
            start=start,
            spec=spec,
            sub_size=sub_size,
            pre_offset=pre_offset,
            n_post=n_post,
            n_pre=n_pre,
        ):
            slots = base + c * chunk + jnp.arange(chunk, dtype=jnp.int32)
            inside = slots < sub_size
            slots = jnp.minimum(slots, sub_size - 1)
            local = jax.vmap(lambda cs: jnp.searchsorted(cs, slots + 1, side="left"))(csum)
            local = jnp.minimum(local.astype(jnp.int32), n_pre - 1)
            ok = (slots[None, :] < n_sub[:, None]) & inside  # (trials, chunk)
            value = jnp.where(ok, s_rows[trial, local + pre_offset], 0)
            post, w, steps, ok_syn = _rows(conn, start, n_post, local.reshape(-1))
            ok_syn = ok_syn & ok.reshape(-1)[:, None]
            tr = jnp.broadcast_to(trial, local.shape).reshape(-1)[:, None]
            target = _targets(spec, step, tr, post, steps, ok_syn, oob)
            contrib = (value.reshape(-1)[:, None] * w.astype(value.dtype)).astype(flat.dtype)
            # One scatter per row, in row order (the same additions in the same order as one
            # scatter of the flattened chunk): flattening the generated rows makes XLA:CPU
            # emit the whole row generator over the flat index, which doubles its cost.
            return lax.fori_loop(
                0,
                target.shape[0],
                lambda r, flat: flat.at[target[r]].add(contrib[r], mode="drop"),
                flat,
            )

        # Full chunks of `big` spikes, then the rest in chunks of `small`: at most `small - 1`
        # empty rows are generated (XLA's CPU scatter pays for every entry, dropped or not).
        n_big = n_here // big
        flat = lax.fori_loop(0, n_big, functools.partial(body, base=0, chunk=big), flat)
        if small < big:  # (with big == 1 the first loop took every spike)
            rest = n_here - n_big * big
            tail = functools.partial(body, base=n_big * big, chunk=small)
            flat = lax.fori_loop(0, (rest + small - 1) // small, tail, flat)
    need = needed(count, size, n_source)
    return flat.reshape(ring.shape), need.reshape(batch)


def _reference(s, step, ring, leaves, *, specs, treedefs, fresh, capacity=None):
    """The pure-JAX delivery: spikes compacted into a buffer of `capacity` per trial, rows
    regenerated chunk by chunk; the ring and the buffer each trial lacked.

    `lax.platform_dependent` traces this default branch even where it cannot run: on a CPU
    backend whose only traced platform takes the CPU slot (`nj.kernels.implementations`
    gives the CPU alone), the branch is dead, and tracing the row generator of every
    projection of the group (twice) cost most of the microcircuit's compilation (20 s of a
    full-scale step's tracing); the CPU slot stands in for it there."""
    static = dict(specs=specs, treedefs=treedefs, fresh=fresh, capacity=capacity)
    # (under nj.kernels.cross_platform() the default branch is lowered for GPUs and TPUs)
    if (
        jax.default_backend() == "cpu"
        and not cross_platform_enabled()
        and set(implementations(DELIVER, s, step, ring, leaves, **static)) == {"cpu"}
    ):
        return _cpu(s, step, ring, leaves, **static)
    return _walk(
        s,
        step,
        ring,
        leaves,
        specs=specs,
        treedefs=treedefs,
        fresh=fresh,
        capacity=capacity,
        every=False,
    )


_TARGET = "nj_procedural_deliver"
_RULE = {"fixed_prob": 0, "fixed_total": 1}


def _native(conn, start, s, ring) -> bool:
    """Whether the C++ kernel draws this projection's rows (see the module docstring): a
    fixed_prob or fixed_total description on one device, scalar, uniform or normal weights,
    no, uniform or normal delays, float32 spikes and ring, jax.random's threefry rows."""
    return (
        start is None
        and conn.rule in _RULE
        and s.dtype == jnp.float32
        and ring.dtype == jnp.float32
        and default_float() == jnp.float32
        and (not isinstance(conn.weight, Distribution) or type(conn.weight) in (Normal, Uniform))
        and (conn.delay is None or type(conn.delay) in (Normal, Uniform))
        and threefry_rows()
        and conn.n_post < 2**31
    )


def _params(conn) -> jax.Array:
    """The float32 parameters the kernel reads (layout in procedural.cc), computed here with
    the operations of `Procedural.rows` so that they carry the same bits."""
    f32 = jnp.float32
    zero = jnp.zeros((), f32)
    p = [zero] * 12
    wt = conn.weight
    if isinstance(wt, Uniform):
        low = jnp.maximum(wt.low, 0.0) if wt.nonnegative else wt.low
        p[0], p[1] = low, wt.high - low
    elif isinstance(wt, Normal):
        p[0], p[1] = wt.mean, wt.std
        if wt.nonnegative:
            safe = jnp.where(wt.std > 0, wt.std, 1.0)
            p[2] = ndtr(jnp.where(wt.std > 0, wt.mean / safe, jnp.inf))
    else:
        p[0] = wt
    dl = conn.delay
    if isinstance(dl, Uniform):
        a = jnp.maximum(dl.low, conn.delay_low)
        b = jnp.minimum(dl.high, conn.delay_high)
        p[3], p[4], p[5], p[6] = a, b - a, conn.delay_low, conn.delay_high
    elif isinstance(dl, Normal):
        a = ndtr((conn.delay_low - dl.mean) / dl.std)
        b = ndtr((conn.delay_high - dl.mean) / dl.std)
        p[3], p[4], p[5], p[6] = dl.mean, dl.std, a, b - a
        p[7], p[8] = conn.delay_low, conn.delay_high
    if dl is not None:
        p[9] = conn.dt
    return jnp.stack([jnp.asarray(x).astype(f32).reshape(()) for x in p])


def _native_call(s, step, ring, group, fresh):
    """One call of the C++ kernel over the projections `group` ((spec, conn) pairs)."""
    buffers, attrs = [], {name: [] for name in _ATTRS}
    for spec, conn in group:
        n_source, pre_offset, n_pre, n_post, n_slots, delay_steps, n_targets, t_off = spec
        buffers += [
            jnp.asarray(conn.counts, jnp.int32),
            jnp.asarray(conn.key_data).astype(jnp.uint32).reshape(2),
            _params(conn),
        ]
        kind_w, kind_d = _kinds(conn)
        values = dict(
            pre_offset=pre_offset,
            n_pre=n_pre,
            n_post=n_post,
            rule=_RULE[conn.rule],
            allow_self=int(conn.allow_self),
            fan_out=conn.max_fan_out,
            weight_kind=kind_w,
            delay_kind=kind_d,
            delay_steps=max(0, delay_steps),
            max_steps=conn.max_delay_steps if kind_d else 0,
            target_offset=t_off,
        )
        for name in _ATTRS:
            attrs[name].append(values[name])
    call = jax.ffi.ffi_call(
        _TARGET,
        jax.ShapeDtypeStruct(ring.shape, ring.dtype),
        input_output_aliases={2: 0},
        vmap_method="sequential",
    )
    spec = group[0][0]
    return call(
        s,
        jnp.asarray(step, jnp.int32),
        ring,
        *buffers,
        n_source=np.int64(spec[0]),
        n_slots=np.int64(spec[4]),
        n_targets=np.int64(spec[6]),
        overwrite=np.int64(bool(fresh)),
        **{name: np.asarray(v, np.int64) for name, v in attrs.items()},
    )


def _kinds(conn) -> tuple[int, int]:
    """The kernel's weight kind (0 scalar, 1 uniform, 2 normal, 3 non-negative normal) and
    delay kind (0 none, 1 uniform, 2 normal) of a native projection."""
    wt, dl = conn.weight, conn.delay
    kind_w = 0
    if isinstance(wt, Uniform):
        kind_w = 1
    elif isinstance(wt, Normal):
        kind_w = 3 if wt.nonnegative else 2
    return kind_w, 0 if dl is None else (1 if isinstance(dl, Uniform) else 2)


def native_draws(conn: Procedural, words: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The weight (float32) and delay in steps (int32) that the C++ kernel draws from each
    uint32 word of `words` for the description `conn` (which `_native` must accept): for
    comparing its transforms with `Procedural.rows`' over every 24-bit uniform."""
    from ...kernels import _build

    if not _build.register_targets(((_DRAWS, "NjProceduralDraws"),)):
        raise RuntimeError("native_draws: the compiled kernels are unavailable")
    kind_w, kind_d = _kinds(conn)
    words = jnp.asarray(words, jnp.uint32)
    call = jax.ffi.ffi_call(
        _DRAWS,
        (
            jax.ShapeDtypeStruct(words.shape, jnp.float32),
            jax.ShapeDtypeStruct(words.shape, jnp.int32),
        ),
    )
    return call(
        words,
        _params(conn),
        weight_kind=np.int64(kind_w),
        delay_kind=np.int64(kind_d),
        max_steps=np.int64(conn.max_delay_steps if conn.delay is not None else 0),
    )


_DRAWS = "nj_procedural_draws"

_ATTRS = (
    "pre_offset",
    "n_pre",
    "n_post",
    "rule",
    "allow_self",
    "fan_out",
    "weight_kind",
    "delay_kind",
    "delay_steps",
    "max_steps",
    "target_offset",
)


def _cpu(s, step, ring, leaves, *, specs, treedefs, fresh, capacity=None):
    """The CPU slot: the projections the C++ kernel supports (`_native`) in calls of
    `nj_procedural_deliver`, the others through the XLA walk over every spike, in the
    group's order (so the ring receives the same terms in the same order); no step ever
    needs a larger buffer."""
    conns = _conns(leaves, treedefs)
    runs = []  # consecutive projections of one kind: (native, [indices])
    for i, (conn, start) in enumerate(conns):
        native = _native(conn, start, s, ring)
        if runs and runs[-1][0] == native:
            runs[-1][1].append(i)
        else:
            runs.append((native, [i]))
    first = True
    for native, idx in runs:
        if native:
            group = [(specs[i], conns[i][0]) for i in idx]
            ring = _native_call(s, step, ring, group, fresh and first)
        else:
            ring, _ = _walk(
                s,
                step,
                ring,
                tuple(leaves[i] for i in idx),
                specs=tuple(specs[i] for i in idx),
                treedefs=tuple(treedefs[i] for i in idx),
                fresh=fresh and first,
                capacity=None,
                every=True,
            )
        first = False
    return ring, jnp.zeros(s.shape[:-1], jnp.int32)


def _dense(s, step, ring, leaves, *, specs, treedefs, fresh, capacity=None, ignore_delays=False):
    """The same delivery over every row (a scan over blocks of rows): the function whose
    derivative the entry uses, reaching every presynaptic neuron and the weight parameters."""
    n_source = s.shape[-1]
    s_rows = s.reshape(-1, n_source)
    n_trials = s_rows.shape[0]
    flat = (jnp.zeros_like(ring) if fresh else ring).reshape(n_trials, -1)
    oob = flat.shape[-1]
    for spec, (conn, start) in zip(specs, _conns(leaves, treedefs), strict=True):
        _, pre_offset, n_pre, n_post, *_ = spec
        block = max(1, min(n_pre, _CHUNK_SYNAPSES // max(1, conn.max_fan_out)))
        n_blocks = -(-n_pre // block)

        def body(
            flat,
            b,
            conn=conn,
            start=start,
            spec=spec,
            block=block,
            n_pre=n_pre,
            pre_offset=pre_offset,
            n_post=n_post,
        ):
            ids = b * block + jnp.arange(block, dtype=jnp.int32)
            inside = ids < n_pre
            ids = jnp.minimum(ids, n_pre - 1)
            post, w, steps, ok = _rows(conn, start, n_post, ids)
            ok = ok & inside[:, None]
            target = _targets(spec, step, 0, post, steps, ok, oob, ignore_delays)
            value = jnp.where(inside, s_rows[:, pre_offset + ids], 0)  # (trials, block)
            contrib = value[:, :, None] * w.astype(value.dtype)
            flat = flat.at[:, target.reshape(-1)].add(
                contrib.reshape(n_trials, -1).astype(flat.dtype), mode="drop"
            )
            return flat, None

        flat, _ = lax.scan(body, flat, jnp.arange(n_blocks, dtype=jnp.int32))
    return flat.reshape(ring.shape), jnp.zeros(s.shape[:-1], jnp.int32)


def _batching(axis_size, in_batched, args, apply):
    """Fold a vmapped axis of the spikes and the ring into the trials of one call when the
    step and the descriptions are shared; otherwise one call per element."""
    s, step, ring, leaves = args
    s_b, step_b, ring_b, leaves_b = in_batched
    if step_b or any(jax.tree.leaves(leaves_b)):
        return Sequential()(axis_size, in_batched, args, apply)
    if not s_b:
        s = jnp.broadcast_to(s, (axis_size, *s.shape))
    if not ring_b:
        ring = jnp.broadcast_to(ring, (axis_size, *ring.shape))
    out = apply(s, step, ring, leaves)
    return out, jax.tree.map(lambda _: True, out)


def _examples():
    import jax.random as jr

    from ...connectivity import _procedural as proc
    from ...connectivity._weights import normal, uniform

    desc = proc.fixed_prob(
        jr.key(3), 12, 9, 0.4, weight=normal(0.5, 0.1), delay=uniform(0.0, 0.5), dt=0.1
    )
    lay = ProceduralLayout.from_procedural(desc)
    s = (jr.uniform(jr.key(4), (2, 12)) < 0.5).astype(jnp.float32)
    ring = jr.uniform(jr.key(5), (2, 6, 9))
    spec = (12, 0, 12, 9, 6, -1, 9, 0)
    static = dict(specs=(spec,), treedefs=(lay._treedef(),), fresh=False)
    args = (s, jnp.int32(3), ring, (lay._leaves(),))
    yield Example(
        args,
        dict(static, capacity=None),
        grad_argnums=(0, 2),
        vmap_argnums=(0, 2),
        label="all-spikes",
    )
    yield Example(
        args, dict(static, capacity=8, fresh=True), vmap_argnums=(0, 2), label="capacity-8-fresh"
    )


DELIVER = register(
    _Kernel(
        name="procedural_deliver",
        reference=_reference,
        cpu=_cpu,
        batching=_batching,
        differentiable=_dense,
        examples=_examples,
        # (the draws' target serves the tests that compare the transforms with the XLA path)
        ffi_targets=((_TARGET, "NjProceduralDeliver"), (_DRAWS, "NjProceduralDraws")),
        # normal draws: the C library's log where XLA has its own (module docstring)
        rtol=1e-5,
        atol=1e-6,
        doc="Delivery of a procedural projection's spikes: each spiking neuron's row "
        "regenerated from its key (neurojax.network._layout._procedural).",
    )
)
