"""Learnable (differentiable) per-synapse delays: `nj.Projection(..., learnable_delays=True)`.

References: whole-step delays against the fixed-delay path (bit for bit), fractional delays
against the linear interpolation between the two neighbouring ring slots written out by
hand, gradients against central finite differences of a smooth objective.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import neurojax as nj

DT = 0.1


class Times(nj.network.SpikeSource):
    """A spike source that replays a fixed 0/1 table `(n_steps, n)` (test helper)."""

    table: jax.Array

    def init_state(self, shape, *, key=None):
        return jnp.zeros(shape[:-1], jnp.int32)

    def step(self, state, current=None, dt=DT):
        return state + 1, self.table[state]

    def step_block(self, state, dt, *, size, padded_size, block, axis_name):
        raise NotImplementedError("not sharded in these tests")


def _recurrent(delay, *, learnable):
    """A recurrent LIF network (40 E + 10 I, p = 0.2) with per-synapse delays, driven above
    threshold so that its spikes depend on every delivery."""
    key = jax.random.key(11)
    k1, k2 = jax.random.split(key)
    ee = nj.connect.fixed_prob(k1, 50, 50, 0.2, weight=1.5)
    w = np.asarray(ee.data)
    pre = np.asarray(ee.indices[:, 0])
    w = np.where(pre >= 40, -4.0 * w, w).astype(np.float32)
    conn = jax.experimental.sparse.BCOO((jnp.asarray(w), ee.indices), shape=(50, 50))
    d = delay(k2, conn.nse)
    proj = nj.Projection(
        "N", "N", conn, synapse=nj.Exponential(3.0), delay=d, learnable_delays=learnable
    )
    net = nj.Network({"N": (nj.LIF(tau_m=10.0, t_ref=2.0), 50)}, [proj], dt=DT)
    return net


def _run(net, n_steps=1000, state=None):
    state = net.init_state(jax.random.key(1)) if state is None else state
    _, rec = nj.simulate(
        net,
        state,
        {"N": 17.0},
        dt=DT,
        n_steps=n_steps,
        record=lambda s, o: {"s": o["N"], "v": s.populations["N"].v},
    )
    return np.asarray(rec.s), np.asarray(rec.v)


@pytest.mark.parametrize("mode", ["auto", pytest.param("reference", marks=pytest.mark.slow)])
def test_whole_step_delays_are_bit_identical_to_fixed_delays(mode):
    """Per-synapse delays of 0..15 steps (ms values such as 0.3 whose ratio to dt is not
    exact in float): spikes and voltages equal the fixed-delay run exactly, on the compiled
    CPU kernel and on the pure-JAX path."""
    delay = lambda k, n: np.asarray(jax.random.randint(k, (n,), 0, 16)) * 0.1  # noqa: E731
    with nj.kernels.use(mode):
        s_fixed, v_fixed = _run(_recurrent(delay, learnable=False))
        s_learn, v_learn = _run(_recurrent(delay, learnable=True))
    assert s_fixed.sum() > 150
    np.testing.assert_array_equal(s_learn, s_fixed)
    np.testing.assert_array_equal(v_learn, v_fixed)


def _line(
    delays, n_steps, *, weights=None, synapse=None, spikes_at=(20,), max_delay=None, post=None
):
    """n sources spiking at the steps `spikes_at`, one synapse each onto n silent LIF."""
    n = len(delays)
    table = np.zeros((n_steps, n), np.float32)
    table[list(spikes_at)] = 1
    w = np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32)
    proj = nj.Projection(
        "S",
        "P",
        np.diag(w),
        synapse=nj.Delta() if synapse is None else synapse,
        delay=np.asarray(delays, np.float64),
        learnable_delays=True,
        max_delay=max_delay,
    )
    post = nj.LIF(v_th=1e9) if post is None else post
    pops = {"S": (Times(jnp.asarray(table)), n), "P": (post, n)}
    return nj.Network(pops, [proj], dt=DT)


def _arrivals(net, n_steps):
    _, rec = nj.simulate(
        net,
        net.init_state(jax.random.key(0)),
        dt=DT,
        n_steps=n_steps,
        record=lambda s, o: {"x": s.synapses[0].g * DT},
    )
    return rec.x


def test_fractional_delay_splits_the_weight_between_neighbouring_slots():
    """A spike at step 20 with delays 0.73, 0.25 and 1.0 ms arrives as (0.7, 0.3) at steps
    28, 29; (0.5, 0.5) at 23, 24; 1.0 at 31 (a spike at step k with d steps arrives at
    k + 1 + d)."""
    x = np.asarray(_arrivals(_line([0.73, 0.25, 1.0], 40, weights=[2.0, 1.0, 3.0]), 40))
    expected = np.zeros((40, 3))
    expected[28, 0], expected[29, 0] = 2.0 * 0.7, 2.0 * 0.3
    expected[23, 1], expected[24, 1] = 0.5, 0.5
    expected[31, 2] = 3.0
    np.testing.assert_allclose(x, expected, atol=2e-6)


def test_delays_beyond_the_bounds_act_as_the_bounds():
    """A delay moved past max_delay (or below 0) delivers at max_delay (or 0), with zero
    gradient, as documented."""
    net = _line([0.5, 0.5], 40, max_delay=1.2)
    moved = eqx.tree_at(lambda m: m.projections[0].delay, net, jnp.array([3.0, -1.0]))
    x = np.asarray(_arrivals(moved, 40))
    assert x[21 + 12, 0] == pytest.approx(1.0) and x[21, 1] == pytest.approx(1.0)

    def total(d):
        m = eqx.tree_at(lambda m: m.projections[0].delay, net, d)
        return jnp.sum(_arrivals(m, 40) * jnp.arange(40.0)[:, None])

    g = jax.grad(total)(jnp.array([3.0, -1.0]))
    np.testing.assert_array_equal(np.asarray(g), [0.0, 0.0])


def _smooth_loss(net, n_steps, target):
    def loss(delay, weights):
        m = eqx.tree_at(lambda m: m.projections[0].delay, net, delay)
        m = eqx.tree_at(lambda m: m.projections[0].layout.weights, m, weights)
        _, rec = nj.simulate(
            m,
            m.init_state(jax.random.key(0)),
            dt=DT,
            n_steps=n_steps,
            record=lambda s, o: {"v": s.populations["P"].v},
        )
        return jnp.mean((rec.v - target) ** 2)

    return loss


def test_gradient_matches_finite_differences_of_a_smooth_objective():
    """Conductance synapses (Exponential, 4 ms, onto e_rev = 0 mV) into silent LIF: the
    squared distance of the voltage traces to a target is smooth in the delays between
    whole steps; jax.grad against central differences (h = 0.01 ms, float32: rtol 1e-2)."""
    n, n_steps = 4, 300
    delays = np.array([1.34, 2.57, 0.41, 3.86])
    # v_th = -30 mV is out of reach (the drive saturates near -47 mV); it sets the random
    # initial voltages between -65 and -30 mV.
    net = _line(
        delays,
        n_steps,
        synapse=nj.Exponential(4.0),
        spikes_at=(10, 60, 150),
        post=nj.LIF(v_th=-30.0),
    )
    proj = net.projections[0]
    proj = nj.Projection(
        "S",
        "P",
        np.diag(np.full(n, 0.3, np.float32)),
        synapse=nj.Exponential(4.0),
        output=nj.ConductanceOutput(0.0),
        delay=delays,
        learnable_delays=True,
    )
    net = eqx.tree_at(lambda m: m.projections, net, [proj])
    target = -65.0 + 8.0 * jnp.sin(jnp.arange(n_steps, dtype=jnp.float32) / 40.0)[:, None]
    loss = jax.jit(_smooth_loss(net, n_steps, target))
    d0, w0 = jnp.asarray(delays, jnp.float32), proj.layout.weights
    gd, gw = jax.grad(loss, argnums=(0, 1))(d0, w0)
    h = 0.01
    for i in range(n):
        fd = (float(loss(d0.at[i].add(h), w0)) - float(loss(d0.at[i].add(-h), w0))) / (2 * h)
        assert gd[i] != 0
        np.testing.assert_allclose(gd[i], fd, rtol=1e-2, err_msg=f"delay {i}")
        hw = 1e-3
        fd = (float(loss(d0, w0.at[i].add(hw))) - float(loss(d0, w0.at[i].add(-hw)))) / (2 * hw)
        np.testing.assert_allclose(gw[i], fd, rtol=1e-2, err_msg=f"weight {i}")


@pytest.mark.slow
def test_gradient_through_a_spiking_network_is_finite():
    """Surrogate gradients of the recurrent network's spike count reach every delay."""
    delay = lambda k, n: np.asarray(jax.random.uniform(k, (n,), minval=0.1, maxval=1.5))  # noqa: E731
    net = _recurrent(delay, learnable=True)

    def count(d):
        m = eqx.tree_at(lambda m: m.projections[0].delay, net, d)
        _, rec = nj.simulate(
            m,
            m.init_state(jax.random.key(1)),
            {"N": 17.0},
            dt=DT,
            n_steps=200,
            record=lambda s, o: {"s": o["N"]},
        )
        return jnp.sum(rec.s)

    g = np.asarray(jax.grad(count)(net.projections[0].delay))
    assert np.all(np.isfinite(g)) and np.count_nonzero(g) > 0.5 * g.size


