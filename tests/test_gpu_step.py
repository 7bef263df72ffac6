"""The per-step GPU path of a network (for networks too large for one program): the kernels a
COBA step costs, the vmapped step with no loop over trials, and the step's results.

On the GPU slots a step is: one Pallas kernel for the arrivals (every projection's kinetics,
and the ring's read slot zeroed), the input currents (XLA, one fusion per population), one
Pallas kernel per group for the neurons (the model's own `step`, spikes written in place, no
concatenation or split of the state), the delivery kernel, and the step counter.
`kernels_per_step` (`tests/_kernel_count.py`) is the proxy count of issue #37."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj

from _kernel_count import kernels_per_step

@pytest.fixture(scope="module")
def coba():
    return nj.models.coba(jax.random.key(0))


def _stacked(state, b):
    return jax.tree.map(lambda x: jnp.stack([x] * b) if isinstance(x, jax.Array) else x, state)


# Measured on this tree: 46 before the delivery read the spike vector itself (23 of them the
# compaction of the spike list), 22 with it, 6 with the fused arrivals and group kernels (the
# arrivals, the two populations' currents, the group, the delivery, the step counter).
COBA_KERNELS_MAX = 6
# Recorded values of the same count (fails when a change makes them larger; lower them then).
STDP_COBA_KERNELS = 14
MICROCIRCUIT_KERNELS = 52


def test_coba_step_kernel_count(coba):
    net, state = coba
    kernels, triton, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert triton == 3, ops  # arrivals, the group's neurons, the delivery
    assert kernels <= COBA_KERNELS_MAX, ops
    assert "while" not in ops and "sort" not in ops and "scatter" not in ops, ops
    assert "concatenate" not in ops and "slice" not in ops, ops


def test_vmapped_coba_step_is_one_program_for_all_trials(coba):
    """`jax.vmap` over 8 full states (the step counter batched too): one delivery kernel, no
    loop over the trials (the GPU batching rule folds them), about the unbatched count."""
    net, state = coba
    states = _stacked(state, 8)
    step = jax.vmap(lambda s: net.step(s, None, 0.1))
    kernels, triton, ops = kernels_per_step(step, states)
    assert triton == 3 and "while" not in ops, ops
    assert kernels <= COBA_KERNELS_MAX, ops
    with nj.kernels.cross_platform():
        text = jax.jit(step).trace(states).lower(lowering_platforms=("cuda",)).as_text()
        tpu = jax.jit(step).trace(states).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "stablehlo.while" not in text
    assert "stablehlo.while" not in tpu  # the TPU delivery folds the trials too


def test_proxy_counts_a_loop_it_is_shown():
    """The counter can fail: a compaction with `jnp.nonzero` shows up as extra kernels."""

    def plain(x):
        return x * 2.0 + 1.0

    def compacting(x):
        return jnp.nonzero(x > 0, size=16, fill_value=0)[0].astype(x.dtype) + x[:16]

    x = jnp.linspace(-1.0, 1.0, 64)
    assert kernels_per_step(plain, x)[0] == 1
    assert kernels_per_step(compacting, x)[0] > 1


def test_small_coba_under_interpret_equals_the_cpu_kernels():
    """COBA (400 neurons, 150 steps) with the GPU kernels interpreted gives the CPU kernels'
    spikes exactly and their state to rounding (the atomics add in no fixed order)."""
    net, state = nj.models.coba(jax.random.key(1), n_exc=320, n_inh=80, p=0.05)
    run = jax.jit(lambda st: nj.simulate(net, st, dt=0.1, n_steps=150))
    want_final, want = run(state)
    with nj.kernels.interpret("gpu"):
        final, got = run(state)
    assert int(want.spikes["E"].sum()) > 0
    for pop in ("E", "I"):
        np.testing.assert_array_equal(np.asarray(got.spikes[pop]), np.asarray(want.spikes[pop]))
    for g, w in zip(jax.tree.leaves(final), jax.tree.leaves(want_final), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_vmapped_network_under_interpret_equals_stacked_runs():
    """`jax.vmap` over three full states (different voltages; the step counter batched too)
    equals three runs, with the GPU kernels interpreted."""
    net, state = nj.models.coba(jax.random.key(2), n_exc=160, n_inh=40, p=0.1)

    def shifted(dv):
        pops = {k: eqx.tree_at(lambda p: p.v, p, p.v + dv) for k, p in state.populations.items()}
        return eqx.tree_at(lambda st: st.populations, state, pops)

    trials = [shifted(dv) for dv in (0.0, 2.0, 4.0)]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *trials)

    def run(st):
        return nj.simulate(net, st, dt=0.1, n_steps=80)[1].spikes

    want = [run(st) for st in trials]
    with nj.kernels.interpret("gpu"):
        got = jax.jit(jax.vmap(run))(states)
    for pop in ("E", "I"):
        np.testing.assert_array_equal(
            np.asarray(got[pop]), np.stack([np.asarray(w[pop]) for w in want])
        )
    assert int(np.asarray(got["E"]).sum()) > 0


def test_stdp_coba_and_microcircuit_step_counts():
    """The proxy count of the STDP COBA step (additive STDP on E->E, as `bench-gpu` builds
    it) and of the microcircuit's step (scale 0.02): their recorded values."""
    from benchmarks.peers.brian2_coba_stdp import STDP_PARAMS
    from benchmarks.stdp_overhead import with_stdp

    net, state = nj.models.coba(jax.random.key(0))
    net, state = with_stdp(net, state, nj.STDP(**STDP_PARAMS, mode="additive"))
    kernels, _, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert kernels <= STDP_COBA_KERNELS, ops
    net, state = nj.models.microcircuit(jax.random.key(0), scale=0.02)
    kernels, _, ops = kernels_per_step(lambda s: net.step(s, None, 0.1), state)
    assert kernels <= MICROCIRCUIT_KERNELS, ops
