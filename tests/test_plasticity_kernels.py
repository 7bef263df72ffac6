"""The compiled trace-rule kernel `nj_trace_update` (`neurojax/kernels/plastic_trace.cc`) of
`nj.TripletSTDP` (both pairings) and `nj.VogelsSTDP`: against the pure-JAX event path (the
`plastic_update` registry entry's reference) and an independent NumPy loop over events, in
float32 and float64, with a trials axis, under `jit`, `vmap` and `grad`; in a network against
the reference mode; corrupted index arrays give an error, never a crash."""

import functools
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _build
from neurojax.network._plastic import PlasticLayout, check_rule, plastic_update
from neurojax.plasticity import TraceKernel

DT = 0.1
N_PRE, N_POST = 37, 29  # both a whole block of vector lanes and a scalar tail in the scans
RULES = {
    "triplet-all_to_all": lambda: nj.TripletSTDP(
        a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01, w_min=0.0, w_max=1.0
    ),
    "triplet-nearest": lambda: nj.TripletSTDP(
        a2_plus=0.02, a3_plus=0.03, a2_minus=0.025, a3_minus=0.01, pairing="nearest"
    ),
    "vogels": lambda: nj.VogelsSTDP(eta=0.01, tau=20.0, rho0=5.0, w_min=0.0, w_max=1.0),
}


def kernel_runs() -> bool:
    return nj.kernels.mode() == "auto" and _build.library() is not None


@functools.cache
def layout(key=3, p=0.3):
    """A random 37 -> 29 CSR (built once, on the host, outside any trace)."""
    conn = nj.connect.fixed_prob(jr.key(key), N_PRE, N_POST, p, weight=0.5)
    proj = nj.Projection("a", "b", conn, synapse=nj.Exponential(5.0), plasticity=nj.STDP())
    lay = PlasticLayout(proj.indptr, proj.indices, proj.col_ptr, proj.col_syn, proj.col_pre)
    return lay, (N_PRE, N_POST, proj.max_fan_out, proj.max_fan_in)


def spikes(n_steps, batch, seed=5, p=0.2):
    """Arrivals and postsynaptic spikes inside wider group vectors: the projection's neurons
    at offsets 3 and 7."""
    rng = np.random.default_rng(seed)
    arr = np.zeros((n_steps, *batch, N_PRE + 5))
    post = np.zeros((n_steps, *batch, N_POST + 9))
    arr[..., 3 : 3 + N_PRE] = rng.random((n_steps, *batch, N_PRE)) < p
    post[..., 7 : 7 + N_POST] = rng.random((n_steps, *batch, N_POST)) < p
    return arr, post


def initial(rule, batch, dtype, seed=6):
    rng = np.random.default_rng(seed)
    lay, _ = layout()
    nnz = lay.indices.shape[0]
    w = jnp.asarray(rng.uniform(0.2, 0.8, (*batch, nnz)), dtype)
    pre = tuple(
        jnp.asarray(rng.uniform(0, 1, (*batch, N_PRE)), dtype) for _ in range(rule.n_pre_traces)
    )
    post = tuple(
        jnp.asarray(rng.uniform(0, 1, (*batch, N_POST)), dtype) for _ in range(rule.n_post_traces)
    )
    return w, pre, post


def run_steps(rule, w, pre, post, arr, post_s, dtype):
    """`len(arr)` steps of `plastic_update` in one jitted scan."""
    lay, sizes = layout()
    decays = tuple(tuple(jnp.asarray(d).astype(dtype) for d in dd) for dd in rule.trace_decays(DT))

    def step(carry, s):
        w, pre, post = carry
        w, pre, post, _ = plastic_update(
            rule, lay, sizes, w, pre, post, s[0], s[1], *decays, arr_offset=3, post_offset=7
        )
        return (w, pre, post), None

    @jax.jit
    def go(w, pre, post, arr, post_s):
        return jax.lax.scan(step, (w, pre, post), (arr, post_s))[0]

    return go(w, pre, post, jnp.asarray(arr, dtype), jnp.asarray(post_s, dtype))


def uses_trace_kernel(fn, *args) -> bool:
    return "nj_trace_update" in str(jax.make_jaxpr(fn)(*args))


