"""NIR import and export: conformance with NIR's published LIF traces, each primitive against
a NumPy reference, round trips, refusals, and jit/vmap/grad of imported graphs."""

import importlib
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj

nir = pytest.importorskip("nir", reason="the optional `nir` package is not installed")

DATA = Path(__file__).parent / "data" / "nir"
F = np.float32


def _graph(node, in_shape, out_shape=None):
    """Input -> node -> Output."""
    out_shape = in_shape if out_shape is None else out_shape
    return nir.NIRGraph(
        nodes={
            "input": nir.Input(input_type=np.array(in_shape)),
            "node": node,
            "output": nir.Output(output_type=np.array(out_shape)),
        },
        edges=[("input", "node"), ("node", "output")],
        type_check=False,
    )


def _run(graph, x, dt, **kw):
    return np.asarray(nj.nir.from_nir(graph, dt=dt, **kw)(jnp.asarray(x, jnp.float32)))


# ------------------------------------------------------------------ NIR's LIF conformance data


def _conformance():
    trace = np.loadtxt(DATA / "lif_exact.csv", delimiter=",")
    return nir.read(DATA / "lif_norse.nir"), trace


def test_conformance_graph_matches_nirs_exact_simulation():
    graph, exact = _conformance()
    net = nj.nir.from_nir(graph, dt=1e-4)
    x = jnp.asarray(exact[:, :1], jnp.float32)
    state = net.init_state()
    v, z = [], []
    for t in range(x.shape[0]):
        state, out = net.step(state, x[t], 1e-4)
        v.append(float(state.nodes["1"].v[0]))
        z.append(float(out[0]))
    v, z = np.array(v), np.array(z)
    # Same spikes, in the same time bins (the reference dates a spike by its exact time).
    np.testing.assert_array_equal(np.nonzero(z)[0], np.nonzero(exact[:, 2])[0])
    assert z.sum() == 4
    # Before the first spike both integrate the same ODE exactly: float32 rounding only.
    first = int(np.nonzero(exact[:, 2])[0][0])
    np.testing.assert_allclose(v[:first], exact[:first, 1], atol=1e-6)
    # After a spike the reference resets at the crossing time and integrates the rest of the
    # step; neurojax resets at the end of the step. The difference is at most the voltage
    # one step of the largest input adds, r I (1 - exp(-dt / tau)), and decays afterwards.
    bound = 1.0 * exact[:, 0].max() * (1 - np.exp(-1e-4 / 0.0025))
    assert np.abs(v - exact[:, 1]).max() <= bound


def test_conformance_graph_with_euler_reproduces_norses_trace():
    graph, exact = _conformance()
    norse = np.loadtxt(DATA / "lif_norse.csv", delimiter=",")
    np.testing.assert_array_equal(norse[:, 0], exact[:, 0])
    net = nj.nir.from_nir(graph, dt=1e-4, method="euler")
    state = net.init_state()
    v, z = [], []
    for x in jnp.asarray(norse[:, :1], jnp.float32):
        state, out = net.step(state, x, 1e-4)
        v.append(float(state.nodes["1"].v[0]))
        z.append(float(out[0]))
    # Norse steps the same ODE by forward Euler: equal up to float32 rounding.
    np.testing.assert_allclose(v, norse[:, 1], atol=1e-6)
    np.testing.assert_array_equal(z, norse[:, 2])


def test_conformance_graph_runs_as_a_sequence_and_survives_a_round_trip(tmp_path):
    graph, exact = _conformance()
    net = nj.nir.from_nir(graph, dt=1e-4)
    x = jnp.asarray(exact[:, :1], jnp.float32)
    spikes = np.asarray(net(x))[:, 0]
    np.testing.assert_array_equal(np.nonzero(spikes)[0], np.nonzero(exact[:, 2])[0])
    path = tmp_path / "again.nir"
    nj.nir.to_nir(net, path)
    again = nj.nir.from_nir(path, dt=1e-4)
    np.testing.assert_array_equal(np.asarray(again(x)), np.asarray(net(x)))


# -------------------------------------------------------------- each primitive against NumPy


def test_affine_linear_scale_match_numpy():
    rng = np.random.default_rng(0)
    w, b, s = rng.normal(size=(3, 4)).astype(F), rng.normal(size=3).astype(F), rng.normal(size=3)
    x = rng.normal(size=(5, 2, 4)).astype(F)
    y = _run(_graph(nir.Affine(weight=w, bias=b), (4,), (3,)), x, 1.0)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-6)
    y = _run(_graph(nir.Linear(weight=w), (4,), (3,)), x, 1.0)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-6)
    y = _run(_graph(nir.Scale(scale=s.astype(F)), (3,)), x[..., :3], 1.0)
    np.testing.assert_allclose(y, x[..., :3] * s.astype(F), rtol=1e-6)


def test_threshold_is_strict_like_nir():
    x = np.array([[0.5, 1.0, 1.5]], F)
    y = _run(_graph(nir.Threshold(threshold=np.ones(3, F)), (3,)), x, 1.0)
    np.testing.assert_array_equal(y, [[0.0, 0.0, 1.0]])


