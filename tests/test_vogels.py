"""`nj.VogelsSTDP` (Vogels et al. 2011): the excitatory rate of a conductance-based E/I
network converges to the target `rho0`; event path against a NumPy sum over spike pairs and
the dense reference; `jit`, `vmap` and `grad`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import neurojax as nj

DT = 0.1
PULSE = 1e4


def vogels_network(n_exc, n_inh, p, p_ie, rule, key=0):
    """The network of Vogels et al. (2011, supplementary; Brian2's example of the paper),
    scaled down: conductance-based LIF (tau_m = 20 ms, E_L = V_reset = -60 mV,
    V_th = -50 mV, 5 ms refractory, 200 pA / 10 nS = 20 mV drive), AMPA 5 ms (0.3 nS =
    0.03 g_L) from every E, GABA 10 ms (I->I 3 nS = 0.3 g_L), I->E plastic from 0. Conductances
    in units of the leak conductance. `p_ie` sets the inhibitory in-degree of an E cell (40 in
    the paper's 10 000-neuron network)."""
    lif = nj.LIF(
        tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, r_m=1.0, t_ref=5.0, method="euler"
    )
    ks = jr.split(jr.key(key), 5)
    ampa = dict(synapse=nj.Exponential(5.0), output=nj.ConductanceOutput(0.0))
    gaba = dict(synapse=nj.Exponential(10.0), output=nj.ConductanceOutput(-80.0))
    fp = nj.connect.fixed_prob
    projs = [
        nj.Projection("E", "E", fp(ks[0], n_exc, n_exc, p, weight=0.03), **ampa),
        nj.Projection("E", "I", fp(ks[1], n_exc, n_inh, p, weight=0.03), **ampa),
        nj.Projection("I", "I", fp(ks[2], n_inh, n_inh, p, weight=0.3), **gaba),
        nj.Projection("I", "E", fp(ks[3], n_inh, n_exc, p_ie, weight=0.0), **gaba, plasticity=rule),
    ]
    net = nj.Network({"E": (lif, n_exc), "I": (lif, n_inh)}, projs, inputs={"E": 20.0, "I": 20.0})
    v = -60.0 + 10.0 * jr.uniform(ks[4], (n_exc + n_inh,))
    state = eqx.tree_at(
        lambda s: (s.populations["E"].v, s.populations["I"].v),
        net.init_state(),
        (v[:n_exc], v[n_exc:]),
    )
    return net, state


def rates_per_second(net, state, seconds):
    """Mean E rate [Hz] in each simulated second, and the final state (`nj.simulate` outside
    `jit`, so that a second whose spikes overflow the event path's buffer is rerun larger)."""
    out = []
    for _ in range(seconds):
        state, rec = nj.simulate(net, state, dt=DT, n_steps=10_000)
        out.append(float(np.asarray(rec.spikes["E"]).mean()) * 1e4)
    return np.array(out), state


@pytest.mark.slow
def test_excitatory_rate_converges_to_rho0():
    """400 E / 100 I (in-degrees 80 E and 40 I). Without inhibition the E cells fire at
    ~11 Hz; after 3 s of learning the mean E rate over the next 4 s is rho0 = 3 Hz within
    15 % (the second-to-second spread of this small network is about +-25 %, hence the
    4 s average)."""
    rule = nj.VogelsSTDP(eta=1e-2, tau=20.0, rho0=3.0, w_max=10.0)
    net, state = vogels_network(400, 100, 0.2, 0.4, rule)
    rates, final = rates_per_second(net, state, 7)
    assert rates[0] > 2.5 * 3.0  # far above the target before inhibition has grown
    assert abs(rates[3:].mean() / 3.0 - 1.0) < 0.15, rates
    w = np.asarray(final.plastic[3].weights)
    assert w.min() >= 0.0 and w.max() > 0.1  # inhibition grew from zero, stays non-negative


@pytest.mark.slow
def test_excitatory_rate_converges_to_rho0_larger_network():
    """800 E / 200 I with the paper's in-degrees (160 E, 40 I), rho0 = 5 Hz: 6 s of
    learning, then the mean over 8 s within 15 % of rho0. (With rho0 = 3 Hz at this eta the
    rate is still 4.8 Hz after 10 s: learning is slower there.) After learning the rate
    fluctuates around its mean by about a hertz from one second to the next, so a mean over
    4 s lands anywhere from 4 % to 16 % above rho0 depending on the trajectory, which a
    last-bit change of rounding (the compiled kernel against the pure-JAX path) reshuffles;
    8 s average that out (10 % and 13 % on the two paths)."""
    rho0 = 5.0
    rule = nj.VogelsSTDP(eta=5e-3, tau=20.0, rho0=rho0, w_max=10.0)
    net, state = vogels_network(800, 200, 0.2, 0.2, rule)
    rates, _ = rates_per_second(net, state, 14)
    assert abs(rates[6:].mean() / rho0 - 1.0) < 0.15, rates


# ---------------------------------------------------------------- the rule itself


def forced_lif(**kwargs):
    return nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=0.0, **kwargs)


def raster(n_steps, spike_steps):
    out = np.zeros((n_steps, len(spike_steps)), bool)
    for i, steps in enumerate(spike_steps):
        out[np.asarray(steps, int), i] = True
    return out


def pulses(spikes):
    return PULSE * np.asarray(spikes, np.dtype(jnp.result_type(float)))


def forced_net(rule, conn, n_pre, n_post, delay, lif=None, inputs=None):
    proj = nj.Projection(
        "pre",
        "post",
        conn,
        synapse=nj.Delta(),
        output=nj.ConductanceOutput(0.0),
        delay=delay,
        plasticity=rule,
    )
    lif = lif or forced_lif()
    return nj.Network({"pre": (lif, n_pre), "post": (lif, n_post)}, [proj], inputs=inputs, dt=DT)


def pair_sum(rule, w0, arrivals, post, pre_idx, post_idx, dt):
    """Independent NumPy reference (no bounds reached): every (arrival, post spike) pair of a
    synapse adds eta exp(-|lag| / tau) at the later of the two (an arrival and a post spike
    of the same step count once), and every arrival subtracts eta alpha."""
    eta, tau, alpha = float(rule.eta), float(rule.tau), float(rule.alpha)
    out = np.tile(np.asarray(w0, np.float64), (arrivals.shape[0], 1))
    for s, (i, j) in enumerate(zip(pre_idx, post_idx, strict=True)):
        for a in np.flatnonzero(arrivals[:, i]):
            out[a:, s] -= eta * alpha
            for p in np.flatnonzero(post[:, j]):
                out[max(a, p) :, s] += eta * np.exp(-abs(p - a) * dt / tau)
    return out


def test_event_path_equals_pair_sum_and_dense_reference():
    n_steps, delay, d = 2000, 0.2, 2
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        rule = nj.VogelsSTDP(eta=0.01, tau=20.0, rho0=10.0, w_min=-10.0, w_max=10.0)
        conn = nj.connect.fixed_prob(jr.key(1), 5, 4, 0.6, weight=0.5)
        net = forced_net(rule, conn, 5, 4, delay)
        drive = {
            "pre": pulses(rng.random((n_steps, 5)) < 0.01),
            "post": pulses(rng.random((n_steps, 4)) < 0.01),
        }
        _, rec = nj.simulate(
            net, net.init_state(), drive, dt=DT, record=lambda s, o: s.plastic[0].weights
        )
        sim = np.asarray(rec.values)
        proj = net.projections[0]
        pre_idx = np.repeat(np.arange(5), np.diff(np.asarray(proj.indptr)))
        post_idx = np.asarray(proj.indices)
        spikes = {k: np.asarray(v) for k, v in rec.spikes.items()}
        arrivals = np.zeros_like(spikes["pre"])
        arrivals[d:] = spikes["pre"][:-d]
        w0 = jnp.asarray(proj.weights)
        decays = rule.trace_decays(DT)

        def step(carry, s):
            w, x, y = carry
            x, y = (x[0] * decays[0][0],), (y[0] * decays[1][0],)
            w = rule.dense_update(w, x, y, s[0], s[1], jnp.asarray(pre_idx), proj.indices)
            return (w, rule.update_pre_traces(x, s[0]), rule.update_post_traces(y, s[1])), w

        f64 = w0.dtype
        init = (w0, (jnp.zeros(5, f64),), (jnp.zeros(4, f64),))
        xs = (jnp.asarray(arrivals, f64), jnp.asarray(spikes["post"], f64))
        dense = np.asarray(jax.lax.scan(step, init, xs)[1])
        ref = pair_sum(rule, np.asarray(w0), arrivals, spikes["post"], pre_idx, post_idx, DT)
    assert arrivals.sum() > 50 and spikes["post"].sum() > 50
    assert np.abs(sim[-1] - np.asarray(w0)).max() > 0.01
    np.testing.assert_allclose(sim, dense, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sim, ref, rtol=0, atol=1e-11)


def test_alpha_and_bad_parameters():
    assert float(nj.VogelsSTDP(tau=20.0, rho0=3.0).alpha) == pytest.approx(0.12)
    with pytest.raises(ValueError, match="VogelsSTDP: tau must be > 0"):
        nj.VogelsSTDP(tau=-1.0)
    with pytest.raises(ValueError, match="VogelsSTDP: rho0 must be >= 0"):
        nj.VogelsSTDP(rho0=-3.0)
    with pytest.raises(ValueError, match="VogelsSTDP: w_min"):
        nj.VogelsSTDP(w_min=1.0, w_max=0.5)


def test_vmap_over_rho0_equals_single_runs():
    rng = np.random.default_rng(3)
    conn = nj.connect.fixed_prob(jr.key(1), 5, 4, 0.6, weight=0.5)
    net = forced_net(nj.VogelsSTDP(eta=0.01, w_max=2.0), conn, 5, 4, 0.3)
    drive = {
        "pre": pulses(rng.random((400, 5)) < 0.03),
        "post": pulses(rng.random((400, 4)) < 0.03),
    }
    state = net.init_state()

    @jax.jit
    def final(rho0):
        n = eqx.tree_at(lambda n: n.projections[0].plasticity.rho0, net, rho0)
        return nj.simulate(n, state, drive, dt=DT)[0].plastic[0].weights

    rho = jnp.asarray([1.0, 20.0, 60.0], jnp.result_type(float))
    swept = np.asarray(jax.vmap(final)(rho))
    for t in range(3):
        np.testing.assert_allclose(swept[t], np.asarray(final(rho[t])), rtol=1e-6, atol=1e-7)
    assert np.all(np.diff(swept.mean(axis=1)) < 0)  # a higher target, less inhibition


@pytest.mark.slow
def test_gradients_match_finite_differences():
    n_steps, delay = 250, 0.2
    with jax.enable_x64(True):
        rule = nj.VogelsSTDP(eta=0.02, tau=15.0, rho0=8.0, w_min=-5.0, w_max=5.0)
        conn = nj.connect.from_arrays([0, 0, 1, 1], [0, 1, 0, 1], 0.5, 2, 2)
        lif = forced_lif(surrogate=nj.surrogate.Triangular(width=0.5))
        net = forced_net(rule, conn, 2, 2, delay, lif=lif, inputs={"pre": jnp.full(2, 0.2)})
        state = net.init_state()
        drive = {
            "pre": pulses(raster(n_steps, [[20, 60, 130], [45, 100, 101]])),
            "post": pulses(raster(n_steps, [[30, 70, 125, 150], [50, 52, 60, 140]])),
        }
        theta = dict(eta=rule.eta, tau=rule.tau, rho0=rule.rho0, w0=jnp.array([0.3, 0.5, 0.6, 0.4]))
        theta["current"] = net.inputs["pre"]
        flat, unravel = ravel_pytree(theta)
        c = jnp.array([1.0, -2.0, 0.5, 1.5])

        @jax.jit
        def loss(v):
            t = unravel(v)
            r = nj.VogelsSTDP(eta=t["eta"], tau=t["tau"], rho0=t["rho0"], w_min=-5.0, w_max=5.0)
            n = eqx.tree_at(lambda n: n.projections[0].plasticity, net, r)
            n = eqx.tree_at(lambda n: n.inputs["pre"], n, t["current"])
            s = eqx.tree_at(lambda s: s.plastic[0].weights, state, t["w0"])
            w = nj.simulate(n, s, drive, dt=DT)[0].plastic[0].weights
            return jnp.sum(c * w) + jnp.sum(w**2)

        grad = np.asarray(jax.grad(loss)(flat))
        fd = np.empty(flat.size)
        x = np.asarray(flat)
        for i in range(x.size):
            h = 1e-6 * max(1.0, abs(x[i]))
            up, down = x.copy(), x.copy()
            up[i] += h
            down[i] -= h
            fd[i] = (float(loss(up)) - float(loss(down))) / (2 * h)
    named = unravel(jnp.asarray(grad))
    for name in ("eta", "tau", "rho0", "w0"):
        assert np.all(np.asarray(named[name]) != 0), name
    assert np.all(np.asarray(named["current"]) == 0)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
