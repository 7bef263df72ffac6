"""Storage layouts of a projection (`nj.network.Layout`): every layout against the others and
against a NumPy reference, and a layout the library does not ship, defined here alone, run by
`nj.Network` and `nj.parallel.shard_network` without any other change."""

from typing import ClassVar

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.experimental import sparse

import neurojax as nj
from neurojax.network import BCOOLayout, DenseLayout, EventLayout, Layout
from neurojax.network._layout import Delivery
from neurojax.parallel import shard_network

DT = 0.1
BUILTIN = (EventLayout, DenseLayout, BCOOLayout)


class Transposed(Layout):
    """A layout of this test only: the dense matrix stored transposed, `W^T s` per step."""

    name: ClassVar[str] = "transposed"
    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    w_t: jax.Array

    @classmethod
    def from_bcoo(cls, conn, *, delay=None, plastic=False):
        return cls(int(conn.shape[0]), int(conn.shape[1]), jnp.asarray(conn.todense()).T), delay

    def to_bcoo(self):
        return sparse.BCOO.fromdense(self.w_t.T)

    def nbytes(self):
        return int(self.w_t.nbytes)

    def product(self, s):
        return jnp.einsum("ji,...i->...j", self.w_t, s, precision=jax.lax.Precision.HIGHEST)


ALL = (*BUILTIN, Transposed)


def _conn(n_pre=30, n_post=20, p=0.25, key=0):
    # Unsorted rows on purpose: the event layout sorts them stably.
    c = nj.connect.fixed_prob(jr.key(key), n_pre, n_post, p, weight=nj.connect.uniform(0.1, 1.0))
    order = np.random.default_rng(key).permutation(c.nse)
    return sparse.BCOO((c.data[order], c.indices[order]), shape=c.shape)


def _spikes(shape, key=1, p=0.3):
    return (jr.uniform(jr.key(key), shape) < p).astype(jnp.float32)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_product_equals_numpy(cls):
    conn = _conn()
    lay, _ = cls.from_bcoo(conn)
    s = _spikes((3, 30))
    want = np.asarray(s, np.float64) @ np.asarray(conn.todense(), np.float64)
    np.testing.assert_allclose(np.asarray(lay.product(s)), want, rtol=1e-6, atol=1e-6)
    assert (lay.n_pre, lay.n_post) == (30, 20)


