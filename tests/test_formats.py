"""Export of recordings to SONATA, NWB and Neo (`nj.io.to_sonata`, `from_sonata`, `to_nwb`,
`to_neo`).

Every file is read back with the library that defines the format (h5py for SONATA, pynwb's
`NWBHDF5IO` for NWB, neo's objects for Neo), never with neurojax, and compared with the
recording's raster through `nj.io.spike_table`. Elephant's `mean_firing_rate` and
`cv(isi(...))` on the Neo trains must equal `nj.analysis.firing_rates` and `cv_isi`: the
rates to 1e-12 relative (the same count divided by the same duration, computed in a
different order), the CVs to 1e-9 relative (Elephant works on float64 times in ms, neurojax
on integer row differences).
"""

import datetime
import json
import sys

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import neurojax as nj

h5py = pytest.importorskip("h5py")
pynwb = pytest.importorskip("pynwb")
neo = pytest.importorskip("neo")
elephant_statistics = pytest.importorskip("elephant.statistics")
pq = pytest.importorskip("quantities")

DT = 0.1
N_STEPS = 3000
# The `sorting` enumeration of the SONATA spike-file specification.
SORTING_ENUM = {"none": 0, "by_id": 1, "by_time": 2}

# Elephant 1.2 still passes `copy=` to quantities 0.16, which warns (the suite turns warnings
# into errors); the warning is about Elephant's call, not about these tests.
pytestmark = pytest.mark.filterwarnings("ignore:The 'copy' argument in Quantity is deprecated")


@pytest.fixture(scope="module")
def network_run():
    net, state = nj.models.cuba(jr.key(0), n_exc=40, n_inh=10, p=0.1)
    _, rec = nj.simulate(net, state, dt=DT, n_steps=N_STEPS, record={"E": ("v",), "I": ("v",)})
    assert int(rec.spikes["E"].sum()) > 100  # active enough for rates and CVs
    return net, rec


@pytest.fixture(scope="module")
def batched_run():
    """A LIF population of 2 x 3 trials x 4 neurons driven by noisy currents."""
    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0, t_ref=2.0)
    current = 0.4 + 0.3 * jr.normal(jr.key(1), (N_STEPS, 2, 3, 4))
    _, rec = nj.simulate(lif, lif.init_state((2, 3, 4)), current, dt=DT, record=("v",))
    assert np.asarray(rec.spikes).sum(axis=0).min() >= 3
    return lif, rec


def _expected(raster, t):
    """(times [ms], ids) by time then id, from the raster, through nj.io.spike_table."""
    table = nj.io.spike_table(np.asarray(raster), t=t)
    return table["time_ms"], table["neuron"]


# ----------------------------------------------------------------------------- SONATA


def test_sonata_layout_read_with_h5py(network_run, tmp_path):
    _, rec = network_run
    path = tmp_path / "spikes.h5"
    nj.io.to_sonata(rec, path)
    with h5py.File(path, "r") as f:
        assert f.attrs["magic"] == 0x0A7A
        assert list(f.attrs["version"]) == [0, 1]
        assert sorted(f["spikes"]) == ["E", "I"]
        for name in ("E", "I"):
            group = f["spikes"][name]
            # SONATA's enum (uint8: none 0, by_id 1, by_time 2), as the spec defines it.
            assert h5py.check_enum_dtype(group.attrs.get_id("sorting").dtype) == SORTING_ENUM
            assert group.attrs["sorting"] == 2
            assert group["timestamps"].attrs["units"] == "ms"
            assert group["timestamps"].dtype == np.float64
            assert group["node_ids"].dtype == np.uint64
            times, ids = _expected(rec.spikes[name], rec.t)
            np.testing.assert_array_equal(group["timestamps"][()], times)
            np.testing.assert_array_equal(group["node_ids"][()], ids)
    back = nj.io.from_sonata(path)
    assert list(back) == ["E", "I"]
    for name in ("E", "I"):
        times, ids = _expected(rec.spikes[name], rec.t)
        np.testing.assert_array_equal(back[name]["timestamps"], times)
        np.testing.assert_array_equal(back[name]["node_ids"], ids)
        assert back[name]["sorting"] == "by_time"


