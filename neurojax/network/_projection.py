"""Projections: synapses from one population onto another, with kinetics, output and delays."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse
from jaxtyping import Array, Float, Int

from .._validation import _fmt, check_dt
from ..connectivity._checks import checked_conn
from ..connectivity._procedural import Procedural
from ..synapses import CurrentOutput, Delta
from ..synapses._base import SynapseDynamics, SynapseOutput
from ._layout import DENSE_AUTO_MAX as DENSE_AUTO_MAX
from ._layout import Layout, layout_class
from ._layout._procedural import procedural_parts
from ._plastic import check_initial_weights, check_rule

__all__ = ["Projection", "delay_steps", "steps_dtype"]


def delay_steps(delay_ms: Any, dt: float) -> np.ndarray:
    """Delays in ms rounded to whole steps of `dt` (half-way cases round up).

    A relative tolerance of 1e-6 absorbs the float error of `delay / dt` so that, for example,
    0.3 ms at dt = 0.1 ms is 3 steps, never 2.
    """
    ratio = np.asarray(delay_ms, np.float64) / dt
    return np.floor(ratio + 0.5 + 1e-6 * np.maximum(ratio, 1.0)).astype(np.int64)


def steps_dtype(max_steps: int) -> type:
    """The smallest integer dtype that holds delays of up to `max_steps` steps."""
    return np.int8 if max_steps < 2**7 else np.int16 if max_steps < 2**15 else np.int32


def _as_steps(delay_ms: np.ndarray, dt: float) -> jax.Array:
    """Per-synapse delays [ms] as whole steps of `dt` on the device, in the smallest integer
    dtype. The delays are rounded from their float32 values, the precision the projection
    has always kept them in, so that a given array gives the same steps however it is
    stored."""
    d = np.asarray(delay_ms).reshape(-1)
    if d.size == 0:
        return jax.device_put(np.zeros(0, np.int8))
    # `delay_steps` is non-decreasing: the largest delay gives the largest step (its dtype)
    d_max = int(delay_steps(np.float32(d.max()), dt))
    out = np.empty(d.size, steps_dtype(d_max))
    # the operations of `delay_steps`, in its order, a block at a time and in place (each
    # block stays in cache): the same steps as one call on the whole array
    for s in range(0, d.size, _BLOCK):
        r = d[s : s + _BLOCK].astype(np.float32).astype(np.float64)
        r /= dt
        t = np.maximum(r, 1.0)
        t *= 1e-6
        r += 0.5
        r += t
        np.floor(r, out=r)
        out[s : s + _BLOCK] = r
    # device_put, not jnp.asarray: no program compiled per array shape
    return jax.device_put(out)


_BLOCK = 1 << 18  # delays per block of `_as_steps`


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
    return checked_conn("Projection", conn)


def _check_new_options(short_term, learnable, max_delay, plasticity, d, n_pre, nnz):
    """Check `short_term`, `learnable_delays` and `max_delay` (before any work); return them
    and the delays (one per synapse when learnable)."""
    from ..synapses import ShortTermRule

    if short_term is not None:
        if not isinstance(short_term, ShortTermRule):
            raise TypeError(
                "Projection: short_term must be None, an nj.TsodyksMarkram or another "
                "nj.synapses.ShortTermRule, got "
                f"{type(short_term).__name__}"
            )
        short_term.check_size("Projection", n_pre)
    if not isinstance(learnable, (bool, np.bool_)):
        raise TypeError(f"Projection: learnable_delays must be True or False, got {learnable!r}")
    learnable = bool(learnable)
    if max_delay is not None and not learnable:
        raise ValueError(
            "Projection: max_delay is only used with learnable_delays=True (fixed delays "
            f"set the ring buffer themselves), got max_delay={max_delay!r}"
        )
    if not learnable:
        return short_term, False, d, None
    if plasticity is not None:
        raise ValueError(
            "Projection: learnable_delays need static weights (plasticity=None); got "
            f"{type(plasticity).__name__}"
        )
    if d.ndim == 0:
        d = np.full((nnz,), float(d))
    elif d.shape != (nnz,):
        raise ValueError(
            f"Projection: delay must be a scalar or have one value per synapse, shape "
            f"({nnz},), got shape {d.shape}"
        )
    largest = float(d.max()) if d.size else 0.0
    if max_delay is None:
        return short_term, True, d, largest
    if isinstance(max_delay, bool) or not isinstance(max_delay, (int, float, np.number)):
        raise TypeError(f"Projection: max_delay must be a number of ms, got {max_delay!r}")
    max_delay = float(max_delay)
    if not np.isfinite(max_delay) or max_delay < largest:
        raise ValueError(
            f"Projection: max_delay must be finite and >= the largest delay ({largest} ms), "
            f"got {max_delay}"
        )
    return short_term, True, d, max_delay


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

    **Storage and propagation** (`method`, kept in `layout`, an `nj.network.Layout`):
    - `"event"` (`nj.network.EventLayout`): event-driven over a compressed-row layout; the
      cost per step grows with spikes x maximum fan-out, never with the number of synapses
      (see `neurojax.network._propagation`). 8 bytes per synapse, plus the delay when it
      varies.
    - `"dense"` (`nj.network.DenseLayout`): a dense `(n_pre, n_post)` weight matrix and one
      matrix product per step, for small networks and gradient training; homogeneous delay
      only.
    - `"bcoo"` (`nj.network.BCOOLayout`): `spikes @ conn` with JAX's BCOO kernels; a
      reference, slow in a loop.
    - `"auto"` (default): `"dense"` when `n_pre * n_post <= 65536`, the delay is homogeneous
      and the weights static, else `"event"`.
    - `"procedural"` (`nj.network.ProceduralLayout`): `conn` is a description from
      `nj.connect.procedural` and no synapse is stored; each spiking neuron's row is
      regenerated from its key (4 bytes per presynaptic neuron). Static weights only;
      per-synapse delays come from the description. `"auto"` picks it for a description.
    - a subclass of `nj.network.Layout`: a layout of your own (see its docstring).
    All built-in layouts deliver the same values and, through `jax.grad`, the same gradients.

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
            Per-synapse delays are kept as those whole steps once `dt` is known (the `dt`
            argument, or the network's when the projection joins an `nj.Network`): 1 byte
            per synapse (int8; int16 or int32 beyond 127 or 32767 steps) instead of a
            float32 in ms; `projection.delay` then reads `delay_steps * dt` in ms (float32),
            the delays rounded to the grid as the network uses them (as NEST reports
            delays). Learnable delays stay float32 ms (see `learnable_delays`).
        short_term: `None`, an `nj.TsodyksMarkram` model of short-term depression and
            facilitation (each spike then delivers `w u+ R-`, per presynaptic neuron; see its
            docstring), or a rule of your own (`nj.synapses.ShortTermRule`): the value is
            computed when the spike is sent and carried through the delay. Its state
            lives in the network state (`NetworkState.short_term`). Any layout.
        learnable_delays: when True the delays are a differentiable float array (ms, one per
            synapse, kept in `delay` in the layout's synapse order) that `jax.grad` can move:
            a delay of `d = (k + f) dt` (`k` whole steps, `0 <= f < 1`) delivers
            `(1 - f) w` at `k` steps and `f w` at `k + 1` steps; whole-step delays give
            exactly the results of fixed delays. Needs the event layout and static weights
            (see docs/concepts/delays.md).
        max_delay: with `learnable_delays`, the largest delay [ms] the ring buffer holds
            (default: the largest initial delay); delays that training moves outside
            `[0, max_delay]` act as the nearest bound (with zero gradient beyond it), as
            weight bounds do for STDP.
        plasticity: `None` (static weights) or an `nj.STDP` rule: the weights then live in the
            network state and change inside the simulation (needs the event path and one delay
            for all synapses; initial weights must lie within the rule's bounds). A plastic
            projection also stores its synapses by postsynaptic neuron (8 more bytes per
            synapse) so that potentiation costs spikes x fan-in.
        method: `"auto"`, `"event"`, `"dense"`, `"bcoo"` or a `nj.network.Layout` subclass
            (see Storage and propagation).
        dt: the step [ms] of the network the projection is for (optional). With per-synapse
            delays it rounds them to whole steps here, so that the float delays are never
            stored (see `delay`); the network must then have the same `dt`.

    Attributes:
        layout: the synapses in the chosen layout; `method` is its name.
        conn: the synapses as a BCOO (rebuilt from the layout).
        delay: the delay [ms]: a float, or per synapse a float32 array in the layout's
            synapse order (`delay_steps * dt` when the delays are kept in steps).
        delay_steps: per-synapse delays in whole steps of `dt` (int8, int16 or int32, in the
            layout's synapse order), or None (one delay for all synapses, learnable delays,
            or per-synapse delays whose `dt` is not known yet).
        indptr, indices, weights, col_ptr, col_syn, col_pre, max_fan_out, max_fan_in: the
            event layout's tables (None, or 0 for the fan sizes, with another layout);
            `matrix` the dense layout's matrix and `conn_bcoo` the BCOO layout's (None
            otherwise). Replace weights with `eqx.tree_at(lambda p: p.weights, proj, w)`.

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
    layout: Layout
    n_synapses: int = eqx.field(static=True)
    # ms: a float, or per synapse (layout order; learnable, or before dt is known); None when
    # the per-synapse delays are kept as `delay_steps`
    delay_ms: float | Float[Array, " nnz"] | None
    max_delay: float = eqx.field(static=True)
    plasticity: Any
    short_term: Any = None
    learnable_delays: bool = eqx.field(static=True, default=False)
    delay_steps: Int[Array, " nnz"] | None = None
    dt: float | None = eqx.field(static=True, default=None)

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
        method: str | type[Layout] = "auto",
        short_term: Any = None,
        learnable_delays: bool = False,
        max_delay: float | None = None,
        dt: float | None = None,
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
        self.dt = None if dt is None else check_dt("Projection", dt)
        self.delay_steps = None
        if isinstance(conn, Procedural):  # nj.connect.procedural: nothing stored
            if short_term is not None or learnable_delays is not False:
                raise ValueError(
                    "Projection: a procedural projection (nj.connect.procedural) regenerates "
                    "its synapses at each spike and takes neither short_term nor "
                    f"learnable_delays (got short_term={short_term!r}, learnable_delays="
                    f"{learnable_delays!r}); build the synapses with nj.connect for those"
                )
            self.layout, self.delay_ms = procedural_parts(
                "Projection", conn, delay, plasticity, method
            )
            self.pre, self.post, self.synapse, self.output = pre, post, synapse, output
            self.n_synapses, self.max_delay, self.plasticity = conn.n_synapses, self.delay_ms, None
            return
        conn = _check_conn(conn)
        n_pre, n_post = (int(d) for d in conn.shape)
        nnz = int(conn.nse)

        if isinstance(delay, jax.core.Tracer):
            raise TypeError("Projection: delay is a traced value; build projections outside jit")
        d = np.asarray(delay, np.float64) if not isinstance(delay, (bool, str, bytes)) else None
        if d is None or d.dtype.kind not in "fiu":
            raise TypeError(
                f"Projection: delay must be a real number or array in ms, got {delay!r}"
            )
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            bad = d[~(np.isfinite(d) & (d >= 0))] if d.ndim else d
            raise ValueError(f"Projection: delay must be finite and >= 0 ms, got {_fmt(bad)}")
        short_term, learnable_delays, d, max_delay = _check_new_options(
            short_term, learnable_delays, max_delay, plasticity, d, n_pre, nnz
        )
        if learnable_delays:
            homogeneous, d_arr = None, d
        elif d.ndim == 0 or (d.size and np.all(d == d.reshape(-1)[0]) and d.shape == (nnz,)):
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
        cls = layout_class(
            method,
            n_pre=n_pre,
            n_post=n_post,
            per_synapse_delays=d_arr is not None,
            plastic=plasticity is not None,
        )
        if plasticity is not None and not cls.plastic:
            raise ValueError(
                f"Projection: plastic weights need method='event' (or 'auto'), got {method!r} "
                f"(the {cls.__name__} layout does not support plasticity)"
            )
        if learnable_delays and not cls.per_synapse_delays:
            raise ValueError(
                f"Projection: learnable_delays need method='event' (or 'auto'), got "
                f"{cls.name!r}, whose layout has one fixed delay for all synapses"
            )
        if d_arr is not None and not cls.per_synapse_delays:
            raise ValueError(
                f"Projection: method={cls.name!r} needs one delay for all synapses; per-synapse "
                "delays need method='event' (or 'auto')"
            )
        layout, d_arr = cls.from_bcoo(conn, delay=d_arr, plastic=plasticity is not None)
        if not isinstance(layout, Layout) or (layout.n_pre, layout.n_post) != (n_pre, n_post):
            raise TypeError(
                f"Projection: {cls.__name__}.from_bcoo must return a Layout of shape "
                f"({n_pre}, {n_post}) and the delays, got {type(layout).__name__}"
            )
        if plasticity is not None:
            check_initial_weights("Projection", plasticity, layout.weights)

        self.pre, self.post = pre, post
        self.synapse, self.output = synapse, output
        self.layout = layout
        self.n_synapses = nnz
        self.max_delay = float(d.max()) if d.size else 0.0
        if max_delay is not None:
            self.max_delay = max_delay
        self.plasticity = plasticity
        self.short_term = short_term
        self.learnable_delays = learnable_delays
        if d_arr is None:
            self.delay_ms = homogeneous
        elif self.dt is not None and not learnable_delays:
            self.delay_ms, self.delay_steps = None, _as_steps(d_arr, self.dt)
        else:
            self.delay_ms = jnp.asarray(d_arr, jnp.float32)

    @classmethod
    def _trusted(
        cls,
        pre: str,
        post: str,
        layout: Layout,
        *,
        synapse: SynapseDynamics,
        output: SynapseOutput,
        delay_steps: np.ndarray,
        max_delay: float,
        dt: float,
    ) -> "Projection":
        """A static projection with per-synapse delays in whole steps of `dt`, assembled from
        a layout and delay steps that a trusted internal builder made (the microcircuit's
        pathways): what `__init__` makes of the same synapses and the delays that round to
        `delay_steps`, without its input checks and copies. `max_delay` [ms] is the largest
        delay before rounding (what `__init__` keeps)."""
        new = object.__new__(cls)
        fields = dict(
            pre=pre,
            post=post,
            synapse=synapse,
            output=output,
            layout=layout,
            n_synapses=int(delay_steps.shape[0]),
            delay_ms=None,
            max_delay=float(max_delay),
            plasticity=None,
            short_term=None,
            learnable_delays=False,
            # device_put, not jnp.asarray: no program compiled per array shape
            delay_steps=jax.device_put(delay_steps),
            dt=check_dt("Projection", dt),
        )
        for field in dataclasses.fields(cls):
            object.__setattr__(new, field.name, fields[field.name])
        return new

    # ------------------------------------------------------------------ delays

    @property
    def delay(self) -> float | Float[Array, " nnz"]:
        """The delay [ms]: a float, or one float32 per synapse in the layout's synapse order
        (`delay_steps * dt` when the per-synapse delays are kept in steps). Learnable delays
        are this field itself, so `eqx.tree_at(lambda p: p.delay, ...)` and `jax.grad` reach
        them."""
        if self.delay_steps is not None:
            return self.delay_steps.astype(jnp.float32) * jnp.float32(self.dt)
        return self.delay_ms

    def with_delay_steps(self, dt: float) -> "Projection":
        """This projection with its per-synapse delays kept as whole steps of `dt` (the
        float32 ms array dropped; see `delay`); itself when there is nothing to convert
        (one delay, learnable delays, or delays already in steps of `dt`). Raises when the
        delays are already in steps of another `dt`."""
        dt = check_dt("Projection.with_delay_steps", dt)
        if self.delay_steps is not None:
            if not np.isclose(self.dt, dt, rtol=1e-9, atol=0.0):
                raise ValueError(
                    f"Projection ({self.pre} -> {self.post}): its delays are whole steps of "
                    f"dt={self.dt} ms but the network's dt is {dt} ms; build the projection "
                    "with the network's dt (or without dt)"
                )
            return self
        if self.learnable_delays or not isinstance(self.delay_ms, jax.Array):
            return self
        new = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(new, field.name, getattr(self, field.name))
        object.__setattr__(new, "delay_steps", _as_steps(np.asarray(self.delay_ms), dt))
        object.__setattr__(new, "delay_ms", None)
        object.__setattr__(new, "dt", dt)
        return new

    # ------------------------------------------------------------------ the layout's view

    @property
    def method(self) -> str:
        """The name of the layout (`"event"`, `"dense"`, `"bcoo"` or a custom layout's)."""
        return self.layout.name

    @property
    def n_pre(self) -> int:
        """Number of presynaptic neurons."""
        return self.layout.n_pre

    @property
    def n_post(self) -> int:
        """Number of postsynaptic neurons."""
        return self.layout.n_post

    @property
    def indptr(self) -> Int[Array, " n_pre_plus_1"] | None:
        """Row pointers of the event layout (None with another layout)."""
        return getattr(self.layout, "indptr", None)

    @property
    def indices(self) -> Int[Array, " nnz"] | None:
        """Postsynaptic neuron of each synapse in the event layout (None otherwise)."""
        return getattr(self.layout, "indices", None)

    @property
    def weights(self) -> Float[Array, " nnz"] | None:
        """Weights in the event layout's synapse order (None with another layout)."""
        return getattr(self.layout, "weights", None)

    @property
    def col_ptr(self) -> Int[Array, " n_post_plus_1"] | None:
        """Column pointers of a plastic event layout (None otherwise)."""
        return getattr(self.layout, "col_ptr", None)

    @property
    def col_syn(self) -> Int[Array, " nnz"] | None:
        """Synapse ids grouped by postsynaptic neuron, plastic event layout (None otherwise)."""
        return getattr(self.layout, "col_syn", None)

    @property
    def col_pre(self) -> Int[Array, " nnz"] | None:
        """Presynaptic neuron of each `col_syn` entry, plastic event layout (None otherwise)."""
        return getattr(self.layout, "col_pre", None)

    @property
    def max_fan_out(self) -> int:
        """Largest number of synapses leaving one neuron, event layout (0 otherwise)."""
        return getattr(self.layout, "max_fan_out", 0)

    @property
    def max_fan_in(self) -> int:
        """Largest number of synapses reaching one neuron, plastic event layout (0 otherwise)."""
        return getattr(self.layout, "max_fan_in", 0)

    @property
    def matrix(self) -> Float[Array, "n_pre n_post"] | None:
        """The dense layout's weight matrix (None with another layout)."""
        return getattr(self.layout, "matrix", None)

    @property
    def conn_bcoo(self) -> sparse.BCOO | None:
        """The BCOO layout's connectivity (None with another layout)."""
        return getattr(self.layout, "conn", None)

    @property
    def conn(self) -> sparse.BCOO:
        """The synapses as a BCOO `(n_pre, n_post)` (rebuilt from the layout)."""
        return self.layout.to_bcoo()

    def nbytes(self) -> int:
        """Bytes held by the synapse arrays of this projection (layout, weights, delays)."""
        extra = sum(
            int(x.nbytes) for x in (self.delay_ms, self.delay_steps) if isinstance(x, jax.Array)
        )
        return self.layout.nbytes() + extra

    def deliver_dense(self, s: Float[Array, "*batch n_pre"]) -> Float[Array, "*batch n_post"]:
        """`s @ W`, the weight each postsynaptic neuron receives from the spikes `s` (one delay
        for all synapses), through the layout's product."""
        return self.layout.product(s)
