"""First spike times and EventProp gradients of one small network from jaxsnn, stored for
tests/test_eventprop.py.

jaxsnn 0.3.0's event-based `LIF` (`jaxsnn/event/modules/lif/lif.py`) integrates
`tau_mem dV/dt = -V + I`, `tau_syn dI/dt = -I` exactly between events (`lif_exponential_flow`
in `jaxsnn/event/functional/lif/dynamics.py`, a matrix exponential) and a `Linear` weight `w`
makes `I` jump by `w` (`transition` in `jaxsnn/event/functional/lif/transition.py`): the
same equations, units and weight convention as neurojax's `nj.LIF` (r_m = 1) with
`nj.Exponential`. But its next spike time comes from `ttfs_solver`
(`jaxsnn/event/solver/lif_analytical.py`), which has closed forms for `tau_mem = tau_syn`
(Lambert W) and `tau_mem = 2 tau_syn` (a quadratic in `exp(-t / tau_mem)`) only and picks
one with `jax.lax.switch(round(tau_mem / tau_syn) - 1, ...)`; `lax.switch` clamps the index,
so any ratio of 2 or more gets the `tau_mem = 2 tau_syn` formula. At the eventax network's
tau_mem 20 ms, tau_syn 5 ms (ratio 4) jaxsnn's spike times are those of a 10 ms synapse
evaluated on a 5 ms synapse's state: wrong, and a neuron whose potential never reaches
threshold can still spike (`SINGLE_NEURON` below).

So the comparison is made where jaxsnn's solver is exact: the 3 -> 4 -> 2 network of
`eventprop_eventax.network()` with tau_mem 20 ms and tau_syn 10 ms, threshold 1, reset to
-1000 (one spike per neuron, as jaxsnn's examples do), float64, with both of jaxsnn's
gradient paths (`backprop_method="analytical"`: autodiff through the closed form, and
`"eventprop"`: its adjoint). The ratio-4 run and three single-neuron spike times (one input
spike of weight `w` at 1 ms) are stored too, to document the cause. The numbers go to
`tests/data/eventprop_jaxsnn.json`. Run in a virtualenv with jaxsnn:

    PYTHONPATH=. /work/venv-yinyang/bin/python -m benchmarks.reference.eventprop_jaxsnn
"""

import json
from pathlib import Path

import numpy as np

from benchmarks.reference.eventprop_eventax import T_MAX, network

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "eventprop_jaxsnn.json"
TAU_MEM = 20.0
V_RESET = -1000.0
N_STEPS = 20  # events per layer in jaxsnn's scan: 3 + 4 (hidden) and 4 + 2 (output) are used
# (tau_syn, backprop_method): the exact case with both gradient paths, then eventax's ratio 4
NETWORK_RUNS = ((10.0, "analytical"), (10.0, "eventprop"), (5.0, "analytical"))
# (tau_syn, w): peak potentials 2.0, 1.26 and 0.94 (the last never reaches threshold 1)
SINGLE_NEURON = ((10.0, 8.0), (5.0, 8.0), (5.0, 6.0))
T_SINGLE = 1.0  # the single neuron's input spike [ms]


def _spikes(times, idx):
    import jax.numpy as jnp
    from jaxsnn.event.types import Spike

    n = len(times)
    return Spike(
        time=jnp.asarray(times)[None],
        idx=jnp.asarray(idx)[None],
        current=jnp.zeros((1, n)),
        layer_idx=jnp.zeros((1, n), int),
        internal=jnp.ones((1, n), bool),
    )


def _params(tau_syn):
    from jaxsnn.event.modules import LIFParameters

    return LIFParameters(v_reset=V_RESET, v_th=1.0, tau_syn=tau_syn, tau_mem=TAU_MEM)


def network_values(tau_syn, method):
    import jax
    import jax.numpy as jnp
    from jaxsnn.event.loss import first_spike
    from jaxsnn.event.modules import LIF, Linear, Source
    from jaxsnn.event.topology import Topology

    w1, w2, t_in, c = network()
    params = _params(tau_syn)
    b = Topology(t_max=T_MAX, backprop_method=method)
    b.add(
        {
            "inp": Source(3),
            "lif1": LIF(4, N_STEPS, params),
            "lif2": LIF(2, N_STEPS, params),
            "syn1": Linear(pre_weights=w1),
            "syn2": Linear(pre_weights=w2),
        }
    )
    b.connect([("inp", "syn1"), ("syn1", "lif1"), ("lif1", "syn2"), ("syn2", "lif2")])
    init_fn, apply_fn = b.done()
    # jaxsnn's input queue is read in time order
    order = np.argsort(t_in[:, 0])
    sp = _spikes(t_in[order, 0], order)

    def ttfs(w):
        out = apply_fn({"inp": sp}, w)["lif2"]
        return jax.vmap(first_spike, in_axes=(0, None))(out, 2)[0]

    w = init_fn(jax.random.PRNGKey(0))
    assert np.array_equal(w["syn1"], w1) and np.array_equal(w["syn2"], w2)
    t = ttfs(w)
    g = jax.grad(lambda w: jnp.sum(jnp.asarray(c) * ttfs(w)))(w)
    return dict(
        tau_syn=tau_syn,
        backprop_method=method,
        ttfs=np.asarray(t).tolist(),
        grad_w1=np.asarray(g["syn1"]).tolist(),
        grad_w2=np.asarray(g["syn2"]).tolist(),
    )


def single_neuron_time(tau_syn, w):
    """Delay from the one input spike to the neuron's first spike [ms] (inf: none)."""
    import jax
    import jax.numpy as jnp
    from jaxsnn.event.loss import first_spike
    from jaxsnn.event.modules import LIF, Linear, Source
    from jaxsnn.event.topology import Topology

    b = Topology(t_max=T_MAX)
    b.add(
        {
            "inp": Source(1),
            "lif": LIF(1, 4, _params(tau_syn)),
            "syn": Linear(pre_weights=jnp.array([[w]])),
        }
    )
    b.connect([("inp", "syn"), ("syn", "lif")])
    init_fn, apply_fn = b.done()
    out = apply_fn({"inp": _spikes([T_SINGLE], [0])}, init_fn(jax.random.PRNGKey(0)))["lif"]
    return float(jax.vmap(first_spike, in_axes=(0, None))(out, 1)[0, 0]) - T_SINGLE


def main():
    import jax

    jax.config.update("jax_enable_x64", True)
    from importlib.metadata import version

    rows = [network_values(ts, m) for ts, m in NETWORK_RUNS]
    single = [dict(tau_syn=ts, w=w, t=single_neuron_time(ts, w)) for ts, w in SINGLE_NEURON]
    OUT.write_text(
        json.dumps(
            dict(
                jaxsnn=version("jaxsnn"),
                jax=version("jax"),
                command="PYTHONPATH=. python -m benchmarks.reference.eventprop_jaxsnn",
                t_max=T_MAX,
                tau_mem=TAU_MEM,
                v_reset=V_RESET,
                runs=rows,
                single_neuron=dict(t_input=T_SINGLE, runs=single),
            ),
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(dict(runs=rows, single_neuron=single)))


if __name__ == "__main__":
    main()