@pytest.mark.parametrize("fresh", [False, True])
def test_every_layout_delivers_the_same_values(fresh):
    """Two projections leaving one group (offsets in the spike vector and the ring), a delay,
    a batch of trials: every layout's `deliver_group` adds the same weights at the same
    places; with `fresh` the ring's old content does not count."""
    a, b = _conn(30, 20, key=2), _conn(30, 15, key=3)
    s = _spikes((2, 50), key=4)  # the group: 20 other neurons, then the 30 presynaptic ones
    ring = jr.normal(jr.key(5), (2, 4, 35))
    step = jnp.int32(6)
    want = np.zeros((2, 4, 35)) if fresh else np.asarray(ring, np.float64)
    for conn, offset, delay in ((a, 0, 2), (b, 20, 0)):
        x = np.asarray(s[:, 20:], np.float64) @ np.asarray(conn.todense(), np.float64)
        want[:, (6 + 1 + delay) % 4, offset : offset + conn.shape[1]] += x
    got = {}
    for cls in ALL:
        lays = [cls.from_bcoo(a)[0], cls.from_bcoo(b)[0]]
        deliveries = [
            Delivery(lays[0], 20, 0, 2, None, None),
            Delivery(lays[1], 20, 20, 0, None, None),
        ]
        out = cls.deliver_group(deliveries, s, step, ring, fresh=fresh)
        if isinstance(out, tuple):  # a bounded spike buffer also says what it lacked
            out, needed = out
            assert not np.any(np.asarray(needed))
        got[cls.name] = np.asarray(out)
        np.testing.assert_allclose(got[cls.name], want, rtol=1e-6, atol=1e-5)
    # The event layout and the dense matrix product add the same terms: equal to rounding.
    chex.assert_trees_all_close(got["event"], got["dense"], got["bcoo"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_to_bcoo_round_trip(cls):
    conn = _conn()
    lay, _ = cls.from_bcoo(conn)
    back = lay.to_bcoo()
    assert back.shape == conn.shape
    np.testing.assert_array_equal(np.asarray(back.todense()), np.asarray(conn.todense()))
    again, _ = cls.from_bcoo(back)
    chex.assert_trees_all_equal(again, lay)


def test_event_layout_orders_synapses_and_delays_by_row():
    conn = _conn()
    delay = np.arange(conn.nse, dtype=np.float64)
    lay, d = EventLayout.from_bcoo(conn, delay=delay)
    idx = np.asarray(conn.indices)
    order = np.argsort(idx[:, 0], kind="stable")
    np.testing.assert_array_equal(d, delay[order])
    np.testing.assert_array_equal(np.asarray(lay.indices), idx[order, 1])
    np.testing.assert_array_equal(np.asarray(lay.weights), np.asarray(conn.data)[order])
    counts = np.bincount(idx[:, 0], minlength=30)
    np.testing.assert_array_equal(np.asarray(lay.indptr), np.concatenate([[0], counts.cumsum()]))
    assert lay.max_fan_out == counts.max() and lay.col_ptr is None
    plastic, _ = EventLayout.from_bcoo(conn, plastic=True)
    assert plastic.max_fan_in == np.bincount(idx[:, 1], minlength=20).max()


def test_nbytes():
    conn = _conn()
    nnz = conn.nse
    event, _ = EventLayout.from_bcoo(conn)
    plastic, _ = EventLayout.from_bcoo(conn, plastic=True)
    assert event.nbytes() == 8 * nnz + 4 * 31
    assert plastic.nbytes() == 16 * nnz + 4 * 31 + 4 * 21
    assert DenseLayout.from_bcoo(conn)[0].nbytes() == 4 * 30 * 20 + 30 * 3  # + synapse bits
    assert BCOOLayout.from_bcoo(conn)[0].nbytes() == 12 * nnz
    assert Transposed.from_bcoo(conn)[0].nbytes() == 4 * 30 * 20
    # A projection adds its per-synapse delays to its layout's bytes.
    proj = nj.Projection("A", "B", conn, delay=np.linspace(0.0, 1.0, nnz), method="event")
    assert proj.nbytes() == event.nbytes() + 4 * nnz


def test_local_tables_do_not_depend_on_the_layout():
    conn = _conn(30, 20)
    tables = [cls.from_bcoo(conn)[0].local_tables(3, 7, 33) for cls in ALL]
    for t in tables:
        assert isinstance(t, EventLayout) and (t.n_pre, t.n_post) == (33, 7)
        assert t.indptr.shape == (3, 34)
    # Same synapses in every table. Within a row, the event and BCOO layouts keep the
    # connectivity's order (a stable sort by row); the dense ones rebuild it from a matrix,
    # in ascending postsynaptic index.
    chex.assert_trees_all_equal(tables[0], tables[2])
    chex.assert_trees_all_equal(tables[1], tables[3])
    for t in tables:
        dense = np.zeros((33, 21))
        for d in range(3):
            ptr = np.asarray(t.indptr[d])
            for i in range(33):
                for j in range(ptr[i], ptr[i + 1]):
                    dense[i, d * 7 + int(t.indices[d, j])] += float(t.weights[d, j])
        np.testing.assert_allclose(dense[:30, :20], np.asarray(conn.todense()), rtol=1e-7)


def _net(method, *, delay=0.0):
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    k = jr.split(jr.key(7), 3)
    c_ee = nj.connect.fixed_prob(k[0], 40, 40, 0.2, weight=1.5)
    c_ei = nj.connect.fixed_prob(k[1], 40, 20, 0.2, weight=2.0)
    c_ie = nj.connect.fixed_prob(k[2], 20, 40, 0.3, weight=0.1)
    return nj.Network(
        {"src": (nj.PoissonSource(150.0), 30), "E": (lif, 40), "I": (lif, 20)},
        [
            nj.Projection("src", "E", _conn(30, 40, key=8), synapse=nj.Exponential(5.0)),
            nj.Projection("E", "E", c_ee, synapse=nj.Exponential(5.0), delay=delay, method=method),
            nj.Projection("E", "I", c_ei, synapse=nj.Alpha(2.0), method=method),
            nj.Projection(
                "I",
                "E",
                c_ie,
                synapse=nj.Exponential(10.0),
                output=nj.ConductanceOutput(-80.0),
                method=method,
            ),
        ],
        inputs={"E": 11.0, "I": 10.5},
        dt=DT,
    )


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_custom_layout_runs_in_a_network(delay):
    """The test's own layout, next to built-in ones in the same sending groups, gives the
    spikes of the dense layout (the same matrix products, summed in another order)."""
    custom = _net(Transposed, delay=delay)
    assert [p.method for p in custom.projections] == ["dense", *["transposed"] * 3]
    assert isinstance(custom.projections[1].layout, Transposed)
    assert custom.projections[1].weights is None and custom.projections[1].matrix is None
    np.testing.assert_array_equal(
        np.asarray(custom.projections[1].conn.todense()),
        np.asarray(_net("dense").projections[1].conn.todense()),
    )
    state = custom.init_state(jr.key(3))
    fin_c, rec_c = nj.simulate(custom, state, dt=DT, n_steps=600)
    fin_d, rec_d = nj.simulate(_net("dense", delay=delay), state, dt=DT, n_steps=600)
    assert rec_d.spikes["E"].sum() > 40 and rec_d.spikes["I"].sum() > 20
    chex.assert_trees_all_equal(rec_c.spikes, rec_d.spikes)
    neurons = [{n: fin.populations[n] for n in ("E", "I")} for fin in (fin_c, fin_d)]
    chex.assert_trees_all_close(*neurons, rtol=1e-5, atol=1e-4)
    # Gradients reach the custom layout's own arrays (filter_grad: the dense layout keeps
    # the bits of its synapses as integers).
    grad = eqx.filter_grad(
        lambda n: jnp.sum(nj.simulate(n, state, dt=DT, n_steps=50)[0].populations["I"].v)
    )(custom)
    assert float(jnp.abs(grad.projections[2].layout.w_t).sum()) > 0


def test_custom_layout_in_a_sharded_network():
    """`shard_network` asks the layout for its local tables: the custom layout is delivered
    through them on every device, as the event layout is."""
    mesh = jax.make_mesh((1,), ("neurons",))
    net_c, net_e = _net(Transposed), _net("event")
    state = net_e.init_state(jr.key(4))
    _, want = nj.simulate(net_e, state, dt=DT, n_steps=400)
    sharded = shard_network(net_c, mesh)
    _, got = sharded.run(sharded.shard_state(state), dt=DT, n_steps=400)
    assert want.spikes["E"].sum() > 20
    chex.assert_trees_all_equal(sharded.to_host(got.spikes), jax.tree.map(np.asarray, want.spikes))


def test_layout_choice_and_errors():
    conn = _conn()
    small = nj.Projection("A", "B", conn)
    assert small.method == "dense" and isinstance(small.layout, DenseLayout)
    big = nj.Projection("A", "B", nj.connect.fixed_prob(jr.key(0), 300, 300, 0.01))
    assert big.method == "event" and big.weights is not None and big.matrix is None
    varied = nj.Projection("A", "B", conn, delay=np.linspace(0.0, 1.0, conn.nse))
    assert varied.method == "event"
    plastic = nj.Projection("A", "B", conn, plasticity=nj.STDP())
    assert plastic.method == "event" and plastic.col_ptr is not None
    bcoo = nj.Projection("A", "B", conn, method="bcoo")
    assert bcoo.conn_bcoo is bcoo.layout.conn and bcoo.weights is None and bcoo.max_fan_out == 0
    with pytest.raises(ValueError, match="layout=Layout is an abstract layout"):
        nj.Projection("A", "B", conn, method=Layout)
    with pytest.raises(ValueError, match="layout must be one of .* or a subclass"):
        nj.Projection("A", "B", conn, method=int)
    with pytest.raises(ValueError, match="plastic weights need layout='event'.*Transposed"):
        nj.Projection("A", "B", conn, plasticity=nj.STDP(), method=Transposed)
    with pytest.raises(ValueError, match="layout='transposed' needs one delay for all"):
        nj.Projection("A", "B", conn, delay=np.linspace(0.0, 1.0, conn.nse), method=Transposed)
