"""One neurojax operation per NIR primitive: its step, its state and its way back to NIR.

Every operation acts on arrays of shape `(*batch, *shape)` where `shape` is the node's own
(unbatched) shape, keeps its dynamic variables in a state that it creates and returns, and
can write itself back as the NIR node it was read from (`to_nir`), so that a graph read by
`from_nir` is written again by `to_nir` with the same parameters.

Spikes follow NIR: `z = 1` where `v > v_threshold` (strictly), computed with a neurojax
surrogate so that gradients flow; the reset to `v_reset` is detached from the gradient, as in
`nj.LIF`.
"""

import abc
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._validation import as_float, default_float
from ..surrogate import Surrogate
from ..training._conv import _conv, avg_pool2d, sum_pool2d

__all__ = ["NODE_TYPES"]


def _np(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _strict_spike(surrogate: Surrogate, x: Float[Array, "..."]) -> Float[Array, "..."]:
    # The surrogate's step is `x >= 0`; NIR fires on `v > v_threshold`, so the tie x == 0 is
    # removed from the value while the surrogate's gradient is kept there.
    s = surrogate(x)
    return s - jax.lax.stop_gradient(jnp.where(x == 0, s, jnp.zeros_like(s)))


def _zeros(batch: tuple[int, ...], shape: tuple[int, ...]) -> Float[Array, "..."]:
    return jnp.zeros(batch + shape, default_float())


class NodeState(eqx.Module):
    """State of a NIR neuron operation: the membrane potential `v` and, for the
    current-based models, the synaptic current `i` (`None` for the others)."""

    v: Float[Array, "..."]
    i: Float[Array, "..."] | None = None


class _Op(eqx.Module):
    """The interface of every operation (see the module docstring)."""

    def init_state(self, batch: tuple[int, ...]) -> Any:
        return None

    @abc.abstractmethod
    def step(self, state, x, dt: float):
        """`(state, output)` after one step of `dt` with input `x`."""

    @abc.abstractmethod
    def to_nir(self, nir, time_scale: float):
        """The NIR node of this operation (times multiplied by `time_scale`)."""


class InputOp(_Op):
    """A graph input: passes the data on."""

    shape: tuple[int, ...] | None = eqx.field(static=True)

    def step(self, state, x, dt):
        return state, x

    def to_nir(self, nir, time_scale):
        return nir.Input(input_type=np.array(self.shape))


class OutputOp(InputOp):
    """A graph output: passes the data on."""

    def to_nir(self, nir, time_scale):
        return nir.Output(output_type=np.array(self.shape))


class AffineOp(_Op):
    """`y = W x + b`, `W` of shape `(n_out, n_in)` as NIR stores it."""

    weight: Float[Array, "n_out n_in"]
    bias: Float[Array, " n_out"] | None

    def step(self, state, x, dt):
        y = x @ self.weight.T
        return state, y if self.bias is None else y + self.bias

    def to_nir(self, nir, time_scale):
        if self.bias is None:
            return nir.Linear(weight=_np(self.weight))
        return nir.Affine(weight=_np(self.weight), bias=_np(self.bias))


class ScaleOp(_Op):
    """`y = x * s`, elementwise."""

    scale: Float[Array, "..."]

    def step(self, state, x, dt):
        return state, x * self.scale

    def to_nir(self, nir, time_scale):
        return nir.Scale(scale=_np(self.scale))


class ThresholdOp(_Op):
    """`z = 1` where `x > threshold`, else 0 (surrogate gradient of `x - threshold`)."""

    threshold: Float[Array, "..."]
    surrogate: Surrogate

    def step(self, state, x, dt):
        return state, _strict_spike(self.surrogate, x - self.threshold)

    def to_nir(self, nir, time_scale):
        return nir.Threshold(threshold=_np(self.threshold))


class DelayOp(_Op):
    """`y(t) = x(t - delay)` with each delay a whole number of steps (`steps`)."""

    delay: Float[Array, "..."]
    steps: Int[Array, "..."]
    max_steps: int = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True)

    def init_state(self, batch):
        # The last `max_steps` inputs, newest first, on the axis after the batch axes.
        if self.max_steps == 0:
            return None
        return _zeros(batch + (self.max_steps,), self.shape)

    def step(self, state, x, dt):
        if self.max_steps == 0:
            return state, x
        axis = x.ndim - len(self.shape)
        history = jnp.concatenate([jnp.expand_dims(x, axis), state], axis=axis)
        index = jnp.broadcast_to(self.steps, x.shape)
        y = jnp.take_along_axis(history, jnp.expand_dims(index, axis), axis=axis)
        return jax.lax.slice_in_dim(history, 0, self.max_steps, axis=axis), jnp.squeeze(y, axis)

    def to_nir(self, nir, time_scale):
        return nir.Delay(delay=_np(self.delay) * time_scale)


