"""Convolution and pooling: array operations and the spiking layers built on them.

The operations act on arrays laid out as `(*batch, channels, *spatial)` (any number of
leading axes, channels before the spatial axes, as in PyTorch and NIR) and follow PyTorch's
conventions for weights (`(c_out, c_in / groups, *kernel)`), padding, stride, dilation and
groups, so that weights move between neurojax, PyTorch-based simulators and NIR graphs
without transposition. The layers follow the step protocol of `SpikingDense`: they act on
one example (`(channels, *spatial)`), take any leading batch axes, and are callable on a
whole time-major sequence, with the convolution of every time step done in one call before
the neurons' scan.
"""

import abc
import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._options import Record, SurrogateGradient
from .._simulate import simulate
from .._validation import check_dt, check_positive, default_float
from ..neurons import NeuronModel
from ._layers import (
    _check_flag,
    _check_key,
    _check_neuron,
    _check_scale,
    _Layer,
    _time_back,
    _time_first,
)

__all__ = [
    "conv1d",
    "conv2d",
    "sum_pool2d",
    "avg_pool2d",
    "conv_output_shape",
    "SpikingConv",
    "SpikingConv1d",
    "SpikingConv2d",
    "StatelessLayer",
    "SumPool2d",
    "AvgPool2d",
    "Flatten",
]

_PADDING_WORDS = ("same", "valid")


