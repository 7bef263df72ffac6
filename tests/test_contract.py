"""Contract tests run over every registered neuron model (tests/helpers.py: MODEL_CASES).

They check the promises of SPEC.md section 1 for each model: the compiled scan equals an
eager Python loop over `step`, batching equals stacked single runs, gradients through the
surrogate spikes are finite and non-zero, sub-threshold gradients match finite differences,
changing parameter values does not recompile, and chunked runs equal unchunked ones.

The tests that compare a run with and without an outer `jax.jit` are `chex.variants` of one
test (`JitVariantsTest`, a `chex.TestCase` parametrised over the same cases); the others
are pytest functions.
"""

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from helpers import MODEL_CASES, case_ids, python_loop
from jax.test_util import check_grads

import neurojax as nj
from neurojax import _simulate

CASES = pytest.mark.parametrize("case", MODEL_CASES, ids=case_ids())


def _drive(case):
    return jnp.asarray(case.drive)


@CASES
def test_state_protocol(case):
    model = case.make()
    state = model.init_state(3)
    assert state.v.shape == (3,)
    new_state, spikes = model.step(state, _drive(case), case.dt)
    assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(new_state)):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert spikes.shape == (3,) and spikes.dtype == state.v.dtype
    batched = model.init_state((2, 4, 3))
    assert batched.v.shape == (2, 4, 3)
    # None means no input and must equal an explicit zero current.
    chex.assert_trees_all_equal(model.step(state, None, case.dt), model.step(state, 0.0, case.dt))


@CASES
def test_batched_equals_stacked_single_runs(case):
    model = case.make()
    drives = jnp.stack([_drive(case), _drive(case)[::-1]])  # (2, 3)
    state = model.init_state((2, 3))
    _, rec = nj.simulate(model, state, drives, dt=case.dt, n_steps=case.n_steps, record=("v",))
    for b in range(2):
        _, single = nj.simulate(
            model, model.init_state(3), drives[b], dt=case.dt, n_steps=case.n_steps, record=("v",)
        )
        np.testing.assert_array_equal(np.asarray(rec.spikes[:, b]), np.asarray(single.spikes))
        # Different array shapes may vectorise differently (SIMD body vs remainder), which
        # rounds differently; the spike upswings amplify that (see the eager test above).
        np.testing.assert_allclose(
            np.asarray(rec.v[:, b]), np.asarray(single.v), rtol=1e-3, atol=1e-2
        )


@CASES
def test_vmap_over_states_and_parameters(case):
    model = case.make()
    state = model.init_state(3)

    def run(m, current):
        _, rec = nj.simulate(m, state, current, dt=case.dt, n_steps=case.n_steps)
        return rec.spikes.sum(0)

    currents = jnp.stack([_drive(case), 0.5 * _drive(case)])
    vm = jax.vmap(run, in_axes=(None, 0))(model, currents)
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(vm[b]), np.asarray(run(model, currents[b])))
    # A sweep over one parameter: stack two models along a new leading axis of that leaf.
    value = getattr(model, case.param)
    models = eqx.tree_at(lambda m: getattr(m, case.param), model, jnp.stack([value, value * 1.05]))
    swept = jax.vmap(run, in_axes=(_param_axes(model, case.param), None))(models, _drive(case))
    np.testing.assert_array_equal(np.asarray(swept[0]), np.asarray(run(model, _drive(case))))
    # The second entry must be the perturbed model, not a copy of the first.
    other = eqx.tree_at(lambda m: getattr(m, case.param), model, value * 1.05)
    np.testing.assert_array_equal(np.asarray(swept[1]), np.asarray(run(other, _drive(case))))


def _param_axes(model, name):
    """in_axes PyTree mapping only parameter `name` over axis 0."""
    axes = jax.tree_util.tree_map(lambda _: None, model)
    return eqx.tree_at(lambda m: getattr(m, name), axes, 0, is_leaf=lambda x: x is None)


@CASES
def test_subthreshold_gradients_match_finite_differences(case):
    # In float64 and below threshold the dynamics are smooth, so reverse-mode gradients of
    # the final voltage must match central finite differences (check_grads' default
    # tolerance for float64 is about 1e-5 relative).
    with jax.enable_x64(True):
        model = case.make()
        state = model.init_state(3)
        n = min(case.n_steps, 400)

        def final_v(current):
            final, _ = nj.simulate(model, state, current, dt=case.dt, n_steps=n)
            return final.v

        current = jnp.array([case.sub, 0.5 * case.sub, 0.25 * case.sub], dtype=jnp.float64)
        _, rec = nj.simulate(model, state, current, dt=case.dt, n_steps=n)
        assert int(rec.spikes.sum()) == 0, "the sub-threshold input must not cause spikes"
        check_grads(final_v, (current,), order=1, modes=["rev", "fwd"], eps=1e-4)


