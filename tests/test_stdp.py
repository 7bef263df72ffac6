"""STDP against its closed-form window and a pair-by-pair reference (REFERENCE.md "STDP").

Spike times are imposed, as in NEST's STDP tests: a "forced" LIF (v_rest = v_reset = 0,
v_th = 1, no refractory period) spikes in exactly the steps where it receives a huge pulse,
and the plastic synapses act through a conductance reversing at 0 mV, which injects exactly
zero current into a neuron that sits at v = 0. Spike times then depend neither on the weights
nor on the STDP parameters, so every weight change can be predicted from the spike rasters.
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from helpers import ffi_output_shapes
from jax.experimental import sparse
from jax.flatten_util import ravel_pytree

import neurojax as nj
from neurojax.kernels import _build


def cpu_kernel_runs():
    """Whether the compiled CPU kernels run here (mode "auto" and the library built)."""
    return nj.kernels.mode() == "auto" and _build.library() is not None


DT = 0.1
PULSE = 1e4  # one step of this input takes a forced LIF from 0 far above threshold
MODES = ("additive", "multiplicative")
PAIRINGS = ("all_to_all", "nearest")
# Song, Miller and Abbott (2000) and REFERENCE.md's window (offset ms, change x 1e-3).
A_PLUS, A_MINUS, TAU = 0.005, 1.05 * 0.005, 20.0
WINDOW = [
    (1, 4.756),
    (10, 3.033),
    (20, 1.839),
    (40, 0.677),
    (-1, -4.994),
    (-10, -3.184),
    (-20, -1.931),
    (-40, -0.711),
]


def forced_lif(**kwargs):
    return nj.LIF(tau_m=10.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=0.0, **kwargs)


def plastic(pre, post, conn, rule, delay=0.0):
    return nj.Projection(
        pre,
        post,
        conn,
        synapse=nj.Delta(),
        output=nj.ConductanceOutput(0.0),
        delay=delay,
        plasticity=rule,
    )


def raster(n_steps, spike_steps):
    """Boolean (n_steps, n): neuron i spikes in the steps spike_steps[i]."""
    out = np.zeros((n_steps, len(spike_steps)), bool)
    for i, steps in enumerate(spike_steps):
        out[np.asarray(steps, int), i] = True
    return out


def pulses(spikes):
    """The drive that makes a forced population spike exactly as in `spikes`."""
    return PULSE * np.asarray(spikes, np.dtype(jnp.result_type(float)))


def plastic_weights(state, outputs):
    return tuple(p.weights for p in state.plastic)


def shift(spikes, d):
    """Arrivals at the synapses of spikes emitted `d` steps earlier."""
    out = np.zeros_like(spikes)
    out[d:] = spikes[: spikes.shape[0] - d]
    return out


def pairwise_reference(arrivals, post_spikes, pre, post, w0, rule, dt):
    """Weight of every synapse after every step, summed over spike pairs (no traces).

    `arrivals[k, i]`: a spike of presynaptic neuron i reaches its synapses in step k;
    `post_spikes[k, j]`: neuron j spikes in step k. Within a step a synapse is first depressed
    by an arrival, which pairs with the post spikes of earlier steps, then potentiated by a
    post spike, which pairs with the arrivals of this and earlier steps (so a pair in the same
    step potentiates); the weight is clipped to the bounds after each of the two.

    `pairing="nearest"` (trace reset to 1 at each spike): an arrival pairs only with the last
    earlier post spike and a post spike only with the last arrival up to its step, whether or
    not those partners already paired with something else (the symmetric nearest-spike scheme
    of Morrison, Diesmann and Gerstner 2008). Returns the trajectory (n_steps, nnz) and how
    many updates the clip changed.
    """
    a_plus, a_minus = float(rule.a_plus), float(rule.a_minus)
    tau_plus, tau_minus = float(rule.tau_plus), float(rule.tau_minus)
    w_min, w_max = float(rule.w_min), float(rule.w_max)
    additive, nearest = rule.mode == "additive", rule.pairing == "nearest"
    n_steps = arrivals.shape[0]
    out = np.empty((n_steps, len(pre)))
    clipped = 0

    def bounded(w):
        nonlocal clipped
        b = min(max(w, w_min), w_max)
        clipped += b != w
        return b

    for s, (i, j, w) in enumerate(zip(pre, post, np.asarray(w0, np.float64), strict=True)):
        a_steps = np.flatnonzero(arrivals[:, i])
        p_steps = np.flatnonzero(post_spikes[:, j])
        start = 0
        for k in np.union1d(a_steps, p_steps):
            out[start:k, s] = w
            if k in a_steps:
                partners = p_steps[p_steps < k][-1:] if nearest else p_steps[p_steps < k]
                y = np.exp(-(k - partners) * dt / tau_minus).sum()
                w = bounded(w - a_minus * (1.0 if additive else w - w_min) * y)
            if k in p_steps:
                partners = a_steps[a_steps <= k][-1:] if nearest else a_steps[a_steps <= k]
                x = np.exp(-(k - partners) * dt / tau_plus).sum()
                w = bounded(w + a_plus * (1.0 if additive else w_max - w) * x)
            out[k, s] = w
            start = k + 1
        out[start:, s] = w
    return out, clipped


# ---------------------------------------------------------------- the window of one pair


def pair_changes(dt, w0, w_min):
    """Weight change of pre n -> post n for every offset of WINDOW (and 0), in one run.

    Two projections carry the same pairs, one per pairing; for single pairs they must agree.
    """
    offsets = np.array([o for o, _ in WINDOW] + [0])
    n = len(offsets)
    conn = nj.connect.from_arrays(np.arange(n), np.arange(n), w0, n, n)
    rules = [
        nj.STDP(
            a_plus=A_PLUS,
            a_minus=A_MINUS,
            tau_plus=TAU,
            tau_minus=TAU,
            w_min=w_min,
            w_max=1.0,
            pairing=pairing,
        )
        for pairing in PAIRINGS
    ]
    lif = forced_lif()
    net = nj.Network(
        {"pre": (lif, n), "post": (lif, n)},
        [plastic("pre", "post", conn, rule) for rule in rules],
        dt=dt,
    )
    first = round(41 / dt)  # leaves room for the post spike 40 ms before the pre spike
    pre = np.full(n, first)
    post = first + np.rint(offsets / dt).astype(int)
    n_steps = 2 * first + 2
    drive = {
        "pre": pulses(raster(n_steps, [[k] for k in pre])),
        "post": pulses(raster(n_steps, [[k] for k in post])),
    }
    final, rec = nj.simulate(net, net.init_state(), drive, dt=dt)
    assert np.all(np.asarray(rec.spikes["pre"]).sum(0) == 1)
    assert np.all(np.asarray(rec.spikes["post"]).sum(0) == 1)
    dw = {
        pairing: np.asarray(ps.weights).astype(np.float64) - w0
        for pairing, ps in zip(PAIRINGS, final.plastic, strict=True)
    }
    return offsets, np.abs(post - pre), dw


def window(offsets, decay_plus, decay_minus, steps):
    return np.where(offsets >= 0, A_PLUS * decay_plus**steps, -A_MINUS * decay_minus**steps)


@pytest.mark.parametrize("dt", [0.1, 0.05, 0.25])
def test_single_pair_reproduces_window_in_float64(dt):
    with jax.enable_x64(True):
        offsets, steps, changes = pair_changes(dt, w0=0.5, w_min=0.0)
    exact = window(offsets, np.exp(-dt / TAU), np.exp(-dt / TAU), steps)
    printed = np.array([v for _, v in WINDOW])
    for pairing, dw in changes.items():
        # A trace decays by a rounded factor once per step: up to 1600 roundings of 1e-16.
        np.testing.assert_allclose(dw, exact, rtol=1e-10, atol=0, err_msg=pairing)
        assert dw[-1] == pytest.approx(A_PLUS, rel=1e-10)  # same step: potentiation
        np.testing.assert_allclose(dw[:-1] * 1e3, printed, rtol=0, atol=5e-4 + 1e-9)


@pytest.mark.parametrize("dt", [0.1, 0.05, 0.25])
def test_single_pair_reproduces_window_in_float32(dt):
    # The change is read as w_new - w_old: starting from w = 0 (additive, w_min = -1) the
    # weight *is* the change, so no digit of it is lost to rounding near w ~ 0.5.
    offsets, steps, changes = pair_changes(dt, w0=0.0, w_min=-1.0)
    # float32 stores exp(-dt/tau) with a relative error of up to 6e-8 (2e-8 here), and the
    # trace multiplies by it once per step: after n steps the window is off the exact one
    # by n times that (1.6e-5 at dt = 0.05 ms, 40 ms = 800 steps). Against the window of the
    # rounded factor the per-step multiplications and the update agree to 1e-6. (The printed
    # values are checked in float64 only: the exact -0.710517 lies 1.7e-5 past the rounding
    # boundary of -0.711, less than this float32 error.)
    # The factor the rule multiplies by is the device's float32 exp: the correctly rounded
    # one on CPU, possibly one ulp off it on a GPU (its expf is not correctly rounded).
    d32 = np.float64(np.asarray(nj.STDP(tau_plus=TAU, tau_minus=TAU).decays(dt)[0]))
    assert abs(d32 - np.exp(-dt / TAU)) <= 2 * 2.0**-24
    exact = window(offsets, np.exp(-dt / TAU), np.exp(-dt / TAU), steps)
    for pairing, dw in changes.items():
        rounded = window(offsets, d32, d32, steps)
        np.testing.assert_allclose(dw, rounded, rtol=1e-6, atol=0, err_msg=pairing)
        bound = 1e-6 + steps.max() * 2.0**-24
        np.testing.assert_allclose(dw, exact, rtol=bound, atol=0, err_msg=pairing)


# ---------------------------------------------------------------- trajectories vs reference

# Edge trains, in steps at the synapse (the presynaptic neurons emit `delay` earlier): arrival
# and post spike in the same step, one step apart either way, and bursts on both sides.
EDGE_ARRIVALS = [
    [100, 200, 300, 301, 302, 500],
    [100, 201, 299, 400, 600, 601],
    [150, 151, 152, 450, 700],
]
EDGE_POST = [
    [100, 201, 300, 302, 303, 520],
    [99, 200, 301, 450, 451, 602],
    [101, 152, 400, 599, 600, 700],
]
TRAJ_RULES = {
    "additive": dict(a_plus=0.08, a_minus=0.1),  # large enough to reach both bounds
    "multiplicative": dict(a_plus=0.3, a_minus=0.35),
}


# Four of the twelve cases cover every mode, pairing and delay; the rest are marked slow.
FAST_TRAJ = {
    ("additive", "all_to_all", 0.0),
    ("multiplicative", "nearest", 1.0),
    ("additive", "nearest", 2.5),
    ("multiplicative", "all_to_all", 2.5),
}


@pytest.mark.parametrize(
    "mode, pairing, delay",
    [
        pytest.param(*case, marks=() if case in FAST_TRAJ else pytest.mark.slow)
        for case in itertools.product(MODES, PAIRINGS, (0.0, 1.0, 2.5))
    ],
)
def test_weight_trajectory_matches_pairwise_reference(mode, pairing, delay):
    n_steps, n_src, n_edge = 1000, 6, len(EDGE_ARRIVALS)
    d = round(delay / DT)
    rng = np.random.default_rng(0)
    # Two post neurons with Poisson trains (100 Hz), then the edge-train neurons; the edge
    # post neuron 0 also spikes when presynaptic edge neuron 0 emits its arrival-500 spike.
    post_trains = [np.flatnonzero(rng.random(n_steps) < 100.0 * DT * 1e-3) for _ in range(2)]
    post_trains += [EDGE_POST[0] + [500 - d]] + EDGE_POST[1:]
    post_spikes = raster(n_steps, post_trains)
    edge_spikes = raster(n_steps, [np.asarray(a) - d for a in EDGE_ARRIVALS])
    w_src = rng.uniform(0.1, 0.9, size=(n_src, 5))
    mask = rng.random((n_src, 5)) < 0.5
    src_pre, src_post = np.nonzero(mask)
    edge_pre, edge_post = np.divmod(np.arange(n_edge * n_edge), n_edge)
    w_edge = rng.uniform(0.1, 0.9, size=n_edge * n_edge)

    with jax.enable_x64(True):
        rule = nj.STDP(**TRAJ_RULES[mode], w_min=0.0, w_max=1.0, mode=mode, pairing=pairing)
        conn_src = nj.connect.from_arrays(src_pre, src_post, w_src[mask], n_src, 5)
        conn_edge = nj.connect.from_arrays(edge_pre, edge_post + 2, w_edge, n_edge, 5)
        lif = forced_lif()
        net = nj.Network(
            {"src": (nj.PoissonSource(150.0), n_src), "edge": (lif, n_edge), "post": (lif, 5)},
            [
                plastic("src", "post", conn_src, rule, delay),
                plastic("edge", "post", conn_edge, rule, delay),
            ],
            dt=DT,
        )
        drive = {"edge": pulses(edge_spikes), "post": pulses(post_spikes)}
        _, rec = nj.simulate(net, net.init_state(jr.key(3)), drive, dt=DT, record=plastic_weights)
        sim = [np.asarray(w) for w in rec.values]
    spikes = {k: np.asarray(v) for k, v in rec.spikes.items()}
    np.testing.assert_array_equal(spikes["post"], post_spikes)
    np.testing.assert_array_equal(spikes["edge"], edge_spikes)
    assert spikes["src"].sum() > 50

    clipped = 0
    for p, name in enumerate(("src", "edge")):
        conn = net.projections[p].conn
        idx, w0 = np.asarray(conn.indices), np.asarray(conn.data)
        ref, c = pairwise_reference(
            shift(spikes[name], d), post_spikes, idx[:, 0], idx[:, 1], w0, rule, DT
        )
        clipped += c
        assert np.abs(ref[-1] - w0).max() > 0.05
        # float64 on both sides; traces and pair sums round differently by ~1e-16 per event.
        np.testing.assert_allclose(sim[p], ref, rtol=0, atol=1e-12)
    if mode == "additive":
        assert clipped > 0
    # The edge trains hold what they were written for: arrival and post spike in the same
    # step and one step apart either way.
    lags = {q - a for arr in EDGE_ARRIVALS for post in post_trains[2:] for a in arr for q in post}
    assert {-1, 0, 1} <= lags


# ---------------------------------------------------------------- bounds and sparsity


def recurrent_net(rule, *, key=0, n_in=20, n_exc=10):
    """Poisson inputs onto LIF neurons with plastic input and recurrent projections."""
    k = jr.split(jr.key(key), 2)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0, t_ref=1.0)
    w = nj.connect.uniform(float(rule.w_min), float(rule.w_max))
    conn_in = nj.connect.fixed_prob(k[0], n_in, n_exc, 0.5, weight=w)
    conn_rec = nj.connect.fixed_prob(k[1], n_exc, n_exc, 0.3, weight=w, allow_self=False)
    return nj.Network(
        {"in": (nj.PoissonSource(100.0), n_in), "E": (lif, n_exc)},
        [
            nj.Projection("in", "E", conn_in, synapse=nj.Exponential(5.0), plasticity=rule),
            nj.Projection("E", "E", conn_rec, synapse=nj.Exponential(5.0), plasticity=rule),
        ],
        inputs={"E": 14.0},
    ), (conn_in, conn_rec)


@pytest.mark.parametrize(
    "mode, pairing", [("additive", "all_to_all"), ("multiplicative", "nearest")]
)
def test_bounds_hold_and_sparsity_is_preserved(mode, pairing):
    rule = nj.STDP(a_plus=0.2, a_minus=0.25, w_min=0.5, w_max=2.0, mode=mode, pairing=pairing)
    net, conns = recurrent_net(rule)
    state = net.init_state(jr.key(1))
    final, rec = nj.simulate(net, state, dt=DT, n_steps=1000, record=plastic_weights)
    assert np.asarray(rec.spikes["E"]).sum() > 20
    lo, hi = np.float32(0.5), np.float32(2.0)
    for p, (proj, conn) in enumerate(zip(net.projections, conns, strict=True)):
        traj = np.asarray(rec.values[p])
        assert traj.shape == (1000, conn.nse)
        assert traj.min() >= lo and traj.max() <= hi
        if mode == "additive":  # the hard bounds were reached, not just respected
            assert (traj == lo).any() and (traj == hi).any()
        # Same synapses, same order: no weight appears where there is no synapse.
        w = final.plastic[p].weights
        assert w.shape == state.plastic[p].weights.shape == (proj.n_synapses,)
        np.testing.assert_array_equal(np.asarray(proj.conn.indices), np.asarray(conn.indices))
        dense = np.asarray(sparse.BCOO((w, proj.conn.indices), shape=conn.shape).todense())
        absent = np.asarray(conn.todense()) == 0
        assert absent.any() and np.all(dense[absent] == 0)
        np.testing.assert_array_equal(dense[~absent], np.asarray(w))
    assert jax.tree.structure(final) == jax.tree.structure(state)
    assert [x.shape for x in jax.tree.leaves(final)] == [x.shape for x in jax.tree.leaves(state)]


# ---------------------------------------------------------------- gradients


def central_differences(f, x, rel_step=1e-6):
    out = np.empty(x.size)
    for i in range(x.size):
        h = rel_step * max(1.0, abs(x[i]))
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        out[i] = (float(f(up)) - float(f(down))) / (2 * h)
    return out


@pytest.mark.parametrize(
    "mode, pairing", [("multiplicative", "all_to_all"), ("additive", "nearest")]
)
def test_gradients_match_finite_differences(mode, pairing):
    n_steps = 200
    pre_trains = [[20, 60, 130], [45, 100, 101]]
    post_trains = [[30, 70, 125, 150], [50, 52, 60, 140]]
    with jax.enable_x64(True):
        rule = nj.STDP(
            a_plus=0.03, a_minus=0.04, tau_plus=15.0, tau_minus=25.0, mode=mode, pairing=pairing
        )
        conn = nj.connect.from_arrays([0, 0, 1, 1], [0, 1, 0, 1], 0.5, 2, 2)
        # A triangular surrogate of width 0.5 has no slope at rest (x = -1) nor under a
        # small input (x <= -0.8) nor during a pulse (x ~ 98): spikes cannot move, so the
        # exact derivative with respect to the input current is 0, and so must autodiff's be.
        lif = forced_lif(surrogate=nj.surrogate.Triangular(width=0.5))
        net = nj.Network(
            {"pre": (lif, 2), "post": (lif, 2)},
            [plastic("pre", "post", conn, rule)],
            inputs={"pre": jnp.full(2, 0.2)},
            dt=DT,
        )
        state = net.init_state()
        drive = {
            "pre": pulses(raster(n_steps, pre_trains)),
            "post": pulses(raster(n_steps, post_trains)),
        }
        theta = {
            "a_plus": rule.a_plus,
            "a_minus": rule.a_minus,
            "tau_plus": rule.tau_plus,
            "tau_minus": rule.tau_minus,
            "w0": jnp.array([0.3, 0.5, 0.6, 0.4]),
            "current": net.inputs["pre"],
        }
        flat, unravel = ravel_pytree(theta)
        c = jnp.array([1.0, -2.0, 0.5, 1.5])

        def params_of(n):
            r = n.projections[0].plasticity
            return r.a_plus, r.a_minus, r.tau_plus, r.tau_minus

        @jax.jit
        def loss(v):
            t = unravel(v)
            n = eqx.tree_at(
                params_of,
                net,
                (t["a_plus"], t["a_minus"], t["tau_plus"], t["tau_minus"]),
            )
            n = eqx.tree_at(lambda n: n.inputs["pre"], n, t["current"])
            s = eqx.tree_at(lambda s: s.plastic[0].weights, state, t["w0"])
            final, _ = nj.simulate(n, s, drive, dt=DT)
            w = final.plastic[0].weights
            return jnp.sum(c * w) + jnp.sum(w**2)

        grad = np.asarray(jax.jit(jax.grad(loss))(flat))
        fd = central_differences(loss, np.asarray(flat))
    named = unravel(jnp.asarray(grad))
    for name in ("a_plus", "a_minus", "tau_plus", "tau_minus", "w0"):
        assert np.all(np.asarray(named[name]) != 0), name
    assert np.all(np.asarray(named["current"]) == 0)
    assert np.all(np.asarray(unravel(jnp.asarray(fd))["current"]) == 0)
    # Central differences in float64: truncation ~h^2 ~ 1e-12, rounding ~1e-16 / h ~ 1e-10.
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_gradients_finite_over_random_initialisations():
    rule = nj.STDP(a_plus=0.05, a_minus=0.06, w_min=0.0, w_max=3.0, mode="multiplicative")
    net, (conn_in, conn_rec) = recurrent_net(rule, key=5, n_in=10, n_exc=8)

    def params_of(n):
        rules = [p.plasticity for p in n.projections]
        return [r.a_plus for r in rules] + [r.tau_plus for r in rules] + [n.inputs["E"]]

    def loss(params, key):
        a_plus, tau_plus, current, w_in, w_rec = params
        n = eqx.tree_at(
            params_of,
            net,
            [a_plus, a_plus, tau_plus, tau_plus, current],
        )
        s = n.init_state(key)
        s = eqx.tree_at(lambda s: (s.plastic[0].weights, s.plastic[1].weights), s, (w_in, w_rec))
        final, rec = nj.simulate(n, s, dt=DT, n_steps=300, record=nj.Record(spikes="float"))
        value = jnp.mean(final.plastic[0].weights) + jnp.mean(final.plastic[1].weights)
        return value, rec.spikes["E"].sum()

    n_init = 20
    keys = jr.split(jr.key(7), 3)
    params = (
        jnp.full(n_init, 0.05),
        jnp.full(n_init, 20.0),
        jr.uniform(keys[0], (n_init, 8), minval=12.0, maxval=18.0),
        jr.uniform(keys[1], (n_init, conn_in.nse), minval=0.5, maxval=2.5),
        jr.uniform(keys[2], (n_init, conn_rec.nse), minval=0.5, maxval=2.5),
    )
    grads, n_spikes = jax.jit(jax.vmap(jax.grad(loss, has_aux=True)))(
        params, jr.split(jr.key(8), n_init)
    )
    assert np.all(np.asarray(n_spikes) > 0)
    for g in grads:
        g = np.asarray(g)
        assert np.all(np.isfinite(g))
        assert np.any(g != 0)


# ---------------------------------------------------------------- vmap and batch


def forced_pair_net(rule, n_pre=4, n_post=3, delay=0.0):
    conn = nj.connect.fixed_prob(jr.key(2), n_pre, n_post, 0.6, weight=0.5)
    lif = forced_lif()
    return nj.Network(
        {"pre": (lif, n_pre), "post": (lif, n_post)},
        [plastic("pre", "post", conn, rule, delay)],
        dt=DT,
    )


def poisson_drive(rng, n_steps, n, rate_hz, batch=()):
    return pulses(rng.random((n_steps, *batch, n)) < rate_hz * DT * 1e-3)


def test_vmap_over_a_plus_equals_loop_of_single_runs():
    net = forced_pair_net(nj.STDP(a_plus=0.01, a_minus=0.012))
    rng = np.random.default_rng(4)
    drive = {"pre": poisson_drive(rng, 800, 4, 80.0), "post": poisson_drive(rng, 800, 3, 80.0)}
    state = net.init_state()

    def final_weights(a_plus):
        n = eqx.tree_at(lambda n: n.projections[0].plasticity.a_plus, net, a_plus)
        final, _ = nj.simulate(n, state, drive, dt=DT)
        return final.plastic[0].weights

    sweep = jnp.linspace(0.0, 0.03, 5)
    swept = np.asarray(jax.jit(jax.vmap(final_weights))(sweep))
    looped = np.stack([np.asarray(final_weights(a)) for a in sweep])
    # The looped runs see a_plus as a constant that XLA may fold, the batch sees an array;
    # the fused arithmetic can round differently (FMA contraction on a GPU), by at most an
    # ulp per update over 800 steps: 800 * 2**-24 = 5e-5 relative.
    np.testing.assert_allclose(swept, looped, rtol=5e-5, atol=1e-7)
    assert np.all(np.abs(np.diff(swept, axis=0)).max(axis=1) > 1e-3)


def test_batch_of_trials_equals_separate_runs():
    net = forced_pair_net(nj.STDP(a_plus=0.02, a_minus=0.025, pairing="nearest"), delay=1.0)
    rng = np.random.default_rng(5)
    n_steps = 800
    drive = {
        "pre": poisson_drive(rng, n_steps, 4, 80.0, batch=(3,)),
        "post": poisson_drive(rng, n_steps, 3, 80.0, batch=(3,)),
    }
    batched, _ = nj.simulate(net, net.init_state(batch=3), drive, dt=DT)
    for trial in range(3):
        one = {k: v[:, trial] for k, v in drive.items()}
        single, _ = nj.simulate(net, net.init_state(), one, dt=DT)
        for field in ("weights", "x", "y", "history"):
            np.testing.assert_allclose(
                np.asarray(getattr(batched.plastic[0], field))[trial],
                np.asarray(getattr(single.plastic[0], field)),
                rtol=1e-6,
                atol=1e-7,
                err_msg=field,
            )
    w = np.asarray(batched.plastic[0].weights)
    assert np.abs(w[0] - w[1]).max() > 1e-3 and np.abs(w[1] - w[2]).max() > 1e-3


@pytest.mark.parametrize("inner", [False, True])
def test_vmap_over_drives_equals_separate_runs(inner):
    """vmap over the drive of a plastic network (shared rule), with and without a state
    batch inside: the compiled kernel runs the vmapped axis as more trials of one call."""
    net = forced_pair_net(nj.STDP(a_plus=0.02, a_minus=0.025), delay=1.0)
    rng = np.random.default_rng(8)
    n_steps, inner_batch = 600, ((2,) if inner else ())
    drives = {
        "pre": poisson_drive(rng, n_steps, 4, 80.0, batch=(3, *inner_batch)),
        "post": poisson_drive(rng, n_steps, 3, 80.0, batch=(3, *inner_batch)),
    }
    # the vmapped axis of the drive is axis 1 (axis 0 is time)
    state = net.init_state(batch=inner_batch)

    def final_weights(drive):
        return nj.simulate(net, state, drive, dt=DT)[0].plastic[0].weights

    swept = np.asarray(jax.jit(jax.vmap(final_weights, in_axes=(1,)))(drives))
    for trial in range(3):
        one = {k: v[:, trial] for k, v in drives.items()}
        np.testing.assert_array_equal(swept[trial], np.asarray(final_weights(one)))
    assert np.abs(swept[0] - swept[1]).max() > 1e-3
    if cpu_kernel_runs():  # one STDP call for all trials: weights (3, *inner, nnz)
        shapes = ffi_output_shapes(jax.vmap(final_weights, in_axes=(1,)), drives)
        nnz = net.projections[0].indices.shape[0]
        assert (3, *inner_batch, nnz) in shapes, shapes


# ---------------------------------------------------------------- statistics and recording


def test_weight_stats_match_numpy():
    rng = np.random.default_rng(6)
    w = rng.uniform(0.1, 0.9, size=500).astype(np.float32)

    def check(stats, ref, bins, range_=None):
        ref = np.asarray(ref, np.float64).reshape(-1)
        np.testing.assert_allclose(float(stats["mean"]), ref.mean(), rtol=1e-6)
        np.testing.assert_allclose(float(stats["std"]), ref.std(), rtol=1e-5)
        assert float(stats["min"]) == ref.min() and float(stats["max"]) == ref.max()
        counts, edges = np.histogram(ref, bins=bins, range=range_)
        np.testing.assert_array_equal(np.asarray(stats["counts"]), counts)
        np.testing.assert_allclose(np.asarray(stats["edges"]), edges, rtol=1e-6, atol=1e-7)
        assert int(np.asarray(stats["counts"]).sum()) == ref.size

    check(nj.plasticity.weight_stats(w, bins=7), w, 7)
    check(nj.plasticity.weight_stats(w, bins=10, range=(0.0, 1.0)), w, 10, (0.0, 1.0))
    conn = nj.connect.from_arrays(np.arange(500) // 25, np.arange(500) % 25, w, 20, 25)
    check(nj.plasticity.weight_stats(conn, bins=5), w, 5)
    rule = nj.STDP(w_min=0.0, w_max=1.0)
    proj = plastic("a", "b", conn, rule)
    check(nj.plasticity.weight_stats(proj, bins=5), w, 5)
    # A plastic state pools its batch of trials.
    net = nj.Network({"a": (forced_lif(), 20), "b": (forced_lif(), 25)}, [proj])
    state = net.init_state(batch=2)
    trials = np.stack([w, w[::-1] * 0.5])
    state = eqx.tree_at(lambda s: s.plastic[0].weights, state, jnp.asarray(trials))
    check(nj.plasticity.weight_stats(state.plastic[0], bins=8), trials, 8)
    jitted = jax.jit(lambda x: nj.plasticity.weight_stats(x, bins=8))(state.plastic[0])
    check(jitted, trials, 8)


@pytest.mark.parametrize("every", [5, 40])
def test_record_every_gives_every_nth_step(every):
    net = forced_pair_net(nj.STDP(a_plus=0.02, a_minus=0.025), delay=0.5)
    rng = np.random.default_rng(7)
    n_steps = 800
    drive = {
        "pre": poisson_drive(rng, n_steps, 4, 100.0),
        "post": poisson_drive(rng, n_steps, 3, 100.0),
    }
    state = net.init_state()
    final_1, rec_1 = nj.simulate(net, state, drive, dt=DT, record=plastic_weights)
    final_n, rec_n = nj.simulate(
        net, state, drive, dt=DT, record=plastic_weights, record_every=every
    )
    every_step, sampled = np.asarray(rec_1.values[0]), np.asarray(rec_n.values[0])
    assert len(np.unique(sampled, axis=0)) > 10  # the weights move between samples
    np.testing.assert_array_equal(sampled, every_step[every - 1 :: every])
    np.testing.assert_array_equal(
        np.asarray(final_n.plastic[0].weights), np.asarray(final_1.plastic[0].weights)
    )
    spikes = np.asarray(rec_1.spikes["post"]).reshape(-1, every, 3).sum(1)
    np.testing.assert_array_equal(np.asarray(rec_n.spikes["post"]), spikes)
    np.testing.assert_allclose(np.asarray(rec_n.t), np.arange(1, n_steps // every + 1) * every * DT)


# ---------------------------------------------------------------- spikes read at an offset


@pytest.mark.parametrize("use_kernel", [True, False])
def test_update_reads_spikes_at_offsets_of_wider_vectors(use_kernel):
    """`stdp_update` on spike vectors of a whole group (the projection's neurons at
    `arr_offset` / `post_offset`) equals the update on the projection's own vectors, values
    and gradients, on the compiled kernel and on the pure-JAX path."""
    if use_kernel and not cpu_kernel_runs():
        pytest.skip("the compiled CPU kernel could not be built here")
    with nj.kernels.use("auto" if use_kernel else "reference"):
        _offsets_case()


def _offsets_case():
    from neurojax.network._plastic import PlasticLayout, stdp_update

    n_pre, n_post, batch = 6, 5, (2,)
    conn = nj.connect.fixed_prob(jr.key(3), n_pre, n_post, 0.7, weight=0.5)
    rule = nj.STDP(a_plus=0.05, a_minus=0.04, w_max=1.0)
    proj = nj.Projection("a", "b", conn, synapse=nj.Exponential(5.0), plasticity=rule)
    lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
    sizes = (n_pre, n_post, proj.max_fan_out, proj.max_fan_in)
    rng = np.random.default_rng(11)
    w = jnp.asarray(rng.uniform(0.2, 0.8, batch + proj.weights.shape), jnp.float32)
    x = jnp.asarray(rng.uniform(0, 1, batch + (n_pre,)), jnp.float32)
    y = jnp.asarray(rng.uniform(0, 1, batch + (n_post,)), jnp.float32)
    s_arr = jnp.asarray(rng.random(batch + (n_pre,)) < 0.5, jnp.float32)
    s_post = jnp.asarray(rng.random(batch + (n_post,)) < 0.5, jnp.float32)
    # wider vectors: 3 other neurons before and 2 after the projection's own
    wide_arr = jnp.concatenate([jnp.ones(batch + (3,)), s_arr, jnp.ones(batch + (2,))], -1)
    wide_post = jnp.concatenate([jnp.ones(batch + (7,)), s_post, jnp.ones(batch + (1,))], -1)
    d = (jnp.float32(0.9), jnp.float32(0.8))

    narrow = stdp_update(rule, lay, sizes, w, x, y, s_arr, s_post, *d)
    wide = stdp_update(
        rule, lay, sizes, w, x, y, wide_arr, wide_post, *d, arr_offset=3, post_offset=7
    )
    for a, b in zip(narrow, wide, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(jnp.abs(narrow[0] - w).max()) > 1e-3  # some synapse changed

    def loss_narrow(sa, sp):
        return jnp.sum(stdp_update(rule, lay, sizes, w, x, y, sa, sp, *d)[0] ** 2)

    def loss_wide(sa, sp):
        out = stdp_update(rule, lay, sizes, w, x, y, sa, sp, *d, arr_offset=3, post_offset=7)
        return jnp.sum(out[0] ** 2)

    g_arr, g_post = jax.grad(loss_narrow, argnums=(0, 1))(s_arr, s_post)
    gw_arr, gw_post = jax.grad(loss_wide, argnums=(0, 1))(wide_arr, wide_post)
    np.testing.assert_allclose(gw_arr[..., 3:9], g_arr, rtol=1e-6)
    np.testing.assert_allclose(gw_post[..., 7:12], g_post, rtol=1e-6)
    assert float(jnp.abs(gw_arr[..., :3]).max()) == 0.0  # the other neurons get no gradient
    assert float(jnp.abs(gw_post[..., 12:]).max()) == 0.0
    assert float(jnp.abs(g_post).max()) > 0.0

    with pytest.raises(
        ValueError,
        match=r"stdp_update: post_offset=9 with 5 neurons does not fit in spike vectors of length 13",
    ):
        stdp_update(rule, lay, sizes, w, x, y, wide_arr, wide_post, *d, post_offset=9)
    with pytest.raises(ValueError, match=r"stdp_update: arr_offset=-1"):
        stdp_update(rule, lay, sizes, w, x, y, wide_arr, wide_post, *d, arr_offset=-1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "mode, pairing", [("additive", "all_to_all"), ("multiplicative", "nearest")]
)
def test_kernel_equals_pure_jax_over_vector_blocks_and_tails(dtype, mode, pairing):
    """The compiled kernel advances the traces and lists the spikes in blocks of two 32-byte
    vectors (16 float32 or 8 float64 neurons), then a scalar tail. With 37 presynaptic and 29
    postsynaptic neurons both parts run; 40 steps of random spikes in two trials give the
    same weights and traces as the pure-JAX event path, to rounding (XLA may fuse a multiply
    and an add where the kernel rounds twice)."""
    from neurojax.network._plastic import PlasticLayout, stdp_update

    if not cpu_kernel_runs():
        pytest.skip("the compiled CPU kernel could not be built here")
    n_pre, n_post, n_steps, batch = 37, 29, 40, (2,)
    rng = np.random.default_rng(5)
    arrivals = rng.random((n_steps, *batch, n_pre)) < 0.2
    fired = rng.random((n_steps, *batch, n_post)) < 0.2

    def run(use_kernel):
        rng_w = np.random.default_rng(6)
        mode_ = "auto" if use_kernel else "reference"
        with jax.enable_x64(dtype == "float64"), nj.kernels.use(mode_):
            conn = nj.connect.fixed_prob(jr.key(8), n_pre, n_post, 0.3, weight=0.5)
            rule = nj.STDP(
                a_plus=0.03, a_minus=0.035, w_min=0.0, w_max=1.0, mode=mode, pairing=pairing
            )
            proj = nj.Projection("a", "b", conn, synapse=nj.Exponential(5.0), plasticity=rule)
            lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
            sizes = (n_pre, n_post, proj.max_fan_out, proj.max_fan_in)
            w = jnp.asarray(rng_w.uniform(0.1, 0.9, batch + proj.weights.shape), dtype)
            x = jnp.zeros(batch + (n_pre,), dtype)
            y = jnp.zeros(batch + (n_post,), dtype)
            d = tuple(jnp.asarray(v, dtype) for v in (0.93, 0.9))
            step = jax.jit(lambda w, x, y, a, p: stdp_update(rule, lay, sizes, w, x, y, a, p, *d))
            for a, p in zip(arrivals, fired, strict=True):
                w, x, y = step(w, x, y, jnp.asarray(a, dtype), jnp.asarray(p, dtype))
            out = [np.asarray(v) for v in (w, x, y)]
        return out

    kernel, pure = run(True), run(False)
    tol = 1e-6 if dtype == "float32" else 1e-13
    for k_val, p_val in zip(kernel, pure, strict=True):
        assert k_val.dtype == np.dtype(dtype)
        np.testing.assert_allclose(k_val, p_val, rtol=tol, atol=tol)
    w0 = np.random.default_rng(6).uniform(0.1, 0.9, kernel[0].shape)
    assert np.abs(kernel[0] - w0).max() > 0.05  # the weights moved
    assert 0.0 < kernel[1].max() and 0.0 < kernel[2].max()
