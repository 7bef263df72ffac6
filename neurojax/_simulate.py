"""`simulate`: step any neurojax model with `jax.lax.scan` under `jit`."""

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import _eventprop, _options, _validation
from ._options import EventPropGradient, Execution, SurrogateGradient
from ._recording import count_dtype, most_spikes, recorded_spikes
from ._run_loop import RunInfo, run_chunks
from ._system import available_bytes as _available_bytes
from ._validation import check_dt, check_positive_int
from .network import _checks as _network_checks
from .network._sources import SpikeSource

__all__ = ["simulate", "Recording", "RunInfo", "SpikeTimes"]


class Recording(eqx.Module):
    """What `simulate` recorded. Time is the leading axis of every array.

    Attributes:
        t: time [ms] at the end of each recorded step, shape `(n_rec,)`.
        spikes: the step outputs (spikes), one entry per recorded step. With `record_every=1`
            and the default `nj.Record(spikes="raster")` they are booleans; with
            `record_every > 1` they are spike counts over each window of `record_every` steps,
            so that no spike is lost. A PyTree when the model's output is one (a network's
            `{name: spikes}`).
        values: the recorded state fields (`{name: array}`) or the PyTree returned by a
            `record` function. State fields are also attributes: `recording.v`.
        sources: the names of a network's populations that are spike sources (inputs such
            as `nj.PoissonSource`, not neurons), which `nj.io`'s writers leave out unless
            asked. A source that emits several spikes per step (`max_spikes_per_step > 1`)
            is recorded as counts, never cut to 0/1.
        info: how the `simulate` call that returned this recording spent its time
            (`nj.RunInfo`: compile and run seconds, chunks, reruns); `None` when the call
            ran under a transformation (`jit`, `vmap`, `grad`). It belongs to the returned
            object only: a recording rebuilt by a tree operation has `info=None`.
    """

    t: Any
    spikes: Any
    values: Any
    sources: tuple[str, ...] = eqx.field(static=True, default=())

    # Not a field: timing of the call is no data of the recording, and as a static field it
    # would make every recording a new compiled-program key when passed into `jit`.
    info = None

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: expose recorded fields as attributes.
        values = self.__dict__.get("values")
        if isinstance(values, dict) and name in values:
            return values[name]
        raise AttributeError(
            f"Recording has no attribute {name!r}; recorded fields: "
            f"{sorted(values) if isinstance(values, dict) else 'none (custom record function)'}"
        )


def _sources(model: Any) -> tuple[str, ...]:
    """The populations of a network (`groups`, `group_models`) that are spike sources."""
    groups, models = getattr(model, "groups", None), getattr(model, "group_models", None)
    if groups is None or models is None:
        return ()
    return tuple(n for names, m in zip(groups, models) if isinstance(m, SpikeSource) for n in names)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _state_fields(state: Any) -> list[str]:
    if hasattr(state, "_fields"):  # NamedTuple
        return list(state._fields)
    if isinstance(state, eqx.Module):
        return [f for f in vars(state)]
    if isinstance(state, dict):
        return list(state)
    return []


def _get_field(state: Any, name: str) -> Any:
    return state[name] if isinstance(state, dict) else getattr(state, name)


def _describe(tree: Any) -> str:
    shapes = jtu.tree_map(lambda x: tuple(np.shape(x)), tree)
    return str(shapes)


def _abstract(tree: Any) -> Any:
    return jtu.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), tree)


def _signature(tree: Any) -> Any:
    """A hashable description of a PyTree's structure, shapes and dtypes (None if unhashable):
    the start check's own (`network._checks`)."""
    return _network_checks._abstract(tree)


# Results of `_step_ok`, keyed by the abstract signature of its arguments: checking shapes
# traces `step`, which costs milliseconds, more than a whole short compiled run.
_STEP_OK_CACHE: dict[Any, tuple[bool, str]] = {}
_STEP_OK_CACHE_MAX = 512


def _step_ok(model: Any, state: Any, inp: Any, dt: float) -> tuple[bool, str]:
    """Whether one step with input `inp` keeps the state's structure, shapes and dtypes."""
    key = (_signature(model), _signature(state), _signature(inp), dt)
    cacheable = None not in key[:3]
    if cacheable and key in _STEP_OK_CACHE:
        return _STEP_OK_CACHE[key]
    result = _step_ok_uncached(model, state, inp, dt)
    if cacheable:
        if len(_STEP_OK_CACHE) >= _STEP_OK_CACHE_MAX:
            _STEP_OK_CACHE.pop(next(iter(_STEP_OK_CACHE)))
        _STEP_OK_CACHE[key] = result
    return result


# The abstract (state, outputs) of one step, keyed like `_STEP_OK_CACHE`: the shape check
# and the recording's size both read it, from one trace of `step` per signature.
_STEP_OUT_CACHE: dict[Any, Any] = {}


def _step_abstract(model: Any, state: Any, inp: Any, dt: float) -> Any:
    """The shapes and dtypes of one step's `(state, outputs)` (traced once per signature)."""
    key = (_signature(model), _signature(state), _signature(inp), dt)
    cacheable = None not in key[:3]
    if cacheable and key in _STEP_OUT_CACHE:
        return _STEP_OUT_CACHE[key]
    with _network_checks.checked_run():  # shapes only: the run's start checks the values
        out = eqx.filter_eval_shape(lambda m, s, x: m.step(s, x, dt), model, state, inp)
    if cacheable:
        if len(_STEP_OUT_CACHE) >= _STEP_OK_CACHE_MAX:
            _STEP_OUT_CACHE.pop(next(iter(_STEP_OUT_CACHE)))
        _STEP_OUT_CACHE[key] = out
    return out


