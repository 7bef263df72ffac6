"""Checkpoints (`save`/`load`) and export of recordings (`save_recording`, `spike_table`).

A run resumed from a checkpoint must equal the uninterrupted run bit for bit (a LIF
population, a network with a Poisson source, delays and STDP, an optax training loop); a
`like` that does not match, and damaged files, must be rejected with messages that name the
leaf or the problem, before anything is built; a failed save must leave the old file intact.
"""

import io
import json
import os
import zipfile

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
import pytest

import neurojax as nj
from neurojax import training as tr
from neurojax.io import load, save, save_recording, spike_table, spike_table_to_csv

F32 = jnp.float32
DT = 0.1


def assert_identical(a, b):
    """Same tree, same leaf types, and every array equal bit for bit (NaN payloads included)."""
    la, ta = jtu.tree_flatten(a)
    lb, tb = jtu.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y)
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                assert y.dtype == x.dtype
                x, y = jr.key_data(x), jr.key_data(y)
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        elif callable(x):
            assert x is y
        else:
            assert x == y


# ------------------------------------------------------------------------ resumed runs


def test_lif_run_resumed_from_checkpoint_is_bit_identical(tmp_path):
    n, n1, n2 = 20, 120, 80
    lif = nj.LIF(tau_m=10.0, t_ref=2.0)
    rng = np.random.default_rng(0)
    drive = jnp.asarray(rng.uniform(10.0, 30.0, (n1 + n2, n)), F32)  # time-varying input
    state0 = lif.init_state(n, key=jr.key(0))
    full_state, full = nj.simulate(lif, state0, drive, dt=DT, record=("v",))
    assert int(full.spikes.sum()) > 20

    mid, first = nj.simulate(lif, state0, drive[:n1], dt=DT, record=("v",))
    save(tmp_path / "lif.nj", {"model": lif, "state": mid, "step": n1})
    like = {"model": nj.LIF(tau_m=10.0, t_ref=2.0), "state": lif.init_state(n), "step": 0}
    ckpt = load(str(tmp_path / "lif.nj"), like)  # a str path works as well
    assert ckpt["step"] == n1
    assert_identical(ckpt["state"], mid)
    end, second = nj.simulate(
        ckpt["model"], ckpt["state"], drive[ckpt["step"] :], dt=DT, record=("v",)
    )

    spikes = np.concatenate([np.asarray(first.spikes), np.asarray(second.spikes)])
    np.testing.assert_array_equal(spikes, np.asarray(full.spikes))
    v = np.concatenate([np.asarray(first.v), np.asarray(second.v)])
    assert v.tobytes() == np.asarray(full.v).tobytes()
    assert_identical(end, full_state)


def plastic_network():
    """A Poisson source driving LIF neurons through a delayed, plastic projection."""
    n_src, n_exc = 30, 12
    stdp = nj.STDP(a_plus=0.02, a_minus=0.021, tau_plus=10.0, tau_minus=10.0, w_max=8.0)
    ff = nj.connect.fixed_prob(jr.key(1), n_src, n_exc, 0.4, weight=4.0)
    rec = nj.connect.fixed_prob(jr.key(2), n_exc, n_exc, 0.2, weight=1.0)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-55.0, t_ref=2.0)
    return nj.Network(
        populations={"src": (nj.PoissonSource(150.0), n_src), "E": (lif, n_exc)},
        projections=[
            nj.Projection("src", "E", ff, synapse=nj.Exponential(2.0), delay=0.5, plasticity=stdp),
            nj.Projection("E", "E", rec, synapse=nj.Exponential(3.0), delay=1.0),
        ],
        dt=DT,
    )


