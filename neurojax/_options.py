"""Option objects of `nj.simulate`: what to record, how to run, which gradient.

`simulate` grew sixteen keywords; the ones that belong together now travel in three small
records, as diffrax's `diffeqsolve` takes a `SaveAt` and an `adjoint=`:

- `nj.Record(fields, every, spikes)` for `record=`: which state fields, how often, and how
  spikes are kept;
- `nj.Execution(chunk_size, progress, unroll, batch_block)` for `run=`: how the compiled loop
  is cut and shown, none of which changes a result;
- `nj.SurrogateGradient(checkpoint, truncate_backprop)` or `nj.EventPropGradient()` for
  `gradient=`: what `jax.grad` through the call computes.

Each is a frozen `equinox.Module` whose fields are all static: it has no array leaves, so it
may cross a `jax.jit` boundary as an argument, compares and hashes by value (the same options
reuse a compiled program), and checks its fields when it is built.
"""

import dataclasses
import functools
import warnings
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import equinox as eqx
import numpy as np

from ._validation import check_positive_int

__all__ = ["Record", "Execution", "SurrogateGradient", "EventPropGradient", "SPIKES"]

# How `nj.Record(spikes=...)` keeps the step outputs.
SPIKES = ("raster", "ids", "float")


class _Slice(NamedTuple):
    """A hashable `slice` (Python 3.11's is not), as a neuron subset of a `Record`."""

    start: Any
    stop: Any
    step: Any

    def __repr__(self) -> str:
        return f"slice({self.start!r}, {self.stop!r}, {self.step!r})"


