"""The plasticity rule as an extension point: a rule that neurojax does not ship, written here
in the test file alone by subclassing `nj.plasticity.PlasticityRule`, runs event-driven in a
`nj.Network` (with a delay) and matches its dense reference stepped alongside and an
independent NumPy sum over spike pairs; under `jit`, `vmap` (per-trial weights) and `grad`.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

import neurojax as nj
from neurojax.kernels import _build

DT = 0.1
PULSE = 1e4  # one step of this input takes a forced LIF from 0 far above threshold
N_PRE, N_POST = 5, 4


_float = nj.validation.as_float


class MexicanHat(nj.plasticity.PlasticityRule):
    """Symmetric pair rule with a difference of exponentials: a presynaptic arrival and a
    postsynaptic spike `|dt|` ms apart change the weight by
    `a_near exp(-|dt| / tau_near) - a_far exp(-|dt| / tau_far)`, whatever their order
    (all pairs add). Two traces per neuron and side, hard bounds."""

    a_near: Float[Array, ""] = eqx.field(default=0.02, converter=_float)
    a_far: Float[Array, ""] = eqx.field(default=0.008, converter=_float)
    tau_near: Float[Array, ""] = eqx.field(default=8.0, converter=_float)
    tau_far: Float[Array, ""] = eqx.field(default=30.0, converter=_float)
    w_min: Float[Array, ""] = eqx.field(default=-10.0, converter=_float)
    w_max: Float[Array, ""] = eqx.field(default=10.0, converter=_float)

    n_pre_traces: ClassVar[int] = 2
    n_post_traces: ClassVar[int] = 2

    def __check_init__(self):
        nj.validation.check_positive("MexicanHat", "tau_near", self.tau_near, "ms")
        nj.validation.check_positive("MexicanHat", "tau_far", self.tau_far, "ms")
        nj.validation.check_less("MexicanHat", "w_min", self.w_min, "w_max", self.w_max)

    def trace_decays(self, dt):
        d = (jnp.exp(-dt / self.tau_near), jnp.exp(-dt / self.tau_far))
        return d, d

    def update_pre_traces(self, traces, spikes):
        return tuple(t + spikes for t in traces)

    def update_post_traces(self, traces, spikes):
        return tuple(t + spikes for t in traces)

    def _change(self, traces):
        return self.a_near * traces[0] - self.a_far * traces[1]

    def on_pre(self, w, pre, post, s):
        return self.clip(w + self._change(post) * s)

    def on_post(self, w, pre, post, s):
        return self.clip(w + self._change(pre) * s)


def forced_lif(**kwargs):
    return nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=0.0, **kwargs)


def pulses(spikes):
    return PULSE * np.asarray(spikes, np.dtype(jnp.result_type(float)))


def raster(n_steps, spike_steps):
    out = np.zeros((n_steps, len(spike_steps)), bool)
    for i, steps in enumerate(spike_steps):
        out[np.asarray(steps, int), i] = True
    return out


def shift(spikes, d):
    """Arrivals at the synapses of spikes emitted `d` steps earlier."""
    out = np.zeros_like(spikes)
    out[d:] = spikes[: spikes.shape[0] - d]
    return out


def make_net(rule, delay=0.3, lif=None):
    conn = nj.connect.fixed_prob(jr.key(2), N_PRE, N_POST, 0.6, weight=nj.connect.uniform(0.2, 0.8))
    lif = lif or forced_lif()
    proj = nj.Projection(
        "pre",
        "post",
        conn,
        synapse=nj.Delta(),
        output=nj.ConductanceOutput(0.0),
        delay=delay,
        plasticity=rule,
    )
    return nj.Network({"pre": (lif, N_PRE), "post": (lif, N_POST)}, [proj], dt=DT)


def poisson_drive(rng, n_steps, rate_hz=80.0, batch=()):
    return {
        "pre": pulses(rng.random((n_steps, *batch, N_PRE)) < rate_hz * DT * 1e-3),
        "post": pulses(rng.random((n_steps, *batch, N_POST)) < rate_hz * DT * 1e-3),
    }


def synapses(proj):
    """Presynaptic and postsynaptic neuron of every synapse, in the CSR order of the state."""
    indptr = np.asarray(proj.indptr)
    pre = np.repeat(np.arange(proj.n_pre), np.diff(indptr))
    return pre, np.asarray(proj.indices)


def dense_trajectory(rule, w0, arrivals, post_spikes, pre_idx, post_idx, dt):
    """The rule's dense reference stepped over recorded spikes: weights after every step."""
    decays = rule.trace_decays(dt)

    def step(carry, s):
        w, pre, post = carry
        s_arr, s_post = s
        pre = tuple(t * d for t, d in zip(pre, decays[0], strict=True))
        post = tuple(t * d for t, d in zip(post, decays[1], strict=True))
        w = rule.dense_update(w, pre, post, s_arr, s_post, pre_idx, post_idx)
        pre = rule.update_pre_traces(pre, s_arr)
        post = rule.update_post_traces(post, s_post)
        return (w, pre, post), w

    z_pre = tuple(jnp.zeros(arrivals.shape[1:], w0.dtype) for _ in range(rule.n_pre_traces))
    z_post = tuple(jnp.zeros(post_spikes.shape[1:], w0.dtype) for _ in range(rule.n_post_traces))
    return jax.lax.scan(step, (w0, z_pre, z_post), (arrivals, post_spikes))[1]