def test_network_with_poisson_delays_and_stdp_resumes_bit_identically(tmp_path):
    n_steps = 350
    net = plastic_network()
    state0 = net.init_state(jr.key(0))
    full_state, full = nj.simulate(net, state0, dt=DT, n_steps=n_steps)
    # Cut 3 steps after an E spike, while it travels through the 1 ms recurrent delay.
    e_steps = np.flatnonzero(np.asarray(full.spikes["E"]).any(axis=1))
    n1 = int(e_steps[e_steps > 150][0]) + 3
    n2 = n_steps - n1

    mid, first = nj.simulate(net, state0, dt=DT, n_steps=n1)
    # What the checkpoint must carry is really in use at the cut: a moved key, spikes in
    # flight in the ring buffers and the STDP delay line, weights changed by STDP.
    assert int(np.asarray(first.spikes["E"]).sum()) > 5
    assert not np.array_equal(
        jr.key_data(mid.populations["src"].key), jr.key_data(state0.populations["src"].key)
    )
    assert all(float(jnp.abs(b).sum()) > 0 for b in mid.buffers)
    assert float(mid.plastic[0].history.sum()) > 0
    assert not np.array_equal(
        np.asarray(mid.plastic[0].weights), np.asarray(state0.plastic[0].weights)
    )

    path = tmp_path / "net.nj"
    save(path, {"net": net, "state": mid})
    like = {"net": plastic_network(), "state": plastic_network().init_state(jr.key(7))}
    ckpt = load(path, like)
    assert_identical(ckpt["state"], mid)
    # An abstract state (no arrays allocated) is enough as `like`.
    abstract = eqx.filter_eval_shape(net.init_state, jr.key(7))
    assert_identical(load(path, {"net": net, "state": abstract})["state"], mid)
    end, second = nj.simulate(ckpt["net"], ckpt["state"], dt=DT, n_steps=n2)

    for name in ("src", "E"):
        spikes = np.concatenate([np.asarray(first.spikes[name]), np.asarray(second.spikes[name])])
        np.testing.assert_array_equal(spikes, np.asarray(full.spikes[name]))
    assert_identical(end, full_state)


def test_training_resumed_from_checkpoint_equals_uninterrupted_training(tmp_path):
    def loss_fn(layer, example, key):
        x, target = example
        rate = jnp.mean(layer(x, dt=1.0), axis=0)
        return jnp.mean((rate - target) ** 2)

    rng = np.random.default_rng(3)
    data = (
        jnp.asarray(rng.uniform(0.0, 2.0, (4, 25, 5)), F32),  # (batch, time, features)
        jnp.asarray(rng.uniform(0.0, 0.5, (4, 3)), F32),
    )
    opt = optax.adam(1e-2)
    step = tr.make_train_step(loss_fn, opt)

    def train(model, opt_state, steps):
        for i in steps:
            model, opt_state, _ = step(model, opt_state, data, jr.fold_in(jr.key(9), i))
        return model, opt_state

    model0 = tr.SpikingDense(5, 3, key=jr.key(0), weight_scale=3.0)
    opt0 = tr.init_opt_state(opt, model0)
    full_model, full_opt = train(model0, opt0, range(6))
    assert not np.array_equal(np.asarray(full_model.weight), np.asarray(model0.weight))

    model, opt_state = train(model0, opt0, range(3))
    save(tmp_path / "train.nj", {"model": model, "opt_state": opt_state, "step": 3})
    fresh = tr.SpikingDense(5, 3, key=jr.key(1), weight_scale=3.0)
    ckpt = load(
        tmp_path / "train.nj",
        {"model": fresh, "opt_state": tr.init_opt_state(opt, fresh), "step": 0},
    )
    assert int(ckpt["opt_state"][0].count) == 3 and ckpt["opt_state"][0].count.dtype == jnp.int32
    model, opt_state = train(ckpt["model"], ckpt["opt_state"], range(ckpt["step"], 6))
    assert_identical(model, full_model)
    assert_identical(opt_state, full_opt)


def test_round_trip_of_every_leaf_kind(tmp_path):
    lif = nj.LIF()
    tree = {
        "state": lif.init_state((2, 3), key=jr.key(4)),
        "key": jr.key(5),
        "keys": jr.split(jr.key(6, impl="rbg"), 3),
        "raw_key": jr.PRNGKey(7),
        "bf16": jnp.asarray([1.5, -2.0, 3.25], jnp.bfloat16),
        "nan": jnp.asarray([np.nan, np.inf, -0.0], F32),
        "weak": jnp.asarray(2.5),  # weakly typed, from a Python scalar
        "np": np.arange(6, dtype=np.int64).reshape(2, 3),
        "np_scalar": np.float32(0.25),
        "empty": jnp.zeros((0, 4), F32),
        "python": (True, 2**70, 0.1, 1 - 2.5j, "text"),
        "none": None,
        "nothing": (),
        "fn": jnp.tanh,
    }
    save(tmp_path / "all.nj", tree)
    like = jtu.tree_map(lambda x: x, tree)
    like["state"] = lif.init_state((2, 3))
    like["python"] = (False, 0, 0.0, 0j, "")
    out = load(tmp_path / "all.nj", like)
    assert_identical(out, tree)
    assert out["weak"].weak_type and not out["state"].v.weak_type
    assert str(jr.key_impl(out["keys"])) == "rbg"
    # Abstract leaves (from eval_shape) are enough for like.
    abstract_like = jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, like
    )
    abstract = load(tmp_path / "all.nj", abstract_like)
    np.testing.assert_array_equal(np.asarray(abstract["state"].v), np.asarray(tree["state"].v))
    assert_identical(jr.key_data(abstract["keys"]), jr.key_data(tree["keys"]))
    # The file is a NumPy-readable archive; the same tree gives the same bytes.
    assert "neurojax_checkpoint.json" in np.load(tmp_path / "all.nj").files
    save(tmp_path / "again.nj", tree)
    assert (tmp_path / "all.nj").read_bytes() == (tmp_path / "again.nj").read_bytes()


