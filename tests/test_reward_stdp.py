"""`nj.RewardSTDP` (Izhikevich 2007): the lazy, event-driven eligibility update equals a
time-driven reference that integrates every synapse at every step (float64); the weights a
spike delivers are up to date; the dopamine reaches the rule as an input of the run or of the
network; `jit`, `vmap` and `grad` (against the time-driven reference and finite
differences)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import neurojax as nj

DT = 1.0
PULSE = 1e4
N_PRE, N_POST = 5, 4


def forced_lif(**kwargs):
    return nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=0.0, **kwargs)


def make_net(rule, delay=3.0, lif=None, inputs=None, n_pre=N_PRE, n_post=N_POST, conn=None):
    conn = conn if conn is not None else nj.connect.fixed_prob(jr.key(1), n_pre, n_post, 0.6, 1.0)
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


def pulses(spikes):
    return PULSE * np.asarray(spikes, np.dtype(jnp.result_type(float)))


def synapses(proj):
    return np.repeat(np.arange(proj.n_pre), np.diff(np.asarray(proj.indptr))), np.asarray(
        proj.indices
    )


def time_driven(rule, w0, arrivals, post, pre_idx, post_idx, d, dt, xp=np):
    """Reference: every synapse's eligibility and weight integrated at every step (what
    Brian2's clock-driven synapses do): w += tau_c (1 - a) c d_k (clipped), c *= a, then the
    step's STDP jumps (arrival before postsynaptic spike). Returns the weights after every
    step and the final eligibility. `xp` is numpy (float64 loop) or jax.numpy (scan)."""
    a = xp.exp(-dt / rule.tau_c)
    gain = rule.tau_c * (1.0 - a)
    dx, dy = xp.exp(-dt / rule.tau_plus), xp.exp(-dt / rule.tau_minus)

    def step(carry, inp):
        w, c, x, y = carry
        s_arr, s_post, d_k = inp
        w = xp.clip(w + gain * c * d_k, rule.w_min, rule.w_max)
        c = c * a
        x, y = x * dx, y * dy
        c = c - rule.a_minus * y[post_idx] * s_arr[pre_idx]
        x = x + s_arr
        c = c + rule.a_plus * x[pre_idx] * s_post[post_idx]
        y = y + s_post
        return (w, c, x, y), w

    init = (w0, w0 * 0.0, arrivals[0] * 0.0, post[0] * 0.0)
    if xp is np:
        carry, out = init, []
        for k in range(arrivals.shape[0]):
            carry, w = step(carry, (arrivals[k], post[k], d[k]))
            out.append(w)
        return np.array(out), carry[1]
    carry, out = jax.lax.scan(step, init, (arrivals, post, d))
    return out, carry[1]


def drive(rng, n_steps, batch=(), rate=0.05):
    return {
        "pre": pulses(rng.random((n_steps, *batch, N_PRE)) < rate),
        "post": pulses(rng.random((n_steps, *batch, N_POST)) < rate),
    }


def dopamine_series(rng, n_steps, batch=()):
    d = rng.uniform(0.0, 0.01, (n_steps, *batch))
    d[rng.random((n_steps, *batch)) < 0.5] = 0.0
    return d


# ---------------------------------------------------------------- against the reference


def test_lazy_update_equals_time_driven_reference():
    """1000 steps, a 3-step delay, a block of 150 steps (six sweeps), dopamine on half the
    steps: the stored weights of the synapses with an event, every synapse's weight brought
    to the present, and the eligibility equal the time-driven reference (float64)."""
    n_steps, delay = 1000, 3
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.15, tau_c=200.0, w_max=4.0, sweep_interval=150.0)
        net = make_net(rule, delay=float(delay))
        proj = net.projections[0]
        d = dopamine_series(rng, n_steps)
        dr = {**drive(rng, n_steps), "dopamine": d}
        state = net.init_state()
        assert isinstance(state.plastic[0], nj.plasticity.RewardSTDPState)
        final, rec = nj.simulate(net, state, dr, dt=DT, record=lambda s, o: s.plastic[0].weights)
        stored = np.asarray(rec.values)
        spikes = {k: np.asarray(v) for k, v in rec.spikes.items()}
        arrivals = np.zeros_like(spikes["pre"])
        arrivals[delay:] = spikes["pre"][:-delay]
        pre_idx, post_idx = synapses(proj)
        now = np.asarray(rule.current_weights(final.plastic[0], DT))
        elig = np.asarray(final.plastic[0].eligibility)
        block = rule.sweep_steps(DT)
        elig_now = elig * np.exp(-DT / 200.0) ** (n_steps % block)
        w0 = np.asarray(proj.weights, np.float64)
        ref, c_ref = time_driven(
            rule, w0, arrivals.astype(float), spikes["post"].astype(float), pre_idx, post_idx,
            d, DT,
        )  # fmt: skip
        ref, c_ref = np.asarray(ref), np.asarray(c_ref)
    assert np.abs(ref[-1] - w0).max() > 0.3  # the dopamine moved the weights
    np.testing.assert_allclose(now, ref[-1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(elig_now, c_ref, rtol=1e-12, atol=1e-14)
    # a synapse's stored weight is exact after each of its events; in particular the
    # weights its presynaptic neuron delivers at emission are up to date
    checked = 0
    for k, i in zip(*np.nonzero(spikes["pre"]), strict=True):
        rows = pre_idx == i
        np.testing.assert_allclose(stored[k, rows], ref[k, rows], rtol=0, atol=1e-12)
        checked += rows.sum()
    for k, j in zip(*np.nonzero(spikes["post"]), strict=True):
        cols = post_idx == j
        np.testing.assert_allclose(stored[k, cols], ref[k, cols], rtol=0, atol=1e-12)
    assert checked > 100
    # and between events a stored weight lags: the path does not touch every synapse
    assert np.abs(stored[-1] - ref[-1]).max() > 1e-3


@pytest.mark.slow
def test_dopamine_as_network_input_equals_run_input():
    """`Network(inputs={"dopamine": f})` with `f(t)` equals the same values given through
    `simulate`'s inputs; a constant works too; without any, the step raises."""
    n_steps = 300
    rng = np.random.default_rng(1)
    rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.12, tau_c=100.0, sweep_interval=100.0)
    dr = drive(rng, n_steps, rate=0.08)
    t = np.arange(n_steps) * DT
    d = (0.002 * (1.0 + np.sin(t / 20.0))).astype(np.float32)
    via_run = make_net(rule)
    a = nj.simulate(via_run, via_run.init_state(), {**dr, "dopamine": d}, dt=DT)[0]
    via_net = make_net(rule, inputs={"dopamine": lambda t: 0.002 * (1.0 + jnp.sin(t / 20.0))})
    b = nj.simulate(via_net, via_net.init_state(), dr, dt=DT)[0]
    wa = np.asarray(rule.current_weights(a.plastic[0], DT))
    wb = np.asarray(rule.current_weights(b.plastic[0], DT))
    np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)
    assert np.abs(wa - 1.0).max() > 1e-3
    const = make_net(rule, inputs={"dopamine": 0.0})
    c = nj.simulate(const, const.init_state(), dr, dt=DT)[0]
    np.testing.assert_array_equal(np.asarray(rule.current_weights(c.plastic[0], DT)), 1.0)


