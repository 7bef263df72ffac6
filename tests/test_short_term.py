"""Tsodyks-Markram short-term plasticity (`nj.TsodyksMarkram` as a projection's `short_term`).

References: the closed-form steady state of a regular train and an event-by-event NumPy
recursion in float64 of the model of Tsodyks, Pawelzik and Markram (1998) (u jumps before
release; see the class docstring), written here independently of the implementation.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
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


def _network(table, conn, stp, *, delay=0.0, method="auto", n_post=None):
    n = table.shape[1]
    n_post = conn.shape[1] if n_post is None else n_post
    proj = nj.Projection(
        "S", "P", conn, synapse=nj.Delta(), delay=delay, method=method, short_term=stp
    )
    pops = {"S": (Times(jnp.asarray(table, jnp.float32)), n), "P": (nj.LIF(v_th=1e9), n_post)}
    return nj.Network(pops, [proj], dt=DT)


def _record(net, n_steps, state=None):
    state = net.init_state(jax.random.key(0)) if state is None else state
    final, rec = nj.simulate(
        net, state, dt=DT, n_steps=n_steps, record=lambda s, o: {"x": s.synapses[0].g * DT}
    )
    return final, np.asarray(rec.x)


def _numpy_releases(table, u_par, tau_rec, tau_facil, dt=DT):
    """Event-by-event float64 recursion: per neuron, the release `u+ R-` of each spike."""
    n_steps, n = table.shape
    u_par, tau_rec, tau_facil = (
        np.broadcast_to(np.float64(x), (n,)) for x in (u_par, tau_rec, tau_facil)
    )
    out = np.zeros((n_steps, n))
    for i in range(n):
        u, r, t_last = 0.0, 1.0, 0.0
        for k in np.nonzero(table[:, i])[0]:
            t = (k + 1) * dt
            delta = t - t_last
            u_minus = u * np.exp(-delta / tau_facil[i]) if tau_facil[i] > 0 else 0.0
            r_minus = 1 - (1 - r) * np.exp(-delta / tau_rec[i])
            u = u_minus + u_par[i] * (1 - u_minus)
            out[k, i] = u * r_minus
            r = r_minus - u * r_minus
            t_last = t
    return out


@pytest.mark.parametrize("name", ["depressing", "facilitating"])
def test_regular_train_reaches_the_closed_form_steady_state(name):
    """A 40 Hz train: the release of late spikes equals u_inf R_inf of the periodic
    solution (formula derived in the class docstring, recomputed here in float64)."""
    stp = nj.TsodyksMarkram.preset(name)
    u_par, tau_rec, tau_facil = nj.TsodyksMarkram.PRESETS[name]
    # 25 ms, 200 spikes: facilitation converges by (1 - U) e^{-T/tau_facil} = 0.925 a spike.
    period_steps, n_steps = 250, 50000
    table = np.zeros((n_steps, 1), np.float32)
    table[::period_steps, 0] = 1
    _, x = _record(_network(table, np.ones((1, 1), np.float32), stp), n_steps)
    period = period_steps * DT
    e_f = np.exp(-period / tau_facil) if tau_facil > 0 else 0.0
    e_r = np.exp(-period / tau_rec)
    u_inf = u_par / (1 - (1 - u_par) * e_f)
    r_inf = (1 - e_r) / (1 - (1 - u_inf) * e_r)
    releases = x[1::period_steps, 0]  # spike at step k arrives at k + 1
    assert releases.shape == (200,)
    # The first spike from rest releases U; the train then converges geometrically.
    np.testing.assert_allclose(releases[0], u_par, rtol=1e-6)
    np.testing.assert_allclose(releases[-1], u_inf * r_inf, rtol=2e-4)
    np.testing.assert_allclose(np.prod(stp.steady_state(period)), u_inf * r_inf, rtol=1e-5)
    if name == "depressing":
        assert releases[-1] < 0.1 * releases[0]
    else:
        assert releases[-1] > 3 * releases[0]


def _irregular(n_steps, n, rate_hz, seed):
    rng = np.random.default_rng(seed)
    return (rng.random((n_steps, n)) < rate_hz * DT * 1e-3).astype(np.float32)


@pytest.mark.parametrize(
    "params",
    [
        nj.TsodyksMarkram.PRESETS["depressing"],
        nj.TsodyksMarkram.PRESETS["facilitating"],
        (
            np.array([0.1, 0.3, 0.5, 0.7, 0.9]),
            np.array([50.0, 100, 200, 400, 800]),
            np.array([0.0, 20.0, 100.0, 300.0, 1000.0]),
        ),
    ],
    ids=["depressing", "facilitating", "per-neuron"],
)
def test_irregular_train_matches_the_event_by_event_recursion(params):
    """Poisson trains (40 Hz, 5 neurons, 2 s) and a 1.3 ms delay: every delivered value equals
    the float64 recursion's release at the spike, 13 steps + 1 later (float32: rtol 1e-5)."""
    n_steps, n = 20000, 5
    table = _irregular(n_steps, n, 40.0, 1)
    stp = nj.TsodyksMarkram(*params)
    _, x = _record(_network(table, np.eye(n, dtype=np.float32), stp, delay=1.3), n_steps)
    expected = np.zeros_like(x, dtype=np.float64)
    expected[14:] = _numpy_releases(table, *params)[:-14]
    assert np.count_nonzero(expected) > 300
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-7)


