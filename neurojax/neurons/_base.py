"""The interface every neuron model implements, and the helpers its `step` shares."""

import abc
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import (
    NamesBadParameters,
    check_broadcast,
    check_key,
    default_float,
    eager,
    normalize_shape,
)

__all__ = [
    "NeuronModel",
    "check_state_fields",
    "input_current",
    "check_broadcast",
    "refractory_clamped",
    "refractory_next",
]


class NeuronModel(eqx.Module, metaclass=NamesBadParameters):
    """A population of point neurons with a pure, explicit-state update.

    Subclasses hold their parameters as array leaves (scalars, or arrays broadcastable to the
    population such as one value per neuron; convert them with
    `neurojax.validation.as_float` and check them in `__check_init__` with the other helpers
    of `neurojax.validation`) and implement:

    - `init_state(shape, *, key=None)`: the state PyTree for a population of `shape`
      (an int `n` or a tuple `(*batch, n)`), with every field of `required_state_fields`;
    - `step(state, current, dt) -> (state, spikes)`: advance by `dt` ms under an input
      `current` that is held constant over the step and broadcastable to the state's shape
      (`None` means no input, see `input_current`). `spikes` is 0.0/1.0 in the state's dtype
      and carries the surrogate gradient of the model's `surrogate` field.

    `step` performs no validation: it is the hot loop. Shapes and `dt` are checked once by
    `neurojax.simulate`, parameters by the constructor.

    **State fields a network reads.** `required_state_fields` (`("v",)`) names the fields
    that a `neurojax.Network` reads from a population's state besides calling `step`: the
    membrane potential `v` [mV] drives conductance-based synapses and gap junctions. A
    network checks them with `check_state_fields` when it is built, so a model whose state
    lacks one fails there with the model, the field and the projection named.

    **Fused runs.** A model that can run many steps of an uncoupled population in one call
    (a compiled kernel, say) overrides `fused_run`; `neurojax.simulate` asks every model
    for one and falls back to its `lax.scan` over `step` when the answer is `None`. A fused
    run belongs to the `step` it reproduces: in a subclass that overrides `step`, an
    inherited `fused_run` answers `None`, so the subclass's own `step` runs (define
    `fused_run` again in that subclass to serve it).
    """

    required_state_fields: ClassVar[tuple[str, ...]] = ("v",)
    """The state fields a network reads besides calling `step`: `v`, the membrane potential
    [mV] (conductance-based synapses, gap junctions)."""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("fused_run")
        if run is not None:
            cls.fused_run = _bind_fused_run_to_step(run, cls)
        init = cls.__dict__.get("init_state")
        if init is not None and not getattr(init, "_checks_key", False):
            cls.init_state = _checking_key(init, cls.__name__)

    @abc.abstractmethod
    def init_state(self, shape: int | tuple[int, ...], *, key: PRNGKeyArray | None = None) -> Any:
        """A state for a population of `shape`, batch dimensions first."""

    @abc.abstractmethod
    def step(self, state: Any, current: Any, dt: float) -> tuple[Any, Float[Array, "..."]]:
        """Advance `state` by `dt` ms; return the new state and the 0/1 spikes."""

    def fused_run(
        self, state: Any, inputs: Any, dt: float, n_rec: int, record_every: int, **options: Any
    ) -> tuple[Any, Any] | None:
        """`n_rec * record_every` steps in one call, or `None` where this model cannot serve
        the run (the default: `neurojax.simulate` then scans `step`).

        `neurojax.simulate` calls it while tracing each compiled chunk of a run. An override
        must give what the scan over `step` gives (to the tolerance its docstring states)
        and return `(final_state, spikes)` (or `(final_state, spikes, {field: record})`
        when it records the state fields of `record`), with `spikes` the bool raster of shape
        `(n_rec, *shape)` when `record_every == 1`, else the spike counts of each window of
        `record_every` steps in `uint8` (up to 255 steps) or `int32`, of the same shape.

        Args:
            state: the state at the start of the chunk.
            inputs: `None` (no input), the constant input (an array), the chunk's time-major
                input series, or the function `(t_ms, step_index) -> input`, as `options`'
                `kind` says.
            dt: time step [ms], a Python float.
            n_rec: number of records.
            record_every: steps per record.
            **options: the rest of the `simulate` call, every key always given: `kind`
                (`"none"`, `"const"`, `"series"` or `"fn"`), `record`, `spike_dtype` (how
                spikes are kept, `nj.Record(spikes=...)`: `"bool"` for `"raster"`, `"ids"`,
                `None` for `"float"`), `check`, `checkpoint`, `truncate_backprop` (of
                `nj.SurrogateGradient`). A fused run serves only the configurations it knows
                and answers `None` to every other.
        """
        return None

    def expected_state(self, state: Any) -> Any:
        """The abstract state (`jax.ShapeDtypeStruct` leaves) that `init_state` makes for a
        population of the shape of `state`'s `v` (its first float field where it has no
        `v`), or None when `state` gives no shape. `nj.simulate` compares a state with it
        before anything is compiled, naming the field that differs."""
        v = getattr(state, "v", None)
        if v is None or not hasattr(v, "shape"):
            floats = [
                x
                for x in jax.tree_util.tree_leaves(state)
                if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
            ]
            if not floats:
                return None
            v = floats[0]
        if not np.shape(v):
            return None
        shape = tuple(np.shape(v))
        return eqx.filter_eval_shape(lambda: self.init_state(shape))

    def _shape(self, shape: Any) -> tuple[int, ...]:
        shape = normalize_shape(f"{type(self).__name__}.init_state", shape)
        check_broadcast(self, shape)
        return shape