def test_save_rejects_traced_abstract_and_object_leaves(tmp_path):
    with pytest.raises(TypeError, match=r"save: leaf \['x'\] is a traced value"):
        jax.jit(lambda x: save(tmp_path / "a.nj", {"x": x}))(jnp.ones(2))
    with pytest.raises(TypeError, match=r"save: leaf \['x'\] is a jax.ShapeDtypeStruct"):
        save(tmp_path / "a.nj", {"x": jax.ShapeDtypeStruct((2,), F32)})
    with pytest.raises(TypeError, match=r"save: leaf \['x'\] is a NumPy array of dtype object"):
        save(tmp_path / "a.nj", {"x": np.array([None, 1])})
    with pytest.raises(
        TypeError, match=r"save: path must be a non-empty str or pathlib.Path, got 3"
    ):
        save(3, {})
    with pytest.raises(FileNotFoundError, match=r"save: the directory .*missing.* does not exist"):
        save(tmp_path / "missing" / "a.nj", {})
    assert sorted(os.listdir(tmp_path)) == []


# ------------------------------------------------------------------------ mismatched like


@pytest.fixture
def saved(tmp_path):
    lif = nj.LIF()
    tree = {
        "state": lif.init_state(3, key=jr.key(0)),
        "key": jr.key(1),
        "count": jnp.int32(5),
        "pair": (jnp.ones(2, F32), jnp.zeros(2, F32)),
        "history": None,
        "rate": 1.5,
    }
    path = tmp_path / "ckpt.nj"
    save(path, tree)
    return path, tree


def edit(tree, **changes):
    out = dict(tree)
    out.update(changes)
    return out


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda t: edit(t, state=nj.LIF().init_state(4)),
            r"at \['state'\]\.v: the checkpoint has shape \(3,\), like \(4,\)",
        ),
        (
            lambda t: edit(t, count=jnp.int16(5)),
            r"at \['count'\]: the checkpoint has dtype int32, like int16",
        ),
        (
            lambda t: edit(t, extra=jnp.ones(1, F32)),
            r"at \['extra'\]: like has a float32 array of shape \(1,\) here, which the checkpoint does not have .* the checkpoint has 7 leaves, like 8",
        ),
        (
            lambda t: {k: v for k, v in t.items() if k != "rate"},
            r"at \['rate'\]: the checkpoint has a Python float here, which like does not have",
        ),
        (
            lambda t: edit(t, key=jr.PRNGKey(1)),
            r"at \['key'\]: the checkpoint has a PRNG key array \(threefry2x32\) of shape \(\), like a uint32 array of shape \(2,\)",
        ),
        (
            lambda t: edit(t, key=jr.key(1, impl="rbg")),
            r"at \['key'\]: the checkpoint has a PRNG key of implementation 'threefry2x32', like one of 'rbg'",
        ),
        (
            lambda t: edit(t, pair=list(t["pair"])),
            r"at \['pair'\]: the checkpoint has a tuple, like a list",
        ),
        (
            lambda t: edit(t, history=jnp.zeros((2, 3), F32)),
            r"at \['history'\]: the checkpoint has None, like a float32 array of shape \(2, 3\)",
        ),
        (
            lambda t: edit(t, rate=2),
            r"at \['rate'\]: the checkpoint has a Python float, like a Python int",
        ),
        (
            lambda t: edit(t, state=nj.AdEx().init_state(3)),
            r"at \['state'\]: the checkpoint has a LIFState, like a AdExState",
        ),
    ],
)
def test_mismatched_like_is_rejected_naming_the_leaf(saved, change, match):
    path, tree = saved
    like = change(tree)
    before = jtu.tree_map(lambda x: x, like)
    with pytest.raises(
        ValueError, match=r"load: like does not match the checkpoint '.*ckpt\.nj' " + match
    ):
        load(path, like)
    assert_identical(like, before)