def _step_ok_uncached(model: Any, state: Any, inp: Any, dt: float) -> tuple[bool, str]:
    try:
        new_state, _ = _step_abstract(model, state, inp, dt)
    except (TypeError, ValueError) as err:
        return False, str(err).splitlines()[0]
    want = _abstract(state)
    got = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), new_state)
    if jtu.tree_structure(want) != jtu.tree_structure(got):
        return False, "the step changed the state's structure"
    for (path, a), b in zip(jtu.tree_leaves_with_path(want), jtu.tree_leaves(got)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False, (
                f"the step turned the state field {jtu.keystr(path).lstrip('.')!r} of shape "
                f"{a.shape} {a.dtype} into {b.shape} {b.dtype}"
            )
    return True, ""


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Whether an array of `shape` broadcasts to exactly `to`."""
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:
        return False


def _model_fault(model: Any, state: Any, dt: float) -> str | None:
    """What is wrong with the model itself, whatever the inputs, or None.

    Checks every population's array parameters against its number of neurons (a
    per-neuron parameter of the wrong length), then steps the model on its own state with a
    neutral input (none for a network, zeros of the state's shape and dtype for a neuron
    model): a step that then changes a state field's shape or dtype is the model's fault.
    """
    sizes = getattr(model, "sizes", None)
    populations = getattr(model, "populations", None)
    if isinstance(sizes, dict) and isinstance(populations, dict):
        members = [(f"population {k!r} ", populations[k], sizes[k]) for k in sizes]
        probe = None
    else:
        v = getattr(state, "v", None)
        if v is None:
            floats = [x for x in jtu.tree_leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
            v = floats[0] if floats else None
        if v is None or not hasattr(v, "shape") or not v.shape:
            return None
        members = [("", model, v.shape[-1])]
        probe = jax.ShapeDtypeStruct(v.shape, v.dtype)
    for where, member, n in members:
        # Only a neuron model's parameters are per neuron (a neuron model declares the state
        # fields others may read); a layer's weight matrix is not.
        if not hasattr(member, "required_state_fields"):
            continue
        params = eqx.filter(member, eqx.is_array)
        for path, leaf in jtu.tree_leaves_with_path(params):
            shape = tuple(np.shape(leaf))
            if len(shape) >= 1 and not _broadcasts(shape, (n,)):
                name = jtu.keystr(path).lstrip(".")
                return (
                    f"{where}{type(member).__name__}: parameter {name} has shape {shape}, which "
                    f"does not broadcast to the population's {n} neurons (a per-neuron parameter "
                    f"needs shape ({n},))"
                )
    if probe is not None:
        probe = jnp.zeros(probe.shape, probe.dtype)
    ok, why = _step_ok(model, state, probe, dt)
    if not ok and why.startswith(("the step turned", "the step changed")):
        return (
            f"{type(model).__name__}.step, given its own state, changes it: {why}; a step must "
            "return a state with the structure, shapes and dtypes it received"
        )
    return None


def _inputs_error(model: Any, state: Any, dt: float, message: str) -> ValueError:
    """The error for inputs that do not fit, unless the model itself is at fault."""
    fault = _model_fault(model, state, dt)
    if fault is not None:
        return ValueError(f"simulate: the model cannot run: {fault}")
    return ValueError(message)


def _classify_inputs(model, state, inputs, n_steps, dt) -> tuple[str, int]:
    """Decide how `inputs` is read: 'none', 'fn', 'const' or 'series'; return it and n_steps."""
    if inputs is None:
        kind = "none"
    elif callable(inputs) and not isinstance(inputs, (jax.Array, np.ndarray)):
        kind = "fn"
    else:
        leaves = jtu.tree_leaves(inputs)
        if not leaves:
            raise ValueError(f"simulate: inputs must contain at least one array, got {inputs!r}")
        lead = {np.shape(x)[0] if np.ndim(x) >= 1 else None for x in leaves}
        series_len = lead.pop() if len(lead) == 1 else None
        if n_steps is None:
            if series_len is None:
                raise ValueError(
                    "simulate: n_steps is required unless inputs is a time-major array (leading "
                    f"axis = time, shared by every leaf); got inputs of shapes {_describe(inputs)}"
                )
            kind, n_steps = "series", series_len
            ok, why = _step_ok(model, state, jtu.tree_map(lambda x: x[0], inputs), dt)
            if not ok:
                raise _inputs_error(
                    model,
                    state,
                    dt,
                    f"simulate: one time step of inputs (shapes {_describe(inputs)} without the "
                    f"leading time axis) does not fit the state of shapes {_describe(state)}: "
                    f"{why}",
                )
        else:
            const_ok, const_why = _step_ok(model, state, inputs, dt)
            series_ok, series_why = False, ""
            if series_len == n_steps:
                first = jtu.tree_map(lambda x: x[0], inputs)
                series_ok, series_why = _step_ok(model, state, first, dt)
            if const_ok and series_ok:
                raise ValueError(
                    f"simulate: inputs of shapes {_describe(inputs)} are ambiguous with n_steps="
                    f"{n_steps}: they fit both as a constant input and as a time series of "
                    f"{n_steps} steps. For a time series omit n_steps; for a constant pass "
                    "inputs=lambda t, i: x"
                )
            if const_ok:
                kind = "const"
            elif series_ok:
                kind = "series"
            else:
                why = series_why or const_why
                raise _inputs_error(
                    model,
                    state,
                    dt,
                    f"simulate: inputs of shapes {_describe(inputs)} fit the state of shapes "
                    f"{_describe(state)} neither as a constant nor as a time series of n_steps="
                    f"{n_steps} steps ({why})",
                )
    if n_steps is None:
        raise ValueError(
            "simulate: n_steps is required when inputs is None, a constant or a function"
        )
    if kind == "fn":
        try:
            sample = jax.eval_shape(inputs, jnp.zeros((), jnp.result_type(float)), jnp.int32(0))
        except Exception as err:  # the user's function may raise anything while tracing
            raise ValueError(
                "simulate: the inputs function must take (t_ms, step_index) and return the "
                f"step input; calling it failed: {type(err).__name__}: {err}"
            ) from err
        for leaf in jtu.tree_leaves(sample):
            if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
                raise TypeError(
                    f"simulate: the inputs function returns complex values ({leaf.dtype}); "
                    "the models take real currents, and the imaginary part would be dropped"
                )
        ok, why = _step_ok(model, state, sample, dt)
        if not ok:
            raise _inputs_error(
                model,
                state,
                dt,
                f"simulate: the inputs function returns shapes {_describe(sample)} which do not "
                f"fit the state of shapes {_describe(state)}: {why}",
            )
    if kind == "none":
        ok, why = _step_ok(model, state, None, dt)
        if not ok:
            raise _inputs_error(
                model, state, dt, f"simulate: the model cannot step without inputs: {why}"
            )
    return kind, n_steps


class _PopulationFields(tuple):
    """A normalised per-population record: `((field, population, selector), ...)`, where the
    selector is None (every neuron), `("slice", start, stop, step)` or `("index", ints)`.
    Hashable, so that it is part of the compiled run's static configuration."""


def _selector(owner: str, sel: Any, n: int) -> Any:
    """A hashable form of a neuron subset of a population of `n` neurons."""
    if sel is None:
        return None
    if isinstance(sel, slice):
        start, stop, step = sel.indices(n)
        if len(range(start, stop, step)) == 0:
            raise ValueError(f"{owner}: the slice {sel} selects no neuron of {n}")
        return ("slice", start, stop, step)
    if isinstance(sel, (int, np.integer)) and not isinstance(sel, bool):
        sel = [sel]
    if isinstance(sel, jax.core.Tracer):
        raise TypeError(f"{owner}: a neuron subset must be concrete, got a traced value")
    idx = np.asarray(sel)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(
            f"{owner}: a neuron subset must be a slice, an int or a non-empty 1-D sequence of "
            f"ints, got {sel!r}"
        )
    if idx.min() < -n or idx.max() >= n:
        raise ValueError(
            f"{owner}: neuron indices must lie in [{-n}, {n}) for a population of {n}, got "
            f"indices in [{idx.min()}, {idx.max()}]"
        )
    return ("index", tuple(int(i) % n for i in idx))


