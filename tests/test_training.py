"""nj.training: encoders, layers, losses, BPTT options and the optax loop.

References are independent: NumPy re-implementations of each recursion and loss, unrolled
Python loops over `step` for backpropagation through time, analytic solutions of the leaky
readout, and binomial statistics for the random encoders.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest

import neurojax as nj
from neurojax import training as tr

F32 = jnp.float32


def _lif_numpy(currents, tau=10.0, dt=1.0, v_th=1.0):
    """LIF in normalised units (rest = reset = 0), exact integration, plain NumPy float64."""
    decay = np.exp(-dt / tau)
    v = np.zeros(currents.shape[1:])
    out = []
    for i in currents:
        v = i + (v - i) * decay
        s = (v >= v_th).astype(np.float64)
        v = np.where(s > 0, 0.0, v)
        out.append(s)
    return np.stack(out)


# ------------------------------------------------------------------------------ encoders


def test_rate_encode_counts_are_binomial():
    x = jnp.array([0.0, 0.1, 0.5, 0.9, 1.0], F32)
    n = 4000
    s = tr.rate_encode(x, n, key=jr.key(0))
    assert s.shape == (n, 5) and s.dtype == F32
    counts = np.asarray(s.sum(0))
    p = np.asarray(x, np.float64)
    sd = np.sqrt(n * p * (1 - p))
    # 5 standard deviations of Binomial(n, p); exact for p = 0 and p = 1.
    assert np.all(np.abs(counts - n * p) <= 5 * sd + 1e-9)
    assert counts[0] == 0 and counts[-1] == n
    half = tr.rate_encode(x, n, key=jr.key(0), gain=0.5)
    assert abs(float(half.sum(0)[-1]) - n / 2) <= 5 * np.sqrt(n / 4)
    # Same key, same spikes; another key differs.
    np.testing.assert_array_equal(np.asarray(s), np.asarray(tr.rate_encode(x, n, key=jr.key(0))))
    assert not np.array_equal(np.asarray(s), np.asarray(tr.rate_encode(x, n, key=jr.key(1))))


def test_poisson_encode_rates():
    rates = jnp.array([[5.0, 50.0], [200.0, 0.0]], F32)
    s = tr.poisson_encode(rates, 20000, dt=0.5, key=jr.key(3))
    assert s.shape == (20000, 2, 2)
    p = np.asarray(rates, np.float64) * 0.5e-3
    counts = np.asarray(s.sum(0), np.float64)
    assert np.all(np.abs(counts - 20000 * p) <= 5 * np.sqrt(20000 * p * (1 - p)) + 1e-9)
    with pytest.raises(ValueError, match=r"poisson_encode: rates must lie in \[0, 2000\]"):
        tr.poisson_encode(jnp.array([2500.0], F32), 10, dt=0.5, key=jr.key(0))


def test_latency_encode_linear_and_rc():
    x = jnp.array([1.0, 0.5, 0.0, 0.25], F32)
    s = np.asarray(tr.latency_encode(x, 11, threshold=0.0))
    # Linear code: step round((1 - x) * 10); x = 0 is at the threshold 0 and does not fire.
    assert s.sum(0).tolist() == [1.0, 1.0, 0.0, 1.0]
    assert np.argmax(s, 0)[[0, 1, 3]].tolist() == [0, 5, 8]  # round(7.5) = 8 (half to even)
    tau, thr = 5.0, 0.2
    s = np.asarray(tr.latency_encode(x, 50, tau=tau, threshold=thr))
    for j, xv in enumerate([1.0, 0.5, 0.25]):
        t = tau * np.log(xv / (xv - thr))
        col = [0, 1, 3][j]
        assert s[:, col].sum() == 1 and np.argmax(s[:, col]) == round(t)
    assert s[:, 2].sum() == 0
    # A crossing after the last step is not emitted: 0.21 crosses at 5 ln(21) = 15.2 steps.
    assert float(tr.latency_encode(jnp.array([0.21], F32), 10, tau=5.0, threshold=0.2).sum()) == 0


def test_current_encode_repeats():
    x = jnp.arange(6, dtype=F32).reshape(2, 3)
    c = tr.current_encode(x, 4, gain=2.0)
    assert c.shape == (4, 2, 3)
    np.testing.assert_array_equal(np.asarray(c[3]), 2 * np.asarray(x))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tr.rate_encode(jnp.array([1.5]), 5, key=jr.key(0)), r"rate_encode: x must lie"),
        (lambda: tr.rate_encode(jnp.array([0.5]), 0, key=jr.key(0)), r"rate_encode: n_steps"),
        (lambda: tr.rate_encode(jnp.array([0.5]), 5, key=None), r"rate_encode: key is required"),
        (lambda: tr.rate_encode(jnp.array([0.5]), 5, key=jr.key(0), gain=2.0), r"gain must"),
        (lambda: tr.latency_encode(jnp.array([-0.1]), 5), r"latency_encode: x must lie"),
        (lambda: tr.latency_encode(jnp.array([0.5]), 5, tau=-1.0), r"tau must be a positive"),
        (lambda: tr.latency_encode(jnp.array([0.5]), 5, threshold=1.0), r"threshold must"),
        (lambda: tr.current_encode(jnp.array([jnp.nan]), 5), r"current_encode: x must be finite"),
        (lambda: tr.current_encode("abc", 5), r"current_encode: x must be an array"),
        (lambda: tr.poisson_encode(jnp.array([1.0]), 5, dt=0.0, key=jr.key(0)), r"dt must"),
    ],
)
def test_encoder_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# -------------------------------------------------------------------------------- losses


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_losses_equal_numpy():
    rng = np.random.default_rng(0)
    spikes = (rng.random((30, 4, 5)) < 0.3).astype(np.float32)
    v = rng.normal(size=(30, 4, 5)).astype(np.float32)
    labels = np.array([0, 3, 4, 1], np.int32)
    counts = spikes.astype(np.float64).sum(0)
    want = -_log_softmax(0.5 * counts)[np.arange(4), labels].mean()
    got = tr.spike_count_cross_entropy(spikes, labels, scale=0.5)
    np.testing.assert_allclose(float(got), want, rtol=1e-6)
    want = -_log_softmax(v.astype(np.float64).max(0))[np.arange(4), labels].mean()
    np.testing.assert_allclose(float(tr.max_membrane_cross_entropy(v, labels)), want, rtol=1e-6)
    rates = counts / 30 * 1000.0 / 0.5
    target = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    np.testing.assert_allclose(
        float(tr.rate_mse(spikes, jnp.asarray(target, F32), dt=0.5)),
        ((rates - target) ** 2).mean(),
        rtol=1e-5,
    )
    reg = (np.maximum(0, 400 - rates) ** 2).mean() + (np.maximum(0, rates - 700) ** 2).mean()
    np.testing.assert_allclose(
        float(tr.rate_regularizer(spikes, dt=0.5, lower=400.0, upper=700.0)), reg, rtol=1e-5
    )
    acc = (np.argmax(counts, -1) == labels).mean()
    assert float(tr.accuracy(spikes, labels)) == pytest.approx(acc)
    acc = (np.argmax(v.max(0), -1) == labels).mean()
    assert float(tr.accuracy(v, labels, readout="max")) == pytest.approx(acc)
    np.testing.assert_allclose(np.asarray(tr.firing_rates(spikes, dt=0.5)), rates, rtol=1e-5)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: tr.spike_count_cross_entropy(jnp.ones((3, 2, 4)), jnp.array([0, 4])),
            r"labels must lie in \[0, 3\]",
        ),
        (
            lambda: tr.spike_count_cross_entropy(jnp.ones((3, 2, 4)), jnp.array([0.0, 1.0])),
            r"labels must be integers",
        ),
        (
            lambda: tr.max_membrane_cross_entropy(jnp.ones((3, 2, 4)), jnp.array([0, 1, 2])),
            r"labels of shape \(3,\) do not match the batch shape \(2,\)",
        ),
        (lambda: tr.spike_counts(jnp.ones(3)), r"spikes must be time-major"),
        (lambda: tr.rate_regularizer(jnp.ones((3, 2)), dt=1.0), r"give lower, upper or both"),
        (
            lambda: tr.rate_regularizer(jnp.ones((3, 2)), dt=1.0, lower=5.0, upper=1.0),
            r"lower=5.0 must not exceed upper=1.0",
        ),
        (
            lambda: tr.rate_mse(jnp.ones((3, 2)), jnp.ones(3, F32), dt=1.0),
            r"target of shape \(3,\) does not broadcast",
        ),
        (lambda: tr.accuracy(jnp.ones((3, 2)), jnp.array(0), readout="mean"), r"readout must"),
    ],
)
def test_loss_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# -------------------------------------------------------------------------------- layers


def test_dense_layer_equals_numpy_recursion_and_stepwise():
    layer = tr.SpikingDense(6, 5, key=jr.key(0), weight_scale=6.0)
    layer = eqx.tree_at(lambda m: m.bias, layer, jnp.full((5,), 0.3, F32))
    x = tr.rate_encode(jr.uniform(jr.key(1), (3, 6), F32), 40, key=jr.key(2))  # (40, 3, 6)
    spikes = layer(x, dt=1.0)
    assert spikes.shape == (40, 3, 5)
    currents = np.asarray(x, np.float64) @ np.asarray(layer.weight, np.float64) + 0.3
    want = _lif_numpy(currents)
    assert want.sum() > 10  # the test exercises spikes
    np.testing.assert_array_equal(np.asarray(spikes), want)
    # The step protocol under simulate gives the same spikes.
    _, rec = nj.simulate(layer, layer.init_state(3), x, dt=1.0)
    np.testing.assert_array_equal(np.asarray(rec.spikes), want > 0)


def test_recurrent_layer_equals_numpy_loop():
    layer = tr.SpikingRecurrent(4, 6, key=jr.key(5), weight_scale=6.0, recurrent_scale=3.0)
    layer = eqx.tree_at(lambda m: m.bias, layer, jnp.full((6,), 1.5, F32))
    x = tr.rate_encode(jnp.full((4,), 0.5, F32), 60, key=jr.key(6))
    spikes = np.asarray(layer(x, dt=0.5))
    w, r, b = (np.asarray(a, np.float64) for a in (layer.weight, layer.recurrent, layer.bias))
    decay = np.exp(-0.5 / 10.0)
    v, s_prev, want = np.zeros(6), np.zeros(6), []
    for xt in np.asarray(x, np.float64):
        i = xt @ w + s_prev @ r + b
        v = i + (v - i) * decay
        s_prev = (v >= 1.0).astype(np.float64)
        v = np.where(s_prev > 0, 0.0, v)
        want.append(s_prev)
    want = np.stack(want)
    assert want.sum() > 5
    np.testing.assert_array_equal(spikes, want)
    _, rec = nj.simulate(layer, layer.init_state(), x, dt=0.5)
    np.testing.assert_array_equal(np.asarray(rec.spikes), want > 0)


def test_leaky_readout_analytic_step_response():
    ro = tr.LeakyReadout(3, 2, key=jr.key(0), tau=jnp.array([5.0, 20.0], F32))
    ro = eqx.tree_at(lambda m: m.weight, ro, jnp.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], F32))
    x = jnp.broadcast_to(jnp.array([1.0, 1.0, 0.0], F32), (100, 3))
    v = np.asarray(ro(x, dt=0.1))
    t = 0.1 * np.arange(1, 101)
    want = np.stack([1 - np.exp(-t / 5.0), 2 * (1 - np.exp(-t / 20.0))], axis=1)
    np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-6)


def test_sequential_call_equals_stepwise():
    k1, k2, k3 = jr.split(jr.key(9), 3)
    net = tr.Sequential(
        [
            tr.SpikingDense(8, 12, key=k1, weight_scale=5.0),
            tr.SpikingRecurrent(12, 7, key=k2, weight_scale=12.0),
            tr.LeakyReadout(7, 3, key=k3),
        ]
    )
    x = tr.rate_encode(jnp.full((2, 8), 0.4, F32), 50, key=jr.key(1))
    out = net(x)
    _, rec = nj.simulate(net, net.init_state(2), x, dt=1.0, record=nj.Record(spikes="float"))
    np.testing.assert_allclose(np.asarray(out), np.asarray(rec.spikes), rtol=1e-6, atol=1e-6)
    hidden = net(x, return_all=True)
    assert [h.shape for h in hidden] == [(50, 2, 12), (50, 2, 7), (50, 2, 3)]
    assert float(hidden[0].sum()) > 0 and float(hidden[1].sum()) > 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tr.SpikingDense(0, 3, key=jr.key(0)), r"SpikingDense: n_in must be a positive"),
        (lambda: tr.SpikingDense(2, 3, key=None), r"SpikingDense: key is required"),
        (lambda: tr.SpikingDense(2, 3, key=jr.key(0), weight_scale=-1.0), r"weight_scale must"),
        (lambda: tr.SpikingDense(2, 3, key=jr.key(0), neuron="lif"), r"neuron must be a neuro"),
        (
            lambda: tr.SpikingDense(2, 3, key=jr.key(0), neuron=nj.Izhikevich(), learn_tau=True),
            r"learn_tau=True needs a neuron with a membrane time constant tau_m",
        ),
        (lambda: tr.SpikingDense(2, 3, key=jr.key(0), tau_min=0.0), r"tau_min must be > 0"),
        (lambda: tr.LeakyReadout(2, 3, key=jr.key(0), tau=-1.0), r"LeakyReadout: tau must be"),
        (
            lambda: tr.LeakyReadout(2, 3, key=jr.key(0), tau=jnp.ones(2, F32)),
            r"tau must be a scalar or have shape \(3,\)",
        ),
        (
            lambda: tr.Sequential(
                [tr.SpikingDense(2, 3, key=jr.key(0)), tr.SpikingDense(4, 1, key=jr.key(1))]
            ),
            r"layer 0 has n_out=3 but layer 1 has n_in=4",
        ),
        (lambda: tr.Sequential([]), r"at least one layer"),
        (
            lambda: tr.SpikingDense(2, 3, key=jr.key(0))(jnp.ones((5, 4), F32)),
            r"SpikingDense: the input must end with the axes of one example \(2\), after time "
            r"and any batch axes; got shape \(5, 4\), read with time on axis 0 \(length 5\)",
        ),
    ],
)
def test_layer_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# ---------------------------------------------------------- backpropagation through time


def _smooth_net(key):
    # Surrogate gradients with a wide arctan make every step contribute.
    neuron = nj.LIF(tau_m=8.0, v_rest=0.0, v_reset=0.0, v_th=1.0, surrogate="arctan")
    k1, k2 = jr.split(key)
    return tr.Sequential(
        [
            tr.SpikingRecurrent(5, 9, key=k1, neuron=neuron, weight_scale=4.0),
            tr.LeakyReadout(9, 3, key=k2),
        ]
    )


def _unrolled_loss(net, x, dt=1.0, cut=None):
    """The same loss as net(x) through a Python loop over `step` (no scan)."""
    state = net.init_state()
    total = 0.0
    for t in range(x.shape[0]):
        if cut is not None and t > 0 and t % cut == 0:
            state = jax.tree.map(jax.lax.stop_gradient, state)
        state, out = net.step(state, x[t], dt)
        total = total + jnp.sum((out - 0.5) ** 2) * (t + 1) / x.shape[0]
    return total


def _scan_loss(net, x, **kw):
    out = net(x, **kw)
    w = jnp.arange(1, x.shape[0] + 1, dtype=F32)[:, None] / x.shape[0]
    return jnp.sum((out - 0.5) ** 2 * w)


def test_bptt_through_scan_equals_unrolled_loop_and_checkpoint():
    net = _smooth_net(jr.key(0))
    x = tr.rate_encode(jnp.full((5,), 0.5, F32), 16, key=jr.key(1))
    g_loop = eqx.filter_jit(eqx.filter_grad(_unrolled_loss))(net, x)
    g_scan = eqx.filter_jit(eqx.filter_grad(_scan_loss))(net, x)
    g_ckpt = eqx.filter_jit(eqx.filter_grad(lambda n, x: _scan_loss(n, x, checkpoint=True)))(net, x)
    leaves = [
        (a, b, c)
        for a, b, c in zip(
            jax.tree.leaves(g_loop), jax.tree.leaves(g_scan), jax.tree.leaves(g_ckpt)
        )
    ]
    assert any(float(jnp.abs(a).max()) > 1e-3 for a, _, _ in leaves)
    for a, b, c in leaves:
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)
        # Rematerialisation recomputes the same operations: identical gradients.
        np.testing.assert_array_equal(np.asarray(c), np.asarray(b))


def test_truncated_bptt_equals_stop_gradient_loop():
    net = _smooth_net(jr.key(2))
    x = tr.rate_encode(jnp.full((5,), 0.6, F32), 17, key=jr.key(3))
    g_loop = eqx.filter_jit(eqx.filter_grad(lambda n, x: _unrolled_loss(n, x, cut=5)))(net, x)
    g_scan = eqx.filter_jit(eqx.filter_grad(lambda n, x: _scan_loss(n, x, truncate_backprop=5)))(
        net, x
    )
    g_full = eqx.filter_jit(eqx.filter_grad(_scan_loss))(net, x)
    for a, b in zip(jax.tree.leaves(g_loop), jax.tree.leaves(g_scan)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)
    # Truncation changes the recurrent weights' gradient (it is not a no-op).
    rec_t, rec_f = g_scan.layers[0].recurrent, g_full.layers[0].recurrent
    assert float(jnp.abs(rec_t - rec_f).max()) > 1e-4
    # The forward value is unchanged.
    assert float(_scan_loss(net, x, truncate_backprop=5)) == float(_scan_loss(net, x))


def test_simulate_checkpoint_and_truncation_on_neuron_model():
    lif = nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, surrogate="arctan")
    drive = 1.2 + 0.3 * jnp.sin(jnp.arange(80, dtype=F32) / 5.0)[:, None] * jnp.ones(4, F32)

    def loss_rec(gain, **kw):
        _, rec = nj.simulate(
            lif,
            lif.init_state(4),
            gain * drive,
            dt=0.5,
            record=nj.Record(fields=("v",), spikes="float"),
            gradient=nj.SurrogateGradient(**kw),
        )
        return rec.spikes.sum() + rec.v.sum() * 1e-2

    g = jax.grad(loss_rec)(1.0)
    assert float(jax.grad(loss_rec)(1.0)) == float(
        jax.grad(lambda a: loss_rec(a, checkpoint=True))(1.0)
    )
    assert np.isfinite(float(g)) and abs(float(g)) > 0
    # Truncation with a window longer than the run changes nothing.
    assert float(jax.grad(lambda a: loss_rec(a, truncate_backprop=1000))(1.0)) == float(g)
    with pytest.raises(ValueError, match=r"nj.SurrogateGradient: truncate_backprop must be a posi"):
        nj.SurrogateGradient(truncate_backprop=0)
    with pytest.raises(TypeError, match=r"nj.SurrogateGradient: checkpoint must be a bool"):
        nj.SurrogateGradient(checkpoint="yes")


def test_vmap_grad_equals_loop_and_gradients_finite():
    net = _smooth_net(jr.key(4))
    xs = tr.rate_encode(jr.uniform(jr.key(5), (6, 5), F32), 20, key=jr.key(6))  # (20, 6, 5)
    xs = jnp.moveaxis(xs, 1, 0)  # per-example time-major sequences
    grad_fn = eqx.filter_jit(eqx.filter_grad(_scan_loss))
    batched = eqx.filter_vmap(grad_fn, in_axes=(None, 0))(net, xs)
    for b in range(xs.shape[0]):
        single = grad_fn(net, xs[b])
        for a, s in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            np.testing.assert_allclose(np.asarray(a[b]), np.asarray(s), rtol=1e-5, atol=1e-6)


def test_gradients_finite_over_random_initialisations():
    x = tr.rate_encode(jnp.full((5,), 0.5, F32), 25, key=jr.key(0))

    @eqx.filter_jit
    def grads(key):
        return eqx.filter_grad(_scan_loss)(_smooth_net(key), x)

    nonzero = 0
    for seed in range(24):
        g = grads(jr.key(100 + seed))
        leaves = jax.tree.leaves(g)
        assert all(bool(jnp.all(jnp.isfinite(a))) for a in leaves), seed
        nonzero += any(float(jnp.abs(a).max()) > 0 for a in leaves)
    assert nonzero == 24


def test_learn_tau_trains_only_the_time_constant():
    base = nj.LIF(tau_m=jnp.full((4,), 10.0, F32), v_rest=0.0, v_reset=0.0, v_th=1.0)
    x = tr.current_encode(jnp.array([0.8, 0.2, 0.5], F32), 30)
    for learn in (False, True):
        layer = tr.SpikingDense(3, 4, key=jr.key(1), neuron=base, weight_scale=6.0, learn_tau=learn)
        g = eqx.filter_grad(lambda m: m(x, dt=1.0).sum())(layer)
        assert float(jnp.abs(g.weight).max()) > 0
        assert (float(jnp.abs(g.neuron.tau_m).max()) > 0) is learn
        assert float(jnp.abs(g.neuron.v_th).max()) == 0.0
        spec = tr.trainable(layer)
        assert spec.weight is True and spec.bias is True
        assert spec.neuron.tau_m is learn and spec.neuron.v_th is False
    # A learned tau below tau_min acts as tau_min.
    low = eqx.tree_at(lambda m: m.neuron.tau_m, layer, jnp.full((4,), -3.0, F32))
    at_min = eqx.tree_at(lambda m: m.neuron.tau_m, layer, jnp.full((4,), 0.5, F32))
    np.testing.assert_array_equal(np.asarray(low(x)), np.asarray(at_min(x)))


# --------------------------------------------------------------------------- optax loop


def _task(key, n=64):
    """Two classes told apart by which half of 8 inputs is brighter."""
    k1, k2 = jr.split(key)
    labels = jr.bernoulli(k1, 0.5, (n,)).astype(jnp.int32)
    base = jr.uniform(k2, (n, 8), F32, 0.0, 0.4)
    bright = jnp.where(labels[:, None] == 0, jnp.arange(8) < 4, jnp.arange(8) >= 4)
    return base + 0.6 * bright.astype(F32), labels


def _task_loss(net, example, key):
    x, label = example
    spikes = tr.rate_encode(x, 20, key=key)
    v = net(spikes)
    loss = tr.max_membrane_cross_entropy(v[:, None], label[None])
    return loss, {"acc": tr.accuracy(v[:, None], label[None], readout="max")}


def _task_net(key):
    k1, k2 = jr.split(key)
    return tr.Sequential(
        [tr.SpikingDense(8, 16, key=k1, weight_scale=6.0), tr.LeakyReadout(16, 2, key=k2)]
    )


def test_tiny_task_loss_halves_identically_twice():
    data = _task(jr.key(0))

    def run():
        net = _task_net(jr.key(1))
        return tr.fit(
            net, optax.adam(1e-2), _task_loss, data, key=jr.key(2), epochs=15, batch_size=16
        )

    net1, res1 = run()
    net2, res2 = run()
    first, last = res1.history[0]["loss"], res1.history[-1]["loss"]
    assert last <= 0.5 * first, (first, last)
    assert res1.history[-1]["acc"] > 0.9
    assert [h["loss"] for h in res1.history] == [h["loss"] for h in res2.history]
    for a, b in zip(jax.tree.leaves(net1), jax.tree.leaves(net2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_train_step_matches_manual_update_and_reports_metrics():
    net = _task_net(jr.key(3))
    x, y = _task(jr.key(4), n=8)
    opt = optax.sgd(0.1)
    step = tr.make_train_step(_task_loss, opt)
    new, _, metrics = step(net, tr.init_opt_state(opt, net), (x, y), jr.key(5))
    assert set(metrics) == {"loss", "grad_norm", "acc"}
    keys = jr.split(jr.key(5), 8)

    def mean_loss(m):
        return jnp.mean(jax.vmap(lambda xi, yi, k: _task_loss(m, (xi, yi), k)[0])(x, y, keys))

    loss, g = eqx.filter_jit(eqx.filter_value_and_grad(mean_loss))(net)
    assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-6)
    want = jax.tree.map(lambda p, d: p - 0.1 * d, eqx.filter(net, eqx.is_inexact_array), g)
    np.testing.assert_allclose(
        np.asarray(new.layers[0].weight), np.asarray(want.layers[0].weight), rtol=1e-5, atol=1e-7
    )
    # The neuron's parameters are not trained (learn_tau=False): unchanged.
    assert new.layers[0].neuron.tau_m is net.layers[0].neuron.tau_m or float(
        new.layers[0].neuron.tau_m
    ) == float(net.layers[0].neuron.tau_m)
    # Only values change between calls: the step is not traced again.
    before = step.jitted._cached._cache_size() if hasattr(step.jitted, "_cached") else None
    step(new, tr.init_opt_state(opt, new), (x, y), jr.key(6))
    if before is not None:
        assert step.jitted._cached._cache_size() == before


def test_whole_batch_loss_and_fit_options():
    x, y = _task(jr.key(7), n=20)

    def batch_loss(net, batch, key):
        xb, yb = batch
        v = jax.vmap(lambda xi: net(tr.current_encode(xi, 10)), out_axes=1)(xb)
        return tr.max_membrane_cross_entropy(v, yb)

    seen = []

    def stop_after_two(epoch, record):
        seen.append((epoch, record["steps"]))
        return epoch == 2

    net, res = tr.fit(
        _task_net(jr.key(8)),
        optax.adam(1e-2),
        batch_loss,
        (x, y),
        key=jr.key(9),
        epochs=5,
        batch_size=8,
        per_example=False,
        eval_fn=lambda m: {"loss": 0.0, "n": 1.0},
        callback=stop_after_two,
    )
    # 20 examples in batches of 8: 3 steps (8, 8, 4); stopped after epoch 2.
    assert seen == [(1, 3), (2, 3)]
    assert len(res.history) == 2 and res.history[0]["eval_loss"] == 0.0
    assert res.history[0]["n"] == 1.0 and res.opt_state is not None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=50), r"fit: batch_size=50 exceeds the 20 examples"),
        (dict(epochs=0), r"fit: epochs must be a positive int"),
        (dict(key=None), r"fit: key is required"),
        (dict(eval_fn=3), r"fit: eval_fn must be callable"),
    ],
)
def test_fit_errors(kwargs, match):
    x, y = _task(jr.key(7), n=20)
    args = dict(key=jr.key(0), batch_size=4)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        tr.fit(_task_net(jr.key(8)), optax.sgd(0.1), _task_loss, (x, y), **args)


def test_train_step_errors():
    with pytest.raises(TypeError, match=r"make_train_step: loss_fn must be callable"):
        tr.make_train_step(3, optax.sgd(0.1))
    with pytest.raises(TypeError, match=r"optimizer must be an optax.GradientTransformation"):
        tr.make_train_step(_task_loss, "adam")
    step = tr.make_train_step(lambda m, ex, k: (jnp.ones(2), {}), optax.sgd(0.1))
    net = _task_net(jr.key(0))
    x, y = _task(jr.key(1), n=4)
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar loss for one example"):
        step(net, tr.init_opt_state(optax.sgd(0.1), net), (x, y), jr.key(2))
    with pytest.raises(ValueError, match=r"the same leading batch axis"):
        step(net, tr.init_opt_state(optax.sgd(0.1), net), (x, y[:2]), jr.key(2))


def test_layers_jit_vmap_grad_contract():
    layer = tr.SpikingDense(3, 4, key=jr.key(0), weight_scale=5.0)
    x = tr.rate_encode(jnp.full((3,), 0.7, F32), 15, key=jr.key(1))
    eager = layer(x)
    np.testing.assert_array_equal(np.asarray(eqx.filter_jit(layer)(x)), np.asarray(eager))
    xs = jnp.stack([x, x[::-1]])
    batched = eqx.filter_vmap(layer)(xs)
    np.testing.assert_array_equal(np.asarray(batched[1]), np.asarray(layer(x[::-1])))
    # Batch axes inside the time-major sequence give the same result as vmap.
    np.testing.assert_array_equal(
        np.asarray(layer(jnp.moveaxis(xs, 0, 1))), np.asarray(jnp.moveaxis(batched, 0, 1))
    )
    g = eqx.filter_grad(lambda m: m(x).sum())(layer)
    assert bool(jnp.all(jnp.isfinite(g.weight))) and float(jnp.abs(g.weight).sum()) > 0


def _stack(time_axis=0):
    k1, k2, k3 = jr.split(jr.key(9), 3)
    return tr.Sequential(
        [
            tr.SpikingDense(8, 12, key=k1, weight_scale=5.0),
            tr.SpikingRecurrent(12, 7, key=k2, weight_scale=12.0),
            tr.LeakyReadout(7, 3, key=k3),
        ],
        time_axis=time_axis,
    )


def test_batch_first_input_with_time_axis_equals_vmap_of_single_examples():
    """A snnTorch-style (batch, time, features) input, told `time_axis=1`, gives per example
    what the time-major single example gives (the reference: vmap over examples of the
    default time-major call), and its outputs keep the batch-first order."""
    x_tm = tr.rate_encode(jr.uniform(jr.key(3), (4, 8), F32), 30, key=jr.key(1))  # (30, 4, 8)
    x_bf = jnp.moveaxis(x_tm, 1, 0)  # (4, 30, 8)
    ref = jax.vmap(_stack())(x_bf)  # each example (30, 8), time-major
    assert float(jnp.abs(ref).sum()) > 0
    for net, kw in ((_stack(time_axis=1), {}), (_stack(), {"time_axis": 1})):
        out = net(x_bf, **kw)
        assert out.shape == (4, 30, 3)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-6, atol=1e-6)
        hidden = net(x_bf, return_all=True, **kw)
        assert [h.shape for h in hidden] == [(4, 30, 12), (4, 30, 7), (4, 30, 3)]
    # negative axes count from the end of the leading axes, as numpy's do
    np.testing.assert_allclose(np.asarray(_stack()(x_bf, time_axis=-1)), np.asarray(ref))
    # each layer takes the same argument
    layer = _stack().layers[0]
    np.testing.assert_array_equal(
        np.asarray(layer(x_bf, time_axis=1)), np.asarray(jnp.moveaxis(layer(x_tm), 0, 1))
    )
    # and the result differs from reading the batch as time: the check matters
    assert not np.allclose(np.asarray(_stack()(x_bf)), np.asarray(ref))


def test_time_axis_under_jit_and_grad():
    x_bf = jnp.moveaxis(tr.rate_encode(jnp.full((2, 8), 0.5, F32), 20, key=jr.key(4)), 1, 0)
    net = _stack(time_axis=1)
    np.testing.assert_array_equal(np.asarray(eqx.filter_jit(net)(x_bf)), np.asarray(net(x_bf)))
    g = eqx.filter_grad(lambda m: m(x_bf).sum())(net)
    g_ref = eqx.filter_grad(lambda m: jax.vmap(m)(x_bf).sum())(_stack())
    np.testing.assert_allclose(
        np.asarray(g.layers[0].weight), np.asarray(g_ref.layers[0].weight), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: _stack(time_axis=1.0), TypeError, r"Sequential: time_axis must be an int.*1.0"),
        (lambda: _stack(time_axis=True), TypeError, r"Sequential: time_axis must be an int"),
        (
            lambda: _stack()(jnp.zeros((5, 4, 8), F32), time_axis=2),
            ValueError,
            r"Sequential: time_axis=2 must name one of the 2 leading axes of the input \(time "
            r"and batch, before the axes of one example \(8\)\), i.e. be in \[-2, 1\]; got "
            r"shape \(5, 4, 8\)",
        ),
        (
            # (batch, features, time): the features are not last, whatever the time axis
            lambda: _stack(time_axis=1)(jnp.zeros((4, 8, 30), F32)),
            ValueError,
            r"Sequential: the input must end with the axes of one example \(8\), after time and "
            r"any batch axes; got shape \(4, 8, 30\), read with time on axis 1 \(length 8\)\. "
            r"Time-major inputs are \(t, \*batch, 8\) \(time_axis=0, the default\); a "
            r"batch-first input \(batch, t, 8\) as snnTorch or tonic give it needs time_axis=1",
        ),
        (
            lambda: tr.LeakyReadout(3, 2, key=jr.key(0))(jnp.zeros((5, 3), F32), time_axis=1),
            ValueError,
            r"LeakyReadout: time_axis=1 must name one of the 1 leading axes",
        ),
        (
            lambda: tr.SpikingRecurrent(3, 2, key=jr.key(0))(jnp.zeros((5, 3), F32), time_axis="t"),
            TypeError,
            r"SpikingRecurrent: time_axis must be an int",
        ),
    ],
)
def test_time_axis_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
