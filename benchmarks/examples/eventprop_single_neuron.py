"""The single-neuron comparison of docs/concepts/exact-gradients.md: first spike time of one
LIF neuron (tau_m 20 ms, exponential synapse 5 ms, threshold 1) after one input spike at
1 ms through weight w, and its derivative by EventProp, by central finite differences of the
float64 event-queue reference (tests/test_eventprop_reference.py) and by a surrogate
gradient on the dt = 0.1 ms grid.

    PYTHONPATH=. python benchmarks/examples/eventprop_single_neuron.py
"""
# ruff: noqa: E402

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
import sys

import neurojax as nj
from neurojax import training as nt

sys.path.insert(0, "tests")
import test_eventprop_reference as ref

lif = nj.LIF(tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0)
syn = nj.Exponential(5.0)
T, DT = 40.0, 0.1


def net_of(w):
    return nt.EventNetwork(
        {"a": (lif, 1)},
        {"in": 1},
        [nt.EventProjection("in", "a", jnp.full((1, 1), w), synapse=syn)],
    )


def t_first_ep(w):
    rec = nt.eventprop_run(net_of(w), {"in": jnp.array([[1.0]])}, t_max=T)
    return nt.first_spike_times(rec.spike_times["a"], t_max=T)[0]


def t_first_ref(w):
    out = ref.simulate(
        {
            "a": dict(
                n=1,
                tau_m=np.array([20.0]),
                tau_s=np.array([5.0]),
                r=np.array([1.0]),
                v_th=np.array([1.0]),
                v_reset=np.array([0.0]),
                v_rest=np.array([0.0]),
            )
        },
        {"in": [[1.0]]},
        [
            dict(
                pre="in",
                post="a",
                w=np.array([[w]]),
                d=np.array(0.0),
                mask=np.array([[True]]),
                delta=False,
            )
        ],
        T,
    )
    s = out["a"]["spikes"][0]
    return s[0] if s else T


n = int(T / DT)
raster = jnp.zeros((n, 1)).at[int(1.0 / DT), 0].set(1.0)


def t_first_grid(w):
    # surrogate: the spike-time estimate sum_t t * s_t * (no earlier spike), on the grid
    def step(c, x):
        hs, g = c
        g, i = syn.step(g, x * w, DT)
        hs, s = lif.step(hs, i, DT)
        return (hs, g), s[0]

    _, s = jax.lax.scan(step, (lif.init_state(1), syn.init_state(1)), raster)
    t = (jnp.arange(n) + 1) * DT
    before = jnp.cumsum(s) - s
    first = s * (before == 0)
    return jnp.sum(first * t) + T * (1 - jnp.sum(first))


for w in (8.0, 12.0, 5.0):
    h = 1e-6
    fd = (t_first_ref(w + h) - t_first_ref(w - h)) / (2 * h)
    print(
        dict(
            w=w,
            t_exact=t_first_ref(w),
            t_eventprop=float(t_first_ep(w)),
            dt_dw_eventprop=float(jax.grad(t_first_ep)(w)),
            dt_dw_fd=fd,
            t_grid=float(t_first_grid(w)),
            dt_dw_surrogate=float(jax.grad(t_first_grid)(w)),
        )
    )