def _population_record(record: Any, state: Any) -> _PopulationFields:
    """Normalise `record` for a state with per-population states (`state.populations`)."""
    pops = state.populations
    if isinstance(record, (tuple, list)):  # the fields of every population that has them
        entries = []
        for name in record:
            having = [p for p, st in pops.items() if name in _state_fields(st)]
            if not having:
                raise ValueError(
                    f"simulate: record names {name!r}, a field of no population; their fields "
                    f"are {{{', '.join(f'{p!r}: {_state_fields(st)}' for p, st in pops.items())}}}"
                )
            entries += [(name, p, None) for p in having]
        return _PopulationFields(entries)
    entries = []
    for pop, fields in record.items():
        if pop not in pops:
            raise ValueError(
                f"simulate: record names population {pop!r}; the populations are {list(pops)}"
            )
        if isinstance(fields, str):
            fields = (fields,)
        if isinstance(fields, Mapping):
            items = list(fields.items())
        elif isinstance(fields, (tuple, list)):
            items = [(f, None) for f in fields]
        else:
            raise TypeError(
                f"simulate: record[{pop!r}] must be a tuple of field names or a dict "
                f"{{field: neuron subset}}, got {fields!r}"
            )
        have = _state_fields(pops[pop])
        for field, sel in items:
            if not isinstance(field, str) or field not in have:
                raise ValueError(
                    f"simulate: record[{pop!r}] names unknown state field {field!r}; population "
                    f"{pop!r} has {have}"
                )
            n = int(np.shape(_get_field(pops[pop], field))[-1])
            entries.append((field, pop, _selector(f"simulate: record[{pop!r}][{field!r}]", sel, n)))
    if len({(f, p) for f, p, _ in entries}) != len(entries):
        raise ValueError("simulate: record lists a population's field twice")
    return _PopulationFields(entries)


def _record_spec(record: Any, state: Any) -> Any:
    if record is None or callable(record):
        return record
    if isinstance(record, str):
        record = (record,)
    per_population = hasattr(state, "populations") and isinstance(state.populations, Mapping)
    if isinstance(record, Mapping):
        if not per_population:
            raise TypeError(
                "simulate: record as a dict {population: fields} needs a network state (with "
                f"per-population states); this state is a {type(state).__name__}: pass a tuple "
                "of its field names"
            )
        return _population_record(record, state)
    if not isinstance(record, (tuple, list)) or not all(isinstance(r, str) for r in record):
        raise TypeError(
            "simulate: record must be None, a tuple of state field names, a dict {population: "
            f"fields}} (networks) or a function (state, outputs) -> PyTree, got {record!r}"
        )
    if len(set(record)) != len(record):
        raise ValueError(f"simulate: record lists a field twice: {tuple(record)}")
    fields = _state_fields(state)
    if per_population and not any(name in fields for name in record):
        return _population_record(record, state)
    for name in record:
        if name not in fields:
            raise ValueError(
                f"simulate: record names unknown state field {name!r}; the state has {fields}"
            )
    return tuple(record)


def _recorded_values(record: Any, st: Any, out: Any) -> Any:
    """What one recorded step stores, for a normalised `record`."""
    if record is None:
        return {}
    if callable(record):
        return record(st, out)
    if isinstance(record, _PopulationFields):
        values: dict[str, dict[str, Any]] = {}
        for field, pop, sel in record:
            x = _get_field(st.populations[pop], field)
            if sel is not None and sel[0] == "slice":
                x = x[..., sel[1] : sel[2] : sel[3]]
            elif sel is not None:
                x = x[..., jnp.asarray(sel[1], jnp.int32)]
            values.setdefault(field, {})[pop] = x
        return values
    return {name: _get_field(st, name) for name in record}