def pair_sum_trajectory(rule, w0, arrivals, post_spikes, pre_idx, post_idx, dt):
    """Independent NumPy reference: every (arrival, post spike) pair of a synapse adds
    `a_near e^{-|dt|/tau_near} - a_far e^{-|dt|/tau_far}` at the later of its two steps."""
    a_near, a_far = float(rule.a_near), float(rule.a_far)
    tau_near, tau_far = float(rule.tau_near), float(rule.tau_far)
    n_steps = arrivals.shape[0]
    out = np.tile(np.asarray(w0, np.float64), (n_steps, 1))
    for s, (i, j) in enumerate(zip(pre_idx, post_idx, strict=True)):
        for a in np.flatnonzero(arrivals[:, i]):
            for p in np.flatnonzero(post_spikes[:, j]):
                lag = abs(p - a) * dt
                out[max(a, p) :, s] += a_near * np.exp(-lag / tau_near) - a_far * np.exp(
                    -lag / tau_far
                )
    return out


def stdp_kernel_in(fn, *args):
    return "nj_stdp_update" in str(jax.make_jaxpr(fn)(*args))


# ---------------------------------------------------------------- the rule in a network


def test_custom_rule_matches_dense_reference_and_pair_sum():
    n_steps, delay = 600, 0.3
    d = round(delay / DT)
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        rule = MexicanHat()
        net = make_net(rule, delay)
        proj = net.projections[0]
        drive = poisson_drive(rng, n_steps, rate_hz=150.0)
        state = net.init_state()
        assert type(state.plastic[0]) is nj.plasticity.PlasticState
        assert len(state.plastic[0].pre_traces) == 2 and len(state.plastic[0].post_traces) == 2
        _, rec = nj.simulate(net, state, drive, dt=DT, record=lambda s, out: s.plastic[0].weights)
        sim = np.asarray(rec.values)
        spikes = {k: np.asarray(v) for k, v in rec.spikes.items()}
        np.testing.assert_array_equal(spikes["pre"], np.asarray(drive["pre"]) > 0)
        np.testing.assert_array_equal(spikes["post"], np.asarray(drive["post"]) > 0)
        arrivals = shift(spikes["pre"], d)
        pre_idx, post_idx = synapses(proj)
        w0 = jnp.asarray(proj.weights)
        dense = np.asarray(
            jax.jit(dense_trajectory, static_argnums=(6,))(
                rule,
                w0,
                jnp.asarray(arrivals, w0.dtype),
                jnp.asarray(spikes["post"], w0.dtype),
                jnp.asarray(pre_idx),
                jnp.asarray(post_idx),
                DT,
            )
        )
    pairs = pair_sum_trajectory(rule, w0, arrivals, spikes["post"], pre_idx, post_idx, DT)
    assert spikes["pre"].sum() > 30 and spikes["post"].sum() > 30
    change = sim[-1] - np.asarray(w0)
    assert change.max() > 0.02 and change.min() < -0.02  # the rule potentiates and depresses
    assert np.all((sim > -10.0) & (sim < 10.0))  # the bounds never acted: pairs simply add
    # float64 throughout; the traces and the pair sums round differently, ~1e-16 per event.
    np.testing.assert_allclose(sim, dense, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sim, pairs, rtol=0, atol=1e-12)


