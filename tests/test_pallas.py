"""The accelerator (Pallas) implementations of the registry, run on the CPU in interpret mode
against their references: every GPU/TPU slot on every example of its entry under jit, vmap
and grad, then the cases the examples do not reach (bursts above the capacity, empty rows,
rows longer than a block, several trial axes, a rule written in the test).

Tolerance: the GPU kernels add with atomics in no fixed order and the TPU delivery sums by
matrix products, so float results are compared to 1e-5 relative / 1e-6 absolute (a few ulps
of the float32 values used), not bit for bit; integer results exactly."""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _pallas_deliver, _pallas_plastic
from neurojax.network._plastic import PlasticLayout
from neurojax.network._plastic import _event_update as _event_update_needed
from neurojax.network._propagation import EventSpec
from neurojax.network._propagation import _deliver_reference as _deliver_reference_needed
from neurojax.neurons import _lif_fused as _pallas_lif
from neurojax.plasticity import PlasticityRule

# Kernel calls trace every platform's implementation (tests/conftest.py).
pytestmark = pytest.mark.cross_platform


def _deliver_reference(*args, **static):
    """The reference's ring (the Pallas functions return the ring alone; the registry's
    wrappers add the buffer each trial needed)."""
    return _deliver_reference_needed(*args, **static)[0]


def _event_update(*args, **static):
    """The reference's weights and traces, without the buffers it needed."""
    return _event_update_needed(*args, **static)[:3]


RTOL, ATOL = 1e-5, 1e-6
KERNELS = nj.kernels.registry()
SLOT_CASES = [
    pytest.param(kernel, slot, example, id=f"{name}-{slot}-{example.label or i}")
    for name, kernel in sorted(KERNELS.items())
    for slot in ("gpu", "tpu")
    if getattr(kernel, slot) is not None
    for i, example in enumerate(kernel.examples() if kernel.examples else ())
]


def _canonical(kernel, out):
    """`lif_step_spikes`' list holds a set (its order follows the GPU's atomics): sorted."""
    if kernel.name == "lif_step_spikes":
        v, r, s, index, count = out
        return v, r, s, jnp.sort(index, axis=-1), count
    return out


def _close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if jnp.issubdtype(w.dtype, jnp.floating):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _run(kernel, example, args=None):
    return nj.kernels.call(kernel, *(example.args if args is None else args), **example.static)


def test_slot_cases_exist():
    """The walk below covers the kernels this module is about."""
    names = {p.values[0].name for p in SLOT_CASES}
    assert {"csr_deliver", "plastic_update", "lif_step_spikes"} <= names


@pytest.mark.parametrize("kernel,slot,example", SLOT_CASES)
def test_slot_equals_reference_under_jit(kernel, slot, example):
    with nj.kernels.use("reference"):
        want = jax.jit(lambda *a: _run(kernel, example, a))(*example.args)
    with nj.kernels.interpret(slot):
        impls = nj.kernels.implementations(kernel, *example.args, **example.static)
        assert impls.get("cpu") is getattr(kernel, slot)
        got = jax.jit(lambda *a: _run(kernel, example, a))(*example.args)
    _close(_canonical(kernel, got), _canonical(kernel, want))


# Interpreted Pallas is slow on the CPU: run with the slow tests (CI runs them too).
@pytest.mark.slow
@pytest.mark.parametrize("kernel,slot,example", SLOT_CASES)
def test_slot_under_vmap_equals_stacked_calls(kernel, slot, example):
    """Three trials under vmap (through the entry's batching rule) equal three calls."""
    argnums = example.vmap_argnums or tuple(
        i for i, a in enumerate(example.args) if isinstance(a, jax.Array) and a.ndim
    )
    trials = []
    for t in range(3):
        args = list(example.args)
        for i in argnums:
            if jnp.issubdtype(args[i].dtype, jnp.floating):
                args[i] = args[i] * (1.0 + 0.25 * t)
        trials.append(args)
    with nj.kernels.use("reference"):
        want = jax.tree.map(lambda *xs: jnp.stack(xs), *[_run(kernel, example, a) for a in trials])
    axes = [0 if i in argnums else None for i in range(len(example.args))]
    stacked = [
        jnp.stack([tr[i] for tr in trials]) if i in argnums else example.args[i]
        for i in range(len(example.args))
    ]
    with nj.kernels.interpret(slot):
        got = jax.vmap(lambda *a: _run(kernel, example, a), in_axes=axes)(*stacked)
    _close(_canonical(kernel, got), _canonical(kernel, want))


