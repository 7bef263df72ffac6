"""Losses on exact spike times and on readout voltages, for EventProp training.

They read an `EventRecording` (or arrays taken from one) for one trial or a batch (leading
axes); each returns a scalar averaged over the batch. Spike times come from
`eventprop_run` with `+inf` where a neuron did not fire.
"""

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float

from ._losses import _labels

__all__ = [
    "first_spike_times",
    "first_spike_mse",
    "first_spike_cross_entropy",
    "first_spike_accuracy",
    "voltage_max_cross_entropy",
    "voltage_integral_cross_entropy",
]


def _check_broadcasts(owner: str, name: str, shape: tuple, to: tuple) -> None:
    """Raise naming `name` when an array of `shape` does not broadcast with `to`."""
    try:
        jnp.broadcast_shapes(shape, to)
    except ValueError:
        raise ValueError(f"{owner}: {name} of shape {shape} does not broadcast to {to}") from None


def first_spike_times(
    spike_times: ArrayLike,
    *,
    t_max: float | ArrayLike,
    v_max: ArrayLike | None = None,
    v_th: float | ArrayLike | None = None,
    silent_slope: float | None = None,
) -> Float[Array, "..."]:
    r"""Each neuron's first spike time, and what a neuron that did not fire gets instead.

    By default a silent neuron gets `t_max`, which carries no gradient: it is pushed only
    through the other neurons' times, and a label neuron that has fallen silent is never
    pushed back to firing (a time-to-first-spike network trained this way can lose its
    outputs one by one, see `docs/concepts/exact-gradients.md`).

    Given its voltage maximum `v_max` (`EventRecording.v_max[name]`, exact and
    differentiable for a neuron that did not fire), the threshold `v_th` and a slope
    [ms per unit of voltage], a silent neuron's time is extended past the end of the run
    by how far it stayed below threshold:

    $$t = t_{max} + \text{silent\_slope}\,(v_{th} - v_{max}),$$

    so that a loss that wants it earlier raises its voltage until it fires. Neurons that
    fire keep their exact first spike time; the gradient is the exact gradient of this
    extended time.

    Args:
        spike_times: `(*batch, n, k)` spike times as `EventRecording.spike_times[name]`.
        t_max: the run's duration [ms].
        v_max: `(*batch, n)` voltage maxima of the same neurons, or None.
        v_th: the neurons' threshold, a number or `(n,)`; required with `v_max`.
        silent_slope: ms added per unit of voltage below threshold, > 0; required with
            `v_max`.
    """
    owner = "first_spike_times"
    s = jnp.asarray(spike_times)
    if s.ndim < 2:
        raise ValueError(f"{owner}: spike_times must have shape (*batch, n, k), got {s.shape}")
    first = s[..., 0]
    t_end = jax.lax.stop_gradient(jnp.asarray(t_max, first.dtype))
    given = [v_max is not None, v_th is not None, silent_slope is not None]
    if any(given) and not all(given):
        raise ValueError(
            f"{owner}: v_max, v_th and silent_slope go together (a silent neuron's time is "
            f"t_max + silent_slope * (v_th - v_max)); got v_max "
            f"{'set' if given[0] else 'None'}, v_th={v_th!r}, silent_slope={silent_slope!r}"
        )
    if v_max is None:
        return jnp.where(jnp.isfinite(first), first, t_end)
    if not (
        isinstance(silent_slope, (int, float))
        and not isinstance(silent_slope, bool)
        and silent_slope > 0
        and silent_slope < float("inf")
    ):
        raise ValueError(
            f"{owner}: silent_slope must be a finite number of ms per unit of voltage > 0, "
            f"got {silent_slope!r}"
        )
    vm = jnp.asarray(v_max)
    if vm.shape != first.shape:
        raise ValueError(
            f"{owner}: v_max must have the shape of the first spike times {first.shape} "
            f"(spike_times without its last axis), got {vm.shape}"
        )
    th = jnp.asarray(v_th, first.dtype)
    _check_broadcasts(owner, "v_th", th.shape, first.shape)
    fired = jnp.isfinite(first)
    # a neuron that did not fire stayed below threshold; the clip only guards the rounding
    # of a maximum that touched it without a located crossing
    below = jnp.maximum(th - jnp.where(fired, th, vm.astype(first.dtype)), 0.0)
    return jnp.where(fired, first, t_end + silent_slope * below)


def first_spike_mse(t_first: ArrayLike, target: ArrayLike) -> Float[Array, ""]:
    """Time-to-first-spike loss: mean squared error [ms^2] between first spike times and
    target times (broadcast), as in Wunderlich and Pehle (2021, Fig. 2)."""
    t = jnp.asarray(t_first)
    target = jnp.asarray(target, t.dtype)
    _check_broadcasts("first_spike_mse", "target", target.shape, t.shape)
    return jnp.mean((t - target) ** 2)


