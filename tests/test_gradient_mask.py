"""Training keeps a network what it is: a projection's weight gradient lives on its synapses.

A sparse connectivity stored densely (`method="auto"` picks the dense layout for small
projections) must get no gradient at the pairs that are not synapses, so that an optax step
leaves absent synapses absent (issue 38, item 4). The reference for the values on the
synapses is the other layouts: the event layout's gradient is per synapse by construction,
and the BCOO layout's goes through JAX's own sparse product.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import neurojax as nj

DT = 0.1
N_PRE, N_POST = 60, 40


def _conn(weight=0.8, p=0.1, key=0):
    return nj.connect.fixed_prob(jax.random.key(key), N_PRE, N_POST, p, weight=weight)


def _net(conn, method):
    proj = nj.Projection("X", "N", conn, synapse=nj.Exponential(5.0), method=method)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-55.0)
    return nj.Network(
        populations={"X": (nj.PoissonSource(80.0), N_PRE), "N": (lif, N_POST)},
        projections=[proj],
    )


def _loss(net):
    """A smooth function of every weight: the summed final membrane potential and spikes."""
    final, rec = nj.simulate(
        net, net.init_state(jax.random.key(1)), dt=DT, n_steps=150, record=nj.Record(spikes="float")
    )
    return jnp.sum(final.populations["N"].v) + jnp.sum(rec.spikes["N"])


def _dense_gradient(net, grads):
    """The gradient of the projection's weights as an `(n_pre, n_post)` array (zeros off the
    synapses of a sparse layout), read through the layout's own `to_bcoo`."""
    layout = eqx.combine(grads.projections[0].layout, net.projections[0].layout)
    return np.asarray(layout.to_bcoo().todense())


def _mask(conn):
    idx = np.asarray(conn.indices)
    mask = np.zeros((N_PRE, N_POST), bool)
    mask[idx[:, 0], idx[:, 1]] = True
    return mask


@pytest.fixture(scope="module")
def gradients():
    conn = _conn()
    out = {}
    for method in ("auto", "dense", "event", "bcoo"):
        net = _net(conn, method)
        grads = eqx.filter_jit(eqx.filter_grad(_loss))(net)
        out[method] = (net, grads)
    return conn, out


def test_auto_is_dense_here(gradients):
    _, out = gradients
    assert out["auto"][0].projections[0].method == "dense"


def test_dense_gradient_is_zero_off_the_synapses(gradients):
    conn, out = gradients
    mask = _mask(conn)
    for method in ("auto", "dense"):
        g = np.asarray(out[method][1].projections[0].layout.matrix)
        assert g.shape == (N_PRE, N_POST)
        assert np.all(g[~mask] == 0.0), f"{method}: {(g[~mask] != 0).sum()} entries off"
        assert np.count_nonzero(g[mask]) > 0.5 * mask.sum()  # the synapses do learn