# Interpreted Pallas is slow on the CPU: run with the slow tests (CI runs them too).
@pytest.mark.slow
@pytest.mark.parametrize("kernel,slot,example", [c for c in SLOT_CASES if c.values[2].grad_argnums])
def test_slot_gradient_is_the_reference_gradient(kernel, slot, example):
    """Gradients never go through a Pallas kernel: they are those of the entry's definition."""
    fn = kernel.differentiable or kernel.reference

    def loss(f):
        def inner(*args):
            out = f(*args, **example.static)
            leaves = [x for x in jax.tree.leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)]
            # linear in the outputs, so the gradient does not depend on their last bits
            return sum(
                jnp.sum(x * jnp.cos(jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape))
                for x in leaves
            )

        return inner

    want = jax.grad(loss(fn), example.grad_argnums)(*example.args)
    with nj.kernels.interpret(slot):
        got = jax.grad(
            loss(lambda *a, **s: nj.kernels.call(kernel, *a, **s)), example.grad_argnums
        )(*example.args)
    chex.assert_trees_all_close(got, want, rtol=RTOL, atol=ATOL)


def test_interpret_runs_the_pallas_kernel():
    """Under the switch the traced program holds the Pallas call; off, it does not."""
    kernel = KERNELS["csr_deliver"]
    example = next(iter(kernel.examples()))
    f = lambda *a: _run(kernel, example, a)  # noqa: E731
    with nj.kernels.interpret("gpu"):
        assert "pallas_call" in str(jax.make_jaxpr(f)(*example.args))
    assert nj.kernels.interpret_mode() == "off"
    with nj.kernels.use("reference"):
        assert "pallas_call" not in str(jax.make_jaxpr(f)(*example.args))


