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


def first_spike_times(spike_times: ArrayLike, *, t_max: float | ArrayLike) -> Float[Array, "..."]:
    """Each neuron's first spike time; a neuron that did not fire gets `t_max` (which
    carries no gradient, so a silent neuron is pushed only through the others' times).

    Args:
        spike_times: `(*batch, n, k)` spike times as `EventRecording.spike_times[name]`.
        t_max: the run's duration [ms].
    """
    s = jnp.asarray(spike_times)
    if s.ndim < 2:
        raise ValueError(
            f"first_spike_times: spike_times must have shape (*batch, n, k), got {s.shape}"
        )
    first = s[..., 0]
    return jnp.where(
        jnp.isfinite(first), first, jax.lax.stop_gradient(jnp.asarray(t_max, first.dtype))
    )


def first_spike_mse(t_first: ArrayLike, target: ArrayLike) -> Float[Array, ""]:
    """Time-to-first-spike loss: mean squared error [ms^2] between first spike times and
    target times (broadcast), as in Wunderlich and Pehle (2021, Fig. 2)."""
    t = jnp.asarray(t_first)
    target = jnp.asarray(target, t.dtype)
    try:
        jnp.broadcast_shapes(t.shape, target.shape)
    except ValueError:
        raise ValueError(
            f"first_spike_mse: target of shape {target.shape} does not broadcast to {t.shape}"
        ) from None
    return jnp.mean((t - target) ** 2)


def first_spike_cross_entropy(
    t_first: ArrayLike,
    labels: ArrayLike,
    *,
    tau0: float = 0.5,
    tau1: float = 6.4,
    alpha: float = 3e-3,
) -> Float[Array, ""]:
    r"""Cross-entropy over first-spike times, with the early-spike regulariser of
    Wunderlich and Pehle (2021, Sci. Rep. 11:12829, Eq. 13):

    $$L = -\log\frac{e^{-t_{l}/\tau_0}}{\sum_k e^{-t_k/\tau_0}}
          + \alpha\left(e^{t_{l}/\tau_1} - 1\right)$$

    with `t_l` the first spike time of the label's neuron. The earliest output wins.

    Args:
        t_first: `(*batch, n_classes)` first spike times [ms] (`first_spike_times`).
        labels: integer classes of shape `batch`.
        tau0: softmax temperature [ms], > 0.
        tau1: time constant of the regulariser [ms], > 0.
        alpha: strength of the regulariser, >= 0.
    """
    owner = "first_spike_cross_entropy"
    for name, v, lo in (("tau0", tau0, 0.0), ("tau1", tau1, 0.0)):
        if not (isinstance(v, (int, float)) and v > lo):
            raise ValueError(f"{owner}: {name} must be a number of ms > 0, got {v!r}")
    if not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise ValueError(f"{owner}: alpha must be a number >= 0, got {alpha!r}")
    t = jnp.asarray(t_first)
    logits = -t / tau0
    labels = _labels(owner, labels, logits)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    t_label = jnp.take_along_axis(t, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(ce + alpha * (jnp.exp(t_label / tau1) - 1.0))


def first_spike_accuracy(t_first: ArrayLike, labels: ArrayLike) -> Float[Array, ""]:
    """Fraction of trials whose earliest output neuron is the label's (ties: lower index)."""
    t = jnp.asarray(t_first)
    labels = _labels("first_spike_accuracy", labels, t)
    return jnp.mean((jnp.argmin(t, axis=-1) == labels).astype(t.dtype))


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