def test_bad_inputs_and_parameters_are_rejected():
    rule = nj.RewardSTDP()
    with pytest.raises(ValueError, match=r"inputs\['dopamine'\] \(a neuromodulator\)"):
        make_net(rule, inputs={"dopamine": np.ones(3)})
    with pytest.raises(ValueError, match="has the name of a population"):
        make_net(nj.RewardSTDP(modulator="post"))
    net = make_net(rule)
    spikes = {"pre": np.zeros((10, N_PRE)), "post": np.zeros((10, N_POST))}
    with pytest.raises(ValueError, match="reads the neuromodulator 'dopamine'"):
        nj.simulate(net, net.init_state(), spikes, dt=DT)
    with pytest.raises(ValueError, match="one value per trial"):
        nj.simulate(net, net.init_state(batch=2), {"dopamine": np.zeros((10, 3))}, dt=DT)
    with pytest.raises(ValueError, match="RewardSTDP: tau_c must be > 0"):
        nj.RewardSTDP(tau_c=0.0)
    with pytest.raises(ValueError, match="sweep_interval"):
        nj.RewardSTDP(tau_c=10.0, sweep_interval=1000.0)
    with pytest.raises(ValueError, match="RewardSTDP: a_minus must be >= 0"):
        nj.RewardSTDP(a_minus=-1.0)


# ---------------------------------------------------------------- vmap, batch, grad