def test_interpret_switch_is_checked_and_read_from_the_environment():
    with pytest.raises(ValueError, match="slot must be one of"):
        with nj.kernels.interpret("cuda"):
            pass
    code = "import neurojax as nj; print(nj.kernels.interpret_mode())"
    env = dict(os.environ, NEUROJAX_PALLAS_INTERPRET="1", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "gpu"


# ------------------------------------------------------------------ delivery


def _csr(rng, n_pre, n_post, p, empty=()):
    mask = rng.random((n_pre, n_post)) < p
    mask[list(empty)] = False
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    return jnp.asarray(indptr), jnp.asarray(np.nonzero(mask)[1].astype(np.int32))


def _delivery_case(rng, trials, *, per_synapse, per_trial, n_slots=4, p=0.6):
    """A group of 40 neurons: projection A (neurons 0..24, rows 3 and 7 empty, 30 targets)
    and projection B (neurons 25..39, 12 targets), one ring of 42 columns."""
    ip_a, ix_a = _csr(rng, 25, 30, p, empty=(3, 7))
    ip_b, ix_b = _csr(rng, 15, 12, p)
    fan_a, fan_b = int(np.diff(ip_a).max()), int(np.diff(ip_b).max())
    d_a = jnp.asarray(rng.integers(0, n_slots, ix_a.shape[0]), jnp.int32) if per_synapse else None
    specs = (
        tuple(EventSpec(40, 0, 25, 30, fan_a, n_slots, None if per_synapse else 1, 42, 0)),
        tuple(EventSpec(40, 25, 15, 12, fan_b, n_slots, 2, 42, 30)),
    )
    w_a_shape = (*trials, ix_a.shape[0]) if per_trial else (ix_a.shape[0],)
    weights = (
        jnp.asarray(rng.uniform(0.1, 1.0, w_a_shape), jnp.float32),
        jnp.asarray(rng.uniform(-1.0, 1.0, ix_b.shape[0]), jnp.float32),
    )
    tables = ((ip_a, ix_a, d_a), (ip_b, ix_b, None))
    s = jnp.asarray(rng.random((*trials, 40)) < 0.7, jnp.float32)
    ring = jnp.asarray(rng.normal(size=(*trials, n_slots, 42)), jnp.float32)
    return s, ring, weights, tables, specs


def _keep_first(s, cap):
    mask = s > 0
    return jnp.where(mask & (jnp.cumsum(mask, axis=-1) <= cap), s, 0.0)


@pytest.mark.parametrize("slot", ["gpu", "tpu"])
@pytest.mark.parametrize(
    "trials,per_synapse,per_trial",
    [
        (trials, per_synapse, per_trial)
        for trials in [(), (3,), (2, 3)]
        for per_synapse, per_trial in [(False, False), (True, False), (True, True)]
        if trials or not per_trial  # per-trial weights need a trial axis
    ],
)
@pytest.mark.parametrize("fresh", [False, True])
def test_deliver_equals_reference(slot, trials, per_synapse, per_trial, fresh):
    """Two projections out of one group, empty rows, delays per synapse or per projection,
    weights per trial, several trial axes; small blocks so that rows span several chunks
    and the spikes several blocks."""
    rng = np.random.default_rng(len(trials) + 2 * per_synapse + 4 * per_trial + 8 * fresh)
    s, ring, weights, tables, specs = _delivery_case(
        rng, trials, per_synapse=per_synapse, per_trial=per_trial
    )
    step = jnp.asarray(6, jnp.int32)
    want = _deliver_reference(s, step, ring, weights, tables, specs=specs, fresh=fresh)
    if slot == "gpu":
        fn = lambda *a: _pallas_deliver.deliver_gpu(  # noqa: E731
            *a, specs=specs, fresh=fresh, block_spikes=4, block_synapses=4
        )
    else:
        fn = lambda *a: _pallas_deliver.deliver_tpu(*a, specs=specs, fresh=fresh)  # noqa: E731
    with nj.kernels.interpret(slot):
        got = jax.jit(fn)(s, step, ring, weights, tables)
    _close(got, want)


@pytest.mark.parametrize("capacity", [0, 1, 5, 13, 100])
def test_deliver_tpu_capacity_keeps_the_lowest_spikes(capacity):
    """A burst above the capacity: the `capacity` lowest spiking neurons of each trial are
    delivered, the others ignored; a capacity above the group's size delivers everything."""
    rng = np.random.default_rng(capacity)
    s, ring, weights, tables, specs = _delivery_case(rng, (2,), per_synapse=True, per_trial=True)
    assert int(jnp.sum(s[0] > 0)) > 13
    step = jnp.asarray(2, jnp.int32)
    want = _deliver_reference(
        _keep_first(s, capacity), step, ring, weights, tables, specs=specs, fresh=False
    )
    with nj.kernels.interpret("tpu"):
        got = jax.jit(
            lambda *a: _pallas_deliver.deliver_tpu(*a, specs=specs, fresh=False, capacity=capacity)
        )(s, step, ring, weights, tables)
    _close(got, want)
    if capacity < 20:  # the capacity did cut something off
        full = _deliver_reference(s, step, ring, weights, tables, specs=specs, fresh=False)
        assert not np.allclose(np.asarray(got), np.asarray(full))


@pytest.mark.parametrize("capacity", [0, 5])
def test_deliver_gpu_has_no_capacity(capacity):
    """The GPU kernel reads the spike vector in tiles inside its fixed grid: a burst above any
    capacity is delivered whole (the registry entry reports no missing buffer), with few
    programs per trial so that each walks several tiles."""
    rng = np.random.default_rng(capacity)
    s, ring, weights, tables, specs = _delivery_case(rng, (2,), per_synapse=True, per_trial=True)
    step = jnp.asarray(2, jnp.int32)
    want = _deliver_reference(s, step, ring, weights, tables, specs=specs, fresh=False)
    with nj.kernels.interpret("gpu"):
        got = jax.jit(
            lambda *a: _pallas_deliver.deliver_gpu(
                *a, specs=specs, fresh=False, capacity=capacity, block_spikes=4, programs=3
            )
        )(s, step, ring, weights, tables)
        ring2, need = nj.kernels.call(
            KERNELS["csr_deliver"],
            s,
            step,
            ring,
            weights,
            tables,
            specs=specs,
            fresh=False,
            capacity=capacity or None,
        )
    _close(got, want)
    _close(ring2, want)
    np.testing.assert_array_equal(need, 0)


@pytest.mark.parametrize("slot,dense_max", [("gpu", None), ("tpu", None), ("tpu", 10)])
def test_deliver_takes_one_step_per_trial(slot, dense_max, monkeypatch):
    """A per-trial step index (a vmapped network step's counter) equals one call per trial,
    on the GPU kernel and on the TPU formulation (dense, and its sparse path)."""
    if dense_max is not None:
        monkeypatch.setattr(_pallas_deliver, "_DENSE_MAX", dense_max)
    rng = np.random.default_rng(11)
    s, ring, weights, tables, specs = _delivery_case(rng, (3,), per_synapse=True, per_trial=False)
    steps = jnp.asarray([2, 5, 7], jnp.int32)
    want = jnp.stack(
        [
            _deliver_reference(s[t], steps[t], ring[t], weights, tables, specs=specs, fresh=False)
            for t in range(3)
        ]
    )
    with nj.kernels.interpret(slot):
        got = KERNELS["csr_deliver"].gpu if slot == "gpu" else KERNELS["csr_deliver"].tpu
        got = got(s, steps, ring, weights, tables, specs=specs, fresh=False, clear=True)[0]
    want_clear = [
        _deliver_reference(
            s[t], steps[t], ring[t], weights, tables, specs=specs, fresh=False, clear=True
        )
        for t in range(3)
    ]
    _close(got, jnp.stack(want_clear))
    if slot == "gpu":
        with nj.kernels.interpret("gpu"):
            got = _pallas_deliver.deliver_gpu(
                s, steps, ring, weights, tables, specs=specs, fresh=False, block_spikes=8
            )
        _close(got, want)


def test_deliver_capacity_is_checked():
    rng = np.random.default_rng(0)
    s, ring, weights, tables, specs = _delivery_case(rng, (), per_synapse=False, per_trial=False)
    with pytest.raises(ValueError, match="capacity must be None or an int >= 0"):
        _pallas_deliver.deliver_gpu(
            s, jnp.int32(0), ring, weights, tables, specs=specs, fresh=False, capacity=-1
        )
    with pytest.raises(ValueError, match="programs must be None or an int >= 1, got 0"):
        _pallas_deliver.deliver_gpu(
            s, jnp.int32(0), ring, weights, tables, specs=specs, fresh=False, programs=0
        )


def test_deliver_tpu_refuses_a_dense_tensor_too_large_without_a_sparse_path(monkeypatch):
    """Without the caller's sparse delivery, a projection above the dense limit is refused
    with its size named, before anything is allocated."""
    monkeypatch.setattr(_pallas_deliver, "_DENSE_MAX", 10)
    rng = np.random.default_rng(9)
    s, ring, weights, tables, specs = _delivery_case(rng, (2,), per_synapse=True, per_trial=True)
    with pytest.raises(ValueError, match=r"would hold \d+ entries .* above the limit of 10"):
        _pallas_deliver.deliver_tpu(s, jnp.int32(3), ring, weights, tables, specs=specs, fresh=True)


def test_deliver_gpu_under_vmap_of_weights_and_grad_through_registry():
    """Through the registry under the switch: a vmapped weight vector (folded into trials)
    and the gradient with respect to spikes and weights (the dense definition's)."""
    kernel = KERNELS["csr_deliver"]
    rng = np.random.default_rng(5)
    s, ring, weights, tables, specs = _delivery_case(rng, (2,), per_synapse=True, per_trial=False)
    step = jnp.asarray(1, jnp.int32)
    static = dict(specs=specs, fresh=False)
    w_stack = (jnp.stack([weights[0] * (1 + 0.5 * k) for k in range(3)]), weights[1])

    def one(w, s_):
        return nj.kernels.call(kernel, s_, step, ring, w, tables, **static)[0]

    with nj.kernels.use("reference"):
        want = jax.vmap(one, in_axes=((0, None), None))(w_stack, s)
        g_want = jax.grad(lambda s_, w: jnp.sum(jnp.sin(one(w, s_))), (0, 1))(s, weights)
    with nj.kernels.interpret("gpu"):
        got = jax.vmap(one, in_axes=((0, None), None))(w_stack, s)
        g_got = jax.grad(lambda s_, w: jnp.sum(jnp.sin(one(w, s_))), (0, 1))(s, weights)
    _close(got, want)
    chex.assert_trees_all_close(g_got, g_want, rtol=RTOL, atol=ATOL)


def test_deliver_tpu_falls_back_to_the_scatter_for_large_projections(monkeypatch):
    """Above the dense size limit the TPU slot uses the reference's scatter: same result."""
    monkeypatch.setattr(_pallas_deliver, "_DENSE_MAX", 10)
    rng = np.random.default_rng(9)
    s, ring, weights, tables, specs = _delivery_case(rng, (2,), per_synapse=True, per_trial=True)
    step = jnp.asarray(3, jnp.int32)
    want = _deliver_reference(s, step, ring, weights, tables, specs=specs, fresh=True)
    with nj.kernels.interpret("tpu"):
        got = KERNELS["csr_deliver"].tpu(s, step, ring, weights, tables, specs=specs, fresh=True)[0]
    _close(got, want)


# ------------------------------------------------------------------ plasticity


class _TripletLike(PlasticityRule):
    """A rule written for this test (not pair STDP): two presynaptic traces, a
    weight-dependent, trace-product update and its own bounds."""

    n_pre_traces = 2
    n_post_traces = 1
    eta: jax.Array
    w_min: jax.Array
    w_max: jax.Array

    def __init__(self, eta=0.1, w_min=0.0, w_max=2.0):
        self.eta = jnp.asarray(eta, jnp.float32)
        self.w_min = jnp.asarray(w_min, jnp.float32)
        self.w_max = jnp.asarray(w_max, jnp.float32)

    def trace_decays(self, dt):
        return (jnp.exp(-dt / 5.0), jnp.exp(-dt / 20.0)), (jnp.exp(-dt / 10.0),)

    def update_pre_traces(self, traces, spikes):
        return (traces[0] + spikes, traces[1] * (1 - spikes) + spikes)

    def update_post_traces(self, traces, spikes):
        return (traces[0] + 0.5 * spikes,)

    def on_pre(self, w, pre, post, s):
        return self.clip(w - self.eta * s * post[0] * (w - self.w_min) * (1 + pre[1]))

    def on_post(self, w, pre, post, s):
        return self.clip(w + self.eta * s * pre[0] * jnp.tanh(self.w_max - w + post[0]))


def _plastic_case(rng, batch, n_pre=23, n_post=19, p=0.4):
    mask = rng.random((n_pre, n_post)) < p
    mask[4] = False  # an empty row
    mask[:, 6] = False  # an empty column
    pre_of, post_of = np.nonzero(mask)
    order = np.argsort(post_of, kind="stable")
    lay = PlasticLayout(
        jnp.asarray(np.concatenate([[0], np.cumsum(mask.sum(1))]), jnp.int32),
        jnp.asarray(post_of, jnp.int32),
        jnp.asarray(np.concatenate([[0], np.cumsum(mask.sum(0))]), jnp.int32),
        jnp.asarray(order, jnp.int32),
        jnp.asarray(pre_of[order], jnp.int32),
    )
    sizes = (n_pre, n_post, int(mask.sum(1).max()), int(mask.sum(0).max()), 3, 2)
    f32 = jnp.float32
    rule = _TripletLike()
    pre_d, post_d = rule.trace_decays(0.1)
    args = (
        rule,
        lay,
        jnp.asarray(rng.uniform(0.2, 1.8, (*batch, int(mask.sum()))), f32),
        tuple(jnp.asarray(rng.uniform(0, 1, (*batch, n_pre)), f32) for _ in range(2)),
        (jnp.asarray(rng.uniform(0, 1, (*batch, n_post)), f32),),
        jnp.asarray(rng.random((*batch, n_pre + 5)) < 0.5, f32),
        jnp.asarray(rng.random((*batch, n_post + 4)) < 0.5, f32),
        tuple(jnp.asarray(d, f32) for d in pre_d),
        tuple(jnp.asarray(d, f32) for d in post_d),
    )
    return args, sizes


@pytest.mark.parametrize("batch", [(), (2,), (2, 2)])
def test_plastic_gpu_runs_a_user_rule(batch):
    """A rule defined in Python here gets the GPU kernel (its on_pre/on_post traced in the
    body), with rows and columns longer than a block and several trial axes."""
    args, sizes = _plastic_case(np.random.default_rng(len(batch)), batch)
    want = _event_update(*args, sizes=sizes)
    with nj.kernels.interpret("gpu"):
        got = jax.jit(
            lambda *a: _pallas_plastic.plastic_gpu(
                *a, sizes=sizes, block_spikes=4, block_synapses=2
            )
        )(*args)
    _close(got, want)
    assert not np.allclose(np.asarray(got[0]), np.asarray(args[2]))  # weights did change


def test_plastic_user_rule_dispatches_to_the_gpu_slot():
    """On the CPU such a rule has no compiled kernel (reference); under the switch the GPU
    slot takes it, and its gradient is the dense definition's."""
    kernel = KERNELS["plastic_update"]
    args, sizes = _plastic_case(np.random.default_rng(7), (2,))
    assert "cpu" not in nj.kernels.implementations(kernel, *args, sizes=sizes)
    with nj.kernels.interpret("gpu"):
        assert nj.kernels.implementations(kernel, *args, sizes=sizes)["cpu"] is kernel.gpu
        got = nj.kernels.call(kernel, *args, sizes=sizes)[:3]
        g_got = jax.grad(
            lambda w, r: jnp.sum(
                jnp.sin(nj.kernels.call(kernel, r, args[1], w, *args[3:], sizes=sizes)[0])
            ),
            (0, 1),
        )(args[2], args[0])
    want = _event_update(*args, sizes=sizes)
    g_want = jax.grad(
        lambda w, r: jnp.sum(
            jnp.sin(kernel.differentiable(r, args[1], w, *args[3:], sizes=sizes)[0])
        ),
        (0, 1),
    )(args[2], args[0])
    _close(got, want)
    chex.assert_trees_all_close(g_got, g_want, rtol=RTOL, atol=ATOL)


def test_plastic_gpu_needs_scalar_parameters():
    """A rule with a non-scalar array parameter is left to the reference on GPU."""
    args, sizes = _plastic_case(np.random.default_rng(1), (2,))
    rule = _TripletLike(eta=jnp.full((3,), 0.1))
    assert not _pallas_plastic.plastic_gpu_supports(rule, *args[1:], sizes=sizes)
    kernel = KERNELS["plastic_update"]
    with nj.kernels.interpret("gpu"):
        assert "cpu" not in nj.kernels.implementations(kernel, rule, *args[1:], sizes=sizes)


# ------------------------------------------------------------------ LIF step with spike list


def _lif_case(rng, trials, n):
    f32 = jnp.float32
    shape = (*trials, n)
    return (
        jnp.asarray(rng.uniform(-70.0, -54.0, shape), f32),
        jnp.asarray(np.where(rng.random(shape) < 0.2, 1.0, 0.0), f32),
        jnp.asarray(rng.uniform(-60.0, -40.0, shape), f32),
        jnp.full(shape, np.exp(-0.1 / 10.0), f32),
        jnp.full(shape, -70.0, f32),
        jnp.asarray(rng.uniform(-56.0, -54.0, shape), f32),
        jnp.full(shape, 2.0, f32),
        jnp.asarray([0.1, 0.05], f32),
    )


@pytest.mark.parametrize("trials", [(), (3,), (2, 2)])
@pytest.mark.parametrize("capacity", [None, 1, 7, 400])
def test_lif_step_spikes_gpu(trials, capacity):
    """State and spikes equal the reference; the list holds the reference's set of neurons
    (all of them, or under overflow `capacity` spiking neurons) and the count is the true
    number of spikes, with blocks smaller than the population."""
    n = 203
    args = _lif_case(np.random.default_rng(len(trials)), trials, n)
    want = _pallas_lif.lif_step_spikes_reference(*args, euler=False, capacity=capacity)
    with nj.kernels.interpret("gpu"):
        got = jax.jit(
            lambda *a: _pallas_lif.lif_step_spikes_gpu(*a, euler=False, capacity=capacity, block=32)
        )(*args)
    _close(got[:3], want[:3])
    np.testing.assert_array_equal(got[4], want[4])
    cap = n if capacity is None else capacity
    assert got[3].shape == (*trials, cap)
    spikes = np.asarray(want[2]).reshape(-1, n)
    counts = np.asarray(want[4]).reshape(-1)
    assert counts.max() > 7  # the small capacities overflow
    for s_row, c, idx in zip(spikes, counts, np.asarray(got[3]).reshape(-1, cap), strict=True):
        kept = idx[idx < n]
        assert len(kept) == min(c, cap)
        assert len(set(kept.tolist())) == len(kept)
        assert s_row[kept].all()
        np.testing.assert_array_equal(idx[len(kept) :], n)
        if c <= cap:
            np.testing.assert_array_equal(np.sort(kept), np.nonzero(s_row)[0])


def test_lif_step_spikes_capacity_is_checked():
    args = _lif_case(np.random.default_rng(0), (), 8)
    with pytest.raises(ValueError, match="capacity must be None or an int >= 1"):
        _pallas_lif.lif_step_spikes_reference(*args, euler=False, capacity=0)


def test_lif_step_spikes_is_one_lif_step():
    """The entry's update is `LIF.step` (spikes, v and refractory) on the same inputs."""
    model = nj.LIF()
    rng = np.random.default_rng(4)
    n, dt = 50, 0.1
    state = nj.LIFState(
        v=jnp.asarray(rng.uniform(-70.0, -50.0, n), jnp.float32),
        refractory=jnp.asarray(np.where(rng.random(n) < 0.3, 1.0, 0.0), jnp.float32),
    )
    current = jnp.asarray(rng.uniform(0.0, 3.0, n), jnp.float32)
    new, s = model.step(state, current, dt)
    v_inf = model.v_rest + model.r_m * current
    full = [
        jnp.broadcast_to(jnp.asarray(x, jnp.float32), (n,))
        for x in (v_inf, jnp.exp(-dt / model.tau_m), model.v_reset, model.v_th, model.t_ref)
    ]
    with nj.kernels.interpret("gpu"):
        v, r, spikes, index, count = nj.kernels.call(
            KERNELS["lif_step_spikes"],
            state.v,
            state.refractory,
            *full,
            jnp.asarray([dt, 0.5 * dt], jnp.float32),
            euler=False,
            capacity=None,
        )
    np.testing.assert_allclose(v, new.v, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(r, new.refractory)
    np.testing.assert_array_equal(spikes, s)
    assert int(count) == int(jnp.sum(s))


# ------------------------------------------------------------------ inside a network


# Interpreted Pallas is slow on the CPU: run with the slow tests (CI runs them too).
@pytest.mark.slow
def test_network_runs_the_gpu_kernels():
    """A LIF network with event-driven delivery (two groups, delays) and an STDP projection,
    400 steps with the GPU kernels interpreted, equals the reference run."""
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0, t_ref=2.0)
    k = jax.random.split(jax.random.key(2), 3)
    ee = nj.connect.fixed_prob(k[0], 30, 30, 0.2, weight=0.5)
    ei = nj.connect.fixed_prob(k[1], 30, 10, 0.3, weight=0.4)
    ie = nj.connect.fixed_prob(k[2], 10, 30, 0.3, weight=0.3)
    rule = nj.STDP(a_plus=0.01, a_minus=0.012, w_max=1.0)
    net = nj.Network(
        populations={"E": (lif, 30), "I": (lif, 10)},
        projections=[
            nj.Projection(
                "E", "E", ee, synapse=nj.Exponential(5.0), method="event", plasticity=rule
            ),
            nj.Projection("E", "I", ei, synapse=nj.Exponential(2.0), delay=0.3, method="event"),
            nj.Projection(
                "I",
                "E",
                ie,
                synapse=nj.Exponential(10.0),
                output=nj.ConductanceOutput(-80.0),
                method="event",
            ),
        ],
        inputs={"E": jnp.linspace(12.0, 20.0, 30), "I": 13.0},
        dt=0.1,
    )
    state = net.init_state(jax.random.key(0))
    with nj.kernels.use("reference"):
        want_final, want = nj.simulate(net, state, dt=0.1, n_steps=400)
    assert int(want.spikes["E"].sum()) > 20 and int(want.spikes["I"].sum()) > 5
    # the per-step GPU path and the whole-network kernel (network_run) alike
    for whole in (False, True):
        with nj.kernels.interpret("gpu"), nj.kernels.whole_networks(whole):
            final, got = nj.simulate(net, state, dt=0.1, n_steps=400)
            step = str(jax.make_jaxpr(lambda st: net.step(st, None, 0.1))(state))
        assert step.count("pallas_call") >= 3  # the delivery and the two plasticity phases
        for pop in ("E", "I"):
            np.testing.assert_array_equal(got.spikes[pop], want.spikes[pop])
        chex.assert_trees_all_close(final, want_final, rtol=RTOL, atol=1e-5)
