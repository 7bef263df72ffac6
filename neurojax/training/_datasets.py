"""Small classification data sets generated on the spot, with time-to-first-spike coding.

- `yin_yang`: the Yin-Yang data set of Kriener, Göltz and Petrovici (2022, NICE '22,
  doi:10.1145/3517343.3517380), generated from its defining formula (no download).
- `latency_digits`: scikit-learn's 8x8 digits, one spike per pixel whose latency falls
  with the pixel's intensity.
- `ttfs_encode`: features in [0, 1] to one spike time each (earlier for larger values
  or later, as chosen), with an optional bias spike.
"""

import numpy as np
from jaxtyping import Array, Float

__all__ = ["yin_yang", "latency_digits", "ttfs_encode"]


def _yin_yang_class(x: np.ndarray, y: np.ndarray, r_small: float, r_big: float) -> np.ndarray:
    d_right = np.hypot(x - 1.5 * r_big, y - r_big)
    d_left = np.hypot(x - 0.5 * r_big, y - r_big)
    yin = (
        (d_right <= r_small)
        | ((d_left > r_small) & (d_left <= 0.5 * r_big))
        | ((y > r_big) & (d_right > 0.5 * r_big))
    )
    dots = (d_right < r_small) | (d_left < r_small)
    return np.where(dots, 2, yin.astype(np.int64))


def yin_yang(
    n: int, *, seed: int = 0, r_small: float = 0.1, r_big: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    r"""The Yin-Yang data set (Kriener et al. 2022): `n` points, 3 balanced classes.

    A point `(x, y)` is drawn uniformly in the disc of radius `r_big` centred on
    `(r_big, r_big)`; its class is yin (0), yang (1) or dot (2) by the published formula:
    with `d_l`, `d_r` the distances to the dots' centres `(r_big/2, r_big)` and
    `(3 r_big/2, r_big)`, it is a dot (2) if `d_l < r_small` or `d_r < r_small`, else 1 if
    `d_r <= r_small`, or `r_small < d_l <= r_big/2`, or `y > r_big` and `d_r > r_big/2`,
    else 0. Each sample first draws a goal class uniformly and then rejects points until
    one of that class comes up, so the classes are balanced, as in the original generator.
    The features are `(x, y, 1 - x, 1 - y)` (the mirrored pair lets neurons without an
    intrinsic bias solve it).

    Args:
        n: number of samples (> 0).
        seed: seed of the NumPy generator (training and test sets: different seeds).
        r_small: radius of the dots, in (0, r_big / 2).
        r_big: radius of the disc.

    Returns:
        `(features, labels)`: float64 array `(n, 4)` in [0, 2 r_big] and int64 labels `(n,)`.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"yin_yang: n must be a positive int, got {n!r}")
    if not (0 < r_big and 0 < r_small < 0.5 * r_big):
        raise ValueError(
            f"yin_yang: need 0 < r_small < r_big / 2, got r_small={r_small!r}, r_big={r_big!r}"
        )
    rng = np.random.default_rng(seed)
    goal = rng.integers(0, 3, n)
    xs, ys = np.empty(n), np.empty(n)
    todo = np.arange(n)
    while todo.size:
        x, y = rng.uniform(0.0, 2.0 * r_big, (2, todo.size))
        inside = np.hypot(x - r_big, y - r_big) <= r_big
        ok = inside & (_yin_yang_class(x, y, r_small, r_big) == goal[todo])
        xs[todo[ok]], ys[todo[ok]] = x[ok], y[ok]
        todo = todo[~ok]
    feats = np.stack([xs, ys, 1.0 - xs, 1.0 - ys], axis=1)
    return feats, goal.astype(np.int64)


def ttfs_encode(
    features: np.ndarray,
    *,
    t_early: float,
    t_late: float,
    bias_time: float | None = None,
    larger_earlier: bool = False,
) -> Float[Array, "batch n 1"]:
    """One spike per feature at `t_early + f (t_late - t_early)` ms (`f` in [0, 1]), or at
    `t_late - f (t_late - t_early)` with `larger_earlier=True`; a feature that is not finite
    raises. With `bias_time`, one more input neuron spikes at that time in every sample.

    Returns spike times of shape `(batch, n_features [+ 1], 1)`, the layout of
    `eventprop_run`'s `input_spikes` for one trial per row (vmap over the batch).
    """
    f = np.asarray(features, float)
    if f.ndim != 2:
        raise ValueError(f"ttfs_encode: features must have shape (batch, n), got {f.shape}")
    if not np.all(np.isfinite(f)) or f.min() < 0 or f.max() > 1:
        raise ValueError(
            f"ttfs_encode: features must lie in [0, 1], got [{np.nanmin(f)}, {np.nanmax(f)}]"
        )
    if not (0 <= t_early < t_late):
        raise ValueError(f"ttfs_encode: need 0 <= t_early < t_late, got {t_early}, {t_late}")
    t = t_late - f * (t_late - t_early) if larger_earlier else t_early + f * (t_late - t_early)
    if bias_time is not None:
        if not bias_time >= 0:
            raise ValueError(f"ttfs_encode: bias_time must be >= 0 ms, got {bias_time}")
        t = np.concatenate([t, np.full((t.shape[0], 1), float(bias_time))], axis=1)
    return t[:, :, None]


def latency_digits(
    *, t_early: float = 2.0, t_late: float = 20.0, threshold: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1797 images, 10 classes), latency coded.

    Pixel intensity `p` in [0, 16] spikes once at `t_late - (p / 16) (t_late - t_early)` ms:
    brighter pixels fire earlier; pixels at or below `threshold` do not fire (`+inf`).

    Returns:
        `(times, labels)`: `(1797, 64, 1)` spike times and `(1797,)` int64 labels.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    p = d.data / 16.0
    t = t_late - p * (t_late - t_early)
    t = np.where(d.data > threshold, t, np.inf)
    return t[:, :, None], d.target.astype(np.int64)