def test_delay_shifts_each_element_by_its_steps():
    delay = np.array([0.0, 1.0, 3.0], F) * 0.5
    x = np.random.default_rng(1).normal(size=(8, 3)).astype(F)
    y = _run(_graph(nir.Delay(delay=delay), (3,)), x, 0.5)
    ref = np.zeros_like(x)
    for j, k in enumerate([0, 1, 3]):
        ref[k:, j] = x[: len(x) - k, j]
    np.testing.assert_array_equal(y, ref)


def test_flatten_keeps_batch_axes():
    node = nir.Flatten(input_type={"input": np.array([2, 3, 4])}, start_dim=0, end_dim=-1)
    x = np.arange(2 * 5 * 24, dtype=F).reshape(2, 5, 2, 3, 4)
    y = _run(_graph(node, (2, 3, 4), (24,)), x, 1.0)
    np.testing.assert_array_equal(y, x.reshape(2, 5, 24))


def _np_conv2d(x, w, b, stride, pad, dil, groups):
    c_out, c_in_g, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (x.shape[1] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x.shape[2] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((c_out, oh, ow))
    per_group = c_out // groups
    for o in range(c_out):
        g = o // per_group
        for i in range(oh):
            for j in range(ow):
                patch = x[
                    g * c_in_g : (g + 1) * c_in_g,
                    i * stride[0] : i * stride[0] + dil[0] * (kh - 1) + 1 : dil[0],
                    j * stride[1] : j * stride[1] + dil[1] * (kw - 1) + 1 : dil[1],
                ]
                y[o, i, j] = (patch * w[o]).sum() + b[o]
    return y


@pytest.mark.parametrize(
    "stride,pad,dil,groups", [((1, 1), (1, 1), (1, 1), 1), ((2, 1), (0, 2), (2, 1), 2)]
)
def test_conv2d_matches_numpy(stride, pad, dil, groups):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 4 // groups, 3, 2)).astype(F)
    b = rng.normal(size=4).astype(F)
    x = rng.normal(size=(3, 4, 7, 6)).astype(F)
    node = nir.Conv2d(
        input_shape=(7, 6), weight=w, stride=stride, padding=pad, dilation=dil, groups=groups,
        bias=b,
    )  # fmt: skip
    y = _run(_graph(node, (4, 7, 6), tuple(node.output_type["output"])), x, 1.0)
    ref = np.stack([_np_conv2d(xi, w, b, stride, pad, dil, groups) for xi in x])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv1d_matches_numpy():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(2, 3, 3)).astype(F)
    b = rng.normal(size=2).astype(F)
    x = rng.normal(size=(4, 3, 9)).astype(F)
    node = nir.Conv1d(input_shape=9, weight=w, stride=2, padding=1, dilation=1, groups=1, bias=b)
    y = _run(_graph(node, (3, 9), (2, 5)), x, 1.0)
    ref = np.stack(
        [_np_conv2d(xi[:, :, None], w[..., None], b, (2, 1), (1, 0), (1, 1), 1)[..., 0] for xi in x]
    )
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["SumPool2d", "AvgPool2d"])
def test_pooling_matches_numpy(kind):
    x = np.random.default_rng(4).normal(size=(2, 3, 6, 5)).astype(F)
    node = getattr(nir, kind)(
        kernel_size=np.array([2, 2]), stride=np.array([2, 1]), padding=np.array([0, 1])
    )
    y = _run(_graph(node, (3, 6, 5), (3, 3, 6)), x, 1.0)
    xp = np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 1)))
    ref = np.zeros((2, 3, 3, 6))
    for i in range(3):
        for j in range(6):
            ref[:, :, i, j] = xp[:, :, 2 * i : 2 * i + 2, j : j + 2].sum(axis=(2, 3))
    if kind == "AvgPool2d":
        ref /= 4
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def _np_neuron(kind, p, x, dt, method):
    """A NumPy loop over the NIR equations with the input held over each step."""
    n = x.shape[1]
    v = np.full(n, p.get("v_leak", 0.0), dtype=np.float64) * np.ones(n)
    i = np.zeros(n)
    out = []
    for xt in x.astype(np.float64):
        if kind in ("I", "IF"):
            v = v + dt * p["r"] * xt
        elif kind in ("LI", "LIF"):
            drive = p["v_leak"] + p["r"] * xt
            if method == "euler":
                v = v + dt / p["tau"] * (drive - v)
            else:
                v = drive + (v - drive) * np.exp(-dt / p["tau"])
        else:
            if method == "euler":
                i = i + dt / p["tau_syn"] * (p["w_in"] * xt - i)
                v = v + dt / p["tau_mem"] * (p["v_leak"] - v + p["r"] * i)
            else:
                # The pair as one linear system, integrated with a matrix exponential.
                from scipy.linalg import expm

                for k in range(n):
                    a = np.array(
                        [
                            [-1 / p["tau_syn"][k], 0.0, p["w_in"][k] * xt[k] / p["tau_syn"][k]],
                            [
                                p["r"][k] / p["tau_mem"][k],
                                -1 / p["tau_mem"][k],
                                p["v_leak"][k] / p["tau_mem"][k],
                            ],
                            [0.0, 0.0, 0.0],
                        ]
                    )
                    i[k], v[k], _ = expm(a * dt) @ np.array([i[k], v[k], 1.0])
        if kind in ("IF", "LIF", "CubaLIF"):
            z = (v > p["v_threshold"]).astype(float)
            v = np.where(z > 0, p["v_reset"], v)
            out.append(z)
        else:
            out.append(v.copy())
    return np.array(out)


