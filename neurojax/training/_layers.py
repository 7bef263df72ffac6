"""Trainable spiking layers built from neurojax's neuron models.

A layer is an `equinox.Module` whose weights are array leaves and whose neurons are an
ordinary neuron model (`nj.LIF` by default). Each layer follows the step protocol of every
neurojax object (`init_state`, `step(state, x, dt) -> (state, outputs)`), so `simulate` can
run it, and is also callable on a whole time-major input sequence, which is the fast path for
training: the input projection of every time step is one matrix product before the scan.
"""

import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._options import Record, SurrogateGradient
from .._simulate import simulate
from .._validation import (
    as_float,
    check_dt,
    check_key,
    check_positive,
    check_positive_int,
    default_float,
)
from ..neurons import LIF, NeuronModel
from ._spike_matmul import spike_matmul

__all__ = [
    "SpikingDense",
    "SpikingRecurrent",
    "LeakyReadout",
    "ReadoutState",
    "RecurrentState",
    "Sequential",
    "default_neuron",
    "trainable",
]


def default_neuron() -> LIF:
    """The LIF population used by layers unless told otherwise, in normalised units.

    `tau_m = 10` ms, rest and reset at 0, threshold 1, `r_m = 1`: a layer's input current is
    then measured in units of the threshold (a constant current of 1 brings the membrane
    exactly to threshold).
    """
    return LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, r_m=1.0)


def _init_weight(key, n_in: int, n_out: int, scale: float) -> Float[Array, "n_in n_out"]:
    # Uniform in +-scale / sqrt(n_in), the default of common deep-learning dense layers.
    bound = scale / math.sqrt(n_in)
    return jr.uniform(key, (n_in, n_out), default_float(), -bound, bound)


def _check_sizes(owner: str, n_in, n_out) -> tuple[int, int]:
    return check_positive_int(owner, "n_in", n_in), check_positive_int(owner, "n_out", n_out)


def _check_scale(owner: str, name: str, value) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        raise TypeError(f"{owner}: {name} must be a number, got {value!r}")
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_key(owner: str, key) -> PRNGKeyArray:
    if key is None:
        raise ValueError(f"{owner}: key is required to draw the initial weights, got None")
    check_key(owner, key)
    return key