def test_sonata_sorting_by_id_and_trials(batched_run, tmp_path):
    _, rec = batched_run
    path = tmp_path / "trial.h5"
    nj.io.to_sonata(rec, path, trial=(1, 2), population="lif", sorting="by_id")
    with h5py.File(path, "r") as f:
        group = f["spikes/lif"]
        assert group.attrs["sorting"] == SORTING_ENUM["by_id"]
        times, ids = group["timestamps"][()], group["node_ids"][()]
    want_t, want_i = _expected(np.asarray(rec.spikes)[:, 1, 2], rec.t)
    order = np.lexsort((want_t, want_i))
    np.testing.assert_array_equal(ids, want_i[order])
    np.testing.assert_array_equal(times, want_t[order])
    assert np.all(np.diff(ids.astype(np.int64)) >= 0)


def test_sonata_read_with_libsonata(network_run, tmp_path):
    """libsonata (what NEURON and BBP tools read SONATA with) reads the file: populations,
    sorting, and every (id, time) pair equal to the raster's."""
    libsonata = pytest.importorskip("libsonata")
    _, rec = network_run
    for sorting in ("by_time", "by_id", "none"):
        path = tmp_path / f"{sorting}.h5"
        nj.io.to_sonata(rec, path, sorting=sorting)
        reader = libsonata.SpikeReader(str(path))
        assert sorted(reader.get_population_names()) == ["E", "I"]
        for name in ("E", "I"):
            population = reader[name]
            assert population.sorting == sorting
            assert population.time_units == "ms"
            times, ids = _expected(rec.spikes[name], rec.t)
            got = population.get()
            want = list(zip(ids.tolist(), times.tolist(), strict=True))
            assert sorted(got) == sorted(want) and len(got) == times.size > 0


def test_sonata_reads_sorting_as_enum_or_string(tmp_path):
    """`from_sonata` reads the spec's enum (libsonata, BMTK) and the string form (neurojax
    before the enum); an unknown code or name is refused naming the file, population, field."""
    enum = h5py.enum_dtype(SORTING_ENUM, basetype=np.uint8)
    cases = {
        "enum": ("by_id", dict(data=1, dtype=enum)),
        "string": ("by_time", dict(data="by_time", dtype=h5py.string_dtype())),
        "bytes": ("none", dict(data=np.bytes_(b"none"))),
    }
    for label, (want, attr) in cases.items():
        path = tmp_path / f"{label}.h5"
        with h5py.File(path, "w") as f:
            group = f.create_group("spikes/E")
            group.attrs.create("sorting", **attr)
            group.create_dataset("timestamps", data=[0.5])
            group.create_dataset("node_ids", data=np.array([2], np.uint64))
        assert nj.io.from_sonata(path)["E"]["sorting"] == want
    for label, attr, shown in (
        ("code", dict(data=7, dtype=np.uint8), "'<code 7>'"),
        ("name", dict(data="by_value", dtype=h5py.string_dtype()), "'by_value'"),
    ):
        path = tmp_path / f"bad_{label}.h5"
        with h5py.File(path, "w") as f:
            group = f.create_group("spikes/E")
            group.attrs.create("sorting", **attr)
            group.create_dataset("timestamps", data=[0.5])
            group.create_dataset("node_ids", data=np.array([2], np.uint64))
        with pytest.raises(
            ValueError,
            match=rf"from_sonata: '.*bad_{label}.h5', population /spikes/E: attribute sorting "
            rf"must be one of \('by_time', 'by_id', 'none'\), got {shown}",
        ):
            nj.io.from_sonata(path)


@pytest.fixture(scope="module")
def microcircuit_run():
    """A scale-0.01 microcircuit with its Poisson `background` (several spikes per step)."""
    net, state = nj.models.microcircuit(jr.key(0), scale=0.01)
    _, rec = nj.simulate(net, state, dt=DT, n_steps=200)
    # The emitted counts, by the float outputs themselves (spikes="float"): a second path.
    _, raw = nj.simulate(net, state, dt=DT, n_steps=200, record=nj.Record(spikes="float"))
    return net, rec, raw