def _nonfinite_index(state: Any) -> jax.Array:
    """Index of the first float leaf of `state` holding a non-finite value, or -1."""
    flags = [
        ~jnp.all(jnp.isfinite(x))
        for x in jtu.tree_leaves(state)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    if not flags:
        return jnp.int32(-1)
    flags = jnp.stack(flags)
    return jnp.where(jnp.any(flags), jnp.argmax(flags).astype(jnp.int32), jnp.int32(-1))


def _float_leaf_names(state: Any) -> list[str]:
    names = []
    for path, x in jtu.tree_leaves_with_path(state):
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            names.append(jtu.keystr(path).lstrip("."))
    return names


def _run_chunk(
    model,
    state,
    inputs,
    start,
    diag,
    *,
    dt: float,
    n_rec: int,
    record_every: int,
    kind: str,
    input_fn: Callable | None,
    record: Any,
    spike_dtype: str | None,
    check: bool,
    unroll: int,
    checkpoint: bool = False,
    truncate_backprop: int | None = None,
    ids_cap: int | None = None,
):
    """Scan `n_rec * record_every` steps starting at global step index `start`."""
    float_dtype = jnp.result_type(float)

    # A model that runs many steps in one call says so (`NeuronModel.fused_run`); None means
    # it cannot serve this configuration, and the scan over `step` below runs it.
    fused_run = getattr(model, "fused_run", None)
    if callable(fused_run):
        fused = fused_run(
            state,
            input_fn if kind == "fn" else inputs,
            dt,
            n_rec,
            record_every,
            kind=kind,
            record=record,
            spike_dtype=spike_dtype,
            check=check,
            checkpoint=checkpoint,
            truncate_backprop=truncate_backprop,
        )
        if fused is not None:
            # `(state, spikes)`, or `(state, spikes, {field: record})` when fields are recorded.
            state, spikes, *values = fused
            return state, spikes, values[0] if values else {}, diag

    def plain_step(st, inp):
        return model.step(st, inp, dt)

    # Rematerialise each step in the backward pass: only the carried state is stored per
    # step, not the step's intermediates (currents, surrogate inputs, gate values).
    stepper = jax.checkpoint(plain_step) if checkpoint else plain_step

    def one_step(carry, x):
        st, i, dg = carry
        if kind == "fn":
            inp = input_fn(i.astype(float_dtype) * dt, i)
        elif kind == "series":
            inp = x
        elif kind == "const":
            inp = inputs
        else:
            inp = None
        if truncate_backprop is not None:
            # Cut the gradient path through the state at the start of every window of
            # truncate_backprop steps; jnp.where sends the cotangent only to the taken branch.
            cut = (i % truncate_backprop == 0) & (i > 0)
            st = jtu.tree_map(
                lambda x: (
                    jnp.where(cut, jax.lax.stop_gradient(x), x)
                    if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
                    else x
                ),
                st,
            )
        st, out = stepper(st, inp)
        if check:
            bad = _nonfinite_index(st)
            first = (dg[0] < 0) & (bad >= 0)
            dg = (jnp.where(first, i, dg[0]), jnp.where(first, bad, dg[1]))
        return (st, i + 1, dg), out

    def to_record(out):
        if spike_dtype == "ids":
            return jtu.tree_map(lambda o: _spike_ids(o, ids_cap), out)
        return out if spike_dtype is None else recorded_spikes(out, most_spikes(model, out))

    def window(carry, xs):
        if record_every == 1:
            carry, out = one_step(carry, xs)
            spikes = to_record(out)
        else:
            # Counts accumulate in the carry: stacking the window's outputs and summing them
            # afterwards would write and re-read record_every full output arrays per window.
            shapes = jax.eval_shape(
                one_step, carry, None if xs is None else jtu.tree_map(lambda x: x[0], xs)
            )[1]
            most = most_spikes(model, shapes)

            def acc_dtype(o, k):
                return o.dtype if spike_dtype is None else count_dtype(record_every * k)

            acc0 = jtu.tree_map(lambda o, k: jnp.zeros(o.shape, acc_dtype(o, k)), shapes, most)
            last0 = jtu.tree_map(lambda o: jnp.zeros(o.shape, o.dtype), shapes)

            def inner(c, x):
                carry_, acc, _ = c
                carry_, out_ = one_step(carry_, x)
                if spike_dtype is None:
                    acc = jtu.tree_map(jnp.add, acc, out_)
                else:
                    # Counts of multi-spike sources are added as they are (`most_spikes`).
                    acc = jtu.tree_map(
                        lambda a, o, k: a + (o if k > 1 else o > 0).astype(a.dtype),
                        acc,
                        out_,
                        most,
                    )
                return (carry_, acc, out_), None

            (carry, spikes, out), _ = jax.lax.scan(
                inner, (carry, acc0, last0), xs, length=record_every, unroll=unroll
            )
        return carry, (spikes, _recorded_values(record, carry[0], out))

    xs = None
    if kind == "series":
        xs = inputs
        if record_every > 1:
            xs = jtu.tree_map(lambda x: x.reshape((n_rec, record_every) + x.shape[1:]), xs)
    carry = (state, start, diag)
    carry, (spikes, values) = jax.lax.scan(
        window, carry, xs, length=n_rec, unroll=unroll if record_every == 1 else 1
    )
    state, _, diag = carry
    return state, spikes, values, diag


_run_chunk_jit = eqx.filter_jit(_run_chunk)

_HOST_TRANSFER_UNDER_TRACE = (
    "simulate: chunk_size and progress move data to the host between chunks (as "
    "nj.Record(spikes='ids') does) and cannot run inside jit/vmap/grad; call simulate outside "
    "the transformation, or drop them"
)


def simulate(
    model: Any,
    state: Any,
    inputs: Any = None,
    *,
    dt: float,
    n_steps: int | None = None,
    record: Any = None,
    record_every: int = 1,
    chunk_size: int | None = None,
    progress: bool = False,
    check: bool = False,
    start: Any = None,
    run: Execution | None = None,
    gradient: str | SurrogateGradient | EventPropGradient = "surrogate",
    spike_dtype: Any = _options.UNSET,
    unroll: Any = _options.UNSET,
    batch_block: Any = _options.UNSET,
    checkpoint: Any = _options.UNSET,
    truncate_backprop: Any = _options.UNSET,
) -> tuple[Any, Recording]:
    """Run `model.step` for `n_steps` steps of `dt` ms with `jax.lax.scan` under `jit`.

    `model` is any object with `step(state, inputs, dt) -> (state, outputs)`: a neuron
    model (`nj.LIF`, ...), a spike source, synaptic kinetics or an `nj.Network`.

    Args:
        model: the steppable object (an `equinox.Module`; its array leaves are traced, so
            changing parameter values reuses the compiled program).
        state: the initial state (for example `model.init_state(n)`).
        inputs: what the model receives at each step:
            - `None`: no input;
            - a constant (scalar, array or PyTree) given at every step;
            - a time-major array (or PyTree of arrays sharing a leading time axis) whose
              row `i` is the input of step `i`; `n_steps` may then be omitted;
            - a function `(t_ms, step_index) -> input`, traced inside the scan, where
              `t_ms = step_index * dt` is the time at the start of the step. A plain
              function or lambda is part of the compiled program's identity (a new lambda
              recompiles, and arrays it closes over are baked in as constants); an
              `equinox.Module` with a `__call__(t_ms, step_index)` keeps its array fields as
              traced inputs, so new values reuse the compiled program.
            An array whose leading axis equals `n_steps` and that would also fit as a
            constant is rejected as ambiguous: omit `n_steps` for a time series, or pass
            `lambda t, i: x` for a constant.
        dt: time step [ms], a static Python number.
        n_steps: number of steps (positive int).
        record: what is recorded beside the step outputs (spikes): an `nj.Record(fields,
            every, spikes)`, or its `fields` alone. `None` records only the spikes; a tuple of
            state field names (`("v",)`) also records those fields; a function `(state,
            outputs) -> PyTree` records whatever it returns (available as
            `recording.values`). On a network, a tuple of field names records them for every
            population that has them, and a dict chooses per population and, optionally, a
            subset of its neurons: `{"E": ("v",), "I": ("v",)}` or `{"E": {"v": slice(0,
            10)}}` (a slice, an int or a sequence of neuron indices); the recording then has
            one dict per field, `recording.v["E"]` of shape `(n_rec, *batch, neurons
            recorded)`. `nj.Record(spikes=...)` says how spikes are kept: `"raster"`
            (default: booleans, counts with `every > 1` and for a source that emits several
            spikes per step, so that none is lost), `"ids"` (only the spikes, as
            `nj.SpikeTimes` event lists, memory in proportion to the spikes: the way to record
            a large network; each step keeps a buffer of spike ids that grows, with the chunk
            rerun, when a step has more spikes; it needs `every=1`, runs outside
            transformations and not with `batch_block`) or `"float"` (the model's float
            outputs, to differentiate through the recorded spikes).
        record_every: shorthand of `nj.Record(every=...)`: record every `record_every`-th step
            (state after that step); spikes are then summed over each window so that none is
            lost. Must divide `n_steps`. Give it here or in `record=nj.Record(...)`, not both.
        chunk_size: shorthand of `nj.Execution(chunk_size=...)`: run the scan in jitted
            chunks of this many steps and move each chunk's recording to the host (NumPy)
            before the next, so that long runs fit in device memory. Must be a multiple of
            `record_every`. Results are bit-identical to an unchunked run.
        progress: shorthand of `nj.Execution(progress=...)`: show a progress bar (tqdm) that
            says while the run compiles, then the simulated time and the steps per second of
            running alone (compile time left out). Without `chunk_size`, the run is split into
            about 20 chunks whose recordings stay on the device.
        check: guard against non-finite state. After the run, raise `FloatingPointError`
            naming the first step and state field that became NaN or infinite. Costs one
            reduction per state leaf per step; free when off.
        start: the index of the first step, so that a run continued from a final state keeps
            the clock: the step index and time `t_ms` given to an `inputs` function, and
            `recording.t`, count from `start` (`recording.t[0] = (start + record_every) *
            dt`). `None` (default) reads it from the state when the state counts its steps
            (a network's `state.step`), else 0. A run split in two (the second from the
            first's final state) then equals one run bit for bit, inputs and `recording.t`
            included. A non-negative int, or an integer scalar array (traced under `jit`).
        run: an `nj.Execution(chunk_size, progress, unroll, batch_block)`: how the compiled
            loop is cut and shown, none of which changes a result. `unroll` is the steps per
            iteration of the compiled loop (`lax.scan`'s `unroll`; larger values cut per-step
            overhead for small models at the cost of compile time). `batch_block`, for a state
            with a leading batch axis of `B` independent trials, runs them in blocks of
            `batch_block` trials one after the other (`lax.map` over blocks, inside one
            compiled program): a step of a large batch streams every state array through
            memory, and blocks small enough to stay in cache run faster per trial (the COBA
            network at batch 32: 0.15 s per trial in one block, 0.08 s in blocks of 4,
            `benchmarks/RESULTS.md`). Every state leaf with at least one dimension must have
            the batch axis first; scalar leaves are shared, except PRNG keys, which are folded
            with the block index so that blocks draw independent numbers. `inputs` are shared
            by all trials. Results equal an unblocked run up to those keys; the final state's
            shared leaves are those of the first block. `None`: the defaults, with
            `chunk_size` and `progress` from the shorthands.
        gradient: which gradient `jax.grad` through this call computes.
            `"surrogate"` or `nj.SurrogateGradient(checkpoint, truncate_backprop)` (default):
            the time-grid simulation above, spikes with surrogate derivatives. Its
            `checkpoint=True` wraps each step in `jax.checkpoint`, so that the backward pass
            keeps only the state carried between steps and recomputes each step's
            intermediates (time grows by about one forward pass; values and gradients are
            unchanged); it pays off for models whose step computes much more than it carries
            (Hodgkin-Huxley gates, networks with synaptic kinetics), while for a LIF layer the
            carried state is as large as the saved residuals (`benchmarks/RESULTS.md`,
            training). Its `truncate_backprop=K` cuts the gradient path through the state at
            steps `K`, `2K`, ... (truncated backpropagation through time; the forward run is
            unchanged). `"eventprop"` or `nj.EventPropGradient()`: exact gradients by the
            adjoint method of Wunderlich and Pehle (2021) on an exact event-driven run of an
            `nj.training.EventNetwork` (current-based LIF, exponential or delta synapses,
            delays) for `n_steps * dt` ms; `state` is `None`, `inputs` the input spike times,
            and the recording an `nj.training.EventRecording` (see
            `nj.training.eventprop_run`). Models without an exact spike time (Izhikevich,
            AdEx, Hodgkin-Huxley), conductance synapses and the grid's options (`record`,
            `chunk_size`, ...) are refused, never replaced.
        spike_dtype: deprecated, `record=nj.Record(spikes=...)`: `"bool"` is `"raster"`,
            `"ids"` is `"ids"` and `None` is `"float"`.
        unroll: deprecated, `run=nj.Execution(unroll=...)`.
        batch_block: deprecated, `run=nj.Execution(batch_block=...)`.
        checkpoint: deprecated, `gradient=nj.SurrogateGradient(checkpoint=...)`.
        truncate_backprop: deprecated, `gradient=nj.SurrogateGradient(truncate_backprop=...)`.

    The five deprecated keywords work until the next release, with one `DeprecationWarning`
    per call that names the new spelling. A value given both as a keyword and inside an
    option object (`record_every=5` with `record=nj.Record(every=10)`, `chunk_size=` with
    `run=`, `checkpoint=` with `gradient=nj.SurrogateGradient(...)`) is a `ValueError`; a
    shorthand left at its default defers to the object.

    **Fused runs.** Before scanning `step`, `simulate` asks the model for a fused run of the
    whole chunk (`NeuronModel.fused_run`, when the model has one) and uses it unless the
    model answers `None`. `nj.LIF` serves uncoupled populations with no input or a constant
    float input, spikes recorded as a raster (the default `nj.Record(spikes="raster")`, raster
    or counts), no `record`, and none of `check`, `checkpoint`, `truncate_backprop`: on CPU one
    compiled kernel takes the neurons in cache-sized blocks through all steps (5x Brian2's C++
    standalone mode at 10^6 neurons in `benchmarks/RESULTS.md`), with a final state and
    raster identical to the general scan's; `grad` goes through a pure-JAX scan of the same
    arithmetic, and `nj.kernels.use("reference")` (or `NEUROJAX_CPU_KERNEL=0`) runs that scan
    instead of the kernel. `nj.HodgkinHuxley` serves the same configurations through a kernel
    of its own, on all of XLA's CPU threads; it integrates the same equations with its own
    vectorised `exp`, so its results equal the general scan's to rounding rather than to the
    bit (float32 spike times within one step). A subclass that overrides `step` is scanned.

    Returns:
        `(final_state, recording)`; see `Recording`. Without `chunk_size` the recording
        stays on the device (JAX arrays); with it, or with `nj.Record(spikes="ids")`, it is on
        the host (NumPy arrays). `recording.info` says how long compiling and running took.

    Same inputs and key give bit-identical results, chunked or not.

    Example:
    ```python
    import neurojax as nj
    lif = nj.LIF()
    final, rec = nj.simulate(lif, lif.init_state(100), 20.0, dt=0.1, n_steps=1000,
                             record=("v",))
    rec.spikes.shape, rec.v.shape     # (1000, 100), (1000, 100)
    # every 10th step, spikes as float outputs, in chunks of 500 steps on the host
    final, rec = nj.simulate(lif, lif.init_state(100), 20.0, dt=0.1, n_steps=1000,
                             record=nj.Record(fields=("v",), every=10, spikes="float"),
                             run=nj.Execution(chunk_size=500))
    ```
    """
    dt = check_dt("simulate", dt)
    opts = _options.resolve(
        record=record,
        record_every=record_every,
        chunk_size=chunk_size,
        progress=progress,
        run=run,
        gradient=gradient,
        spike_dtype=spike_dtype,
        unroll=unroll,
        batch_block=batch_block,
        checkpoint=checkpoint,
        truncate_backprop=truncate_backprop,
    )
    record, record_every = opts.record.plain_fields, opts.record.every
    chunk_size, progress = opts.run.chunk_size, opts.run.progress
    unroll, batch_block = opts.run.unroll, opts.run.batch_block
    if isinstance(opts.gradient, EventPropGradient):
        if opts.record.spikes != "raster":
            raise ValueError(
                f"simulate(gradient='eventprop'): record={opts.record!r} keeps spikes as "
                f"{opts.record.spikes!r}, an option of the time-grid simulation; EventProp "
                "records exact spike times (leave spikes at 'raster')"
            )
        grid_options = dict(record=record, record_every=record_every, chunk_size=chunk_size,
                            progress=progress, check=check, unroll=unroll,
                            batch_block=batch_block, start=start)  # fmt: skip
        return _eventprop.simulate_eventprop(
            model, state, inputs, dt=dt, n_steps=n_steps, gradient="eventprop",
            options=grid_options,
        )  # fmt: skip
    spike_dtype = _options.DTYPE_OF_SPIKES[opts.record.spikes]
    checkpoint = opts.gradient.checkpoint
    truncate_backprop = opts.gradient.truncate_backprop
    first = _start_of(state, start)
    if batch_block is not None:
        _check_blocks(state, batch_block)
        if spike_dtype == "ids":
            raise ValueError(
                "simulate: spikes='ids' (nj.Record) cannot be combined with batch_block "
                f"(nj.Execution(batch_block={batch_block})); record the batch's spikes as ids "
                "without blocks, or as a raster with blocks"
            )
    if not hasattr(model, "step") or not callable(model.step):
        raise TypeError(
            f"simulate: model must have a step(state, inputs, dt) method, got {type(model)!r}"
        )
    if n_steps is not None:
        n_steps = check_positive_int("simulate", "n_steps", n_steps)
    if not isinstance(check, bool):
        raise TypeError(f"simulate: check must be a bool, got {check!r}")
    record = _record_spec(record, state)
    # The state against the model's own init_state (type, field shapes, dtypes) and the
    # inputs' values, before any input is matched to the state or anything compiled.
    state = _network_checks.check_run(model, state)
    if inputs is not None and not callable(inputs):
        _validation.check_input_values("simulate", inputs)
    kind, n_steps = _classify_inputs(model, state, inputs, n_steps, dt)
    if not _is_tracer(first):
        _validation.check_run_length("simulate", first, n_steps, record_every)
    if n_steps % record_every:
        raise ValueError(f"simulate: record_every={record_every} must divide n_steps={n_steps}")
    if chunk_size is not None and chunk_size % record_every:
        raise ValueError(
            f"simulate: chunk_size={chunk_size} must be a multiple of record_every={record_every}"
        )
    traced = any(_is_tracer(x) for x in jtu.tree_leaves((model, state, inputs)))
    if traced and (chunk_size is not None or progress or spike_dtype == "ids"):
        raise ValueError(_HOST_TRANSFER_UNDER_TRACE)
    per_record = _record_bytes(model, state, inputs, kind, record, dt, record_every, spike_dtype)
    total = per_record * (n_steps // record_every)
    available = _available_bytes(on_host=chunk_size is not None)
    if available is not None and total > available:
        where = "host" if chunk_size is not None else "device"
        raise RecordingTooLarge(
            f"simulate: the recording would take {_gb(total)} ({n_steps // record_every} "
            f"records of {per_record} bytes), more than the {_gb(available)} of {where} memory "
            "available; record fewer steps (record_every=K sums spikes over K steps), fewer "
            "fields or neurons (record=...), run fewer steps per call (continue from the final "
            "state), or move chunks to the host as they finish (chunk_size=...)"
        )

    to_host = chunk_size is not None
    # A model with a bounded spike buffer (a network's pure-JAX event path) reruns a chunk in
    # which a step needed a larger buffer, with one that holds it; each chunk starts again
    # from the model's own buffer, so a burst (a network's initial transient) costs one chunk
    # run twice, not a large buffer for the whole run.
    fits = callable(getattr(model, "fit_capacity", None))
    if chunk_size is None:
        chunk_size = n_steps
        if progress:
            chunk_size = record_every * max(1, math.ceil(n_steps / record_every / 20))
        elif fits and not traced and model.buffers_may_overflow():
            chunk_size = record_every * max(1, math.ceil(n_steps / record_every / 8))
    n_rec_total = n_steps // record_every

    input_fn = inputs if kind == "fn" else None
    if kind in ("const", "series"):
        # Python scalars would be static under jit (a new value would recompile): make arrays.
        inputs = jtu.tree_map(lambda x: x if isinstance(x, jax.Array) else jnp.asarray(x), inputs)
    const = inputs if kind == "const" else None
    ids = _SpikeIdBuffer(state, model, inputs, kind, dt) if spike_dtype == "ids" else None
    options = dict(
        dt=dt,
        record_every=record_every,
        kind=kind,
        input_fn=input_fn,
        record=record,
        spike_dtype=spike_dtype,
        check=check,
        unroll=unroll,
        checkpoint=checkpoint,
        truncate_backprop=truncate_backprop,
    )
    # Under the caller's transformation the diagnostics stay traced; a record or inputs
    # function closing over traced values makes them traced too (found after the first chunk).
    diag = [(jnp.int32(-1), jnp.int32(-1))]

    def run_chunk(m, st, offset, length):
        chunk_inputs = const
        if kind == "series":
            window = slice(offset, offset + length)
            chunk_inputs = jtu.tree_map(lambda x, w=window: x[w], inputs)
        runner = _run_blocked_chunk_jit if batch_block is not None else _run_chunk_jit
        extra = {"block": batch_block} if batch_block is not None else {}
        out = runner(
            m,
            st,
            chunk_inputs,
            jnp.asarray(first + offset, jnp.int32),
            diag[0],
            n_rec=length // record_every,
            ids_cap=None if ids is None else ids.cap,
            **options,
            **extra,
        )
        new_state, spikes, values, new_diag = out
        if _is_tracer(new_diag[0]) and not traced and (to_host or progress or ids is not None):
            raise ValueError(_HOST_TRANSFER_UNDER_TRACE)
        return new_state, (spikes, values, new_diag)

    def refit(m, new_state, out):
        if not _is_tracer(out[2][0]):
            if ids is not None and ids.grow(out[0]):
                return m, True  # a step had more spikes than the id buffer: rerun, larger
            if fits:
                grown = m.fit_capacity(new_state)
                if grown is not m:
                    return grown, True  # spikes were left out: run again, larger buffer
        diag[0] = out[2]
        return m, False

    # The model was checked where the run starts (`check_run` above): its steps skip the
    # check a step called on its own makes (`Network.step`).
    with _network_checks.checked_run():
        model, state, chunks, info = run_chunks(
            run_chunk,
            model,
            state,
            n_steps=n_steps,
            chunk_size=chunk_size,
            refit=refit,
            to_host=to_host or ids is not None,
            progress=progress,
            dt=dt,
            traced=traced,
        )
    if _is_tracer(chunks[-1][2][0]):
        # An inputs function or record function closing over traced values puts the whole
        # run under the caller's transformation, even with concrete arguments.
        traced = True
    diag = chunks[-1][2]
    chunks = [(spikes, values) for spikes, values, _ in chunks]

    if ids is not None:
        spikes = ids.spike_times([c[0] for c in chunks], first, record_every)
        values = _concatenate([c[1] for c in chunks], to_host=True)
    elif len(chunks) == 1:
        spikes, values = chunks[0]
    else:
        spikes, values = _concatenate(chunks, to_host)

    if fits and traced and model.buffers_may_overflow():
        # No rerun is possible under the caller's transformation: one check after the run.
        state = model.check_capacity(state)

    if not check and not traced:
        bad = _validation.nonfinite_fields(state)
        if bad:
            fields = ", ".join(f"{name!r} ({n} of {size} entries)" for name, n, size in bad)
            warnings.warn(
                f"simulate: the final state holds NaN or infinity in field(s) {fields}: the "
                "initial state or the inputs held non-finite values, or the integration is "
                f"unstable at dt={dt} ms (the recording after that point is meaningless). Run "
                "with check=True to raise at the first step that produced them",
                RuntimeWarning,
                stacklevel=2,
            )

    if check:
        bad_step, bad_leaf = diag
        names = _float_leaf_names(state)
        if traced:
            state = eqx.branched_error_if(
                state,
                bad_leaf >= 0,
                jnp.maximum(bad_leaf, 0),
                [f"simulate(check=True): state field {n!r} became non-finite" for n in names],
            )
        elif int(bad_leaf) >= 0:
            step = int(bad_step)
            raise FloatingPointError(
                f"simulate: state field {names[int(bad_leaf)]!r} became non-finite at step {step}"
                f" (t = {step * dt:g} to {(step + 1) * dt:g} ms); check dt against the model's "
                "stability limit and the size of the inputs"
            )

    if _is_tracer(first):
        steps = first + jnp.arange(1, n_rec_total + 1, dtype=jnp.int32) * record_every
        t = steps.astype(jnp.result_type(float)) * dt
    else:
        t = ((int(first) + np.arange(1, n_rec_total + 1) * record_every) * dt).astype(np.float64)
        if not to_host and ids is None:
            t = jnp.asarray(t, dtype=jnp.result_type(float))
    rec = Recording(t=t, spikes=spikes, values=values, sources=_sources(model))
    if info is not None:
        object.__setattr__(rec, "info", info)
    return state, rec


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key)


class RecordingTooLarge(ValueError):
    """The recording a `simulate` call asks for cannot fit in the memory available."""


def _step_outputs(model: Any, state: Any, inputs: Any, kind: str, dt: float) -> Any:
    """The abstract outputs (shapes and dtypes) of one step with one step's input."""
    if kind == "fn":
        inp = jax.eval_shape(inputs, jnp.zeros((), jnp.result_type(float)), jnp.int32(0))
    elif kind == "series":
        inp = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), inputs)
    else:
        inp = inputs
    return _step_abstract(model, state, inp, dt)[1]