NEURON_PARAMS = {
    "I": dict(r=[1.0, 2.0, 0.5]),
    "IF": dict(r=[1.0, 2.0, 0.5], v_threshold=[1.0, 1.5, 0.7], v_reset=[0.0, -0.2, 0.1]),
    "LI": dict(tau=[5.0, 10.0, 20.0], r=[1.0, 2.0, 3.0], v_leak=[0.0, 0.5, -0.5]),
    "LIF": dict(
        tau=[5.0, 10.0, 20.0],
        r=[2.0, 3.0, 4.0],
        v_leak=[0.0, 0.5, -0.5],
        v_threshold=[1.0, 1.2, 0.8],
        v_reset=[0.0, 0.1, -0.6],
    ),  # fmt: skip
    "CubaLI": dict(
        tau_syn=[2.0, 10.0, 10.0],
        tau_mem=[5.0, 10.0, 20.0],
        r=[1.0, 2.0, 3.0],
        v_leak=[0.0, 0.5, -0.5],
        w_in=[1.0, 2.0, 0.5],
    ),  # fmt: skip
    "CubaLIF": dict(
        tau_syn=[2.0, 10.0, 10.0],
        tau_mem=[5.0, 10.0, 20.0],
        r=[3.0, 2.0, 4.0],
        v_leak=[0.0, 0.5, -0.5],
        w_in=[1.0, 2.0, 1.5],
        v_threshold=[1.0, 1.2, 0.8],
        v_reset=[0.0, 0.1, -0.6],
    ),  # fmt: skip
}