def test_batch_of_trials_and_vmap_equal_single_runs():
    """Per-trial drives and dopamine: a batch in the state, `jax.vmap` over the run and
    single runs agree (one shared connectivity, per-trial weights and eligibilities)."""
    n_steps, trials = 400, 3
    rng = np.random.default_rng(2)
    rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.15, tau_c=150.0, sweep_interval=100.0)
    net = make_net(rule)
    dr = {**drive(rng, n_steps, (trials,)), "dopamine": dopamine_series(rng, n_steps, (trials,))}
    dr["dopamine"] = dr["dopamine"].astype(np.float32)

    @jax.jit
    def run(state, inputs):
        final = nj.simulate(net, state, inputs, dt=DT)[0]
        return rule.current_weights(final.plastic[0], DT)

    batched = np.asarray(run(net.init_state(batch=trials), dr))
    vmapped = np.asarray(jax.vmap(run, in_axes=(None, 1))(net.init_state(), dr))
    np.testing.assert_allclose(vmapped, batched, rtol=1e-6, atol=1e-6)
    one = np.asarray(run(net.init_state(), {k: v[:, 1] for k, v in dr.items()}))
    np.testing.assert_allclose(batched[1], one, rtol=1e-6, atol=1e-6)
    assert np.abs(batched[0] - batched[2]).max() > 1e-3


@pytest.mark.slow
def test_gradients_match_time_driven_reference_and_finite_differences():
    """Forced spikes (no surrogate slope): the final weights are smooth in the rule's
    parameters, the initial weights and the dopamine series; `jax.grad` through the network
    equals the gradient of the time-driven reference and central differences."""
    n_steps, delay = 120, 2
    pre_trains = [[10, 30, 70], [25, 60, 61]]
    post_trains = [[15, 40, 75, 90], [28, 30, 50, 100]]
    with jax.enable_x64(True):
        conn = nj.connect.from_arrays([0, 0, 1, 1], [0, 1, 0, 1], 1.0, 2, 2)
        lif = forced_lif(surrogate=nj.surrogate.Triangular(width=0.5))
        rule = nj.RewardSTDP(
            a_plus=0.3, a_minus=0.4, tau_plus=15.0, tau_minus=25.0, tau_c=60.0,
            w_min=-50.0, w_max=50.0, sweep_interval=40.0,
        )  # fmt: skip
        net = make_net(rule, float(delay), lif=lif, n_pre=2, n_post=2, conn=conn)
        state = net.init_state()

        def raster(trains):
            out = np.zeros((n_steps, len(trains)))
            for i, tr in enumerate(trains):
                out[tr, i] = 1.0
            return out

        pre_s, post_s = raster(pre_trains), raster(post_trains)
        dr = {"pre": pulses(pre_s), "post": pulses(post_s)}
        rng = np.random.default_rng(5)
        theta = {
            "a_plus": rule.a_plus,
            "a_minus": rule.a_minus,
            "tau_plus": rule.tau_plus,
            "tau_c": rule.tau_c,
            "w0": jnp.array([1.0, 0.5, 1.5, 0.8]),
            "d": jnp.asarray(rng.uniform(0.0, 0.05, n_steps)),
        }
        flat, unravel = ravel_pytree(theta)
        c = jnp.array([1.0, -2.0, 0.5, 1.5])

        def rule_of(t):
            return nj.RewardSTDP(
                a_plus=t["a_plus"], a_minus=t["a_minus"], tau_plus=t["tau_plus"],
                tau_minus=25.0, tau_c=t["tau_c"], w_min=-50.0, w_max=50.0, sweep_interval=40.0,
            )  # fmt: skip

        @jax.jit
        def loss(v):
            t = unravel(v)
            r = rule_of(t)
            n = eqx.tree_at(lambda n: n.projections[0].plasticity, net, r)
            s = eqx.tree_at(lambda s: s.plastic[0].weights, state, t["w0"])
            final = nj.simulate(n, s, {**dr, "dopamine": t["d"]}, dt=DT)[0]
            w = r.current_weights(final.plastic[0], DT)
            return jnp.sum(c * w) + jnp.sum(w**2)

        pre_idx, post_idx = synapses(net.projections[0])
        arrivals = np.zeros_like(pre_s)
        arrivals[delay:] = pre_s[:-delay]

        @jax.jit
        def loss_ref(v):
            t = unravel(v)
            out, _ = time_driven(
                rule_of(t), t["w0"], jnp.asarray(arrivals), jnp.asarray(post_s),
                jnp.asarray(pre_idx), jnp.asarray(post_idx), t["d"], DT, xp=jnp,
            )  # fmt: skip
            w = out[-1]
            return jnp.sum(c * w) + jnp.sum(w**2)

        grad = np.asarray(jax.grad(loss)(flat))
        grad_ref = np.asarray(jax.grad(loss_ref)(flat))
        x = np.asarray(flat)
        fd = np.empty(x.size)
        for i in range(x.size):
            h = 1e-6 * max(1.0, abs(x[i]))
            up, down = x.copy(), x.copy()
            up[i] += h
            down[i] -= h
            fd[i] = (float(loss(up)) - float(loss(down))) / (2 * h)
        assert float(loss(flat)) == pytest.approx(float(loss_ref(flat)), rel=1e-12)
    named = unravel(jnp.asarray(grad))
    for name in ("a_plus", "a_minus", "tau_plus", "tau_c", "w0"):
        assert np.all(np.asarray(named[name]) != 0), name
    assert np.abs(np.asarray(named["d"])).max() > 0
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- the distal reward problem


