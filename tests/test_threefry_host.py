"""The host-side threefry functions against `jax.random`, and what they buy: connectivity
builders that draw the same synapses whether their random words come from NumPy or from a
compiled JAX program, and a COBA build that compiles no sampler in a fresh process."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax.connectivity import _sampling
from neurojax.connectivity._threefry import HostKey, threefry2x32

SEEDS = [0, 1, 7, 2**31 - 1, 123_456_789, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_split_fold_in_and_bits_equal_jax_random(seed):
    key = jr.key(seed)
    hk = HostKey.of(key)
    assert hk is not None
    np.testing.assert_array_equal(hk.data, np.asarray(jr.key_data(key)))
    for n in (1, 2, 3, 4, 9):
        want = np.asarray(jr.key_data(jr.split(key, n)))
        got = np.stack([k.data for k in hk.split(n)])
        np.testing.assert_array_equal(got, want)
    for d in (0, 1, 5, 2**31 - 1, 2**32 - 1):
        np.testing.assert_array_equal(
            hk.fold_in(d).data, np.asarray(jr.key_data(jr.fold_in(key, d)))
        )
    for shape in ((1,), (3,), (7, 5), (513, 48), (2, 3, 4)):
        np.testing.assert_array_equal(hk.bits(shape), np.asarray(jr.bits(key, shape, jnp.uint32)))


def test_threefry_known_answer():
    # The Threefry-2x32 (20 rounds) known-answer vectors of Salmon et al. (Random123).
    y0, y1 = threefry2x32(0, 0, np.array([0], np.uint32), np.array([0], np.uint32))
    assert (int(y0[0]), int(y1[0])) == (0x6B200159, 0x99BA4EFE)
    y0, y1 = threefry2x32(
        0xFFFFFFFF, 0xFFFFFFFF, np.array([0xFFFFFFFF], np.uint32), np.array([0xFFFFFFFF], np.uint32)
    )
    assert (int(y0[0]), int(y1[0])) == (0x1CB996FC, 0xBB002BE7)


def test_raw_key_data_and_other_implementations():
    raw = jr.PRNGKey(3)
    np.testing.assert_array_equal(HostKey.of(raw).data, np.asarray(raw))
    assert HostKey.of(jr.key(3, impl="rbg")) is None
    assert HostKey.of(jr.split(jr.key(3), 2)) is None  # a batch of keys


def test_non_partitionable_mode_falls_back_to_jax():
    with jax.threefry_partitionable(False):
        assert HostKey.of(jr.key(3)) is None
        a = nj.connect.fixed_prob(jr.key(3), 300, 200, 0.1)
        b = nj.connect.fixed_prob(jr.key(3), 300, 200, 0.1)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))


@pytest.mark.parametrize("allow_self", [True, False])
def test_fixed_prob_same_synapses_from_numpy_and_jax_words(monkeypatch, allow_self):
    key = jr.key(11)
    host = nj.connect.fixed_prob(key, 900, 900, 0.05, allow_self=allow_self)
    monkeypatch.setattr(_sampling, "_HOST_WORDS", 0)  # every block through `_bits_kernel`
    compiled = nj.connect.fixed_prob(key, 900, 900, 0.05, allow_self=allow_self)
    np.testing.assert_array_equal(np.asarray(host.indices), np.asarray(compiled.indices))
    assert host.nse > 0.04 * 900 * 900


def test_other_key_implementations_still_build():
    conn = nj.connect.fixed_prob(jr.key(2, impl="rbg"), 400, 400, 0.1, allow_self=False)
    idx = np.asarray(conn.indices)
    assert (idx[:, 0] != idx[:, 1]).all()
    assert abs(idx.shape[0] - 0.1 * 400 * 399) < 5 * np.sqrt(0.1 * 0.9 * 400 * 399)


_FRESH_BUILD = """
import json, jax, numpy as np
from jax import monitoring
import neurojax as nj
names = []
monitoring.register_event_duration_secs_listener(
    lambda name, d, **kw: names.append(str(kw.get("fun_name", "")))
    if name == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)
key = jax.random.wrap_key_data(np.array([0, 5], np.uint32))
net, state = nj.models.coba(key)
print(json.dumps({"lowered": names, "synapses": int(net.n_synapses)}))
"""


def test_coba_build_in_a_fresh_process_lowers_only_its_initial_voltages():
    # Before the host-side sampler, a fresh build traced and lowered 8 programs (key splits,
    # one sampler per array shape, the initial voltages); each costs 30-100 ms.
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_BUILD], capture_output=True, text=True, check=True
    )
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["lowered"] == ["jit(_initial_v)"], info["lowered"]
    assert abs(info["synapses"] - 0.02 * 4000 * 4000) < 5 * np.sqrt(0.02 * 0.98 * 16e6)