def _ring(key, p=0.2):
    """A small network whose connectivity (and so its arrays' shapes) is drawn from `key`."""
    conn = nj.connect.fixed_prob(jr.key(key), 20, 20, p, weight=1.0)
    net = nj.Network({"E": (nj.LIF(), 20)}, [nj.Projection("E", "E", conn)])
    return net, net.init_state(jr.key(0)), int(conn.nse)


def test_mismatch_says_whether_the_network_or_only_a_state_differs(saved, tmp_path):
    """The header's structure fingerprints say which modules differ: a network built with
    other arguments (its model, not only its state), or only a state (another size)."""
    net, state, nnz = _ring(1)
    other, other_state, other_nnz = _ring(2, p=0.3)
    assert nnz != other_nnz
    save(tmp_path / "run.nj", {"net": net, "state": state})
    with pytest.raises(
        ValueError,
        match=r"load: like does not match the checkpoint '.*run\.nj' at \['net'\]\S*: .*"
        r"\. The structure fingerprints stored in the checkpoint show "
        r"that the model itself differs, not only a state: \['net'\] \(a Network, model; "
        r"inside it \['net'\]\.projections\[0\]\S*\).*build it as the saved one was",
    ):
        load(tmp_path / "run.nj", {"net": other, "state": other_state})
    path, tree = saved
    with pytest.raises(
        ValueError,
        match=r"at \['state'\]\.v: the checkpoint has shape \(3,\), like \(4,\)\. The structure "
        r"fingerprints stored in the checkpoint show that a state differs: \['state'\] \(a "
        r"LIFState, state\)\. A state's shapes come from the model that made it",
    ):
        load(path, edit(tree, state=nj.LIF().init_state(4)))
    # A file written before the fingerprints (no "structure") gives the plain message.
    rewrite(
        path,
        header=lambda h: json.dumps({k: v for k, v in json.loads(h).items() if k != "structure"}),
    )
    with pytest.raises(ValueError) as err:
        load(path, edit(tree, state=nj.LIF().init_state(4)))
    assert str(err.value).endswith("the checkpoint has shape (3,), like (4,)")
    np.testing.assert_array_equal(load(path, tree)["state"].v, tree["state"].v)


def test_header_without_static_loads_with_a_warning_naming_what_came_from_like(tmp_path):
    net, state, _ = _ring(1)
    save(tmp_path / "run.nj", {"net": net, "state": state})
    rewrite(
        tmp_path / "run.nj",
        header=lambda h: json.dumps({k: v for k, v in json.loads(h).items() if k != "static"}),
    )
    with pytest.warns(
        UserWarning,
        match=r"load: checkpoint '.*run\.nj' has no 'static' section \(written by an older "
        r"neurojax, or edited\), so the static configuration of like is used unchecked: "
        r"\['net'\] \(sizes, dt, .*\)",
    ):
        back = load(tmp_path / "run.nj", {"net": net, "state": state})
    np.testing.assert_array_equal(back["state"].populations["E"].v, state.populations["E"].v)


def test_load_rejects_traced_like_and_bad_path(saved):
    path, tree = saved
    with pytest.raises(TypeError, match=r"load: leaf \['count'\] is a traced value"):
        jax.jit(lambda c: load(path, edit(tree, count=c)))(jnp.int32(0))
    with pytest.raises(
        TypeError, match=r"load: path must be a non-empty str or pathlib.Path, got b'x'"
    ):
        load(b"x", tree)


# ------------------------------------------------------------------------ damaged files


def rewrite(path, header=None, members=None):
    """Rebuild the archive with the given header text or members, keeping valid CRCs."""
    with zipfile.ZipFile(path) as zf:
        content = {name: zf.read(name) for name in zf.namelist()}
    if header is not None:
        content["neurojax_checkpoint.json"] = header(
            content["neurojax_checkpoint.json"].decode()
        ).encode()
    content.update(members or {})
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in content.items():
            zf.writestr(name, data)