def test_custom_rule_runs_on_the_generic_event_path_under_jit():
    """The rule does not claim the compiled STDP kernel (`pair_kernel()` is None), so the
    generic event path runs it; `jit` of the whole run gives the same weights as the eager
    call, and a subclass of `nj.STDP` that redefines an event loses the kernel too."""
    rule = MexicanHat()
    assert rule.pair_kernel() is None
    net = make_net(rule)
    rng = np.random.default_rng(1)
    drive = poisson_drive(rng, 300)
    state = net.init_state()

    def final_weights(drive):
        return nj.simulate(net, state, drive, dt=DT)[0].plastic[0].weights

    assert not stdp_kernel_in(final_weights, drive)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(final_weights)(drive)), np.asarray(final_weights(drive))
    )
    assert float(jnp.abs(final_weights(drive) - net.projections[0].weights).max()) > 1e-3

    class Louder(nj.STDP):
        def on_post(self, w, pre, post, s):
            return self.clip(w + 2.0 * self.a_plus * self.f_plus(w) * pre[0] * s)

    assert nj.STDP().pair_kernel() is not None
    assert Louder().pair_kernel() is None
    if nj.kernels.mode() == "auto" and _build.library() is not None:  # the kernel is seen
        plain_net = make_net(nj.STDP())
        plain_state = plain_net.init_state()
        assert stdp_kernel_in(
            lambda dr: nj.simulate(plain_net, plain_state, dr, dt=DT)[0].plastic[0].weights, drive
        )
    assert isinstance(Louder(), nj.plasticity.PlasticityRule)
    louder = make_net(Louder(a_plus=0.02, a_minus=0.021, w_max=1.0))
    plain = make_net(nj.STDP(a_plus=0.02, a_minus=0.021, w_max=1.0))
    s_l, s_p = louder.init_state(), plain.init_state()
    w_l = nj.simulate(louder, s_l, drive, dt=DT)[0].plastic[0].weights
    w_p = nj.simulate(plain, s_p, drive, dt=DT)[0].plastic[0].weights
    assert float(jnp.max(w_l - w_p)) > 1e-3  # its own on_post ran, not the kernel's


def test_custom_rule_under_vmap_with_per_trial_weights():
    """vmap over the initial weights and the drive: every trial learns from its own weights,
    and equals a single run; a batch of trials in the state does the same."""
    rule = MexicanHat()
    net = make_net(rule)
    rng = np.random.default_rng(2)
    n_trials, n_steps = 3, 400
    drives = poisson_drive(rng, n_steps, batch=(n_trials,))
    nnz = net.projections[0].weights.shape[0]
    w0s = jnp.asarray(rng.uniform(0.2, 0.8, (n_trials, nnz)), jnp.result_type(float))
    state = net.init_state()

    def final_weights(w0, drive):
        s = eqx.tree_at(lambda s: s.plastic[0].weights, state, w0)
        return nj.simulate(net, s, drive, dt=DT)[0].plastic[0].weights

    swept = np.asarray(jax.jit(jax.vmap(final_weights, in_axes=(0, 1)))(w0s, drives))
    for t in range(n_trials):
        one = {k: v[:, t] for k, v in drives.items()}
        np.testing.assert_allclose(swept[t], np.asarray(final_weights(w0s[t], one)), rtol=1e-6)
    assert np.abs(swept[0] - swept[1]).max() > 1e-3

    batched = eqx.tree_at(lambda s: s.plastic[0].weights, net.init_state(batch=n_trials), w0s)
    fin, _ = nj.simulate(net, batched, drives, dt=DT)
    np.testing.assert_allclose(np.asarray(fin.plastic[0].weights), swept, rtol=1e-6)
    assert fin.plastic[0].pre_traces[1].shape == (n_trials, N_PRE)
    stats = nj.plasticity.weight_stats(fin.plastic[0], bins=4)
    assert int(stats["counts"].sum()) == n_trials * nnz


def central_differences(f, x, rel_step=1e-6):
    out = np.empty(x.size)
    for i in range(x.size):
        h = rel_step * max(1.0, abs(x[i]))
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        out[i] = (float(f(up)) - float(f(down))) / (2 * h)
    return out