def first_spike_cross_entropy(
    t_first: ArrayLike,
    labels: ArrayLike,
    *,
    tau0: float = 0.5,
    tau1: float = 6.4,
    alpha: float = 3e-3,
    t_max: float | None = None,
) -> Float[Array, ""]:
    r"""Cross-entropy over first-spike times, with the early-spike regulariser of
    Wunderlich and Pehle (2021, Sci. Rep. 11:12829, Eq. 13):

    $$L = -\log\frac{e^{-t_{l}/\tau_0}}{\sum_k e^{-t_k/\tau_0}}
          + \alpha\left(e^{t_{l}/\tau_1} - 1\right)$$

    with `t_l` the first spike time of the label's neuron. The earliest output wins.

    By default every output takes part with the time it is given (a silent one with
    `first_spike_times`' `t_max` or its extension past it). With `t_max`, the rule of
    Wunderlich and Pehle's own code applies instead: an output with a time at or after
    `t_max` is silent and leaves the softmax, and a trial whose label output is silent adds
    nothing to the loss and no gradient (it is not pushed, and neither are the other
    outputs on its account); the mean is still over all trials.

    Args:
        t_first: `(*batch, n_classes)` first spike times [ms] (`first_spike_times`).
        labels: integer classes of shape `batch`.
        tau0: softmax temperature [ms], > 0.
        tau1: time constant of the regulariser [ms], > 0.
        alpha: strength of the regulariser, >= 0.
        t_max: the run's duration [ms], > 0, or None (see above).
    """
    owner = "first_spike_cross_entropy"
    for name, v, lo in (("tau0", tau0, 0.0), ("tau1", tau1, 0.0)):
        if not (isinstance(v, (int, float)) and v > lo):
            raise ValueError(f"{owner}: {name} must be a number of ms > 0, got {v!r}")
    if not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise ValueError(f"{owner}: alpha must be a number >= 0, got {alpha!r}")
    if t_max is not None and not (
        isinstance(t_max, (int, float)) and not isinstance(t_max, bool) and 0 < t_max < float("inf")
    ):
        raise ValueError(f"{owner}: t_max must be a finite number of ms > 0 or None, got {t_max!r}")
    t = jnp.asarray(t_first)
    logits = -t / tau0
    labels = _labels(owner, labels, logits)
    t_label = jnp.take_along_axis(t, labels[..., None], axis=-1)[..., 0]
    if t_max is None:
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return jnp.mean(ce + alpha * (jnp.exp(t_label / tau1) - 1.0))
    silent = t >= t_max
    # a silent output's logit sits far below every other (its softmax weight underflows to
    # 0) and is a constant, so no gradient reaches its time; finite, so that a trial with
    # every output silent has a finite (unused) softmax and no NaN reaches the gradient
    floor = jax.lax.stop_gradient(jnp.min(jnp.where(silent, 0.0, logits)) - 1e4)
    ce = optax.softmax_cross_entropy_with_integer_labels(jnp.where(silent, floor, logits), labels)
    label_fired = ~jnp.take_along_axis(silent, labels[..., None], axis=-1)[..., 0]
    t_reg = jnp.where(label_fired, t_label, 0.0)
    per_trial = ce + alpha * (jnp.exp(t_reg / tau1) - 1.0)
    return jnp.mean(jnp.where(label_fired, per_trial, 0.0))


def first_spike_accuracy(
    t_first: ArrayLike, labels: ArrayLike, *, t_max: float | None = None
) -> Float[Array, ""]:
    """Fraction of trials whose earliest output neuron is the label's (ties: lower index).
    With `t_max` [ms], a trial whose label output's time is at or after it (silent) counts
    as wrong, as it does in Wunderlich and Pehle's code, even where every output is silent."""
    owner = "first_spike_accuracy"
    if t_max is not None and not (
        isinstance(t_max, (int, float)) and not isinstance(t_max, bool) and 0 < t_max < float("inf")
    ):
        raise ValueError(f"{owner}: t_max must be a finite number of ms > 0 or None, got {t_max!r}")
    t = jnp.asarray(t_first)
    labels = _labels(owner, labels, t)
    right = jnp.argmin(t, axis=-1) == labels
    if t_max is not None:
        t_label = jnp.take_along_axis(t, labels[..., None], axis=-1)[..., 0]
        right = right & (t_label < t_max)
    return jnp.mean(right.astype(t.dtype))


def voltage_max_cross_entropy(v_max: ArrayLike, labels: ArrayLike) -> Float[Array, ""]:
    """Softmax cross-entropy with each readout's maximum voltage over the run as its logit
    (`EventRecording.v_max` of a non-spiking readout population, exact: the maximum is taken
    at the trajectory's turning points in closed form)."""
    v = jnp.asarray(v_max)
    labels = _labels("voltage_max_cross_entropy", labels, v)
    return optax.softmax_cross_entropy_with_integer_labels(v, labels).mean()


def voltage_integral_cross_entropy(
    v_integral: ArrayLike, labels: ArrayLike, *, scale: float = 1.0
) -> Float[Array, ""]:
    """Softmax cross-entropy with `scale` times each readout's voltage integral [mV ms]
    over the run as its logit (`EventRecording.v_integral`), the sum-over-time readout of
    Nowotny et al. (2022, arXiv 2212.01232)."""
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(
            f"voltage_integral_cross_entropy: scale must be a number > 0, got {scale!r}"
        )
    v = jnp.asarray(v_integral) * scale
    labels = _labels("voltage_integral_cross_entropy", labels, v)
    return optax.softmax_cross_entropy_with_integer_labels(v, labels).mean()
