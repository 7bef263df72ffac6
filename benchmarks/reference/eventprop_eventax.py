"""EventProp gradients of one small network from eventax, stored for tests/test_eventprop.py.

A 3 -> 4 -> 2 network of current-based LIF neurons (tau_m 20 ms, exponential synapses of
5 ms, threshold 1, reset to 0), weights and input spike times drawn from seed 3
(`network()`), float64. eventax (0.1.0, `FFEvNN` with its `LIF` neuron, diffrax ODE solving
with a root finder) gives the output neurons' first spike times (`ttfs`) and the gradient
of `sum(c * ttfs)` with respect to both weight matrices, at two solver step sizes. The
numbers go to `tests/data/eventprop_eventax.json`; the test checks that neurojax's exact
values lie where eventax's converge as its step shrinks. Run in a virtualenv with eventax:

    PYTHONPATH=. /work/venv-yinyang/bin/python -m benchmarks.reference.eventprop_eventax
"""

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "eventprop_eventax.json"
T_MAX = 30.0
STEPS = (0.01, 0.001)


def network():
    """Weights `(3, 4)` and `(4, 2)`, input spike times `(3, 1)` [ms], loss weights `c`."""
    rng = np.random.default_rng(3)
    w1 = rng.uniform(2.0, 6.0, (3, 4))
    w2 = rng.uniform(2.0, 6.0, (4, 2))
    t_in = rng.uniform(0.0, 5.0, (3, 1))
    c = rng.normal(size=2)
    return w1, w2, t_in, c


def eventax_values(step):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from eventax.evnn import FFEvNN
    from eventax.neuron_models.lif import LIF

    w1, w2, t_in, c = network()
    n_in, n_h = w1.shape
    n_o = w2.shape[1]
    n = n_h + n_o
    # eventax's weight matrix: rows are the neurons (hidden, output) then the inputs,
    # columns the neurons
    w = np.zeros((n + n_in, n))
    w[:n_h, n_h:] = w2
    w[n:, :n_h] = w1
    net = FFEvNN(
        layers=[n_h, n_o],
        in_size=n_in,
        neuron_model=LIF,
        max_solver_time=T_MAX,
        key=jax.random.PRNGKey(0),
        init_weights=jnp.asarray(w),
        init_bias=0.0,
        thresh=1.0,
        tsyn=5.0,
        tmem=20.0,
        vreset=0.0,
        dtype=jnp.float64,
        solver_stepsize=step,
    )
    t = jnp.asarray(t_in)
    ttfs = net.ttfs(t)
    g = eqx.filter_grad(lambda m: jnp.sum(jnp.asarray(c) * m.ttfs(t)))(net).neuron_model.weights
    return dict(
        solver_stepsize=step,
        ttfs=np.asarray(ttfs).tolist(),
        grad_w1=np.asarray(g[n:, :n_h]).tolist(),
        grad_w2=np.asarray(g[:n_h, n_h:]).tolist(),
    )


def main():
    import jax

    jax.config.update("jax_enable_x64", True)
    from importlib.metadata import version

    import eventax  # noqa: F401

    rows = [eventax_values(s) for s in STEPS]
    OUT.write_text(
        json.dumps(
            dict(
                eventax=version("eventax"),
                jax=version("jax"),
                command="PYTHONPATH=. python -m benchmarks.reference.eventprop_eventax",
                t_max=T_MAX,
                runs=rows,
            ),
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
