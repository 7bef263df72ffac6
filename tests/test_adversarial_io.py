"""Adversarial files and targets for the readers and writers of neurojax (issue 42): bad
SONATA spike files, bad NIR files and graphs, damaged checkpoints, and writers pointed at a
missing folder or at a folder. Each case is refused with the documented exception, whose
message names the neurojax function, the file and, where there is one, the population or
node and the field, before any program is compiled (counted with JAX's monitoring events, as
in `tests/test_adversarial.py`), and nothing is written.

Where a case used to pass silently (issue 42: SONATA node ids 0.7 and 1.9 read as 0 and 1,
-3 as -3, NaN timestamps as NaN; a NIR input of shape [-2] accepted until called) the test
also checks the file is otherwise valid: the same file with the field fixed reads back."""

import re

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax import monitoring

import neurojax as nj

h5py = pytest.importorskip("h5py")
nir = pytest.importorskip("nir")

# ------------------------------------------------------------------ the compilation counter

_COMPILED: list[str] = []
_EAGER = re.compile(r"^jit\((\w+)\)$")


def _listener(name, duration, **kwargs):
    if name == "/jax/core/compile/backend_compile_duration":
        _COMPILED.append(str(kwargs.get("fun_name", "")))


monitoring.register_event_duration_secs_listener(_listener)


def _refused(exc, match, call):
    """`call()` raises `exc` matching `match`, and compiles no program while it runs (one
    eager operation, such as a constructor's conversion, is not a program)."""
    start = len(_COMPILED)
    with pytest.raises(exc, match=match):
        call()
    programs = [n for n in _COMPILED[start:] if _EAGER.match(n) is None]
    assert programs == [], f"compiled before the error: {programs}"


# ------------------------------------------------------------------ SONATA spike files


def _sonata(path, *, times=(0.5, 1.0, 1.5), ids=(0, 1, 2), ids_dtype=np.uint64, units="ms"):
    with h5py.File(path, "w") as f:
        group = f.create_group("spikes/E")
        ts = group.create_dataset("timestamps", data=np.asarray(times))
        if units is not None:
            ts.attrs["units"] = units
        group.create_dataset("node_ids", data=np.asarray(ids, dtype=ids_dtype))
    return path


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(ids=(0.7, 1.9, 2.0), ids_dtype=np.float64),
            r"node_ids must be a dataset of integers \(node ids\), got dtype float64",
        ),
        (dict(ids=(0, -3, 2), ids_dtype=np.int64), r"node_ids must be >= 0, got -3 at index 1"),
        (
            dict(ids=(0, 2**63 + 5, 1), ids_dtype=np.uint64),
            r"node_ids must be below 2\*\*63, got 9223372036854775813 at index 1",
        ),
        (dict(times=(0.5, np.nan, 1.5)), r"timestamps must be finite, got nan at index 1"),
        (dict(times=(0.5, 1.0, np.inf)), r"timestamps must be finite, got inf at index 2"),
        (
            dict(times=np.array([b"0.5", b"1.0", b"x"])),
            r"timestamps must be a dataset of real numbers, got dtype \|S3",
        ),
        (
            dict(times=(0.5, 1.0)),
            r"timestamps \(2,\) and node_ids \(3,\) must be 1-D of equal length",
        ),
        (dict(units="us"), r"timestamps has units 'us'; 'ms' or 's' allowed"),
    ],
)
def test_from_sonata_refuses_bad_data_naming_file_population_and_field(tmp_path, kwargs, match):
    path = _sonata(tmp_path / "bad.h5", **kwargs)
    _refused(
        ValueError,
        r"from_sonata: '.*bad\.h5', population /spikes/E: " + match,
        lambda: nj.io.from_sonata(path),
    )
    good = _sonata(tmp_path / "good.h5")
    np.testing.assert_array_equal(nj.io.from_sonata(good)["E"]["node_ids"], [0, 1, 2])


def test_from_sonata_refuses_string_timestamps_and_misplaced_datasets(tmp_path):
    path = tmp_path / "strings.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("spikes/E")
        group.create_dataset("timestamps", data=["0.5", "1.0"], dtype=h5py.string_dtype())
        group.create_dataset("node_ids", data=np.array([0, 1], np.uint64))
    _refused(
        ValueError,
        r"from_sonata: '.*strings\.h5', population /spikes/E: timestamps must be a dataset of "
        r"real numbers, got dtype object",
        lambda: nj.io.from_sonata(path),
    )
    path = tmp_path / "group.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("spikes/E")
        group.create_group("timestamps")
        group.create_dataset("node_ids", data=np.array([0, 1], np.uint64))
    _refused(
        ValueError,
        r"from_sonata: '.*group\.h5', population /spikes/E: timestamps must be a dataset, got "
        r"a group",
        lambda: nj.io.from_sonata(path),
    )
    path = tmp_path / "no_times.h5"
    with h5py.File(path, "w") as f:
        f.create_group("spikes/E").create_dataset("node_ids", data=np.array([0], np.uint64))
    _refused(
        ValueError,
        r"from_sonata: '.*no_times\.h5', population /spikes/E has node_ids but no timestamps",
        lambda: nj.io.from_sonata(path),
    )