@pytest.mark.parametrize("method", ["exact", "euler"])
@pytest.mark.parametrize("kind", list(NEURON_PARAMS))
def test_neuron_primitives_match_numpy(kind, method):
    params = {k: np.array(v, F) for k, v in NEURON_PARAMS[kind].items()}
    node = getattr(nir, kind)(**params)
    x = (np.random.default_rng(5).uniform(size=(60, 3)) < 0.4).astype(F) * 1.5
    dt = 0.5
    y = _run(_graph(node, (3,)), x, dt, method=method)
    ref = _np_neuron(kind, {k: v.astype(np.float64) for k, v in params.items()}, x, dt, method)
    if kind in ("IF", "LIF", "CubaLIF"):
        assert ref.sum() > 5, "the reference should spike"
        np.testing.assert_array_equal(y, ref)
    else:
        # float32 against float64: a relative error of a few ulps per step, accumulated.
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_cuba_exact_integration_is_smooth_when_the_time_constants_meet():
    # c = tau_syn (a - b) / (tau_syn - tau_mem) has a removable singularity at equality.
    x = np.ones((20, 3), F)
    outs = []
    for tau_syn in (10.0 - 1e-3, 10.0, 10.0 + 1e-3):
        p = dict(NEURON_PARAMS["CubaLI"], tau_syn=[tau_syn] * 3, tau_mem=[10.0] * 3)
        outs.append(
            _run(_graph(nir.CubaLI(**{k: np.array(v, F) for k, v in p.items()}), (3,)), x, 1.0)
        )
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(outs[2], outs[1], rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- round trips


def _dense_model():
    k1, k2, k3 = jr.split(jr.key(0), 3)
    neuron = nj.LIF(tau_m=jnp.linspace(5.0, 15.0, 6), v_rest=0.0, v_reset=0.0, v_th=1.0)
    return nj.training.Sequential(
        [
            nj.training.SpikingDense(4, 6, key=k1, weight_scale=30.0, neuron=neuron),
            nj.training.SpikingRecurrent(6, 5, key=k2, weight_scale=40.0),
            nj.training.LeakyReadout(5, 3, key=k3, tau=jnp.array([5.0, 8.0, 12.0])),
        ]
    )


def _inputs(shape, key=1, rate=0.5):
    return (jr.uniform(jr.key(key), shape) < rate).astype(jnp.float32)


def test_neurojax_to_nir_to_neurojax_keeps_parameters_and_outputs(tmp_path):
    model = _dense_model()
    graph = nj.nir.to_nir(model, tmp_path / "m.nir")
    assert [type(graph.nodes[n]).__name__ for n in graph.nodes] == [
        "Input", "Affine", "LIF", "Affine", "LIF", "Linear", "Affine", "LI", "Output",
    ]  # fmt: skip
    # Seconds by default, and the graph says so.
    assert graph.metadata["time_unit"] == "s"
    net = nj.nir.from_nir(tmp_path / "m.nir", dt=1e-3)
    assert net.time_unit == "s"
    np.testing.assert_array_equal(net.nodes["layer0_affine"].weight, model.layers[0].weight.T)
    np.testing.assert_allclose(
        net.nodes["layer0_lif"].tau, model.layers[0].neuron.tau_m * 1e-3, rtol=1e-6
    )
    np.testing.assert_array_equal(net.nodes["layer1_recurrent"].weight, model.layers[1].recurrent.T)
    x = _inputs((30, 2, 4))
    expected = model(x, dt=1.0)
    got = net(x)
    assert (
        float(model.layers[0](x).sum()) > 0 and float(model.layers[1](model.layers[0](x)).sum()) > 0
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_convolutional_model_round_trip():
    k1, k2 = jr.split(jr.key(3))
    conv = nj.training.SpikingConv2d((2, 6, 6), 3, 3, key=k1, padding=1, weight_scale=6.0)
    pool = nj.training.AvgPool2d(conv.out_shape, 2)
    flat = nj.training.Flatten(pool.out_shape)
    model = nj.training.Sequential(
        [conv, pool, flat, nj.training.SpikingDense(flat.out_shape, 4, key=k2, weight_scale=8.0)]
    )
    x = _inputs((12, 2, 6, 6), key=4)
    net = nj.nir.from_nir(nj.nir.to_nir(model), dt=1e-3)
    assert float(conv(x).sum()) > 0
    np.testing.assert_allclose(np.asarray(net(x)), np.asarray(model(x)), atol=1e-5)


def _every_primitive_graph():
    rng = np.random.default_rng(6)

    def arr(*shape):
        return rng.uniform(0.5, 1.5, size=shape).astype(F)

    nodes = {
        "input": nir.Input(input_type=np.array([1, 4, 4])),
        "conv": nir.Conv2d(
            input_shape=(4, 4),
            weight=arr(2, 1, 3, 3),
            stride=1,
            padding=1,
            dilation=1,
            groups=1,
            bias=arr(2),
        ),
        "pool": nir.SumPool2d(
            kernel_size=np.array([2, 2]), stride=np.array([2, 2]), padding=np.array([0, 0])
        ),
        "flat": nir.Flatten(input_type={"input": np.array([2, 2, 2])}, start_dim=0, end_dim=-1),
        "affine": nir.Affine(weight=arr(3, 8), bias=arr(3)),
        "scale": nir.Scale(scale=arr(3)),
        "delay": nir.Delay(delay=np.array([0.0, 1.0, 2.0], F)),
        "lif": nir.LIF(
            tau=arr(3) * 5,
            r=arr(3),
            v_leak=np.zeros(3, F),
            v_threshold=arr(3) * 3,
            v_reset=np.zeros(3, F),
        ),
        "rec": nir.Linear(weight=arr(3, 3) - 1.0),
        "cubalif": nir.CubaLIF(
            tau_syn=arr(3),
            tau_mem=arr(3) * 4,
            r=arr(3),
            v_leak=np.zeros(3, F),
            v_threshold=arr(3),
            v_reset=np.zeros(3, F),
            w_in=arr(3),
        ),
        "li": nir.LI(tau=arr(3), r=arr(3), v_leak=np.zeros(3, F)),
        "cubali": nir.CubaLI(tau_syn=arr(3), tau_mem=arr(3), r=arr(3), v_leak=np.zeros(3, F)),
        "if": nir.IF(r=arr(3), v_threshold=arr(3) * 2, v_reset=np.zeros(3, F)),
        "integrator": nir.I(r=arr(3)),
        "threshold": nir.Threshold(threshold=arr(3)),
        "output": nir.Output(output_type=np.array([3])),
        "output_v": nir.Output(output_type=np.array([3])),
    }
    nodes["pool"].input_type = {"input": np.array([2, 4, 4])}
    nodes["pool"].output_type = {"output": np.array([2, 2, 2])}
    edges = [
        ("input", "conv"), ("conv", "pool"), ("pool", "flat"), ("flat", "affine"),
        ("affine", "scale"), ("scale", "delay"), ("delay", "lif"), ("lif", "rec"),
        ("rec", "lif"), ("lif", "cubalif"), ("cubalif", "li"), ("li", "output_v"),
        ("cubalif", "cubali"), ("cubali", "if"), ("if", "integrator"),
        ("integrator", "threshold"), ("threshold", "output"),
    ]  # fmt: skip
    return nir.NIRGraph(nodes=nodes, edges=edges, type_check=False)


def test_nir_to_neurojax_to_nir_keeps_every_node_and_edge(tmp_path):
    graph = _every_primitive_graph()
    net = nj.nir.from_nir(graph, dt=1.0)
    assert net.feedback_edges == (("rec", "lif"),)
    back = nj.nir.to_nir(net)
    assert set(back.nodes) == set(graph.nodes)
    assert sorted(back.edges) == sorted(graph.edges)
    for name, node in graph.nodes.items():
        other = back.nodes[name]
        assert type(other) is type(node), name
        for field, value in vars(node).items():
            if field in ("input_type", "output_type", "metadata"):
                continue
            if isinstance(value, np.ndarray):
                np.testing.assert_allclose(
                    getattr(other, field), value, rtol=1e-6, err_msg=f"{name}.{field}"
                )
            else:
                assert np.all(np.asarray(getattr(other, field)) == np.asarray(value)), (
                    f"{name}.{field}"
                )
    nir.write(tmp_path / "all.nir", back)
    again = nj.nir.from_nir(tmp_path / "all.nir", dt=1.0)
    x = jnp.asarray(np.random.default_rng(7).uniform(0, 2, size=(25, 1, 4, 4)), jnp.float32)
    out, out2 = net(x), again(x)
    assert set(out) == {"output", "output_v"}
    for k in out:
        np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(out2[k]))
    assert float(out["output"].sum()) > 0


def test_time_scale_writes_seconds():
    model = nj.training.SpikingDense(3, 2, key=jr.key(0))
    graph = nj.nir.to_nir(model, time_scale=1e-3)
    np.testing.assert_allclose(graph.nodes["layer0_lif"].tau, [0.01, 0.01], rtol=1e-6)
    x = _inputs((20, 3))
    net = nj.nir.from_nir(graph, dt=1e-3)
    np.testing.assert_array_equal(np.asarray(net(x)), np.asarray(model(x, dt=1.0)))


def test_default_export_is_in_seconds_and_a_unit_mix_up_is_warned(tmp_path):
    """to_nir writes seconds (and says so); from_nir with dt in the graph's unit gives the
    model's spikes, and a dt a thousand times off either way warns naming both."""
    model = nj.training.SpikingDense(3, 2, key=jr.key(0), weight_scale=6.0)
    x = _inputs((40, 3))
    want = np.asarray(model(x, dt=1.0))
    assert want.sum() > 0
    graph = nj.nir.to_nir(model, tmp_path / "s.nir")
    np.testing.assert_allclose(graph.nodes["layer0_lif"].tau, [0.01, 0.01], rtol=1e-6)
    assert nir.read(tmp_path / "s.nir").metadata["time_unit"] == "s"
    net = nj.nir.from_nir(tmp_path / "s.nir", dt=1e-3)  # 1 ms, in seconds
    np.testing.assert_array_equal(np.asarray(net(x)), want)
    # The round trip of the imported network keeps the unit and the values.
    again = nj.nir.to_nir(net)
    assert again.metadata["time_unit"] == "s"
    np.testing.assert_array_equal(again.nodes["layer0_lif"].tau, graph.nodes["layer0_lif"].tau)
    # A graph in seconds read with a dt in ms: the time constants are 0.01 of dt.
    with pytest.warns(
        UserWarning,
        match=r"from_nir: the graph's time constants \(median 0.01, from 0.01 to 0.01\) are "
        r"0.01 times dt=1; the graph's metadata says its time unit is 's'",
    ):
        nj.nir.from_nir(graph, dt=1.0)
    # A graph in ms read with a dt in seconds (the mix-up): 10 ms / 1e-3 = 1e4.
    in_ms = nj.nir.to_nir(model, time_scale=1.0)
    with pytest.warns(UserWarning, match=r"are 1e\+04 times dt=0.001; .*time unit is 'ms'"):
        nj.nir.from_nir(in_ms, dt=1e-3)
    del in_ms.metadata["time_unit"]
    with pytest.warns(UserWarning, match=r"\(the graph does not state its time unit\)"):
        nj.nir.from_nir(in_ms, dt=1e-3)
    # In range, no warning (the suite turns warnings into errors).
    nj.nir.from_nir(in_ms, dt=1.0)


def test_nested_graphs_are_inlined():
    inner = nir.NIRGraph.from_list(nir.Affine(weight=np.eye(2, dtype=F) * 2, bias=np.zeros(2, F)))
    graph = nir.NIRGraph(
        nodes={
            "input": nir.Input(input_type=np.array([2])),
            "sub": inner,
            "output": nir.Output(output_type=np.array([2])),
        },
        edges=[("input", "sub"), ("sub", "output")],
        type_check=False,
    )
    net = nj.nir.from_nir(graph, dt=1.0)
    assert "sub.affine" in net.nodes
    np.testing.assert_allclose(np.asarray(net(jnp.ones((3, 2)))), 2.0)


def test_open_shapes_are_inferred_from_the_graph():
    # As Norse and snnTorch write them: scalar neuron parameters, an Input without a shape.
    w = np.array([[1.0, 0.5, 0.0], [0.0, 0.5, 1.0]], F)
    scalar = dict(
        tau=np.array(5.0, F),
        r=np.array(2.0, F),
        v_leak=np.array(0.0, F),
        v_threshold=np.array(1.0, F),
        v_reset=np.array(0.0, F),
    )
    vector = {k: np.full(2, v, F) for k, v in scalar.items()}
    x = _inputs((30, 3), key=9)
    outs, nets = [], []
    for params in (scalar, vector):
        graph = nir.NIRGraph(
            nodes={
                "in": nir.Input(input_type=np.array([3])),
                "w": nir.Linear(weight=w),
                "lif": nir.LIF(**params),
                "out": nir.Output(output_type=np.array([2])),
            },
            edges=[("in", "w"), ("w", "lif"), ("lif", "out")],
            type_check=False,
        )
        graph.nodes["in"].input_type = {"input": None}
        graph.nodes["out"].output_type = {"output": None}
        net = nj.nir.from_nir(graph, dt=1.0)
        assert net.nodes["in"].shape == (3,) and net.nodes["lif"].shape == (2,)
        outs.append(np.asarray(net(x)))
        nets.append(net)
    assert outs[0].shape == (30, 2) and outs[0].sum() > 0
    np.testing.assert_array_equal(outs[0], outs[1])
    # Written back, the scalar parameters stay scalars.
    assert nj.nir.to_nir(nets[0]).nodes["lif"].tau.shape == ()
    assert nj.nir.to_nir(nets[1]).nodes["lif"].tau.shape == (2,)


def test_a_neuron_whose_shape_disagrees_with_its_input_is_refused():
    graph = nir.NIRGraph(
        nodes={
            "in": nir.Input(input_type=np.array([3])),
            "w": nir.Linear(weight=np.ones((2, 3), F)),
            "lif": _lif(
                tau=np.ones(3, F),
                r=np.ones(3, F),
                v_leak=np.zeros(3, F),
                v_threshold=np.ones(3, F),
                v_reset=np.zeros(3, F),
            ),
            "out": nir.Output(output_type=np.array([3])),
        },
        edges=[("in", "w"), ("w", "lif"), ("lif", "out")],
        type_check=False,
    )
    with pytest.raises(
        ValueError,
        match=r"from_nir: node 'lif' \(LIF\): its parameters have shape \(3,\) but its input has shape \(2,\)",
    ):
        nj.nir.from_nir(graph, dt=1.0)


# ---------------------------------------------------------------------------------- refusals


def _lif(**over):
    p = dict(
        tau=np.ones(2, F),
        r=np.ones(2, F),
        v_leak=np.zeros(2, F),
        v_threshold=np.ones(2, F),
        v_reset=np.zeros(2, F),
    )
    p.update(over)
    return nir.LIF(**p)


@pytest.mark.parametrize(
    "node,match",
    [
        (
            _lif(v_reset=np.array([0.0, 1.0], F)),
            r"node 'node' \(LIF\): v_reset must be < v_threshold everywhere",
        ),
        (
            _lif(tau=np.array([1.0, -1.0], F)),
            r"node 'node' \(LIF\): tau must be > 0 everywhere, got \[1.0, -1.0\]",
        ),
        (_lif(r=np.array([1.0, np.nan], F)), r"node 'node' \(LIF\): r must be finite"),
        (
            nir.Delay(delay=np.array([0.25, 1.0], F)),
            r"node 'node' \(Delay\): delay must be a whole number of time steps dt=0.5",
        ),
        (nir.Delay(delay=np.array([-1.0, 1.0], F)), r"node 'node' \(Delay\): delay must be >= 0"),
        (
            nir.Affine(weight=np.ones((1, 2, 2), F), bias=np.zeros(2, F)),
            r"node 'node' \(Affine\): weight must be a matrix",
        ),
    ],
)
def test_refusals_name_the_node_and_field(node, match):
    with pytest.raises(ValueError, match=match):
        nj.nir.from_nir(_graph(node, (2,)), dt=0.5)


def test_unsupported_primitive_is_refused():
    from nir.ir.graph import Identity

    node = Identity(input_type={"input": np.array([2])})
    with pytest.raises(
        ValueError,
        match=r"node 'node' has type Identity, which neurojax does not support; supported: Input",
    ):
        nj.nir.from_nir(_graph(node, (2,)), dt=1.0)


def test_bad_arguments_are_refused():
    graph = _graph(_lif(), (2,))
    with pytest.raises(ValueError, match=r"from_nir: dt must be finite and > 0 ms, got -1.0"):
        nj.nir.from_nir(graph, dt=-1.0)
    with pytest.raises(ValueError, match=r"from_nir: method must be one of"):
        nj.nir.from_nir(graph, dt=1.0, method="rk4")
    with pytest.raises(
        TypeError,
        match=r"from_nir: graph must be a nir.NIRGraph or a path to a .nir file, got dict",
    ):
        nj.nir.from_nir({}, dt=1.0)
    net = nj.nir.from_nir(graph, dt=1.0)
    with pytest.raises(
        ValueError,
        match=r"NIRNetwork: dt must be the dt the graph was imported with \(1.0\), got 0.5",
    ):
        net.step(net.init_state(), jnp.zeros(2), 0.5)
    with pytest.raises(ValueError, match=r"to_nir: time_scale must be finite and > 0, got -1.0"):
        nj.nir.to_nir(net, time_scale=-1.0)
    with pytest.raises(TypeError, match=r"to_nir: model must be Sequential, SpikingDense"):
        nj.nir.to_nir(nj.LIF())


def test_export_refuses_what_nir_cannot_express():
    layer = nj.training.SpikingDense(2, 2, key=jr.key(0), neuron=nj.Izhikevich())
    with pytest.raises(
        ValueError,
        match=r"to_nir: layer 0 \(SpikingDense\) has a Izhikevich neuron; NIR has a primitive",
    ):
        nj.nir.to_nir(layer)
    layer = nj.training.SpikingDense(2, 2, key=jr.key(0), neuron=nj.LIF(t_ref=2.0))
    with pytest.raises(
        ValueError,
        match=r"to_nir: layer 0 \(SpikingDense\) has an nj.LIF with t_ref=2.0 ms; NIR's LIF has no refractory period",
    ):
        nj.nir.to_nir(layer)


def test_missing_nir_package_gives_an_install_hint(monkeypatch):
    real = importlib.import_module

    def fake(name, *args):
        if name == "nir":
            raise ImportError("No module named 'nir'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(
        ImportError,
        match=r"nj.nir.from_nir needs the `nir` package .*pip install 'neurojax\[nir\]'",
    ):
        nj.nir.from_nir(_graph(_lif(), (2,)), dt=1.0)


# ------------------------------------------------------------------ transformations


def test_imported_graph_under_jit_vmap_and_grad():
    graph = nj.nir.to_nir(_dense_model(), time_scale=1.0)  # in ms, as neurojax
    assert graph.metadata["time_unit"] == "ms"
    net = nj.nir.from_nir(graph, dt=1.0)
    x = _inputs((20, 3, 4), key=8)
    eager = net(x)
    jitted = eqx.filter_jit(lambda m, x: m(x))(net, x)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), atol=1e-6)
    vmapped = jax.vmap(lambda xi: net(xi), in_axes=1, out_axes=1)(x)
    np.testing.assert_allclose(np.asarray(vmapped), np.asarray(eager), atol=1e-6)

    def loss(m):
        return jnp.sum(m(x) ** 2)

    grads = eqx.filter_grad(loss)(net)
    g = grads.nodes["layer0_affine"].weight
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).sum()) > 0
    step_by_step = nj.simulate(
        net, net.init_state((3,)), x, dt=1.0, record=nj.Record(spikes="float")
    )[1].spikes
    np.testing.assert_allclose(np.asarray(step_by_step), np.asarray(eager), atol=1e-6)