def _record_bytes(model, state, inputs, kind, record, dt, record_every, spike_dtype) -> int:
    """Bytes of one recorded step: the step outputs as `simulate` keeps them, and the fields."""
    try:
        out = _step_outputs(model, state, inputs, kind, dt)
    except Exception:  # noqa: BLE001  (the run itself will report it)
        return 0
    if record_every > 1:
        itemsize = np.dtype(count_dtype(record_every)).itemsize
        size = sum(int(np.prod(o.shape)) * itemsize for o in jtu.tree_leaves(out))
    elif spike_dtype == "bool":
        size = sum(int(np.prod(o.shape)) for o in jtu.tree_leaves(out))
    else:
        size = sum(int(np.prod(o.shape)) * o.dtype.itemsize for o in jtu.tree_leaves(out))
    if record is None:
        return size
    if callable(record):
        try:
            values = eqx.filter_eval_shape(record, state, out)
        except Exception:  # noqa: BLE001
            return size
        _validation.check_record_values("simulate", values)
    else:
        values = jax.eval_shape(lambda st: _recorded_values(record, st, None), state)
    # a `record` function may return Python numbers (one value each; eval_shape keeps them)
    return size + sum(
        int(np.prod(getattr(v, "shape", ())))
        * np.dtype(getattr(v, "dtype", None) or jnp.result_type(v)).itemsize
        for v in jtu.tree_leaves(values)
    )


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def _start_of(state: Any, start: Any) -> Any:
    """The index of a run's first step: `start`, else the state's own step counter (a scalar
    integer field `step`), else 0. An int, or a scalar int32 array when traced."""
    if start is None:
        step = getattr(state, "step", None)
        if step is None or not hasattr(step, "dtype") or np.ndim(step) != 0:
            return 0
        if not jnp.issubdtype(step.dtype, jnp.integer):
            return 0
        start = step
    if isinstance(start, bool):
        raise TypeError(f"simulate: start must be a non-negative int, got {start!r}")
    if isinstance(start, (int, np.integer)):
        if start < 0:
            raise ValueError(f"simulate: start must be a non-negative int, got {start!r}")
        return int(start)
    if not (hasattr(start, "dtype") and jnp.issubdtype(start.dtype, jnp.integer)):
        raise TypeError(f"simulate: start must be a non-negative int, got {start!r}")
    if np.ndim(start) != 0:
        raise ValueError(f"simulate: start must be a scalar step index, got shape {start.shape}")
    if _is_tracer(start):
        return jnp.asarray(start, jnp.int32)
    if int(start) < 0:
        raise ValueError(f"simulate: start must be a non-negative int, got {int(start)}")
    return int(start)