def _int_tuple(owner: str, name: str, value, ndim: int, *, minimum: int) -> tuple[int, ...]:
    """`value` (an int or a sequence of `ndim` ints, each >= minimum) as a tuple of ints."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    items = [value] * ndim if not isinstance(value, (tuple, list)) else list(value)
    ok = len(items) == ndim and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in items
    )
    if not ok:
        raise ValueError(
            f"{owner}: {name} must be an int >= {minimum} or a sequence of {ndim} such ints, "
            f"got {value!r}"
        )
    return tuple(int(v) for v in items)


def _padding(owner: str, padding, ndim: int) -> str | tuple[int, ...]:
    if isinstance(padding, str):
        if padding not in _PADDING_WORDS:
            raise ValueError(
                f"{owner}: padding must be 'same', 'valid', an int >= 0 or a sequence of "
                f"{ndim} ints >= 0, got {padding!r}"
            )
        return padding
    return _int_tuple(owner, "padding", padding, ndim, minimum=0)


def conv_output_shape(
    spatial: Sequence[int],
    kernel: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: str | int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
) -> tuple[int, ...]:
    """The spatial output shape of a convolution or pooling window, PyTorch's formula.

    `floor((n + 2 p - d (k - 1) - 1) / s) + 1` per axis; `padding="same"` keeps `n` (it needs
    stride 1) and `"valid"` means `p = 0`.

    Args:
        spatial: the input's spatial shape.
        kernel: the window's shape, one entry per spatial axis.
        stride: step of the window, an int or one per axis.
        padding: zeros added on both sides, an int, one per axis, `"same"` or `"valid"`.
        dilation: spacing of the window's taps, an int or one per axis.
    """
    owner = "conv_output_shape"
    spatial = _int_tuple(owner, "spatial", tuple(spatial), len(spatial), minimum=1)
    ndim = len(spatial)
    kernel = _int_tuple(owner, "kernel", tuple(kernel), ndim, minimum=1)
    stride = _int_tuple(owner, "stride", stride, ndim, minimum=1)
    dilation = _int_tuple(owner, "dilation", dilation, ndim, minimum=1)
    padding = _padding(owner, padding, ndim)
    if padding == "same":
        if stride != (1,) * ndim:
            raise ValueError(f"{owner}: padding='same' needs stride 1, got stride={stride}")
        return spatial
    pads = (0,) * ndim if padding == "valid" else padding
    out = tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(spatial, kernel, stride, pads, dilation)
    )
    if min(out) < 1:
        raise ValueError(
            f"{owner}: a window of {kernel} (dilation {dilation}) does not fit the input of "
            f"spatial shape {spatial} with padding {padding}; the output would be {out}"
        )
    return out


def _lax_padding(padding, ndim: int):
    if isinstance(padding, str):
        return padding.upper()
    return [(p, p) for p in padding]


def _conv(owner, x, weight, bias, stride, padding, dilation, groups, ndim):
    x = jnp.asarray(x)
    weight = jnp.asarray(weight)
    if weight.ndim != ndim + 2:
        raise ValueError(
            f"{owner}: weight must have shape (c_out, c_in / groups, {', '.join(['k'] * ndim)}), "
            f"got shape {weight.shape}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{owner}: groups must be an int >= 1, got {groups!r}")
    c_out, c_in_group = weight.shape[:2]
    if x.ndim < ndim + 1 or x.shape[-ndim - 1] != c_in_group * groups:
        raise ValueError(
            f"{owner}: input must have shape (*batch, {c_in_group * groups}, *spatial) with "
            f"{ndim} spatial axes (weight {weight.shape}, groups {groups}), got shape {x.shape}"
        )
    if c_out % groups:
        raise ValueError(f"{owner}: groups={groups} must divide c_out={c_out}")
    stride = _int_tuple(owner, "stride", stride, ndim, minimum=1)
    dilation = _int_tuple(owner, "dilation", dilation, ndim, minimum=1)
    padding = _padding(owner, padding, ndim)
    if padding == "same" and stride != (1,) * ndim:
        raise ValueError(f"{owner}: padding='same' needs stride 1, got stride={stride}")
    lead = x.shape[: x.ndim - ndim - 1]
    flat = x.reshape((-1,) + x.shape[x.ndim - ndim - 1 :])
    spatial = "HW"[:ndim] if ndim <= 2 else None
    dims = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    y = jax.lax.conv_general_dilated(
        flat,
        weight.astype(flat.dtype),
        window_strides=stride,
        padding=_lax_padding(padding, ndim),
        rhs_dilation=dilation,
        dimension_numbers=dims,
        feature_group_count=groups,
    )
    if bias is not None:
        bias = jnp.asarray(bias, y.dtype)
        if bias.shape != (c_out,):
            raise ValueError(f"{owner}: bias must have shape ({c_out},), got {bias.shape}")
        y = y + bias.reshape((c_out,) + (1,) * ndim)
    return y.reshape(lead + y.shape[1:])


def conv1d(
    x: Float[Array, "*batch c_in n"],
    weight: Float[Array, "c_out c_in_g k"],
    bias: Float[Array, " c_out"] | None = None,
    *,
    stride: int = 1,
    padding: str | int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> Float[Array, "*batch c_out m"]:
    """One-dimensional convolution (cross-correlation, as in PyTorch) over the last axis.

    Args:
        x: input of shape `(*batch, c_in, n)`.
        weight: kernel of shape `(c_out, c_in / groups, k)`.
        bias: `(c_out,)` or `None`.
        stride: step of the kernel, >= 1.
        padding: zeros added on both ends (>= 0), `"same"` (stride 1) or `"valid"`.
        dilation: spacing of the kernel's taps, >= 1.
        groups: number of channel groups; `c_in` and `c_out` must be multiples of it.
    """
    return _conv("conv1d", x, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(
    x: Float[Array, "*batch c_in h w"],
    weight: Float[Array, "c_out c_in_g kh kw"],
    bias: Float[Array, " c_out"] | None = None,
    *,
    stride: int | tuple[int, int] = 1,
    padding: str | int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Float[Array, "*batch c_out oh ow"]:
    """Two-dimensional convolution (cross-correlation, as in PyTorch) over the last two axes.

    Args:
        x: input of shape `(*batch, c_in, h, w)`.
        weight: kernel of shape `(c_out, c_in / groups, kh, kw)`.
        bias: `(c_out,)` or `None`.
        stride: step of the kernel, an int or `(sh, sw)`.
        padding: zeros added on both sides, an int, `(ph, pw)`, `"same"` or `"valid"`.
        dilation: spacing of the kernel's taps, an int or `(dh, dw)`.
        groups: number of channel groups.
    """
    return _conv("conv2d", x, weight, bias, stride, padding, dilation, groups, 2)


def _pool(owner, x, kernel_size, stride, padding):
    x = jnp.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"{owner}: input must have shape (*batch, c, h, w), got {x.shape}")
    kernel = _int_tuple(owner, "kernel_size", kernel_size, 2, minimum=1)
    stride = kernel if stride is None else _int_tuple(owner, "stride", stride, 2, minimum=1)
    padding = _int_tuple(owner, "padding", padding, 2, minimum=0)
    lead = x.ndim - 2
    return jax.lax.reduce_window(
        x,
        jnp.zeros((), x.dtype),
        jax.lax.add,
        (1,) * lead + kernel,
        (1,) * lead + stride,
        [(0, 0)] * lead + [(p, p) for p in padding],
    ), kernel


def sum_pool2d(
    x: Float[Array, "*batch c h w"],
    kernel_size: int | tuple[int, int],
    *,
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
) -> Float[Array, "*batch c oh ow"]:
    """Sum over windows of the last two axes (padded with zeros).

    Args:
        x: input of shape `(*batch, c, h, w)`.
        kernel_size: window, an int or `(kh, kw)`.
        stride: step of the window (default: the window, non-overlapping).
        padding: zeros added on both sides, an int or `(ph, pw)`.
    """
    return _pool("sum_pool2d", x, kernel_size, stride, padding)[0]


def avg_pool2d(
    x: Float[Array, "*batch c h w"],
    kernel_size: int | tuple[int, int],
    *,
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
) -> Float[Array, "*batch c oh ow"]:
    """Mean over windows of the last two axes; padded zeros count (PyTorch's default).

    Args:
        x: input of shape `(*batch, c, h, w)`.
        kernel_size: window, an int or `(kh, kw)`.
        stride: step of the window (default: the window).
        padding: zeros added on both sides, an int or `(ph, pw)`.
    """
    total, kernel = _pool("avg_pool2d", x, kernel_size, stride, padding)
    return total / math.prod(kernel)


def _in_shape(owner: str, in_shape, ndim: int) -> tuple[int, ...]:
    if isinstance(in_shape, int):
        in_shape = (in_shape,)
    if not isinstance(in_shape, (tuple, list)) or len(in_shape) != ndim + 1:
        raise ValueError(
            f"{owner}: in_shape must be (channels, {', '.join(['n'] * ndim)}), got {in_shape!r}"
        )
    return _int_tuple(owner, "in_shape", tuple(in_shape), ndim + 1, minimum=1)


class SpikingConv(_Layer):
    """The shared parts of `SpikingConv1d` and `SpikingConv2d` (built through those two):
    a convolution into a population of spiking neurons, see `SpikingConv2d`."""

    weight: Float[Array, "c_out c_in_g *k"]
    bias: Float[Array, " c_out"] | None
    neuron: NeuronModel
    in_shape: tuple[int, ...] = eqx.field(static=True)
    out_shape: tuple[int, ...] = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: str | tuple[int, ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    learn_tau: bool = eqx.field(static=True)
    tau_min: float = eqx.field(static=True)

    def _setup(
        self, owner, ndim, in_shape, out_channels, kernel_size, key, stride, padding, dilation,
        groups, neuron, weight_scale, bias, learn_tau, tau_min,
    ):  # fmt: skip
        self.in_shape = _in_shape(owner, in_shape, ndim)
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"{owner}: out_channels must be a positive int, got {out_channels!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"{owner}: groups must be a positive int, got {groups!r}")
        c_in = self.in_shape[0]
        if c_in % groups or out_channels % groups:
            raise ValueError(
                f"{owner}: groups={groups} must divide both the input channels ({c_in}) and "
                f"out_channels ({out_channels})"
            )
        kernel = _int_tuple(owner, "kernel_size", kernel_size, ndim, minimum=1)
        self.stride = _int_tuple(owner, "stride", stride, ndim, minimum=1)
        self.dilation = _int_tuple(owner, "dilation", dilation, ndim, minimum=1)
        self.padding = _padding(owner, padding, ndim)
        self.groups = groups
        spatial = conv_output_shape(
            self.in_shape[1:], kernel, stride=self.stride, padding=self.padding,
            dilation=self.dilation,
        )  # fmt: skip
        self.out_shape = (out_channels,) + spatial
        weight_scale = _check_scale(owner, "weight_scale", weight_scale)
        self.neuron = _check_neuron(owner, neuron, learn_tau)
        self.learn_tau = learn_tau
        check_positive(owner, "tau_min", tau_min, "ms")
        self.tau_min = float(tau_min)
        _check_flag(owner, "bias", bias)
        fan_in = (c_in // groups) * math.prod(kernel)
        bound = weight_scale / math.sqrt(fan_in)
        w_shape = (out_channels, c_in // groups) + kernel
        self.weight = jr.uniform(_check_key(owner, key), w_shape, default_float(), -bound, bound)
        self.bias = jnp.zeros((out_channels,), default_float()) if bias else None

    @property
    def n_in(self) -> tuple[int, ...]:
        """The input shape of one example, `(channels, *spatial)`."""
        return self.in_shape

    @property
    def n_out(self) -> tuple[int, ...]:
        """The shape of the neuron population, `(out_channels, *spatial_out)`."""
        return self.out_shape

    def current(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """The input current: the convolution of `x` plus the bias, any leading axes."""
        ndim = len(self.in_shape) - 1
        return _conv(
            type(self).__name__, x, self.weight, self.bias, self.stride, self.padding,
            self.dilation, self.groups, ndim,
        )  # fmt: skip

    def init_state(self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None):
        """The neurons' rest state for a batch of `shape` (`()` for one example)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self.neuron.init_state(shape + self.out_shape, key=key)

    def step(self, state, x, dt: float):
        """One step: `x` of shape `(*batch, *in_shape)` -> spikes `(*batch, *out_shape)`."""
        x = jnp.asarray(x, dtype=self.weight.dtype)
        if x.shape[x.ndim - len(self.in_shape) :] != self.in_shape:
            raise ValueError(
                f"step: the input must end with the axes {self.in_shape}, got shape {x.shape}"
            )
        return self._neuron().step(state, self.current(x), dt)

    def __call__(
        self,
        x_seq: Float[Array, "t ..."],
        *,
        dt: float = 1.0,
        state=None,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        time_axis: int = 0,
    ) -> Float[Array, "t ..."]:
        """Run the layer over an input sequence; return its spikes `(t, ..., *out_shape)`.

        The input is time-major, `(t, *batch, *in_shape)`, unless `time_axis` names another
        of its leading axes as time (1 for batch-first); the spikes keep time on that axis.
        The convolutions of all steps are one call; the neurons then run under `simulate`.
        """
        owner = type(self).__name__
        x, axis = _time_first(owner, x_seq, self.in_shape, time_axis)
        dt = check_dt(owner, dt)
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


class SpikingConv1d(SpikingConv):
    """A one-dimensional convolution into a population of spiking neurons.

    As `SpikingConv2d` with one spatial axis: inputs `(*batch, c_in, n)`, weight
    `(out_channels, c_in / groups, k)`, neurons `(*batch, out_channels, m)`.

    Args:
        in_shape: `(c_in, n)` of one example.
        out_channels: number of output channels.
        kernel_size: kernel length.
        key: key for the initial weights (uniform in `+-weight_scale / sqrt(fan_in)`).
        stride: step of the kernel.
        padding: zeros on both ends, `"same"` (stride 1) or `"valid"`.
        dilation: spacing of the kernel's taps.
        groups: channel groups.
        neuron: a neurojax neuron model (default `default_neuron()`).
        weight_scale: scale of the initial weights, >= 0.
        bias: whether the layer has a trainable bias per output channel.
        learn_tau: train the neuron's `tau_m` too.
        tau_min: lower bound [ms] on a learned `tau_m`.
    """

    def __init__(
        self,
        in_shape: tuple[int, int],
        out_channels: int,
        kernel_size: int,
        *,
        key: PRNGKeyArray,
        stride: int = 1,
        padding: str | int = 0,
        dilation: int = 1,
        groups: int = 1,
        neuron: NeuronModel | None = None,
        weight_scale: float = 1.0,
        bias: bool = True,
        learn_tau: bool = False,
        tau_min: float = 0.5,
    ):
        self._setup(
            "SpikingConv1d", 1, in_shape, out_channels, kernel_size, key, stride, padding,
            dilation, groups, neuron, weight_scale, bias, learn_tau, tau_min,
        )  # fmt: skip


class SpikingConv2d(SpikingConv):
    r"""A two-dimensional convolution into a population of spiking neurons.

    At each step the input `x` of shape `(c_in, h, w)` drives neurons arranged as
    `(out_channels, oh, ow)` with the current `I = conv2d(x, W) + b` (PyTorch's convention:
    cross-correlation, weight `(out_channels, c_in / groups, kh, kw)`, one bias per output
    channel). The neurons (by default `default_neuron()`) integrate it and spike with
    surrogate gradients, as in `SpikingDense`; the output shape follows
    `conv_output_shape`.

    Args:
        in_shape: `(c_in, h, w)` of one example.
        out_channels: number of output channels.
        kernel_size: an int or `(kh, kw)`.
        key: key for the initial weights (uniform in `+-weight_scale / sqrt(fan_in)` with
            `fan_in = c_in / groups * kh * kw`).
        stride: step of the kernel, an int or `(sh, sw)`.
        padding: zeros on both sides, an int, `(ph, pw)`, `"same"` (stride 1) or `"valid"`.
        dilation: spacing of the kernel's taps.
        groups: channel groups; must divide `c_in` and `out_channels`.
        neuron: a neurojax neuron model (default `default_neuron()`).
        weight_scale: scale of the initial weights, >= 0.
        bias: whether the layer has a trainable bias per output channel.
        learn_tau: train the neuron's `tau_m` too.
        tau_min: lower bound [ms] on a learned `tau_m`.

    Example:
    ```python
    conv = nj.training.SpikingConv2d((1, 8, 8), 4, 3, key=jr.key(0), padding=1)
    spikes = conv(x, dt=1.0)         # x: (t, 1, 8, 8) -> (t, 4, 8, 8)
    ```
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        out_channels: int,
        kernel_size: int | tuple[int, int],
        *,
        key: PRNGKeyArray,
        stride: int | tuple[int, int] = 1,
        padding: str | int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        neuron: NeuronModel | None = None,
        weight_scale: float = 1.0,
        bias: bool = True,
        learn_tau: bool = False,
        tau_min: float = 0.5,
    ):
        self._setup(
            "SpikingConv2d", 2, in_shape, out_channels, kernel_size, key, stride, padding,
            dilation, groups, neuron, weight_scale, bias, learn_tau, tau_min,
        )  # fmt: skip


class StatelessLayer(eqx.Module):
    """A layer without state or parameters: the same map (`apply`) at every time step.

    The base of `SumPool2d`, `AvgPool2d` and `Flatten`; a subclass sets the static fields
    `in_shape` and `out_shape` and defines `apply`.
    """

    @abc.abstractmethod
    def apply(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """The map, on arrays of shape `(*leading, *in_shape)`."""

    def init_state(self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None):
        """No state: `None` (the layer keeps nothing between steps)."""
        return None

    def step(self, state, x, dt: float):
        """Apply the map to one step's input; the state stays `None`."""
        return state, self.apply(jnp.asarray(x))

    def __call__(
        self,
        x_seq: Float[Array, "t ..."],
        *,
        dt: float = 1.0,
        state=None,
        checkpoint: bool = False,
        truncate_backprop: int | None = None,
        time_axis: int = 0,
    ) -> Float[Array, "t ..."]:
        """Apply the map to every step of a sequence at once (time-major unless `time_axis`
        says otherwise; time stays on the input's axis)."""
        owner = type(self).__name__
        check_dt(owner, dt)
        x, axis = _time_first(owner, x_seq, self.in_shape, time_axis)
        return _time_back(self.apply(x), axis)

    @property
    def n_in(self) -> tuple[int, ...]:
        """The input shape of one example."""
        return self.in_shape

    @property
    def n_out(self) -> tuple[int, ...] | int:
        """The output shape of one example."""
        return self.out_shape


class _Pool2d(StatelessLayer):
    in_shape: tuple[int, int, int] = eqx.field(static=True)
    out_shape: tuple[int, int, int] = eqx.field(static=True)
    kernel_size: tuple[int, int] = eqx.field(static=True)
    stride: tuple[int, int] = eqx.field(static=True)
    padding: tuple[int, int] = eqx.field(static=True)

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        kernel_size: int | tuple[int, int],
        *,
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
    ):
        owner = type(self).__name__
        self.in_shape = _in_shape(owner, in_shape, 2)
        self.kernel_size = _int_tuple(owner, "kernel_size", kernel_size, 2, minimum=1)
        self.stride = (
            self.kernel_size
            if stride is None
            else _int_tuple(owner, "stride", stride, 2, minimum=1)
        )
        self.padding = _int_tuple(owner, "padding", padding, 2, minimum=0)
        spatial = conv_output_shape(
            self.in_shape[1:], self.kernel_size, stride=self.stride, padding=self.padding
        )
        self.out_shape = (self.in_shape[0],) + spatial