def test_from_sonata_refuses_missing_folder_text_and_truncated_files(tmp_path):
    _refused(
        FileNotFoundError,
        r"from_sonata: no file at '.*none\.h5'",
        lambda: nj.io.from_sonata(tmp_path / "none.h5"),
    )
    _refused(
        IsADirectoryError,
        r"from_sonata: '.*' is a directory, expected a SONATA file",
        lambda: nj.io.from_sonata(tmp_path),
    )
    (tmp_path / "text.h5").write_text("timestamps,node_ids\n0.5,0\n")
    _refused(
        ValueError,
        r"from_sonata: '.*text\.h5' is not an HDF5 file, or is truncated or damaged",
        lambda: nj.io.from_sonata(tmp_path / "text.h5"),
    )
    good = _sonata(tmp_path / "good.h5", times=np.linspace(0, 100, 5000), ids=np.arange(5000))
    raw = good.read_bytes()
    (tmp_path / "cut.h5").write_bytes(raw[: len(raw) // 2])
    _refused(
        ValueError,
        r"from_sonata: '.*cut\.h5' is not an HDF5 file, or is truncated or damaged",
        lambda: nj.io.from_sonata(tmp_path / "cut.h5"),
    )


# ------------------------------------------------------------------ NIR files and graphs


def _graph(input_shape=(2,), edges=None):
    return nir.NIRGraph(
        nodes={
            "input": nir.Input(input_type=np.array(input_shape)),
            "node": nir.LIF(
                tau=np.full(2, 0.01, np.float32),
                r=np.ones(2, np.float32),
                v_leak=np.zeros(2, np.float32),
                v_threshold=np.ones(2, np.float32),
                v_reset=np.zeros(2, np.float32),
            ),
            "output": nir.Output(output_type=np.array([2])),
        },
        edges=[("input", "node"), ("node", "output")] if edges is None else edges,
        type_check=False,
    )


def test_from_nir_refuses_missing_folder_text_truncated_and_non_nir_files(tmp_path):
    _refused(
        FileNotFoundError,
        r"from_nir: no file at '.*none\.nir' \(graph\)",
        lambda: nj.nir.from_nir(tmp_path / "none.nir", dt=1e-3),
    )
    _refused(
        IsADirectoryError,
        r"from_nir: graph '.*' is a directory, expected a \.nir file",
        lambda: nj.nir.from_nir(str(tmp_path), dt=1e-3),
    )
    (tmp_path / "text.nir").write_text("input -> lif -> output")
    _refused(
        ValueError,
        r"from_nir: graph '.*text\.nir' is not an HDF5 file \(a \.nir file is HDF5",
        lambda: nj.nir.from_nir(tmp_path / "text.nir", dt=1e-3),
    )
    nir.write(tmp_path / "good.nir", _graph())
    raw = (tmp_path / "good.nir").read_bytes()
    (tmp_path / "cut.nir").write_bytes(raw[: len(raw) // 2])
    _refused(
        ValueError,
        r"from_nir: graph '.*cut\.nir' is not a readable NIR graph \(truncated, damaged or not "
        r"written by nir\.write\)",
        lambda: nj.nir.from_nir(tmp_path / "cut.nir", dt=1e-3),
    )
    _sonata(tmp_path / "spikes.nir")  # HDF5, but SONATA
    _refused(
        ValueError,
        r"from_nir: graph '.*spikes\.nir' is not a readable NIR graph",
        lambda: nj.nir.from_nir(tmp_path / "spikes.nir", dt=1e-3),
    )
    # The intact file reads.
    assert nj.nir.from_nir(tmp_path / "good.nir", dt=1e-3).nodes["node"].shape == (2,)


@pytest.mark.parametrize(
    "edges, match",
    [
        (["input->node", "node->output"], r"edge 0 of the graph must be a pair \(source, target\) "
         r"of node names, got 'input->node'"),
        ([("input", "node", "output")], r"edge 0 of the graph must be a pair .*got \('input', "
         r"'node', 'output'\)"),
        ([("input", "node"), ("node", 3)], r"edge 1 of the graph must be a pair .*got \('node', 3\)"),
        ("input->node", r"the graph's edges must be a list of \(source, target\) pairs, got "
         r"'input->node'"),
    ],
)  # fmt: skip
def test_from_nir_refuses_malformed_edges(edges, match):
    exc = TypeError if isinstance(edges, str) else ValueError
    _refused(exc, r"from_nir: " + match, lambda: nj.nir.from_nir(_graph(edges=edges), dt=1e-3))


@pytest.mark.parametrize(
    "shape, shown",
    [((-2,), r"\[-2\]"), ((0,), r"\[0\]"), ((2.5,), r"\[2\.5\]"), ((2, -1), r"\[2, -1\]")],
)
def test_from_nir_refuses_a_non_positive_input_shape_at_import(shape, shown):
    _refused(
        ValueError,
        r"from_nir: node 'input' \(Input\): input_type must be a shape of positive ints, got "
        + shown,
        lambda: nj.nir.from_nir(_graph(input_shape=shape), dt=1e-3),
    )


def test_from_nir_refuses_nodes_that_are_not_nir_nodes():
    graph = _graph()
    graph.nodes["node"] = {"tau": 0.01}
    _refused(
        TypeError,
        r"from_nir: node 'node' of the graph must be a NIR node, got dict",
        lambda: nj.nir.from_nir(graph, dt=1e-3),
    )


# ------------------------------------------------------------------ checkpoints


def test_load_refuses_missing_folder_text_and_truncated_checkpoints(tmp_path):
    lif = nj.LIF()
    tree = {"model": lif, "state": lif.init_state(3)}
    _refused(
        FileNotFoundError,
        r"load: no checkpoint at '.*none\.nj': the file does not exist",
        lambda: nj.load(tmp_path / "none.nj", tree),
    )
    (tmp_path / "folder").mkdir()
    _refused(
        ValueError,
        r"load: cannot read checkpoint '.*folder': it is a directory without "
        r"neurojax_checkpoint\.json",
        lambda: nj.load(tmp_path / "folder", tree),
    )
    (tmp_path / "text.nj").write_text("not a checkpoint")
    _refused(
        ValueError,
        r"load: cannot read checkpoint '.*text\.nj': it is not a complete ZIP archive",
        lambda: nj.load(tmp_path / "text.nj", tree),
    )
    nj.save(tmp_path / "good.nj", tree)
    raw = (tmp_path / "good.nj").read_bytes()
    (tmp_path / "cut.nj").write_bytes(raw[: len(raw) - 40])
    _refused(
        ValueError,
        r"load: cannot read checkpoint '.*cut\.nj': ",
        lambda: nj.load(tmp_path / "cut.nj", tree),
    )


# ------------------------------------------------------------------ writers' targets


@pytest.fixture(scope="module")
def recording():
    lif = nj.LIF()
    current = 20.0 + 10.0 * jr.normal(jr.key(0), (200, 3))
    _, rec = nj.simulate(lif, lif.init_state(3), current, dt=0.1)
    return rec


def _writers(rec):
    model = nj.training.SpikingDense(2, 2, key=jr.key(0))
    table = nj.io.spike_table(np.asarray(rec.spikes), dt=0.1)
    return {
        "save": lambda p: nj.save(p, {"x": jnp.ones(2)}),
        "save_recording": lambda p: nj.io.save_recording(p, rec),
        "spike_table_to_csv": lambda p: nj.io.spike_table_to_csv(p, table),
        "to_sonata": lambda p: nj.io.to_sonata(rec, p),
        "to_nwb": lambda p: nj.io.to_nwb(rec, p, dt=0.1),
        "to_nir": lambda p: nj.nir.to_nir(model, p),
    }


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_writers_refuse_a_missing_folder_and_a_folder_as_target(recording, tmp_path):
    pytest.importorskip("pynwb")
    for name, write in _writers(recording).items():
        target, file = tmp_path / name, "out.nwb" if name == "to_nwb" else "out.bin"
        target.mkdir()
        _refused(
            FileNotFoundError,
            rf"^{name}: the directory '.*missing' of path '.*missing/out\.\w+' does not exist$",
            lambda write=write, target=target, file=file: write(target / "missing" / file),
        )
        _refused(
            IsADirectoryError,
            rf"^{name}: path '.*{name}' is a directory, expected a file$",
            lambda write=write, target=target: write(target),
        )
        assert list(target.iterdir()) == [], name  # nothing written
        write(target / file)  # and the writer works
        assert (target / file).is_file(), name