def _check_blocks(state: Any, block: int) -> None:
    """Refuse a `batch_block` that the state's leading batch axis does not split into."""
    sizes = {np.shape(x)[0] for x in jtu.tree_leaves(state) if np.ndim(x) >= 1}
    if len(sizes) != 1:
        raise ValueError(
            "simulate: batch_block needs every state leaf with a dimension to lead with the same "
            f"batch axis; found leading sizes {sorted(sizes)} in a state of shapes "
            f"{_describe(state)}"
        )
    (batch,) = sizes
    if batch % block:
        raise ValueError(
            f"simulate: batch_block={block} must divide the batch size {batch} of the state"
        )


def _run_blocked_chunk(model, state, inputs, start, diag, *, block, **options):
    """`_run_chunk` over blocks of `block` trials of the leading batch axis, one block after
    the other inside one program (`lax.map`), see `simulate`'s `batch_block`."""
    leaves, treedef = jtu.tree_flatten(state)
    batched = [np.ndim(x) >= 1 for x in leaves]
    batch = next(np.shape(x)[0] for x, b in zip(leaves, batched) if b)
    n_blocks = batch // block
    split = [
        jnp.reshape(x, (n_blocks, block) + np.shape(x)[1:]) if b else None
        for x, b in zip(leaves, batched)
    ]

    def one(args):
        index, parts = args
        rebuilt = [
            p if b else (jax.random.fold_in(x, index) if _is_key(x) else x)
            for p, x, b in zip(parts, leaves, batched)
        ]
        return _run_chunk(
            model, jtu.tree_unflatten(treedef, rebuilt), inputs, start, diag, **options
        )

    finals, spikes, values, diags = jax.lax.map(one, (jnp.arange(n_blocks), split))
    final_leaves = [
        jnp.reshape(f, (batch,) + f.shape[2:]) if b else f[0]
        for f, b in zip(jtu.tree_leaves(finals), batched)
    ]

    def merge(x):
        # (blocks, time, block, ...) -> (time, batch, ...)
        if x.ndim < 3 or x.shape[2] != block:
            raise ValueError(
                "simulate: with batch_block every recorded array needs the trial axis right "
                f"after time; a recorded value has shape {x.shape[1:]} per block"
            )
        x = jnp.moveaxis(x, 0, 1)
        return x.reshape((x.shape[0], batch) + x.shape[3:])

    # The first non-finite value over all blocks: the earliest step, then the lowest block.
    steps, leaf = diags
    bad = leaf >= 0
    order = jnp.where(bad, steps, jnp.iinfo(jnp.int32).max)
    pick = jnp.argmin(order)
    diag = (
        jnp.where(jnp.any(bad), steps[pick], diag[0]),
        jnp.where(jnp.any(bad), leaf[pick], diag[1]),
    )
    return (
        jtu.tree_unflatten(treedef, final_leaves),
        jtu.tree_map(merge, spikes),
        jtu.tree_map(merge, values),
        diag,
    )


