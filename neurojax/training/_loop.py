"""A thin optax training loop: a jitted, vmapped train step and a `fit` driver.

Nothing here is required: a user's own loop around `jax.value_and_grad` of a function that
calls `simulate` or a layer works the same way. These helpers only remove the boilerplate
(partitioning trainable leaves, batching with vmap, averaging metrics, shuffling, progress).
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax

from .._validation import check_positive_int
from ._layers import trainable

__all__ = ["make_train_step", "init_opt_state", "fit", "FitResult"]


def _split_loss(out: Any, owner: str):
    """A loss function returns a scalar, or (scalar, {name: metric})."""
    if isinstance(out, tuple):
        if len(out) != 2 or not isinstance(out[1], dict):
            raise TypeError(
                f"{owner}: loss_fn must return a scalar loss or (loss, dict of metrics), got a "
                f"tuple of {len(out)} items"
            )
        return out
    return out, {}


def _check_loss_shape(loss, owner: str, per_example: bool):
    if jnp.shape(loss) != ():
        kind = "one example" if per_example else "the batch"
        raise ValueError(
            f"{owner}: loss_fn must return a scalar loss for {kind}, got shape {jnp.shape(loss)}"
        )


def init_opt_state(
    optimizer: optax.GradientTransformation, model: Any, filter_spec: Any = None
) -> optax.OptState:
    """The optimizer state for the trainable leaves of `model` (`trainable(model)` by default)."""
    spec = trainable(model) if filter_spec is None else filter_spec
    return optimizer.init(eqx.filter(model, spec))


def make_train_step(
    loss_fn: Callable,
    optimizer: optax.GradientTransformation,
    *,
    per_example: bool = True,
    filter_spec: Any = None,
) -> Callable:
    """Build a jitted training step `step(model, opt_state, batch, key)`.

    The step evaluates the loss and its gradient with respect to the trainable leaves of
    `model` (`trainable(model)` unless `filter_spec` is given), applies one optax update, and
    returns `(model, opt_state, metrics)`, with `metrics` a dict of scalars: `loss`,
    `grad_norm` (global norm of the gradient) and whatever `loss_fn` reports.

    Args:
        loss_fn: `loss_fn(model, example, key)` returning a scalar loss or
            `(loss, {name: scalar})`. With `per_example=True` (default) it sees one example
            (the batch's leading axis removed) and is vmapped over the batch with one key per
            example; losses and metrics are averaged. With `per_example=False` it receives
            the whole batch and the key.
        optimizer: any `optax.GradientTransformation`.
        per_example: see `loss_fn`.
        filter_spec: a boolean PyTree like the model selecting the leaves to train.

    The optax update is traced under JAX's standard dtype promotion: optax combines float32
    moments with int32 step counts, which `jax_numpy_dtype_promotion="strict"` rejects. A
    hand-written loop in strict mode needs the same `with jax.numpy_dtype_promotion(
    "standard"):` around `optimizer.update`.

    Example:
    ```python
    def loss_fn(net, example, key):
        x, label = example
        out = net(nj.training.current_encode(x, 25))
        return nj.training.max_membrane_cross_entropy(out[:, None], label[None])

    opt = optax.adam(1e-3)
    step = nj.training.make_train_step(loss_fn, opt)
    opt_state = nj.training.init_opt_state(opt, net)
    net, opt_state, metrics = step(net, opt_state, (xb, yb), jr.key(0))
    ```
    """
    owner = "make_train_step"
    if not callable(loss_fn):
        raise TypeError(f"{owner}: loss_fn must be callable, got {type(loss_fn).__name__}")
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(
            f"{owner}: optimizer must be an optax.GradientTransformation, got "
            f"{type(optimizer).__name__}"
        )
    if not isinstance(per_example, bool):
        raise TypeError(f"{owner}: per_example must be a bool, got {per_example!r}")

    @eqx.filter_jit
    def step(model, opt_state, batch, key):
        spec = trainable(model) if filter_spec is None else filter_spec
        params, static = eqx.partition(model, spec)

        def objective(p):
            m = eqx.combine(p, static)
            if per_example:
                sizes = {jnp.shape(x)[0] for x in jtu.tree_leaves(batch)}
                n = sizes.pop()
                keys = jr.split(key, n)

                def one(example, k):
                    loss, aux = _split_loss(loss_fn(m, example, k), "loss_fn")
                    _check_loss_shape(loss, owner, per_example)
                    return loss, aux

                losses, aux = jax.vmap(one)(batch, keys)
                return jnp.mean(losses), jtu.tree_map(jnp.mean, aux)
            loss, aux = _split_loss(loss_fn(m, batch, key), "loss_fn")
            _check_loss_shape(loss, owner, per_example)
            return loss, aux

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
        # optax mixes float32 moments with int32 step counts (adam's bias correction), which
        # jax's strict dtype promotion rejects; the update is traced under standard promotion
        # so that users (and this project's tests) may run their models in strict mode.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            grad_norm = optax.tree.norm(grads)
        metrics = {"loss": loss, "grad_norm": grad_norm, **aux}
        return eqx.combine(params, static), opt_state, metrics

    def checked(model, opt_state, batch, key):
        leaves = jtu.tree_leaves(batch)
        if not leaves:
            raise ValueError(f"{owner}: batch must contain at least one array, got {batch!r}")
        if per_example:
            sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
            if len(sizes) != 1 or None in sizes:
                raise ValueError(
                    f"{owner}: with per_example=True every array in batch needs the same "
                    f"leading batch axis; got shapes {[np.shape(x) for x in leaves]}"
                )
        return step(model, opt_state, batch, key)

    checked.jitted = step
    return checked


@dataclasses.dataclass
class FitResult:
    """What `fit` returns besides the model.

    Attributes:
        opt_state: the optimizer state after the last step (to continue training).
        history: one dict per epoch: `epoch`, `steps`, `time_s`, the mean of every train
            metric over the epoch's batches (`loss`, `grad_norm`, ...), and the metrics
            returned by `eval_fn` (prefixed `eval_` when a train metric has the same name).
    """

    opt_state: Any
    history: list


def _examples(owner: str, data) -> int:
    leaves = jtu.tree_leaves(data)
    if not leaves:
        raise ValueError(f"{owner}: data must contain at least one array, got {data!r}")
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"{owner}: every array in data needs the same leading example axis; got shapes "
            f"{[np.shape(x) for x in leaves]}"
        )
    return sizes.pop()


def fit(
    model: Any,
    optimizer: optax.GradientTransformation,
    loss_fn: Callable,
    data: Any,
    *,
    key: jax.Array,
    epochs: int = 1,
    batch_size: int = 32,
    per_example: bool = True,
    filter_spec: Any = None,
    eval_fn: Callable | None = None,
    opt_state: Any = None,
    progress: bool = False,
    callback: Callable | None = None,
) -> tuple[Any, "FitResult"]:
    """Train `model` on `data` for `epochs` passes of shuffled mini-batches.

    Each epoch draws a permutation of the examples from `key`, cuts it into batches of
    `batch_size` (the last batch holds the remainder, so every example is used each epoch;
    it compiles once more when its size differs) and applies `make_train_step`.

    Args:
        model: the model (any PyTree; neurojax layers train their weights by default).
        optimizer: an optax transformation.
        loss_fn: `loss_fn(model, example, key)` as in `make_train_step`.
        data: a PyTree of arrays sharing a leading example axis, for example `(x, labels)`.
        key: key for shuffling and for the per-example keys passed to `loss_fn`.
        epochs: number of passes (positive int).
        batch_size: examples per step, between 1 and the number of examples.
        per_example: as in `make_train_step`.
        filter_spec: leaves to train (default `trainable(model)`).
        eval_fn: optional `eval_fn(model) -> {name: scalar}` called after each epoch.
        opt_state: a state to continue from (default: a fresh `optimizer.init`).
        progress: show a progress bar (tqdm) with the running loss.
        callback: optional `callback(epoch, record)` called with each epoch's history dict;
            returning `True` stops training early.

    Returns:
        `(model, FitResult)`.
    """
    owner = "fit"
    n = _examples(owner, data)
    epochs = check_positive_int(owner, "epochs", epochs)
    batch_size = check_positive_int(owner, "batch_size", batch_size)
    if batch_size > n:
        raise ValueError(f"{owner}: batch_size={batch_size} exceeds the {n} examples in data")
    if key is None:
        raise ValueError(f"{owner}: key is required (shuffling and per-example keys), got None")
    if eval_fn is not None and not callable(eval_fn):
        raise TypeError(f"{owner}: eval_fn must be callable or None, got {eval_fn!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"{owner}: callback must be callable or None, got {callback!r}")
    step = make_train_step(loss_fn, optimizer, per_example=per_example, filter_spec=filter_spec)
    if opt_state is None:
        opt_state = init_opt_state(optimizer, model, filter_spec)
    data = jtu.tree_map(jnp.asarray, data)
    steps_per_epoch = -(-n // batch_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs * steps_per_epoch, unit="step", desc="fit", dynamic_ncols=True)
    history = []
    try:
        for epoch in range(epochs):
            key, k_perm, k_steps = jr.split(key, 3)
            order = jr.permutation(k_perm, n)
            step_keys = jr.split(k_steps, steps_per_epoch)
            t0 = time.perf_counter()
            collected = []
            for b in range(steps_per_epoch):
                idx = order[b * batch_size : (b + 1) * batch_size]
                batch = jtu.tree_map(lambda x, i=idx: x[i], data)
                model, opt_state, metrics = step.jitted(model, opt_state, batch, step_keys[b])
                collected.append((metrics, int(idx.shape[0])))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"epoch {epoch + 1}, loss {float(metrics['loss']):.4g}")
            host = jax.device_get([m for m, _ in collected])
            weights = np.array([w for _, w in collected], np.float64)
            record: dict[str, Any] = {"epoch": epoch + 1, "steps": steps_per_epoch}
            for name in host[0]:
                values = np.array([float(m[name]) for m in host])
                record[name] = float(np.sum(values * weights) / weights.sum())
            record["time_s"] = time.perf_counter() - t0
            if eval_fn is not None:
                for name, value in dict(eval_fn(model)).items():
                    record[f"eval_{name}" if name in record else name] = float(value)
            history.append(record)
            if callback is not None and callback(epoch + 1, record) is True:
                break
    finally:
        if bar is not None:
            bar.close()
    return model, FitResult(opt_state=opt_state, history=history)
