"""The uniforms behind procedural draws and the ring slots a procedural delay needs.

References: exact float64 arithmetic for the 24-bit uniforms, SciPy's truncated normal
quantile (float64) for the longest delay a 24-bit uniform can reach, and the description's
own synapses (`stored()`) for the delays actually drawn.
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

import neurojax as nj
from neurojax.connectivity import _procedural as P

proc = nj.connect.procedural
DT = 0.1


def test_uniform_is_inside_the_open_interval_at_every_word():
    # Every 24-bit value (the low 8 bits of a word are dropped), float64 reference.
    k = np.arange(1 << 24, dtype=np.uint32)
    u = np.asarray(P._uniform(jnp.asarray(k << 8)), np.float64)
    exact = (k.astype(np.float64) + 0.5) / 2**24
    assert u.min() > 0.0 and u.max() < 1.0
    # Within one float32 spacing of the exact value (2^-24 below 1, finer below 1/2).
    assert np.max(np.abs(u - exact)) <= 2.0**-24
    # The top word lands on the largest float below 1 (exact: 1 - 2^-25), not on 1.
    assert u[-1] == 1.0 - 2.0**-24 and u[-2] == 1.0 - 2.0**-23
    # The dropped low bits do not matter.
    top = P._uniform(jnp.asarray([0xFFFFFFFF, 0xFFFFFF00], jnp.uint32))
    assert float(top[0]) == float(top[1]) == 1.0 - 2.0**-24


def test_top_word_gives_finite_weights_and_delays():
    u = P._uniform(jnp.asarray([0xFFFFFFFF, 0], jnp.uint32))
    for dist, mean, std in (
        (nj.connect.normal(-1.0, 0.1), -1.0, 0.1),
        (nj.connect.normal(0.5, 0.05, nonnegative=True), 0.5, 0.05),
    ):
        w = np.asarray(P._draw(dist, u), np.float64)
        assert np.all(np.isfinite(w)), (dist, w)
        # Within ~5.3 standard deviations (the reach of 24-bit uniforms), float32 tolerance.
        assert np.all(np.abs(w - mean) <= 5.5 * std), (dist, w)
    logn = np.asarray(P._draw(nj.connect.lognormal(0.0, 0.5), u))
    assert np.all(np.isfinite(logn)) and logn.max() < np.exp(5.5 * 0.5)
    d = float(P._truncated(nj.connect.normal(1.5, 0.75), u[:1], 0.05, 31.5)[0])
    assert 1.5 + 5.0 * 0.75 < d < 1.5 + 5.5 * 0.75


def _reference_steps(mean, std, low, high, dt):
    """Steps of the truncated normal's quantile at the largest uniform (float64)."""
    law = stats.truncnorm((low - mean) / std, (high - mean) / std, loc=mean, scale=std)
    return int(np.floor(law.ppf(1.0 - 2.0**-24) / dt + 0.5))


def test_ring_slots_follow_the_reachable_delay_not_the_range():
    # The microcircuit's excitatory delays: 1.5 +- 0.75 ms conditioned on [dt/2, 31.5 ms].
    key = jax.random.key(0)
    desc = proc.fixed_total(
        key, 300, 200, 40_000, weight=1.0, delay=nj.connect.normal(1.5, 0.75), dt=DT,
        delay_range=(0.05, 31.5),
    )  # fmt: skip
    ref = _reference_steps(1.5, 0.75, 0.05, 31.5, DT)  # 54
    assert ref <= desc.max_delay_steps <= ref + 2  # float32 quantile + one step of margin
    assert desc.max_delay == desc.max_delay_steps * DT
    # A range narrower than the reach keeps its own bound (every step up to it is drawn).
    tight = proc.fixed_total(
        key, 300, 200, 40_000, weight=1.0, delay=nj.connect.normal(1.5, 0.75), dt=DT,
        delay_range=(0.1, 3.0),
    )  # fmt: skip
    assert tight.max_delay_steps == 30
    # The network's ring has max_delay_steps + 1 slots for it.
    lif = nj.LIF()
    net = nj.Network({"A": (lif, 300), "B": (lif, 200)}, [nj.Projection("A", "B", desc)], dt=DT)
    assert [r.slots for r in net.memory().rings] == [desc.max_delay_steps + 1]


def test_drawn_delays_never_exceed_the_slots():
    # 2 million delays regenerated: none beyond max_delay_steps, the largest near the reach.
    desc = proc.fixed_total(
        jax.random.key(5), 2000, 1000, 2_000_000, weight=nj.connect.normal(-1.0, 0.1),
        delay=nj.connect.normal(0.75, 0.375), dt=DT, delay_range=(0.05, 15.75),
    )  # fmt: skip
    conn, delay = desc.stored()
    steps = np.rint(np.asarray(delay) / DT).astype(int)
    assert steps.min() >= 1
    assert steps.max() <= desc.max_delay_steps
    assert desc.max_delay_steps <= _reference_steps(0.75, 0.375, 0.05, 15.75, DT) + 2
    assert np.all(np.isfinite(np.asarray(conn.data)))


def test_row_words_are_those_of_jax_random():
    """The rows' random words, hashed in place, equal `jax.random.bits` of the key folded with
    each row id, for several keys, row ids up to 2^31 - 1 and row lengths, and under jit."""
    ids = jnp.asarray([0, 1, 2, 5, 77, 4096, 2**20 + 3, 2**31 - 1], jnp.int32)
    for seed in (0, 1, 12345, 2**31 + 7):
        data = jax.random.key_data(jax.random.key(seed))
        key = jax.random.wrap_key_data(data)
        for size in (1, 7, 64):
            expected = jax.vmap(
                lambda i, key=key, size=size: jax.random.bits(
                    jax.random.fold_in(key, i), (size,), jnp.uint32
                )
            )(ids)
            got = jax.jit(P._row_bits, static_argnums=2)(data, ids, size)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