@pytest.mark.slow  # the microcircuit's build and two compilations: 40 s loaded
def test_recording_keeps_counts_of_a_multi_spike_source(microcircuit_run):
    """With the default spike_dtype="bool" a source of counts is recorded as counts: the
    recorded spikes equal the emitted ones, step by step, and more than one per step occurs."""
    net, rec, raw = microcircuit_run
    assert rec.sources == ("background",)
    background = np.asarray(rec.spikes["background"])
    emitted = np.asarray(raw.spikes["background"])
    assert background.dtype == np.uint8 and emitted.max() > 1
    np.testing.assert_array_equal(background, emitted)
    assert rec.spikes["L4E"].dtype == np.bool_  # neurons: 0/1, as before


def test_writers_leave_a_poisson_source_out_unless_asked(tmp_path):
    """A small network with a PoissonSource input: the default export holds the neurons
    only, populations="all" the source too, every spike of both."""
    net = nj.Network(
        {"ext": (nj.PoissonSource(200.0), 20), "E": (nj.LIF(), 10)},
        [nj.Projection("ext", "E", nj.connect.fixed_prob(jr.key(1), 20, 10, 0.5, weight=8.0))],
    )
    _, rec = nj.simulate(net, net.init_state(jr.key(2)), dt=DT, n_steps=500)
    assert rec.sources == ("ext",)
    n_ext, n_e = int(rec.spikes["ext"].sum()), int(rec.spikes["E"].sum())
    assert n_ext > 100 and n_e > 10
    nj.io.to_sonata(rec, tmp_path / "default.h5")
    assert list(nj.io.from_sonata(tmp_path / "default.h5")) == ["E"]
    nj.io.to_sonata(rec, tmp_path / "all.h5", populations="all")
    back = nj.io.from_sonata(tmp_path / "all.h5")
    assert [back[k]["node_ids"].size for k in ("E", "ext")] == [n_e, n_ext]
    assert [g.name for g in nj.io.to_neo(rec, dt=DT).groups] == ["E"]
    assert [g.name for g in nj.io.to_neo(rec, dt=DT, populations=["ext"]).groups] == ["ext"]
    nj.io.to_nwb(rec, tmp_path / "all.nwb", dt=DT, populations="all")
    with pynwb.NWBHDF5IO(str(tmp_path / "all.nwb"), "r") as io:
        units = io.read().units.to_dataframe()
    assert sorted(set(units["population"])) == ["E", "ext"]
    assert sum(len(x) for x in units["spike_times"]) == n_e + n_ext
    nj.io.save_recording(tmp_path / "default.npz", rec)
    with np.load(tmp_path / "default.npz") as data:
        assert sorted(data.files) == ["spikes/E", "t"]


def test_recording_keeps_counts_of_a_source_run_alone():
    """The source stepped alone, every step and in windows of record_every steps (the counts
    are added, not the steps with a spike), against its float outputs."""
    from neurojax.models._microcircuit import PoissonCounts

    source = PoissonCounts(levels=jnp.array([8000.0, 2000.0]), level=jnp.arange(40) % 2, n_terms=17)
    state = source.init_state(40, key=jr.key(3))
    for every in (1, 10):
        _, rec = nj.simulate(source, state, dt=DT, n_steps=300, record_every=every)
        _, raw = nj.simulate(
            source, state, dt=DT, n_steps=300, record=nj.Record(every=every, spikes="float")
        )
        assert rec.spikes.dtype == np.uint8 and np.asarray(raw.spikes).max() > 1
        np.testing.assert_array_equal(np.asarray(rec.spikes), np.asarray(raw.spikes))
    # The mean count per step is lambda = rate * dt: 0.8 and 0.2 (300 steps x 20 sources,
    # standard error about 0.012 and 0.006).
    per_step = np.asarray(rec.spikes, np.float64).sum(0) / 300
    np.testing.assert_allclose(
        [per_step[0::2].mean(), per_step[1::2].mean()], [0.8, 0.2], atol=0.05
    )


