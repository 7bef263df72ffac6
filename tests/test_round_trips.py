"""No host round trip per step: the compiled steps contain no `conditional` and only loops
whose trip count XLA knows (issue "Accelerators", point 1).

On a GPU, XLA runs a `conditional` or a `while` of unknown length by copying the predicate
to the host and waiting for the device. These tests compile each step (and a scan of
steps) for the CPU, which runs the same XLA passes up to code generation, and count those
instructions in the optimised HLO, on the pure-JAX path (what GPUs and TPUs run) and on the
default path. The census helper itself is checked on programs that do have them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import hlo_census

import neurojax as nj
from benchmarks.stdp_overhead import with_stdp

# Kernel calls trace every platform's implementation (tests/conftest.py).
pytestmark = pytest.mark.cross_platform

DT = 0.1


@pytest.fixture(params=["reference", "auto"])
def mode(request):
    with nj.kernels.use(request.param):
        yield request.param


def census_of(fn, *args) -> dict:
    return hlo_census(jax.jit(fn).lower(*args).compile().as_text())


def scan_census(net, state, n_steps=5, ext=None):
    def run(st):
        def body(s, _):
            s, out = net.step(s, ext, DT)
            return s, out

        return jax.lax.scan(body, st, None, length=n_steps)

    return census_of(run, state)


def assert_no_round_trip(census):
    assert census["conditional"] == 0, census
    assert census["unknown_trip_count"] == 0, census


def test_census_sees_conditionals_and_data_dependent_loops():
    def with_cond(x):
        return jax.lax.cond(x.sum() > 0, lambda y: y + 1, lambda y: y * 2, x)

    def with_while(x):
        return jax.lax.while_loop(lambda c: c[0].sum() < 100, lambda c: (c[0] * 2, c[1]), (x, 0))

    def with_scan(x):
        return jax.lax.scan(lambda c, _: (c * 2, None), x, None, length=7)[0]

    x = jnp.arange(1.0, 5.0)
    assert census_of(with_cond, x)["conditional"] == 1
    c = census_of(with_while, x)
    assert c["while"] == 1 and c["unknown_trip_count"] == 1
    c = census_of(with_scan, x)
    assert c["while"] <= 1 and c["unknown_trip_count"] == 0


def test_coba_step_has_no_round_trip(mode):
    net, state = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100)
    assert_no_round_trip(scan_census(net, state))


def test_batched_coba_step_has_no_round_trip(mode):
    net, state = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100, batch=(4,))
    assert_no_round_trip(scan_census(net, state))
    vstep = jax.vmap(lambda s: net.step(s, None, DT))
    _, single = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100)
    stacked = jax.tree.map(lambda x: jnp.stack([x] * 3), single)
    assert_no_round_trip(census_of(vstep, stacked))


@pytest.mark.parametrize("mode_", ["additive", "multiplicative"])
def test_coba_with_stdp_has_no_round_trip(mode, mode_):
    net, state = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100)
    rule = nj.STDP(a_plus=0.01, a_minus=0.0105, w_max=1.0, mode=mode_)
    net, state = with_stdp(net, state, rule)
    assert_no_round_trip(scan_census(net, state))


def test_delays_sources_and_gap_junctions_have_no_round_trip(mode):
    k = jax.random.split(jax.random.key(3), 3)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0)
    conn = nj.connect.fixed_prob(k[0], 50, 40, 0.2, weight=0.5)
    rec = nj.connect.fixed_prob(k[1], 40, 40, 0.1, weight=0.2)
    delay = np.random.default_rng(0).uniform(0.1, 2.0, conn.nse)
    gap = nj.GapJunction(nj.connect.from_arrays(np.array([0, 1]), np.array([1, 2]), 1.0, 40, 40))
    net = nj.Network(
        {"src": (nj.PoissonSource(200.0), 50), "A": (lif, 40)},
        [
            nj.Projection("src", "A", conn, synapse=nj.Exponential(5.0), delay=delay),
            nj.Projection("A", "A", rec, synapse=nj.Exponential(5.0), delay=1.0),
        ],
        gap_junctions={"A": gap},
        dt=DT,
    )
    assert_no_round_trip(scan_census(net, net.init_state(k[2])))


def test_training_step_has_no_round_trip(mode):
    layer = nj.training.SpikingDense(16, 8, key=jax.random.key(0), sparse_input=True)
    opt = optax.adam(1e-3)
    x = (jax.random.uniform(jax.random.key(1), (4, 20, 16)) < 0.2).astype(jnp.float32)
    y = jnp.arange(4) % 8

    def loss(model, example, key):
        xs, label = example
        return nj.training.spike_count_cross_entropy(model(xs, dt=1.0), label)

    step = nj.training.make_train_step(loss, opt)
    opt_state = nj.training.init_opt_state(opt, layer)
    lowered = step.jitted.lower(layer, opt_state, (x, y), jax.random.key(2))
    text = lowered.lowered.compile().as_text()
    assert_no_round_trip(hlo_census(text))