def _numpy_per_step(table, u_par, tau_rec, tau_facil, dt=DT):
    """The per-step integration in float64: every step, every neuron's u and R relax over
    one step (u e^{-dt/tau_facil}, 1 - (1 - R) e^{-dt/tau_rec}), then a spike at the end of
    the step jumps u, releases u+ R- and lowers R. Returns the releases `(n_steps, n)` and
    u, R at the end of the run."""
    n_steps, n = table.shape
    u_par, tau_rec, tau_facil = (
        np.broadcast_to(np.float64(x), (n,)) for x in (u_par, tau_rec, tau_facil)
    )
    decay_f = np.where(tau_facil > 0, np.exp(-dt / np.where(tau_facil > 0, tau_facil, 1)), 0.0)
    decay_r = np.exp(-dt / tau_rec)
    u, r = np.zeros(n), np.ones(n)
    out = np.zeros((n_steps, n))
    for k in range(n_steps):
        u = u * decay_f
        r = 1 - (1 - r) * decay_r
        s = table[k] > 0
        u = np.where(s, u + u_par * (1 - u), u)
        out[k] = np.where(s, u * r, 0.0)
        r = np.where(s, r - out[k], r)
    return out, u, r


@pytest.mark.parametrize("mode", ["auto", "reference"])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["single", "batch-2"])
def test_lazy_state_equals_the_per_step_integration(mode, batch):
    """Random trains (6 neurons with per-neuron parameters, 30 Hz, 1.5 s): the releases of
    `release` (compiled kernel in "auto" on CPU, pure JAX in "reference"), called step by
    step under jit (and under vmap over the trials), equal those of the float64 per-step integration, and the lazy state
    relaxed to the end of the run equals its u and R (float32: rtol 1e-5, the per-step
    decays compound ~10^4 roundings in float32 but not in float64)."""
    n_steps, n = 15000, 6
    params = (
        np.array([0.05, 0.2, 0.5, 0.5, 0.8, 1.0]),
        np.array([30.0, 100.0, 800.0, 200.0, 50.0, 400.0]),
        np.array([0.0, 50.0, 0.0, 600.0, 20.0, 100.0]),
    )
    stp = nj.TsodyksMarkram(*params)
    tables = [_irregular(n_steps, n, 30.0, 10 + b) for b in range(max(1, math.prod(batch)))]
    spikes = jnp.asarray(np.stack(tables, axis=1).reshape((n_steps, *batch, n)))

    def run(spikes):
        def body(state, xs):
            k, s = xs
            return stp.release(state, s, k, DT)

        steps = jnp.arange(n_steps, dtype=jnp.int32)
        return jax.lax.scan(body, stp.init_state(spikes.shape[1:]), (steps, spikes))

    with nj.kernels.use(mode):
        final, rel = jax.jit(run)(spikes)
        if batch:  # the trials as a vmapped axis: the same values
            vfinal, vrel = jax.jit(jax.vmap(run, in_axes=1, out_axes=(0, 1)))(spikes)
            np.testing.assert_array_equal(np.asarray(vrel), np.asarray(rel))
            np.testing.assert_array_equal(np.asarray(vfinal.r), np.asarray(final.r))
    rel = np.asarray(rel).reshape(n_steps, -1, n)
    end = n_steps * DT
    for b, table in enumerate(tables):
        want, u_end, r_end = _numpy_per_step(table, *params)
        assert np.count_nonzero(want) > 150
        np.testing.assert_allclose(rel[:, b], want, rtol=1e-5, atol=1e-7)
        u_lazy = np.asarray(final.u, np.float64).reshape(-1, n)[b]
        r_lazy = np.asarray(final.r, np.float64).reshape(-1, n)[b]
        gap = end - np.asarray(final.last).reshape(-1, n)[b] * DT
        tau_f, tau_r = params[2], params[1]
        e_f = np.where(tau_f > 0, np.exp(-gap / np.where(tau_f > 0, tau_f, 1)), 0.0)
        np.testing.assert_allclose(u_lazy * e_f, u_end, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(1 - (1 - r_lazy) * np.exp(-gap / tau_r), r_end, rtol=1e-5)


def test_kernel_equals_the_reference_in_a_network():
    """A group sending through a static and a facilitating projection (event layout,
    delays 0.3 ms): the compiled path (one delivery call) and the pure-JAX path with a spike
    buffer of 1 (a spike and its release need 2, so `nj.simulate` reruns with a larger one)
    give the same arrivals and short-term state (rtol 1e-6: std::exp against XLA's exp)."""
    n_steps, n = 2000, 5
    table = _irregular(n_steps, n, 70.0, 11)
    pops = {"S": (Times(jnp.asarray(table)), n), "P": (nj.LIF(v_th=1e9), n)}
    w = np.random.default_rng(12).uniform(0.2, 1.0, (n, n)).astype(np.float32)
    static = nj.Projection("S", "P", w, method="event", delay=0.3)
    stp = nj.Projection(
        "S", "P", w, method="event", delay=0.3, short_term=nj.TsodyksMarkram(0.3, 120.0, 80.0)
    )
    rec = lambda s, o: {"g": s.synapses[0].g, "h": s.synapses[1].g}  # noqa: E731
    out = {}
    for mode, capacity in (("auto", None), ("reference", 1)):
        net = nj.Network(pops, [static, stp], dt=DT, spike_capacity=capacity)
        with nj.kernels.use(mode):
            fin, r = nj.simulate(
                net, net.init_state(jax.random.key(0)), dt=DT, n_steps=n_steps, record=rec
            )
        out[mode] = (fin, r)
    (fa, ra), (fr, rr) = out["auto"], out["reference"]
    assert np.count_nonzero(np.asarray(ra.h)) > 100
    np.testing.assert_array_equal(np.asarray(ra.g), np.asarray(rr.g))
    np.testing.assert_allclose(np.asarray(ra.h), np.asarray(rr.h), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fa.short_term[1].r, fr.short_term[1].r, rtol=1e-6)
    np.testing.assert_array_equal(fa.short_term[1].last, fr.short_term[1].last)


@pytest.mark.parametrize("method", ["event", "dense", "bcoo"])
def test_every_layout_delivers_the_scaled_weights(method):
    """Random weights (8 -> 6, p = 0.5): arrivals are `release(t - 1 - d) @ W` for every
    layout, W dense from the connectivity (homogeneous delay of 0.5 ms = 5 steps)."""
    n_steps, n_pre, n_post = 3000, 8, 6
    conn = nj.connect.fixed_prob(jax.random.key(3), n_pre, n_post, 0.5, weight=0.7)
    w = np.asarray(conn.todense(), np.float64) * np.linspace(0.5, 1.5, n_post)
    conn = nj.connect.from_dense(w.astype(np.float32))
    table = _irregular(n_steps, n_pre, 60.0, 2)
    params = nj.TsodyksMarkram.PRESETS["facilitating"]
    _, x = _record(
        _network(table, conn, nj.TsodyksMarkram(*params), delay=0.5, method=method), n_steps
    )
    rel = _numpy_releases(table, *params)
    expected = np.zeros((n_steps, n_post))
    expected[6:] = (rel @ w)[:-6]
    np.testing.assert_allclose(x, expected, rtol=2e-5, atol=1e-6)


def test_a_static_projection_beside_it_is_unchanged():
    """Two projections from one group, one with short-term plasticity: the static one
    delivers exactly what it delivers alone (bit for bit)."""
    n_steps, n = 1500, 4
    table = _irregular(n_steps, n, 80.0, 4)
    src = Times(jnp.asarray(table))
    pops = {"S": (src, n), "P": (nj.LIF(v_th=1e9), n), "Q": (nj.LIF(v_th=1e9), n)}
    eye = np.eye(n, dtype=np.float32) * 0.3
    static = nj.Projection("S", "P", eye, method="event", delay=0.2)
    stp = nj.Projection(
        "S", "Q", eye, method="event", delay=0.2, short_term=nj.TsodyksMarkram.preset("depressing")
    )
    rec = lambda s, o: {"p": s.synapses[0].g, "q": s.synapses[-1].g}  # noqa: E731
    key = jax.random.key(0)
    both = nj.Network(pops, [static, stp], dt=DT)
    _, r_both = nj.simulate(both, both.init_state(key), dt=DT, n_steps=n_steps, record=rec)
    alone = nj.Network(pops, [static], dt=DT)
    _, r_alone = nj.simulate(alone, alone.init_state(key), dt=DT, n_steps=n_steps, record=rec)
    np.testing.assert_array_equal(np.asarray(r_both.p), np.asarray(r_alone.p))
    assert np.asarray(r_both.q).sum() < np.asarray(r_both.p).sum()  # depressed


def _loss_fn(table, n_steps):
    """A smooth function of the parameters and weights: the time-weighted arrivals."""
    n = table.shape[1]
    ramp = jnp.linspace(1.0, 2.0, n_steps)[:, None]

    base = _network(
        table, np.eye(n, dtype=np.float32), nj.TsodyksMarkram(), delay=0.3, method="event"
    )

    def loss(u, tau_rec, tau_facil, w):
        stp = nj.TsodyksMarkram(u=u, tau_rec=tau_rec, tau_facil=tau_facil)
        net = eqx.tree_at(lambda m: m.projections[0].short_term, base, stp)
        net = eqx.tree_at(lambda m: m.projections[0].layout.weights, net, w)
        state = net.init_state(jax.random.key(0))
        _, rec = nj.simulate(
            net, state, dt=DT, n_steps=n_steps, record=lambda s, o: {"x": s.synapses[0].g}
        )
        return jnp.sum(rec.x * ramp) * DT

    return loss


def test_gradients_match_finite_differences():
    """jax.grad with respect to U, tau_rec, tau_facil and the weights against central
    differences (float32, relative step 1e-2 where curvature is small: rtol 2e-2)."""
    n_steps, n = 2000, 3
    table = _irregular(n_steps, n, 50.0, 5)
    loss = jax.jit(_loss_fn(table, n_steps))
    args = [jnp.float32(0.2), jnp.float32(150.0), jnp.float32(200.0), jnp.full((n,), 0.8)]
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    for i, g in enumerate(grads):
        g = np.asarray(g).reshape(-1)
        base = np.asarray(args[i]).reshape(-1)
        for j in range(g.size):
            h = 1e-2 * abs(base[j])
            plus = [a for a in args]
            minus = [a for a in args]
            plus[i] = jnp.asarray(base.copy()).at[j].add(h).reshape(np.shape(args[i]))
            minus[i] = jnp.asarray(base.copy()).at[j].add(-h).reshape(np.shape(args[i]))
            fd = (float(loss(*plus)) - float(loss(*minus))) / (2 * h)
            assert g[j] != 0
            np.testing.assert_allclose(g[j], fd, rtol=2e-2, err_msg=f"argument {i}[{j}]")


def test_release_gradient_with_respect_to_the_spikes():
    """`release` is smooth in the (surrogate-carrying) spike values: its gradient with respect
    to them matches central differences, and flows through the state into later releases."""
    stp = nj.TsodyksMarkram.preset("facilitating")
    state = stp.init_state(3)

    def f(s):
        st, r1 = stp.release(state, s, jnp.int32(10), DT)
        _, r2 = stp.release(st, jnp.ones(3), jnp.int32(200), DT)
        return jnp.sum(r1 * jnp.arange(1.0, 4.0)) + jnp.sum(r2 * r2)

    s0 = jnp.array([1.0, 0.0, 0.6])
    g = np.asarray(jax.grad(f)(s0))
    fd = [(float(f(s0.at[i].add(1e-2))) - float(f(s0.at[i].add(-1e-2)))) / 2e-2 for i in range(3)]
    np.testing.assert_allclose(g, fd, rtol=1e-3)


@pytest.mark.slow
def test_gradient_reaches_input_current_through_surrogate_spikes():
    """A LIF presynaptic population driven by an external current: the gradient of the
    postsynaptic arrivals with respect to the current is finite and nonzero."""
    n = 4
    proj = nj.Projection(
        "A",
        "B",
        np.eye(n, dtype=np.float32),
        synapse=nj.Exponential(5.0),
        short_term=nj.TsodyksMarkram.preset("depressing"),
    )
    net = nj.Network({"A": (nj.LIF(), n), "B": (nj.LIF(v_th=1e9), n)}, [proj], dt=DT)

    def loss(i_ext):
        state = net.init_state()
        _, rec = nj.simulate(
            net,
            state,
            {"A": i_ext},
            dt=DT,
            n_steps=400,
            record=lambda s, o: {"g": s.synapses[0].g},
        )
        return jnp.sum(rec.g)

    g = jax.grad(loss)(jnp.full((n,), 20.0))
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g) != 0)