@pytest.mark.slow  # the microcircuit's build and two compilations: 40 s loaded
def test_exports_leave_inputs_out_unless_asked(microcircuit_run, tmp_path):
    """Every writer writes the neuron populations by default; populations="all" adds the
    Poisson background with every spike it emitted; a list chooses."""
    net, rec, raw = microcircuit_run
    neurons = [n for n in rec.spikes if n != "background"]
    nj.io.to_sonata(rec, tmp_path / "default.h5")
    with h5py.File(tmp_path / "default.h5", "r") as f:
        assert sorted(f["spikes"]) == sorted(neurons)
    nj.io.to_sonata(rec, tmp_path / "all.h5", populations="all")
    back = nj.io.from_sonata(tmp_path / "all.h5")
    assert sorted(back) == sorted(rec.spikes)
    emitted = int(np.asarray(raw.spikes["background"]).sum())
    assert back["background"]["node_ids"].size == emitted > 0
    counts = np.bincount(back["background"]["node_ids"], minlength=net.sizes["background"])
    np.testing.assert_array_equal(counts, np.asarray(raw.spikes["background"]).sum(0))
    nj.io.to_sonata(rec, tmp_path / "two.h5", populations=["L4I", "L4E"])
    assert list(nj.io.from_sonata(tmp_path / "two.h5")) == ["L4E", "L4I"]

    nj.io.to_nwb(rec, tmp_path / "default.nwb", dt=DT)
    with pynwb.NWBHDF5IO(str(tmp_path / "default.nwb"), "r") as io:
        pops = set(io.read().units.to_dataframe()["population"])
    assert pops == set(neurons)
    nj.io.to_nwb(rec, tmp_path / "bg.nwb", dt=DT, populations=["background"])
    with pynwb.NWBHDF5IO(str(tmp_path / "bg.nwb"), "r") as io:
        units = io.read().units.to_dataframe()
    assert sum(len(x) for x in units["spike_times"]) == emitted
    block = nj.io.to_neo(rec, dt=DT)
    assert [g.name for g in block.groups] == neurons
    block = nj.io.to_neo(rec, dt=DT, populations="all")
    assert sum(t.size for t in block.groups[-1].spiketrains) == emitted

    with pytest.raises(
        ValueError, match=r"to_sonata: populations names \['L9'\], which the recording does not"
    ):
        nj.io.to_sonata(rec, tmp_path / "x.h5", populations=["L4E", "L9"])
    with pytest.raises(TypeError, match=r"to_nwb: populations must be None .*got 3"):
        nj.io.to_nwb(rec, tmp_path / "x.nwb", dt=DT, populations=3)
    with pytest.raises(ValueError, match=r"to_neo: populations lists a name twice"):
        nj.io.to_neo(rec, dt=DT, populations=["L4E", "L4E"])
    only_bg = _with_spikes(rec, {"background": rec.spikes["background"]})
    with pytest.raises(ValueError, match=r"to_sonata: every population .* is an input"):
        nj.io.to_sonata(only_bg, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "x.nwb").exists()


@pytest.mark.slow  # the microcircuit's build and two compilations: 40 s loaded
def test_save_recording_leaves_inputs_out_unless_asked(microcircuit_run, tmp_path):
    _, rec, raw = microcircuit_run
    nj.io.save_recording(tmp_path / "default.npz", rec)
    with np.load(tmp_path / "default.npz") as data:
        assert "spikes/background" not in data.files and "spikes/L4E" in data.files
    nj.io.save_recording(tmp_path / "all.npz", rec, populations="all")
    with np.load(tmp_path / "all.npz") as data:
        np.testing.assert_array_equal(data["spikes/background"], raw.spikes["background"])
    with pytest.raises(ValueError, match=r"save_recording: populations names \['E'\]"):
        nj.io.save_recording(tmp_path / "x.npz", rec, populations=["E"])


def _with_spikes(rec, spikes):
    return nj.Recording(t=rec.t, spikes=spikes, values=rec.values, sources=rec.sources)


def test_sonata_reads_seconds_and_gids(tmp_path):
    """Files of other writers: ids named `gids`, times in seconds, no sorting attribute."""
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("spikes/cortex")
        group.create_dataset("timestamps", data=[0.001, 0.0025]).attrs["units"] = "s"
        group.create_dataset("gids", data=np.array([3, 1], np.uint64))
    back = nj.io.from_sonata(path)["cortex"]
    np.testing.assert_allclose(back["timestamps"], [1.0, 2.5], rtol=1e-15)
    np.testing.assert_array_equal(back["node_ids"], [3, 1])
    assert back["sorting"] == "none"