def test_custom_rule_gradients_match_finite_differences_and_dense_reference():
    """With forced spikes that cannot move (a triangular surrogate with no slope at rest nor
    during a pulse) the final weights are smooth in the rule's parameters and the initial
    weights: `jax.grad` through the event-driven network equals central differences and the
    gradient of the dense reference stepped by hand."""
    n_steps, delay = 250, 0.2
    d = round(delay / DT)
    pre_trains = [[20, 60, 130], [45, 100, 101]]
    post_trains = [[30, 70, 125, 150], [50, 52, 60, 140]]
    with jax.enable_x64(True):
        rule = MexicanHat(a_near=0.03, a_far=0.01, tau_near=10.0, tau_far=25.0)
        conn = nj.connect.from_arrays([0, 0, 1, 1], [0, 1, 0, 1], 0.5, 2, 2)
        lif = forced_lif(surrogate=nj.surrogate.Triangular(width=0.5))
        net = nj.Network(
            {"pre": (lif, 2), "post": (lif, 2)},
            [
                nj.Projection(
                    "pre",
                    "post",
                    conn,
                    synapse=nj.Delta(),
                    output=nj.ConductanceOutput(0.0),
                    delay=delay,
                    plasticity=rule,
                )
            ],
            dt=DT,
        )
        state = net.init_state()
        pre_spikes, post_spikes = raster(n_steps, pre_trains), raster(n_steps, post_trains)
        drive = {"pre": pulses(pre_spikes), "post": pulses(post_spikes)}
        theta = {
            "a_near": rule.a_near,
            "a_far": rule.a_far,
            "tau_near": rule.tau_near,
            "tau_far": rule.tau_far,
            "w0": jnp.array([0.3, 0.5, 0.6, 0.4]),
        }
        flat, unravel = ravel_pytree(theta)
        c = jnp.array([1.0, -2.0, 0.5, 1.5])

        def rule_of(t):
            return MexicanHat(t["a_near"], t["a_far"], t["tau_near"], t["tau_far"])

        @jax.jit
        def loss(v):
            t = unravel(v)
            n = eqx.tree_at(lambda n: n.projections[0].plasticity, net, rule_of(t))
            s = eqx.tree_at(lambda s: s.plastic[0].weights, state, t["w0"])
            w = nj.simulate(n, s, drive, dt=DT)[0].plastic[0].weights
            return jnp.sum(c * w) + jnp.sum(w**2)

        pre_idx, post_idx = synapses(net.projections[0])
        arrivals = jnp.asarray(shift(pre_spikes, d), flat.dtype)
        post_j = jnp.asarray(post_spikes, flat.dtype)

        @jax.jit
        def loss_dense(v):
            t = unravel(v)
            traj = dense_trajectory(
                rule_of(t),
                t["w0"],
                arrivals,
                post_j,
                jnp.asarray(pre_idx),
                jnp.asarray(post_idx),
                DT,
            )
            w = traj[-1]
            return jnp.sum(c * w) + jnp.sum(w**2)

        grad = np.asarray(jax.grad(loss)(flat))
        grad_dense = np.asarray(jax.grad(loss_dense)(flat))
        fd = central_differences(loss, np.asarray(flat))
        assert float(loss(flat)) == pytest.approx(float(loss_dense(flat)), abs=1e-12)
    named = unravel(jnp.asarray(grad))
    for name in theta:
        assert np.all(np.asarray(named[name]) != 0), name
    # float64: the event path's JVP is the dense reference's, up to rounding.
    np.testing.assert_allclose(grad, grad_dense, rtol=1e-10, atol=1e-12)
    # Central differences in float64: truncation ~h^2 ~ 1e-12, rounding ~1e-16 / h ~ 1e-10.
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- the interface's checks


def test_incomplete_or_foreign_rules_are_rejected():
    class NoEvents(nj.plasticity.PlasticityRule):
        w_min: Float[Array, ""] = eqx.field(default=0.0, converter=_float)
        w_max: Float[Array, ""] = eqx.field(default=1.0, converter=_float)
        n_pre_traces: ClassVar[int] = 1
        n_post_traces: ClassVar[int] = 1

    with pytest.raises(TypeError, match="abstract"):
        NoEvents()
    conn = nj.connect.fixed_prob(jr.key(0), 3, 3, 0.5, weight=0.5)
    with pytest.raises(TypeError, match=r"plasticity must be None or nj.STDP\(\.\.\.\) or another"):
        nj.Projection("a", "b", conn, plasticity=lambda w: w)
    with pytest.raises(ValueError, match=r"MexicanHat: tau_far must be > 0 ms, got -1.0"):
        MexicanHat(tau_far=-1.0)
    with pytest.raises(ValueError, match=r"within the MexicanHat bounds \[w_min, w_max\]"):
        nj.Projection("a", "b", conn, plasticity=MexicanHat(w_min=0.6, w_max=1.0))

    class WrongKernel(MexicanHat):
        def pair_kernel(self):
            return nj.plasticity.PairKernel(
                self.a_near, self.a_far, self.w_min, self.w_max, False, False
            )

    with pytest.raises(TypeError, match=r"WrongKernel.pair_kernel\(\) returns kernel parameters"):
        nj.Projection("a", "b", conn, plasticity=WrongKernel())
