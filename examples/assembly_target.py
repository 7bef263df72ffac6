"""Example: learn stimulus-to-area synapses so that projection produces a chosen assembly.

An explicit-mode area A (n = 1000 neurons, cap k = 30, p = 0.1) receives a stimulus of 30
neurons. A projection is two steps of the assembly calculus: the stimulus fires into A, then
the stimulus and A's first assembly fire into A together. Which 30 neurons win is decided by
the stimulus weights (one total weight per neuron of A, `state.stimulus_weights`) and the
random recurrent synapses, which stay fixed.

The hard k-cap has no useful gradient, so training runs the same two steps with the smooth
relaxation `nj.assembly.soft_kcap` and minimises the Fenchel-Young loss
`nj.assembly.assembly_loss` between the second step's input and a randomly chosen target
assembly, with optax's Adam on the stimulus weights (kept positive through a softplus). After
training, the *hard* projection (`Brain.project`, real k-cap) is run with the learnt weights
and its assembly is compared with the target.

Run: `python examples/assembly_target.py [--steps N] [--seed S]`. Prints the loss and the
hard overlap with the target every few steps; the loss falls and the overlap reaches k.
"""

import argparse
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import neurojax as nj

N, K, P = 1000, 30, 0.1
TEMPERATURE = 0.5


def build(seed: int):
    brain = nj.assembly.Brain(
        areas={"A": (N, K)},
        stimuli={"s": K},
        p=P,
        beta=0.0,
        mode="explicit",
        key=jax.random.key(seed),
    )
    state = brain.init_state()
    target = jax.random.choice(jax.random.key(seed + 1), N, (K,), replace=False)
    return brain, state, target


def soft_projection(brain, state, w_stim):
    """The two projection steps with the soft cap: returns the second step's input."""
    w_aa = state.weights[("A", "A")]
    y1 = nj.assembly.soft_kcap(w_stim, K, TEMPERATURE)
    return w_stim + y1 @ w_aa


def hard_projection(brain, state, w_stim):
    """The same two steps with `Brain.project` (real k-cap); returns the final winners."""
    state = eqx.tree_at(lambda s: s.stimulus_weights, state, {("s", "A"): w_stim})
    state = brain.project(state, stimuli={"s": ["A"]}, plasticity=False)
    state = brain.project(state, stimuli={"s": ["A"]}, areas={"A": ["A"]}, plasticity=False)
    return state.winners["A"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"argument --steps: must be >= 1, got {args.steps}")

    brain, state, target = build(args.seed)
    w0 = state.stimulus_weights[("s", "A")]
    # softplus^-1 of the initial weights (+ a small floor: many are 0).
    theta = jnp.log(jnp.expm1(w0 + 0.05))

    def loss_fn(theta):
        w = jax.nn.softplus(theta)
        x = soft_projection(brain, state, w)
        return nj.assembly.assembly_loss(x, target, K, TEMPERATURE)

    opt = optax.adam(0.05)
    opt_state = opt.init(theta)

    @jax.jit
    def update(theta, opt_state):
        loss, grad = jax.value_and_grad(loss_fn)(theta)
        updates, opt_state = opt.update(grad, opt_state, theta)
        return optax.apply_updates(theta, updates), opt_state, loss

    def hard_overlap(theta):
        winners = hard_projection(brain, state, jax.nn.softplus(theta))
        return int(nj.assembly.overlap(winners, target))

    history = []
    print(f"{'step':>5}  {'loss':>10}  {'hard overlap':>12}")
    first_overlap = hard_overlap(theta)
    for step in range(args.steps):
        theta, opt_state, loss = update(theta, opt_state)
        history.append(float(loss))
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"{step:>5}  {float(loss):>10.4f}  {hard_overlap(theta):>9d}/{K}")
    result = {
        "loss_first": history[0],
        "loss_last": history[-1],
        "overlap_before": first_overlap,
        "overlap_after": hard_overlap(theta),
        "k": K,
    }
    print(result)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