def test_damaged_files_are_rejected_and_like_is_unaffected(saved, tmp_path):
    path, tree = saved
    like = edit(tree, state=nj.LIF().init_state(3), key=jr.key(99))
    before = jtu.tree_map(lambda x: x, like)
    good = path.read_bytes()
    where = r"load: cannot read checkpoint '.*\.nj': "

    cases = []
    truncated = tmp_path / "truncated.nj"
    truncated.write_bytes(good[: len(good) // 2])
    cases.append(
        (truncated, r"it is not a complete ZIP archive \(truncated, or not a checkpoint\)")
    )

    flipped = tmp_path / "flipped.nj"
    payload = np.asarray(tree["state"].v).tobytes()
    at = good.index(payload) + 5
    flipped.write_bytes(good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1 :])
    cases.append(
        (flipped, r"the array of leaf \['state'\]\.v \(leaves/\d+\.npy\) is damaged \(Bad CRC-32")
    )

    # A changed array in a well-formed archive (valid CRC): caught by the SHA-256.
    tampered = tmp_path / "tampered.nj"
    tampered.write_bytes(good)
    with zipfile.ZipFile(tampered) as zf:
        header = zf.read("neurojax_checkpoint.json").decode()
    member = next(s for s in json.loads(header)["leaves"] if s["path"] == "['count']")["member"]
    buf = io.BytesIO()
    np.save(buf, np.int32(6))
    rewrite(tampered, members={member: buf.getvalue()})
    cases.append(
        (tampered, r"the array of leaf \['count'\] .* does not match its SHA-256 checksum")
    )

    bad_header = tmp_path / "header.nj"
    bad_header.write_bytes(good)
    rewrite(bad_header, header=lambda h: h[:-10])
    cases.append((bad_header, r"its header is damaged"))

    newer = tmp_path / "newer.nj"
    newer.write_bytes(good)
    rewrite(newer, header=lambda h: h.replace('"format_version":2', '"format_version":3'))
    cases.append(
        (newer, r"it has format_version 3, written by a newer neurojax .* upgrade neurojax")
    )

    no_array = tmp_path / "no_array.nj"
    no_array.write_bytes(good)
    rewrite(no_array, header=lambda h: h.replace("leaves/00001.npy", "leaves/99999.npy"))
    cases.append(
        (no_array, r"its header is invalid: leaf .* its array is missing from the archive")
    )

    # A value kept in the header itself (a Python float here), edited to another valid value.
    edited = tmp_path / "edited.nj"
    edited.write_bytes(good)
    rewrite(edited, header=lambda h: h.replace((1.5).hex(), (2.5).hex()))
    cases.append((edited, r"the value of leaf \['rate'\] does not match its SHA-256 checksum"))

    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    cases.append((text, r"it is not a complete ZIP archive"))

    plain_npz = tmp_path / "plain.npz"
    np.savez(plain_npz, v=np.ones(3))
    cases.append(
        (plain_npz, r"it has no neurojax_checkpoint.json header \(not a neurojax checkpoint\)")
    )

    for bad, match in cases:
        with pytest.raises(ValueError, match=where.replace(r".*\.nj", ".*") + match):
            load(bad, like)
    with pytest.raises(
        FileNotFoundError, match=r"load: no checkpoint at '.*absent\.nj': the file does not exist"
    ):
        load(tmp_path / "absent.nj", like)
    assert_identical(like, before)
    assert_identical(load(path, like), tree)  # the intact file still loads


def test_version_1_files_without_digests_of_header_values_still_load(saved, tmp_path):
    # Version 1 kept Python scalars in the header without a SHA-256; such a file loads, and
    # a version-2 file whose scalar lost its SHA-256 is refused.
    path, tree = saved

    def strip(version):
        def edit_header(text):
            header = json.loads(text)
            header["format_version"] = version
            for spec in header["leaves"]:
                if spec["kind"] not in ("array", "key"):
                    spec.pop("sha256", None)
            return json.dumps(header)

        return edit_header

    old = tmp_path / "v1.nj"
    old.write_bytes(path.read_bytes())
    rewrite(old, header=strip(1))
    assert_identical(load(old, tree), tree)
    assert load(old, tree)["rate"] == 1.5
    stripped = tmp_path / "v2.nj"
    stripped.write_bytes(path.read_bytes())
    rewrite(stripped, header=strip(2))
    with pytest.raises(ValueError, match=r"its header is invalid: leaf \['rate'\] has no SHA-256"):
        load(stripped, tree)


# ------------------------------------------------------------------------ atomic writes


def test_interrupted_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.nj"
    save(path, {"w": jnp.zeros(3, F32)})
    save(path, {"w": jnp.ones(3, F32)})  # replacing a checkpoint works
    old = path.read_bytes()
    like = {"w": jnp.zeros(3, F32)}

    def crash(*args, **kwargs):
        raise OSError("simulated crash")

    with monkeypatch.context() as m:  # the crash comes just before the rename
        m.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="simulated crash"):
            save(path, {"w": jnp.full(3, 2.0, F32)})

    writes = []

    def crash_after_one(fp, array, **kwargs):  # the crash comes while arrays are written
        if writes:
            fp.write(b"partial")
            raise KeyboardInterrupt
        writes.append(array)
        return real(fp, array, **kwargs)

    real = np.lib.format.write_array
    with monkeypatch.context() as m:
        m.setattr(np.lib.format, "write_array", crash_after_one)
        with pytest.raises(KeyboardInterrupt):
            save(path, {"a": jnp.full(3, 2.0, F32), "w": jnp.full(3, 2.0, F32)})

    assert path.read_bytes() == old
    np.testing.assert_array_equal(np.asarray(load(path, like)["w"]), np.ones(3, np.float32))
    assert os.listdir(tmp_path) == ["ckpt.nj"]  # no temporary file left behind


