"""`simulate`: input kinds, recording, record_every, chunking, progress, the check guard."""

import ast
from pathlib import Path

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import neurojax as nj


class Echo(eqx.Module):
    """A test model whose state accumulates its input and whose output is `input > 0`.

    Its recordings reveal exactly what `simulate` fed it at every step.
    """

    gain: Float[Array, ""] = eqx.field(default=1.0, converter=jnp.asarray)

    def init_state(self, shape, *, key=None):
        shape = (shape,) if isinstance(shape, int) else shape
        return {"v": jnp.zeros(shape), "last": jnp.zeros(shape)}

    def step(self, state, inp, dt):
        inp = jnp.zeros(()) if inp is None else jnp.asarray(inp, jnp.float32)
        inp = jnp.broadcast_to(inp, state["v"].shape)
        new = {"v": state["v"] + self.gain * inp * dt, "last": inp}
        return new, (inp > 0).astype(jnp.float32)


class TwoPops(eqx.Module):
    """A model with a PyTree of outputs, as a network has."""

    def init_state(self, shape, *, key=None):
        return {"a": jnp.zeros(2), "b": jnp.zeros(3)}

    def step(self, state, inp, dt):
        new = {"a": state["a"] + 1.0, "b": state["b"] + 2.0}
        return new, {"a": (new["a"] % 3 == 0).astype(jnp.float32), "b": jnp.ones(3)}


def test_input_kinds_agree():
    m = Echo()
    s = m.init_state(3)
    x = jnp.array([1.0, 2.0, -1.0])
    _, r_const = nj.simulate(m, s, x, dt=0.5, n_steps=4, record=("last",))
    _, r_series = nj.simulate(m, s, jnp.tile(x, (4, 1)), dt=0.5, record=("last",))
    _, r_fn = nj.simulate(m, s, lambda t, i: x, dt=0.5, n_steps=4, record=("last",))
    for r in (r_const, r_series, r_fn):
        np.testing.assert_array_equal(np.asarray(r.last), np.tile(np.asarray(x), (4, 1)))
    _, r_none = nj.simulate(m, s, None, dt=0.5, n_steps=4, record=("last",))
    assert float(jnp.abs(r_none.last).sum()) == 0.0


def test_function_input_sees_start_time_and_index():
    m = Echo()
    _, rec = nj.simulate(
        m,
        m.init_state(2),
        lambda t, i: jnp.stack([t, i.astype(t.dtype)]),
        dt=0.25,
        n_steps=6,
        record=("last",),
    )
    np.testing.assert_allclose(np.asarray(rec.last[:, 0]), 0.25 * np.arange(6))
    np.testing.assert_allclose(np.asarray(rec.last[:, 1]), np.arange(6))
    # Recording times are the ends of the steps.
    np.testing.assert_allclose(np.asarray(rec.t), 0.25 * np.arange(1, 7))


def test_time_series_rows_are_steps():
    m = Echo()
    series = jnp.arange(10.0).reshape(5, 2)
    final, rec = nj.simulate(m, m.init_state(2), series, dt=1.0, record=("last", "v"))
    np.testing.assert_array_equal(np.asarray(rec.last), np.asarray(series))
    np.testing.assert_array_equal(np.asarray(final["v"]), np.asarray(series.sum(0)))
    assert rec.spikes.dtype == jnp.bool_ and rec.spikes.shape == (5, 2)


def test_record_every_subsamples_fields_and_counts_spikes():
    m = Echo()
    pattern = (jnp.arange(24.0) % 3 == 0).astype(jnp.float32).reshape(12, 2)  # some steps spike
    _, full = nj.simulate(m, m.init_state(2), pattern, dt=0.1, record=("v",))
    _, sub = nj.simulate(m, m.init_state(2), pattern, dt=0.1, record=("v",), record_every=4)
    np.testing.assert_array_equal(np.asarray(sub.v), np.asarray(full.v)[3::4])
    counts = np.asarray(full.spikes).reshape(3, 4, 2).sum(1)
    np.testing.assert_array_equal(np.asarray(sub.spikes), counts)
    assert sub.spikes.dtype == jnp.uint8
    np.testing.assert_allclose(np.asarray(sub.t), [0.4, 0.8, 1.2], rtol=1e-6)
    # Chunked with record_every gives the same.
    _, ch = nj.simulate(
        m, m.init_state(2), pattern, dt=0.1, record=("v",), record_every=4, chunk_size=8
    )
    np.testing.assert_array_equal(ch.v, np.asarray(sub.v))
    np.testing.assert_array_equal(ch.spikes, np.asarray(sub.spikes))