@pytest.mark.slow
def test_vmap_over_parameters_equals_separate_runs():
    n_steps, n = 1500, 3
    table = _irregular(n_steps, n, 80.0, 6)

    base = _network(table, np.eye(n, dtype=np.float32), nj.TsodyksMarkram(0.5, 100.0, 300.0))

    def run(u):
        net = eqx.tree_at(lambda m: m.projections[0].short_term.u, base, u)
        return _record_jax(net, n_steps)

    us = jnp.array([0.1, 0.4, 0.8])
    batched = np.asarray(jax.vmap(run)(us))
    for i, u in enumerate(us):
        np.testing.assert_allclose(batched[i], np.asarray(run(u)), rtol=1e-6, atol=1e-7)


def _record_jax(net, n_steps, state=None):
    state = net.init_state(jax.random.key(0)) if state is None else state
    _, rec = nj.simulate(
        net, state, dt=DT, n_steps=n_steps, record=lambda s, o: {"x": s.synapses[0].g * DT}
    )
    return rec.x


def test_batched_trials_keep_their_own_state():
    """A batch of 2 trials of a LIF presynaptic population with different drives: each
    trial's short-term state and arrivals equal those of its own unbatched run."""
    n = 3
    proj = nj.Projection(
        "A",
        "B",
        np.eye(n, dtype=np.float32),
        method="event",
        short_term=nj.TsodyksMarkram.preset("depressing"),
    )
    net = nj.Network({"A": (nj.LIF(), n), "B": (nj.LIF(v_th=1e9), n)}, [proj], dt=DT)
    drive = jnp.array([[20.0, 30.0, 40.0], [60.0, 16.0, 25.0]])
    rec = lambda s, o: {"g": s.synapses[0].g}  # noqa: E731
    fin, r = nj.simulate(net, net.init_state(batch=2), {"A": drive}, dt=DT, n_steps=800, record=rec)
    for b in range(2):
        fb, rb = nj.simulate(net, net.init_state(), {"A": drive[b]}, dt=DT, n_steps=800, record=rec)
        np.testing.assert_allclose(np.asarray(r.g)[:, b], np.asarray(rb.g), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(fin.short_term[0].r[b], fb.short_term[0].r, rtol=1e-6)
    assert fin.short_term[0].r.shape == (2, n)


def test_state_saves_and_resumes(tmp_path):
    """A run split at a checkpoint (nj.save / nj.load) equals the uninterrupted run."""
    n_steps, n = 2000, 3
    table = _irregular(n_steps, n, 60.0, 7)
    net = _network(table, np.eye(n, dtype=np.float32), nj.TsodyksMarkram.preset("facilitating"))
    _, whole = _record(net, n_steps)
    mid, first = _record(net, 1000)
    nj.save(tmp_path / "ck", mid)
    resumed = nj.load(tmp_path / "ck", mid)
    _, second = _record(net, 1000, resumed)
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match=r"TsodyksMarkram: u must be in \(0, 1\], got 1.5"):
        nj.TsodyksMarkram(u=1.5)
    with pytest.raises(ValueError, match="TsodyksMarkram: u must be in"):
        nj.TsodyksMarkram(u=0.0)
    with pytest.raises(ValueError, match="TsodyksMarkram: tau_rec must be > 0 ms"):
        nj.TsodyksMarkram(tau_rec=0.0)
    with pytest.raises(ValueError, match="TsodyksMarkram: tau_facil must be >= 0 ms"):
        nj.TsodyksMarkram(tau_facil=-1.0)
    with pytest.raises(ValueError, match="TsodyksMarkram: u must be a scalar or one value"):
        nj.TsodyksMarkram(u=np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="TsodyksMarkram.preset: name must be one of"):
        nj.TsodyksMarkram.preset("pseudo-linear")
    with pytest.raises(
        TypeError, match="Projection: short_term must be None, an nj.TsodyksMarkram or another"
    ):
        nj.Projection("A", "B", np.eye(2, dtype=np.float32), short_term=0.5)
    with pytest.raises(ValueError, match="short_term.tau_rec has 3 values but the presynaptic"):
        nj.Projection(
            "A",
            "B",
            np.eye(2, dtype=np.float32),
            short_term=nj.TsodyksMarkram(tau_rec=np.array([1.0, 2.0, 3.0])),
        )