def numpy_steps(rule, w, pre, post, arr, post_s, lay):
    """Independent reference in float64: a Python loop over events, synapse by synapse, in
    the documented order (decay; arrivals with the old presynaptic traces; presynaptic
    traces take the arrivals; postsynaptic spikes with the new presynaptic traces;
    postsynaptic traces take the spikes). One trial."""
    indptr, post_of = np.asarray(lay.indptr), np.asarray(lay.indices)
    pre_of = np.repeat(np.arange(N_PRE), np.diff(indptr))
    w = np.array(w, np.float64)
    pre = [np.array(t, np.float64) for t in pre]
    post = [np.array(t, np.float64) for t in post]
    (dp, dq) = (
        [float(d) for d in dd] for dd in rule.trace_decays(DT)
    )  # the rule's float32 factors, as the network passes them
    lo, hi = float(rule.w_min), float(rule.w_max)
    triplet = isinstance(rule, nj.TripletSTDP)
    nearest = getattr(rule, "pairing", "all_to_all") == "nearest"

    def take(t, s):
        return np.where(s > 0, 1.0, t) if nearest else t + s

    for a, p in zip(arr, post_s, strict=True):
        a, p = a[3 : 3 + N_PRE], p[7 : 7 + N_POST]
        pre = [t * d for t, d in zip(pre, dp, strict=True)]
        post = [t * d for t, d in zip(post, dq, strict=True)]
        for k in range(w.size):
            i, j = pre_of[k], post_of[k]
            if a[i]:
                if triplet:
                    dw = -post[0][j] * (float(rule.a2_minus) + float(rule.a3_minus) * pre[1][i])
                else:
                    dw = float(rule.eta) * (post[0][j] - float(rule.alpha))
                w[k] = min(max(w[k] + dw * a[i], lo), hi)
        pre = [take(t, a) for t in pre]
        for k in range(w.size):
            i, j = pre_of[k], post_of[k]
            if p[j]:
                if triplet:
                    dw = pre[0][i] * (float(rule.a2_plus) + float(rule.a3_plus) * post[1][j])
                else:
                    dw = float(rule.eta) * pre[0][i]
                w[k] = min(max(w[k] + dw * p[j], lo), hi)
        post = [take(t, p) for t in post]
    return w, pre, post


# ---------------------------------------------------------------- kernel against references


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("name", sorted(RULES))
def test_kernel_equals_event_path_and_numpy_loop(name, batch, dtype):
    """30 steps of random spikes (20 % per step) on a random CSR: the kernel's weights and
    traces equal the pure-JAX event path's to rounding (XLA may fuse a trace's decay and
    increment, or a product and a sum, into one multiply-add where the kernel rounds twice:
    a few ulps, ~1e-6 relative in float32, ~1e-15 in float64) and the NumPy loop's."""
    if not kernel_runs():
        pytest.skip("the compiled CPU kernels are off (reference mode) or could not be built")
    f32 = dtype == "float32"
    with jax.enable_x64(not f32):
        rule = RULES[name]()
        assert rule.trace_kernel() is not None
        w, pre, post = initial(rule, batch, dtype)
        arr, post_s = spikes(30, batch)
        assert uses_trace_kernel(
            lambda *a: run_steps(rule, *a, dtype), w, pre, post, arr[:2], post_s[:2]
        )
        got = run_steps(rule, w, pre, post, arr, post_s, dtype)
        with nj.kernels.use("reference"):
            want = run_steps(rule, w, pre, post, arr, post_s, dtype)
        trial = (0,) * len(batch)
        ref = numpy_steps(
            rule,
            np.asarray(w)[trial],
            [np.asarray(t)[trial] for t in pre],
            [np.asarray(t)[trial] for t in post],
            arr[(slice(None), *trial)],
            post_s[(slice(None), *trial)],
            layout()[0],
        )
    tol = dict(rtol=2e-6, atol=2e-6) if f32 else dict(rtol=1e-12, atol=1e-12)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == np.dtype(dtype) and g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), **tol)
    assert np.abs(np.asarray(got[0]) - np.asarray(w)).max() > 0.02  # the weights moved
    # the loop computes in float64 from the same float32 inputs
    loop_tol = dict(rtol=2e-5, atol=2e-5) if f32 else dict(rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(got[0])[trial], ref[0], **loop_tol)
    for g, r in zip(got[1] + got[2], ref[1] + ref[2], strict=True):
        np.testing.assert_allclose(np.asarray(g)[trial], r, **loop_tol)