# -------------------------------------------------------- graphs made by other simulators


# snnTorch 1.0 and Norse 1.1 export through nirtorch's deprecated `extract_nir_graph`; there is
# no newer export API in either, so only that warning is let through.
_EXTRACT_NIR_GRAPH_DEPRECATED = (
    "ignore:nirtorch.extract_nir_graph is being deprecated:DeprecationWarning"
)


@pytest.mark.filterwarnings(_EXTRACT_NIR_GRAPH_DEPRECATED)
@pytest.mark.parametrize("reset_delay", [True, False])
def test_graph_exported_by_snntorch(reset_delay):
    torch = pytest.importorskip("torch", reason="snnTorch's export needs torch (the `bench` extra)")
    snn = pytest.importorskip("snntorch", reason="snnTorch is not installed (the `bench` extra)")
    from snntorch.export_nir import export_to_nir

    torch.manual_seed(0)
    # beta and threshold per neuron: with scalars snnTorch writes a LIF of shape () and its own
    # type check (nir.NIRGraph.infer_types, run inside export_to_nir) refuses the Affine (3,)
    # -> LIF () edge before neurojax sees the graph.
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 3),
        snn.Leaky(
            beta=torch.full((3,), 0.9),
            threshold=torch.ones(3),
            init_hidden=True,
            reset_mechanism="zero",
            reset_delay=reset_delay,
        ),
    )
    x = (torch.rand(40, 4) < 0.5).float() * 3.0
    graph = export_to_nir(net, x[0])
    # The export runs the network on its sample, which leaves a membrane in the hidden state.
    net[1].reset_mem()
    with torch.no_grad():
        ref = torch.stack([net(xt) for xt in x]).numpy()
    assert ref.sum() >= 3, "the reference should spike"
    # snnTorch writes tau = dt / (1 - beta), r = tau / dt with dt = 1e-4 and steps by forward
    # Euler, which method="euler" reproduces: v <- beta v + x. Its reset to zero, delayed or
    # not, zeroes the membrane before the next step's input is added, as NIR's immediate
    # reset to v_reset = 0 does, so the spike trains are the same throughout.
    ours = np.asarray(nj.nir.from_nir(graph, dt=1e-4, method="euler")(jnp.asarray(x.numpy())))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.filterwarnings(_EXTRACT_NIR_GRAPH_DEPRECATED)