def test_sonata_errors(network_run, batched_run, tmp_path):
    _, rec = network_run
    _, batched = batched_run
    with pytest.raises(
        ValueError,
        match=r"to_sonata: sorting must be one of \('by_time', 'by_id', 'none'\), got 'time'",
    ):
        nj.io.to_sonata(rec, tmp_path / "x.h5", sorting="time")
    with pytest.raises(
        ValueError,
        match=r"to_sonata: population names a single population's recording; .* \['E', 'I'\] \(got population='X'\)",
    ):
        nj.io.to_sonata(rec, tmp_path / "x.h5", population="X")
    with pytest.raises(
        ValueError,
        match=r"to_sonata: the recording is batched \(batch shape \(2, 3\)\).*pass trial=<index>",
    ):
        nj.io.to_sonata(batched, tmp_path / "x.h5")
    with pytest.raises(
        ValueError,
        match=r"to_sonata: trial must be a tuple of ints indexing the batch shape \(2, 3\).*got \(2, 0\)",
    ):
        nj.io.to_sonata(batched, tmp_path / "x.h5", trial=(2, 0))
    with pytest.raises(
        ValueError, match=r"to_sonata: trial selects one trial .* no batch axes \(got trial=0\)"
    ):
        nj.io.to_sonata(rec, tmp_path / "x.h5", trial=0)
    with pytest.raises(
        TypeError, match=r"to_sonata: recording must be a neurojax Recording .*got dict"
    ):
        nj.io.to_sonata({"E": rec.spikes["E"]}, tmp_path / "x.h5")
    with pytest.raises(
        TypeError, match=r"to_sonata: path must be a non-empty str or pathlib.Path, got ''"
    ):
        nj.io.to_sonata(rec, "")
    with pytest.raises(
        FileNotFoundError, match=r"to_sonata: the directory .*missing.* does not exist"
    ):
        nj.io.to_sonata(rec, tmp_path / "missing" / "x.h5")
    assert not list(tmp_path.iterdir())  # nothing written by any failed call
    with pytest.raises(FileNotFoundError, match=r"from_sonata: no file at"):
        nj.io.from_sonata(tmp_path / "none.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match=r"from_sonata: .*text.h5' is not an HDF5 file"):
        nj.io.from_sonata(tmp_path / "text.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f.create_group("other")
    with pytest.raises(ValueError, match=r"from_sonata: .*empty.h5' has no /spikes group"):
        nj.io.from_sonata(tmp_path / "empty.h5")


# ----------------------------------------------------------------------------- NWB


def test_nwb_read_with_pynwb(network_run, tmp_path):
    net, rec = network_run
    path = tmp_path / "run.nwb"
    start = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    nj.io.to_nwb(rec, path, dt=DT, model=net, identifier="run-1", session_start_time=start)
    with pynwb.NWBHDF5IO(str(path), "r") as io:
        f = io.read()
        assert f.identifier == "run-1" and f.session_start_time == start
        units = f.units.to_dataframe()
        assert len(units) == 50
        assert list(units["population"]) == ["E"] * 40 + ["I"] * 10
        assert list(units["neuron"]) == list(range(40)) + list(range(10))
        for name, offset in (("E", 0), ("I", 40)):
            times, ids = _expected(rec.spikes[name], rec.t)
            for i in range(rec.spikes[name].shape[1]):
                got = np.asarray(units["spike_times"].iloc[offset + i])
                np.testing.assert_array_equal(got, times[ids == i] / 1000.0)
            trace = f.acquisition[f"v_{name}"]
            np.testing.assert_array_equal(trace.data[()], np.asarray(rec.v[name]))
            assert trace.unit == "mV"
            assert trace.rate == pytest.approx(1000.0 / DT, rel=1e-12)
            assert trace.starting_time == pytest.approx(DT / 1000.0, rel=1e-6)
        meta = json.loads(f.scratch["neurojax_model"].data)
    assert meta["type"] == "Network"
    assert meta["populations"] == {"E": 40, "I": 10}
    tau = meta["parameters"][".group_models[0].tau_m"]
    assert tau == float(np.asarray(net.group_models[0].tau_m).astype(str))


def test_nwb_one_trial_of_a_batch_with_parameters(batched_run, tmp_path):
    lif, rec = batched_run
    path = tmp_path / "trial.nwb"
    nj.io.to_nwb(rec, path, dt=DT, model=lif, trial=(0, 1), population="lif")
    with pynwb.NWBHDF5IO(str(path), "r") as io:
        f = io.read()
        units = f.units.to_dataframe()
        times, ids = _expected(np.asarray(rec.spikes)[:, 0, 1], rec.t)
        for i in range(4):
            np.testing.assert_array_equal(
                np.asarray(units["spike_times"].iloc[i]), times[ids == i] / 1000.0
            )
        np.testing.assert_array_equal(f.acquisition["v"].data[()], np.asarray(rec.v)[:, 0, 1])
        meta = json.loads(f.scratch["neurojax_model"].data)
    assert meta["type"] == "LIF"
    assert meta["parameters"][".tau_m"] == 10.0 and meta["parameters"][".t_ref"] == 2.0


def test_nwb_errors(network_run, batched_run, tmp_path):
    _, rec = network_run
    _, batched = batched_run
    with pytest.raises(
        ValueError, match=r"to_nwb: dt \* record_every = 0.2 ms does not match the recording"
    ):
        nj.io.to_nwb(rec, tmp_path / "x.nwb", dt=0.2)
    with pytest.raises(TypeError, match=r"to_nwb: record_every must be a positive int, got 1.0"):
        nj.io.to_nwb(rec, tmp_path / "x.nwb", dt=DT, record_every=1.0)
    with pytest.raises(ValueError, match=r"to_nwb: the recording is batched"):
        nj.io.to_nwb(batched, tmp_path / "x.nwb", dt=DT)
    with pytest.raises(TypeError, match=r"to_nwb: session_start_time must be a timezone-aware"):
        nj.io.to_nwb(
            rec, tmp_path / "x.nwb", dt=DT, session_start_time=datetime.datetime(2026, 1, 1)
        )
    with pytest.raises(TypeError, match=r"to_nwb: units must be a dict \{field: unit\}"):
        nj.io.to_nwb(rec, tmp_path / "x.nwb", dt=DT, units={"v": 1})
    with pytest.raises(TypeError, match=r"to_nwb: identifier must be a non-empty str, got ''"):
        nj.io.to_nwb(rec, tmp_path / "x.nwb", dt=DT, identifier="")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- Neo


def _elephant_rates_and_cvs(trains):
    rates = np.array([float(elephant_statistics.mean_firing_rate(s).rescale("Hz")) for s in trains])
    cvs = []
    for s in trains:
        cvs.append(
            float(elephant_statistics.cv(elephant_statistics.isi(s).magnitude))
            if len(s) >= 3
            else np.nan
        )
    return rates, np.array(cvs)


def test_neo_network_equals_nj_analysis(network_run):
    _, rec = network_run
    block = nj.io.to_neo(rec, dt=DT)
    assert isinstance(block, neo.Block) and len(block.segments) == 1
    seg = block.segments[0]
    assert len(seg.spiketrains) == 50
    assert [g.name for g in block.groups] == ["E", "I"]
    rates, cvs = _elephant_rates_and_cvs(seg.spiketrains)
    want_rates = nj.analysis.firing_rates(rec.spikes, dt=DT)
    want_cv = nj.analysis.cv_isi(rec.spikes, dt=DT)
    offset = 0
    for name in ("E", "I"):
        n = rec.spikes[name].shape[1]
        np.testing.assert_allclose(rates[offset : offset + n], want_rates[name], rtol=1e-12)
        # atol: a perfectly regular train has CV 0 in neurojax (integer intervals) and a few
        # 1e-16 in Elephant (float times).
        np.testing.assert_allclose(
            cvs[offset : offset + n], want_cv[name].cv, rtol=1e-9, atol=1e-12
        )
        assert want_cv[name].qualified.sum() >= 10
        offset += n
    train = seg.spiketrains[3]
    assert train.annotations == {"population": "E", "neuron": 3}
    assert float(train.t_start) == 0.0 and float(train.t_stop) == N_STEPS * DT
    times, ids = _expected(rec.spikes["E"], rec.t)
    np.testing.assert_array_equal(train.rescale("ms").magnitude, times[ids == 3])
    signals = {s.name: s for s in seg.analogsignals}
    assert sorted(signals) == ["v/E", "v/I"]
    assert signals["v/E"].units == pq.mV and signals["v/E"].shape == (N_STEPS, 40)
    np.testing.assert_array_equal(signals["v/E"].magnitude, np.asarray(rec.v["E"]))
    assert float(signals["v/E"].sampling_period.rescale("ms")) == pytest.approx(DT, rel=1e-12)
    assert signals["v/I"].annotations["population"] == "I"


def test_neo_batched_one_segment_per_trial(batched_run):
    _, rec = batched_run
    block = nj.io.to_neo(rec, dt=DT, population="lif", units={"v": "mV"}, name="sweep")
    assert block.name == "sweep" and len(block.segments) == 6
    spikes = np.asarray(rec.spikes)
    want_rates = nj.analysis.firing_rates(spikes, dt=DT)
    want_cv = nj.analysis.cv_isi(spikes, dt=DT).cv
    for seg, index in zip(block.segments, np.ndindex(2, 3), strict=True):
        assert seg.annotations["trial"] == index
        rates, cvs = _elephant_rates_and_cvs(seg.spiketrains)
        np.testing.assert_allclose(rates, want_rates[index], rtol=1e-12)
        np.testing.assert_allclose(cvs, want_cv[index], rtol=1e-9, atol=1e-12)
        (signal,) = seg.analogsignals
        np.testing.assert_array_equal(signal.magnitude, np.asarray(rec.v)[:, *index])
    assert len(block.groups[0].spiketrains) == 6 * 4


def test_neo_counts_and_split_runs():
    """`record_every > 1` (counts, one time per window) and a network run continued from its
    final state (its clock, and so `t`, does not start at 0)."""
    net, state = nj.models.cuba(jr.key(2), n_exc=40, n_inh=10, p=0.1)
    mid, _ = nj.simulate(net, state, dt=DT, n_steps=500)
    _, rec = nj.simulate(net, mid, dt=DT, n_steps=1000, record_every=5)
    block = nj.io.to_neo(rec, dt=DT, record_every=5)
    trains = block.segments[0].spiketrains
    assert float(trains[0].t_start) == 50.0 and float(trains[0].t_stop) == 150.0
    rates, _ = _elephant_rates_and_cvs(trains)
    want = nj.analysis.firing_rates(rec.spikes, dt=DT, record_every=5)
    np.testing.assert_allclose(rates, np.concatenate([want["E"], want["I"]]), rtol=1e-12)
    counts = np.concatenate([np.asarray(rec.spikes[k], np.int64).sum(axis=0) for k in "EI"])
    assert [len(s) for s in trains] == list(counts) and counts.sum() > 50


def test_neo_errors(network_run):
    _, rec = network_run
    with pytest.raises(ValueError, match=r"to_neo: dt must be"):
        nj.io.to_neo(rec, dt=-0.1)
    with pytest.raises(ValueError, match=r"to_neo: record_every must be a positive int, got 0"):
        nj.io.to_neo(rec, dt=DT, record_every=0)
    with pytest.raises(
        ValueError, match=r"to_neo: units\['v'\] = 'parsecs_per_bogon' is not a unit"
    ):
        nj.io.to_neo(rec, dt=DT, units={"v": "parsecs_per_bogon"})
    bad = nj.Recording(t=rec.t, spikes=rec.spikes, values={"w": jnp.zeros((5, 2))})
    with pytest.raises(
        ValueError,
        match=r"to_neo: recorded value 'w' has shape \(5, 2\); a trace must be time-major",
    ):
        nj.io.to_neo(bad, dt=DT)
    float_spikes = nj.Recording(
        t=rec.t, spikes={"E": rec.spikes["E"].astype(jnp.float32) * 0.5}, values={}
    )
    with pytest.raises(
        ValueError,
        match=r"to_neo: the spikes of population 'E' must be 0/1 or whole counts >= 0, got 0.5",
    ):
        nj.io.to_neo(float_spikes, dt=DT)


# ----------------------------------------------------------------------------- extras


@pytest.mark.parametrize(
    "call, module, extra",
    [
        (lambda rec, p: nj.io.to_sonata(rec, p / "x.h5"), "h5py", "sonata"),
        (lambda rec, p: nj.io.to_nwb(rec, p / "x.nwb", dt=DT), "pynwb", "nwb"),
        (lambda rec, p: nj.io.to_neo(rec, dt=DT), "neo", "neo"),
    ],
)
def test_missing_extra_names_it(network_run, tmp_path, monkeypatch, call, module, extra):
    _, rec = network_run
    # None in sys.modules makes any import of the module fail, as if it were not installed.
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        ImportError,
        match=rf"needs the optional package '{module}'.*pip install 'neurojax\[{extra}\]'",
    ):
        call(rec, tmp_path)
