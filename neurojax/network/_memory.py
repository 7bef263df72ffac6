r"""Memory of a network, reported and planned before anything is allocated.

`nj.Network.memory()` and `nj.network.plan_memory(populations, projections)` return a
`MemoryReport`: per population the bytes of its state per neuron (from `jax.eval_shape` of
its `init_state`, nothing allocated), per projection the bytes of its synapse tables (per
synapse) and of its kinetics (per postsynaptic neuron), per ring buffer the bytes of one
delay slot, and the totals. `plan_memory` takes planned projections (`ProjectionPlan`: sizes
and a method, no synapses) as well as built ones, so that a network of 10^10 synapses can be
sized before its connectivity is drawn; `MemoryReport.check` refuses (raises
`MemoryPlanError`, a `MemoryError`, with the report) what would not fit in the memory
available now: the host's (`MemAvailable` of `/proc/meminfo`) on a CPU, the device's free
memory on a GPU or TPU. `nj.Network.init_state` runs that check before it allocates a state.

Bytes per synapse of each layout (float32 weights, int32 indices):

| layout | bytes per synapse | bytes per presynaptic neuron |
| --- | --- | --- |
| `"event"` | 8 (+ 8 when plastic, + 1, 2 or 4 for per-synapse delays in steps) | 4 |
| `"bcoo"` | 12 | 0 |
| `"dense"` | `(4 n_pre n_post + n_pre ceil(n_post / 8)) / n_synapses` (bits: see below) | 0 |
| `"procedural"` | 0 | 4 (+ 4 d for distance-rule positions) |

The dense layout's bits say which pairs are synapses (so that gradients stay on them); they
are stored only when not every pair is a synapse.
"""

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

from .._system import available_bytes

__all__ = ["MemoryReport", "MemoryPlanError", "ProjectionPlan", "plan_memory", "available_memory"]

_METHODS = ("event", "bcoo", "dense", "procedural")


class MemoryPlanError(MemoryError):
    """A build that would not fit in the available memory; the message holds the report."""


@dataclasses.dataclass(frozen=True)
class ProjectionPlan:
    """A projection described by its sizes only, for `plan_memory`.

    Attributes:
        pre, post: population names.
        n_synapses: number of synapses (int >= 0).
        method: `"event"`, `"bcoo"`, `"dense"` or `"procedural"`.
        max_delay: the longest delay [ms] (sizes the ring buffer with the network's `dt`).
        per_synapse_delays: whether delays differ between synapses (1-4 bytes each, stored
            layouts only).
        plastic: a plastic event layout (8 more bytes per synapse, plus its traces).
        synapse_state: bytes of kinetics state per postsynaptic neuron (4 for
            `nj.Exponential`, 8 for `nj.Alpha`, 0 for `nj.Delta`).
        position_dims: dimensions of the positions a procedural distance rule keeps.
    """

    pre: str
    post: str
    n_synapses: int
    method: str = "event"
    max_delay: float = 0.0
    per_synapse_delays: bool = False
    plastic: bool = False
    synapse_state: int = 4
    position_dims: int = 0

    def __post_init__(self):
        if self.method not in _METHODS:
            raise ValueError(
                f"ProjectionPlan: method must be one of {_METHODS}, got {self.method!r}"
            )
        n = self.n_synapses
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"ProjectionPlan: n_synapses must be an int >= 0, got {n!r}")
        if not (math.isfinite(self.max_delay) and self.max_delay >= 0):
            raise ValueError(f"ProjectionPlan: max_delay must be >= 0 ms, got {self.max_delay!r}")
        if self.plastic and self.method != "event":
            raise ValueError(
                f"ProjectionPlan: plastic projections need method='event', got {self.method!r}"
            )


@dataclasses.dataclass(frozen=True)
class PopulationRow:
    name: str
    neurons: int
    state_bytes_per_neuron: float
    parameter_bytes: int

    @property
    def bytes(self) -> int:
        """Bytes of the state (the parameters are counted apart)."""
        return int(round(self.state_bytes_per_neuron * self.neurons))


@dataclasses.dataclass(frozen=True)
class ProjectionRow:
    name: str
    method: str
    n_synapses: int
    table_bytes: int  # connectivity arrays (layout + per-synapse delays)
    state_bytes: int  # kinetics and plastic state
    n_post: int = 0

    @property
    def bytes_per_synapse(self) -> float:
        return self.table_bytes / self.n_synapses if self.n_synapses else 0.0

    @property
    def bytes(self) -> int:
        return self.table_bytes + self.state_bytes