def test_graph_exported_by_norse():
    import inspect

    torch = pytest.importorskip("torch", reason="Norse's export needs torch (the `bench` extra)")
    norse = pytest.importorskip("norse.torch", reason="Norse is not installed (the `bench` extra)")

    torch.manual_seed(0)
    model = norse.SequentialState(torch.nn.Linear(4, 3, bias=False), norse.LIFBoxCell())
    x = (torch.rand(40, 4) < 0.5).float() * 30
    # Recent Norse reads the graph from the module alone (sample_data is deprecated there).
    if inspect.signature(norse.to_nir).parameters["sample_data"].default is inspect._empty:
        graph = norse.to_nir(model, x[0])
    else:
        graph = norse.to_nir(model, type_check=False)
    state, ref = None, []
    with torch.no_grad():
        for xt in x:
            z, state = model(xt, state)
            ref.append(z.numpy())
    ref = np.array(ref)
    assert ref.sum() > 0, "the reference should spike"
    # Norse steps its LIFBox by forward Euler with dt = 1e-3 s, v += dt / tau (v_leak - v + x),
    # a spike where v > v_th and a reset to v_reset at once: the steps of method="euler". Its
    # export (Norse 1.1) writes tau = dt / tau_mem_inv = dt * tau (1e-5 for
    # the default tau = 10 ms), not tau; the graph's tau is set right before the import. The
    # LIF's parameters are scalars: neurojax takes the layer's shape from
    # the Affine before it.
    dt = 1e-3
    lif = graph.nodes["1"]
    tau_mem_inv = np.asarray(model[1].p.tau_mem_inv)
    np.testing.assert_allclose(np.asarray(lif.tau), dt / tau_mem_inv, rtol=1e-6)
    lif.tau = 1.0 / tau_mem_inv
    ours = np.asarray(nj.nir.from_nir(graph, dt=dt, method="euler")(jnp.asarray(x.numpy())))
    np.testing.assert_array_equal(ours, ref)
    # The graph as exported describes a neuron 100 times faster than Norse's: it does not match.
    # from_nir says so: the time constants are a hundredth of dt.
    lif.tau = dt / tau_mem_inv
    with pytest.warns(
        UserWarning, match=r"from_nir: the graph's time constants .* are 0.01 times dt=0.001"
    ):
        wrong = np.asarray(nj.nir.from_nir(graph, dt=dt, method="euler")(jnp.asarray(x.numpy())))
    assert np.any(wrong != ref)