def test_release_refuses_spikes_of_another_shape():
    stp = nj.TsodyksMarkram.preset("depressing")
    with pytest.raises(
        ValueError, match=r"release: spikes of shape \(4,\) do not match the state's \(3,\)"
    ):
        stp.release(stp.init_state(3), jnp.ones(4), jnp.int32(0), DT)


def test_shard_network_refuses_short_term_plasticity():
    from jax.sharding import Mesh

    proj = nj.Projection(
        "A", "A", np.eye(2, dtype=np.float32), short_term=nj.TsodyksMarkram.preset("depressing")
    )
    net = nj.Network({"A": (nj.LIF(), 2)}, [proj], dt=DT)
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    with pytest.raises(ValueError, match="shard_network: short-term plasticity and learnable"):
        nj.parallel.shard_network(net, mesh)


def test_a_state_without_short_term_state_is_refused():
    proj = nj.Projection(
        "A", "A", np.eye(2, dtype=np.float32), short_term=nj.TsodyksMarkram.preset("depressing")
    )
    net = nj.Network({"A": (nj.LIF(), 2)}, [proj], dt=DT)
    s = net.init_state()
    old = nj.network.NetworkState(s.populations, s.synapses, s.buffers, s.step, s.plastic, s.peak)
    with pytest.raises(ValueError, match="Network.step: the network has short-term plasticity"):
        net.step(old, None, DT)