def test_record_function_and_pytree_outputs():
    _, rec = nj.simulate(
        TwoPops(),
        TwoPops().init_state(0),
        None,
        dt=1.0,
        n_steps=6,
        record=lambda st, out: {"sum_a": st["a"].sum(), "b0": st["b"][0]},
    )
    np.testing.assert_array_equal(np.asarray(rec.sum_a), 2.0 * np.arange(1, 7))
    np.testing.assert_array_equal(np.asarray(rec.values["b0"]), 2.0 * np.arange(1, 7))
    assert set(rec.spikes) == {"a", "b"}
    assert rec.spikes["a"].dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(rec.spikes["a"][:, 0]), np.arange(1, 7) % 3 == 0)
    with pytest.raises(AttributeError, match="Recording has no attribute 'w'"):
        _ = rec.w


def test_float_spikes_keep_float_outputs_for_gradients():
    lif = nj.LIF()
    floats = nj.Record(spikes="float")
    _, rec = nj.simulate(lif, lif.init_state(2), 20.0, dt=0.1, n_steps=100, record=floats)
    assert rec.spikes.dtype == jnp.float32
    g = jax.grad(
        lambda i: nj.simulate(lif, lif.init_state(2), i, dt=0.1, n_steps=100, record=floats)[
            1
        ].spikes.sum()
    )(jnp.array([20.0, 30.0]))
    assert np.all(np.asarray(g) > 0)


def test_reproducible_and_jittable():
    lif = nj.LIF(t_ref=1.0)
    state = lif.init_state(50, key=jax.random.key(3))
    a = nj.simulate(lif, state, 18.0, dt=0.1, n_steps=300, record=("v",))
    b = nj.simulate(lif, state, 18.0, dt=0.1, n_steps=300, record=("v",))
    chex.assert_trees_all_equal(a, b)
    jitted = jax.jit(lambda s: nj.simulate(lif, s, 18.0, dt=0.1, n_steps=300, record=("v",)))
    c = jitted(state)
    np.testing.assert_array_equal(np.asarray(c[1].spikes), np.asarray(a[1].spikes))


def test_progress_bar_reports_time_and_speed(capsys):
    lif = nj.LIF()
    _, plain = nj.simulate(lif, lif.init_state(4), 20.0, dt=0.1, n_steps=200)
    _, rec = nj.simulate(lif, lif.init_state(4), 20.0, dt=0.1, n_steps=200, progress=True)
    err = capsys.readouterr().err
    assert "steps/s" in err and "t=20.0 ms" in err
    # progress without chunk_size keeps the recording on the device and identical.
    assert isinstance(rec.spikes, jax.Array)
    np.testing.assert_array_equal(np.asarray(rec.spikes), np.asarray(plain.spikes))


def test_check_names_first_nonfinite_step_and_field():
    lif = nj.LIF()
    bad = lambda t, i: jnp.where(i >= 37, jnp.nan, 1.0)  # noqa: E731
    with pytest.raises(
        FloatingPointError, match=r"field 'v' became non-finite at step 37 \(t = 3.7"
    ):
        nj.simulate(lif, lif.init_state(3), bad, dt=0.1, n_steps=100, check=True)
    # Off by default: the run goes to the end, and the final state's check warns.
    with pytest.warns(RuntimeWarning, match=r"final state holds NaN or infinity in .*'v'"):
        final, _ = nj.simulate(lif, lif.init_state(3), bad, dt=0.1, n_steps=100)
    assert np.all(np.isnan(np.asarray(final.v)))
    # Inside the caller's jit the guard still stops the run and names the field.
    f = jax.jit(
        lambda i: (
            nj.simulate(
                lif,
                lif.init_state(3),
                lambda t, k: jnp.where(k >= 37, jnp.nan, i),
                dt=0.1,
                n_steps=100,
                check=True,
            )[0].v
        )
    )
    with pytest.raises(Exception, match="state field 'v' became non-finite"):
        jax.block_until_ready(f(1.0))


def test_chunking_inside_jit_is_rejected():
    lif = nj.LIF()
    f = jax.jit(lambda s: nj.simulate(lif, s, 20.0, dt=0.1, n_steps=10, chunk_size=5)[0])
    with pytest.raises(ValueError, match="chunk_size and progress move data to the host"):
        f(lif.init_state(2))