class _Mapping(tuple):
    """A hashable, read-only `{key: value}` of a `Record`'s per-population fields, kept in the
    order it was given; it prints as the dict it stands for."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self) + "}"


def _freeze(owner: str, value: Any) -> Any:
    """`value` with its dicts, lists, slices and index arrays made hashable (see `_thaw`)."""
    if isinstance(value, Mapping):
        return _Mapping((k, _freeze(owner, v)) for k, v in value.items())
    if isinstance(value, slice):
        return _Slice(value.start, value.stop, value.step)
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise TypeError(
                f"{owner}: a neuron subset must be a slice, an int or a 1-D sequence of ints, "
                f"got an array of shape {value.shape} and dtype {value.dtype}"
            )
        return tuple(int(i) for i in value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(owner, v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a JAX array
        raise TypeError(
            f"{owner}: a neuron subset must be concrete (a slice, an int or a sequence of "
            f"ints), got a JAX array of shape {value.shape}; pass a NumPy array or a list"
        )
    return value


def _thaw(value: Any) -> Any:
    """The plain form of a frozen value: dicts and slices back, tuples kept."""
    if isinstance(value, _Mapping):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, _Slice):
        return slice(value.start, value.stop, value.step)
    if isinstance(value, tuple):
        return tuple(_thaw(v) for v in value)
    return value


def _fields(value: Any) -> Any:
    owner = "nj.Record"
    if value is None or isinstance(value, str):
        return value
    if callable(value) and not isinstance(value, (Mapping, list, tuple)):
        return value
    if isinstance(value, (list, tuple)):
        if not all(isinstance(f, str) for f in value):
            raise TypeError(
                f"{owner}: fields as a sequence must hold state field names (str), got {value!r}"
            )
        return tuple(value)
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(
                f"{owner}: fields as a dict maps population names (str) to their fields, got "
                f"keys {list(value)!r}"
            )
        return _freeze(owner, value)
    raise TypeError(
        f"{owner}: fields must be None, a tuple of state field names, a dict {{population: "
        f"fields}} (networks) or a function (state, outputs) -> PyTree, got {value!r}"
    )


def _every(value: Any) -> int:
    return check_positive_int("nj.Record", "every", value)


def _spikes(value: Any) -> str:
    if not isinstance(value, str) or value not in SPIKES:
        hint = ""
        if value is None or value == "bool":
            hint = f" (the old spike_dtype={value!r} is spikes={_SPIKES_OF_DTYPE[value]!r})"
        raise ValueError(
            f"nj.Record: spikes must be one of {', '.join(map(repr, SPIKES))}, got {value!r}{hint}"
        )
    return value


class _Options(eqx.Module):
    """Shared printing: the fields that differ from their defaults, dicts and slices shown as
    they were given."""

    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                shown.append(f"{f.name}={_thaw(value)!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


class Record(_Options):
    """What `nj.simulate(..., record=nj.Record(...))` keeps of a run.

    Args:
        fields: which state is recorded beside the spikes, as `simulate`'s `record=` takes it:
            `None` (only the spikes), a tuple of state field names (`("v",)`), on a network a
            dict `{population: fields}` that may pick neurons (`{"E": {"v": slice(0, 10)}}`),
            or a function `(state, outputs) -> PyTree`.
        every: record every `every`-th step (the state after that step); with `"raster"`
            spikes are summed over each window of `every` steps, so none is lost. Must divide
            the run's `n_steps` (and the `chunk_size`).
        spikes: how the step outputs (spikes) are kept:
            - `"raster"` (default): an array per recorded step; booleans, or integer counts
              with `every > 1` and for a source that emits several spikes per step
              (`max_spikes_per_step > 1`);
            - `"ids"`: only the spikes, as event lists (`nj.SpikeTimes`: time, neuron, step,
              trial), memory in proportion to the spikes; needs `every=1` and a run outside
              `jit`/`vmap`/`grad`;
            - `"float"`: the model's own float outputs (0.0/1.0 with surrogate derivatives),
              summed over each window when `every > 1`: the choice for a loss on the recorded
              spikes.

    `record=` keeps taking a tuple, dict or function (then `every=record_every` and
    `spikes="raster"`), and `record_every=` stays the shorthand of `every`.

    Example:
    ```python
    import neurojax as nj
    lif = nj.LIF()
    opts = nj.Record(fields=("v",), every=10)
    _, rec = nj.simulate(lif, lif.init_state(4), 20.0, dt=0.1, n_steps=100, record=opts)
    print(rec.spikes.shape, rec.v.shape)  # (10, 4) (10, 4)
    ```
    """

    fields: Any = eqx.field(default=None, static=True, converter=_fields)
    every: int = eqx.field(default=1, static=True, converter=_every)
    spikes: Literal["raster", "ids", "float"] = eqx.field(
        default="raster", static=True, converter=_spikes
    )

    def __check_init__(self) -> None:
        if self.spikes == "ids" and self.every != 1:
            raise ValueError(
                f"nj.Record: spikes='ids' keeps every spike with its step, so every must be 1, "
                f"got every={self.every}; record state fields sparsely with a separate run or "
                "a fields function, or use spikes='raster' for counts per window"
            )

    @property
    def plain_fields(self) -> Any:
        """`fields` as `simulate`'s `record=` reads it (dicts and slices as given)."""
        return _thaw(self.fields)


def _chunk_size(value: Any) -> int | None:
    return None if value is None else check_positive_int("nj.Execution", "chunk_size", value)


def _progress(value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"nj.Execution: progress must be a bool, got {value!r}")
    return bool(value)


def _unroll(value: Any) -> int:
    return check_positive_int("nj.Execution", "unroll", value)


def _batch_block(value: Any) -> int | None:
    return None if value is None else check_positive_int("nj.Execution", "batch_block", value)