def test_no_recompilation_when_only_values_change():
    net = nj.nir.from_nir(_every_primitive_graph(), dt=1.0)
    x = jnp.asarray(np.random.default_rng(10).uniform(0, 2, size=(10, 1, 4, 4)), jnp.float32)
    traces = []

    @eqx.filter_jit
    def run(m, x):
        traces.append(1)
        return m(x)

    run(net, x)
    other = eqx.tree_at(lambda m: m.nodes["affine"].weight, net, net.nodes["affine"].weight * 2)
    other = eqx.tree_at(lambda m: m.nodes["lif"].tau, other, other.nodes["lif"].tau + 1.0)
    run(other, x)
    assert len(traces) == 1


def test_smooth_gradients_match_finite_differences():
    # Affine into a current-based leaky integrator: no threshold, so the output is a smooth
    # function of the weights and the exact gradient can be checked.
    graph = _graph(
        nir.CubaLI(
            tau_syn=np.array([2.0, 4.0], F),
            tau_mem=np.array([5.0, 5.0], F),
            r=np.ones(2, F),
            v_leak=np.zeros(2, F),
        ),
        (2,),
    )
    x = jnp.asarray(np.random.default_rng(11).uniform(size=(30, 2)), jnp.float32)
    net = nj.nir.from_nir(graph, dt=1.0)

    def loss(w_in):
        m = eqx.tree_at(lambda m: m.nodes["node"].w_in, net, w_in)
        return jnp.sum(m(x) ** 2)

    w0 = net.nodes["node"].w_in
    grad = np.asarray(jax.grad(loss)(w0))
    eps = 1e-2
    for k in range(2):
        e = jnp.zeros(2).at[k].set(eps)
        fd = (float(loss(w0 + e)) - float(loss(w0 - e))) / (2 * eps)
        # central differences of a quadratic in w_in are exact up to float32 rounding
        assert abs(grad[k] - fd) <= 1e-3 * abs(fd)