# ------------------------------------------------------------------------ export


def test_save_recording_round_trip(tmp_path):
    net = plastic_network()
    _, rec = nj.simulate(
        net,
        net.init_state(jr.key(0)),
        dt=DT,
        n_steps=60,
        record=lambda s, out: {"v": s.populations["E"].v, "w": s.plastic[0].weights},
    )
    # The input population (a spike source) is left out unless asked, as by every writer.
    save_recording(tmp_path / "neurons.npz", rec)
    with np.load(tmp_path / "neurons.npz", allow_pickle=False) as data:
        assert sorted(data.files) == ["spikes/E", "t", "values/v", "values/w"]
    save_recording(tmp_path / "net.npz", rec, populations="all")
    with np.load(tmp_path / "net.npz", allow_pickle=False) as data:
        assert sorted(data.files) == ["spikes/E", "spikes/src", "t", "values/v", "values/w"]
        np.testing.assert_array_equal(data["t"], np.asarray(rec.t))
        for name in ("E", "src"):
            assert data[f"spikes/{name}"].dtype == np.bool_
            np.testing.assert_array_equal(data[f"spikes/{name}"], np.asarray(rec.spikes[name]))
        for name in ("v", "w"):
            np.testing.assert_array_equal(data[f"values/{name}"], np.asarray(rec.values[name]))

    lif = nj.LIF()
    _, rec = nj.simulate(
        lif, lif.init_state(4), 20.0, dt=DT, n_steps=40, record=("v",), record_every=4
    )
    save_recording(str(tmp_path / "lif.data"), rec, compress=False)
    with np.load(tmp_path / "lif.data", allow_pickle=False) as data:
        assert sorted(data.files) == ["spikes", "t", "values/v"]
        assert data["spikes"].dtype == np.uint8 and data["spikes"].shape == (10, 4)
        np.testing.assert_array_equal(data["values/v"], np.asarray(rec.v))
    with pytest.raises(
        TypeError,
        match=r"save_recording: recording must be a neurojax Recording \(from nj.simulate\), got dict",
    ):
        save_recording(tmp_path / "x.npz", {"t": rec.t})


def test_spike_table_of_a_small_raster():
    raster = np.zeros((3, 4), bool)
    raster[0, 2] = raster[2, 3] = raster[2, 0] = True
    assert_identical(
        spike_table(raster, dt=0.1),
        {"time_ms": np.array([0.1, 0.3, 0.3]), "neuron": np.array([2, 0, 3])},
    )
    assert_identical(
        spike_table(jnp.asarray(raster)),
        {"step": np.array([0, 2, 2]), "neuron": np.array([2, 0, 3])},
    )
    empty = spike_table(np.zeros((5, 2), np.uint8), dt=1.0)
    assert empty["time_ms"].shape == (0,) and empty["neuron"].dtype == np.int64