class SumPool2d(_Pool2d):
    """Sum pooling over the last two axes, as a layer (see `sum_pool2d`).

    Args:
        in_shape: `(c, h, w)` of one example.
        kernel_size: window, an int or `(kh, kw)`.
        stride: step of the window (default: the window).
        padding: zeros on both sides, an int or `(ph, pw)`.
    """

    def apply(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """Sum pooling of `x`, shape `(*leading, c, h, w)`."""
        return sum_pool2d(x, self.kernel_size, stride=self.stride, padding=self.padding)


class AvgPool2d(_Pool2d):
    """Average pooling over the last two axes, as a layer (see `avg_pool2d`).

    Args:
        in_shape: `(c, h, w)` of one example.
        kernel_size: window, an int or `(kh, kw)`.
        stride: step of the window (default: the window).
        padding: zeros on both sides (counted in the mean), an int or `(ph, pw)`.
    """

    def apply(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """Average pooling of `x`, shape `(*leading, c, h, w)`."""
        return avg_pool2d(x, self.kernel_size, stride=self.stride, padding=self.padding)


class Flatten(StatelessLayer):
    """Flatten one example's axes `in_shape` into one feature axis (batch axes kept).

    Put it between convolutional or pooling layers and a `SpikingDense` or `LeakyReadout`.

    Args:
        in_shape: the shape of one example, for example `(c, h, w)`.
    """

    in_shape: tuple[int, ...] = eqx.field(static=True)
    out_shape: int = eqx.field(static=True)

    def __init__(self, in_shape: tuple[int, ...]):
        if isinstance(in_shape, int):
            in_shape = (in_shape,)
        if not isinstance(in_shape, (tuple, list)) or not in_shape:
            raise ValueError(
                f"Flatten: in_shape must be a non-empty tuple of ints, got {in_shape!r}"
            )
        self.in_shape = _int_tuple("Flatten", "in_shape", tuple(in_shape), len(in_shape), minimum=1)
        self.out_shape = math.prod(self.in_shape)

    def apply(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """`x` of shape `(*leading, *in_shape)` reshaped to `(*leading, prod(in_shape))`."""
        lead = x.shape[: x.ndim - len(self.in_shape)]
        if x.shape[len(lead) :] != self.in_shape:
            raise ValueError(
                f"Flatten: the input must end with the axes {self.in_shape}, got shape {x.shape}"
            )
        return x.reshape(lead + (self.out_shape,))