@pytest.mark.slow
def test_short_term_plasticity_on_a_plastic_projection():
    """STDP with a_plus = a_minus = 0 keeps the weights: the projection then delivers what the
    same projection without STDP delivers (the releases times the plastic weights)."""
    n_steps, n = 1500, 4
    table = _irregular(n_steps, n, 60.0, 8)
    stp = nj.TsodyksMarkram.preset("facilitating")
    conn = np.eye(n, dtype=np.float32) * 0.5
    pops = {"S": (Times(jnp.asarray(table)), n), "P": (nj.LIF(v_th=1e9), n)}
    rule = nj.STDP(a_plus=0.0, a_minus=0.0, w_min=0.0, w_max=1.0)
    plastic = nj.Network(
        pops, [nj.Projection("S", "P", conn, plasticity=rule, short_term=stp)], dt=DT
    )
    static = nj.Network(
        pops, [nj.Projection("S", "P", conn, method="event", short_term=stp)], dt=DT
    )
    _, x_plastic = _record(plastic, n_steps)
    _, x_static = _record(static, n_steps)
    assert np.count_nonzero(x_static) > 10
    np.testing.assert_allclose(x_plastic, x_static, rtol=1e-6, atol=1e-8)


class Halving(nj.synapses.ShortTermRule):
    """A rule of the reader's own (the `ShortTermRule` docstring's example): each spike
    releases the available fraction r and halves it; r recovers to 1 with `tau_rec` ms."""

    tau_rec: float = 5.0

    def init_state(self, shape):
        return jnp.ones(shape, jnp.float32)

    def release(self, r, spikes, step, dt):
        r = 1.0 - (1.0 - r) * jnp.exp(-dt / self.tau_rec)
        out = spikes * r
        return r - 0.5 * out, out


