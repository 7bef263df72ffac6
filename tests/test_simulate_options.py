"""`nj.simulate`'s option objects: `nj.Record`, `nj.Execution`, `nj.SurrogateGradient`,
`nj.EventPropGradient` (`neurojax._options`).

References: each object against the old keyword it replaces (bit for bit, the old call
warning once), and against independent constructions of the same record (a raster summed by
NumPy over windows, the raster's nonzero entries for spike ids, a full recording sliced by
NumPy, an unchunked run, an untruncated gradient).
"""

import dataclasses
import warnings

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax import _simulate

DT = 0.1


def _lif(n=4, batch=()):
    lif = nj.LIF(tau_m=12.0)
    return lif, lif.init_state(batch + (n,))


def _drive(n=4):
    return jnp.linspace(20.0, 60.0, n, dtype=jnp.float32)


def _old(*args, **kwargs):
    """`nj.simulate` with old keywords: exactly one `DeprecationWarning` naming the new form."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nj.simulate(*args, **kwargs)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    assert deprecations[0].filename == __file__  # the warning points at the caller's line
    return out, str(deprecations[0].message)


def _equal(a, b):
    chex.assert_trees_all_equal(
        jax.tree_util.tree_map(np.asarray, a), jax.tree_util.tree_map(np.asarray, b)
    )


# ---------------------------------------------------------------- each object = old keyword


@pytest.mark.parametrize(
    ("spikes", "dtype", "every"),
    [("raster", "bool", 1), ("raster", "bool", 5), ("float", None, 1), ("float", None, 5)],
)
def test_record_spikes_equal_the_old_spike_dtype(spikes, dtype, every):
    lif, state = _lif()
    new_final, new = nj.simulate(
        lif,
        state,
        _drive(),
        dt=DT,
        n_steps=200,
        record=nj.Record(fields=("v",), every=every, spikes=spikes),
    )
    (old_final, old), message = _old(
        lif,
        state,
        _drive(),
        dt=DT,
        n_steps=200,
        record=("v",),
        record_every=every,
        spike_dtype=dtype,
    )
    assert f"spike_dtype={dtype!r}" in message
    assert f"record=nj.Record(spikes={spikes!r})" in message
    _equal((new_final, new.spikes, new.v, new.t), (old_final, old.spikes, old.v, old.t))


def test_record_every_sums_the_raster_over_windows():
    lif, state = _lif()
    _, raster = nj.simulate(lif, state, _drive(), dt=DT, n_steps=300)
    _, counts = nj.simulate(lif, state, _drive(), dt=DT, n_steps=300, record=nj.Record(every=10))
    summed = np.asarray(raster.spikes).reshape(30, 10, 4).sum(axis=1)
    assert summed.sum() > 10  # the neurons fire
    np.testing.assert_array_equal(np.asarray(counts.spikes), summed)
    np.testing.assert_allclose(np.asarray(counts.t), (np.arange(30) + 1) * 10 * DT, rtol=1e-6)
    _, floats = nj.simulate(
        lif, state, _drive(), dt=DT, n_steps=300, record=nj.Record(every=10, spikes="float")
    )
    assert floats.spikes.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(floats.spikes), summed.astype(np.float32))


def test_record_ids_equal_the_old_keyword_and_the_raster():
    net, state = nj.models.coba(jax.random.key(3), n_exc=160, n_inh=40)
    _, raster = nj.simulate(net, state, dt=DT, n_steps=150)
    _, new = nj.simulate(net, state, dt=DT, n_steps=150, record=nj.Record(spikes="ids"))
    (_, old), message = _old(net, state, dt=DT, n_steps=150, spike_dtype="ids")
    assert "record=nj.Record(spikes='ids')" in message
    for pop, r in raster.spikes.items():
        steps, neurons = np.nonzero(np.asarray(r))
        assert isinstance(new.spikes[pop], nj.SpikeTimes)
        np.testing.assert_array_equal(new.spikes[pop].i, neurons)
        np.testing.assert_array_equal(new.spikes[pop].step, steps)
        _equal(new.spikes[pop]._replace(trial=0), old.spikes[pop]._replace(trial=0))
    assert sum(len(s.i) for s in new.spikes.values()) > 0


def test_record_fields_per_population_with_a_subset_equal_the_full_record_sliced():
    net, state = nj.models.coba(jax.random.key(1), n_exc=80, n_inh=20)
    _, full = nj.simulate(net, state, dt=DT, n_steps=60, record={"E": ("v",), "I": ("v",)})
    picked = [3, 0, 7]
    record = nj.Record(fields={"E": {"v": slice(2, 12, 3)}, "I": {"v": np.array(picked)}})
    _, part = nj.simulate(net, state, dt=DT, n_steps=60, record=record)
    np.testing.assert_array_equal(np.asarray(part.v["E"]), np.asarray(full.v["E"])[:, 2:12:3])
    np.testing.assert_array_equal(np.asarray(part.v["I"]), np.asarray(full.v["I"])[:, picked])
    # A fields function, given through the object as through record=.
    _, fn = nj.simulate(net, state, dt=DT, n_steps=60, record=nj.Record(fields=lambda s, o: s.step))
    np.testing.assert_array_equal(np.asarray(fn.values), np.arange(1, 61))


def test_execution_equals_the_old_keywords_and_an_unchunked_run():
    lif, state = _lif(batch=(4,))
    plain_final, plain = nj.simulate(lif, state, _drive(), dt=DT, n_steps=120, record=("v",))
    run = nj.Execution(chunk_size=40, unroll=3, batch_block=2)
    new_final, new = nj.simulate(lif, state, _drive(), dt=DT, n_steps=120, record=("v",), run=run)
    (old_final, old), message = _old(
        lif,
        state,
        _drive(),
        dt=DT,
        n_steps=120,
        record=("v",),
        chunk_size=40,
        unroll=3,
        batch_block=2,
    )
    assert "unroll=3, batch_block=2" in message
    assert "run=nj.Execution(unroll=3, batch_block=2)" in message
    assert new.info.chunks == 3 and isinstance(new.spikes, np.ndarray)
    _equal((new_final, new.spikes, new.v), (old_final, old.spikes, old.v))
    _equal((new_final, new.spikes, new.v), (plain_final, plain.spikes, plain.v))


def test_execution_progress_equals_the_shorthand(capsys):
    lif, state = _lif()
    _, a = nj.simulate(lif, state, _drive(), dt=DT, n_steps=100, progress=True)
    _, b = nj.simulate(lif, state, _drive(), dt=DT, n_steps=100, run=nj.Execution(progress=True))
    _equal(a.spikes, b.spikes)
    assert a.info.chunks == b.info.chunks == 20  # a progress bar splits the run in ~20


def _grad(lif, state, **kwargs):
    def loss(current):
        _, rec = nj.simulate(lif, state, current, dt=DT, n_steps=300, **kwargs)
        return (
            jnp.sum(rec.spikes * jnp.arange(1, 301, dtype=jnp.float32)[:, None])
            + rec.v.sum() * 1e-3
        )

    return jax.grad(loss)(_drive())


def test_surrogate_gradient_equals_the_old_keywords_and_its_references():
    lif, state = _lif()
    rec = nj.Record(fields=("v",), spikes="float")
    full = _grad(lif, state, record=rec)
    assert np.all(np.isfinite(np.asarray(full))) and float(jnp.abs(full).sum()) > 0
    for kwargs, old_kwargs in [
        (dict(checkpoint=True), dict(checkpoint=True)),
        (dict(truncate_backprop=25), dict(truncate_backprop=25)),
        (dict(checkpoint=True, truncate_backprop=25), dict(checkpoint=True, truncate_backprop=25)),
    ]:
        new = _grad(lif, state, record=rec, gradient=nj.SurrogateGradient(**kwargs))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = _grad(lif, state, record=("v",), **old_kwargs, spike_dtype=None)
        assert len([w for w in caught if w.category is DeprecationWarning]) == 1
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    # References: checkpointing changes no value (to float32 rounding: XLA fuses the
    # recomputed step of the backward pass on its own, 3e-5 of 110 measured); a truncation
    # window longer than the run changes nothing; a short one changes the gradient.
    ckpt = _grad(lif, state, record=rec, gradient=nj.SurrogateGradient(checkpoint=True))
    np.testing.assert_allclose(np.asarray(ckpt), np.asarray(full), rtol=1e-5)
    long = _grad(lif, state, record=rec, gradient=nj.SurrogateGradient(truncate_backprop=1000))
    np.testing.assert_array_equal(np.asarray(long), np.asarray(full))
    short = _grad(lif, state, record=rec, gradient=nj.SurrogateGradient(truncate_backprop=25))
    assert not np.allclose(np.asarray(short), np.asarray(full))
    # The string is the default object.
    same = _grad(lif, state, record=rec, gradient="surrogate")
    np.testing.assert_array_equal(np.asarray(same), np.asarray(full))


def test_eventprop_gradient_object_equals_the_string():
    from neurojax.training import EventNetwork, EventProjection

    lif = nj.LIF(tau_m=10.0, v_rest=-1.0, v_reset=-1.5, v_th=0.0, r_m=1.0)
    proj = EventProjection("in", "a", np.full((2, 2), 1.5), synapse=nj.Exponential(4.0))
    net = EventNetwork({"a": (lif, 2)}, {"in": 2}, [proj])
    inputs = {"in": jnp.array([[1.0, 4.0], [2.0, 3.0]], jnp.float32)}

    def first(gradient, net):
        _, rec = nj.simulate(net, None, inputs, dt=DT, n_steps=200, gradient=gradient)
        s = rec.spike_times["a"]
        return jnp.sum(jnp.where(jnp.isfinite(s), s, 0.0))

    a = first(nj.EventPropGradient(), net)
    b = first("eventprop", net)
    assert float(a) > 0
    assert float(a) == float(b)
    ga = jax.grad(lambda n: first(nj.EventPropGradient(), n))(net)
    gb = jax.grad(lambda n: first("eventprop", n))(net)
    np.testing.assert_array_equal(
        np.asarray(ga.projections[0].weight), np.asarray(gb.projections[0].weight)
    )
    with pytest.raises(ValueError, match=r"record=Record\(spikes='ids'\) keeps spikes as 'ids'"):
        nj.simulate(
            net,
            None,
            inputs,
            dt=DT,
            n_steps=200,
            record=nj.Record(spikes="ids"),
            gradient=nj.EventPropGradient(),
        )
    with pytest.raises(ValueError, match=r"record_every=5 belongs to the time-grid"):
        nj.simulate(
            net, None, inputs, dt=DT, n_steps=200, record=nj.Record(every=5), gradient="eventprop"
        )
    with pytest.raises(ValueError, match=r"unroll=2 belongs to the time-grid"):
        nj.simulate(
            net, None, inputs, dt=DT, n_steps=200, run=nj.Execution(unroll=2), gradient="eventprop"
        )


# ---------------------------------------------------------------- shorthands and warnings


def test_spec_keywords_are_shorthands_without_a_warning():
    lif, state = _lif()
    # pytest turns warnings into errors (pyproject's filterwarnings): none may be raised.
    _, short = nj.simulate(
        lif, state, _drive(), dt=DT, n_steps=100, record=("v",), record_every=5, chunk_size=50
    )
    _, long = nj.simulate(
        lif,
        state,
        _drive(),
        dt=DT,
        n_steps=100,
        record=nj.Record(fields=("v",), every=5),
        run=nj.Execution(chunk_size=50),
    )
    _equal((short.spikes, short.v, short.t), (long.spikes, long.v, long.t))


def test_every_old_keyword_warns_once_with_its_new_spelling():
    lif, state = _lif()
    cases = [
        (dict(spike_dtype="bool"), "record=nj.Record(spikes='raster')"),
        (dict(unroll=2), "run=nj.Execution(unroll=2)"),
        (dict(batch_block=None), "run=nj.Execution(batch_block=None)"),
        (dict(checkpoint=False), "gradient=nj.SurrogateGradient(checkpoint=False)"),
        (dict(truncate_backprop=7), "gradient=nj.SurrogateGradient(truncate_backprop=7)"),
    ]
    for kwargs, spelling in cases:
        _, message = _old(lif, state, _drive(), dt=DT, n_steps=10, **kwargs)
        assert message.startswith("deprecated simulate keyword ")
        assert spelling in message, message
    _, message = _old(
        lif, state, _drive(), dt=DT, n_steps=10, spike_dtype=None, unroll=2, checkpoint=True
    )
    assert message.startswith("deprecated simulate keywords spike_dtype=None, unroll=2, check")
    assert (
        "write record=nj.Record(spikes='float'), run=nj.Execution(unroll=2), "
        "gradient=nj.SurrogateGradient(checkpoint=True) instead"
    ) in message


def test_a_value_given_both_ways_is_refused():
    lif, state = _lif()
    call = dict(model=lif, state=state, inputs=_drive(), dt=DT, n_steps=20)
    cases = [
        (
            dict(record_every=5, record=nj.Record(every=10)),
            r"record_every=5 and record=Record\(every=10\) both set the recording interval",
        ),
        (
            dict(record_every=2, record=nj.Record()),
            r"record_every=2 and record=Record\(\) both",
        ),
        (
            dict(spike_dtype=None, record=nj.Record(fields=("v",))),
            r"spike_dtype=None and record=Record\(fields=\('v',\)\) both say how spikes",
        ),
        (
            dict(chunk_size=10, run=nj.Execution(unroll=2)),
            r"chunk_size=10 and run=Execution\(unroll=2\) both set how the run executes; "
            r"give it once, as nj.Execution\(chunk_size=10\)",
        ),
        (
            dict(progress=True, unroll=3, run=nj.Execution()),
            r"progress=True, unroll=3 and run=Execution\(\) both .* give them once",
        ),
        (
            dict(batch_block=2, run=nj.Execution(batch_block=2)),
            r"batch_block=2 and run=Execution\(batch_block=2\) both",
        ),
        (
            dict(checkpoint=True, gradient=nj.SurrogateGradient(truncate_backprop=5)),
            r"checkpoint=True and gradient=SurrogateGradient\(truncate_backprop=5\) both set",
        ),
        (
            dict(truncate_backprop=5, gradient=nj.EventPropGradient()),
            r"truncate_backprop=5 and gradient=EventPropGradient\(\) both set the gradient",
        ),
        (
            dict(checkpoint=True, gradient="eventprop"),
            r"simulate\(gradient='eventprop'\): checkpoint=True belongs to the surrogate",
        ),
    ]
    for kwargs, match in cases:
        args = {**call, **kwargs}
        m, s, i = args.pop("model"), args.pop("state"), args.pop("inputs")
        with pytest.raises(ValueError, match=match):
            nj.simulate(m, s, i, **args)


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: nj.Record(every=0), ValueError, r"nj.Record: every must be a positive int, got 0"),
        (lambda: nj.Record(every=2.0), TypeError, r"nj.Record: every must be a positive int"),
        (lambda: nj.Record(every=True), TypeError, r"nj.Record: every must be a positive int"),
        (
            lambda: nj.Record(spikes="bool"),
            ValueError,
            r"nj.Record: spikes must be one of 'raster', 'ids', 'float', got 'bool' \(the old "
            r"spike_dtype='bool' is spikes='raster'\)",
        ),
        (
            lambda: nj.Record(spikes=None),
            ValueError,
            r"got None \(the old spike_dtype=None is spikes='float'\)",
        ),
        (
            lambda: nj.Record(spikes="ids", every=4),
            ValueError,
            r"spikes='ids' keeps every spike with its step, so every must be 1, got every=4",
        ),
        (lambda: nj.Record(fields=3), TypeError, r"nj.Record: fields must be None, a tuple"),
        (
            lambda: nj.Record(fields=("v", 2)),
            TypeError,
            r"fields as a sequence must hold state field names \(str\), got \('v', 2\)",
        ),
        (
            lambda: nj.Record(fields={1: ("v",)}),
            TypeError,
            r"fields as a dict maps population names \(str\) to their fields, got keys \[1\]",
        ),
        (
            lambda: nj.Record(fields={"E": {"v": jnp.arange(3)}}),
            TypeError,
            r"a neuron subset must be concrete",
        ),
        (
            lambda: nj.Execution(chunk_size=0),
            ValueError,
            r"nj.Execution: chunk_size must be a positive int, got 0",
        ),
        (lambda: nj.Execution(progress=1), TypeError, r"nj.Execution: progress must be a bool"),
        (lambda: nj.Execution(unroll=-1), ValueError, r"nj.Execution: unroll must be a positive"),
        (lambda: nj.Execution(batch_block="2"), TypeError, r"nj.Execution: batch_block must be"),
        (
            lambda: nj.SurrogateGradient(checkpoint="yes"),
            TypeError,
            r"nj.SurrogateGradient: checkpoint must be a bool, got 'yes'",
        ),
        (
            lambda: nj.SurrogateGradient(truncate_backprop=0),
            ValueError,
            r"nj.SurrogateGradient: truncate_backprop must be a positive int, got 0",
        ),
    ],
)
def test_option_objects_check_their_fields(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_simulate_refuses_what_is_no_option_before_running(monkeypatch):
    lif, state = _lif()
    # Nothing may compile for a refused call.
    monkeypatch.setattr(_simulate, "_run_chunk_jit", None)
    cases = [
        (dict(run=dict(unroll=2)), TypeError, r"simulate: run must be an nj.Execution or None"),
        (
            dict(gradient="exact"),
            ValueError,
            r"simulate: gradient must be 'surrogate' or 'eventprop', got 'exact' \(or an "
            r"nj.SurrogateGradient",
        ),
        (dict(gradient=nj.Execution()), ValueError, r"gradient must be 'surrogate' or"),
        (dict(record=5), TypeError, r"simulate: record must be None, a tuple .* or an nj.Record"),
        (dict(record=("v", 1)), TypeError, r"simulate: record must be None"),
        (dict(record_every=0), ValueError, r"simulate: record_every must be a positive int"),
        (dict(chunk_size=-4), ValueError, r"simulate: chunk_size must be a positive int, got -4"),
        (dict(progress="yes"), TypeError, r"simulate: progress must be a bool, got 'yes'"),
        (dict(spike_dtype="int8"), ValueError, r"spike_dtype must be 'bool', 'ids' or None"),
        (dict(unroll=0), ValueError, r"simulate: unroll must be a positive int, got 0"),
        (dict(checkpoint=1), TypeError, r"simulate: checkpoint must be a bool, got 1"),
        (
            dict(record=nj.Record(fields=("w",))),
            ValueError,
            r"simulate: record names unknown state field 'w'",
        ),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            nj.simulate(lif, state, _drive(), dt=DT, n_steps=20, **kwargs)


# ---------------------------------------------------------------- values, jit, vmap, grad


def test_objects_are_frozen_hashable_static_and_print_as_given():
    a = nj.Record(fields={"E": {"v": slice(0, 10)}, "I": ["v"]}, every=2)
    b = nj.Record(fields={"E": {"v": slice(0, 10)}, "I": ("v",)}, every=2)
    assert a == b and hash(a) == hash(b)
    assert a != nj.Record(fields={"E": {"v": slice(0, 11)}, "I": ("v",)}, every=2)
    assert jax.tree_util.tree_leaves(a) == []  # no array leaves: static under jit
    assert repr(a) == "Record(fields={'E': {'v': slice(0, 10, None)}, 'I': ('v',)}, every=2)"
    assert a.plain_fields == {"E": {"v": slice(0, 10, None)}, "I": ("v",)}
    assert repr(nj.Record()) == "Record()"
    assert repr(nj.Execution(chunk_size=5, unroll=2)) == "Execution(chunk_size=5, unroll=2)"
    assert repr(nj.SurrogateGradient(checkpoint=True)) == "SurrogateGradient(checkpoint=True)"
    assert repr(nj.EventPropGradient()) == "EventPropGradient()"
    assert nj.Execution(unroll=np.int64(2)).unroll == 2
    assert type(nj.Execution(unroll=np.int64(2)).unroll) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.every = 3
    for obj in (nj.Execution(), nj.SurrogateGradient(), nj.EventPropGradient()):
        assert jax.tree_util.tree_leaves(obj) == [] and hash(obj) == hash(type(obj)())


def test_options_cross_jit_as_arguments_without_recompiling():
    lif, state = _lif()
    traces = []

    @jax.jit
    def run(state, record, run, gradient):
        traces.append(1)
        _, rec = nj.simulate(
            lif, state, _drive(), dt=DT, n_steps=50, record=record, run=run, gradient=gradient
        )
        return rec.spikes, rec.v

    args = (nj.Record(fields=("v",), every=5), nj.Execution(unroll=2), nj.SurrogateGradient())
    spikes, v = run(state, *args)
    # Equal objects built anew reuse the compiled program.
    run(state, nj.Record(fields=["v"], every=5), nj.Execution(unroll=2), nj.SurrogateGradient())
    assert len(traces) == 1
    _, eager = nj.simulate(lif, state, _drive(), dt=DT, n_steps=50, record=args[0], run=args[1])
    _equal((spikes, v), (eager.spikes, eager.v))
    # Different options compile again, and differ.
    spikes_float, _ = run(state, nj.Record(fields=("v",), every=5, spikes="float"), *args[1:])
    assert len(traces) == 2 and spikes_float.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(spikes_float), np.asarray(spikes, np.float32))
    # equinox's filter_jit treats them the same way.
    f = eqx.filter_jit(lambda s, r: nj.simulate(lif, s, _drive(), dt=DT, n_steps=50, record=r)[1].v)
    np.testing.assert_array_equal(np.asarray(f(state, args[0])), np.asarray(v))


def test_options_under_vmap_equal_stacked_single_runs():
    lif, base = _lif()
    states = jax.vmap(lambda v0: eqx.tree_at(lambda s: s.v, base, base.v + v0))(
        jnp.array([0.0, 3.0, 6.0])
    )
    record = nj.Record(fields=("v",), every=4, spikes="float")
    run = nj.Execution(unroll=2)

    def one(state):
        _, rec = nj.simulate(lif, state, _drive(), dt=DT, n_steps=80, record=record, run=run)
        return rec.spikes, rec.v

    batched = jax.vmap(one)(states)
    for k in range(3):
        single = one(jax.tree_util.tree_map(lambda x, k=k: x[k], states))
        np.testing.assert_array_equal(np.asarray(batched[0][k]), np.asarray(single[0]))
        np.testing.assert_allclose(np.asarray(batched[1][k]), np.asarray(single[1]), rtol=1e-6)
    assert float(batched[0].sum()) > 0