class Execution(_Options):
    """How `nj.simulate(..., run=nj.Execution(...))` runs: the cut of the compiled loop and
    what it shows. No field changes a result (a blocked batch up to its PRNG keys).

    Args:
        chunk_size: run the scan in jitted chunks of this many steps and move each chunk's
            recording to the host (NumPy) before the next, so that long runs fit in device
            memory; a multiple of the recording's `every`. `None`: one chunk, the recording
            on the device. Results are bit-identical to an unchunked run.
        progress: show a tqdm progress bar (compiling, then simulated time and steps per
            second of running alone).
        unroll: steps per iteration of the compiled loop (`lax.scan`'s `unroll`); larger
            values cut per-step loop overhead for small models at the cost of compile time.
        batch_block: for a state with a leading batch axis of independent trials, run them in
            blocks of this many trials one after the other inside one program (`lax.map`);
            must divide the batch. `None`: the whole batch at once.

    `chunk_size=` and `progress=` stay shorthands of the same fields on `simulate`.

    Example:
    ```python
    import neurojax as nj
    lif = nj.LIF()
    run = nj.Execution(chunk_size=50, unroll=2)
    _, rec = nj.simulate(lif, lif.init_state(4), 20.0, dt=0.1, n_steps=100, run=run)
    print(type(rec.spikes).__name__)  # ndarray (chunks go to the host)
    ```
    """

    chunk_size: int | None = eqx.field(default=None, static=True, converter=_chunk_size)
    progress: bool = eqx.field(default=False, static=True, converter=_progress)
    unroll: int = eqx.field(default=1, static=True, converter=_unroll)
    batch_block: int | None = eqx.field(default=None, static=True, converter=_batch_block)


def _checkpoint(value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"nj.SurrogateGradient: checkpoint must be a bool, got {value!r}")
    return bool(value)


def _truncate(value: Any) -> int | None:
    if value is None:
        return None
    return check_positive_int("nj.SurrogateGradient", "truncate_backprop", value)


class SurrogateGradient(_Options):
    """`nj.simulate(..., gradient=nj.SurrogateGradient(...))`: gradients through the
    time-grid simulation, spikes with surrogate derivatives (the default, also spelled
    `gradient="surrogate"`), with the memory options of backpropagation through time.

    Args:
        checkpoint: wrap each step in `jax.checkpoint`, so that the backward pass keeps only
            the state carried between steps and recomputes each step's intermediates
            (memory per step drops to the size of the state; time grows by about one forward
            pass). Values and gradients are unchanged.
        truncate_backprop: truncated backpropagation through time: a positive number of steps
            `K` after which the gradient path through the state is cut (at steps `K`, `2K`,
            ...). The forward run is unchanged. `None`: the full gradient.

    Example:
    ```python
    import jax
    import neurojax as nj
    lif = nj.LIF()
    grad = nj.SurrogateGradient(checkpoint=True, truncate_backprop=50)

    def loss(i_ext):
        _, rec = nj.simulate(lif, lif.init_state(4), i_ext, dt=0.1, n_steps=200,
                             record=nj.Record(spikes="float"), gradient=grad)
        return rec.spikes.sum()

    print(jax.grad(loss)(20.0) > 0)  # True
    ```
    """

    checkpoint: bool = eqx.field(default=False, static=True, converter=_checkpoint)
    truncate_backprop: int | None = eqx.field(default=None, static=True, converter=_truncate)


class EventPropGradient(_Options):
    """`nj.simulate(..., gradient=nj.EventPropGradient())`: exact gradients by the adjoint
    method of Wunderlich and Pehle (2021) on an exact event-driven run of an
    `nj.training.EventNetwork`, also spelled `gradient="eventprop"`; see `nj.simulate` and
    `nj.training.eventprop_run` for what it takes and returns.

    Wunderlich, T. C. and Pehle, C. (2021). Event-based backpropagation can compute exact
    gradients for spiking neural networks. *Scientific Reports* 11, 12829.
    """


# The old `spike_dtype=` values and their `nj.Record(spikes=...)` names.
_SPIKES_OF_DTYPE: dict[Any, str] = {"bool": "raster", "ids": "ids", None: "float"}
# ... and back: the run loop and the fused runs (`NeuronModel.fused_run`) read these.
DTYPE_OF_SPIKES: dict[str, Any] = {v: k for k, v in _SPIKES_OF_DTYPE.items()}


def spikes_of_dtype(spike_dtype: Any) -> str:
    """The `nj.Record(spikes=...)` name of an old `spike_dtype=` value; `ValueError` naming
    both spellings for anything else."""
    try:
        return _SPIKES_OF_DTYPE[spike_dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"simulate: spike_dtype must be 'bool', 'ids' or None, got {spike_dtype!r} (it is "
            "renamed record=nj.Record(spikes='raster' | 'ids' | 'float'))"
        ) from None