def test_a_rule_of_your_own_runs_in_a_network():
    """`nj.synapses.ShortTermRule` is open for rules outside neurojax: a projection with
    `Halving` delivers, per spike, the float64 per-step recursion of the same rule (after a
    delay of 0.7 ms: 7 steps + 1), under jit and vmap over its time constant."""
    n_steps, n = 3000, 4
    table = _irregular(n_steps, n, 60.0, 3)
    net = _network(table, np.eye(n, dtype=np.float32), Halving(), delay=0.7)
    _, x = _record(net, n_steps)
    r = np.ones(n)
    want = np.zeros((n_steps, n))
    for k in range(n_steps):
        r = 1.0 - (1.0 - r) * np.exp(-DT / 5.0)
        want[k] = table[k] * r
        r = r - 0.5 * want[k]
    expected = np.zeros_like(want)
    expected[8:] = want[:-8]
    assert np.count_nonzero(expected) > 50
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-7)

    short = _network(table[:500], np.eye(n, dtype=np.float32), Halving(), delay=0.7)

    def total(tau):
        edited = eqx.tree_at(lambda m: m.projections[0].short_term.tau_rec, short, tau)
        state = edited.init_state(jax.random.key(0))
        _, rec = nj.simulate(edited, state, dt=DT, n_steps=500, record=lambda s, o: s.synapses[0].g)
        return jnp.sum(rec.values) * DT

    taus = jnp.asarray([2.0, 5.0], jnp.float32)
    sums = jax.jit(jax.vmap(total))(taus)
    np.testing.assert_allclose(sums[1], x[:500].sum(), rtol=1e-5)
    assert sums[0] > sums[1]  # faster recovery leaves more to release
    with pytest.raises(TypeError, match="another nj.synapses.ShortTermRule, got Delta"):
        nj.Projection("S", "P", np.eye(n, dtype=np.float32), short_term=nj.Delta())