def test_batch_block_equals_one_block_for_a_network():
    net, state = nj.models.coba(jax.random.key(2), n_exc=400, n_inh=100, p=0.05, batch=6)
    final_a, rec_a = nj.simulate(net, state, dt=0.1, n_steps=500, record=lambda s, o: s.step)
    with pytest.raises(ValueError, match="trial axis right after time"):
        nj.simulate(
            net,
            state,
            dt=0.1,
            n_steps=500,
            record=lambda s, o: s.step,
            run=nj.Execution(batch_block=2),
        )
    final_a, rec_a = nj.simulate(net, state, dt=0.1, n_steps=500)
    final_b, rec_b = nj.simulate(net, state, dt=0.1, n_steps=500, run=nj.Execution(batch_block=2))
    assert rec_a.spikes["E"].sum() > 100
    for pop in ("E", "I"):
        np.testing.assert_array_equal(rec_a.spikes[pop], rec_b.spikes[pop])
        np.testing.assert_array_equal(final_a.populations[pop].v, final_b.populations[pop].v)
    assert int(final_b.step) == 500
    np.testing.assert_array_equal(rec_a.t, rec_b.t)


def test_batch_block_gives_blocks_independent_random_numbers():
    src = nj.PoissonSource(200.0)
    net = nj.Network({"s": (src, 50)})
    state = net.init_state(jax.random.key(0), batch=4)
    _, rec = nj.simulate(net, state, dt=0.1, n_steps=200, run=nj.Execution(batch_block=2))
    spikes = np.asarray(rec.spikes["s"])
    assert spikes.shape == (200, 4, 50)
    # Trials within a block differ (one key, a batch of draws), and so do the blocks.
    assert not np.array_equal(spikes[:, 0], spikes[:, 1])
    assert not np.array_equal(spikes[:, :2], spikes[:, 2:])


def test_batch_block_errors():
    lif = nj.LIF()
    blocks = nj.Execution(batch_block=2)
    with pytest.raises(ValueError, match="must divide the batch size 5"):
        nj.simulate(lif, lif.init_state((5, 3)), 1.0, dt=0.1, n_steps=10, run=blocks)
    with pytest.raises(ValueError, match=r"spikes='ids' \(nj.Record\) cannot be combined with"):
        nj.simulate(
            lif,
            lif.init_state((4, 3)),
            1.0,
            dt=0.1,
            n_steps=10,
            run=blocks,
            record=nj.Record(spikes="ids"),
        )
    with pytest.raises(TypeError, match="nj.Execution: batch_block must be a positive int"):
        nj.Execution(batch_block=1.5)


# What `FusedEcho.fused_run` was asked, in order. `simulate` asks while tracing a chunk, so
# each configuration is asked once per process.
_FUSED_CALLS: list = []


class FusedEcho(Echo):
    """`Echo` with a fused run that serves constant inputs recorded as a bool raster: all
    steps at once, as the scan over `step` would give them."""

    def fused_run(self, state, inputs, dt, n_rec, record_every, **options):
        _FUSED_CALLS.append((options["kind"], n_rec, record_every))
        if options["kind"] != "const" or options["record"] is not None or record_every != 1:
            return None
        inp = jnp.broadcast_to(jnp.asarray(inputs, jnp.float32), state["v"].shape)
        final = {"v": state["v"] + n_rec * (self.gain * inp * dt), "last": inp}
        return final, jnp.broadcast_to(inp > 0, (n_rec, *inp.shape))


def test_simulate_asks_the_model_for_a_fused_run_and_falls_back_on_none():
    _FUSED_CALLS.clear()
    m = FusedEcho()
    s = m.init_state(3)
    x = jnp.array([1.0, 2.0, -1.0])
    fused_final, fused = nj.simulate(m, s, x, dt=0.5, n_steps=4)
    scan_final, scan = nj.simulate(Echo(), s, x, dt=0.5, n_steps=4)
    assert _FUSED_CALLS == [("const", 4, 1)]
    chex.assert_trees_all_equal(fused_final, scan_final)
    chex.assert_trees_all_equal(fused.spikes, scan.spikes)
    # Declined (a time series; a recorded field): the scan over `step` runs.
    _FUSED_CALLS.clear()
    final, rec = nj.simulate(m, s, jnp.tile(x, (4, 1)), dt=0.5)
    nj.simulate(m, s, x, dt=0.5, n_steps=4, record=("last",))
    assert [c[0] for c in _FUSED_CALLS] == ["series", "const"]
    chex.assert_trees_all_equal(final, scan_final)
    chex.assert_trees_all_equal(rec.spikes, scan.spikes)


