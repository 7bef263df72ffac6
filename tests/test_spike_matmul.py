"""`nj.training.spike_matmul` and the layers' `sparse_input=True`.

The reference is the product written plainly in NumPy float64 (`x @ w`, `x.T @ g`, `g @ w.T`);
with 0/1 inputs and integer-valued weights every partial sum is exact in float32, so there the
kernel must match it bit for bit. The kernel is the path taken on CPU (checked in the lowered
program); the dense fallback is checked against the same references.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
from helpers import has_cpu_kernel
from jax.test_util import check_grads

import neurojax as nj
from neurojax.training import _spike_matmul, spike_matmul

F32 = jnp.float32


@pytest.fixture
def kernel():
    if not has_cpu_kernel("spike_matmul"):
        pytest.skip("the compiled CPU kernels could not be built here")


def _problem(shape_x, n_out, density=0.1, seed=0, integer=False, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = (rng.random(shape_x) < density).astype(dtype)
    if integer:
        w = rng.integers(-8, 9, (shape_x[-1], n_out)).astype(dtype)
    else:
        w = rng.standard_normal((shape_x[-1], n_out)).astype(dtype)
    return x, w


def _ref(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


# (M, K, N): panels of 64 columns with and without a narrower last one, one narrow panel
# only, a single row or input, more rows than one slab of the packed weights holds.
SHAPES = [(37, 53, 70), (200, 300, 128), (5, 7, 3), (1, 1, 1), (64, 9000, 130)]


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_forward_equals_numpy(kernel, m, k, n):
    x, w = _problem((m, k), n, seed=m + k + n)
    y = jax.jit(spike_matmul)(x, w)
    assert y.shape == (m, n) and y.dtype == F32
    np.testing.assert_allclose(np.asarray(y), _ref(x, w), rtol=1e-5, atol=1e-5 * np.sqrt(k))
    lowered = jax.jit(spike_matmul).lower(x, w).as_text()
    assert "nj_spike_matmul" in lowered


def test_few_spikes_read_weights_in_place(kernel):
    # Fewer non-zero inputs than weight rows (one step of a simulation): the kernel reads the
    # rows where they lie instead of packing them; the same for the transposed product.
    x, w = _problem((2, 3000), 200, density=0.01, seed=9)
    np.testing.assert_allclose(np.asarray(spike_matmul(x, w)), _ref(x, w), rtol=1e-5, atol=1e-5)
    x = np.zeros((500, 3), np.float32)
    x[123, 1] = 1.0
    g = np.random.default_rng(10).standard_normal((500, 70)).astype(np.float32)
    w = np.ones((3, 70), np.float32)
    dw = jax.grad(lambda w: jnp.sum(spike_matmul(x, w) * g))(w)
    np.testing.assert_array_equal(np.asarray(dw), x.T @ g)


def test_exact_for_spikes_and_integer_weights(kernel):
    x, w = _problem((500, 4, 300), 200, density=0.2, integer=True)
    y = spike_matmul(x, w)
    np.testing.assert_array_equal(np.asarray(y), _ref(x, w))
    g = np.random.default_rng(1).integers(-4, 5, (500, 4, 200)).astype(np.float32)
    dw = jax.grad(lambda w: jnp.sum(spike_matmul(x, w) * g))(w)
    np.testing.assert_array_equal(np.asarray(dw), np.einsum("tbk,tbn->kn", x, g))
    # bool spikes give the same numbers as 0/1 floats
    np.testing.assert_array_equal(np.asarray(spike_matmul(x > 0, w)), np.asarray(y))


def test_graded_and_negative_inputs(kernel):
    rng = np.random.default_rng(3)
    x = np.where(rng.random((40, 90)) < 0.15, rng.standard_normal((40, 90)), 0.0).astype(np.float32)
    w = rng.standard_normal((90, 77)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(spike_matmul(x, w)), _ref(x, w), rtol=1e-5, atol=1e-5)
    # all zeros and all non-zero
    z = np.zeros((6, 90), np.float32)
    np.testing.assert_array_equal(np.asarray(spike_matmul(z, w)), np.zeros((6, 77)))
    full = rng.standard_normal((6, 90)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(spike_matmul(full, w)), _ref(full, w), rtol=1e-5, atol=1e-5
    )


def test_zero_inputs_skip_non_finite_weights(kernel):
    x = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
    w = np.array([[np.inf, 1.0], [2.0, 3.0]], np.float32)
    y = np.asarray(spike_matmul(x, w))
    np.testing.assert_array_equal(y, np.array([[2.0, 3.0], [np.inf, 1.0]]))
    w_nan = np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)
    y = np.asarray(spike_matmul(x, w_nan))
    assert np.isnan(y[1, 0]) and np.array_equal(y[0], [2.0, 3.0])


def test_float64(kernel):
    with jax.enable_x64(True):
        x, w = _problem((120, 150), 90, seed=5, dtype=np.float64)
        w = w + 1e-9 * np.arange(w.size).reshape(w.shape)  # digits beyond float32
        y = jax.jit(spike_matmul)(x, w)
        assert y.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(y), _ref(x, w), rtol=1e-13, atol=1e-12)
        g = np.random.default_rng(6).standard_normal((120, 90))
        dw = jax.grad(lambda w: jnp.sum(spike_matmul(x, w) * g))(w)
        np.testing.assert_allclose(np.asarray(dw), x.T @ g, rtol=1e-13, atol=1e-12)


def test_leading_axes_and_empty_shapes(kernel):
    x, w = _problem((10, 3, 40), 33)
    y = spike_matmul(x, w)
    assert y.shape == (10, 3, 33)
    np.testing.assert_allclose(np.asarray(y), _ref(x, w), rtol=1e-5, atol=1e-5)
    assert spike_matmul(np.zeros((0, 40), np.float32), w).shape == (0, 33)
    assert spike_matmul(np.zeros((4, 40), np.float32), np.zeros((40, 0), np.float32)).shape == (
        4,
        0,
    )
    v = spike_matmul(x[0, 0], w)  # a single input vector
    np.testing.assert_allclose(np.asarray(v), _ref(x[0, 0], w), rtol=1e-5, atol=1e-5)


def test_gradients_equal_dense_products(kernel):
    rng = np.random.default_rng(7)
    x, w = _problem((30, 4, 70), 50, density=0.2, seed=8)
    g = rng.standard_normal((30, 4, 50)).astype(np.float32)

    def loss(w, x):
        return jnp.sum(spike_matmul(x, w) * g)

    dw, dx = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x)
    np.testing.assert_allclose(np.asarray(dw), np.einsum("tbk,tbn->kn", x, g), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        np.asarray(dx),
        np.asarray(g, np.float64) @ np.asarray(w, np.float64).T,
        rtol=1e-5,
        atol=1e-4,
    )
    # A bool input has no cotangent and the weight gradient is unchanged.
    dw_bool = jax.grad(loss)(w, x > 0)
    np.testing.assert_array_equal(np.asarray(dw_bool), np.asarray(dw))
    # Reverse-mode derivative checks against finite differences (float64).
    with jax.enable_x64(True):
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        check_grads(lambda w, x: spike_matmul(x, w), (w64, x64), order=1, modes=["rev"])


def test_weight_gradient_skips_the_input_gradient(kernel):
    # Gradients for the weights of data inputs: no dense product is left in the program.
    x, w = _problem((50, 8, 64), 64)
    text = jax.jit(jax.grad(lambda w: jnp.sum(spike_matmul(x, w) ** 2))).lower(w).compile()
    hlo = text.as_text()
    assert " dot(" not in hlo and hlo.count("custom-call(") == 2


def test_vmap_equals_loop(kernel):
    rng = np.random.default_rng(11)
    xs = (rng.random((3, 20, 40)) < 0.2).astype(np.float32)
    w = rng.standard_normal((40, 70)).astype(np.float32)
    ws = rng.standard_normal((3, 40, 70)).astype(np.float32)
    g = rng.standard_normal((3, 20, 70)).astype(np.float32)
    loop = np.stack([np.asarray(spike_matmul(xs[i], w)) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(jax.vmap(spike_matmul, (0, None))(xs, w)), loop)
    loop = np.stack([np.asarray(spike_matmul(xs[0], ws[i])) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(jax.vmap(spike_matmul, (None, 0))(xs[0], ws)), loop)
    loop = np.stack([np.asarray(spike_matmul(xs[i], ws[i])) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(spike_matmul))(xs, ws)), loop)

    def loss(w, x, g):
        return jnp.sum(spike_matmul(x, w) * g)

    grad = jax.grad(loss)
    loop = np.stack([np.asarray(grad(w, xs[i], g[i])) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(jax.vmap(grad, (None, 0, 0))(w, xs, g)), loop)
    loop = np.stack([np.asarray(grad(w, xs[0], g[i])) for i in range(3)])
    np.testing.assert_allclose(
        np.asarray(jax.vmap(grad, (None, None, 0))(w, xs[0], g)), loop, rtol=1e-6, atol=1e-6
    )
    # The gradient of a batch-summed loss equals the sum over the batch.
    total = jax.grad(lambda w: jax.vmap(loss, (None, 0, 0))(w, xs, g).sum())(w)
    np.testing.assert_allclose(
        np.asarray(total), np.einsum("bmk,bmn->kn", xs, g), rtol=1e-5, atol=1e-5
    )
    # Shared weights fold the vmapped axis into rows: one kernel call of all rows.
    jaxpr = str(jax.make_jaxpr(jax.vmap(spike_matmul, (0, None)))(xs, w))
    assert jaxpr.count("ffi_call") == 1 and "f32[60,70]" in jaxpr


def test_deterministic(kernel):
    x, w = _problem((300, 500), 260, seed=2)
    a, b = spike_matmul(x, w), jax.jit(spike_matmul)(x, w)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fallback_equals_reference():
    x, w = _problem((40, 60), 50, seed=4)
    with nj.kernels.use("reference"):
        lowered = jax.jit(spike_matmul).lower(x, w).as_text()
        assert "nj_spike_matmul" not in lowered
        np.testing.assert_allclose(np.asarray(spike_matmul(x, w)), _ref(x, w), rtol=1e-5, atol=1e-5)
        g = np.ones((40, 50), np.float32)
        dw = jax.grad(lambda w: jnp.sum(spike_matmul(x, w) * g))(w)
        np.testing.assert_allclose(np.asarray(dw), x.T @ g, rtol=1e-6)
    # half precision always takes the dense product (the kernel is float32/float64)
    assert (
        "nj_spike_matmul"
        not in jax.jit(spike_matmul).lower(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).as_text()
    )
    assert _spike_matmul.spike_matmul is spike_matmul


@pytest.mark.parametrize(
    "x, w, match",
    [
        (
            np.ones((2, 3)),
            np.ones(3),
            r"spike_matmul: w must have shape \(n_in, n_out\), got shape \(3,\)",
        ),
        (
            np.ones((2, 3)),
            np.ones((3, 2), np.int32),
            r"spike_matmul: w must be a float array, got dtype int32",
        ),
        (
            np.ones((2, 4), np.float32),
            np.ones((3, 2), np.float32),
            r"x must have shape \(\.\.\., 3\) to match w of shape \(3, 2\), got shape \(2, 4\)",
        ),
        (
            np.ones((2, 3), np.int32),
            np.ones((3, 2), np.float32),
            r"x must be bool \(spikes\) or a float array, got dtype int32",
        ),
        (np.float32(1.0), np.ones((3, 2), np.float32), r"x must have shape \(\.\.\., 3\)"),
    ],
)
def test_errors(x, w, match):
    with pytest.raises((TypeError, ValueError), match=match):
        spike_matmul(x, w)


# ------------------------------------------------------------------------------ layers


def _layers(sparse_cls, **kw):
    dense = sparse_cls(20, 30, key=jr.key(0), weight_scale=6.0, **kw)
    sparse = sparse_cls(20, 30, key=jr.key(0), weight_scale=6.0, sparse_input=True, **kw)
    return dense, sparse


@pytest.mark.parametrize("cls", [nj.training.SpikingDense, nj.training.SpikingRecurrent])
def test_sparse_input_layer_equals_dense_layer(kernel, cls):
    dense, sparse = _layers(cls)
    x = nj.training.rate_encode(jr.uniform(jr.key(1), (4, 20), F32) * 0.3, 60, key=jr.key(2))
    np.testing.assert_allclose(
        np.asarray(sparse.current(x)), np.asarray(dense.current(x)), rtol=1e-6, atol=1e-6
    )
    out_d, out_s = dense(x), sparse(x)
    assert float(out_d.sum()) > 10
    np.testing.assert_array_equal(np.asarray(out_s), np.asarray(out_d))

    def loss(layer):
        return jnp.sum(layer(x) * jnp.linspace(0.5, 1.5, 30, dtype=F32))

    gd = eqx.filter_grad(loss)(dense)
    gs = eqx.filter_jit(eqx.filter_grad(loss))(sparse)
    np.testing.assert_allclose(np.asarray(gs.weight), np.asarray(gd.weight), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gs.bias), np.asarray(gd.bias), rtol=1e-4, atol=1e-5)
    # one example at a time under vmap, as the training loop runs layers
    per_example = eqx.filter_vmap(sparse, in_axes=1, out_axes=1)(x)
    np.testing.assert_array_equal(np.asarray(per_example), np.asarray(out_d))
    # the step protocol
    _, rec = nj.simulate(sparse, sparse.init_state(4), x, dt=1.0)
    np.testing.assert_array_equal(np.asarray(rec.spikes), np.asarray(out_d) > 0)


def test_sparse_input_hidden_layer_passes_input_gradients(kernel):
    # In a stack the second layer's input is the first layer's surrogate spikes: the
    # gradient must flow through the sparse product back to the first layer's weights.
    k1, k2 = jr.split(jr.key(3))
    neuron = nj.LIF(tau_m=8.0, v_rest=0.0, v_reset=0.0, v_th=1.0, surrogate="arctan")

    def net(sparse):
        return nj.training.Sequential(
            [
                nj.training.SpikingDense(10, 16, key=k1, neuron=neuron, weight_scale=5.0),
                nj.training.SpikingDense(
                    16, 4, key=k2, neuron=neuron, weight_scale=5.0, sparse_input=sparse
                ),
            ]
        )

    x = nj.training.rate_encode(jnp.full((10,), 0.4, F32), 30, key=jr.key(4))

    def loss(m):
        return jnp.sum((m(x) - 0.3) ** 2)

    g_dense = eqx.filter_grad(loss)(net(False))
    g_sparse = eqx.filter_grad(loss)(net(True))
    first_d, first_s = g_dense.layers[0].weight, g_sparse.layers[0].weight
    assert float(jnp.abs(first_d).sum()) > 0
    np.testing.assert_allclose(np.asarray(first_s), np.asarray(first_d), rtol=1e-4, atol=1e-5)


def test_sparse_input_flag_is_checked():
    with pytest.raises(TypeError, match=r"SpikingDense: sparse_input must be a bool, got 1"):
        nj.training.SpikingDense(2, 3, key=jr.key(0), sparse_input=1)
    with pytest.raises(TypeError, match=r"SpikingRecurrent: sparse_input must be a bool"):
        nj.training.SpikingRecurrent(2, 3, key=jr.key(0), sparse_input="yes")


def test_sparse_input_train_step_equals_dense_train_step(kernel):
    # The optax loop vmaps the loss over examples: per-example weight gradients through the
    # kernel, averaged, must give the dense layer's update.
    def net(sparse):
        return nj.training.Sequential(
            [
                nj.training.SpikingDense(
                    12, 20, key=jr.key(0), weight_scale=6.0, sparse_input=sparse
                ),
                nj.training.LeakyReadout(20, 3, key=jr.key(1)),
            ]
        )

    def loss(model, example, key):
        x, y = example
        return nj.training.max_membrane_cross_entropy(model(x), y)

    x = nj.training.rate_encode(jr.uniform(jr.key(2), (6, 12), F32), 25, key=jr.key(3))
    batch = (jnp.moveaxis(x, 1, 0), jnp.array([0, 1, 2, 0, 1, 2]))
    opt = optax.adam(1e-2)
    updated = []
    for sparse in (False, True):
        model = net(sparse)
        step = nj.training.make_train_step(loss, opt)
        new, _, metrics = step(model, nj.training.init_opt_state(opt, model), batch, jr.key(4))
        assert float(metrics["grad_norm"]) > 0
        updated.append(new)
    dense, sparse = updated
    np.testing.assert_allclose(
        np.asarray(sparse.layers[0].weight), np.asarray(dense.layers[0].weight), atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(sparse.layers[1].weight), np.asarray(dense.layers[1].weight), atol=1e-6
    )