class FlattenOp(_Op):
    """Reshape one example from `in_shape` to `shape` (batch axes kept); both `None` until
    `from_nir` infers them when the graph leaves them open."""

    in_shape: tuple[int, ...] | None = eqx.field(static=True)
    shape: tuple[int, ...] | None = eqx.field(static=True)
    start_dim: int = eqx.field(static=True)
    end_dim: int = eqx.field(static=True)

    def step(self, state, x, dt):
        lead = x.shape[: x.ndim - len(self.in_shape)]
        return state, x.reshape(lead + self.shape)

    def resolved(self, in_shape: tuple[int, ...]) -> "FlattenOp":
        """This operation for inputs of `in_shape`, axes `start_dim..end_dim` merged."""
        n = len(in_shape)
        start, end = self.start_dim % max(n, 1), self.end_dim % max(n, 1)
        if n == 0 or start > end:
            raise ValueError(
                f"start_dim={self.start_dim} and end_dim={self.end_dim} do not select axes of "
                f"an input of shape {in_shape}"
            )
        shape = in_shape[:start] + (math.prod(in_shape[start : end + 1]),) + in_shape[end + 1 :]
        return FlattenOp(
            in_shape=in_shape, shape=shape, start_dim=self.start_dim, end_dim=self.end_dim
        )

    def to_nir(self, nir, time_scale):
        return nir.Flatten(
            input_type={"input": None if self.in_shape is None else np.array(self.in_shape)},
            start_dim=self.start_dim,
            end_dim=self.end_dim,
        )