_run_blocked_chunk_jit = eqx.filter_jit(_run_blocked_chunk)


def _spike_ids(out: Any, cap: int) -> tuple[jax.Array, jax.Array]:
    """One step's spiking neurons of one output: their flat indices (`cap` entries, -1 past
    the last) and their number (which may exceed `cap`: the run loop then reruns)."""
    flat = (out > 0) if jnp.issubdtype(out.dtype, jnp.floating) else out.astype(bool)
    flat = flat.reshape(-1)
    (idx,) = jnp.nonzero(flat, size=min(cap, flat.size), fill_value=-1)
    return idx.astype(jnp.int32), jnp.sum(flat, dtype=jnp.int32)


class SpikeTimes(NamedTuple):
    """The spikes of one population (or neuron model's output) as a list of events, what
    `nj.simulate(..., record=nj.Record(spikes="ids"))` records: one entry per spike, in step
    order (and by neuron within a step). As Brian2's `SpikeMonitor` and NEST's spike recorder
    give them.

    Attributes:
        t: time [ms] at the end of the step in which each spike happened (as `recording.t`:
            `(step + 1) * dt` for a run that starts at step 0), float64.
        i: the neuron's index in the population (its last axis), int32.
        step: the global index of the step (counted as `recording.t` is), int64.
        trial: for a batched state, the trial's flat index over the batch axes (int32);
            `None` for an unbatched state.
    """

    t: np.ndarray
    i: np.ndarray
    step: np.ndarray
    trial: np.ndarray | None


