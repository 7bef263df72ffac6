"""Readouts and losses for spiking networks.

All functions take time-major arrays (`(t, *batch, n)`, as `simulate` records them) and
return a scalar averaged over the batch, so they compose with `jax.value_and_grad`. Class
labels are integer arrays of shape `batch`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, Int

from .._validation import is_concrete

__all__ = [
    "spike_counts",
    "firing_rates",
    "spike_count_cross_entropy",
    "max_membrane_cross_entropy",
    "rate_mse",
    "rate_regularizer",
    "accuracy",
]


def _time_major(owner: str, name: str, x: ArrayLike, min_ndim: int = 2) -> Float[Array, "..."]:
    x = jnp.asarray(x)
    if x.ndim < min_ndim:
        raise ValueError(
            f"{owner}: {name} must be time-major with shape (t, *batch, n) (at least "
            f"{min_ndim} dimensions), got shape {x.shape}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def _labels(owner: str, labels: ArrayLike, logits: Float[Array, "*batch c"]) -> Int[Array, "..."]:
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{owner}: labels must be integers (class indices), got {labels.dtype}")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"{owner}: labels of shape {labels.shape} do not match the batch shape "
            f"{logits.shape[:-1]} of outputs with {logits.shape[-1]} classes"
        )
    n_classes = logits.shape[-1]
    if is_concrete(labels):
        a = np.asarray(labels)
        if a.size and (a.min() < 0 or a.max() >= n_classes):
            raise ValueError(
                f"{owner}: labels must lie in [0, {n_classes - 1}] for {n_classes} output "
                f"neurons, got values from {a.min()} to {a.max()}"
            )
    return labels


def _check_dt(owner: str, dt) -> float:
    if not (isinstance(dt, (int, float)) and dt > 0 and np.isfinite(dt)):
        raise ValueError(f"{owner}: dt must be a positive number of ms, got {dt!r}")
    return float(dt)


def spike_counts(spikes: ArrayLike) -> Float[Array, "*batch n"]:
    """Spikes summed over the leading time axis."""
    return _time_major("spike_counts", "spikes", spikes).sum(axis=0)


def firing_rates(spikes: ArrayLike, *, dt: float) -> Float[Array, "*batch n"]:
    """Mean firing rate [Hz] of each neuron over the run; `dt` [ms] is the step."""
    dt = _check_dt("firing_rates", dt)
    return _time_major("firing_rates", "spikes", spikes).mean(axis=0) * (1000.0 / dt)


def spike_count_cross_entropy(
    spikes: ArrayLike, labels: ArrayLike, *, scale: float = 1.0
) -> Float[Array, ""]:
    """Softmax cross-entropy with each output neuron's spike count as its logit.

    `logits = scale * sum_t spikes[t]`; the loss is averaged over the batch. Gradients reach
    the network through the spikes' surrogate derivatives.

    Args:
        spikes: output spikes, shape `(t, *batch, n_classes)`.
        labels: integer class indices of shape `batch`, in `[0, n_classes)`.
        scale: factor applied to the counts (an inverse temperature), > 0.
    """
    owner = "spike_count_cross_entropy"
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"{owner}: scale must be a positive number, got {scale!r}")
    logits = scale * spike_counts(spikes)
    labels = _labels(owner, labels, logits)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def max_membrane_cross_entropy(v: ArrayLike, labels: ArrayLike) -> Float[Array, ""]:
    """Softmax cross-entropy with each output's maximum membrane potential over time as logit.

    The usual readout of non-spiking leaky output units (`LeakyReadout`), as in Zenke and
    Vogels (2021, Neural Comput 33:899) and Cramer et al. (2022, IEEE TNNLS 33:2744).

    Args:
        v: membrane potentials, shape `(t, *batch, n_classes)`.
        labels: integer class indices of shape `batch`.
    """
    owner = "max_membrane_cross_entropy"
    logits = _time_major(owner, "v", v).max(axis=0)
    labels = _labels(owner, labels, logits)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def rate_mse(spikes: ArrayLike, target: ArrayLike, *, dt: float) -> Float[Array, ""]:
    """Mean squared error [Hz^2] between the neurons' firing rates and `target` [Hz].

    Args:
        spikes: spikes of shape `(t, *batch, n)`.
        target: target rates [Hz], broadcastable to `(*batch, n)` (a scalar, one value per
            neuron, or one per trial and neuron).
        dt: time step [ms].
    """
    owner = "rate_mse"
    rates = firing_rates(spikes, dt=dt)
    target = jnp.asarray(target, dtype=rates.dtype)
    try:
        jnp.broadcast_shapes(target.shape, rates.shape)
    except ValueError:
        raise ValueError(
            f"{owner}: target of shape {target.shape} does not broadcast to the rates of shape "
            f"{rates.shape}"
        ) from None
    return jnp.mean((rates - target) ** 2)


def rate_regularizer(
    spikes: ArrayLike,
    *,
    dt: float,
    lower: float | None = None,
    upper: float | None = None,
) -> Float[Array, ""]:
    """Penalty [Hz^2] on firing rates outside `[lower, upper]` Hz.

    `mean(relu(lower - r)^2) + mean(relu(r - upper)^2)` over neurons and trials, with `r`
    each neuron's rate over the run. A lower bound keeps neurons from falling silent (a
    silent neuron passes no surrogate gradient in spike-count losses); an upper bound keeps
    activity sparse. In the spirit of the activity regularisers of Zenke and Vogels (2021).
    Multiply by a strength of your choice and add it to the task loss.

    Args:
        spikes: spikes of shape `(t, *batch, n)`.
        dt: time step [ms].
        lower: lower bound [Hz] or `None`.
        upper: upper bound [Hz] or `None`; at least one bound is required.
    """
    owner = "rate_regularizer"
    if lower is None and upper is None:
        raise ValueError(f"{owner}: give lower, upper or both (rates in Hz); got neither")
    for name, b in (("lower", lower), ("upper", upper)):
        if b is not None and not (isinstance(b, (int, float)) and b >= 0 and np.isfinite(b)):
            raise ValueError(f"{owner}: {name} must be a rate >= 0 Hz or None, got {b!r}")
    if lower is not None and upper is not None and lower > upper:
        raise ValueError(f"{owner}: lower={lower} must not exceed upper={upper}")
    r = firing_rates(spikes, dt=dt)
    loss = jnp.zeros((), r.dtype)
    if lower is not None:
        loss = loss + jnp.mean(jax.nn.relu(lower - r) ** 2)
    if upper is not None:
        loss = loss + jnp.mean(jax.nn.relu(r - upper) ** 2)
    return loss


def accuracy(outputs: ArrayLike, labels: ArrayLike, *, readout: str = "count") -> Float[Array, ""]:
    """Fraction of trials whose predicted class equals the label.

    Args:
        outputs: time-major outputs `(t, *batch, n_classes)`: spikes for `readout="count"`
            (predicted class = most spikes, ties to the lower index) or membrane potentials
            for `readout="max"` (predicted class = highest peak potential).
        labels: integer class indices of shape `batch`.
        readout: `"count"` or `"max"`.
    """
    owner = "accuracy"
    if readout not in ("count", "max"):
        raise ValueError(f"{owner}: readout must be 'count' or 'max', got {readout!r}")
    x = _time_major(owner, "outputs", outputs)
    logits = x.sum(axis=0) if readout == "count" else x.max(axis=0)
    labels = _labels(owner, labels, logits)
    return jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(logits.dtype))