def test_flatten_without_input_type_takes_its_inputs_shape():
    # snnTorch writes Flatten with input_type None and the batch axis already left out.
    w = np.random.default_rng(12).normal(size=(2, 1, 3, 3)).astype(F)
    nodes = {
        "input": nir.Input(input_type=np.array([1, 5, 5])),
        "conv": nir.Conv2d(
            input_shape=None,
            weight=w,
            stride=1,
            padding=0,
            dilation=1,
            groups=1,
            bias=np.zeros(2, F),
        ),
        "flat": nir.Flatten(input_type=None, start_dim=0, end_dim=-1),
        "output": nir.Output(output_type=None),
    }
    graph = nir.NIRGraph(
        nodes=nodes,
        edges=[("input", "conv"), ("conv", "flat"), ("flat", "output")],
        type_check=False,
    )
    net = nj.nir.from_nir(graph, dt=1.0)
    assert net.nodes["flat"].shape == (18,) and net.nodes["output"].shape == (18,)
    x = jnp.ones((2, 3, 1, 5, 5))
    assert net(x).shape == (2, 3, 18)
    nodes["flat"] = nir.Flatten(input_type=None, start_dim=2, end_dim=1)
    graph = nir.NIRGraph(
        nodes=nodes,
        edges=[("input", "conv"), ("conv", "flat"), ("flat", "output")],
        type_check=False,
    )
    with pytest.raises(
        ValueError,
        match=r"from_nir: node 'flat' \(Flatten\): start_dim=2 and end_dim=1 do not select axes of an input of shape \(2, 3, 3\)",
    ):
        nj.nir.from_nir(graph, dt=1.0)