def test_spike_table_with_counts_and_a_batch_axis(tmp_path):
    # (time, trial, neuron) counts as recorded with record_every > 1: a window holding two
    # spikes of a neuron gives two rows.
    counts = np.zeros((3, 2, 3), np.uint8)
    counts[0, 1, 2] = 2
    counts[1, 0, 0] = 1
    counts[2, 0, 1] = 1
    counts[2, 1, 0] = 3
    t = jnp.asarray([0.5, 1.0, 1.5], F32)
    want = {
        "time_ms": np.array([0.5, 0.5, 1.0, 1.5, 1.5, 1.5, 1.5]),
        "trial": np.array([1, 1, 0, 0, 1, 1, 1]),
        "neuron": np.array([2, 2, 0, 1, 0, 0, 0]),
    }
    assert_identical(spike_table(counts, t=t), want)
    assert_identical(spike_table(counts.astype(np.float32), dt=0.5), want)
    spike_table_to_csv(tmp_path / "spikes.csv", spike_table(counts, t=t))
    assert (tmp_path / "spikes.csv").read_text() == (
        "time_ms,trial,neuron\n0.5,1,2\n0.5,1,2\n1.0,0,0\n1.5,0,1\n1.5,1,0\n1.5,1,0\n1.5,1,0\n"
    )
    two_batch = spike_table(counts[:, None], dt=0.5)
    assert list(two_batch) == ["time_ms", "trial_0", "trial_1", "neuron"]
    np.testing.assert_array_equal(two_batch["trial_0"], np.zeros(7, np.int64))


def test_spike_table_of_recorded_counts_matches_the_full_raster():
    lif = nj.LIF(t_ref=0.0)
    state = lif.init_state((2, 5), key=jr.key(3))
    drive = jnp.linspace(16.0, 400.0, 5, dtype=F32)
    _, fine = nj.simulate(lif, state, drive, dt=DT, n_steps=200)
    _, coarse = nj.simulate(lif, state, drive, dt=DT, n_steps=200, record_every=10)
    counts = np.asarray(coarse.spikes)
    assert counts.max() > 1
    table = spike_table(counts, t=coarse.t)
    full = spike_table(fine.spikes, dt=DT)
    # Every spike of the fine raster appears once, dated by the end of its 1 ms window.
    window_end = np.ceil(np.round(full["time_ms"], 9))
    order = np.lexsort((full["neuron"], full["trial"], window_end))
    np.testing.assert_array_equal(table["time_ms"], window_end[order])
    np.testing.assert_array_equal(table["trial"], full["trial"][order])
    np.testing.assert_array_equal(table["neuron"], full["neuron"][order])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: spike_table(np.ones(3, bool)),
            ValueError,
            r"spike_table: spikes must have shape \(t, n\) or \(t, \*batch, n\), got shape \(3,\)",
        ),
        (
            lambda: spike_table(np.array([[0, -1]])),
            ValueError,
            r"spikes must hold 0/1 or whole spike counts >= 0, got -1 at index \(0, 1\)",
        ),
        (
            lambda: spike_table(np.array([[0.5, 1.0]], np.float32)),
            ValueError,
            r"whole spike counts >= 0, got 0.5 at index \(0, 0\)",
        ),
        (
            lambda: spike_table(np.ones((2, 2), bool), dt=0.1, t=np.ones(2)),
            ValueError,
            r"give dt or t, not both",
        ),
        (
            lambda: spike_table(np.ones((2, 2), bool), t=np.ones(3)),
            ValueError,
            r"t must have shape \(2,\), one time per raster row, got shape \(3,\)",
        ),
        (
            lambda: spike_table(np.ones((2, 2), bool), dt=-1.0),
            ValueError,
            r"spike_table: dt must be finite and > 0 ms, got -1.0",
        ),
        (
            lambda: spike_table({"E": np.ones((2, 2), bool)}),
            TypeError,
            r"pass one population, e.g. rec.spikes\['E'\]",
        ),
        (
            lambda: spike_table_to_csv("x.csv", {"a": np.ones(2), "b": np.ones(3)}),
            ValueError,
            r"all columns must have the same length, got \{'a': 2, 'b': 3\}",
        ),
    ],
)
def test_export_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