class ConvOp(_Op):
    """Convolution in 1 or 2 spatial dimensions, PyTorch's (and NIR's) convention."""

    weight: Float[Array, "c_out c_in_g *k"]
    bias: Float[Array, " c_out"] | None
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: str | tuple[int, ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    input_shape: tuple[int, ...] | None = eqx.field(static=True)

    def step(self, state, x, dt):
        ndim = self.weight.ndim - 2
        y = _conv(
            f"Conv{ndim}d", x, self.weight, self.bias, self.stride, self.padding,
            self.dilation, self.groups, ndim,
        )  # fmt: skip
        return state, y

    def to_nir(self, nir, time_scale):
        ndim = self.weight.ndim - 2
        bias = self.bias if self.bias is not None else jnp.zeros(self.weight.shape[0])
        common = dict(weight=_np(self.weight), groups=self.groups, bias=_np(bias))
        if ndim == 1:
            return nir.Conv1d(
                input_shape=None if self.input_shape is None else self.input_shape[0],
                stride=self.stride[0],
                padding=self.padding if isinstance(self.padding, str) else self.padding[0],
                dilation=self.dilation[0],
                **common,
            )
        return nir.Conv2d(
            input_shape=self.input_shape,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            **common,
        )


class PoolOp(_Op):
    """Sum or average pooling over the last two axes (`kind` "sum" or "avg")."""

    kind: str = eqx.field(static=True)
    kernel_size: tuple[int, int] = eqx.field(static=True)
    stride: tuple[int, int] = eqx.field(static=True)
    padding: tuple[int, int] = eqx.field(static=True)

    def step(self, state, x, dt):
        pool = sum_pool2d if self.kind == "sum" else avg_pool2d
        return state, pool(x, self.kernel_size, stride=self.stride, padding=self.padding)

    def to_nir(self, nir, time_scale):
        cls = nir.SumPool2d if self.kind == "sum" else nir.AvgPool2d
        return cls(
            kernel_size=np.array(self.kernel_size),
            stride=np.array(self.stride),
            padding=np.array(self.padding),
        )


class _NeuronOp(_Op):
    """Shared parts of the NIR neuron models: shape, integration method, surrogate."""

    shape: tuple[int, ...] = eqx.field(static=True)
    method: str = eqx.field(static=True)

    def init_state(self, batch):
        return NodeState(v=_zeros(batch, self.shape) + self._v0())

    def _v0(self):
        return getattr(self, "v_leak", 0.0)

    def _leak(self, v, tau, drive, dt):
        # tau dv/dt = drive - v with drive held over the step: exact or forward Euler.
        if self.method == "euler":
            return v + (dt / tau) * (drive - v)
        return drive + (v - drive) * jnp.exp(-dt / tau)

    def _fire(self, v):
        z = _strict_spike(
            self.surrogate, (v - self.v_threshold) / (self.v_threshold - self.v_reset)
        )
        return jnp.where(z > 0, self.v_reset, v), z


class LIOp(_NeuronOp):
    """`tau dv/dt = (v_leak - v) + r I`; the output is `v`."""

    tau: Float[Array, "..."]
    r: Float[Array, "..."]
    v_leak: Float[Array, "..."]

    def step(self, state, x, dt):
        v = self._leak(state.v, self.tau, self.v_leak + self.r * x, dt)
        return NodeState(v=v), v

    def to_nir(self, nir, time_scale):
        return nir.LI(tau=_np(self.tau) * time_scale, r=_np(self.r), v_leak=_np(self.v_leak))


class LIFOp(_NeuronOp):
    """`tau dv/dt = (v_leak - v) + r I`; spike where `v > v_threshold`, then `v = v_reset`."""

    tau: Float[Array, "..."]
    r: Float[Array, "..."]
    v_leak: Float[Array, "..."]
    v_threshold: Float[Array, "..."]
    v_reset: Float[Array, "..."]
    surrogate: Surrogate

    def step(self, state, x, dt):
        v, z = self._fire(self._leak(state.v, self.tau, self.v_leak + self.r * x, dt))
        return NodeState(v=v), z

    def to_nir(self, nir, time_scale):
        return nir.LIF(
            tau=_np(self.tau) * time_scale,
            r=_np(self.r),
            v_leak=_np(self.v_leak),
            v_threshold=_np(self.v_threshold),
            v_reset=_np(self.v_reset),
        )


class IOp(_NeuronOp):
    """`dv/dt = r I`; the output is `v`."""

    r: Float[Array, "..."]

    def step(self, state, x, dt):
        v = state.v + dt * self.r * x
        return NodeState(v=v), v

    def to_nir(self, nir, time_scale):
        return nir.I(r=_np(self.r) / time_scale)


class IFOp(_NeuronOp):
    """`dv/dt = r I`; spike where `v > v_threshold`, then `v = v_reset`."""

    r: Float[Array, "..."]
    v_threshold: Float[Array, "..."]
    v_reset: Float[Array, "..."]
    surrogate: Surrogate

    def _v0(self):
        return 0.0

    def step(self, state, x, dt):
        v, z = self._fire(state.v + dt * self.r * x)
        return NodeState(v=v), z

    def to_nir(self, nir, time_scale):
        return nir.IF(
            r=_np(self.r) / time_scale, v_threshold=_np(self.v_threshold), v_reset=_np(self.v_reset)
        )


class CubaLIOp(_NeuronOp):
    """`tau_syn dI/dt = -I + w_in x`, `tau_mem dv/dt = (v_leak - v) + r I`; output `v`."""

    tau_syn: Float[Array, "..."]
    tau_mem: Float[Array, "..."]
    r: Float[Array, "..."]
    v_leak: Float[Array, "..."]
    w_in: Float[Array, "..."]

    def init_state(self, batch):
        return NodeState(v=_zeros(batch, self.shape) + self.v_leak, i=_zeros(batch, self.shape))

    def _integrate(self, state, x, dt):
        i_inf = self.w_in * x
        if self.method == "euler":
            # Current first, then the membrane with the new current (snnTorch's Synaptic).
            i = state.i + (dt / self.tau_syn) * (i_inf - state.i)
            v = state.v + (dt / self.tau_mem) * (self.v_leak - state.v + self.r * i)
            return v, i
        a = jnp.exp(-dt / self.tau_syn)
        b = jnp.exp(-dt / self.tau_mem)
        i = i_inf + (state.i - i_inf) * a
        # Exact solution of the linear pair for x held over the step:
        # u(dt) = u b + r I_inf (1 - b) + r (I_0 - I_inf) c, with u = v - v_leak and
        # c = tau_syn (a - b) / (tau_syn - tau_mem) = b (dt / tau_mem) expm1(k) / k,
        # k = dt (tau_syn - tau_mem) / (tau_syn tau_mem); the second form has no
        # cancellation when the two time constants are (nearly) equal, where c -> b dt/tau_mem.
        k = dt * (self.tau_syn - self.tau_mem) / (self.tau_syn * self.tau_mem)
        small = jnp.abs(k) < 1e-4
        k_safe = jnp.where(small, 1.0, k)
        ratio = jnp.where(small, 1.0 + k / 2, jnp.expm1(k_safe) / k_safe)
        c = b * (dt / self.tau_mem) * ratio
        u = (state.v - self.v_leak) * b + self.r * (i_inf * (1 - b) + (state.i - i_inf) * c)
        return self.v_leak + u, i

    def step(self, state, x, dt):
        v, i = self._integrate(state, x, dt)
        return NodeState(v=v, i=i), v

    def to_nir(self, nir, time_scale):
        return nir.CubaLI(
            tau_syn=_np(self.tau_syn) * time_scale,
            tau_mem=_np(self.tau_mem) * time_scale,
            r=_np(self.r),
            v_leak=_np(self.v_leak),
            w_in=_np(self.w_in),
        )


class CubaLIFOp(CubaLIOp):
    """`CubaLI` with a threshold: spike where `v > v_threshold`, then `v = v_reset`."""

    v_threshold: Float[Array, "..."]
    v_reset: Float[Array, "..."]
    surrogate: Surrogate

    def step(self, state, x, dt):
        v, i = self._integrate(state, x, dt)
        v, z = self._fire(v)
        return NodeState(v=v, i=i), z

    def to_nir(self, nir, time_scale):
        return nir.CubaLIF(
            tau_syn=_np(self.tau_syn) * time_scale,
            tau_mem=_np(self.tau_mem) * time_scale,
            r=_np(self.r),
            v_leak=_np(self.v_leak),
            v_threshold=_np(self.v_threshold),
            v_reset=_np(self.v_reset),
            w_in=_np(self.w_in),
        )


# ------------------------------------------------------------------------------------ import


class RefusedNode(ValueError):
    """A NIR node that neurojax cannot represent; the message names the node and field."""


def _refuse(name: str, node, field: str, why: str) -> RefusedNode:
    return RefusedNode(f"from_nir: node {name!r} ({type(node).__name__}): {field} {why}")


def _field(name, node, field, *, positive=False, shape=None) -> Float[Array, "..."]:
    value = getattr(node, field)
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise _refuse(
            name, node, field, f"must be an array of real numbers, got {value!r}"
        ) from err
    if not np.all(np.isfinite(a)):
        raise _refuse(name, node, field, f"must be finite, got {a.tolist()}")
    if positive and not np.all(a > 0):
        raise _refuse(name, node, field, f"must be > 0 everywhere, got {a.tolist()}")
    if shape is not None and a.shape != shape:
        if a.ndim == 0 or a.size == 1:
            a = np.broadcast_to(a.reshape(()), shape)
        else:
            raise _refuse(name, node, field, f"must have the node's shape {shape}, got {a.shape}")
    return as_float(a)


def _shape_of(name, node, field) -> tuple[int, ...]:
    return tuple(int(n) for n in np.shape(getattr(node, field)))


def _check_reset(name, node, v_threshold, v_reset):
    if np.any(np.asarray(v_reset) >= np.asarray(v_threshold)):
        raise _refuse(
            name, node, "v_reset",
            f"must be < v_threshold everywhere (a reset at or above the threshold would fire "
            f"at every step), got v_reset={np.asarray(v_reset).tolist()} and "
            f"v_threshold={np.asarray(v_threshold).tolist()}",
        )  # fmt: skip


def _int_param(name, node, field, ndim, minimum):
    value = getattr(node, field)
    a = np.asarray(value)
    if a.ndim == 0:
        a = np.full(ndim, a)
    ok = a.shape == (ndim,) and np.all(a == np.round(a)) and np.all(a >= minimum)
    if not ok:
        raise _refuse(
            name, node, field, f"must be an int >= {minimum} or {ndim} such ints, got {value!r}"
        )
    return tuple(int(v) for v in a)


def _listed(x) -> Any:
    try:
        return np.asarray(x).tolist()
    except (TypeError, ValueError):
        return x


def _type_shape(name, node, key, which) -> tuple[int, ...] | None:
    """The shape `node.<which>[key]`, `None` when open; refused unless positive ints."""
    types = getattr(node, which, None) or {}
    if not isinstance(types, dict):
        raise _refuse(name, node, which, f"must be a dict {{{key!r}: shape}}, got {types!r}")
    shape = types.get(key)
    if shape is None:
        return None
    try:
        a = np.asarray(shape).reshape(-1)
        ok = a.dtype.kind in "iuf" and bool(np.all(a == np.round(a))) and bool(np.all(a >= 1))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise _refuse(
            name,
            node,
            which,
            f"must be a shape of positive ints, got {_listed(shape)!r}",
        )
    return tuple(int(n) for n in a)


def _io(name, node, method, surrogate, dt):
    if type(node).__name__ == "Input":
        shape = _type_shape(name, node, "input", "input_type")
        cls = InputOp
    else:
        shape = _type_shape(name, node, "output", "output_type")
        cls = OutputOp
    # An unknown shape (None) is inferred from the graph by `from_nir`.
    return cls(shape=shape)


def _affine(name, node, method, surrogate, dt):
    w = np.asarray(node.weight)
    if w.ndim != 2:
        raise _refuse(name, node, "weight", f"must be a matrix (n_out, n_in), got shape {w.shape}")
    weight = _field(name, node, "weight")
    bias = None
    if type(node).__name__ == "Affine":
        bias = _field(name, node, "bias", shape=(w.shape[0],))
    return AffineOp(weight=weight, bias=bias)


def _scale(name, node, method, surrogate, dt):
    return ScaleOp(scale=_field(name, node, "scale"))


def _threshold(name, node, method, surrogate, dt):
    return ThresholdOp(threshold=_field(name, node, "threshold"), surrogate=surrogate)


def _delay(name, node, method, surrogate, dt):
    delay = np.asarray(_field(name, node, "delay"), dtype=np.float64)
    if np.any(delay < 0):
        raise _refuse(name, node, "delay", f"must be >= 0, got {delay.tolist()}")
    steps = np.round(delay / dt)
    if not np.allclose(steps * dt, delay, rtol=1e-5, atol=1e-9 * dt):
        raise _refuse(
            name, node, "delay",
            f"must be a whole number of time steps dt={dt}, got {delay.tolist()} "
            f"({(delay / dt).tolist()} steps); import the graph with a dt that divides every delay",
        )  # fmt: skip
    return DelayOp(
        delay=as_float(delay),
        steps=jnp.asarray(steps.astype(np.int32)),
        max_steps=int(steps.max()) if steps.size else 0,
        shape=tuple(delay.shape),
    )


def _flatten(name, node, method, surrogate, dt):
    in_shape = _type_shape(name, node, "input", "input_type")
    if in_shape is None:  # inferred from the graph by `from_nir`
        return FlattenOp(
            in_shape=None, shape=None, start_dim=int(node.start_dim), end_dim=int(node.end_dim)
        )
    out_shape = _type_shape(name, node, "output", "output_type")
    if out_shape is None or math.prod(out_shape) != math.prod(in_shape):
        raise _refuse(
            name, node, "output_type",
            f"must hold as many elements as input_type {in_shape}, got {out_shape}",
        )  # fmt: skip
    return FlattenOp(
        in_shape=in_shape, shape=out_shape, start_dim=int(node.start_dim), end_dim=int(node.end_dim)
    )


def _conv_node(name, node, method, surrogate, dt):
    ndim = 1 if type(node).__name__ == "Conv1d" else 2
    w = np.asarray(node.weight)
    if w.ndim != ndim + 2:
        raise _refuse(
            name,
            node,
            "weight",
            f"must have {ndim + 2} axes (c_out, c_in/groups, *k), got {w.shape}",
        )
    groups = node.groups
    if isinstance(groups, bool) or int(np.asarray(groups)) != np.asarray(groups) or groups < 1:
        raise _refuse(name, node, "groups", f"must be an int >= 1, got {groups!r}")
    padding = node.padding
    if not isinstance(padding, str):
        padding = _int_param(name, node, "padding", ndim, 0)
    input_shape = node.input_shape
    if input_shape is not None:
        input_shape = _int_param(name, node, "input_shape", ndim, 1)
    bias = None if node.bias is None else _field(name, node, "bias", shape=(w.shape[0],))
    return ConvOp(
        weight=_field(name, node, "weight"),
        bias=bias,
        stride=_int_param(name, node, "stride", ndim, 1),
        padding=padding,
        dilation=_int_param(name, node, "dilation", ndim, 1),
        groups=int(groups),
        input_shape=input_shape,
    )


def _pool(name, node, method, surrogate, dt):
    return PoolOp(
        kind="sum" if type(node).__name__ == "SumPool2d" else "avg",
        kernel_size=_int_param(name, node, "kernel_size", 2, 1),
        stride=_int_param(name, node, "stride", 2, 1),
        padding=_int_param(name, node, "padding", 2, 0),
    )


def _neuron(name, node, method, surrogate, dt):
    kind = type(node).__name__
    shape_field = {"I": "r", "IF": "r", "LI": "r", "LIF": "r"}.get(kind, "tau_mem")
    shape = _shape_of(name, node, shape_field)

    def f(field, positive=False):
        return _field(name, node, field, positive=positive, shape=shape)

    common = dict(shape=shape, method=method)
    if kind == "I":
        return IOp(r=f("r"), **common)
    if kind == "LI":
        return LIOp(tau=f("tau", True), r=f("r"), v_leak=f("v_leak"), **common)
    if kind in ("IF", "LIF", "CubaLIF"):
        v_threshold, v_reset = f("v_threshold"), f("v_reset")
        _check_reset(name, node, v_threshold, v_reset)
    if kind == "IF":
        return IFOp(
            r=f("r"), v_threshold=v_threshold, v_reset=v_reset, surrogate=surrogate, **common
        )
    if kind == "LIF":
        return LIFOp(
            tau=f("tau", True), r=f("r"), v_leak=f("v_leak"), v_threshold=v_threshold,
            v_reset=v_reset, surrogate=surrogate, **common,
        )  # fmt: skip
    cuba = dict(
        tau_syn=f("tau_syn", True), tau_mem=f("tau_mem", True), r=f("r"), v_leak=f("v_leak"),
        w_in=f("w_in"),
    )  # fmt: skip
    if kind == "CubaLI":
        return CubaLIOp(**cuba, **common)
    return CubaLIFOp(
        **cuba, v_threshold=v_threshold, v_reset=v_reset, surrogate=surrogate, **common
    )


NODE_TYPES: dict[str, Any] = {
    "Input": _io,
    "Output": _io,
    "Affine": _affine,
    "Linear": _affine,
    "Scale": _scale,
    "Threshold": _threshold,
    "Delay": _delay,
    "Flatten": _flatten,
    "Conv1d": _conv_node,
    "Conv2d": _conv_node,
    "SumPool2d": _pool,
    "AvgPool2d": _pool,
    "I": _neuron,
    "IF": _neuron,
    "LI": _neuron,
    "LIF": _neuron,
    "CubaLI": _neuron,
    "CubaLIF": _neuron,
}
"""NIR primitive name -> the function that reads such a node into a neurojax operation."""