def test_the_driver_imports_no_model_module():
    """`simulate` asks models what they can do (`fused_run`); it names none of them."""
    source = Path(nj.__file__).with_name("_simulate.py").read_text(encoding="utf-8")
    imported = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            imported.append(node.module or "")
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
    assert imported and not [m for m in imported if "neurons" in m or "_fused" in m], imported


# -- recording the state fields of a network's populations -------------------------------------


def _small_coba():
    return nj.models.coba(jax.random.key(0), n_exc=80, n_inh=20, p=0.1)


def test_network_records_population_fields_by_name():
    """`record={"E": ("v",), "I": ("v",)}` and `record=("v",)` give `rec.v[pop]`, time first,
    equal to what a record function reads from the state."""
    net, st = _small_coba()
    _, ref = nj.simulate(
        net, st, dt=0.1, n_steps=40, record=lambda s, o: {p: s.populations[p].v for p in "EI"}
    )
    _, by_pop = nj.simulate(net, st, dt=0.1, n_steps=40, record={"E": ("v",), "I": ("v",)})
    _, by_name = nj.simulate(net, st, dt=0.1, n_steps=40, record=("v",))
    for rec in (by_pop, by_name):
        assert sorted(rec.v) == ["E", "I"]
        assert rec.v["E"].shape == (40, 80) and rec.v["I"].shape == (40, 20)
        for p in "EI":
            np.testing.assert_array_equal(rec.v[p], ref.values[p])
    assert not bool(jnp.all(ref.values["E"][0] == ref.values["E"][-1]))  # v does move


def test_network_records_neuron_subsets_chunked_and_batched():
    net, st = _small_coba()
    _, full = nj.simulate(net, st, dt=0.1, n_steps=40, record={"E": ("v",), "I": ("v",)})
    spec = {"E": {"v": slice(0, 10)}, "I": {"v": [3, 1], "refractory": 5}}
    _, sub = nj.simulate(net, st, dt=0.1, n_steps=40, record=spec, chunk_size=20, record_every=4)
    np.testing.assert_array_equal(sub.v["E"], np.asarray(full.v["E"])[3::4, :10])
    np.testing.assert_array_equal(sub.v["I"], np.asarray(full.v["I"])[3::4][:, [3, 1]])
    assert sub.refractory["I"].shape == (10, 1)
    batch = net.init_state(jax.random.key(1), batch=3)
    _, rec = nj.simulate(net, batch, dt=0.1, n_steps=10, record={"E": {"v": slice(70, None)}})
    assert rec.v["E"].shape == (10, 3, 10)


@pytest.mark.parametrize(
    "record, match",
    [
        ({"X": ("v",)}, r"record names population 'X'; the populations are \['E', 'I'\]"),
        ({"E": ("q",)}, r"record\['E'\] names unknown state field 'q'; population 'E' has"),
        ({"E": {"v": slice(90, 95)}}, r"the slice slice\(90, 95, None\) selects no neuron of 80"),
        ({"E": {"v": [100]}}, r"indices must lie in \[-80, 80\) for a population of 80"),
        ({"E": 3}, r"record\['E'\] must be a tuple of field names or a dict"),
        ({"E": {"v": [1.5]}}, r"a neuron subset must be a slice, an int or a non-empty"),
        (("q",), r"record names 'q', a field of no population"),
    ],
)
def test_network_record_errors_name_the_population_and_field(record, match):
    net, st = _small_coba()
    with pytest.raises((ValueError, TypeError), match=match):
        nj.simulate(net, st, dt=0.1, n_steps=5, record=record)


def test_record_dict_on_a_single_population_is_refused():
    lif = nj.LIF()
    with pytest.raises(TypeError, match=r"record as a dict \{population: fields\} needs a network"):
        nj.simulate(lif, lif.init_state(3), 1.0, dt=0.1, n_steps=5, record={"E": ("v",)})


# -- the clock of a continued run -------------------------------------------------------------