def distal_reward_run(seconds, seed=0, rate_hz=3.0, reward=0.012, n=100):
    """Izhikevich (2007)'s first experiment with imposed spikes: `n` Poisson presynaptic
    neurons onto one postsynaptic neuron (all `rate_hz`), one synapse each. When presynaptic
    neuron 0's spike arrives and the postsynaptic neuron fires within 10 ms after, a reward
    follows 1-3 s later: dopamine `reward * exp(-(t - t_r) / 200 ms)`. The run goes in 1 s
    chunks, each chunk's dopamine computed from the rewards earned before it (a reward is at
    least 1 s late, so it always falls in a later chunk). Returns the weights every 50 s and
    the number of rewards."""
    chunk = 1000
    rng = np.random.default_rng(seed)
    rule = nj.RewardSTDP(a_plus=0.1, a_minus=0.12, tau_c=1000.0, w_min=0.0, w_max=4.0)
    conn = nj.connect.from_arrays(np.arange(n), np.zeros(n, int), 1.0, n, 1)
    net = make_net(rule, delay=1.0, n_pre=n, n_post=1, conn=conn)
    run = jax.jit(lambda s, x: nj.simulate(net, s, x, dt=DT))
    state = net.init_state()
    rewards, history = [], []
    last_arrival, used = -1e9, None
    tt = np.arange(seconds * chunk) * DT
    for sec in range(seconds):
        t = tt[sec * chunk : (sec + 1) * chunk]
        d = np.zeros(chunk)
        for r in rewards:
            m = t >= r
            d[m] += reward * np.exp(-(t[m] - r) / 200.0)
        pre = rng.random((chunk, n)) < rate_hz * DT * 1e-3
        post = rng.random((chunk, 1)) < rate_hz * DT * 1e-3
        state, rec = run(state, {"pre": 1e4 * pre, "post": 1e4 * post, "dopamine": d})
        arrivals = np.flatnonzero(np.asarray(rec.spikes["pre"])[:, 0]) + sec * chunk + 1
        for k in np.flatnonzero(np.asarray(rec.spikes["post"])[:, 0]) + sec * chunk:
            j = np.searchsorted(arrivals, k) - 1
            a = arrivals[j] if j >= 0 else last_arrival
            if 0 < k - a <= 10 and a != used:
                rewards.append(k * DT + rng.uniform(1000, 3000))
                used = a
        if len(arrivals):
            last_arrival = arrivals[-1]
        if sec % 50 == 49:
            history.append(np.asarray(rule.current_weights(state.plastic[0], DT)))
    return np.array(history), len(rewards)


@pytest.mark.slow
def test_distal_reward_singles_out_the_rewarded_synapse():
    """One simulated hour, as in the paper: the rewarded synapse reaches the maximum weight
    (4) and stays near it, while the 99 others end low (initial weight 1 for all)."""
    history, n_rewards = distal_reward_run(3600)
    chosen, others = history[:, 0], history[:, 1:]
    assert n_rewards > 200
    assert chosen.max() == pytest.approx(4.0)
    assert chosen[-12:].mean() > 0.85 * 4.0  # the last 10 minutes
    assert others[-1].mean() < 0.25 * 4.0
    assert np.quantile(others[-1], 0.99) < 0.6 * 4.0
    assert chosen[-1] > others[-1].max() + 1.0


def test_modulated_rules_declare_their_interface():
    """The network's neuromodulated path calls only what `nj.plasticity.ModulatedRule`
    declares: RewardSTDP is one, and a rule that leaves a declared method out is refused
    when built, before any network runs it."""
    assert isinstance(nj.RewardSTDP(), nj.plasticity.ModulatedRule)
    rule = nj.RewardSTDP(tau_c=200.0)
    # float32 1 - exp(-dt/tau_c) loses ~4 digits to cancellation at dt/tau_c = 5e-4
    np.testing.assert_allclose(
        float(rule.eligibility_gain(0.1)), 200.0 * (1.0 - np.exp(-0.1 / 200.0)), rtol=2e-4
    )

    class Incomplete(nj.plasticity.ModulatedRule):
        def modulator_name(self):
            return "dopamine"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