class _Unset:
    """The default of `simulate`'s deprecated keywords: tells "not given" from any value."""

    def __repr__(self) -> str:
        return "<deprecated>"


UNSET: Any = _Unset()


class Resolved(NamedTuple):
    """`simulate`'s options after the shorthands and the old keywords are folded in."""

    record: Record
    run: Execution
    gradient: SurrogateGradient | EventPropGradient


# Building an equinox module costs tens of microseconds (its converters and checks), a few
# percent of a short `simulate` call: the objects a call's keywords stand for are kept, keyed
# by their (hashable, already checked) values.
@functools.lru_cache(maxsize=256, typed=True)
def _cached(cls: type, **kwargs: Any) -> Any:
    return cls(**kwargs)


def _record(fields: Any, every: int, spikes: str) -> Record:
    if isinstance(fields, list):
        fields = tuple(fields)
    if fields is None or isinstance(fields, (str, tuple)):
        return _cached(Record, fields=fields, every=every, spikes=spikes)
    # A dict is no key, and the cache must not keep a record function (and what it closes
    # over) alive.
    return Record(fields=fields, every=every, spikes=spikes)


def _spelled(name: str, obj: eqx.Module, fields: dict[str, Any]) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"{name}=nj.{type(obj).__name__}({inner})"


def resolve(
    *,
    record: Any,
    record_every: Any,
    chunk_size: Any,
    progress: Any,
    run: Any,
    gradient: Any,
    spike_dtype: Any = UNSET,
    unroll: Any = UNSET,
    batch_block: Any = UNSET,
    checkpoint: Any = UNSET,
    truncate_backprop: Any = UNSET,
    stacklevel: int = 3,
) -> Resolved:
    """Fold `simulate`'s keywords into its three option objects.

    `record_every`, `chunk_size` and `progress` are shorthands (no warning); `spike_dtype`,
    `unroll`, `batch_block`, `checkpoint` and `truncate_backprop` are the old spellings (one
    `DeprecationWarning` per call naming the new one). A value given both as a keyword (not
    at its default) and through an option object is a `ValueError` naming both."""
    old = {
        k: v
        for k, v in dict(
            spike_dtype=spike_dtype,
            unroll=unroll,
            batch_block=batch_block,
            checkpoint=checkpoint,
            truncate_backprop=truncate_backprop,
        ).items()
        if v is not UNSET
    }

    # record=
    if isinstance(record, Record):
        if isinstance(record_every, bool) or not (
            isinstance(record_every, (int, np.integer)) and record_every == 1
        ):
            raise ValueError(
                f"simulate: record_every={record_every!r} and record={record!r} both set the "
                "recording interval; give it once, as nj.Record(every=...)"
            )
        if "spike_dtype" in old:
            raise ValueError(
                f"simulate: spike_dtype={old['spike_dtype']!r} and record={record!r} both say "
                "how spikes are kept; give it once, as nj.Record(spikes=...)"
            )
        rec = record
    else:
        every = check_positive_int("simulate", "record_every", record_every)
        spikes = spikes_of_dtype(old["spike_dtype"]) if "spike_dtype" in old else "raster"
        if isinstance(record, (list, tuple)) and not all(isinstance(f, str) for f in record):
            raise TypeError(
                "simulate: record must be None, a tuple of state field names, a dict "
                "{population: fields} (networks), a function (state, outputs) -> PyTree or an "
                f"nj.Record, got {record!r}"
            )
        if spikes == "ids" and every != 1:
            raise ValueError(
                f"simulate: spike_dtype='ids' records every spike with its step, so "
                f"record_every must be 1, got {every}; record state fields more sparsely with "
                "a record function, or use spike_dtype='bool' for counts per window"
            )
        try:
            rec = _record(record, every, spikes)
        except TypeError as err:
            raise TypeError(
                "simulate: record must be None, a tuple of state field names, a dict "
                "{population: fields} (networks), a function (state, outputs) -> PyTree or an "
                f"nj.Record, got {record!r}"
            ) from err

    # run=
    if run is not None:
        if not isinstance(run, Execution):
            raise TypeError(f"simulate: run must be an nj.Execution or None, got {run!r}")
        given = {
            k: v
            for k, v in dict(chunk_size=chunk_size, progress=progress).items()
            if not (v is None or v is False)
        }
        given.update({k: old[k] for k in ("unroll", "batch_block") if k in old})
        if given:
            names = ", ".join(f"{k}={v!r}" for k, v in given.items())
            raise ValueError(
                f"simulate: {names} and run={run!r} both set how the run executes; give "
                f"{'it' if len(given) == 1 else 'them'} once, as nj.Execution({names})"
            )
        exe = run
    else:
        if chunk_size is not None:
            chunk_size = check_positive_int("simulate", "chunk_size", chunk_size)
        if not isinstance(progress, (bool, np.bool_)):
            raise TypeError(f"simulate: progress must be a bool, got {progress!r}")
        kwargs = dict(chunk_size=chunk_size, progress=bool(progress))
        if "unroll" in old:
            kwargs["unroll"] = check_positive_int("simulate", "unroll", old["unroll"])
        if "batch_block" in old and old["batch_block"] is not None:
            kwargs["batch_block"] = check_positive_int(
                "simulate", "batch_block", old["batch_block"]
            )
        exe = _cached(Execution, **kwargs)

    # gradient=
    grad_old = {k: old[k] for k in ("checkpoint", "truncate_backprop") if k in old}
    if isinstance(gradient, (SurrogateGradient, EventPropGradient)):
        if grad_old:
            names = ", ".join(f"{k}={v!r}" for k, v in grad_old.items())
            raise ValueError(
                f"simulate: {names} and gradient={gradient!r} both set the gradient; give "
                f"{'it' if len(grad_old) == 1 else 'them'} once, as "
                f"nj.SurrogateGradient({names})"
            )
        grad = gradient
    elif isinstance(gradient, str) and gradient == "surrogate":
        kwargs = {}
        if "checkpoint" in grad_old:
            if not isinstance(grad_old["checkpoint"], (bool, np.bool_)):
                raise TypeError(
                    f"simulate: checkpoint must be a bool, got {grad_old['checkpoint']!r}"
                )
            kwargs["checkpoint"] = grad_old["checkpoint"]
        if grad_old.get("truncate_backprop") is not None:
            kwargs["truncate_backprop"] = check_positive_int(
                "simulate", "truncate_backprop", grad_old["truncate_backprop"]
            )
        grad = _cached(SurrogateGradient, **kwargs)
    elif isinstance(gradient, str) and gradient == "eventprop":
        for k, v in grad_old.items():
            raise ValueError(
                f"simulate(gradient='eventprop'): {k}={v!r} belongs to the surrogate gradient "
                "of the time-grid simulation (nj.SurrogateGradient) and is not supported with "
                "EventProp; leave it out"
            )
        grad = _cached(EventPropGradient)
    else:
        raise ValueError(
            f"simulate: gradient must be 'surrogate' or 'eventprop', got {gradient!r} (or an "
            "nj.SurrogateGradient(...) or nj.EventPropGradient() object)"
        )

    if old:
        new = []
        if "spike_dtype" in old:
            new.append(_spelled("record", rec, {"spikes": rec.spikes}))
        run_old = {k: old[k] for k in ("unroll", "batch_block") if k in old}
        if run_old:
            new.append(_spelled("run", exe, run_old))
        if grad_old:
            new.append(_spelled("gradient", SurrogateGradient(), grad_old))
        given = ", ".join(f"{k}={v!r}" for k, v in old.items())
        warnings.warn(
            f"deprecated simulate keyword{'s' if len(old) > 1 else ''} {given}: write "
            f"{', '.join(new)} instead (the old keywords work until the next release)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return Resolved(record=rec, run=exe, gradient=grad)