def _bind_fused_run_to_step(run, owner: type):
    """`run`, answering `None` for instances whose `step` is not `owner`'s."""

    @functools.wraps(run)
    def fused_run(self, *args: Any, **kwargs: Any):
        if type(self).step is not owner.step:
            return None
        return run(self, *args, **kwargs)

    return fused_run


def check_state_fields(
    model: Any,
    state: Any,
    fields: Sequence[str] = NeuronModel.required_state_fields,
    *,
    needed_by: str | None = None,
) -> None:
    """Raise `ValueError` unless `state` (of `model`) has every field in `fields`.

    The state may be abstract (`equinox.filter_eval_shape(model.init_state, n)` costs no
    computation and keeps `n` static) or concrete; an `equinox.Module`, a NamedTuple or a
    dict. The message names the model, the missing field, what needs it and the fields the
    state has.

    Args:
        model: the neuron model (any object; only its class name is used).
        state: its state, for example `equinox.filter_eval_shape(model.init_state, n)`.
        fields: the field names to require (default `NeuronModel.required_state_fields`).
        needed_by: who reads the field, for the message (for example
            `"projection 'e_to_i' (ConductanceOutput)"`).

    Example:
    ```python
    import equinox as eqx, neurojax as nj
    lif = nj.LIF()
    nj.neurons.check_state_fields(lif, eqx.filter_eval_shape(lif.init_state, 10))  # passes
    ```
    """
    if isinstance(state, dict):
        present = tuple(state)
    elif hasattr(state, "_fields"):
        present = tuple(state._fields)
    else:
        present = tuple(name for name in getattr(state, "__dict__", {}) if not name.startswith("_"))
    for name in fields:
        if name not in present:
            who = f"; {needed_by} needs it" if needed_by else ""
            raise ValueError(
                f"{type(model).__name__}: the state ({type(state).__name__}) has no field "
                f"{name!r}{who}; its fields are {present}. A neuron model used in a network "
                f"needs the state fields {tuple(fields)} (NeuronModel.required_state_fields)"
            )


def input_current(current: Any, like: Float[Array, "..."]) -> Float[Array, "..."]:
    """The step input as an array of `like`'s dtype; `None` means zero input.

    Args:
        current: the `current` argument of `step`: `None`, a number or an array
            broadcastable to the population.
        like: an array of the state (for example `state.v`) whose dtype the input takes.

    Returns:
        A zero scalar for `None`, else `current` as an array of `like`'s dtype.
    """
    if current is None:
        return jnp.zeros((), like.dtype)
    return jnp.asarray(current, dtype=like.dtype)


def full(shape: tuple[int, ...], value: Any) -> Float[Array, "..."]:
    """An array of `shape` and the default float dtype filled with (broadcast) `value`."""
    if isinstance(value, (int, float, np.ndarray, np.generic, jax.Array)) and eager():
        # Filled on the host: a broadcast on the device compiles a program per shape.
        return jax.device_put(np.broadcast_to(np.asarray(value, default_float()), shape).copy())
    return jnp.broadcast_to(jnp.asarray(value, default_float()), shape)


def refractory_clamped(refractory: Float[Array, "..."], dt: float) -> Float[Array, "..."]:
    """Whether a neuron with `refractory` ms left stays clamped during this step.

    Compared with `dt / 2` so that a refractory period lasts `round(t_ref / dt)` whole steps
    rather than depending on the rounding of repeated float subtraction.

    Args:
        refractory: time left in the refractory period [ms], one entry per neuron.
        dt: time step [ms].

    Returns:
        A bool array: `True` where the neuron is held at its reset potential this step.
    """
    return refractory > 0.5 * dt


def refractory_next(
    refractory: Float[Array, "..."],
    clamped: Float[Array, "..."],
    spikes: Float[Array, "..."],
    t_ref: Float[Array, "..."],
    dt: float,
) -> Float[Array, "..."]:
    """Refractory time left after the step: `t_ref` after a spike, else counted down by `dt`.

    Args:
        refractory: time left at the start of the step [ms].
        clamped: `refractory_clamped(refractory, dt)`, computed at the start of the step.
        spikes: the step's 0/1 spikes (bool or float).
        t_ref: the refractory period [ms], a scalar or one value per neuron.
        dt: time step [ms].

    Returns:
        The refractory time left at the end of the step [ms]; `0` for a free neuron.
    """
    return jnp.where(spikes > 0, t_ref, jnp.where(clamped, refractory - dt, 0.0))


def _checking_key(init: Any, model: str) -> Any:
    """`init_state` with its `key` checked first: one PRNG key (or None), named in the error."""

    @functools.wraps(init)
    def init_state(self, shape, *args, key=None, **kwargs):
        if key is not None:
            check_key(f"{model}.init_state", key)
        return init(self, shape, *args, key=key, **kwargs)

    init_state._checks_key = True
    return init_state
