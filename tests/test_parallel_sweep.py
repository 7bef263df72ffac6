"""nj.parallel.sweep: vmapped, chunked and device-sharded runs equal a Python loop.

The multi-device checks run in a subprocess with 8 forced host devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX starts).
"""

import json
import os
import subprocess
import sys
import textwrap

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax.parallel import _sweep

LIF = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=1.0)


def _rate(current):
    _, rec = nj.simulate(LIF, LIF.init_state(2), current, dt=0.1, n_steps=1000)
    return {"rate": rec.spikes.sum(0).astype(jnp.float32) / 0.1, "v": rec.values}


def _loop(fn, params):
    outs = [fn(jax.tree.map(lambda x, i=i: x[i], params)) for i in range(len(params))]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *outs)


def _count_traces(monkeypatch, n):
    """Give `sweep` a fresh compiled chunk program that may be traced at most `n` times."""
    chex.clear_trace_counter()
    monkeypatch.setattr(
        _sweep, "_run_jit", eqx.filter_jit(chex.assert_max_traces(_sweep._run, n=n))
    )


def test_sweep_equals_loop_in_chunks_without_recompiling(monkeypatch):
    currents = jnp.stack([jnp.linspace(0.3, 1.0, 11), jnp.linspace(1.0, 0.3, 11)], axis=1)
    want = _loop(_rate, currents)
    assert want["rate"].max() > 0
    # One trace for the full batch, one per distinct chunk size (4, then 11 again cached):
    # two at most, and at least two since the chunks of 11 and of 4 differ in shape.
    _count_traces(monkeypatch, 2)
    for batch_size in (None, 4, 11, 50):
        got = nj.parallel.sweep(_rate, currents, batch_size=batch_size)
        assert isinstance(got["rate"], np.ndarray)
        np.testing.assert_array_equal(got["rate"], want["rate"])
    # New values, same shapes: no new trace.
    nj.parallel.sweep(_rate, currents + 0.05, batch_size=4)


def test_sweep_over_keys_and_pytrees_on_device():
    keys = jr.split(jr.key(0), 7)
    params = {"key": keys, "gain": jnp.linspace(1.0, 2.0, 7)}

    def fn(p):
        return p["gain"] * jr.normal(p["key"], (3,))

    got = nj.parallel.sweep(fn, params, batch_size=3, to_host=False)
    assert isinstance(got, jax.Array) and got.shape == (7, 3)
    # Same numbers up to rounding: XLA may vectorise a chunk of 3 and a batch of 7
    # differently (the normal sampler's polynomial differs in the last bit).
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.vmap(fn)(params)), rtol=1e-6)


def test_sweep_module_values_are_traced(monkeypatch):
    # An equinox module as fn: its array fields are inputs, so a new tau reuses the program.
    _count_traces(monkeypatch, 1)
    for tau in (8.0, 12.0):
        lif = nj.LIF(tau_m=tau, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0)
        fn = _Rate(lif)
        got = nj.parallel.sweep(fn, jnp.linspace(0.4, 1.0, 4)[:, None])
        np.testing.assert_array_equal(got, _loop(fn, jnp.linspace(0.4, 1.0, 4)[:, None]))


class _Rate(eqx.Module):
    lif: nj.LIF

    def __call__(self, current):
        _, rec = nj.simulate(self.lif, self.lif.init_state(1), current, dt=0.1, n_steps=500)
        return rec.spikes.sum()


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((3, jnp.ones(3)), {}, r"sweep: fn must be callable"),
        ((_rate, {"a": jnp.ones(3), "b": jnp.ones(4)}), {}, r"the same leading batch axis"),
        ((_rate, jnp.ones(())), {}, r"the same leading batch axis"),
        ((_rate, jnp.ones((0, 2))), {}, r"empty batch axis"),
        ((_rate, {}), {}, r"params must contain at least one array"),
        ((_rate, jnp.ones((3, 2))), {"batch_size": 0}, r"batch_size must be a positive int"),
        ((_rate, jnp.ones((3, 2))), {"mesh": "cpu"}, r"mesh must be a jax.sharding.Mesh"),
        ((_rate, jnp.ones((3, 2))), {"axis": "x"}, r"axis='x' needs a mesh"),
        ((_rate, jnp.ones((3, 2))), {"to_host": 1}, r"to_host must be a bool"),
    ],
)
def test_sweep_errors(args, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        nj.parallel.sweep(*args, **kwargs)


_MULTI_DEVICE = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, jax.random as jr, numpy as np
    import neurojax as nj

    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=1.0)

    def rate(current):
        _, rec = nj.simulate(lif, lif.init_state(2), current, dt=0.1, n_steps=1000)
        return rec.spikes.sum(0)

    out = {"devices": jax.device_count()}
    mesh = jax.make_mesh((8,), ("trials",))
    mesh2 = jax.make_mesh((2, 4), ("a", "b"))
    for n in (24, 21):
        cur = jnp.stack([jnp.linspace(0.3, 1.0, n), jnp.linspace(1.0, 0.3, n)], axis=1)
        want = np.stack([np.asarray(rate(c)) for c in cur])
        for m, axis in ((mesh, None), (mesh2, None), (mesh2, "b")):
            for bs in (None, 8, 5):
                for host in (True, False):
                    got = nj.parallel.sweep(rate, cur, mesh=m, axis=axis, batch_size=bs,
                                            to_host=host)
                    key = f"{n}-{dict(m.shape)}-{axis}-{bs}-{host}"
                    out[key] = bool(np.array_equal(np.asarray(got), want))
                    if not host and n == 24 and bs is None and axis is None:
                        out[key + "-spec"] = str(got.sharding.spec)
                        out[key + "-ndev"] = len(got.sharding.device_set)
    keys = jr.split(jr.key(0), 13)
    got = nj.parallel.sweep(lambda k: jr.normal(k, (2,)), keys, batch_size=4, mesh=mesh)
    want = np.asarray(jax.vmap(lambda k: jr.normal(k, (2,)))(keys))
    out["keys"] = bool(np.allclose(got, want, rtol=1e-6, atol=0))
    try:
        nj.parallel.sweep(rate, cur, mesh=mesh, axis="nope")
    except ValueError as err:
        out["axis_error"] = str(err)
    print("RESULT " + json.dumps(out))
    """
)


def test_sweep_sharded_over_eight_devices_equals_loop():
    # Eight forced host devices: the CPU backend, also on a machine with a GPU.
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _MULTI_DEVICE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    assert out["devices"] == 8
    checks = {k: v for k, v in out.items() if isinstance(v, bool)}
    assert len(checks) == 2 * 3 * 3 * 2 + 1
    assert all(checks.values()), [k for k, v in checks.items() if not v]
    # Results stay sharded along the batch axis over all devices when asked.
    assert out["24-{'trials': 8}-None-None-False-spec"] == "P('trials', None)"
    assert out["24-{'trials': 8}-None-None-False-ndev"] == 8
    assert out["24-{'a': 2, 'b': 4}-None-None-False-ndev"] == 8
    assert "axis ['nope'] not in the mesh's axes ('trials',)" in out["axis_error"]