@CASES
def test_no_recompilation_when_only_values_change(case, monkeypatch):
    # A fresh compiled driver whose scan body may be traced once, by the first run: the
    # other two only change values and must reuse its program.
    chex.clear_trace_counter()
    traced_once = chex.assert_max_traces(_simulate._run_chunk, n=1)
    monkeypatch.setattr(_simulate, "_run_chunk_jit", eqx.filter_jit(traced_once))
    model = case.make()
    state = model.init_state(3)
    kwargs = dict(dt=case.dt, n_steps=50, record=("v",))
    nj.simulate(model, state, _drive(case), **kwargs)
    other = eqx.tree_at(lambda m: getattr(m, case.param), model, getattr(model, case.param) * 1.01)
    nj.simulate(other, state, _drive(case) * 0.9, **kwargs)
    nj.simulate(model, model.init_state(3, key=jax.random.key(1)), _drive(case), **kwargs)


@CASES
def test_chunked_equals_unchunked_bit_for_bit(case):
    model = case.make()
    state = model.init_state(3, key=jax.random.key(0))
    kwargs = dict(dt=case.dt, n_steps=case.n_steps, record=("v",))
    f1, r1 = nj.simulate(model, state, _drive(case), **kwargs)
    f2, r2 = nj.simulate(model, state, _drive(case), chunk_size=case.n_steps // 4 + 10, **kwargs)
    assert isinstance(r2.v, np.ndarray)
    chex.assert_trees_all_equal(f1, f2)
    np.testing.assert_array_equal(np.asarray(r1.spikes), r2.spikes)
    np.testing.assert_array_equal(np.asarray(r1.v), r2.v)


@CASES
def test_random_initial_state_is_reproducible(case):
    model = case.make()
    a = model.init_state((2, 3), key=jax.random.key(7))
    b = model.init_state((2, 3), key=jax.random.key(7))
    c = model.init_state((2, 3), key=jax.random.key(8))
    chex.assert_trees_all_equal(a, b)
    assert not np.array_equal(np.asarray(a.v), np.asarray(c.v))


@CASES
def test_pmap_over_a_device_axis(case):
    # Scripts still use jax.pmap; a leading device axis (size = number of local devices) must
    # give the same result as running each slice alone.
    model = case.make()
    n_dev = jax.local_device_count()
    drives = jnp.stack([_drive(case) * (1.0 + 0.1 * d) for d in range(n_dev)])

    def run(current):
        _, rec = nj.simulate(model, model.init_state(3), current, dt=case.dt, n_steps=200)
        return rec.spikes.sum(0)

    out = jax.pmap(run)(drives)
    for d in range(n_dev):
        np.testing.assert_array_equal(np.asarray(out[d]), np.asarray(run(drives[d])))


class JitVariantsTest(chex.TestCase):
    """Each test runs twice: its `self.variant` is `jax.jit` in one run, the identity in the
    other, and both must meet the same reference."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(case.id, case) for case in MODEL_CASES])
    def test_simulate_matches_eager_python_loop(self, case):
        model = case.make()
        state = model.init_state(3)
        n = min(case.n_steps, 400)
        run = self.variant(
            lambda m, s, x: nj.simulate(m, s, x, dt=case.dt, n_steps=n, record=("v",))
        )
        final, rec = run(model, state, _drive(case))
        ref_final, ref_spikes, ref_v = python_loop(model, state, _drive(case), case.dt, n)
        # Eager op-by-op evaluation and the fused scan may round differently in the last bit
        # (XLA fuses and reorders elementwise work). The quadratic (Izhikevich) and
        # exponential (AdEx) upswings amplify such a difference to ~1e-3 mV within a spike,
        # so voltages are compared at rtol 1e-3 while spike trains must agree exactly.
        assert ref_spikes.sum() > 0, "the drive must make the model fire for this test to mean much"
        np.testing.assert_array_equal(np.asarray(rec.spikes), ref_spikes > 0)
        np.testing.assert_allclose(np.asarray(rec.v), ref_v, rtol=1e-3, atol=1e-2)
        np.testing.assert_allclose(
            np.asarray(final.v), np.asarray(ref_final.v), rtol=1e-3, atol=1e-2
        )

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(case.id, case) for case in MODEL_CASES])
    def test_grad_through_surrogate_spikes_is_finite_and_nonzero(self, case):
        model = case.make()
        state = model.init_state(3)

        def count(current):
            _, rec = nj.simulate(
                model,
                state,
                current,
                dt=case.dt,
                n_steps=case.n_steps,
                record=nj.Record(spikes="float"),
            )
            return rec.spikes.sum()

        g = self.variant(jax.grad(count))(_drive(case))
        assert np.all(np.isfinite(np.asarray(g)))
        assert np.any(np.asarray(g) != 0), "surrogate gradient of the spike count vanished"
        # jit(grad) equals grad. Through the quadratic and exponential upswings (Izhikevich,
        # AdEx) the two compilations' rounding differences grow to ~1e-4 relative.
        chex.assert_trees_all_close(g, jax.grad(count)(_drive(case)), rtol=1e-3, atol=1e-6)
