"""An independent float64 event-queue simulation of current-based LIF networks (NumPy and
Python floats, a heap of pending arrivals, threshold crossings by `scipy.optimize.brentq`),
the reference that the EventProp tests differentiate by central finite differences.

It shares no code with `neurojax._eventprop`: it reads the network's parameters as NumPy
arrays and integrates the same equations its own way.
"""

import heapq
import math

import numpy as np
from scipy.optimize import brentq


def _free(u, i, s, tau_m, tau_s, r):
    """Membrane after `s` ms of free evolution from (u, I)."""
    if i == 0.0:
        return u * math.exp(-s / tau_m)
    return u * math.exp(-s / tau_m) + r * i * tau_s / (tau_s - tau_m) * (
        math.exp(-s / tau_s) - math.exp(-s / tau_m)
    )


def _integral(u, i, s, tau_m, tau_s, r):
    val = u * tau_m * (1 - math.exp(-s / tau_m))
    if i != 0.0:
        c = r * i * tau_s / (tau_s - tau_m)
        val += c * (tau_s * (1 - math.exp(-s / tau_s)) - tau_m * (1 - math.exp(-s / tau_m)))
    return val


def _peak(u, i, s_max, tau_m, tau_s, r):
    """Largest value of the free trajectory on [0, s_max] and where the rise ends."""
    cands = [0.0, s_max]
    if i != 0.0:
        b = r * i * tau_s / (tau_s - tau_m)
        a = u - b
        if a != 0.0 and -(b * tau_m) / (a * tau_s) > 0:
            s = math.log(-(b * tau_m) / (a * tau_s)) / (1 / tau_s - 1 / tau_m)
            if 0 < s < s_max:
                cands.append(s)
    return cands


def _first_crossing(u, i, s_max, tau_m, tau_s, r, theta):
    if u >= theta:
        return 0.0
    pts = sorted(_peak(u, i, s_max, tau_m, tau_s, r))
    prev = 0.0
    for s in pts[1:]:
        if _free(u, i, s, tau_m, tau_s, r) >= theta:
            f = lambda x: _free(u, i, x, tau_m, tau_s, r) - theta  # noqa: E731
            return brentq(f, prev, s, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
        prev = s
    return None


def simulate(pops, inputs, projs, t_max, readouts=()):
    """Run the network. `pops`: {name: dict(n, tau_m, tau_s or None (delta), r, v_th,
    v_reset, v_rest)} with per-neuron arrays; `inputs`: {name: list of spike-time lists};
    `projs`: list of dict(pre, post, w (n_pre, n_post), d (scalar or matrix), mask, delta).
    Returns spike times per population (lists per neuron), v_max, v_integral."""
    names = list(pops)
    st = {}
    for name in names:
        p = pops[name]
        st[name] = dict(
            u=np.zeros(p["n"]),
            i=np.zeros(p["n"]),
            vmax=np.zeros(p["n"]),
            vint=np.zeros(p["n"]),
            spikes=[[] for _ in range(p["n"])],
        )
    heap, seq = [], 0

    def emit(pre, j, t):
        nonlocal seq
        for q, pr in enumerate(projs):
            if pr["pre"] != pre:
                continue
            d = np.asarray(pr["d"], float)
            for i in range(pr["w"].shape[1]):
                if pr["mask"][j, i]:
                    ti = t + (float(d) if d.ndim == 0 else d[j, i])
                    heapq.heappush(heap, (ti, seq, q, j, i))
                    seq += 1

    for name, trains in inputs.items():
        for j, train in enumerate(trains):
            for t in train:
                if np.isfinite(t):
                    emit(name, j, float(t))
    t = 0.0

    def advance(dt):
        for name in names:
            p, s = pops[name], st[name]
            for k in range(p["n"]):
                tm, ts, r = (
                    p["tau_m"][k],
                    p["tau_s"][k] if p["tau_s"] is not None else 1.0,
                    p["r"][k],
                )
                u0, i0 = s["u"][k], s["i"][k]
                for c in _peak(u0, i0, dt, tm, ts, r):
                    s["vmax"][k] = max(s["vmax"][k], _free(u0, i0, c, tm, ts, r))
                s["vint"][k] += _integral(u0, i0, dt, tm, ts, r)
                s["u"][k] = _free(u0, i0, dt, tm, ts, r)
                s["i"][k] = i0 * math.exp(-dt / ts)

    while True:
        t_arr = heap[0][0] if heap else math.inf
        bound = min(t_arr, t_max)
        best = (math.inf, None, None)
        for name in names:
            p, s = pops[name], st[name]
            if name in readouts or p["tau_s"] is None:
                continue
            for k in range(p["n"]):
                th = p["v_th"][k] - p["v_rest"][k]
                c = _first_crossing(
                    s["u"][k], s["i"][k], bound - t, p["tau_m"][k], p["tau_s"][k], p["r"][k], th
                )
                if c is not None and t + c < best[0]:
                    best = (t + c, name, k)
        if best[1] is not None and best[0] < t_arr:
            t_new, name, k = best
            advance(t_new - t)
            t = t_new
            p = pops[name]
            st[name]["u"][k] = p["v_reset"][k] - p["v_rest"][k]
            st[name]["spikes"][k].append(t)
            emit(name, k, t)
            continue
        if t_arr > t_max:
            advance(t_max - t)
            break
        ta, _, q, j, i = heapq.heappop(heap)
        advance(ta - t)
        t = ta
        pr = projs[q]
        p, s = pops[pr["post"]], st[pr["post"]]
        w = pr["w"][j, i]
        if pr["delta"]:
            s["u"][i] += p["r"][i] * w / p["tau_m"][i]
            th = p["v_th"][i] - p["v_rest"][i]
            if pr["post"] not in readouts and s["u"][i] >= th:
                s["u"][i] = p["v_reset"][i] - p["v_rest"][i]
                s["spikes"][i].append(t)
                emit(pr["post"], i, t)
        else:
            s["i"][i] += w
    out = {}
    for name in names:
        vr = np.asarray(pops[name]["v_rest"], float)
        out[name] = dict(
            spikes=st[name]["spikes"],
            v_max=st[name]["vmax"] + vr,
            v_integral=st[name]["vint"] + vr * t_max,
        )
    return out