def test_every_layout_gives_the_same_gradient_on_the_synapses(gradients):
    conn, out = gradients
    mask = _mask(conn)
    ref = _dense_gradient(*out["event"])
    assert np.abs(ref).max() > 0 and np.all(ref[~mask] == 0.0)
    for method in ("auto", "dense", "bcoo"):
        g = _dense_gradient(*out[method])
        assert np.all(g[~mask] == 0.0)
        # float32 sums of the same arrivals in different orders: a few ulps, carried
        # through 150 steps of the LIF dynamics and its surrogate
        np.testing.assert_allclose(g[mask], ref[mask], rtol=2e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("optimiser", [optax.sgd(0.5), optax.adam(1e-2)], ids=["sgd", "adam"])
@pytest.mark.parametrize("method", ["auto", "dense", "event", "bcoo"])
def test_an_optax_step_keeps_absent_synapses_absent(gradients, optimiser, method):
    conn, out = gradients
    mask = _mask(conn)
    net, grads = out[method]
    params = eqx.filter(net, eqx.is_inexact_array)
    state = optimiser.init(params)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
        updates, _ = optimiser.update(grads, state, params)
    stepped = eqx.apply_updates(net, updates)
    before = np.asarray(net.projections[0].layout.to_bcoo().todense())
    after = np.asarray(stepped.projections[0].layout.to_bcoo().todense())
    assert np.all(after[~mask] == 0.0)
    assert np.any(after[mask] != before[mask])  # the step did move the synapses
    assert stepped.projections[0].conn.nse == conn.nse  # same synapses, none added
    if method in ("auto", "dense"):
        assert np.all(np.asarray(stepped.projections[0].layout.matrix)[~mask] == 0.0)


def test_a_synapse_of_weight_zero_stays_a_synapse():
    """Existence is the connectivity, not a nonzero weight: synapses that start at 0 learn
    (a common initialisation), absent ones do not."""
    conn = _conn(weight=0.0)
    mask = _mask(conn)
    net = _net(conn, "dense")
    assert net.projections[0].conn.nse == conn.nse

    def loss(net):
        # a postsynaptic drive that depends on the weights at first order
        final, _ = nj.simulate(
            net,
            net.init_state(jax.random.key(1)),
            dt=DT,
            n_steps=100,
            record=nj.Record(spikes="float"),
        )
        return jnp.sum(final.populations["N"].v)

    g = np.asarray(eqx.filter_grad(loss)(net).projections[0].layout.matrix)
    assert np.all(g[~mask] == 0.0)
    ev = _net(conn, "event")
    ref = _dense_gradient(ev, eqx.filter_grad(loss)(ev))
    assert np.count_nonzero(ref[mask] > 0) > 0.5 * mask.sum()  # the zero weights do learn
    np.testing.assert_allclose(g[mask], ref[mask], rtol=2e-4, atol=1e-6)


def test_forward_mode_and_jacobians_are_masked_too():
    conn = _conn()
    mask = _mask(conn)
    lay = nj.Projection("X", "N", conn, method="dense").layout
    s = (jax.random.uniform(jax.random.key(2), (3, N_PRE)) < 0.3).astype(jnp.float32)

    def f(m):
        return eqx.tree_at(lambda lay: lay.matrix, lay, m).product(s)

    # jvp along a full tangent: only the synapses' entries move the output
    full = jnp.ones((N_PRE, N_POST), jnp.float32)
    _, dy = jax.jvp(f, (lay.matrix,), (full,))
    np.testing.assert_allclose(dy, np.asarray(s) @ mask.astype(np.float32), rtol=1e-6)
    jac = np.asarray(jax.jacrev(f)(lay.matrix))  # (3, n_post, n_pre, n_post)
    assert np.all(jac[..., ~mask] == 0.0)
    # grad under vmap over a stack of matrices and jit: the analytic gradient of
    # sum(s @ m), sum_b s[b, i] at every synapse (i, j) and 0 elsewhere
    stack = jnp.stack([lay.matrix, 2.0 * lay.matrix])
    g = jax.jit(jax.vmap(jax.grad(lambda m: f(m).sum())))(stack)
    want = np.asarray(s).sum(axis=0)[:, None] * mask
    np.testing.assert_allclose(g[0], want, rtol=1e-6)
    np.testing.assert_allclose(g[1], want, rtol=1e-6)
    # and the forward product is the plain one
    y = jax.jit(jax.vmap(f))(stack)
    np.testing.assert_allclose(y[1], 2.0 * np.asarray(s) @ np.asarray(lay.matrix), rtol=1e-6)


def test_dense_layout_keeps_its_synapses_in_bits():
    conn = _conn()
    lay = nj.Projection("X", "N", conn, method="dense").layout
    np.testing.assert_array_equal(np.asarray(lay.mask()), _mask(conn))
    assert lay.nbytes() == 4 * N_PRE * N_POST + N_PRE * ((N_POST + 7) // 8)
    back = lay.to_bcoo()
    np.testing.assert_array_equal(np.asarray(back.todense()), np.asarray(conn.todense()))
    # all-to-all: no bits kept, every pair is a synapse
    full = nj.connect.fixed_prob(jax.random.key(0), 5, 4, 1.0, weight=0.3)
    all_lay = nj.Projection("X", "N", full, method="dense").layout
    assert all_lay.synapses is None and all_lay.nbytes() == 4 * 5 * 4
    assert all_lay.to_bcoo().nse == 20


def test_procedural_weight_gradient_is_the_sum_over_its_synapses():
    """A procedural projection has no per-pair weights to learn: its gradient is the weight
    parameter's, the sum of the per-synapse gradients of the same synapses stored."""
    desc = nj.connect.procedural.fixed_prob(jax.random.key(3), N_PRE, N_POST, 0.1, weight=0.8)
    stored, _ = desc.stored()
    g_proc = eqx.filter_grad(_loss)(_net(desc, "procedural"))
    leaves = [x for x in jax.tree.leaves(g_proc.projections[0].layout) if x is not None]
    assert all(x.size <= N_PRE for x in leaves)  # nothing per (pre, post) pair
    ev = _net(stored, "event")
    g_ev = eqx.filter_grad(_loss)(ev).projections[0].layout.weights
    g_w = g_proc.projections[0].layout.conn.weight  # d loss / d (the one weight)
    assert np.shape(g_w) == ()
    np.testing.assert_allclose(float(g_w), float(jnp.sum(g_ev)), rtol=1e-4)