@pytest.mark.parametrize("name", sorted(RULES))
def test_vmap_over_trials_and_parameters_equals_single_runs(name):
    """vmap over trials (folded into one kernel call) and over a rule parameter (one call per
    value) equal the single runs; the batched kernel equals its own single runs exactly."""
    if not kernel_runs():
        pytest.skip("the compiled CPU kernels are off (reference mode) or could not be built")
    f32 = "float32"
    rule = RULES[name]()
    w, pre, post = initial(rule, (3,), f32)
    arr, post_s = spikes(12, (3,))
    arr_t, post_t = np.moveaxis(arr, 1, 0), np.moveaxis(post_s, 1, 0)
    batched = jax.vmap(lambda *a: run_steps(rule, *a, f32))(w, pre, post, arr_t, post_t)
    singles = [
        run_steps(rule, w[b], tuple(t[b] for t in pre), tuple(t[b] for t in post), arr_t[b],
                  post_t[b], f32)
        for b in range(3)
    ]  # fmt: skip
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *singles)
    for g, r in zip(jax.tree.leaves(batched), jax.tree.leaves(stacked), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))

    field = "a3_plus" if isinstance(rule, nj.TripletSTDP) else "rho0"
    values = jnp.asarray([0.5, 1.0, 2.0]) * getattr(rule, field)
    rules = jax.vmap(lambda v: eqx.tree_at(lambda r: getattr(r, field), rule, v))(values)
    over = eqx.filter_vmap(lambda r: run_steps(r, w[0], tuple(t[0] for t in pre),
                                               tuple(t[0] for t in post), arr_t[0],
                                               post_t[0], f32))(rules)  # fmt: skip
    for k, v in enumerate(values):
        one = run_steps(
            eqx.tree_at(lambda r: getattr(r, field), rule, v), w[0], tuple(t[0] for t in pre),
            tuple(t[0] for t in post), arr_t[0], post_t[0], f32,
        )  # fmt: skip
        for g, r in zip(jax.tree.leaves(over), jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(np.asarray(g[k]), np.asarray(r), rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(over[0][0]) - np.asarray(over[0][2])).max() > 1e-4


@pytest.mark.parametrize("name", sorted(RULES))
def test_gradient_through_the_kernel_is_the_dense_definitions(name):
    """The derivative with respect to the rule's parameters, the weights and the traces is
    that of the dense reference (the registry's `differentiable`), kernel or not."""
    with jax.enable_x64(True):
        rule = RULES[name]()
        w, pre, post = initial(rule, (2,), "float64")
        arr, post_s = spikes(6, (2,), p=0.3)
        cw = jnp.asarray(np.random.default_rng(2).normal(size=w.shape))

        def loss(rule, w, pre):
            out = run_steps(rule, w, pre, post, arr, post_s, "float64")
            return jnp.sum(cw * out[0]) + sum(jnp.sum(t**2) for t in out[1] + out[2])

        grad = eqx.filter_grad(lambda args: loss(*args))
        got = grad((rule, w, pre))
        with nj.kernels.use("reference"):
            want = grad((rule, w, pre))
    leaves = jax.tree.leaves(got)
    for g, r in zip(leaves, jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-10, atol=1e-12)
    assert np.abs(np.asarray(got[1])).max() > 0.1


# ---------------------------------------------------------------- in a network


def net_with(rule, delay=0.3, n=40, dtype_seed=1):
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)
    key_e, key_i = jr.split(jr.key(dtype_seed))
    projs = [
        nj.Projection(
            "E", "E", nj.connect.fixed_prob(key_e, n, n, 0.2, weight=0.5),
            synapse=nj.Exponential(5.0), delay=delay, plasticity=rule,
        ),
        nj.Projection("I", "E", nj.connect.fixed_prob(key_i, n // 4, n, 0.3, weight=0.5),
                      synapse=nj.Exponential(10.0), plasticity=RULES["vogels"]()),
    ]  # fmt: skip
    return nj.Network(
        {"E": (lif, n), "I": (lif, n // 4)}, projs, inputs={"E": 17.0, "I": 16.0}, dt=DT
    )


@pytest.mark.parametrize("name", ["triplet-all_to_all", "triplet-nearest"])
def test_network_on_the_kernel_equals_the_reference_mode(name):
    """A network with a triplet E->E projection (0.3 ms delay) and a Vogels I->E projection:
    2000 steps on the kernels give the reference mode's spikes and, to rounding, weights."""
    with jax.enable_x64(True):
        net = net_with(RULES[name]())
        state = net.init_state(jr.key(4))

        def run():
            final, rec = nj.simulate(net, state, dt=DT, n_steps=2000)
            return [p.weights for p in final.plastic], rec.spikes

        if kernel_runs():
            assert uses_trace_kernel(lambda: nj.simulate(net, state, dt=DT, n_steps=3)[0])
        w_k, s_k = run()
        with nj.kernels.use("reference"):
            w_r, s_r = run()
    assert int(s_k["E"].sum()) > 100 and int(s_k["I"].sum()) > 20
    for k in s_k:
        np.testing.assert_array_equal(np.asarray(s_k[k]), np.asarray(s_r[k]))
    for g, r, proj in zip(w_k, w_r, net.projections, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-12, atol=1e-12)
        assert np.abs(np.asarray(g) - np.asarray(proj.weights)).max() > 1e-3


def _steps_by_hand(net, n_steps, *, checks=True):
    """`n_steps` of `net.step` in a jitted scan (no `nj.simulate`); `checks=False` switches
    the library's model checks off (`checked_run`), so that the kernel meets what it gets."""
    from neurojax.network._checks import checked_run

    def run(m, s):
        return jax.lax.scan(lambda st, _: (m.step(st, None, 0.1)[0], None), s, None, n_steps)[0]

    if checks:
        return jax.jit(run)(net, net.init_state())
    with checked_run():
        return jax.jit(run)(net, net.init_state())


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("field", ["col_syn", "col_pre", "col_ptr", "indices", "indptr"])
def test_corrupted_indices_give_an_error_not_a_crash(name, field):
    if not kernel_runs():
        pytest.skip("the compiled CPU kernels are off (reference mode) or could not be built")
    n = 20
    conn = nj.connect.fixed_prob(jr.key(1), n, n, 0.3, weight=0.5)
    proj = nj.Projection("A", "A", conn, delay=1.0, plasticity=RULES[name]())
    net = nj.Network({"A": (nj.LIF(), n)}, [proj], inputs={"A": 20.0}, dt=0.1)
    bad = eqx.tree_at(
        lambda m: getattr(m.projections[0].layout, field),
        net,
        getattr(net.projections[0].layout, field).at[1].set(10**6),
    )
    assert uses_trace_kernel(lambda: nj.simulate(net, net.init_state(), dt=0.1, n_steps=2)[0])
    # nj.simulate refuses the edited layout at its start, a loop of steps of one's own at the
    # step (traced: when it runs), and the kernel's own check, with those checks off, reports
    # it too rather than crashing
    with pytest.raises(ValueError, match="simulate: EventLayout"):
        nj.simulate(bad, bad.init_state(), dt=0.1, n_steps=200)
    # (the step's check and the kernel's run in one compiled program: whichever XLA
    # schedules first refuses)
    with pytest.raises(Exception, match="Network.step: EventLayout|corrupted connectivity"):
        jax.block_until_ready(_steps_by_hand(bad, 200))
    with pytest.raises(Exception, match="corrupted connectivity"):
        jax.block_until_ready(_steps_by_hand(bad, 200, checks=False))


# ---------------------------------------------------------------- which rules claim the kernel


def test_only_rules_the_kernel_implements_claim_it():
    """A subclass that redefines an event loses the kernel (the generic event path runs its
    own `on_post`); a rule whose `trace_kernel()` does not fit its traces is refused by the
    projection."""
    assert nj.STDP().trace_kernel() is None and nj.RewardSTDP().trace_kernel() is None
    tk = nj.TripletSTDP.preset("hippocampal_nearest").trace_kernel()
    assert tk.kind == "triplet" and tk.nearest and float(tk.a_pre) == pytest.approx(3e-3)
    assert float(nj.VogelsSTDP(rho0=5.0, tau=20.0).trace_kernel().b_pre) == pytest.approx(0.2)

    class Louder(nj.VogelsSTDP):
        def on_post(self, w, pre, post, s):
            return self.clip(w + 2.0 * self.eta * pre[0] * s)

    assert Louder().trace_kernel() is None
    conn = nj.connect.fixed_prob(jr.key(1), 20, 20, 0.3, weight=0.5)

    def final_weights(rule):
        proj = nj.Projection("A", "A", conn, plasticity=rule)
        net = nj.Network({"A": (nj.LIF(), 20)}, [proj], inputs={"A": 20.0}, dt=0.1)
        return nj.simulate(net, net.init_state(), dt=0.1, n_steps=500)[0].plastic[0].weights

    louder = final_weights(Louder(eta=0.01, w_max=1.0))
    plain = final_weights(nj.VogelsSTDP(eta=0.01, w_max=1.0))
    assert float(jnp.max(louder - plain)) > 1e-3  # its own on_post ran, not the kernel's

    class OneTraceTriplet(nj.VogelsSTDP):
        def trace_kernel(self):
            return TraceKernel("triplet", *(jnp.asarray(0.1),) * 6, nearest=False)

    with pytest.raises(TypeError, match=r"kind='triplet', which needs 2 presynaptic and 2"):
        check_rule("Projection", OneTraceTriplet())

    class Unknown(nj.VogelsSTDP):
        def trace_kernel(self):
            return TraceKernel("quadruplet", *(jnp.asarray(0.1),) * 6, nearest=False)

    with pytest.raises(TypeError, match=r"kind='quadruplet'; the trace-rule kernel runs"):
        check_rule("Projection", Unknown())


# ---------------------------------------------------------------- reward-modulated STDP


def uses_reward_kernel(fn, *args) -> bool:
    return "nj_reward_update" in str(jax.make_jaxpr(fn)(*args))


def reward_steps(rule, state, arr, emit, post_s, d, dtype, n_block=7):
    """`len(arr)` steps of `modulated_update` in one jitted scan, with the block factors of
    step k and the sweep at the start of every block of `n_block` steps."""
    from neurojax.network._plastic import modulated_update

    lay, sizes = layout()
    static = (*sizes, None)
    (dx,), (dy,) = rule.trace_decays(DT)
    a = rule.eligibility_decay(DT)
    gain = rule.tau_c * (1.0 - a)
    cast = lambda v: jnp.asarray(v).astype(dtype)  # noqa: E731

    def step(carry, inp):
        k, s_arr, s_emit, s_post, d_k = inp
        phase = (k % n_block).astype(a.dtype)
        out = modulated_update(
            static, rule, lay, *carry, s_emit, s_arr, s_post, d_k, cast(dx), cast(dy),
            cast(a**phase), cast(a ** (phase + 1.0)), cast(gain), (k % n_block == 0) & (k > 0),
            cast(a**n_block),
        )  # fmt: skip
        return out[:6], None

    @jax.jit
    def go(state, arr, emit, post_s, d):
        ks = jnp.arange(arr.shape[0])
        return jax.lax.scan(step, state, (ks, arr, emit, post_s, d))[0]

    return go(state, *(jnp.asarray(v, dtype) for v in (arr, emit, post_s, d)))


def reward_state(batch, dtype, seed=8):
    rng = np.random.default_rng(seed)
    nnz = layout()[0].indices.shape[0]
    return tuple(
        jnp.asarray(v, dtype)
        for v in (
            rng.uniform(0.5, 3.5, (*batch, nnz)),  # weights
            rng.uniform(-0.3, 0.3, (*batch, nnz)),  # eligibility
            np.zeros((*batch, nnz)),  # stamp
            np.zeros(batch),  # acc
            rng.uniform(0, 1, (*batch, N_PRE)),  # x
            rng.uniform(0, 1, (*batch, N_POST)),  # y
        )
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("pairing", ["all_to_all", "nearest"])
def test_reward_kernel_equals_event_path(pairing, batch, dtype):
    """30 steps of random emissions, arrivals and postsynaptic spikes with a dopamine series:
    weights, eligibilities, stamps, the block sum and the traces of the kernel equal the
    pure-JAX event path's to rounding (~1e-6 relative in float32, 1e-12 in float64)."""
    if not kernel_runs():
        pytest.skip("the compiled CPU kernels are off (reference mode) or could not be built")
    f32 = dtype == "float32"
    rng = np.random.default_rng(9)
    n = 30
    arr = rng.random((n, *batch, N_PRE)) < 0.2
    emit = rng.random((n, *batch, N_PRE)) < 0.2
    post_s = rng.random((n, *batch, N_POST)) < 0.2
    d = rng.uniform(0.0, 0.02, (n, *batch))
    with jax.enable_x64(not f32):
        rule = nj.RewardSTDP(
            a_plus=0.5, a_minus=0.6, tau_c=40.0, w_max=4.0, pairing=pairing, sweep_interval=0.7
        )
        state = reward_state(batch, dtype)
        assert uses_reward_kernel(
            lambda s: reward_steps(rule, s, arr[:2], emit[:2], post_s[:2], d[:2], dtype), state
        )
        got = reward_steps(rule, state, arr, emit, post_s, d, dtype)
        with nj.kernels.use("reference"):
            want = reward_steps(rule, state, arr, emit, post_s, d, dtype)
    tol = dict(rtol=2e-6, atol=2e-6) if f32 else dict(rtol=1e-12, atol=1e-12)
    for g, r in zip(got, want, strict=True):
        assert g.dtype == np.dtype(dtype) and g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), **tol)
    assert np.abs(np.asarray(got[0]) - np.asarray(state[0])).max() > 0.01  # weights moved
    assert np.abs(np.asarray(got[1]) - np.asarray(state[1])).max() > 0.1  # eligibility too


def test_reward_network_on_the_kernel_equals_the_reference_mode_under_vmap():
    """A network with a 2 ms delay, dopamine as an input of the run, 3 trials by vmap and 2
    blocks of sweeps: the kernel's weights, eligibilities and spikes equal the reference
    mode's; the vmapped run equals single runs."""
    n, n_steps = 30, 600
    rule = nj.RewardSTDP(a_plus=0.5, a_minus=0.6, tau_c=100.0, w_max=4.0, sweep_interval=25.0)
    conn = nj.connect.fixed_prob(jr.key(2), n, n, 0.2, weight=1.0)
    proj = nj.Projection("E", "E", conn, synapse=nj.Exponential(5.0), delay=2.0, plasticity=rule)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)
    net = nj.Network({"E": (lif, n)}, [proj], inputs={"E": 16.5}, dt=DT)
    rng = np.random.default_rng(4)
    d = rng.uniform(0.0, 0.01, (n_steps, 3)).astype(np.float32)
    state = net.init_state(jr.key(5))

    @jax.jit
    def run(d):
        final, rec = nj.simulate(net, state, {"dopamine": d}, dt=DT)
        ps = final.plastic[0]
        return rule.current_weights(ps, DT), ps.eligibility, rec.spikes["E"]

    if kernel_runs():
        assert uses_reward_kernel(run, d[:5, 0])
    got = jax.vmap(run, in_axes=1)(d)
    with nj.kernels.use("reference"):
        want = jax.vmap(run, in_axes=1)(d)
    np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(want[2]))
    assert int(got[2].sum()) > 200
    for g, r in zip(got[:2], want[:2], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)
    one = run(d[:, 1])
    for g, r in zip(got, one, strict=True):
        np.testing.assert_allclose(np.asarray(g[1]), np.asarray(r), rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(got[0]) - 1.0).max() > 1e-3


