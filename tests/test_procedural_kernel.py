"""The C++ CPU kernel of `procedural_deliver` (neurojax/kernels/procedural.cc) against the XLA
walk it replaces: targets, slots and scalar or uniform draws identical, normal draws equal to
float32 rounding, delays rounding to the same step but for a handful of the 2^24 uniforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax.connectivity import _procedural as proc
from neurojax.kernels import _build
from neurojax.kernels import call as kernel_call
from neurojax.network._layout import _procedural as lay_mod

DT = 0.1


@pytest.fixture(autouse=True)
def _targets():
    if not _build.register_targets(((lay_mod._TARGET, "NjProceduralDeliver"),)):
        pytest.skip("the compiled kernels are unavailable")


def _group(descs, trials=2, seed=0, density=0.3):
    """Spikes, a ring and the static arguments of one group whose projections share the
    sending population and write side by side into the ring."""
    n_pre = descs[0].n_pre
    n_slots = max(d.max_delay_steps for d in descs) + 3
    n_targets = sum(d.n_post for d in descs)
    rng = np.random.default_rng(seed)
    on = rng.random((trials, n_pre)) < density
    s = jnp.asarray(on * rng.uniform(0.5, 2.0, (trials, n_pre)), jnp.float32)
    ring = jnp.asarray(rng.random((trials, n_slots, n_targets)), jnp.float32)
    specs, leaves, treedefs, off = [], [], [], 0
    for d in descs:
        lay = lay_mod.ProceduralLayout.from_procedural(d)
        own = d.delay is not None
        specs.append((n_pre, 0, n_pre, d.n_post, n_slots, -1 if own else 2, n_targets, off))
        leaves.append(lay._leaves())
        treedefs.append(lay._treedef())
        off += d.n_post
    static = dict(specs=tuple(specs), treedefs=tuple(treedefs))
    return s, ring, tuple(leaves), static


def _both(descs, fresh=False, **kw):
    s, ring, leaves, static = _group(descs, **kw)
    step = jnp.int32(7)
    got, need = lay_mod._cpu(s, step, ring, leaves, fresh=fresh, **static)
    want, _ = lay_mod._walk(s, step, ring, leaves, fresh=fresh, capacity=None, every=True, **static)
    assert np.all(np.asarray(need) == 0)
    return np.asarray(got), np.asarray(want)


def _key(i):
    return jax.random.key(i)


@pytest.mark.parametrize("fresh", [False, True])
def test_scalar_and_uniform_rows_are_identical(fresh):
    descs = [
        proc.fixed_prob(_key(1), 150, 120, 0.1, weight=0.7),
        proc.fixed_prob(_key(2), 150, 150, 0.05, weight=-1.3, allow_self=False),
        proc.fixed_total(_key(3), 150, 90, 4000, weight=0.25),
        proc.fixed_total(
            _key(4),
            150,
            80,
            3000,
            weight=nj.connect.uniform(0.2, 1.0),
            delay=nj.connect.uniform(0.1, 2.0),
            dt=DT,
        ),
        proc.fixed_prob(
            _key(5),
            150,
            150,
            0.08,
            weight=nj.connect.uniform(-0.5, 1.0, nonnegative=True),
            delay=nj.connect.uniform(0.0, 1.0),
            dt=DT,
            allow_self=False,
        ),
    ]
    assert all(lay_mod._native(d, None, jnp.zeros(1), jnp.zeros(1)) for d in descs)
    got, want = _both(descs, fresh=fresh, trials=3)
    np.testing.assert_array_equal(got, want)


def test_the_kernel_adds_what_a_numpy_loop_over_the_stored_rows_adds():
    desc = proc.fixed_total(
        _key(6), 60, 40, 900, weight=1.5, delay=nj.connect.uniform(0.1, 0.9), dt=DT
    )
    (s, ring, leaves, static) = _group([desc], trials=2, seed=3)
    step = 4
    got, _ = lay_mod._cpu(s, jnp.int32(step), ring, leaves, fresh=False, **static)
    pre, post, w, d = desc._stored_arrays()
    want = np.array(ring, np.float32)
    n_slots = ring.shape[-2]
    for b in range(s.shape[0]):
        for i, j, wk, dk in zip(pre, post, w, d, strict=True):
            v = np.float32(s[b, i])
            if v > 0:
                slot = (step + 1 + dk) % n_slots
                want[b, slot, j] = np.float32(want[b, slot, j] + v * np.float32(wk))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_normal_rows_match_to_float32_rounding_and_mixed_groups_keep_their_order():
    descs = [
        proc.fixed_prob(_key(7), 150, 100, 0.1, weight=nj.connect.normal(0.5, 0.2)),
        # lognormal weights stay on the XLA walk, between two kernel calls
        proc.fixed_prob(_key(8), 150, 100, 0.1, weight=nj.connect.lognormal(-1.0, 0.3)),
        proc.fixed_total(
            _key(9),
            150,
            100,
            5000,
            weight=nj.connect.normal(87.8, 8.78, nonnegative=True),
            delay=nj.connect.normal(1.5, 0.75),
            dt=DT,
            delay_range=(0.05, 31.5),
        ),
    ]
    assert [lay_mod._native(d, None, jnp.zeros(1), jnp.zeros(1)) for d in descs] == [
        True,
        False,
        True,
    ]
    got, want = _both(descs, trials=2)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-4)
    assert np.count_nonzero(got != want) < 0.05 * got.size


def test_draws_over_many_words():
    words = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, 1 << 16, np.uint32))
    _check_draws(words, delay_mismatch=0)


@pytest.mark.slow
def test_draws_over_every_24_bit_uniform():
    words = jnp.asarray(np.arange(1 << 24, dtype=np.uint32) << 8)
    _check_draws(words, delay_mismatch=20)


def _check_draws(words, delay_mismatch):
    cases = [
        (nj.connect.normal(0.5, 0.2), nj.connect.normal(1.5, 0.75), (0.05, 31.5)),
        (
            nj.connect.normal(87.8, 8.78, nonnegative=True),
            nj.connect.normal(0.75, 0.375),
            (0.05, 15.75),
        ),
        (nj.connect.normal(-351.0, 35.1), nj.connect.uniform(0.1, 2.0), None),
        (nj.connect.uniform(0.2, 1.3), nj.connect.uniform(0.0, 3.0), None),
    ]
    for weight, delay, rng in cases:
        desc = proc.fixed_total(
            _key(10), 4, 4, 8, weight=weight, delay=delay, dt=DT, delay_range=rng
        )

        @jax.jit
        def xla(c, words):
            u = proc._uniform(words)
            w = proc._draw(c.weight, u)
            d = proc._truncated(c.delay, u, c.delay_low, c.delay_high)
            return w, jnp.minimum(proc.delay_steps_f32(d, c.dt), c.max_delay_steps)

        w_x, d_x = (np.asarray(x) for x in xla(desc, words))
        w_c, d_c = (np.asarray(x) for x in lay_mod.native_draws(desc, words))
        scale = abs(float(weight.mean if hasattr(weight, "mean") else weight.high))
        spread = float(getattr(weight, "std", 0.0))
        np.testing.assert_allclose(w_c, w_x, rtol=0, atol=2e-6 * (scale + 6 * spread))
        if isinstance(weight, proc.Uniform):
            np.testing.assert_array_equal(w_c, w_x)
        assert np.count_nonzero(d_c != d_x) <= delay_mismatch
        assert np.all(np.abs(d_c - d_x) <= 1)


def _call(s, step, ring, leaves, static, fresh=False):
    return kernel_call(lay_mod.DELIVER, s, step, ring, leaves, fresh=fresh, capacity=None, **static)


def test_jit_vmap_and_batched_trials_through_the_registry():
    desc = proc.fixed_total(
        _key(11), 80, 60, 2000, weight=0.9, delay=nj.connect.uniform(0.1, 1.5), dt=DT
    )
    s, ring, leaves, static = _group([desc], trials=4, seed=5)
    step = jnp.int32(11)
    whole, need = jax.jit(lambda s, r: _call(s, step, r, leaves, static))(s, ring)
    assert np.all(np.asarray(need) == 0)
    for t in range(4):
        one, _ = _call(s[t], step, ring[t], leaves, static)
        np.testing.assert_array_equal(np.asarray(whole[t]), np.asarray(one))
    mapped, _ = jax.vmap(lambda a, b: _call(a, step, b, leaves, static))(s, ring)
    np.testing.assert_array_equal(np.asarray(mapped), np.asarray(whole))
    with nj.kernels.use("reference"):
        ref, _ = _call(s, step, ring, leaves, static)
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(ref))


def test_gradient_through_the_weight_distribution_matches_finite_differences():
    base = proc.fixed_prob(_key(12), 40, 30, 0.2, weight=nj.connect.normal(0.5, 0.2))

    def loss(mean, std):
        desc = _with_weight(base, nj.connect.normal(mean, std))
        s, ring, leaves, static = _group([desc], trials=1, seed=7)
        out, _ = _call(s, jnp.int32(2), ring, leaves, static)
        return jnp.sum(out * jnp.arange(out.size, dtype=out.dtype).reshape(out.shape) / out.size)

    g = jax.grad(loss, argnums=(0, 1))(0.5, 0.2)
    # the delivered sum is linear in mean and std: central differences of the kernel's own
    # forward pass (the C++ slot) are exact up to rounding
    h = 0.05
    fd_mean = (loss(0.5 + h, 0.2) - loss(0.5 - h, 0.2)) / (2 * h)
    fd_std = (loss(0.5, 0.2 + h) - loss(0.5, 0.2 - h)) / (2 * h)
    np.testing.assert_allclose(float(g[0]), float(fd_mean), rtol=2e-3)
    np.testing.assert_allclose(float(g[1]), float(fd_std), rtol=2e-3, atol=1e-3)
    assert abs(float(g[0])) > 1.0


def _with_weight(desc, weight):
    import equinox as eqx

    return eqx.tree_at(lambda d: d.weight, desc, weight)


def test_corrupted_descriptions_are_refused():
    desc = proc.fixed_prob(_key(13), 50, 40, 0.2, weight=1.0)
    import equinox as eqx

    bad = eqx.tree_at(lambda d: d.counts, desc, desc.counts.at[3].set(desc.max_fan_out + 5))
    s, ring, leaves, static = _group([bad], trials=1, density=1.0)
    with pytest.raises(Exception, match="count outside"):
        jax.block_until_ready(lay_mod._cpu(s, jnp.int32(0), ring, leaves, fresh=False, **static))
    # a projection that does not fit the ring
    s, ring, leaves, static = _group([desc], trials=1)
    spec = static["specs"][0]
    wide = dict(static, specs=((spec[0], 0, spec[2], spec[3], spec[4], 2, spec[3] - 1, 0),))
    with pytest.raises(Exception, match="outside their ranges"):
        jax.block_until_ready(
            lay_mod._cpu(s, jnp.int32(0), ring[..., :-1], leaves, fresh=False, **wide)
        )


def test_a_network_run_matches_its_stored_conversion():
    n = 150
    desc = proc.fixed_total(
        _key(14),
        n,
        n,
        2400,
        weight=nj.connect.normal(0.8, 0.08, nonnegative=True),
        delay=nj.connect.normal(1.5, 0.75),
        dt=DT,
        delay_range=(0.05, 31.5),
    )
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    conn, d = desc.stored()
    kw = dict(inputs={"E": 11.0}, dt=DT)
    syn = nj.Exponential(5.0)
    a = nj.Network({"E": (lif, n)}, [nj.Projection("E", "E", desc, synapse=syn)], **kw)
    b = nj.Network({"E": (lif, n)}, [nj.Projection("E", "E", conn, synapse=syn, delay=d)], **kw)
    # (the procedural ring has a slot per reachable delay, the stored one per drawn delay)
    sa, sb = a.init_state(jax.random.key(15)), b.init_state(jax.random.key(15))
    np.testing.assert_array_equal(
        np.asarray(sa.populations["E"].v), np.asarray(sb.populations["E"].v)
    )
    _, ra = nj.simulate(a, sa, dt=DT, n_steps=200, record=("v",), chunk_size=100)
    _, rb = nj.simulate(b, sb, dt=DT, n_steps=200, record=("v",), chunk_size=100)
    assert float(ra.spikes["E"].sum()) > 20
    np.testing.assert_array_equal(np.asarray(ra.spikes["E"]), np.asarray(rb.spikes["E"]))
    np.testing.assert_allclose(np.asarray(ra.v["E"]), np.asarray(rb.v["E"]), rtol=0, atol=1e-4)


def test_threaded_batches_keep_the_order_of_the_walk():
    # 45 spiking rows of about 3500 entries per trial: more than one batch of 2^17 entries,
    # each drawn on several threads, then added in row order
    descs = [
        proc.fixed_total(
            _key(16),
            150,
            3000,
            150 * 3500,
            weight=nj.connect.uniform(0.1, 0.3),
            delay=nj.connect.uniform(0.1, 1.0),
            dt=DT,
        ),
        proc.fixed_prob(_key(17), 150, 500, 0.5, weight=0.2),
    ]
    got, want = _both(descs, trials=2)
    np.testing.assert_array_equal(got, want)