def test_split_run_with_time_dependent_input_equals_one_run():
    """A LIF population under `I(t) = 1 + sin(t / 5 ms)` run 300 steps at once, and 120 + 180
    with the second run given `start=120`: bit-identical voltages, spikes and `rec.t`."""
    lif = nj.LIF(tau_m=10.0, r_m=10.0, v_th=-55.0)
    drive = lambda t_ms, i: 1.0 + jnp.sin(t_ms / 5.0)  # noqa: E731
    st = lif.init_state(4)
    _, one = nj.simulate(lif, st, drive, dt=0.1, n_steps=300, record=("v",))
    mid, a = nj.simulate(lif, st, drive, dt=0.1, n_steps=120, record=("v",))
    _, b = nj.simulate(lif, mid, drive, dt=0.1, n_steps=180, record=("v",), start=120)
    np.testing.assert_array_equal(np.concatenate([a.v, b.v]), one.v)
    np.testing.assert_array_equal(np.concatenate([a.spikes, b.spikes]), one.spikes)
    np.testing.assert_array_equal(np.concatenate([a.t, b.t]), one.t)
    assert int(one.spikes.sum()) > 0
    # Without start the input restarts at t = 0: a different run.
    _, restarted = nj.simulate(lif, mid, drive, dt=0.1, n_steps=180, record=("v",))
    assert not np.array_equal(restarted.v, b.v)


def test_network_run_continues_its_clock_with_poisson_sources():
    """A network counts its steps: a run continued from a final state (chunked, with Poisson
    sources and a time-dependent input of the network) equals one run, `rec.t` included."""
    k1, k2 = jax.random.split(jax.random.key(2))
    conn = nj.connect.fixed_prob(k1, 50, 30, 0.2, weight=2.0)
    net = nj.Network(
        populations={"src": (nj.PoissonSource(rate=40.0), 50), "n": (nj.LIF(r_m=10.0), 30)},
        projections=[nj.Projection("src", "n", conn, synapse=nj.Exponential(5.0))],
        inputs={"n": lambda t: 1.2 + jnp.sin(t / 7.0)},
    )
    st = net.init_state(k2)
    drive = {"n": lambda t_ms, i: 0.3 * jnp.cos(t_ms / 3.0)}
    ext = lambda t_ms, i: {"n": drive["n"](t_ms, i)}  # noqa: E731
    _, one = nj.simulate(net, st, ext, dt=0.1, n_steps=400, record={"n": ("v",)})
    mid, a = nj.simulate(net, st, ext, dt=0.1, n_steps=150, record={"n": ("v",)})
    _, b = nj.simulate(net, mid, ext, dt=0.1, n_steps=250, record={"n": ("v",)}, chunk_size=50)
    np.testing.assert_array_equal(np.concatenate([a.v["n"], b.v["n"]]), one.v["n"])
    for pop in ("src", "n"):
        np.testing.assert_array_equal(
            np.concatenate([a.spikes[pop], b.spikes[pop]]), one.spikes[pop]
        )
    # A chunked run keeps its times on the host in float64; the float32 times are the same.
    np.testing.assert_array_equal(np.concatenate([a.t, np.float32(b.t)]), one.t)
    assert float(b.t[0]) == pytest.approx(15.1)
    _, c = nj.simulate(net, mid, ext, dt=0.1, n_steps=250, record={"n": ("v",)})
    np.testing.assert_array_equal(np.concatenate([a.t, c.t]), one.t)
    np.testing.assert_array_equal(c.v["n"], b.v["n"])


@pytest.mark.parametrize(
    "start, error, match",
    [
        (-1, ValueError, "start must be a non-negative int, got -1"),
        (True, TypeError, "start must be a non-negative int, got True"),
        (1.5, TypeError, "start must be a non-negative int, got 1.5"),
        (
            jnp.zeros(2, jnp.int32),
            ValueError,
            r"start must be a scalar step index, got shape \(2,\)",
        ),
    ],
)
def test_bad_start_is_refused(start, error, match):
    lif = nj.LIF()
    with pytest.raises(error, match=match):
        nj.simulate(lif, lif.init_state(2), 1.0, dt=0.1, n_steps=5, start=start)