def test_vmap_over_delays_equals_separate_runs():
    net = _line([0.3, 0.55, 1.18], 40, max_delay=2.0)

    def run(d):
        return _arrivals(eqx.tree_at(lambda m: m.projections[0].delay, net, d), 40)

    ds = jnp.array([[0.3, 0.55, 1.18], [1.9, 0.0, 0.71], [0.05, 1.5, 1.0]])
    batched = np.asarray(jax.jit(jax.vmap(run))(ds))
    for i in range(3):
        np.testing.assert_allclose(batched[i], np.asarray(run(ds[i])), atol=1e-7)


@pytest.mark.slow
def test_learns_a_target_spike_time_pattern():
    """Eight sources spike together at 2 ms; each drives one LIF through a learnable delay.
    The targets are the conductance traces (a van Rossum filter of the arrivals, 4 ms) that
    delays of 1.5 .. 6.4 ms produce. From 4 ms for every synapse, Adam on the squared
    distance of the traces moves the delays to the target (within 0.05 ms), and the LIF
    then fire at the target times (same step)."""
    n, n_steps = 8, 160
    target_d = np.linspace(1.5, 6.4, n)
    w = np.full(n, 3.0, np.float32)

    def network(delays):
        table = np.zeros((n_steps, n), np.float32)
        table[20] = 1
        proj = nj.Projection(
            "S",
            "P",
            np.diag(w),
            synapse=nj.Exponential(4.0),
            output=nj.ConductanceOutput(0.0),
            delay=delays,
            learnable_delays=True,
            max_delay=8.0,
        )
        pops = {"S": (Times(jnp.asarray(table)), n), "P": (nj.LIF(tau_m=10.0, t_ref=5.0), n)}
        return nj.Network(pops, [proj], dt=DT)

    def trace(net):
        _, rec = nj.simulate(
            net,
            net.init_state(jax.random.key(0)),
            dt=DT,
            n_steps=n_steps,
            record=lambda s, o: {"g": s.synapses[0].g, "s": o["P"]},
        )
        return rec.g, rec.s

    target_g, target_s = trace(network(target_d))
    assert np.all(np.asarray(target_s).sum(0) >= 1)  # every output neuron fires
    net = network(np.full(n, 4.03))  # off the grid: a whole step is a kink of the loss

    def loss(d):
        g, _ = trace(eqx.tree_at(lambda m: m.projections[0].delay, net, d))
        return jnp.mean((g - target_g) ** 2)

    opt = optax.adam(0.05)
    d = net.projections[0].delay
    state = opt.init(d)

    @jax.jit
    def update(d, state):
        value, g = jax.value_and_grad(loss)(d)
        upd, state = opt.update(g, state)
        return optax.apply_updates(d, upd), state, value

    first = None
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
        for _ in range(200):
            d, state, value = update(d, state)
            first = value if first is None else first
    np.testing.assert_allclose(np.asarray(d), target_d, atol=0.05)
    assert float(loss(d)) < 1e-3 * float(first)
    _, s = trace(eqx.tree_at(lambda m: m.projections[0].delay, net, d))
    np.testing.assert_array_equal(np.argmax(np.asarray(s), 0), np.argmax(np.asarray(target_s), 0))