@pytest.mark.parametrize("field", ["col_syn", "col_pre", "indices", "indptr"])
def test_reward_kernel_reports_corrupted_indices(field):
    if not kernel_runs():
        pytest.skip("the compiled CPU kernels are off (reference mode) or could not be built")
    n = 20
    conn = nj.connect.fixed_prob(jr.key(1), n, n, 0.3, weight=0.5)
    proj = nj.Projection("A", "A", conn, delay=1.0, plasticity=nj.RewardSTDP(w_max=1.0))
    net = nj.Network({"A": (nj.LIF(), n)}, [proj], inputs={"A": 20.0, "dopamine": 0.01}, dt=0.1)
    bad = eqx.tree_at(
        lambda m: getattr(m.projections[0].layout, field),
        net,
        getattr(net.projections[0].layout, field).at[1].set(10**6),
    )
    with pytest.raises(Exception, match="nj_reward_update: corrupted connectivity"):
        jax.block_until_ready(_steps_by_hand(bad, 200, checks=False))


ASAN_SCRIPT = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp, equinox as eqx
    import neurojax as nj
    rng = np.random.default_rng(0)
    rules = [nj.TripletSTDP(), nj.TripletSTDP(pairing="nearest"), nj.VogelsSTDP(w_max=1.0),
             nj.RewardSTDP(w_max=1.0, sweep_interval=2.0)]
    for rule in rules:
        conn = nj.connect.fixed_prob(jax.random.key(1), 16, 16, 0.3, weight=0.5)
        proj = nj.Projection("A", "A", conn, delay=0.5, plasticity=rule)
        inputs = {"A": 20.0, **({"dopamine": 0.01} if rule.modulator_name() else {})}
        net = nj.Network({"A": (nj.LIF(), 16)}, [proj], inputs=inputs, dt=0.1)
        state = net.init_state(jax.random.key(0))
        # steps by hand with the model checks off: nj.simulate's start check and
        # Network.step's own check would refuse the edits before the kernels
        from neurojax.network._checks import checked_run
        _run = eqx.filter_jit(lambda n, s: jax.lax.scan(
            lambda st, _: n.step(st, None, 0.1), s, None, length=60)[1]["A"])
        def run(n, s):
            with checked_run():
                return _run(n, s)
        np.asarray(run(net, state))
        errors = 0
        for case in range(40):
            field = ["indptr", "indices", "col_ptr", "col_syn", "col_pre"][case % 5]
            arr = np.asarray(getattr(net.projections[0].layout, field)).copy()
            arr[rng.integers(arr.size)] = rng.choice([-(2**31), -1, 10**6, 2**31 - 1, 17, 64])
            bad = eqx.tree_at(lambda m: getattr(m.projections[0].layout, field), net,
                              jnp.asarray(arr, jnp.int32))
            try:
                np.asarray(run(bad, state))
            except Exception as err:
                assert "corrupted connectivity" in str(err), err
                errors += 1
        assert errors > 5, (type(rule).__name__, errors)
    print("ASAN-FUZZ-DONE")
    """
)


@pytest.mark.slow
def test_corrupted_indices_under_address_sanitizer(tmp_path):
    """The three rules' kernels on networks with corrupted index arrays, in a process whose
    compiled library is built with AddressSanitizer: every run either reports the corruption
    or stays inside its arrays (no invalid access is reported)."""
    cxx = _build._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    runtime = subprocess.run(
        [cxx, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"{cxx} has no AddressSanitizer runtime")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {**os.environ, "NEUROJAX_CACHE_DIR": str(cache), "NEUROJAX_CPU_KERNEL": "1"}
    old = os.environ.get("NEUROJAX_CACHE_DIR")
    os.environ["NEUROJAX_CACHE_DIR"] = str(cache)
    try:
        out = _build.library_path()  # the name the child process will look for
    finally:
        if old is None:
            del os.environ["NEUROJAX_CACHE_DIR"]
        else:
            os.environ["NEUROJAX_CACHE_DIR"] = old
    _build.compile_library(out, ("-fsanitize=address", "-fno-omit-frame-pointer", "-g"))
    stdcxx = subprocess.run(
        [cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True
    ).stdout.strip()
    env.update(
        LD_PRELOAD=f"{runtime}:{stdcxx}" if os.path.isabs(stdcxx) else runtime,
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        PYTHONPATH=os.getcwd(),
    )
    proc = subprocess.run(
        [sys.executable, "-c", ASAN_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0 and "ASAN-FUZZ-DONE" in proc.stdout, proc.stderr[-4000:]