def test_a_recording_that_cannot_fit_is_refused_before_compiling(monkeypatch):
    """The recording's size is estimated before anything is compiled: 10^6 records of a
    10^6-neuron population's v and spikes (5 TB) are refused, naming the size and what
    shrinks it; with 1 GB of memory, 2 x 10^5 records of 4000 neurons' spikes (0.8 GB) pass
    the check and 4 x 10^5 (1.6 GB) do not."""
    from neurojax import _simulate

    lif = nj.LIF()
    with pytest.raises(ValueError, match=r"would take 5e\+03 GB \(1000000 records of 5000000"):
        nj.simulate(lif, lif.init_state(10**6), 1.0, dt=0.1, n_steps=10**6, record=("v",))
    monkeypatch.setattr(_simulate, "_available_bytes", lambda on_host: 10**9)
    traced = []
    monkeypatch.setattr(_simulate, "_run_chunk_jit", lambda *a, **k: traced.append(1))
    with pytest.raises(
        ValueError, match=r"1.6 GB .* more than the 1 GB of device memory.*record_every"
    ):
        nj.simulate(lif, lif.init_state(4000), 1.0, dt=0.1, n_steps=400_000)
    assert not traced  # refused before any compiled chunk ran
    with pytest.raises(ValueError, match=r"of host memory available"):
        nj.simulate(lif, lif.init_state(4000), 1.0, dt=0.1, n_steps=400_000, chunk_size=1000)
    with pytest.raises(TypeError):  # passes the size check, then reaches the (patched) run
        nj.simulate(lif, lif.init_state(4000), 1.0, dt=0.1, n_steps=200_000)
    assert traced


def test_the_clock_of_a_traced_network_state():
    """Under jit the network's step count is traced: the times and the input function's
    clock still continue from it."""
    net, st = _small_coba()
    mid, _ = nj.simulate(net, st, dt=0.1, n_steps=30)
    ext = lambda t_ms, i: {"E": 0.5 * jnp.sin(t_ms), "I": 0.0 * t_ms}  # noqa: E731
    want_final, want = nj.simulate(net, mid, ext, dt=0.1, n_steps=20)
    got_final, got = jax.jit(lambda s: nj.simulate(net, s, ext, dt=0.1, n_steps=20))(mid)
    np.testing.assert_allclose(got.t, want.t, rtol=1e-6)
    assert float(got.t[0]) == pytest.approx(3.1, rel=1e-6)
    np.testing.assert_array_equal(got_final.populations["E"].v, want_final.populations["E"].v)


class _DtypeChanging(nj.NeuronModel):
    """A model whose step returns its voltage in float16: the model's fault, not the input's."""

    tau: float = 10.0

    def init_state(self, shape, key=None):
        z = jnp.zeros(shape, jnp.float32)
        return nj.LIFState(v=z, refractory=z)

    def step(self, state, current, dt):
        v = state.v + dt * (current - state.v) / self.tau
        new = nj.LIFState(v=v.astype(jnp.float16), refractory=state.refractory)
        return new, (v > 1).astype(jnp.float32)


class _PerNeuronWeight(_DtypeChanging):
    """A model with a per-neuron parameter that may have the wrong length."""

    w: jax.Array = eqx.field(default_factory=lambda: jnp.ones(3))

    def step(self, state, current, dt):
        v = state.v + dt * (current * self.w - state.v) / self.tau
        return nj.LIFState(v=v, refractory=state.refractory), (v > 1).astype(jnp.float32)


def test_errors_blame_the_model_not_the_inputs():
    # Before: both read "inputs of shapes () fit the state ... neither as a constant nor as a
    # time series", and inside a network "the model cannot step without inputs".
    bad = _DtypeChanging()
    with pytest.raises(
        ValueError,
        match=r"the model cannot run: _DtypeChanging.step, given its own state, changes it: the "
        r"step turned the state field 'v' of shape \(4,\) float32 into \(4,\) float16",
    ):
        nj.simulate(bad, bad.init_state(4), 1.0, dt=0.1, n_steps=5)
    wrong = _PerNeuronWeight()
    with pytest.raises(
        ValueError,
        match=r"the model cannot run: _PerNeuronWeight: parameter w has shape \(3,\), which does "
        r"not broadcast to the population's 4 neurons",
    ):
        nj.simulate(wrong, wrong.init_state(4), 1.0, dt=0.1, n_steps=5)
    net = nj.Network({"A": (wrong, 4)}, inputs={"A": 1.0})
    with pytest.raises(
        ValueError, match=r"the model cannot run: population 'A' _PerNeuronWeight: parameter w"
    ):
        nj.simulate(net, net.init_state(), dt=0.1, n_steps=5)
    # The right length runs; a wrong input to a sound model still blames the inputs.
    right = _PerNeuronWeight(w=jnp.ones(4))
    nj.simulate(right, right.init_state(4), 1.0, dt=0.1, n_steps=5)
    lif = nj.LIF()
    with pytest.raises(ValueError, match=r"simulate: inputs of shapes \(3,\) fit the state"):
        nj.simulate(lif, lif.init_state(4), jnp.ones(3), dt=0.1, n_steps=5)
