r"""The Brette et al. (2007) COBA and CUBA benchmark networks: parameters and spike statistics.

Both networks (Vogels and Abbott 2005; Brette et al. 2007) have N = 4000 leaky
integrate-and-fire neurons, the first 3200 excitatory and the last 800 inhibitory, every
ordered pair connected with probability 0.02 (Brian2's `connect(p=0.02)` from each source
population onto the whole network, self-connections included), dt = 0.1 ms. Units: ms, mV,
pF, nS.

**COBA**, the formulation of the published simulator speed comparisons (Brian 1's COBA
example, BrainPy's Brian2/NEST comparisons), forward Euler:

$$\tau_m \dot v = g_e (E_{exc} - v) + g_i (E_{inh} - v) - (v - E_L) + I,\qquad
\tau_{exc} \dot g_e = -g_e,\qquad \tau_{inh} \dot g_i = -g_i$$

with $g_e, g_i$ in units of $g_L$ (a spike adds `w_exc` = 6 nS / 10 nS = 0.6 or `w_inh` =
67 nS / 10 nS = 6.7), a constant drive $I$ = 20 mV, spike when $v > V_{th}$, reset to
$V_{reset}$, $v$ clamped for $t_{ref}$; initial $v \sim N(-55, 5)$ mV, $g_e = g_i = 0$.

**CUBA**, Brian2's CUBA example, integrated exactly (the equations are linear):

$$\tau_m \dot v = g_e + g_i - (v - E_L),\qquad \tau_{exc} \dot g_e = -g_e,\qquad
\tau_{inh} \dot g_i = -g_i$$

with $g_e, g_i$ in mV (a spike adds `w_exc` = 1.62 mV or `w_inh` = -9 mV), no external
drive (the rest potential $E_L$ = -49 mV lies above threshold), spike when $v > V_{th}$,
reset, clamp as above; initial $v$ uniform in $[V_{reset}, V_{th})$, $g_e = g_i = 0$.

The networks are chaotic, so implementations are compared through `spike_stats` over
several seeds, never spike by spike.
"""

import numpy as np

__all__ = ["COBA", "CUBA", "MODELS", "spike_stats"]

COBA = {
    "n_exc": 3200,
    "n_inh": 800,
    "p_conn": 0.02,
    "dt": 0.1,  # ms
    "e_l": -60.0,  # mV
    "v_th": -50.0,
    "v_reset": -60.0,
    "t_ref": 5.0,  # ms
    "c_m": 200.0,  # pF
    "g_l": 10.0,  # nS (tau_m = c_m / g_l)
    "tau_m": 20.0,  # ms
    "tau_exc": 5.0,
    "tau_inh": 10.0,
    "e_exc": 0.0,  # mV
    "e_inh": -80.0,
    "w_exc_ns": 6.0,  # nS
    "w_inh_ns": 67.0,
    "w_exc": 0.6,  # the same jumps in units of g_l
    "w_inh": 6.7,
    "i_ext": 20.0,  # mV, constant drive (I / g_l)
    "v0_mean": -55.0,  # mV, initial v ~ N(v0_mean, v0_std)
    "v0_std": 5.0,
}

CUBA = {
    "n_exc": 3200,
    "n_inh": 800,
    "p_conn": 0.02,
    "dt": 0.1,  # ms
    "e_l": -49.0,  # mV
    "v_th": -50.0,
    "v_reset": -60.0,
    "t_ref": 5.0,  # ms
    "tau_m": 20.0,
    "tau_exc": 5.0,
    "tau_inh": 10.0,
    "w_exc": 1.62,  # mV, voltage jumps (NEST: 16.2 pA and -139.5 pA currents, C = 200 pF)
    "w_inh": -9.0,
    # initial v uniform in [v_reset, v_th)
}

MODELS = {"coba": COBA, "cuba": CUBA}


def spike_stats(
    spike_idx: np.ndarray,
    spike_t_ms: np.ndarray,
    n_exc: int,
    n_inh: int,
    duration_ms: float,
    t_skip_ms: float = 0.0,
) -> dict[str, float | int]:
    """Population statistics of the spikes with `t_skip_ms <= t < duration_ms`.

    Neurons `[0, n_exc)` are excitatory, `[n_exc, n_exc + n_inh)` inhibitory. Returns:

    - `rate_exc_hz`, `rate_inh_hz`, `rate_hz`: mean firing rate of the excitatory, inhibitory
      and all neurons (silent neurons included) over the window;
    - `cv_isi`: the mean, over neurons with at least 3 spikes in the window (`n_cv` of them),
      of the coefficient of variation of their inter-spike intervals (population standard
      deviation, `ddof=0`, over the mean); NaN when no neuron qualifies;
    - `n_spikes`: spikes in the window.
    """
    n = int(n_exc) + int(n_inh)
    window_s = (float(duration_ms) - float(t_skip_ms)) / 1000.0
    if window_s <= 0:
        raise ValueError(f"t_skip_ms ({t_skip_ms}) must be below duration_ms ({duration_ms})")
    idx = np.asarray(spike_idx, dtype=np.int64).ravel()
    t = np.asarray(spike_t_ms, dtype=np.float64).ravel()
    if idx.shape != t.shape:
        raise ValueError(f"spike_idx {idx.shape} and spike_t_ms {t.shape} differ in shape")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"spike indices must lie in [0, {n}), got [{idx.min()}, {idx.max()}]")
    keep = (t >= t_skip_ms) & (t < duration_ms)
    idx, t = idx[keep], t[keep]

    counts = np.bincount(idx, minlength=n)
    # Intervals between consecutive spikes of the same neuron, in (neuron, time) order.
    order = np.lexsort((t, idx))
    idx, t = idx[order], t[order]
    same = idx[1:] == idx[:-1]
    owner = idx[1:][same]
    isi = np.diff(t)[same]
    n_isi = np.bincount(owner, minlength=n)
    mean = np.bincount(owner, isi, minlength=n) / np.maximum(n_isi, 1)
    var = np.bincount(owner, (isi - mean[owner]) ** 2, minlength=n) / np.maximum(n_isi, 1)
    qualifies = counts >= 3
    cv = np.sqrt(var[qualifies]) / mean[qualifies]

    return {
        "rate_exc_hz": float(counts[:n_exc].sum() / (n_exc * window_s)),
        "rate_inh_hz": float(counts[n_exc:].sum() / (n_inh * window_s)),
        "rate_hz": float(counts.sum() / (n * window_s)),
        "cv_isi": float(cv.mean()) if cv.size else float("nan"),
        "n_cv": int(qualifies.sum()),
        "n_spikes": int(counts.sum()),
    }
