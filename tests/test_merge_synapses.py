"""`nj.Network(..., merge_synapses=True)`: projections from one group onto one population with
the same linear kinetics and output share their ring columns and one synaptic state.

The reference is the same network built without merging (every projection its own columns
and state): linear synapses superpose, so the shared state must be the sum of the separate
ones, and the currents and spikes the same up to the order of float additions."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import random as jr

import neurojax as nj
from neurojax.kernels import _build

DT = 0.1


@pytest.fixture(params=["kernel", "jax"])
def path(request):
    """The compiled CPU kernels and the pure-JAX path."""
    if request.param == "kernel" and (nj.kernels.mode() != "auto" or _build.library() is None):
        pytest.skip("the compiled CPU kernel could not be built here")
    with nj.kernels.use("auto" if request.param == "kernel" else "reference"):
        yield request.param


def build(merge: bool, *, e_rev_inh: float | None = None, per_synapse_delays: bool = True):
    """E (160) and I (40) LIF neurons stepped as one group, a Poisson source, and projections
    of which some can share: E->E and I->E (same kinetics, current output), E->I and I->I
    (same), E->E again with slower kinetics (never shares), source->E (another sender)."""
    k = jr.split(jr.key(11), 8)
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    exp5 = nj.Exponential(5.0)
    inh_out = nj.CurrentOutput() if e_rev_inh is None else nj.ConductanceOutput(e_rev_inh)
    inh_w = -1.2 if e_rev_inh is None else 0.02

    def delay(key, n_pre, n_post, p):
        conn = nj.connect.fixed_prob(key, n_pre, n_post, p, weight=1.0)
        if not per_synapse_delays:
            return 1.0
        return jr.uniform(jr.fold_in(key, 1), (conn.nse,), minval=0.1, maxval=2.0)

    def proj(pre, post, key, n_pre, n_post, p, w, synapse, output=None):
        conn = nj.connect.fixed_prob(key, n_pre, n_post, p, weight=w)
        return nj.Projection(
            pre,
            post,
            conn,
            synapse=synapse,
            output=output or nj.CurrentOutput(),
            delay=delay(key, n_pre, n_post, p),
            method="event",
        )

    projections = [
        proj("E", "E", k[0], 160, 160, 0.1, 0.5, exp5),
        proj("E", "I", k[1], 160, 40, 0.1, 0.8, exp5),
        proj("I", "E", k[2], 40, 160, 0.2, inh_w, exp5, inh_out),
        proj("I", "I", k[3], 40, 40, 0.2, -1.0, exp5),
        proj("E", "E", k[4], 160, 160, 0.05, 0.3, nj.Exponential(10.0)),
        proj("src", "E", k[5], 100, 160, 0.1, 1.5, exp5),
    ]
    return nj.Network(
        populations={"E": (lif, 160), "I": (lif, 40), "src": (nj.PoissonSource(20.0), 100)},
        projections=projections,
        inputs={"E": 11.0, "I": 10.5},
        dt=DT,
        merge_synapses=merge,
    )


def test_who_shares_and_the_ring_widths():
    merged, separate = build(True), build(False)
    # I->E shares E->E's state, I->I shares E->I's; the slower E->E and the source keep theirs
    assert merged.synapse_of == (0, 1, 0, 1, 4, 5)
    assert separate.synapse_of == (0, 1, 2, 3, 4, 5)
    # the E/I group's ring: blocks E (E->E and I->E), I (E->I and I->I), E (slow E->E)
    assert merged.ring_shape[0][1] == 160 + 40 + 160
    assert separate.ring_shape[0][1] == 160 + 40 + 160 + 40 + 160
    assert merged.ring_of[2] == merged.ring_of[0] and merged.ring_of[3] == merged.ring_of[1]
    mem, mem_sep = merged.memory(), separate.memory()
    assert mem.rings[0].bytes_per_slot == 4 * 360 and mem_sep.rings[0].bytes_per_slot == 4 * 560
    # a conductance output with another reversal potential is another synapse type
    assert build(True, e_rev_inh=-80.0).synapse_of == (0, 1, 2, 1, 4, 5)


@pytest.mark.parametrize("delays", [True, False])
def test_shared_state_is_the_sum_of_the_separate_ones(path, delays):
    merged, separate = (
        build(True, per_synapse_delays=delays),
        build(False, per_synapse_delays=delays),
    )
    key = jr.key(3)

    def run(net):
        return nj.simulate(net, net.init_state(key), dt=DT, n_steps=300)

    (fm, rm), (fs, rs) = run(merged), run(separate)
    assert int(rs.spikes["E"].sum()) > 100 and int(rs.spikes["I"].sum()) > 10  # active
    for name in ("E", "I", "src"):
        np.testing.assert_array_equal(np.asarray(rm.spikes[name]), np.asarray(rs.spikes[name]))
    g = [np.asarray(s.g) for s in fs.synapses]
    gm = [np.asarray(s.g) for s in fm.synapses]
    assert np.abs(g[2]).max() > 0.1 and np.abs(g[3]).max() > 0.1  # inhibition arrived
    np.testing.assert_allclose(gm[0], g[0] + g[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gm[1], g[1] + g[3], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(gm[2], 0.0)  # the sharing projections' own states
    np.testing.assert_array_equal(gm[3], 0.0)
    for i in (4, 5):  # projections with their own state: the same additions in the same order
        np.testing.assert_array_equal(gm[i], g[i])
    np.testing.assert_allclose(
        np.asarray(fm.populations["E"].v), np.asarray(fs.populations["E"].v), atol=1e-4
    )


def test_conductance_outputs_share_when_their_reversal_potentials_agree():
    merged = build(True, e_rev_inh=-80.0)
    # E->E (current) and I->E (conductance) stay apart; so does a conductance pair that
    # differs in e_rev from the current one: the pairing equals the separate network's run.
    final_m, rec_m = nj.simulate(merged, merged.init_state(jr.key(0)), dt=DT, n_steps=200)
    sep = build(False, e_rev_inh=-80.0)
    final_s, rec_s = nj.simulate(sep, sep.init_state(jr.key(0)), dt=DT, n_steps=200)
    np.testing.assert_array_equal(np.asarray(rec_m.spikes["E"]), np.asarray(rec_s.spikes["E"]))
    g_m, g_s = np.asarray(final_m.synapses[1].g), np.asarray(final_s.synapses[1].g)
    np.testing.assert_allclose(g_m, g_s + np.asarray(final_s.synapses[3].g), rtol=1e-5, atol=1e-6)


def test_jit_vmap_and_grad_through_shared_columns():
    merged, separate = build(True), build(False)

    def loss(net, w_inh):
        net = eqx.tree_at(lambda n: n.projections[2].weights, net, w_inh)
        st, _ = nj.simulate(net, net.init_state(jr.key(1)), dt=DT, n_steps=150)
        return jnp.sum(st.populations["E"].v)

    w0 = separate.projections[2].weights
    gm = jax.jit(jax.grad(loss, argnums=1))(merged, w0)
    gs = jax.jit(jax.grad(loss, argnums=1))(separate, w0)
    assert np.abs(np.asarray(gs)).max() > 0
    np.testing.assert_allclose(np.asarray(gm), np.asarray(gs), rtol=1e-3, atol=1e-6)

    # a batch of trials (vmap over the initial state) equals the trials one by one
    keys = jr.split(jr.key(4), 3)
    states = jax.vmap(merged.init_state)(keys)
    run = jax.vmap(lambda s: nj.simulate(merged, s, dt=DT, n_steps=120)[1].spikes["E"])
    batch = np.asarray(run(states))
    for t, key in enumerate(keys):
        _, rec = nj.simulate(merged, merged.init_state(key), dt=DT, n_steps=120)
        np.testing.assert_array_equal(batch[t], np.asarray(rec.spikes["E"]))


def test_editing_a_sharing_projections_kinetics_is_refused():
    net = build(True)
    state = net.init_state(jr.key(0))
    for i in (2, 0):  # either side of the shared pair alone
        edited = eqx.tree_at(lambda n, i=i: n.projections[i].synapse, net, nj.Exponential(7.0))
        with pytest.raises(ValueError, match=r"projections\[2\].*shares the synaptic state of "):
            edited.step(state, None, DT)

    # both edited alike: the shared state follows the new kinetics, as the separate ones do
    def slower(n):
        return eqx.tree_at(
            lambda m: (m.projections[0].synapse, m.projections[2].synapse),
            n,
            (nj.Exponential(7.0), nj.Exponential(7.0)),
        )

    final_m, _ = nj.simulate(slower(net), state, dt=DT, n_steps=100)
    sep = build(False)
    final_s, _ = nj.simulate(slower(sep), sep.init_state(jr.key(0)), dt=DT, n_steps=100)
    g_s = np.asarray(final_s.synapses[0].g) + np.asarray(final_s.synapses[2].g)
    assert np.abs(g_s).max() > 0.1
    np.testing.assert_allclose(np.asarray(final_m.synapses[0].g), g_s, rtol=1e-5, atol=1e-5)


def test_merge_synapses_argument_is_checked():
    lif = nj.LIF()
    with pytest.raises(TypeError, match=r"merge_synapses must be True or False, got 'yes'"):
        nj.Network({"E": (lif, 10)}, merge_synapses="yes")
    with pytest.raises(TypeError, match=r"microcircuit: merge_synapses must be True or False"):
        nj.models.microcircuit(jr.key(0), scale=0.01, merge_synapses=1)


def test_sharded_network_shares_the_same_columns():
    from neurojax.parallel._shard import shard_network

    net = build(True, per_synapse_delays=False)  # the sharded step takes one delay each
    state = net.init_state(jr.key(2))
    final, rec = nj.simulate(net, state, dt=DT, n_steps=300)
    sharded = shard_network(net, jax.make_mesh((1,), ("neurons",)))
    assert [tuple(b.shape[1:]) for b in sharded.init_state(jr.key(2)).buffers] == list(
        net.ring_shape
    )
    got_final, got = sharded.run(sharded.shard_state(state), dt=DT, n_steps=300)
    for name in ("E", "I"):
        np.testing.assert_array_equal(np.asarray(got.spikes[name]), np.asarray(rec.spikes[name]))
    back = sharded.unshard_state(got_final)
    for a, b in zip(back.buffers, final.buffers, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