def _check_flag(owner: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be a bool, got {value!r}")
    return value


def _feed_forward(x, weight, bias, sparse_input: bool):
    # x W + b; with sparse_input the product adds the weight rows of non-zero inputs only.
    i = spike_matmul(x, weight) if sparse_input else x @ weight
    return i if bias is None else i + bias


def _check_neuron(owner: str, neuron, learn_tau: bool) -> NeuronModel:
    if neuron is None:
        neuron = default_neuron()
    if not isinstance(neuron, NeuronModel):
        raise TypeError(
            f"{owner}: neuron must be a neurojax neuron model (nj.LIF, nj.Izhikevich, ...), got "
            f"{type(neuron).__name__}"
        )
    _check_flag(owner, "learn_tau", learn_tau)
    if learn_tau and not hasattr(neuron, "tau_m"):
        raise ValueError(
            f"{owner}: learn_tau=True needs a neuron with a membrane time constant tau_m; "
            f"{type(neuron).__name__} has none"
        )
    return neuron


def _check_time_axis(owner: str, time_axis) -> int:
    """`time_axis` as an int (checked before any work; its range is checked at the call,
    against the input's shape)."""
    if isinstance(time_axis, bool) or not isinstance(time_axis, (int, np.integer)):
        raise TypeError(
            f"{owner}: time_axis must be an int (the input's axis that is time: 0 for "
            f"time-major (t, *batch, ...), 1 for batch-first (batch, t, ...)), got {time_axis!r}"
        )
    return int(time_axis)


def _example_text(example: tuple[int, ...]) -> str:
    return ", ".join(map(str, example))


def _time_first(
    owner: str, x_seq: ArrayLike, example: tuple[int, ...], time_axis: int
) -> tuple[Float[Array, "t ..."], int]:
    """The input sequence `x_seq` with its time axis `time_axis` moved to the front, as a
    float array, and that axis counted from the front (to move the outputs back).

    `x_seq` is `(*leading, *example)`: time and the batch axes lead, in any order, and the
    axes of one example (`example`, `(n_in,)` for a dense layer) end it. Every error says
    which axis was read as time and how to ask for another.
    """
    x = jnp.asarray(x_seq)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(default_float())
    time_axis = _check_time_axis(owner, time_axis)
    k = len(example)
    text = _example_text(example)
    if x.ndim < k + 1 or tuple(x.shape[x.ndim - k :]) != tuple(example):
        read = (
            f"read with time on axis {time_axis} (length {x.shape[time_axis]})"
            if -x.ndim <= time_axis < x.ndim
            else f"time_axis={time_axis}"
        )
        raise ValueError(
            f"{owner}: the input must end with the axes of one example ({text}), after time "
            f"and any batch axes; got shape {tuple(x.shape)}, {read}. Time-major inputs are "
            f"(t, *batch, {text}) (time_axis=0, the default); a batch-first input "
            f"(batch, t, {text}) as snnTorch or tonic give it needs time_axis=1"
        )
    lead = x.ndim - k
    if not -lead <= time_axis < lead:
        raise ValueError(
            f"{owner}: time_axis={time_axis} must name one of the {lead} leading axes of the "
            f"input (time and batch, before the axes of one example ({text})), i.e. be in "
            f"[{-lead}, {lead - 1}]; got shape {tuple(x.shape)}"
        )
    axis = time_axis % lead
    return (jnp.moveaxis(x, axis, 0) if axis else x), axis


def _time_back(y: jax.Array, axis: int) -> jax.Array:
    """Outputs `(t, *batch, ...)` with time moved back to the input's `axis`."""
    return jnp.moveaxis(y, 0, axis) if axis else y


def _step_input(x, n_in: int, like) -> Float[Array, "... n_in"]:
    x = jnp.asarray(x, dtype=like.dtype)
    if x.shape[-1:] != (n_in,):
        raise ValueError(f"step: the input must end with an axis of {n_in} features, got {x.shape}")
    return x


class _Layer(eqx.Module):
    """Shared parts of the layers with a neuron population: weights, neuron, time constant."""

    def _neuron(self) -> NeuronModel:
        # Neuron parameters get no gradient unless learn_tau, in which case tau_m does and
        # is held at or above tau_min (a projection of the learned value, not of user input).
        frozen = jtu.tree_map(jax.lax.stop_gradient, self.neuron)
        if not self.learn_tau:
            return frozen
        tau = jnp.maximum(self.neuron.tau_m, self.tau_min)
        return eqx.tree_at(lambda m: m.tau_m, frozen, tau)

    def _trainable_spec(self):
        spec = jtu.tree_map(eqx.is_inexact_array, self)
        neuron_spec = jtu.tree_map(lambda _: False, self.neuron)
        if self.learn_tau:
            neuron_spec = eqx.tree_at(lambda m: m.tau_m, neuron_spec, True)
        return eqx.tree_at(lambda layer: layer.neuron, spec, neuron_spec)


class SpikingDense(_Layer):
    r"""A dense (all-to-all) projection into a population of spiking neurons.

    At each step the input `x` (spikes or analogue values, `n_in` features) drives the
    population with the current `I = x W + b`; the neurons (by default `default_neuron()`, a
    LIF in units of its threshold) integrate it and emit spikes that carry surrogate
    gradients. Weights `W` of shape `(n_in, n_out)` and bias `b` are trained; the neuron's
    parameters are fixed unless `learn_tau=True`, which also trains the membrane time
    constant `tau_m` (one per neuron when the neuron was built with per-neuron `tau_m`;
    held at `tau_min` or above).

    Units: `x` is dimensionless, `I` is the neuron's input current (nA for `nj.LIF`; with the
    default neuron a current of 1 reaches threshold), time in ms.

    Args:
        n_in: number of input features.
        n_out: number of neurons.
        key: key for the initial weights (uniform in `+-weight_scale / sqrt(n_in)`).
        neuron: a neurojax neuron model (`nj.LIF`, `nj.Izhikevich`, `nj.AdEx`, ...).
        weight_scale: scale of the initial weights, >= 0.
        bias: whether the layer has a trainable bias (initialised to 0).
        learn_tau: train the neuron's `tau_m` too.
        tau_min: lower bound [ms] on a learned `tau_m`, > 0.
        sparse_input: the inputs are mostly zeros (spikes): compute `x W` with
            `nj.training.spike_matmul`, which adds the weight rows of the non-zero inputs only
            (forward and weight gradient), on CPU at a cost proportional to the input spikes.
            Same values up to rounding; for spike inputs, not for mostly non-zero analogue
            ones. On GPU/TPU it is the dense product.

    Example:
    ```python
    layer = nj.training.SpikingDense(64, 100, key=jr.key(0), weight_scale=3.0)
    x = nj.training.current_encode(features, 25)     # (25, 64)
    spikes = layer(x, dt=1.0)                         # (25, 100)
    ```
    """

    weight: Float[Array, "n_in n_out"]
    bias: Float[Array, " n_out"] | None
    neuron: NeuronModel
    n_in: int = eqx.field(static=True)
    n_out: int = eqx.field(static=True)
    learn_tau: bool = eqx.field(static=True)
    tau_min: float = eqx.field(static=True)
    sparse_input: bool = eqx.field(static=True)

    def __init__(
        self,
        n_in: int,
        n_out: int,
        *,
        key: PRNGKeyArray,
        neuron: NeuronModel | None = None,
        weight_scale: float = 1.0,
        bias: bool = True,
        learn_tau: bool = False,
        tau_min: float = 0.5,
        sparse_input: bool = False,
    ):
        owner = "SpikingDense"
        self.n_in, self.n_out = _check_sizes(owner, n_in, n_out)
        self.sparse_input = _check_flag(owner, "sparse_input", sparse_input)
        weight_scale = _check_scale(owner, "weight_scale", weight_scale)
        self.neuron = _check_neuron(owner, neuron, learn_tau)
        self.learn_tau = learn_tau
        check_positive(owner, "tau_min", tau_min, "ms")
        self.tau_min = float(tau_min)
        self.weight = _init_weight(_check_key(owner, key), self.n_in, self.n_out, weight_scale)
        self.bias = jnp.zeros((self.n_out,), default_float()) if bias else None

    def current(self, x: Float[Array, "... n_in"]) -> Float[Array, "... n_out"]:
        """The input current `x W + b` for inputs with any leading axes."""
        return _feed_forward(x, self.weight, self.bias, self.sparse_input)

    def init_state(self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None):
        """The neurons' rest state for a batch of `shape` (`()` for one example)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self.neuron.init_state(shape + (self.n_out,), key=key)

    def step(self, state, x, dt: float):
        """One step: `x` of shape `(*batch, n_in)` -> spikes of shape `(*batch, n_out)`."""
        return self._neuron().step(state, self.current(_step_input(x, self.n_in, self.weight)), dt)

    def __call__(
        self,
        x_seq: Float[Array, "t ... n_in"],
        *,
        dt: float = 1.0,
        state=None,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        time_axis: int = 0,
    ) -> Float[Array, "t ... n_out"]:
        """Run the layer over an input sequence; return its spikes `(t, ..., n_out)`.

        The input is time-major, `(t, *batch, n_in)`, unless `time_axis` names another of
        its leading axes as time (`time_axis=1` for batch-first `(batch, t, n_in)`); the
        spikes have time on the same axis as the input. The currents of all steps are one
        matrix product; the neurons then run under `simulate` (`checkpoint` and
        `truncate_backprop` as there). `state` defaults to rest.
        """
        x, axis = _time_first("SpikingDense", x_seq, (self.n_in,), time_axis)
        dt = check_dt("SpikingDense", dt)
        currents = self.current(x)
        neuron = self._neuron()
        if state is None:
            state = neuron.init_state(currents.shape[1:])
        _, rec = simulate(
            neuron,
            state,
            currents,
            dt=dt,
            record=Record(spikes="float"),
            gradient=SurrogateGradient(checkpoint=checkpoint, truncate_backprop=truncate_backprop),
        )
        return _time_back(rec.spikes, axis)


class RecurrentState(eqx.Module):
    """State of a `SpikingRecurrent` layer: its neurons' state and last step's spikes."""

    neuron: object
    spikes: Float[Array, "*batch n"]


class _RecurrentCore(eqx.Module):
    """The recurrent part of a step, with the feed-forward current given as input."""

    neuron: NeuronModel
    recurrent: Float[Array, "n n"]

    def step(self, state: RecurrentState, current, dt: float):
        i = current + state.spikes @ self.recurrent
        neuron_state, s = self.neuron.step(state.neuron, i, dt)
        return RecurrentState(neuron=neuron_state, spikes=s), s


class SpikingRecurrent(_Layer):
    r"""A spiking population with dense feed-forward and recurrent weights.

    The current at step `t` is `I_t = x_t W + s_{t-1} V + b`, where `s_{t-1}` are the layer's
    own spikes of the previous step (a one-step synaptic delay) and `V` has shape
    `(n_out, n_out)` (self-connections included; mask them in your loss or zero the diagonal
    if unwanted). Everything else as in `SpikingDense`.

    Args:
        n_in: number of input features.
        n_out: number of neurons.
        key: key for the initial weights.
        neuron: a neurojax neuron model (default `default_neuron()`).
        weight_scale: scale of the initial feed-forward weights (`+-scale / sqrt(n_in)`).
        recurrent_scale: scale of the initial recurrent weights (`+-scale / sqrt(n_out)`).
        bias: whether the layer has a trainable bias.
        learn_tau: train the neuron's `tau_m` too.
        tau_min: lower bound [ms] on a learned `tau_m`.
        sparse_input: compute the feed-forward `x W` from the non-zero inputs only, as in
            `SpikingDense` (the recurrent product stays dense).
    """

    weight: Float[Array, "n_in n_out"]
    recurrent: Float[Array, "n_out n_out"]
    bias: Float[Array, " n_out"] | None
    neuron: NeuronModel
    n_in: int = eqx.field(static=True)
    n_out: int = eqx.field(static=True)
    learn_tau: bool = eqx.field(static=True)
    tau_min: float = eqx.field(static=True)
    sparse_input: bool = eqx.field(static=True)

    def __init__(
        self,
        n_in: int,
        n_out: int,
        *,
        key: PRNGKeyArray,
        neuron: NeuronModel | None = None,
        weight_scale: float = 1.0,
        recurrent_scale: float = 1.0,
        bias: bool = True,
        learn_tau: bool = False,
        tau_min: float = 0.5,
        sparse_input: bool = False,
    ):
        owner = "SpikingRecurrent"
        self.n_in, self.n_out = _check_sizes(owner, n_in, n_out)
        self.sparse_input = _check_flag(owner, "sparse_input", sparse_input)
        weight_scale = _check_scale(owner, "weight_scale", weight_scale)
        recurrent_scale = _check_scale(owner, "recurrent_scale", recurrent_scale)
        self.neuron = _check_neuron(owner, neuron, learn_tau)
        self.learn_tau = learn_tau
        check_positive(owner, "tau_min", tau_min, "ms")
        self.tau_min = float(tau_min)
        k_in, k_rec = jr.split(_check_key(owner, key))
        self.weight = _init_weight(k_in, self.n_in, self.n_out, weight_scale)
        self.recurrent = _init_weight(k_rec, self.n_out, self.n_out, recurrent_scale)
        self.bias = jnp.zeros((self.n_out,), default_float()) if bias else None

    def current(self, x: Float[Array, "... n_in"]) -> Float[Array, "... n_out"]:
        """The feed-forward part of the current, `x W + b`."""
        return _feed_forward(x, self.weight, self.bias, self.sparse_input)

    def init_state(
        self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None
    ) -> RecurrentState:
        """Rest state and no previous spikes, for a batch of `shape`."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        neuron_state = self.neuron.init_state(shape + (self.n_out,), key=key)
        return RecurrentState(
            neuron=neuron_state, spikes=jnp.zeros(shape + (self.n_out,), default_float())
        )

    def _core(self) -> _RecurrentCore:
        return _RecurrentCore(neuron=self._neuron(), recurrent=self.recurrent)

    def step(self, state: RecurrentState, x, dt: float):
        """One step: `x` of shape `(*batch, n_in)` -> spikes of shape `(*batch, n_out)`."""
        return self._core().step(state, self.current(_step_input(x, self.n_in, self.weight)), dt)

    def __call__(
        self,
        x_seq: Float[Array, "t ... n_in"],
        *,
        dt: float = 1.0,
        state: RecurrentState | None = None,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        time_axis: int = 0,
    ) -> Float[Array, "t ... n_out"]:
        """Run the layer over an input sequence (time-major unless `time_axis` says
        otherwise, as `SpikingDense`); return its spikes, time on the input's time axis."""
        x, axis = _time_first("SpikingRecurrent", x_seq, (self.n_in,), time_axis)
        dt = check_dt("SpikingRecurrent", dt)
        currents = self.current(x)
        if state is None:
            state = self.init_state(currents.shape[1:-1])
        _, rec = simulate(
            self._core(),
            state,
            currents,
            dt=dt,
            record=Record(spikes="float"),
            gradient=SurrogateGradient(checkpoint=checkpoint, truncate_backprop=truncate_backprop),
        )
        return _time_back(rec.spikes, axis)


class ReadoutState(eqx.Module):
    """State of a `LeakyReadout`: the membrane potential of each output unit."""

    v: Float[Array, "*batch n"]


class LeakyReadout(eqx.Module):
    r"""Non-spiking leaky integrators reading out a spiking layer.

    $$\tau \frac{dv}{dt} = -v + x W + b$$

    integrated exactly for inputs held over each step,
    `v <- I + (v - I) exp(-dt / tau)`. The output of each step is `v`; train it with
    `max_membrane_cross_entropy` (peak potential as logit) or any loss of the trace.

    Args:
        n_in: number of inputs.
        n_out: number of output units (classes).
        key: key for the initial weights (`+-weight_scale / sqrt(n_in)`).
        tau: time constant [ms], > 0 (a scalar or one per unit).
        weight_scale: scale of the initial weights.
        bias: whether the units have a trainable bias.
        learn_tau: train `tau` too (held at `tau_min` or above).
        tau_min: lower bound [ms] on a learned `tau`.
    """

    weight: Float[Array, "n_in n_out"]
    bias: Float[Array, " n_out"] | None
    tau: Float[Array, "..."]
    n_in: int = eqx.field(static=True)
    n_out: int = eqx.field(static=True)
    learn_tau: bool = eqx.field(static=True)
    tau_min: float = eqx.field(static=True)

    def __init__(
        self,
        n_in: int,
        n_out: int,
        *,
        key: PRNGKeyArray,
        tau: float | ArrayLike = 10.0,
        weight_scale: float = 1.0,
        bias: bool = True,
        learn_tau: bool = False,
        tau_min: float = 0.5,
    ):
        owner = "LeakyReadout"
        self.n_in, self.n_out = _check_sizes(owner, n_in, n_out)
        weight_scale = _check_scale(owner, "weight_scale", weight_scale)
        self.tau = as_float(tau)
        check_positive(owner, "tau", self.tau, "ms")
        if self.tau.ndim > 1 or (self.tau.ndim == 1 and self.tau.shape != (self.n_out,)):
            raise ValueError(
                f"{owner}: tau must be a scalar or have shape ({self.n_out},), got {self.tau.shape}"
            )
        self.learn_tau = _check_flag(owner, "learn_tau", learn_tau)
        check_positive(owner, "tau_min", tau_min, "ms")
        self.tau_min = float(tau_min)
        self.weight = _init_weight(_check_key(owner, key), self.n_in, self.n_out, weight_scale)
        self.bias = jnp.zeros((self.n_out,), default_float()) if bias else None

    def current(self, x: Float[Array, "... n_in"]) -> Float[Array, "... n_out"]:
        """The drive `x W + b`."""
        i = x @ self.weight
        return i if self.bias is None else i + self.bias

    def _tau(self):
        if self.learn_tau:
            return jnp.maximum(self.tau, self.tau_min)
        return jax.lax.stop_gradient(self.tau)

    def _trainable_spec(self):
        spec = jtu.tree_map(eqx.is_inexact_array, self)
        return eqx.tree_at(lambda m: m.tau, spec, self.learn_tau)

    def init_state(
        self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None
    ) -> ReadoutState:
        """`v = 0` for a batch of `shape` (`key` is accepted for the protocol and unused)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return ReadoutState(v=jnp.zeros(shape + (self.n_out,), default_float()))

    def step(self, state: ReadoutState, x, dt: float):
        """One step; the output is the new membrane potential."""
        i = self.current(_step_input(x, self.n_in, self.weight))
        return _ReadoutCore(self._tau()).step(state, i, dt)

    def __call__(
        self,
        x_seq: Float[Array, "t ... n_in"],
        *,
        dt: float = 1.0,
        state: ReadoutState | None = None,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        time_axis: int = 0,
    ) -> Float[Array, "t ... n_out"]:
        """Membrane potentials `(t, ..., n_out)` over an input sequence (time-major unless
        `time_axis` says otherwise, as `SpikingDense`; time stays on the input's axis)."""
        x, axis = _time_first("LeakyReadout", x_seq, (self.n_in,), time_axis)
        dt = check_dt("LeakyReadout", dt)
        currents = self.current(x)
        if state is None:
            state = ReadoutState(v=jnp.zeros(currents.shape[1:], currents.dtype))
        _, rec = simulate(
            _ReadoutCore(self._tau()),
            state,
            currents,
            dt=dt,
            record=Record(spikes="float"),
            gradient=SurrogateGradient(checkpoint=checkpoint, truncate_backprop=truncate_backprop),
        )
        return _time_back(rec.spikes, axis)


class _ReadoutCore(eqx.Module):
    """A leaky readout's dynamics with the drive given as input (for `simulate`)."""

    tau: Float[Array, "..."]

    def step(self, state: ReadoutState, current, dt: float):
        v = current + (state.v - current) * jnp.exp(-dt / self.tau)
        return ReadoutState(v=v), v


class Sequential(eqx.Module):
    """A feed-forward stack of layers run one after another within each time step.

    As a steppable object its state is the tuple of the layers' states and its output the
    last layer's output; calling it on a time-major sequence runs the layers one at a time
    over the whole sequence (each with its input product hoisted out of the scan), which
    gives the same result because no layer feeds back to an earlier one.

    **Time axis.** Every neurojax array is time-major, and so is the stack's input by
    default: `(t, *batch, n_in)` (`time_axis=0`). Layers act on one example and batching is
    `jax.vmap`'s job, but leading batch axes are accepted; their order against time cannot be
    read from a shape, so the stack is told which axis is time: `time_axis=1` for the
    batch-first `(batch, t, n_in)` that snnTorch users and tonic's `batch_first` loaders
    write (without it such an input would run with time and batch swapped). The outputs
    keep time on the input's axis. A shape that does not fit says which axis was read as
    time.

    Args:
        layers: the layers, first to last (`SpikingDense`, `SpikingRecurrent`,
            `LeakyReadout`, or any module with the same `init_state` / `step` / `__call__`).
        time_axis: the input's axis that is time (default 0, time-major; 1 for batch-first),
            used by `__call__` unless the call names another.

    Example:
    ```python
    net = nj.training.Sequential([nj.training.SpikingDense(64, 100, key=k1),
                                  nj.training.LeakyReadout(100, 10, key=k2)], time_axis=1)
    v = net(x)      # x: (batch, t, 64) -> v: (batch, t, 10)
    ```
    """

    layers: tuple
    time_axis: int = eqx.field(static=True, default=0)

    def __init__(self, layers: Sequence, *, time_axis: int = 0):
        self.time_axis = _check_time_axis("Sequential", time_axis)
        layers = tuple(layers)
        if not layers:
            raise ValueError("Sequential: layers must contain at least one layer, got none")
        for i, (a, b) in enumerate(zip(layers[:-1], layers[1:])):
            if getattr(a, "n_out", None) != getattr(b, "n_in", None):
                raise ValueError(
                    f"Sequential: layer {i} has n_out={getattr(a, 'n_out', None)} but layer "
                    f"{i + 1} has n_in={getattr(b, 'n_in', None)}"
                )
        self.layers = layers

    @property
    def n_in(self) -> int:
        """Input features of the first layer."""
        return self.layers[0].n_in

    @property
    def n_out(self) -> int:
        """Output neurons of the last layer."""
        return self.layers[-1].n_out

    def init_state(self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None):
        """The tuple of the layers' initial states for a batch of `shape`."""
        keys = [None] * len(self.layers) if key is None else list(jr.split(key, len(self.layers)))
        return tuple(layer.init_state(shape, key=k) for layer, k in zip(self.layers, keys))

    def step(self, state: tuple, x, dt: float):
        """One time step through every layer; the output is the last layer's."""
        new = []
        for layer, st in zip(self.layers, state):
            st, x = layer.step(st, x, dt)
            new.append(st)
        return tuple(new), x

    def __call__(
        self,
        x_seq: Float[Array, "t ... n_in"],
        *,
        dt: float = 1.0,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        return_all: bool = False,
        time_axis: int | None = None,
    ):
        """Run the stack over an input sequence from rest.

        `time_axis` is the input's axis that is time (default: the stack's `time_axis`, 0
        unless it was built with another). Returns the last layer's outputs `(t, ...,
        n_out)` (time on the input's time axis), or with `return_all=True` the list of every
        layer's outputs (for rate regularisers on hidden layers).
        """
        time_axis = self.time_axis if time_axis is None else time_axis
        n_in = getattr(self.layers[0], "n_in", None)
        # the axes of one example; none known for a first layer of the user's without n_in
        example = () if n_in is None else n_in if isinstance(n_in, tuple) else (n_in,)
        x, axis = _time_first("Sequential", x_seq, example, time_axis)
        outputs = []
        for layer in self.layers:
            x = layer(x, dt=dt, checkpoint=checkpoint, truncate_backprop=truncate_backprop)
            outputs.append(x)
        outputs = [_time_back(y, axis) for y in outputs]
        return outputs if return_all else outputs[-1]


def trainable(model) -> object:
    """A filter PyTree (same structure as `model`, booleans) of the leaves to train.

    Weights and biases of neurojax layers are trainable; their neurons' parameters only when
    the layer has `learn_tau=True` (then only the time constant). Every other floating array
    in `model` is trainable. Use with `eqx.partition(model, trainable(model))`; `fit` and
    `make_train_step` use it by default.
    """

    def spec(node):
        if isinstance(node, (_Layer, LeakyReadout)):
            return node._trainable_spec()
        return eqx.is_inexact_array(node)

    return jtu.tree_map(spec, model, is_leaf=lambda n: isinstance(n, (_Layer, LeakyReadout)))