def test_invalid_options_are_refused():
    eye = np.eye(2, dtype=np.float32)
    with pytest.raises(TypeError, match="Projection: learnable_delays must be True or False"):
        nj.Projection("A", "B", eye, learnable_delays="yes")
    with pytest.raises(ValueError, match="Projection: max_delay is only used with learnable"):
        nj.Projection("A", "B", eye, delay=1.0, max_delay=2.0)
    with pytest.raises(
        ValueError, match=r"max_delay must be finite and >= the largest delay \(1.5"
    ):
        nj.Projection("A", "B", eye, delay=[1.0, 1.5], learnable_delays=True, max_delay=1.0)
    with pytest.raises(ValueError, match="learnable_delays need layout='event'"):
        nj.Projection("A", "B", eye, delay=1.0, learnable_delays=True, method="dense")
    with pytest.raises(ValueError, match="learnable_delays need static weights"):
        nj.Projection("A", "B", eye * 0.5, learnable_delays=True, plasticity=nj.STDP())
    with pytest.raises(ValueError, match="delay must be a scalar or have one value per synapse"):
        nj.Projection("A", "B", eye, delay=[1.0, 2.0, 3.0], learnable_delays=True)
    proj = nj.Projection("A", "A", eye, learnable_delays=True)
    with pytest.raises(ValueError, match="Network: projections\\[0\\] .* has learnable delays"):
        nj.Network({"A": (nj.LIF(), 2)}, [proj])


def test_shard_network_refuses_learnable_delays():
    from jax.sharding import Mesh

    proj = nj.Projection("A", "A", np.eye(2, dtype=np.float32), delay=0.5, learnable_delays=True)
    net = nj.Network({"A": (nj.LIF(), 2)}, [proj], dt=DT)
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    with pytest.raises(ValueError, match="shard_network: .* learnable delays"):
        nj.parallel.shard_network(net, mesh)
