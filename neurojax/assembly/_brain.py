"""The assembly-calculus brain: areas with a k-cap, random synapses and Hebbian plasticity."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .. import kernels
from . import _sampling, _synapses
from ._synapses import FanOut

__all__ = ["Brain", "BrainState", "ProjectionTrace", "overlap"]

_MODES = ("sparse", "explicit")
_STORAGES = ("auto", "dense", "fanout")
# Explicit areas keep a dense matrix up to this many synapse slots (64 MiB of float32).
_DENSE_MAX = 1 << 24
# Bits of `BrainState.faults`.
_EMPTY_SOURCE = 1  # the area was a source of a projection while it had no assembly
_ABOVE_BOUND = 2  # a first-time winner of the area drew an input above the static bound


def _default_capacity(n: int, k: int, beta: float) -> int:
    """The default capacity of a sparse area whose smallest plasticity is `beta`.

    About twice the support after 100 steps of the reference projection (n = 10^5, k = 317,
    p = 0.01; means of 8 seeds, largest seed in brackets): 3.9k (4.0k) at beta = 0.05, 6.2k
    (6.6k) at 0.02, 8.0k (8.7k) at 0.01 and 10.0k (10.5k, still growing) at 0.005, a growth
    close to beta^-0.45. Hence `8k (0.05 / beta)^0.45`, at least `8k` and at most `32k`
    (beta <= 0.0023, and no plasticity), and at least 1024, at most `n - k`.
    """
    per_k = 32.0 if beta <= 0 else min(32.0, max(8.0, 8.0 * (0.05 / beta) ** 0.45))
    return min(n - k, max(math.ceil(per_k * k), 1024))


class BrainState(eqx.Module):
    """State of a `Brain`: assemblies, supports, synaptic weights and the PRNG key.

    Neurons are named by integer labels. In explicit mode the label is the neuron's index in
    its area (`0..n-1`). In sparse mode only neurons that have fired are represented and they
    are labelled in the order they first fired (`0..support-1`), as in the reference
    implementation.

    Attributes:
        winners: per area, the labels of the neurons firing now, shape `(k,)`, int32; `-1`
            pads the list when fewer than `k` fire (after `Brain.set_winners` with a subset)
            and fills it before the area has fired.
        support: per area, how many neurons have ever fired.
        new_winners: per area, how many neurons fired for the first time in the last
            projection into the area.
        fixed: per area, whether its assembly is frozen (`Brain.fix`).
        fired: per area, a boolean vector of the neurons that have ever fired (explicit mode
            only; empty in sparse mode, where the support is the label range).
        stimulus_weights: per `(stimulus, area)`, the total synaptic weight from the stimulus
            onto each neuron (the stimulus neurons always fire together), shape `(capacity,)`.
        weights: per `(source area, target area)`, the synapses: a dense `(capacity_src,
            capacity_tgt)` matrix or a `FanOut`.
        key: PRNG key of the sparse-mode draws; every projection draws its random numbers and
            the next key from it at once.
        step: number of projections so far.
        synapse_key: the key that drew the random synapses (`init_state`'s key); growing the
            capacity draws the synapses of the added neurons from it.
        overflow: per area, 0, or the largest support that a projection into the area needed
            beyond the capacity of the state (sparse mode). A projection that overflows goes
            on with its first-time winners beyond the capacity dropped, so the state is only
            good for rerunning from the state before it with a larger capacity, which eager
            `Brain.project` and `Brain.project_rounds` do themselves.
        faults: per area, bit flags of conditions that make the state invalid: 1, the area was
            the source of a projection while it had no assembly; 2, a first-time winner drew
            an input above the static bound of the input selection (please report). Read
            after a run: eagerly they raise, under `jit` one `eqx.error_if` checks them.

    The capacity of a sparse area is the size of the state's arrays for it (`capacity(state,
    area)`); the Brain's `capacities` are the capacities `init_state` starts with.
    """

    winners: dict[str, Int[Array, " k"]]
    support: dict[str, Int[Array, ""]]
    new_winners: dict[str, Int[Array, ""]]
    fixed: dict[str, Bool[Array, ""]]
    fired: dict[str, Bool[Array, " n"]]
    stimulus_weights: dict[tuple[str, str], Float[Array, " c"]]
    weights: dict[tuple[str, str], Any]
    key: PRNGKeyArray
    step: Int[Array, ""]
    synapse_key: PRNGKeyArray
    overflow: dict[str, Int[Array, ""]]
    faults: dict[str, Int[Array, ""]]


class ProjectionTrace(eqx.Module):
    """What `Brain.project_rounds` records at every step, per target area (time first).

    Attributes:
        winners: `(steps, k)` labels of the winners after each step.
        new_winners: `(steps,)` neurons that fired for the first time at that step.
        support: `(steps,)` neurons that have ever fired, after the step.
        overlap: `(steps,)` winners shared with the previous step (`k` once converged).
    """

    winners: dict[str, Int[Array, "steps k"]]
    new_winners: dict[str, Int[Array, " steps"]]
    support: dict[str, Int[Array, " steps"]]
    overlap: dict[str, Int[Array, " steps"]]


def overlap(a: Int[Array, "... k"], b: Int[Array, "... m"]) -> Int[Array, "..."]:
    """How many neurons of winner list `a` are also in `b` (`-1` entries never count).

    Works on the last axis (leading axes broadcast), so stacked lists give one count each.
    """
    a = jnp.asarray(a)
    b = jnp.asarray(b)
    if a.ndim < 1 or b.ndim < 1:
        raise ValueError(
            "overlap: a and b must be winner lists (at least 1-d), got shapes "
            f"{a.shape} and {b.shape}"
        )
    found = jnp.vectorize(_contains, signature="(m),(k)->(k)")(jnp.sort(b, axis=-1), a)
    return jnp.sum(found & (a >= 0), axis=-1).astype(jnp.int32)


def _contains(sorted_b: Int[Array, " m"], a: Int[Array, " k"]) -> Bool[Array, " k"]:
    pos = jnp.minimum(jnp.searchsorted(sorted_b, a), sorted_b.shape[0] - 1)
    return sorted_b[pos] == a


def _is_plain_array(x: Any) -> bool:
    return eqx.is_array(x) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


# Arrays of the result that the check after a run is tied to: at most this many entries.
_TIE_MAX = 1 << 16


def _tie(x: Array, token: Int[Array, ""]) -> Array:
    """`x` with `token` (always 0) added to its first entry: `x`, made to depend on `token`.
    Arrays above `_TIE_MAX` entries (synapse matrices) are left alone: XLA copies an array
    to update one entry of it where the array has other users, which for the synapses of a
    sparse area (25 MB at n = 10^5) cost more than the 100 steps of a converged run."""
    if x.size == 0 or x.size > _TIE_MAX:
        return x
    first = (0,) * x.ndim
    if x.dtype == jnp.bool_:
        return x.at[first].set(x[first] | (token != 0))
    return x.at[first].add(token.astype(x.dtype))


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"Brain: {what} names must be non-empty strings, got {name!r}")
    return name


def _names(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be an area name or a list of area names, got {value!r}")
    return tuple(value)


class Brain(eqx.Module):
    r"""Brain areas of the assembly calculus (Papadimitriou et al. 2020).

    Each area has `n` excitatory neurons of which exactly `k` fire at a time (the k-cap);
    each stimulus is a set of `k_s` neurons that fire together. Every ordered pair (stimulus
    to area, area to area, an area to itself included) is wired by independent Bernoulli(`p`)
    synapses of weight 1. One projection step computes, for every target area at once, the
    input of each neuron from the current winners of its sources,

    $$ x_i = \sum_{s} W^{s}_i + \sum_{A} \sum_{j \in \mathrm{win}(A)} W^{A}_{j i}, $$

    takes the `k` largest (ties to the lower index) as the new winners, and multiplies every
    synapse from a neuron that fired at `t-1` onto a neuron that fires at `t` by `1 + beta`.

    Modes:

    - `"sparse"` (default, as in the reference code): only neurons that have ever fired are
      represented. The never-fired neurons compete through the `k` largest of their
      `Binomial(total_k, p)` inputs, drawn from the binomial tail (see
      `neurojax.assembly._sampling`); when one of them wins, its synapses are created as
      the reference algorithm does: its input is split among the sources by choosing that
      many of the `total_k` firing inputs without replacement, its synapses from the chosen
      winners are 1, those from the other winners 0, and every other synapse of it is
      Bernoulli(p). Static shapes: each area's state holds up to `capacity` fired neurons.
      A projection that needs more sets `BrainState.overflow`: eager calls of `project` and
      `project_rounds` then grow the capacity (`grow_capacity`) and rerun from the state
      they were given, with the results a larger capacity would have given from the start;
      under `jit` the capacity is part of the compiled shapes and the run raises once at its
      end, naming the area and the capacity to build the Brain with. Results never depend
      on the capacity (for threefry keys, JAX's default: the random synapses of a neuron are
      drawn by its index, see `init_state`).
    - `"explicit"`: all `n` neurons and their synapses are represented, densely while an
      area pair has at most 2**24 synapse slots and as padded fan-out lists above.

    Args:
        areas: `{name: (n, k)}` with `0 < k <= n`.
        stimuli: `{name: k_s}` with `k_s >= 1`.
        p: connection probability, `0 < p < 1`.
        beta: plasticity: a number for every connection, or a mapping whose keys are area
            names (the default for every connection into that area) or `(source, target)`
            pairs (source: a stimulus or an area). Values must be > -1 (weights stay
            positive); 0 switches a connection's plasticity off.
        mode: `"sparse"` or `"explicit"`.
        capacity: sparse mode only: how many fired neurons `init_state` makes room for in an
            area, an int for all areas or `{area: int}`; `k <= capacity <= n - k`. Default:
            about twice the support of the reference projection after 100 steps at the
            area's smallest `beta`, `min(n - k, max(1024, 8k (0.05 / beta)^0.45))` with the
            factor kept within `[8k, 32k]`: `8k` at `beta >= 0.05` (supports settle near
            `4k`), `16.5k` at `beta = 0.01` (supports reach about `8k`; 5233 neurons for the
            reference experiment n = 10^5, k = 317, p = 0.01). Eager projections grow it as
            needed; under `jit` a projection that outgrows it raises.
        storage: explicit mode only: `"auto"`, `"dense"` or `"fanout"`.
        key: PRNG key of the random synapses (and of the sparse-mode draws).

    Example:
    ```python
    brain = nj.assembly.Brain(areas={"A": (100_000, 317)}, stimuli={"s": 317},
                              p=0.01, beta=0.05, key=jax.random.key(0))
    state = brain.init_state()
    state = brain.project(state, stimuli={"s": ["A"]})
    state, trace = brain.project_rounds(state, stimuli={"s": ["A"]}, areas={"A": ["A"]},
                                        steps=99)
    trace.support["A"][-1]   # about 4k neurons have ever fired
    ```

    References:
        C. H. Papadimitriou, S. S. Vempala, D. Mitropolsky, M. Collins, W. Maass (2020),
        "Brain computation by assemblies of neurons", PNAS 117(25):14464-14472.
    """

    area_names: tuple[str, ...] = eqx.field(static=True)
    sizes: tuple[int, ...] = eqx.field(static=True)
    caps: tuple[int, ...] = eqx.field(static=True)
    stimulus_names: tuple[str, ...] = eqx.field(static=True)
    stimulus_sizes: tuple[int, ...] = eqx.field(static=True)
    p: float = eqx.field(static=True)
    mode: str = eqx.field(static=True)
    capacities: tuple[int, ...] = eqx.field(static=True)
    layouts: tuple[tuple[str, str, str], ...] = eqx.field(static=True)
    beta: dict[tuple[str, str], Float[Array, ""]]
    key: PRNGKeyArray

    def __init__(
        self,
        areas: Mapping[str, tuple[int, int]],
        stimuli: Mapping[str, int] | None = None,
        p: float = 0.01,
        beta: float | Mapping[Any, float] = 0.05,
        *,
        mode: str = "sparse",
        capacity: int | Mapping[str, int] | None = None,
        storage: str = "auto",
        key: PRNGKeyArray,
    ):
        if not isinstance(areas, Mapping) or not areas:
            raise ValueError(
                f"Brain: areas must be a non-empty mapping {{name: (n, k)}}, got {areas!r}"
            )
        stimuli = {} if stimuli is None else stimuli
        if not isinstance(stimuli, Mapping):
            raise ValueError(f"Brain: stimuli must be a mapping {{name: k_s}}, got {stimuli!r}")
        if mode not in _MODES:
            raise ValueError(f"Brain: mode must be one of {_MODES}, got {mode!r}")
        names, sizes, caps = [], [], []
        for name, nk in areas.items():
            _check_name("area", name)
            if not (isinstance(nk, (tuple, list)) and len(nk) == 2 and all(map(_is_int, nk))):
                raise ValueError(
                    f"Brain: areas[{name!r}] must be a pair of ints (n, k), got {nk!r}"
                )
            n, k = int(nk[0]), int(nk[1])
            if not 0 < k <= n:
                raise ValueError(f"Brain: areas[{name!r}] needs 0 < k <= n, got n={n}, k={k}")
            if n >= 2**31 - 1:
                raise ValueError(f"Brain: areas[{name!r}]: n must be < 2**31 - 1, got {n}")
            names.append(name)
            sizes.append(n)
            caps.append(k)
        stim_names, stim_sizes = [], []
        for name, ks in stimuli.items():
            _check_name("stimulus", name)
            if name in areas:
                raise ValueError(
                    f"Brain: {name!r} is both an area and a stimulus; names must differ"
                )
            if not _is_int(ks) or ks < 1:
                raise ValueError(f"Brain: stimuli[{name!r}] must be an int >= 1, got {ks!r}")
            stim_names.append(name)
            stim_sizes.append(int(ks))
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0 < p < 1:
            raise ValueError(f"Brain: p must be a number in (0, 1), got {p!r}")
        self.area_names, self.sizes, self.caps = tuple(names), tuple(sizes), tuple(caps)
        self.stimulus_names, self.stimulus_sizes = tuple(stim_names), tuple(stim_sizes)
        self.p = float(p)
        self.mode = mode
        self.beta = self._resolve_beta(beta)
        self.capacities = self._resolve_capacity(capacity)
        self.layouts = self._resolve_storage(storage)
        if key is None:
            raise ValueError("Brain: key is required (a jax.random.key)")
        self.key = key

    # -- construction helpers -------------------------------------------------------------

    def _resolve_capacity(self, capacity: Any) -> tuple[int, ...]:
        if self.mode == "explicit":
            if capacity is not None:
                raise ValueError(
                    "Brain: capacity applies to sparse mode only (explicit areas hold all n "
                    f"neurons), got capacity={capacity!r} with mode='explicit'"
                )
            return self.sizes
        if capacity is None:
            per = {}
        elif _is_int(capacity):
            per = {name: int(capacity) for name in self.area_names}
        elif isinstance(capacity, Mapping):
            unknown = set(capacity) - set(self.area_names)
            if unknown:
                raise ValueError(
                    f"Brain: capacity names unknown areas {sorted(unknown)}; areas are "
                    f"{list(self.area_names)}"
                )
            per = dict(capacity)
        else:
            raise ValueError(
                f"Brain: capacity must be an int or a mapping {{area: int}}, got {capacity!r}"
            )
        out = []
        for name, n, k in zip(self.area_names, self.sizes, self.caps):
            if n - k < k:
                raise ValueError(
                    f"Brain: sparse mode needs n >= 2k (never-fired candidates must outnumber the "
                    f"cap), got n={n}, k={k} in area {name!r}; use mode='explicit' for small areas"
                )
            beta = min(float(v) for (_, t), v in self.beta.items() if t == name)
            c = per.get(name, _default_capacity(n, k, beta))
            if not _is_int(c) or not k <= c <= n - k:
                raise ValueError(
                    f"Brain: capacity of area {name!r} must be an int with k <= capacity <= n - k "
                    f"({k} <= capacity <= {n - k}), got {c!r}"
                )
            out.append(int(c))
        return tuple(out)

    def _resolve_storage(self, storage: str) -> tuple[tuple[str, str, str], ...]:
        if storage not in _STORAGES:
            raise ValueError(f"Brain: storage must be one of {_STORAGES}, got {storage!r}")
        if self.mode == "sparse":
            if storage != "auto":
                raise ValueError(
                    f"Brain: storage applies to explicit mode only (sparse mode stores its support "
                    f"densely), got storage={storage!r} with mode='sparse'"
                )
            return tuple((a, b, "dense") for a in self.area_names for b in self.area_names)
        out = []
        for a, na in zip(self.area_names, self.sizes):
            for b, nb in zip(self.area_names, self.sizes):
                layout = storage
                if layout == "auto":
                    layout = "dense" if na * nb <= _DENSE_MAX else "fanout"
                if layout == "fanout" and _synapses.fanout_width(nb, self.p) * (nb + 1) >= 2**31:
                    raise ValueError(
                        f"Brain: explicit synapses {a!r} -> {b!r} are too many for fan-out lists "
                        f"(n={nb}, p={self.p}); use mode='sparse'"
                    )
                out.append((a, b, layout))
        return tuple(out)

    def _resolve_beta(self, beta: Any) -> dict[tuple[str, str], Array]:
        sources = self.stimulus_names + self.area_names
        dtype = jnp.result_type(float)

        def check(where: str, value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"Brain: {where} must be a number > -1, got {value!r}")
            if not (math.isfinite(float(value)) and float(value) > -1.0):
                raise ValueError(f"Brain: {where} must be finite and > -1, got {value!r}")
            return float(value)

        default, per_area, per_pair = 0.05, {}, {}
        if isinstance(beta, Mapping):
            for key, value in beta.items():
                if isinstance(key, str):
                    if key not in self.area_names:
                        raise ValueError(
                            f"Brain: beta key {key!r} is not an area; areas are "
                            f"{list(self.area_names)}"
                        )
                    per_area[key] = check(f"beta[{key!r}]", value)
                elif isinstance(key, tuple) and len(key) == 2:
                    src, tgt = key
                    if src not in sources or tgt not in self.area_names:
                        raise ValueError(
                            f"Brain: beta key {key!r} must be (source, target) with a source in "
                            f"{list(sources)} and a target area in {list(self.area_names)}"
                        )
                    per_pair[key] = check(f"beta[{key!r}]", value)
                else:
                    raise ValueError(
                        "Brain: beta keys must be area names or (source, target) pairs, "
                        f"got {key!r}"
                    )
        else:
            default = check("beta", beta)
        out = {}
        for tgt in self.area_names:
            for src in sources:
                value = per_pair.get((src, tgt), per_area.get(tgt, default))
                out[(src, tgt)] = jnp.asarray(value, dtype)
        return out

    # -- lookups ----------------------------------------------------------------------------

    def _area(self, name: Any, where: str) -> int:
        if name not in self.area_names:
            raise ValueError(f"{where}: unknown area {name!r}; areas are {list(self.area_names)}")
        return self.area_names.index(name)

    def _layout(self, src: str, tgt: str) -> str:
        for a, b, layout in self.layouts:
            if a == src and b == tgt:
                return layout
        raise KeyError((src, tgt))

    # -- state ------------------------------------------------------------------------------

    def init_state(self, key: PRNGKeyArray | None = None) -> BrainState:
        """A fresh brain: no assemblies yet and newly drawn random synapses.

        `key` defaults to the brain's key; give different keys (for example under
        `jax.vmap`) for independent brains with the same parameters. The synapses of each
        neuron are drawn from keys folded with its index (see `_synapses.random_dense`), so
        with a threefry key (JAX's default) they do not depend on the capacity: a state made
        with a larger capacity extends one made with a smaller.
        """
        key = self.key if key is None else key
        k_state, _, _ = jr.split(key, 3)
        stim_w = {
            (s, t): self._stimulus_synapses(key, s, t, c)
            for s in self.stimulus_names
            for t, c in zip(self.area_names, self.capacities)
        }
        weights = {
            (a, b): self._area_synapses(key, a, b, ca, cb)
            for a, ca in zip(self.area_names, self.capacities)
            for b, cb in zip(self.area_names, self.capacities)
        }
        explicit = self.mode == "explicit"

        def zeros():
            # New arrays for every field: a state whose leaves share a buffer cannot be
            # donated to a jitted call.
            return {a: jnp.zeros((), jnp.int32) for a in self.area_names}

        return BrainState(
            winners={a: jnp.full((k,), -1, jnp.int32) for a, k in zip(self.area_names, self.caps)},
            support=zeros(),
            new_winners=zeros(),
            fixed={a: jnp.zeros((), bool) for a in self.area_names},
            fired={a: jnp.zeros((n,), bool) for a, n in zip(self.area_names, self.sizes)}
            if explicit
            else {},
            stimulus_weights=stim_w,
            weights=weights,
            key=k_state,
            step=jnp.zeros((), jnp.int32),
            # A copy: a caller that donates the state must not delete the Brain's own key.
            synapse_key=jr.wrap_key_data(jnp.copy(jr.key_data(key)), impl=jr.key_impl(key)),
            overflow=zeros(),
            faults=zeros(),
        )

    def _stimulus_synapses(self, key: PRNGKeyArray, s: str, t: str, size: int) -> Array:
        """The initial total weight from stimulus `s` onto the first `size` neurons of `t`:
        Binomial(k_s, p) each (a threefry key's draws of a vector are prefix-consistent)."""
        i, j = self.stimulus_names.index(s), self.area_names.index(t)
        kk = jr.fold_in(jr.fold_in(jr.split(key, 3)[1], i), j)
        ks = self.stimulus_sizes[i]
        return jr.binomial(kk, ks, self.p, (size,)).astype(jnp.result_type(float))

    def _area_synapses(self, key: PRNGKeyArray, a: str, b: str, n_src: int, n_tgt: int) -> Any:
        """The initial synapses from the first `n_src` neurons of `a` onto the first `n_tgt`
        of `b`."""
        i, j = self.area_names.index(a), self.area_names.index(b)
        kk = jr.fold_in(jr.fold_in(jr.split(key, 3)[2], i), j)
        if self._layout(a, b) == "fanout":
            return _synapses.random_fanout(kk, n_src, n_tgt, self.p)
        return _synapses.random_dense(kk, n_src, n_tgt, self.p)

    def capacity(self, state: BrainState, area: str) -> int:
        """How many fired neurons `state` holds room for in `area` (`n` in explicit mode)."""
        i = self._area(area, "Brain.capacity")
        if self.mode == "explicit":
            return self.sizes[i]
        return int(state.weights[(area, area)].shape[-1])

    def grow_capacity(self, state: BrainState, capacity: int | Mapping[str, int]) -> BrainState:
        """`state` with room for `capacity` fired neurons in its sparse areas (an int for
        every area or `{area: int}`; an area's capacity never shrinks).

        The synapses of the added neurons are the ones `init_state` draws for them (from
        `state.synapse_key`), so a projection from the grown state gives what it would have
        given had the state been made with the larger capacity. Eager `project` and
        `project_rounds` call it when a projection overflows.
        """
        if self.mode != "sparse":
            raise ValueError("Brain.grow_capacity: explicit areas hold all n neurons already")
        if _is_int(capacity):
            capacity = {a: int(capacity) for a in self.area_names}
        if not isinstance(capacity, Mapping):
            raise ValueError(
                "Brain.grow_capacity: capacity must be an int or a mapping {area: int}, got "
                f"{capacity!r}"
            )
        old = {a: self.capacity(state, a) for a in self.area_names}
        new = dict(old)
        for a, c in capacity.items():
            i = self._area(a, "Brain.grow_capacity")
            n, k = self.sizes[i], self.caps[i]
            if not _is_int(c) or not k <= c <= n - k:
                raise ValueError(
                    f"Brain.grow_capacity: capacity of area {a!r} must be an int with k <= "
                    f"capacity <= n - k ({k} <= capacity <= {n - k}), got {c!r}"
                )
            new[a] = max(old[a], int(c))
        if new == old:
            return state
        key = state.synapse_key
        stim_w = {}
        for (s, t), w in state.stimulus_weights.items():
            fresh = self._stimulus_synapses(key, s, t, new[t])
            stim_w[(s, t)] = fresh.at[: old[t]].set(w)
        weights = {}
        for (a, b), w in state.weights.items():
            fresh = self._area_synapses(key, a, b, new[a], new[b])
            # Only rows and columns of fired neurons (inside the old capacity) ever change.
            weights[(a, b)] = fresh.at[: old[a], : old[b]].set(w)
        return eqx.tree_at(lambda st: (st.stimulus_weights, st.weights), state, (stim_w, weights))

    def set_winners(self, state: BrainState, area: str, labels: Any) -> BrainState:
        """Make `labels` (at most `k` distinct neuron labels) the firing set of `area`.

        Used to fire part of an assembly (pattern completion) or a chosen set. In sparse mode
        the labels must be neurons that have fired before (`< support`); in explicit mode any
        neuron `< n`. Out-of-range or repeated labels raise (under `jit` too).
        """
        i = self._area(area, "Brain.set_winners")
        k, n = self.caps[i], self.sizes[i]
        labels = jnp.asarray(labels)
        if labels.ndim != 1 or labels.shape[0] > k or not jnp.issubdtype(labels.dtype, jnp.integer):
            raise ValueError(
                f"Brain.set_winners: labels must be a 1-d integer array of at most k={k} labels, "
                f"got shape {labels.shape} and dtype {labels.dtype}"
            )
        labels = labels.astype(jnp.int32)
        limit = state.support[area] if self.mode == "sparse" else jnp.asarray(n, jnp.int32)
        if not isinstance(labels, jax.core.Tracer) and not isinstance(limit, jax.core.Tracer):
            # Concrete labels: the error now, with the values, not at the next run.
            values, top = np.asarray(labels), int(np.max(np.asarray(limit)))
            bad = values[(values < 0) | (values >= top)]
            what = "the support of the area" if self.mode == "sparse" else "n"
            if bad.size:
                raise ValueError(
                    f"Brain.set_winners: labels of area {area!r} must be in [0, {top}) ({what}), "
                    f"got {bad.tolist()[:5]}"
                )
            if np.unique(values).size != values.size:
                raise ValueError(
                    f"Brain.set_winners: labels of area {area!r} must be distinct, got "
                    f"{values.tolist()[:10]}"
                )
        srt = jnp.sort(labels)
        bad = jnp.any(labels < 0) | jnp.any(labels >= limit) | jnp.any(srt[1:] == srt[:-1])
        labels = eqx.error_if(
            labels,
            bad,
            f"Brain.set_winners: labels of area {area!r} must be distinct and in [0, limit) where "
            "limit is the support (sparse mode) or n (explicit mode)",
        )
        winners = jnp.full((k,), -1, jnp.int32).at[: labels.shape[0]].set(labels)
        fired = state.fired
        support = state.support
        if self.mode == "explicit":
            f = state.fired[area].at[labels].set(True)
            fired = {**state.fired, area: f}
            support = {**state.support, area: jnp.sum(f).astype(jnp.int32)}
        return eqx.tree_at(
            lambda s: (s.winners, s.fired, s.support),
            state,
            ({**state.winners, area: winners}, fired, support),
        )

    def fix(self, state: BrainState, area: str) -> BrainState:
        """Freeze the assembly of `area`: projections into it keep its winners (Hebbian
        updates onto them still happen). Raises if the area has no assembly."""
        self._area(area, "Brain.fix")
        fixed = eqx.error_if(
            jnp.ones((), bool),
            ~jnp.any(state.winners[area] >= 0),
            f"Brain.fix: area {area!r} has no assembly to fix",
        )
        return eqx.tree_at(lambda s: s.fixed, state, {**state.fixed, area: fixed})

    def unfix(self, state: BrainState, area: str) -> BrainState:
        """Let the assembly of `area` change again."""
        self._area(area, "Brain.unfix")
        return eqx.tree_at(lambda s: s.fixed, state, {**state.fixed, area: jnp.zeros((), bool)})

    # -- projection -------------------------------------------------------------------------

    def _routes(self, stimuli: Any, areas: Any, where: str) -> tuple:
        stimuli = {} if stimuli is None else stimuli
        areas = {} if areas is None else areas
        for arg, value in (("stimuli", stimuli), ("areas", areas)):
            if not isinstance(value, Mapping):
                raise ValueError(
                    f"{where}: {arg} must be a mapping {{source: [target areas]}}, got {value!r}"
                )
        stim_in = {t: [] for t in self.area_names}
        area_in = {t: [] for t in self.area_names}
        for s, targets in stimuli.items():
            if s not in self.stimulus_names:
                raise ValueError(
                    f"{where}: unknown stimulus {s!r} in stimuli; stimuli are "
                    f"{list(self.stimulus_names)}"
                )
            for t in _names(f"{where}: stimuli[{s!r}]", targets):
                self._area(t, f"{where}: stimuli[{s!r}]")
                if s in stim_in[t]:
                    raise ValueError(f"{where}: stimuli[{s!r}] names area {t!r} twice")
                stim_in[t].append(s)
        for src, targets in areas.items():
            self._area(src, f"{where}: areas (source)")
            for t in _names(f"{where}: areas[{src!r}]", targets):
                self._area(t, f"{where}: areas[{src!r}]")
                if src in area_in[t]:
                    raise ValueError(f"{where}: areas[{src!r}] names area {t!r} twice")
                area_in[t].append(src)
        routes = tuple(
            (t, tuple(stim_in[t]), tuple(area_in[t]))
            for t in self.area_names
            if stim_in[t] or area_in[t]
        )
        if not routes:
            raise ValueError(f"{where}: nothing to project: stimuli and areas name no target area")
        return routes

    def input_currents(
        self,
        state: BrainState,
        stimuli: Mapping[str, Sequence[str]] | None = None,
        areas: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Float[Array, " c"]]:
        """The synaptic input of every represented neuron of each target area.

        Same routing as `project`; differentiable with respect to the weights in `state`
        (the training example uses it). In sparse mode entries at and beyond the support are
        synapses of neurons not yet represented and carry no meaning.
        """
        routes = self._routes(stimuli, areas, "Brain.input_currents")
        return {t: self._inputs(state, t, stims, srcs) for t, stims, srcs in routes}

    def _inputs(
        self,
        state: BrainState,
        t: str,
        stims: tuple,
        srcs: tuple,
        limit: Array | None = None,
        sums: Mapping | None = None,
    ) -> Array:
        """Summed input of target `t`; with `limit`, dense synapses are summed over the first
        `limit` neurons only (0 beyond: the sparse mode's not-yet-represented neurons).
        `sums` may hold those dense sums already computed, by `(source, target)`."""
        x = jnp.zeros((self._cap(state, t),), jnp.result_type(float))
        for s in stims:
            x = x + state.stimulus_weights[(s, t)]
        for a in srcs:
            w = state.weights[(a, t)]
            if isinstance(w, FanOut):
                x = x + _synapses.inputs(w, state.winners[a])
            elif sums is not None and (a, t) in sums:
                x = x + sums[(a, t)]
            else:
                x = x + _synapses.dense_inputs(w, state.winners[a], limit)
        return x

    def _sum_limit(self, support: Mapping[str, Array], t: str) -> Array | None:
        """The `limit` of target `t`'s dense input sums: its support in sparse mode."""
        return support[t] if self.mode == "sparse" else None

    def _dense_sums(self, state: BrainState, routes: tuple) -> dict:
        """The dense input sums of a step from `state`, by `(source, target)`."""
        return {
            (a, t): _synapses.dense_inputs(
                state.weights[(a, t)], state.winners[a], self._sum_limit(state.support, t)
            )
            for t, _, srcs in routes
            for a in srcs
            if not isinstance(state.weights[(a, t)], FanOut)
        }

    def _cap(self, state: BrainState, t: str) -> int:
        """The capacity of area `t` in `state` (static: an array size)."""
        if self.mode == "explicit":
            return self.sizes[self.area_names.index(t)]
        return state.weights[(t, t)].shape[-1]

    def project(
        self,
        state: BrainState,
        stimuli: Mapping[str, Sequence[str]] | None = None,
        areas: Mapping[str, Sequence[str]] | None = None,
        *,
        plasticity: bool = True,
    ) -> BrainState:
        """One synchronous projection step.

        `stimuli={stim: [areas]}` fires each stimulus into the listed areas and
        `areas={source: [targets]}` fires each source area's current assembly into its
        targets; every area named as a target gets new winners, computed from the state
        before the step. `plasticity=False` skips the Hebbian update.

        Compiled once per routing and shapes. Called eagerly, a step that needs more room
        than a sparse area's capacity grows it (`grow_capacity`) and runs again, with the
        same result; under `jit` or `vmap` the step raises instead, once, after it (as it
        does, eagerly or not, when a source area has no assembly).
        """
        routes = self._routes(stimuli, areas, "Brain.project")
        return self._checked("Brain.project", state, routes, plasticity, None)

    def project_rounds(
        self,
        state: BrainState,
        stimuli: Mapping[str, Sequence[str]] | None = None,
        areas: Mapping[str, Sequence[str]] | None = None,
        steps: int = 1,
        *,
        plasticity: bool = True,
    ) -> tuple[BrainState, ProjectionTrace]:
        """`steps` repeated projections with the same routing, as one `jax.lax.scan`.

        Returns the final state and a `ProjectionTrace` of every target area. The compiled
        step has no branch and no loop of unknown length (accelerators run it without
        returning to the host); the conditions that invalidate a run (a sparse area's support
        beyond its capacity, a source without an assembly) are flags in the state, read after
        the run: called eagerly, an overflow grows the capacity and reruns all `steps` from
        `state` (same results as a larger capacity from the start) and any other fault
        raises; under `jit` or `vmap` one `eqx.error_if` after the scan raises, naming the
        area and the capacity to build the Brain with.
        """
        if not _is_int(steps) or steps < 1:
            raise ValueError(f"Brain.project_rounds: steps must be an int >= 1, got {steps!r}")
        routes = self._routes(stimuli, areas, "Brain.project_rounds")
        return self._checked("Brain.project_rounds", state, routes, plasticity, int(steps))

    def _checked(self, where: str, state: BrainState, routes: tuple, plasticity: bool, steps):
        """`_run`, then its flags: grown and rerun or raised eagerly, `eqx.error_if` traced."""
        leaves = jax.tree_util.tree_leaves((self, state))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            out = self._run(state, routes, plasticity, steps)
            new = out if steps is None else out[0]
            return self._error_if(where, out, new)
        self._raise_faults(where, state, "the state passed in")
        while True:
            out = self._run(state, routes, plasticity, steps)
            new = out if steps is None else out[0]
            needed = jax.device_get(new.overflow)
            grow = {a: int(v) for a, v in needed.items() if int(v) > 0}
            if not grow:
                self._raise_faults(where, new, "the projection")
                return out
            capacity = {}
            for a, v in grow.items():
                i = self.area_names.index(a)
                n, k, cap = self.sizes[i], self.caps[i], self._cap(state, a)
                if v > n - k:
                    raise ValueError(
                        f"{where}: the support of area {a!r} would exceed n - k = {n - k} "
                        f"neurons (n={n}, k={k}), the most a sparse area can represent; use "
                        "mode='explicit' or a larger area"
                    )
                capacity[a] = min(n - k, max(2 * cap, v))
            state = self.grow_capacity(state, capacity)

    def _messages(self, where: str, state: BrainState) -> list[tuple[Array, str]]:
        """Every fault of `state` as `(condition, message)`."""
        out = []
        for a in self.area_names:
            f = state.faults[a]
            out.append(
                (
                    (f & _EMPTY_SOURCE) != 0,
                    f"{where}: area {a!r} has no assembly yet, so it cannot be a source; project "
                    "a stimulus (or another area) into it first",
                )
            )
            out.append(
                (
                    (f & _ABOVE_BOUND) != 0,
                    f"{where}: a first-time winner of area {a!r} drew an input above the static "
                    "bound of the input selection (please report)",
                )
            )
            if self.mode == "sparse":
                i = self.area_names.index(a)
                cap, n, k = self._cap(state, a), self.sizes[i], self.caps[i]
                out.append(
                    (
                        state.overflow[a] > 0,
                        f"{where}: the support of area {a!r} would exceed its capacity {cap}; "
                        "under jit or vmap the capacity cannot grow: build the Brain with "
                        f"capacity={{{a!r}: {min(n - k, 2 * cap)}}} or more (state.overflow"
                        f"[{a!r}] holds the support the run needed), or call {where} outside "
                        "jit, which grows it",
                    )
                )
        return out

    def _raise_faults(self, where: str, state: BrainState, what: str) -> None:
        """Eagerly: raise the first fault of `state` as a ValueError."""
        for cond, msg in self._messages(where, state):
            if bool(jnp.any(cond)):
                raise ValueError(msg)

    def _error_if(self, where: str, out: Any, state: BrainState) -> Any:
        """Traced: one `eqx.branched_error_if` over every fault of `state`, on all of `out`
        (so that it stays in a compiled program that keeps any part of the result)."""
        checks = self._messages(where, state)
        failed = jnp.stack([jnp.any(c) for c, _ in checks])
        # The check runs on a scalar (0 unless it raises), which is then added to one entry of
        # every array of the result up to `_TIE_MAX` entries (winners, supports, counts, the
        # trace, stimulus weights): the result (synapse matrices of hundreds of MB) never
        # passes through the check's branch, where XLA would copy it, and a program that
        # keeps any of those keeps the check. A program that keeps only the synapse matrices
        # drops it, as it drops any `eqx.error_if` whose result is unused. (An optimisation
        # barrier does not keep it: XLA drops the barrier's unused operand.)
        token = eqx.branched_error_if(
            jnp.zeros((), jnp.int32),
            jnp.any(failed),
            jnp.argmax(failed),
            [msg for _, msg in checks],
        )
        plain, keys = eqx.partition(out, _is_plain_array)
        plain = jax.tree.map(lambda x: _tie(x, token), plain)
        return eqx.combine(plain, keys)

    @eqx.filter_jit
    def _run(self, state: BrainState, routes: tuple, plasticity: bool, steps: int | None):
        """The unchecked projection: one step (`steps=None`) or `steps` rounds as a scan,
        with no branch and no loop of unknown trip count; faults are left in the state."""
        if steps is None:
            return self._step(state, routes, plasticity, None)[0]
        targets = [t for t, _, _ in routes]

        # Each step also computes the dense input sums of the next one, in the kernel that
        # updates the synapses (see `_synapses.dense_update_inputs`); the last step's are not
        # used.
        def body(carry, _):
            s, sums = carry
            new, sums, overlaps = self._step(s, routes, plasticity, sums)
            rec = (
                {t: new.winners[t] for t in targets},
                {t: new.new_winners[t] for t in targets},
                {t: new.support[t] for t in targets},
                {
                    t: _overlap_labels(new.winners[t], s.winners[t], self._cap(s, t))
                    if overlaps[t] is None
                    else overlaps[t]
                    for t in targets
                },
            )
            return (new, sums), rec

        carry = (state, self._dense_sums(state, routes))
        (state, _), (win, new, sup, ov) = jax.lax.scan(body, carry, None, length=steps)
        return state, ProjectionTrace(winners=win, new_winners=new, support=sup, overlap=ov)

    def _step(
        self, state: BrainState, routes: tuple, plasticity: bool, sums: dict | None
    ) -> tuple[BrainState, dict | None, dict]:
        """One projection step. With `sums` (the dense input sums of this step, computed by
        the step before), also returns those of the next step with the same routing, each
        computed by the kernel that updates its synapses (`dense_update_inputs`). The last
        result holds, by target, the overlap of its new winners with the old ones where the
        step computed it on the way (sparse mode), else None. Faults go into the state's
        flags (`BrainState.overflow`, `BrainState.faults`), never into a branch."""
        faults = dict(state.faults)
        overflow = dict(state.overflow)
        for a in sorted({a for _, _, srcs in routes for a in srcs}):
            empty = ~jnp.any(state.winners[a] >= 0)
            faults[a] = faults[a] | jnp.where(empty, _EMPTY_SOURCE, 0).astype(jnp.int32)
        key, draws = self._step_draws(state.key, routes)
        new_winners = dict(state.winners)
        support = dict(state.support)
        counts = dict(state.new_winners)
        fired = dict(state.fired)
        stim_w = dict(state.stimulus_weights)
        weights = dict(state.weights)
        created, overlaps = {}, {}
        for (t, stims, srcs), draws_t in zip(routes, draws):
            if self.mode == "sparse":
                out, (needed, above) = self._sparse_target(state, t, stims, srcs, draws_t, sums)
                overflow[t] = jnp.maximum(overflow[t], needed)
                faults[t] = faults[t] | jnp.where(above, _ABOVE_BOUND, 0).astype(jnp.int32)
            else:
                out = self._explicit_target(state, t, stims, srcs, sums)
            new_winners[t], support[t], counts[t], f_t, created_stim, created_w, overlaps[t] = out
            if f_t is not None:
                fired[t] = f_t
            created[t] = (created_stim, created_w)
        # The synapses change once every target has its winners: the input sums of the next
        # step are taken from the sources' new winners.
        next_sums = None if sums is None else {}
        for t, stims, srcs in routes:
            win_t = new_winners[t]
            created_stim, created_w = created[t]
            mask = None
            for s in stims:
                w = created_stim.get(s, state.stimulus_weights[(s, t)])
                if plasticity:
                    w = _synapses.hebbian_vector(w, win_t, 1.0 + self.beta[(s, t)])
                stim_w[(s, t)] = w
            for a in srcs:
                w = state.weights[(a, t)]
                factor = 1.0 + self.beta[(a, t)]
                if isinstance(w, FanOut):
                    if plasticity:
                        if mask is None:
                            mask = _synapses.winner_mask(win_t, self._cap(state, t))
                        w = _synapses.hebbian(w, state.winners[a], win_t, mask, factor)
                else:
                    hebb = (state.winners[a], win_t, factor) if plasticity else None
                    if next_sums is None:
                        w = _synapses.dense_update(w, created_w.get(a), hebb)
                    else:
                        w, next_sums[(a, t)] = _synapses.dense_update_inputs(
                            w, created_w.get(a), hebb, new_winners[a], self._sum_limit(support, t)
                        )
                weights[(a, t)] = w
        new_state = eqx.tree_at(
            lambda s: (
                s.winners,
                s.support,
                s.new_winners,
                s.fired,
                s.stimulus_weights,
                s.weights,
                s.key,
                s.step,
                s.overflow,
                s.faults,
            ),
            state,
            (
                new_winners,
                support,
                counts,
                fired,
                stim_w,
                weights,
                key,
                state.step + 1,
                overflow,
                faults,
            ),
        )
        return new_state, next_sums, overlaps

    def _explicit_target(self, state, t, stims, srcs, sums=None):
        i = self.area_names.index(t)
        k = self.caps[i]
        x = self._inputs(state, t, stims, srcs, sums=sums)
        _, idx = _top_k(x, k, x[..., :0])
        idx = idx.astype(jnp.int32)
        fixed = state.fixed[t]
        win = jnp.where(fixed, state.winners[t], idx)
        before = state.fired[t]
        safe = jnp.where(win < 0, self.sizes[i], win)
        first = ~jnp.take(before, safe, mode="fill", fill_value=True)
        fired = before.at[safe].set(True, mode="drop")
        n_first = jnp.sum(first).astype(jnp.int32)
        return win, jnp.sum(fired).astype(jnp.int32), n_first, fired, {}, {}, None

    def _step_draws(self, key: PRNGKeyArray, routes: tuple) -> tuple[PRNGKeyArray, list]:
        """The random numbers of one step, from one draw of `key`: the next state's key and,
        per target in sparse mode, a key for the first-time winners' input choice and `k`
        words for the candidates (one draw instead of a split per use: on CPU each draw of a
        threefry key is a loop of its own)."""
        impl = jr.key_impl(key)
        kw = jr.key_data(key).shape[-1]
        sparse = self.mode == "sparse"
        sizes = [kw + self.caps[self.area_names.index(t)] if sparse else 0 for t, _, _ in routes]
        words = _random_words(key, kw + sum(sizes))
        draws, at = [], kw
        for size in sizes:
            if size:
                draws.append(
                    (jr.wrap_key_data(words[at : at + kw], impl=impl), words[at + kw : at + size])
                )
            else:
                draws.append(None)
            at += size
        return jr.wrap_key_data(words[:kw], impl=impl), draws

    def _sparse_target(self, state, t, stims, srcs, draws, sums):
        """The new winners of sparse target `t` and the synapses of its first-time winners;
        also `(needed, above)`: the support the step needed if it exceeds the capacity (else
        0) and whether a first-time winner's input exceeded the selection's static bound."""
        i = self.area_names.index(t)
        n, k, cap = self.sizes[i], self.caps[i], self._cap(state, t)
        k_items, cand_words = draws
        w = state.support[t]
        x = self._inputs(state, t, stims, srcs, limit=w, sums=sums)
        x = jnp.where(jnp.arange(cap, dtype=jnp.int32) < w, x, -jnp.inf)
        stim_sizes = [self.stimulus_sizes[self.stimulus_names.index(s)] for s in stims]
        src_counts = [jnp.sum(state.winners[a] >= 0).astype(jnp.int32) for a in srcs]
        total = jnp.asarray(sum(stim_sizes), jnp.int32)
        for c in src_counts:
            total = total + c
        total_max = sum(stim_sizes) + sum(self.caps[self.area_names.index(a)] for a in srcs)
        table = _sampling.binom_tail_table(total_max, self.p, k / n)
        cand = _sampling.sample_candidates(cand_words, table, total, n, k, w, self.p)
        win, m, cols, slot, info = _sparse_cap(x, cand, w, state.fixed[t], state.winners[t])
        n_new, n_need, overlap, largest = info[0], info[1], info[2], info[3]
        new_support = w + n_new
        bound = _sampling.max_input(total_max, self.p, table.shape[1])
        needed = jnp.where(new_support > cap, new_support, 0).astype(jnp.int32)
        # The items 0 .. sum(stim_sizes) - 1 are the stimuli's neurons, each stimulus a range.
        offsets = np.cumsum([0, *stim_sizes])
        ranges = [(int(lo), int(hi)) for lo, hi in zip(offsets[:-1], offsets[1:])]
        chosen, counts = _choose_inputs(k_items, m, total, bound, total_max, (slot, n_need), ranges)
        created_stim, created_w = {}, {}
        for s, count in zip(stims, counts):
            w_s = state.stimulus_weights[(s, t)]
            created_stim[s] = w_s.at[cols].set(count.astype(w_s.dtype), mode="drop")
        start = jnp.asarray(int(offsets[-1]), jnp.int32)
        for a, count_a in zip(srcs, src_counts):
            # The synapses of the first-time winners (columns `cols`) from this source's
            # winners: 1 from the winners their input was drawn from (items `start` to
            # `start + count_a` of `chosen`), 0 from the others; `dense_update` writes them.
            # Without first-time winners every column is the sentinel and nothing is written.
            created_w[a] = (state.winners[a], cols, chosen, start, count_a)
            start = start + count_a
        out = (win, new_support, n_new, None, created_stim, created_w, overlap)
        return out, (needed, largest > bound)


def _random_words(key: PRNGKeyArray, n: int) -> Array:
    """`jax.random.bits(key, (n,), uint32)`; for a threefry key through the registered kernel
    `assembly_bits` (on CPU the compiled Threefry of `neurojax/kernels/assembly.cc`, the same
    words: JAX runs Threefry on CPU as a loop of small XLA computations, several microseconds
    per draw)."""
    threefry = str(jr.key_impl(key)) == "threefry2x32" and jax.config.jax_threefry_partitionable
    if not threefry:
        return jr.bits(key, (n,), jnp.uint32)
    return kernels.call(BITS, jr.key_data(key), n=n)


def _bits_jax(data: Array, *, n: int) -> Array:
    return jr.bits(jr.wrap_key_data(data, impl="threefry2x32"), (n,), jnp.uint32)


def _bits_kernel(data: Array, n: int) -> Array:
    call = jax.ffi.ffi_call("nj_asm_bits", jax.ShapeDtypeStruct((*data.shape[:-1], n), jnp.uint32))
    return call(data)


def _bits_examples():
    for n in (1, 8, 321):
        yield kernels.Example((jr.key_data(jr.key(n)),), {"n": n}, label=f"n={n}")


BITS = kernels.register(
    kernels.Kernel(
        "assembly_bits",
        reference=_bits_jax,
        cpu=_bits_kernel,
        ffi_targets=(("nj_asm_bits", "NjAsmBits"),),
        batching=kernels.Fold(trial=(0,)),
        examples=_bits_examples,
    )
)


def _overlap_labels(a: Int[Array, " k"], b: Int[Array, " m"], size: int) -> Int[Array, ""]:
    """`overlap(a, b)` of labels below `size`: up to 2**16 through a boolean mask, a scatter
    and a gather (XLA:CPU sorts and binary-searches several times slower), else by sorting."""
    if size > 1 << 16:
        return overlap(a, b)
    mask = jnp.zeros((size + 1,), bool).at[jnp.where(b < 0, size, b)].set(True)
    found = mask[jnp.where(a < 0, size, a)] & (a >= 0)
    return jnp.sum(found).astype(jnp.int32)


def _sparse_cap(
    x: Float[Array, " cap"],
    cand: Float[Array, " k"],
    support: Int[Array, ""],
    fixed: Bool[Array, ""],
    old: Int[Array, " k"],
) -> tuple[Array, Array, Array, Array, Int[Array, " 4"]]:
    """The k-cap of a sparse-mode target and what the step needs from it.

    `x`: the support's inputs (-inf beyond the support), `cand`: the `k` candidates' inputs,
    `old`: the winners before the step. Returns `(win, m, cols, slot, info)`: the winners
    (the new ones labelled `support, support + 1, ...` in the cap's order; `old` if `fixed`),
    the first-time winners' inputs `m` (0 elsewhere) and columns `cols` (`cap` elsewhere),
    each first-time winner's row of words for `_choose_inputs` (`slot`, 0 where `m == 0`),
    and `info = (new winners, rows with m > 0, overlap of win with old, largest m)`. On CPU
    one call of the kernel in `neurojax/kernels/assembly.cc` computes all of it; the results
    are integers and carry no gradient.
    """
    args = (jax.lax.stop_gradient(x), jax.lax.stop_gradient(cand), support, fixed, old)
    return kernels.call(SPARSE_CAP, *args)


def _sparse_cap_jax(x, cand, support, fixed, old):
    cap, k = x.shape[-1], cand.shape[-1]
    vals, idx = _lax_top_k(x, cand, k)
    idx = idx.astype(jnp.int32)
    is_new = (idx >= cap) & ~fixed
    rank = jnp.cumsum(is_new.astype(jnp.int32)) - 1
    labels = jnp.where(is_new, support + rank, idx)
    win = jnp.where(fixed, old, labels)
    m = jnp.where(is_new, vals, 0.0).astype(jnp.int32)
    cols = jnp.where(is_new, labels, cap)
    slot, n_need = _word_slots(m)
    ov = _overlap_labels(win, old, cap)
    info = [jnp.sum(is_new), n_need, ov, jnp.max(m)]
    return win, m, cols, slot, jnp.stack([v.astype(jnp.int32) for v in info])


def _word_slots(m: Int[Array, " k"]) -> tuple[Int[Array, " k"], Int[Array, ""]]:
    """Each row's row of Floyd words (the rows with `m > 0` in order; 0 elsewhere) and the
    number of such rows."""
    need = m > 0
    slot = jnp.where(need, jnp.cumsum(need.astype(jnp.int32)) - 1, 0)
    return slot, jnp.sum(need).astype(jnp.int32)


def _sparse_cap_kernel(x, cand, support, fixed, old):
    k = cand.shape[-1]
    out = jax.ShapeDtypeStruct((*x.shape[:-1], k), jnp.int32)
    call = jax.ffi.ffi_call(
        "nj_asm_cap",
        (out, out, out, out, jax.ShapeDtypeStruct((*x.shape[:-1], 4), jnp.int32)),
        vmap_method="broadcast_all",
    )
    return call(x, cand, support, fixed, old)


def _sparse_cap_examples():
    inf = jnp.float32(-jnp.inf)
    x = jnp.asarray([3.0, 1.0, 4.0, 1.0, 5.0, inf, inf, inf], jnp.float32)  # support 5
    cand = jnp.asarray([4.0, 2.0, 6.0], jnp.float32)
    old = jnp.asarray([2, 4, -1], jnp.int32)
    for fixed in (False, True):
        yield kernels.Example(
            (x, cand, jnp.int32(5), jnp.bool_(fixed), old), label=f"ties-fixed={fixed}"
        )
    empty = jnp.full((8,), inf)
    yield kernels.Example((empty, cand, jnp.int32(0), jnp.bool_(False), old), label="empty")


# The k-cap of a sparse-mode target with its bookkeeping; integer results, no gradient.
SPARSE_CAP = kernels.register(
    kernels.Kernel(
        "assembly_sparse_cap",
        reference=_sparse_cap_jax,
        cpu=_sparse_cap_kernel,
        ffi_targets=(("nj_asm_cap", "NjAsmCap"),),
        batching=kernels.Fold(trial=(0, 1, 2, 3, 4)),
        examples=_sparse_cap_examples,
    )
)


def _choose_inputs(
    key: PRNGKeyArray,
    m: Int[Array, " k"],
    total: Int[Array, ""],
    bound: int,
    total_max: int,
    slots: tuple[Int[Array, " k"], Int[Array, ""]] | None = None,
    ranges: Sequence[tuple[int, int]] = (),
) -> tuple[Int[Array, "k bound"], tuple[Int[Array, " k"], ...]]:
    """For each row, `m[r]` distinct items of `range(total)` chosen uniformly; `total` pads.

    Floyd's algorithm, vectorised over rows: for `j = total - m, ..., total - 1` draw `t`
    uniformly in `[0, j]` and keep `t`, or `j` if `t` was already kept. It yields a uniform
    `m`-subset with `m` draws, as a loop of `bound` iterations (a static trip count; the
    iterations past a row's `m` keep nothing).

    The draws come from 32-bit words, one row of `bound` words for each row with `m > 0` (in
    row order): the rows of `jax.random.bits(key, (k * bound,))` reshaped to `(k, bound)`. A
    word `u` gives `floor(u (j + 1) / 2**32)`, an exact multiply-high for `j + 1 < 2**16`,
    whose bias is below `(j + 1) / 2**32` (at most 1.5e-5, about 1.5e-7 for the usual few
    hundred inputs). On CPU a compiled kernel runs the loop and, for a threefry key, computes
    only the words it reads (`neurojax/kernels/assembly.cc`, same numbers); the pure-JAX
    path draws all `k` rows, a static size whatever the step needs. Inputs of `2**16` or more
    draw with `jax.random.randint` at every iteration. `slots` may give each row's row of
    words (0 where `m == 0`) and the number of rows with `m > 0`, as `_sparse_cap` returns
    them.

    Returns `(chosen, counts)`: `counts` holds, for each static range `(lo, hi)` of
    `ranges`, how many of each row's items lie in `[lo, hi)`.
    """
    width = max(bound, 1)
    total = jnp.asarray(total, jnp.int32)
    if total_max >= 2**16:
        chosen = _floyd_randint(key, m, total, width)
    else:
        rows = m.shape[0]
        slot, _ = _word_slots(m) if slots is None else slots
        threefry = str(jr.key_impl(key)) == "threefry2x32" and jax.config.jax_threefry_partitionable
        if threefry:
            chosen = kernels.call(CHOOSE_THREEFRY, jr.key_data(key), slot, m, total, width=width)
        else:
            words = jr.bits(key, (rows * width,), jnp.uint32).reshape(rows, width)
            chosen = kernels.call(CHOOSE, words, slot, m, total)
    counts = tuple(
        jnp.sum((chosen >= lo) & (chosen < hi), axis=1).astype(jnp.int32) for lo, hi in ranges
    )
    return chosen, counts


def _floyd_loop(m, total, width, draw_at):
    def body(i, chosen):
        j = jnp.maximum(total - m + i, 0)
        draw = draw_at(i, j)
        seen = jnp.any(chosen == draw[None, :], axis=0)
        col = jnp.where(i < m, jnp.where(seen, j, draw), total)
        return jax.lax.dynamic_update_index_in_dim(chosen, col, i, 0)

    # A static trip count (`width` bounds every row's m): no loop whose length depends on
    # the data, so accelerators never return to the host to test its condition.
    chosen = jnp.full((width, m.shape[0]), total, jnp.int32)
    return jax.lax.fori_loop(0, width, body, chosen).T


def _floyd_words(words, slot, m, total):
    def draw_at(i, j):
        u = words[slot, i]
        span = (j + 1).astype(jnp.uint32)
        return (((u >> 16) * span + (((u & 0xFFFF) * span) >> 16)) >> 16).astype(jnp.int32)

    return _floyd_loop(m, total, words.shape[-1], draw_at)


def _floyd_randint(key, m, total, width):
    def draw_at(i, j):
        return jr.randint(jr.fold_in(key, i), m.shape, 0, j + 1, jnp.int32)

    return _floyd_loop(m, total, width, draw_at)


def _floyd_kernel(words, slot, m, total):
    shape = (*m.shape, words.shape[-1])
    call = jax.ffi.ffi_call(
        "nj_asm_choose", jax.ShapeDtypeStruct(shape, jnp.int32), vmap_method="broadcast_all"
    )
    return call(words, slot, m, total)


def _floyd_examples():
    words = jr.bits(jr.key(1), (3, 6), jnp.uint32)
    m = jnp.asarray([2, 0, 6, 1], jnp.int32)
    slot = jnp.asarray([0, 0, 1, 2], jnp.int32)
    yield kernels.Example((words, slot, m, jnp.int32(40)), label="rows")
    yield kernels.Example((words, slot, jnp.zeros(4, jnp.int32), jnp.int32(9)), label="none")


# Floyd's choice of each first-time winner's inputs from its row of random words.
CHOOSE = kernels.register(
    kernels.Kernel(
        "assembly_choose",
        reference=_floyd_words,
        cpu=_floyd_kernel,
        ffi_targets=(("nj_asm_choose", "NjAsmChoose"),),
        batching=kernels.Fold(trial=(0, 1, 2, 3)),
        examples=_floyd_examples,
    )
)


def _floyd_threefry_jax(data, slot, m, total, *, width):
    words = _bits_jax(data, n=m.shape[-1] * width).reshape(m.shape[-1], width)
    return _floyd_words(words, slot, m, total)


def _floyd_threefry_kernel(data, slot, m, total, *, width):
    shape = (*m.shape, width)
    call = jax.ffi.ffi_call(
        "nj_asm_choose_threefry",
        jax.ShapeDtypeStruct(shape, jnp.int32),
        vmap_method="broadcast_all",
    )
    return call(data, slot, m, total)


def _floyd_threefry_examples():
    m = jnp.asarray([2, 0, 6, 1, 0], jnp.int32)
    slot = jnp.asarray([0, 0, 1, 2, 0], jnp.int32)
    data = jr.key_data(jr.key(3))
    yield kernels.Example((data, slot, m, jnp.int32(40)), {"width": 6}, label="rows")
    yield kernels.Example(
        (data, slot, jnp.zeros(5, jnp.int32), jnp.int32(9)), {"width": 3}, label="none"
    )


# The same choice with the words of a threefry key: row r of `bits(key, (rows * width,))`
# reshaped to `(rows, width)`. The CPU kernel computes only the words it reads.
CHOOSE_THREEFRY = kernels.register(
    kernels.Kernel(
        "assembly_choose_threefry",
        reference=_floyd_threefry_jax,
        cpu=_floyd_threefry_kernel,
        ffi_targets=(("nj_asm_choose_threefry", "NjAsmChooseThreefry"),),
        batching=kernels.Fold(trial=(0, 1, 2, 3)),
        examples=_floyd_threefry_examples,
    )
)


def _top_k(
    x: Float[Array, " n"], k: int, extra: Float[Array, " m"]
) -> tuple[Float[Array, " k"], Int[Array, " k"]]:
    """`jax.lax.top_k(concatenate([x, extra]), k)` (ties to the lower index).

    On CPU the compiled kernel of `neurojax/kernels/assembly.cc` selects the k-th value in
    linear time, sorts only the k winners and reads the two parts where they are, with the
    same result."""
    return kernels.call(TOP_K, x, extra, k=k)


def _lax_top_k(x, extra, k):
    vals, idx = jax.lax.top_k(jnp.concatenate([x, extra], axis=-1), k)
    return vals, idx


def _top_k_kernel(x, extra, k):
    shape = (*x.shape[:-1], k)
    call = jax.ffi.ffi_call(
        "nj_asm_topk",
        (jax.ShapeDtypeStruct(shape, x.dtype), jax.ShapeDtypeStruct(shape, jnp.int32)),
        vmap_method="broadcast_all",
    )
    vals, idx = call(x, extra)
    return vals, idx


def _top_k_examples():
    x = jr.normal(jr.key(2), (40,), jnp.float32)
    tied = jnp.asarray([1.0, 3.0, 3.0, -2.0, 3.0, 0.5], jnp.float32)
    yield kernels.Example((x[:30], x[30:]), {"k": 7}, grad_argnums=(0, 1), label="split")
    yield kernels.Example((tied, tied[:2]), {"k": 4}, label="ties")


# The k largest inputs of an area (and of the candidates beyond it), ties to the lower index.
TOP_K = kernels.register(
    kernels.Kernel(
        "assembly_top_k",
        reference=lambda x, extra, *, k: _lax_top_k(x, extra, k),
        cpu=_top_k_kernel,
        ffi_targets=(("nj_asm_topk", "NjAsmTopK"),),
        batching=kernels.Fold(trial=(0, 1)),
        examples=_top_k_examples,
    )
)
