"""Example: learn synaptic delays so that a population fires a target spike-time pattern.

Eight input neurons spike together at 2 ms. Each drives one LIF neuron through a
conductance synapse (`nj.Exponential(4 ms)`, reversal 0 mV) whose delay is learnable
(`nj.Projection(..., learnable_delays=True)`): a delay of `(k + f) dt` delivers `(1 - f) w`
after `k` steps and `f w` after `k + 1` steps, so the synaptic conductance, and through it
the membrane and its spike times, depend smoothly on the delays between whole steps.

The target pattern is the one that delays of 1.5, 2.2, ..., 6.4 ms produce: the output
neurons then fire one after the other. Training starts from 4.03 ms for every synapse and
minimises, with optax's Adam, the squared distance between the synaptic conductance traces
and the target ones (the conductance of an exponential synapse is a van Rossum filter of
the arriving spikes). It starts off the grid: at a whole step the loss has a kink (the
interpolation changes slot pair), and a gradient there is the one-sided derivative towards
longer delays.

Run: `python examples/learn_delays.py [--steps N] [--lr LR]`. Prints the loss, the delays
and the output spike times (ms) before and after training; the learnt delays reach the
targets to within a few hundredths of a ms and the spike times match the target's.
"""

import argparse
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import neurojax as nj

DT = 0.1  # ms
N = 8
N_STEPS = 160
TARGET_DELAYS = np.linspace(1.5, 6.4, N)  # ms
INPUT_STEP = 20  # the inputs spike during step 20 (dated 2.1 ms)


class Replay(nj.network.SpikeSource):
    """Spike source replaying a fixed 0/1 table `(n_steps, n)`."""

    table: jax.Array

    def init_state(self, shape, *, key=None):
        return jnp.zeros(shape[:-1], jnp.int32)

    def step(self, state, current=None, dt=DT):
        return state + 1, self.table[state]

    def step_block(self, state, dt, *, size, padded_size, block, axis_name):
        raise NotImplementedError("Replay is not meant for shard_network")


def build(delays) -> nj.Network:
    """Inputs -> LIF, one learnable-delay conductance synapse each."""
    table = np.zeros((N_STEPS, N), np.float32)
    table[INPUT_STEP] = 1
    proj = nj.Projection(
        "in",
        "out",
        np.diag(np.full(N, 3.0, np.float32)),
        synapse=nj.Exponential(4.0),
        output=nj.ConductanceOutput(0.0),
        delay=np.asarray(delays, np.float64),
        learnable_delays=True,
        max_delay=8.0,
    )
    pops = {"in": (Replay(jnp.asarray(table)), N), "out": (nj.LIF(tau_m=10.0, t_ref=5.0), N)}
    return nj.Network(pops, [proj], dt=DT)


def run(net: nj.Network):
    """The conductance traces and output spikes, time first."""
    _, rec = nj.simulate(
        net,
        net.init_state(jax.random.key(0)),
        dt=DT,
        n_steps=N_STEPS,
        record=lambda s, o: {"g": s.synapses[0].g, "s": o["out"]},
    )
    return rec.g, rec.s


def first_spike_ms(spikes) -> np.ndarray:
    s = np.asarray(spikes)
    return np.where(s.any(0), (np.argmax(s, 0) + 1) * DT, np.nan)


def train(steps: int = 200, lr: float = 0.05):
    """Returns the learnt delays and the history of the loss."""
    target_g, _ = run(build(TARGET_DELAYS))
    net = build(np.full(N, 4.03))

    def loss(d):
        g, _ = run(eqx.tree_at(lambda m: m.projections[0].delay, net, d))
        return jnp.mean((g - target_g) ** 2)

    opt = optax.adam(lr)
    d = net.projections[0].delay
    state = opt.init(d)

    @jax.jit
    def update(d, state):
        value, grad = jax.value_and_grad(loss)(d)
        upd, state = opt.update(grad, state)
        return optax.apply_updates(d, upd), state, value

    history = []
    for _ in range(steps):
        d, state, value = update(d, state)
        history.append(float(value))
    return net, d, history


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    net, d, history = train(args.steps, args.lr)
    _, target_s = run(build(TARGET_DELAYS))
    _, before_s = run(net)
    _, after_s = run(eqx.tree_at(lambda m: m.projections[0].delay, net, d))
    np.set_printoptions(precision=2, suppress=True)
    print(f"loss: {history[0]:.3g} -> {history[-1]:.3g}")
    print("target delays [ms]:   ", TARGET_DELAYS)
    print("learnt delays [ms]:   ", np.asarray(d))
    print("target spikes [ms]:   ", first_spike_ms(target_s))
    print("spikes before [ms]:   ", first_spike_ms(before_s))
    print("spikes after [ms]:    ", first_spike_ms(after_s))


if __name__ == "__main__":
    main(sys.argv[1:])