@dataclasses.dataclass(frozen=True)
class RingRow:
    senders: str
    slots: int
    width: int
    bytes_per_slot: int

    @property
    def bytes(self) -> int:
        return self.slots * self.bytes_per_slot


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes of a network by part (see the module docstring); `str(report)` is a table.

    Attributes:
        populations, projections, rings: one row per population, projection and ring
            buffer (`bytes`, and `state_bytes_per_neuron`, `bytes_per_synapse`,
            `bytes_per_slot`).
        batch: the trials the state holds.
        built_bytes: bytes already allocated (the tables of built projections and the
            models' parameters).
    """

    populations: tuple[PopulationRow, ...]
    projections: tuple[ProjectionRow, ...]
    rings: tuple[RingRow, ...]
    batch: int = 1
    built_bytes: int = 0

    @property
    def table_bytes(self) -> int:
        """Bytes of the connectivity (all projections' tables)."""
        return sum(p.table_bytes for p in self.projections)

    @property
    def state_bytes(self) -> int:
        """Bytes of the network state (populations, kinetics, plastic state, rings)."""
        return (
            sum(p.bytes for p in self.populations)
            + sum(p.state_bytes for p in self.projections)
            + sum(r.bytes for r in self.rings)
        )

    @property
    def parameter_bytes(self) -> int:
        """Bytes of the neuron models' parameter arrays."""
        return sum(p.parameter_bytes for p in self.populations)

    @property
    def total_bytes(self) -> int:
        """Everything: tables, parameters and state."""
        return self.table_bytes + self.parameter_bytes + self.state_bytes

    @property
    def n_synapses(self) -> int:
        """Synapses over all projections."""
        return sum(p.n_synapses for p in self.projections)

    @property
    def n_neurons(self) -> int:
        """Neurons over all populations."""
        return sum(p.neurons for p in self.populations)

    def __str__(self) -> str:
        lines = [f"{'part':<28}{'count':>16}{'bytes/unit':>14}{'total':>12}"]

        def row(part, count, unit, per, total):
            lines.append(f"{part:<28}{count:>12,} {unit:<4}{per:>13.3g}{_human(total):>12}")

        for p in self.populations:
            row(f"population {p.name}", p.neurons, "nrn", p.state_bytes_per_neuron, p.bytes)
        for p in self.projections:
            row(f"{p.name} [{p.method}]", p.n_synapses, "syn", p.bytes_per_synapse, p.table_bytes)
            if p.state_bytes:
                per = p.state_bytes / max(1, p.n_post)
                row(f"  state of {p.name}", p.n_post, "nrn", per, p.state_bytes)
        for r in self.rings:
            row(f"ring {r.senders}", r.slots, "slot", r.bytes_per_slot, r.bytes)
        lines.append(
            f"{'total':<28}{self.n_neurons:>12,} nrn {self.n_synapses:>14,} syn "
            f"{_human(self.total_bytes):>8}"
        )
        if self.batch > 1:
            lines.append(f"(state for {self.batch} trials)")
        return "\n".join(lines)

    def check(self, owner: str = "plan_memory", *, available: int | None = None) -> "MemoryReport":
        """Raise `MemoryPlanError` (with this report) when the bytes not yet allocated
        exceed `available` (default: `available_memory()`); returns the report."""
        need = self.total_bytes - self.built_bytes
        free = available_memory() if available is None else int(available)
        if need > free:
            raise MemoryPlanError(
                f"{owner}: the network needs {_human(need)} more memory but only "
                f"{_human(free)} is available; refused before allocating. Use the "
                "procedural layout (nj.connect.procedural) for large static projections, fewer "
                f"trials, or shard the neurons over devices (nj.parallel.shard_network).\n{self}"
            )
        return self


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


def available_memory() -> int:
    """Bytes that can still be allocated where arrays live now: on a GPU or TPU the default
    device's free memory (`memory_stats`), on a CPU the host's `MemAvailable`."""
    free = available_bytes(on_host=jax.devices()[0].platform == "cpu")
    if free is not None:
        return free
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _tree_bytes(tree: Any) -> int:
    return int(
        sum(
            math.prod(x.shape) * np.dtype(x.dtype).itemsize
            for x in jtu.tree_leaves(tree)
            if hasattr(x, "shape")
            and hasattr(x, "dtype")
            and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        )
    )


def _population_row(name: str, model: Any, size: int, batch: int) -> PopulationRow:
    # The state's shapes at the population's own size (a model may hold per-neuron
    # parameters of that size), traced abstractly: nothing is allocated.
    state = eqx.filter_eval_shape(lambda m: m.init_state((batch, size), key=jr.key(0)), model)
    params = _tree_bytes(eqx.filter(model, eqx.is_array))
    return PopulationRow(name, size, _tree_bytes(state) / size, params)


def _synapse_state_bytes(synapse: Any, n_post: int, batch: int) -> int:
    return _tree_bytes(jax.eval_shape(lambda: synapse.init_state((batch, n_post))))


def _delay_bytes(max_steps: int) -> int:
    return 1 if max_steps < 2**7 else 2 if max_steps < 2**15 else 4


def plan_memory(
    populations: Mapping[str, tuple[Any, int]],
    projections: Sequence[Any] = (),
    *,
    dt: float | None = None,
    batch: int = 1,
) -> MemoryReport:
    """The memory of a network made of `populations` (`{name: (model, size)}`, as for
    `nj.Network`) and `projections` (built `nj.Projection`s or `ProjectionPlan`s), with a
    state of `batch` trials, computed from shapes only (nothing is allocated).

    Example:
    ```python
    lif = nj.LIF()
    plan = nj.network.plan_memory(
        {"E": (lif, 10**6)},
        [nj.network.ProjectionPlan("E", "E", 10**10, method="event", max_delay=1.5)],
        dt=0.1,
    )
    print(plan)          # 80 GB of synapses: plan.check() refuses it on a 24 GB machine
    ```
    """
    from ._projection import Projection

    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"plan_memory: batch must be an int >= 1, got {batch!r}")
    sizes = {}
    pops = []
    for name, (model, size) in populations.items():
        sizes[name] = int(size)
        pops.append(_population_row(name, model, int(size), int(batch)))
    rows, built, slots_of = [], 0, {}
    for i, proj in enumerate(projections):
        if isinstance(proj, Projection):
            name = f"{proj.pre}->{proj.post}"
            table = proj.nbytes()
            if isinstance(proj.delay_ms, jax.Array) and not proj.learnable_delays and dt:
                # the network keeps these delays as whole steps instead of float32 ms
                steps = int(math.floor(proj.max_delay / dt + 0.5 + 1e-6))
                table += proj.n_synapses * _delay_bytes(steps) - int(proj.delay_ms.nbytes)
            built += proj.nbytes()
            state = _synapse_state_bytes(proj.synapse, proj.n_post, batch)
            if proj.plasticity is not None:
                state += batch * proj.n_synapses * 4  # the plastic weights per trial
            rows.append(
                ProjectionRow(name, proj.method, proj.n_synapses, table, state, proj.n_post)
            )
            pre, post, max_delay = proj.pre, proj.post, proj.max_delay
        elif isinstance(proj, ProjectionPlan):
            for end in (proj.pre, proj.post):
                if end not in sizes:
                    raise ValueError(
                        f"plan_memory: projections[{i}] names {end!r}, not one of {list(sizes)}"
                    )
            n_pre, n_post, n = sizes[proj.pre], sizes[proj.post], proj.n_synapses
            steps = 0 if dt is None else int(math.floor(proj.max_delay / dt + 0.5 + 1e-6))
            if proj.method == "event":
                table = 8 * n + 4 * (n_pre + 1) + (8 * n + 4 * (n_post + 1)) * proj.plastic
                # per-synapse delays: whole steps (int8, int16 or int32) in the projection
                table += n * _delay_bytes(steps) * proj.per_synapse_delays
            elif proj.method == "bcoo":
                table = 12 * n
            elif proj.method == "dense":
                # the matrix, and one bit per pair saying which are synapses unless all are
                table = 4 * n_pre * n_post + n_pre * -(-n_post // 8) * (n < n_pre * n_post)
            else:
                table = 4 * n_pre + 16 + 4 * proj.position_dims * (n_pre + n_post)
            state = batch * proj.synapse_state * n_post + (batch * 4 * n) * proj.plastic
            rows.append(
                ProjectionRow(f"{proj.pre}->{proj.post}", proj.method, n, table, state, n_post)
            )
            pre, post, max_delay = proj.pre, proj.post, proj.max_delay
        else:
            raise TypeError(
                f"plan_memory: projections[{i}] must be an nj.Projection or a ProjectionPlan, "
                f"got {type(proj).__name__}"
            )
        if max_delay > 0 and dt is None:
            raise ValueError(f"plan_memory: projections[{i}] has delays; pass dt= (ms)")
        steps = 0 if max_delay == 0 else int(math.floor(max_delay / dt + 0.5 + 1e-6))
        slots, width = slots_of.get(pre, (1, 0))
        slots_of[pre] = (max(slots, steps + 1), width + sizes[post])
    rings = tuple(
        RingRow(pre, slots, width, 4 * width * batch) for pre, (slots, width) in slots_of.items()
    )
    built += sum(p.parameter_bytes for p in pops)  # the models exist already
    return MemoryReport(tuple(pops), tuple(rows), rings, int(batch), built)
