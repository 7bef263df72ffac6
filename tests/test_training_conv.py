"""Convolutional and pooling layers of nj.training: shapes, step protocol, batching, training
filters and error messages. Their numerics against NumPy are in tests/test_nir.py (the NIR
Conv1d/Conv2d/pooling nodes run the same operations)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj

T = nj.training


def _x(shape, key=0, rate=0.4):
    return (jr.uniform(jr.key(key), shape) < rate).astype(jnp.float32)


def test_conv_output_shape_follows_pytorch():
    assert T.conv_output_shape((8, 7), (3, 2), stride=(2, 1), padding=(1, 0), dilation=1) == (4, 6)
    assert T.conv_output_shape((9,), (3,), padding="same") == (9,)
    assert T.conv_output_shape((9,), (3,), padding="valid", dilation=2) == (5,)


def test_spiking_conv2d_step_equals_sequence_and_batches():
    layer = T.SpikingConv2d((2, 6, 6), 3, 3, key=jr.key(1), padding=1, weight_scale=6.0)
    assert layer.out_shape == (3, 6, 6) and layer.weight.shape == (3, 2, 3, 3)
    x = _x((10, 4, 2, 6, 6))
    seq = layer(x)
    assert seq.shape == (10, 4, 3, 6, 6) and float(seq.sum()) > 0
    state = layer.init_state((4,))
    steps = []
    for t in range(10):
        state, s = layer.step(state, x[t], 1.0)
        steps.append(s)
    np.testing.assert_allclose(np.stack(steps), np.asarray(seq), atol=1e-6)
    single = jax.vmap(lambda xi: layer(xi), in_axes=1, out_axes=1)(x)
    np.testing.assert_allclose(np.asarray(single), np.asarray(seq), atol=1e-6)


def test_spiking_conv1d_and_a_sequential_stack_train():
    k1, k2, k3 = jr.split(jr.key(2), 3)
    conv = T.SpikingConv1d((2, 12), 4, 3, key=k1, stride=2, weight_scale=5.0)
    flat = T.Flatten(conv.out_shape)
    model = T.Sequential([conv, flat, T.LeakyReadout(flat.out_shape, 2, key=k3)])
    x = _x((15, 2, 12), key=3)
    filt = T.trainable(model)
    assert filt.layers[0].weight is True and filt.layers[0].neuron.tau_m is False

    def loss(m):
        return jnp.sum(m(x)[-1] ** 2)

    grads = eqx.filter_grad(loss)(model)
    assert float(jnp.abs(grads.layers[0].weight).sum()) > 0
    assert model(x).shape == (15, 2)


def test_pooling_layers_and_flatten():
    x = jnp.arange(2 * 3 * 4 * 4, dtype=jnp.float32).reshape(2, 3, 4, 4)
    s = T.SumPool2d((3, 4, 4), 2)
    a = T.AvgPool2d((3, 4, 4), 2)
    assert s.out_shape == (3, 2, 2)
    np.testing.assert_allclose(np.asarray(a(x[None])[0]) * 4, np.asarray(s(x[None])[0]))
    np.testing.assert_allclose(np.asarray(s.apply(x))[0, 0, 0, 0], float(x[0, 0, :2, :2].sum()))
    f = T.Flatten((3, 4, 4))
    assert f(x[None]).shape == (1, 2, 48)
    state, y = f.step(f.init_state(), x, 1.0)
    assert state is None and y.shape == (2, 48)


@pytest.mark.parametrize(
    "build,match",
    [
        (
            lambda: T.SpikingConv2d((2, 6), 3, 3, key=jr.key(0)),
            r"SpikingConv2d: in_shape must be \(channels, n, n\), got \(2, 6\)",
        ),
        (
            lambda: T.SpikingConv2d((3, 6, 6), 4, 3, key=jr.key(0), groups=2),
            r"SpikingConv2d: groups=2 must divide both the input channels \(3\) and out_channels \(4\)",
        ),
        (
            lambda: T.SpikingConv2d((2, 6, 6), 3, 3, key=jr.key(0), padding="full"),
            r"SpikingConv2d: padding must be 'same', 'valid', an int >= 0 or a sequence of 2 ints >= 0, got 'full'",
        ),
        (
            lambda: T.SpikingConv2d((2, 6, 6), 3, 3, key=jr.key(0), padding="same", stride=2),
            r"conv_output_shape: padding='same' needs stride 1, got stride=\(2, 2\)",
        ),
        (
            lambda: T.SpikingConv2d((2, 2, 2), 3, 5, key=jr.key(0)),
            r"conv_output_shape: a window of \(5, 5\) .* does not fit the input of spatial shape \(2, 2\)",
        ),
        (
            lambda: T.SpikingConv1d((2, 6), 0, 3, key=jr.key(0)),
            r"SpikingConv1d: out_channels must be a positive int, got 0",
        ),
        (
            lambda: T.SumPool2d((2, 6, 6), 0),
            r"SumPool2d: kernel_size must be an int >= 1 or a sequence of 2 such ints, got 0",
        ),
        (lambda: T.Flatten(()), r"Flatten: in_shape must be a non-empty tuple of ints, got \(\)"),
    ],
)
def test_bad_arguments_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_input_shapes_are_refused():
    layer = T.SpikingConv2d((2, 6, 6), 3, 3, key=jr.key(0))
    with pytest.raises(
        ValueError,
        match=r"SpikingConv2d: the input must end with the axes of one example \(2, 6, 6\).*"
        r"got shape \(5, 2, 5, 6\), read with time on axis 0 \(length 5\).*time_axis=1",
    ):
        layer(jnp.zeros((5, 2, 5, 6)))
    with pytest.raises(
        ValueError, match=r"conv2d: input must have shape \(\*batch, 2, \*spatial\)"
    ):
        T.conv2d(jnp.zeros((3, 6, 6)), layer.weight)


def test_batch_first_sequences_with_time_axis():
    """Convolution, pooling and flattening read a batch-first (batch, t, c, h, w) input when
    told `time_axis=1`, and give per example what the time-major call gives."""
    conv = T.SpikingConv2d((2, 6, 6), 3, 3, key=jr.key(0), padding=1, weight_scale=4.0)
    pool = T.SumPool2d((3, 6, 6), 2)
    flat = T.Flatten((3, 3, 3))
    x_tm = (jr.uniform(jr.key(1), (12, 4, 2, 6, 6)) < 0.3).astype(jnp.float32)
    x_bf = jnp.moveaxis(x_tm, 1, 0)
    for layer, x_ref in ((conv, x_tm), (pool, conv(x_tm)), (flat, pool(conv(x_tm)))):
        want = jnp.moveaxis(layer(x_ref), 0, 1)
        got = layer(jnp.moveaxis(x_ref, 1, 0), time_axis=1)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert float(conv(x_tm).sum()) > 0
    with pytest.raises(ValueError, match=r"SpikingConv2d: time_axis=2 must name one of the 2"):
        conv(x_bf, time_axis=2)