class _SpikeIdBuffer:
    """The per-step buffer of spike ids of a `spikes="ids"` run: its size, grown when a
    chunk's step had more spikes, and the assembly of the chunks into `SpikeTimes`."""

    def __init__(self, state: Any, model: Any, inputs: Any, kind: str, dt: float) -> None:
        out = _step_outputs(model, state, inputs, kind, dt)
        self.shapes = jtu.tree_map(lambda o: tuple(o.shape), out)
        self.treedef = jtu.tree_structure(out)
        self.dt_ms = float(dt)
        largest = max(int(np.prod(o.shape)) for o in jtu.tree_leaves(out))
        self.cap = int(min(largest, max(256, largest // 64)))

    def grow(self, spikes: Any) -> bool:
        """Whether a step of this chunk had more spikes than the buffer (then it is grown)."""
        parts = self.treedef.flatten_up_to(spikes)
        need = max((int(np.max(count, initial=0)) for _, count in parts), default=0)
        if need <= self.cap:
            return False
        self.cap = 1 << (need - 1).bit_length()
        return True

    def spike_times(self, chunks: list[Any], first: int, record_every: int) -> Any:
        leaves = []
        shapes = self.treedef.flatten_up_to(self.shapes)
        per_chunk = [self.treedef.flatten_up_to(c) for c in chunks]
        for k, shape in enumerate(shapes):
            ids = np.concatenate([np.asarray(c[k][0]) for c in per_chunk])
            counts = np.concatenate([np.asarray(c[k][1]) for c in per_chunk])
            steps = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts) + int(first)
            flat = ids[ids >= 0].astype(np.int64)
            n = shape[-1] if shape else 1
            i = (flat % n).astype(np.int32)
            trial = (flat // n).astype(np.int32) if len(shape) > 1 else None
            t = (steps + 1).astype(np.float64) * self.dt_ms
            leaves.append(SpikeTimes(t=t, i=i, step=steps, trial=trial))
        return self.treedef.unflatten(leaves)


def _concatenate(chunks: list[Any], to_host: bool) -> Any:
    """Chunks' recordings joined along time (NumPy on the host, else JAX)."""
    if len(chunks) == 1:
        return chunks[0]
    cat = np.concatenate if to_host else jnp.concatenate
    return jtu.tree_map(lambda *xs: cat(xs, axis=0), *chunks)
