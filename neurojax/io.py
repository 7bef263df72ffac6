"""Checkpoints of neurojax PyTrees, and export of recordings to NumPy and CSV.

**Checkpoints.** `save(path, tree)` writes any PyTree of neurojax objects (models, states
with their PRNG keys, ring buffers and plastic weights, optax optimizer states, Python
scalars) to one file; `load(path, like)` reads it back into a PyTree of the same structure,
for example a freshly built model and `init_state`. The structure and code come from
`like` (the classes themselves, functions), so a checkpoint never executes code when loaded;
the static configuration (sizes, method names, delays in steps: every static field of every
module) is stored too, and `load` refuses a `like` built with another one, naming the field.
Every module rebuilt by `load` passes its constructor's checks again (a projection's
compressed rows inside its populations, finite weights, parameters in range). A simulation
or a training run resumed from a checkpoint continues bit for bit as if it had not been
interrupted.

```python
state, rec = nj.simulate(net, net.init_state(jax.random.key(0)), dt=0.1, n_steps=10_000)
nj.save("run.nj", {"net": net, "state": state})
# later, in another process:
ckpt = nj.load("run.nj", {"net": net, "state": net.init_state(jax.random.key(0))})
state, rec = nj.simulate(ckpt["net"], ckpt["state"], dt=0.1, n_steps=10_000)
```

**File format** (`format_version` 2): an uncompressed ZIP archive, readable with
`numpy.load(path)`, holding

- `neurojax_checkpoint.json`: the header: `format` (`"neurojax-checkpoint"`),
  `format_version`, the neurojax, JAX and NumPy versions that wrote it, `nodes` (the path and
  type name of every internal node of the tree, `None` included) and `leaves` (per leaf, in
  the order of `jax.tree_util.tree_flatten`: its path as written by `jax.tree_util.keystr`,
  its kind, shape, dtype, PRNG implementation, the archive member holding it and the SHA-256
  of its bytes; Python scalars and strings are stored in the header itself, each with the
  SHA-256 of its kind and value, absent from version-1 files, which still load) and `static`
  (per module node path, its static fields that have an exact JSON form: floats as
  `["float", hex]`, tuples as `["tuple", [...]]`; absent from files of older versions, which
  are then loaded without this comparison and with a `UserWarning` naming the static fields
  taken from `like` unchecked) and `structure` (per module node path, its type, its role,
  `"model"` for an object with `init_state` and `step` such as a network or `"state"`, and a
  64-bit fingerprint of its structure: node types, leaf shapes and dtypes, static fields;
  when `like` does not match, `load` compares them to say which modules differ and whether
  a model, not only a state, was built differently; absent from older files);
- `leaves/00000.npy`, ...: one `.npy` file per array leaf. Typed PRNG keys are stored as
  their `jax.random.key_data` (uint32); dtypes that `.npy` cannot describe (`bfloat16`,
  `float8_*`, ...) as their raw bytes, a `uint8` array with a trailing axis of the item size.

Files are written atomically (a temporary file in the same directory, `fsync`, then
`os.replace`), so an interrupted `save` leaves the previous file, or none, never half a file.
The temporary file is named `.<name>.<host>-<pid>.<random>.tmp`; a save killed before its
rename (`kill -9`, a power cut) leaves it behind, and the next `save` to the same path
removes those whose writer process no longer exists on this host.
`load` verifies the archive, the header, the structure, shapes and dtypes against `like` and
every checksum before it builds anything, and reads arrays with `allow_pickle=False`.

**Sharded and multi-process states** are saved to a directory instead (orbax-checkpoint,
the optional extra `neurojax[orbax]`), each process writing its own shards, with the same
guarantees: see `save` and the guide "Output formats and sharded checkpoints".

**Recordings.** `save_recording(path, recording)` writes a `nj.Recording` to a `.npz` with
the keys `t`, `spikes` (or `spikes/<population>`) and `values/<field>`;
`spike_table(spikes, dt=..., t=...)` turns a time-major spike raster into a table with one
row per spike (columns `time_ms`, `trial`, `neuron`), and `spike_table_to_csv` writes it.
`to_sonata`/`from_sonata`, `to_nwb` and `to_neo` export to SONATA spike files, NWB and Neo
(optional extras `neurojax[sonata]`, `[nwb]`, `[neo]`).
"""

import csv
import json
import os
import zipfile
from collections.abc import Mapping
from decimal import Decimal
from io import BytesIO, TextIOWrapper
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import ArrayLike, PyTree, Shaped

from . import _sharded_io, _validation
from ._checkpoint import (
    _HEADER,
    FORMAT,
    FORMAT_VERSION,
    _as_path,
    _atomic_write,
    _check_header,
    _Corrupt,
    _dtype_name,
    _encode,
    _is_key_dtype,
    _leaf_spec,
    _match,
    _match_statics,
    _neurojax_version,
    _nodes,
    _sha256,
    _show,
    _statics,
    _structure,
    _structure_note,
)
from ._checkpoint import _HOST as _HOST  # noqa: F401  (tests read nj.io._HOST)
from ._formats import _chosen
from ._formats import from_sonata as from_sonata
from ._formats import to_neo as to_neo
from ._formats import to_nwb as to_nwb
from ._formats import to_sonata as to_sonata
from ._simulate import Recording
from ._validation import check_dt

__all__ = [
    "save",
    "load",
    "save_recording",
    "spike_table",
    "spike_table_to_csv",
    "to_sonata",
    "from_sonata",
    "to_nwb",
    "to_neo",
]

# A fixed timestamp for the archive members: the same tree gives the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _zipinfo(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    return info


# ----------------------------------------------------------------------------- save


def save(path: str | os.PathLike, tree: PyTree, *, sharded: bool | None = None) -> None:
    """Save a PyTree of neurojax objects (models, states, optimizer states) to one file.

    Every array leaf is stored with its shape, dtype and SHA-256 checksum: JAX and NumPy
    arrays of any dtype, typed PRNG keys from `jax.random.key` (as their
    `jax.random.key_data` and implementation name) and raw `uint32` keys. Python `bool`,
    `int`, `float`, `complex` and `str` leaves are stored exactly in the file's JSON header.
    `None` and empty containers are part of the structure. Other leaves (functions, for
    example a network input given as `t_ms -> current`) and all static fields are not stored:
    `load` takes them from its `like` argument.

    The file is written atomically: to a temporary file in the same directory, flushed to
    disk, then renamed over `path`, so that a crash or an error during `save` leaves the
    previous file at `path` (or none) intact. The format is described in `neurojax.io`.

    **Sharded and multi-process states.** In a job of several processes (`jax.distributed`),
    or for a tree holding arrays that this process cannot read whole, `save` is collective
    (every process calls it with the same arguments) and writes a directory instead of a
    file: each process writes its own shards with orbax-checkpoint (`pip install
    'neurojax[orbax]'`), nothing is gathered to one process, and the same guarantees hold
    (atomic commit of a header, a checksum per array, the tree checked against `like` by
    `load`). See the "Output formats and sharded checkpoints" guide.

    Args:
        path: the file to write (`str` or `pathlib.Path`); its directory must exist. Any
            suffix works; `.nj` is a good choice. An existing file is replaced.
        tree: the PyTree to save. Must not contain traced values (call `save` outside
            `jit`, `vmap` and `grad`) or `jax.ShapeDtypeStruct` leaves.
        sharded: `None` (default) writes the directory layout in a multi-process job or
            when an array of `tree` is not fully addressable from this process, else one
            file; `True` always writes the directory layout (for example a state sharded
            over many local devices, without copying it to the host first); `False` always
            one file (refused for arrays this process cannot read whole).

    Raises:
        TypeError: for a bad `path` or `sharded`, a traced or abstract leaf, or an array
            that cannot be stored without pickle (object dtype).
        ValueError: for `sharded=False` with arrays spread over several processes.
        FileExistsError: for the directory layout at the path of a file, or of a directory
            that is not a neurojax checkpoint.
        OSError: when the file cannot be written (a full disk, a read-only folder): the
            same class and errno as the system's error, with a message that starts with
            `save:` and names `path`; the previous file at `path` is left as it was.

    Example:
    ```python
    lif = nj.LIF()
    state, rec = nj.simulate(lif, lif.init_state(100), 20.0, dt=0.1, n_steps=1000)
    nj.save("lif.nj", {"model": lif, "state": state, "t_ms": 100.0})
    ```
    """
    owner = "save"
    p = _as_path(owner, path)
    if sharded is not None and not isinstance(sharded, bool):
        raise TypeError(f"{owner}: sharded must be None, True or False, got {sharded!r}")
    if sharded is None:
        sharded = _sharded_io.wants_sharded(tree)
    elif not sharded:
        for key_path, x in jtu.tree_flatten_with_path(tree)[0]:
            if _sharded_io.spans_processes(x):
                raise ValueError(
                    f"{owner}: sharded=False writes one file from this process, but leaf "
                    f"{_show(jtu.keystr(key_path))} spans devices of other processes; use "
                    "sharded=None or True (a checkpoint directory written by every process)"
                )
    if sharded:
        _sharded_io.save_sharded(owner, p, tree)
        return
    flat, _ = jtu.tree_flatten_with_path(tree)
    specs, arrays = [], []
    for index, (key_path, x) in enumerate(flat):
        spec = _leaf_spec(owner, jtu.keystr(key_path), x)
        data = _encode(owner, spec, x, index)
        specs.append(spec)
        if data is not None:
            arrays.append((spec["member"], data))
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "neurojax_version": _neurojax_version(),
        "jax_version": jax.__version__,
        "numpy_version": np.__version__,
        "nodes": [list(node) for node in _nodes(tree)],
        "leaves": specs,
        "static": _statics(tree),
        "structure": _structure(tree),
    }
    header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")

    def write(f: BinaryIO) -> None:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(_zipinfo(_HEADER), header_bytes)
            for member, data in arrays:
                with zf.open(_zipinfo(member), "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, data, allow_pickle=False)

    _atomic_write(owner, p, write)


def _read_array(zf: zipfile.ZipFile, spec: dict) -> np.ndarray:
    where = f"the array of leaf {_show(spec['path'])} ({spec['member']})"
    try:
        raw = zf.read(spec["member"])
    except zipfile.BadZipFile as err:
        raise _Corrupt(f"{where} is damaged ({err})") from None
    try:
        arr = np.lib.format.read_array(BytesIO(raw), allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise _Corrupt(f"{where} is not a valid .npy array ({err})") from None
    if spec["kind"] == "key":
        shape, dtype = tuple(spec["data_shape"]), spec["data_dtype"]
        if shape[: len(spec["shape"])] != tuple(spec["shape"]):
            raise _Corrupt(f"{where}: key data of shape {shape} for keys of shape {spec['shape']}")
    elif spec["encoding"] == "raw":
        item = jnp.dtype(spec["dtype"]).itemsize
        shape, dtype = tuple(spec["shape"]) + (item,), "uint8"
    else:
        shape, dtype = tuple(spec["shape"]), spec["dtype"]
    if arr.shape != shape or _dtype_name(arr.dtype) != dtype:
        raise _Corrupt(
            f"{where} has shape {arr.shape} and dtype {_dtype_name(arr.dtype)}, but the header "
            f"says {shape} and {dtype}"
        )
    if _sha256(arr) != spec["sha256"]:
        raise _Corrupt(f"{where} does not match its SHA-256 checksum")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if spec["kind"] == "array" and spec["encoding"] == "raw":
        arr = arr.reshape(-1).view(jnp.dtype(spec["dtype"])).reshape(spec["shape"])
    return arr


def _to_device(value: Any, like: Any) -> jax.Array:
    """A JAX array with the values of `value` placed like `like` (an array or abstract)."""
    sharding = getattr(like, "sharding", None)
    if sharding is not None and sharding.device_set != {jax.devices()[0]}:
        return jax.device_put(value, sharding)
    return jnp.asarray(value)


def _restore(spec: dict, value: Any, like: Any) -> Any:
    kind = spec["kind"]
    if kind == "object":
        return like
    if kind == "bool" or kind == "int" or kind == "str":
        return spec["value"]
    if kind == "float":
        return float.fromhex(spec["value"])
    if kind == "complex":
        return complex(float.fromhex(spec["value"][0]), float.fromhex(spec["value"][1]))
    if kind == "key":
        return jax.random.wrap_key_data(_to_device(value, like), impl=spec["impl"])
    if isinstance(like, np.generic):
        return value[()]
    if isinstance(like, np.ndarray):
        return value
    out = _to_device(value, like)
    if getattr(like, "weak_type", False) and isinstance(like, jax.Array):
        # Keep a weakly typed leaf weak (it came from a Python scalar): promotion rules and
        # the jit cache see it as before. A scatter into a weak array keeps the operand's type.
        out = lax.full_like(like, 0).at[...].set(out)
    return out


def load(path: str | os.PathLike, like: PyTree) -> PyTree:
    """Load a checkpoint written by `save` into a PyTree shaped like `like`.

    `like` is a PyTree with the structure of the saved tree, for example a freshly built
    model and its `init_state`; its array leaves may also be `jax.ShapeDtypeStruct`s (from
    `jax.eval_shape` or `equinox.filter_eval_shape`). The result has the structure, static
    fields and leaf types of `like` (JAX array, NumPy array, NumPy scalar; a JAX array is
    placed on the devices of the `like` leaf) and the values of the checkpoint. Leaves that
    the checkpoint does not store (functions and other objects) are taken from `like`.

    Before anything is built, `load` checks that the file is a complete, uncorrupted
    checkpoint (the ZIP archive's CRC-32s, the header and the SHA-256 of every array) and
    that `like` matches it: the same tree (node types and leaf paths, `None` included), and
    per leaf the same kind (array, PRNG key, Python scalar), shape and dtype, and for keys
    the same implementation. A mismatch raises a `ValueError` naming the first leaf path
    where they differ, as written by `jax.tree_util.keystr` (e.g. `.populations['E'].v`).
    `like` itself is never modified.

    A directory written by `save` for a sharded or multi-process state is read the same way,
    each process reading the shards its `like` leaves place on its devices (a leaf's
    sharding may differ from the saved one: the arrays are resharded as they are read); in a
    multi-process job every process calls `load`. The checks are the same, with a 64-bit
    checksum of each array's values in place of the SHA-256 of its bytes.

    Args:
        path: the checkpoint file (`str` or `pathlib.Path`).
        like: a PyTree with the structure, shapes and dtypes of the saved tree.

    Returns:
        A PyTree like `like` holding the saved values.

    Raises:
        FileNotFoundError: if there is no file at `path`.
        ValueError: if the file is truncated, corrupted, not a neurojax checkpoint or written
            by a newer format version, if `like` does not match it (structure, shapes,
            dtypes, static configuration), or if a rebuilt module fails its constructor's
            checks.
        TypeError: for a bad `path` or traced leaves in `like` (call `load` outside `jit`).

    Example:
    ```python
    ckpt = nj.load("lif.nj", {"model": nj.LIF(), "state": nj.LIF().init_state(100),
                              "t_ms": 0.0})
    state = ckpt["state"]
    ```
    """
    owner = "load"
    p = _as_path(owner, path)
    flat, treedef = jtu.tree_flatten_with_path(like)
    like_leaves = [x for _, x in flat]
    like_specs = [_leaf_spec(owner, jtu.keystr(kp), x) for kp, x in flat]
    like_nodes = _nodes(like)
    where = repr(str(p))
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"load: no checkpoint at {where}: the file does not exist"
        ) from None
    except IsADirectoryError:
        # A directory is a checkpoint of a sharded or multi-process state (`save`).
        return _sharded_io.load_sharded(owner, p, like)
    with f:
        try:
            try:
                zf = zipfile.ZipFile(f)
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
                raise _Corrupt(
                    f"it is not a complete ZIP archive (truncated, or not a checkpoint): {err}"
                ) from None
            with zf:
                members = set(zf.namelist())
                if _HEADER not in members:
                    raise _Corrupt(f"it has no {_HEADER} header (not a neurojax checkpoint)")
                try:
                    header = json.loads(zf.read(_HEADER).decode("utf-8"))
                except (zipfile.BadZipFile, UnicodeDecodeError, ValueError) as err:
                    raise _Corrupt(f"its header is damaged ({err})") from None
                except RecursionError:
                    raise _Corrupt("its header is damaged (nested too deeply)") from None
                _check_header(header, members)
                try:
                    _match(where, header, like_nodes, like_specs)
                    _match_statics(where, header, like)
                except ValueError as err:
                    raise ValueError(str(err) + _structure_note(header, like)) from None
                values = [
                    _read_array(zf, spec) if spec["kind"] in ("array", "key") else None
                    for spec in header["leaves"]
                ]
        except _Corrupt as err:
            raise ValueError(f"load: cannot read checkpoint {where}: {err}") from None
        # zipfile raises NotImplementedError for a member with an unknown compression method:
        # a damaged or forged file, reported like any other damage.
        except (zipfile.BadZipFile, EOFError, OSError, KeyError, NotImplementedError) as err:
            raise ValueError(
                f"load: cannot read checkpoint {where}: it is damaged ({type(err).__name__}: {err})"
            ) from None
    leaves = [
        _restore(spec, value, x)
        for spec, value, x in zip(header["leaves"], values, like_leaves, strict=True)
    ]
    out = jtu.tree_unflatten(treedef, leaves)
    _revalidate(f"load: checkpoint {where}", out)
    return out


def _revalidate(owner: str, tree: Any) -> None:
    """Run, on a tree whose values did not pass through the constructors, the checks each
    class declares (`__check_init__` along its hierarchy, a layout's or a network's
    `check_invariants`): a projection's compressed rows inside its populations, per-synapse
    delays inside the ring, finite weights, parameters in range. A forged file with a valid
    checksum then cannot make a kernel read or write outside its arrays, nor the pure-JAX
    path drop a synapse. `ValueError` naming `owner`, the class and the field."""
    try:
        for module in _validation.modules(tree):
            _validation.check_module(owner, module)
    except (ValueError, TypeError) as err:
        raise ValueError(str(err)) from None


# ----------------------------------------------------------------------------- recordings


def _entry_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _flatten_named(owner: str, prefix: str, tree: Any, out: dict[str, np.ndarray]) -> None:
    for key_path, x in jtu.tree_flatten_with_path(tree)[0]:
        name = "/".join([prefix] + [_entry_name(e) for e in key_path])
        if isinstance(x, jax.core.Tracer):
            raise TypeError(f"{owner}: {name} is a traced value; call {owner} outside jit")
        if isinstance(x, jax.Array) and _is_key_dtype(x.dtype):
            x = jax.random.key_data(x)
        if not isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
            raise TypeError(
                f"{owner}: {name} is a {type(x).__name__}, not an array; a recording holds "
                "arrays only"
            )
        arr = np.asarray(x)
        if arr.dtype.kind == "O":
            raise TypeError(f"{owner}: {name} has dtype object, which .npz cannot store")
        if name in out:
            raise ValueError(
                f"{owner}: two entries of the recording are both named {name!r}; rename one"
            )
        out[name] = arr


def save_recording(
    path: str | os.PathLike,
    recording: Recording,
    *,
    compress: bool = True,
    populations: str | list[str] | None = None,
) -> None:
    """Export a `nj.Recording` to a NumPy `.npz` file.

    The keys of the archive are `t` (time [ms] at the end of each recorded step), `spikes`
    for a single raster or `spikes/<population>` for a network's `{population: raster}`,
    and `values/<field>` for recorded state fields (`values/v`); nested PyTrees returned by
    a custom `record` function get one path segment per level (`values/0`, `values/E/v`).
    Time is the leading axis of every array, as in the recording. PRNG keys are stored as
    their `jax.random.key_data`. The file is written atomically, like `save`.

    Args:
        path: the file to write (`str` or `pathlib.Path`); written as given (NumPy's habit of
            appending `.npz` does not apply).
        recording: the `Recording` returned by `nj.simulate`.
        compress: compress the arrays (zlib; spike rasters shrink many times). Read either
            way with `numpy.load`.
        populations: which of a network's populations to write, as for `to_sonata`: `None`
            (default) every neuron population, leaving out the inputs (spike sources,
            `recording.sources`) with their recorded values; `"all"` every population; or
            a list of names.

    Example:
    ```python
    _, rec = nj.simulate(net, net.init_state(jax.random.key(0)), dt=0.1, n_steps=1000,
                         record=lambda s, out: {"v": s.populations["E"].v})
    nj.io.save_recording("run.npz", rec)
    data = np.load("run.npz")
    data["t"].shape, data["spikes/E"].shape, data["values/v"].shape
    ```
    """
    owner = "save_recording"
    p = _as_path(owner, path)
    if not isinstance(recording, Recording):
        raise TypeError(
            f"{owner}: recording must be a neurojax Recording (from nj.simulate), got "
            f"{type(recording).__name__}"
        )
    if not isinstance(compress, bool):
        raise TypeError(f"{owner}: compress must be a bool, got {compress!r}")
    arrays: dict[str, np.ndarray] = {}
    spikes, left_out = recording.spikes, set()
    if isinstance(spikes, Mapping) and spikes:
        keep = _chosen(owner, recording, list(spikes), populations)
        left_out = set(spikes) - set(keep)
        spikes = {name: spikes[name] for name in keep}
    elif populations not in (None, "all"):
        raise ValueError(
            f"{owner}: populations chooses among a network's populations; this recording is "
            f"of a single population (got populations={populations!r})"
        )
    _flatten_named(owner, "t", recording.t, arrays)
    _flatten_named(owner, "spikes", spikes, arrays)
    values: dict[str, np.ndarray] = {}
    _flatten_named(owner, "values", recording.values, values)
    for name, arr in values.items():
        if not left_out.intersection(name.split("/")[1:]):
            arrays[name] = arr
    writer = np.savez_compressed if compress else np.savez
    _atomic_write(owner, p, lambda f: writer(f, **arrays))


def _decimals(dt: float) -> int:
    exponent = Decimal(repr(dt)).as_tuple().exponent
    return max(0, -int(exponent))


def spike_table(
    spikes: Shaped[ArrayLike, "t *batch n"],
    *,
    dt: float | None = None,
    t: Shaped[ArrayLike, " t"] | None = None,
) -> dict[str, np.ndarray]:
    """A table with one row per spike from a time-major spike raster.

    The raster is what `nj.simulate` records: shape `(t, n)` or `(t, *batch, n)`, booleans,
    0/1 values, or spike counts per window (with `record_every > 1`). A window that holds
    `c` spikes of a neuron gives `c` identical rows. Rows are sorted by time, then trial
    (batch index), then neuron: the order of the raster's elements.

    Columns (NumPy arrays of equal length):

    - `time_ms` (float64) when `t` or `dt` is given: the time of the raster row, else
      `step` (int64): the row index itself;
    - `trial` (int64) for one batch axis, or `trial_0`, `trial_1`, ... for several;
    - `neuron` (int64): the index along the last axis.

    The result converts directly to a table library: `pandas.DataFrame(table)`.

    Args:
        spikes: the raster, time first (NumPy or JAX array). For a network's recording pass
            one population: `rec.spikes["E"]`.
        dt: time between raster rows [ms] (the simulation step times `record_every`); row `i`
            is dated `(i + 1) * dt`, the end of its window, as in `Recording.t`. Computed in
            float64 and rounded to the decimal places of `dt`, so that `3 * 0.1` gives `0.3`.
        t: the time of every row [ms], shape `(t,)`, usually `recording.t`. A float32 `t` is
            read through its shortest decimal form (`0.3`, not `0.30000001192092896`).
            Give `dt` or `t`, not both.

    Returns:
        `{column name: 1-D array}`.

    Example:
    ```python
    _, rec = nj.simulate(lif, lif.init_state((2, 3)), 20.0, dt=0.1, n_steps=100)
    table = nj.io.spike_table(rec.spikes, t=rec.t)
    table.keys()    # time_ms, trial, neuron
    ```
    """
    owner = "spike_table"
    if isinstance(spikes, Mapping):
        raise TypeError(
            f"{owner}: spikes must be one time-major raster; for a network's recording pass "
            f"one population, e.g. rec.spikes[{next(iter(spikes), 'name')!r}]"
        )
    if isinstance(spikes, jax.core.Tracer) or isinstance(t, jax.core.Tracer):
        raise TypeError(f"{owner}: spikes and t must be concrete arrays; call it outside jit")
    raster = np.asarray(spikes)
    if raster.ndim < 2:
        raise ValueError(
            f"{owner}: spikes must have shape (t, n) or (t, *batch, n), got shape {raster.shape}"
        )
    kind = raster.dtype.kind
    if kind not in "biuf":
        raise TypeError(
            f"{owner}: spikes must be booleans or spike counts (int or float), got dtype "
            f"{raster.dtype}"
        )
    if kind in "iuf" and raster.size:
        bad = ~np.isfinite(raster) | (raster < 0) if kind == "f" else raster < 0
        if kind == "f":
            bad |= np.isfinite(raster) & (raster != np.round(raster))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{owner}: spikes must hold 0/1 or whole spike counts >= 0, got "
                f"{raster[where].item()!r} at index {where}"
            )
    if dt is not None and t is not None:
        raise ValueError(f"{owner}: give dt or t, not both (got dt={dt!r} and t)")
    times = None
    if dt is not None:
        dt = check_dt(owner, dt)
    elif t is not None:
        t_arr = np.asarray(t)
        if t_arr.shape != raster.shape[:1]:
            raise ValueError(
                f"{owner}: t must have shape ({raster.shape[0]},), one time per raster row, "
                f"got shape {t_arr.shape}"
            )
        if t_arr.dtype.kind not in "iuf":
            raise TypeError(f"{owner}: t must hold times in ms, got dtype {t_arr.dtype}")
        if t_arr.dtype.kind == "f" and t_arr.dtype.itemsize < 8:
            # The shortest decimal that reads back as the float32 value, then float64.
            times = t_arr.astype(str).astype(np.float64)
        else:
            times = t_arr.astype(np.float64)
    index = np.nonzero(raster)
    if kind != "b":
        counts = raster[index].astype(np.int64)
        index = tuple(np.repeat(i, counts) for i in index)
    rows = index[0].astype(np.int64)
    table: dict[str, np.ndarray] = {}
    if dt is not None:
        table["time_ms"] = np.round((rows + 1).astype(np.float64) * dt, _decimals(dt))
    elif times is not None:
        table["time_ms"] = times[rows]
    else:
        table["step"] = rows
    batch = index[1:-1]
    for b, column in enumerate(batch):
        table["trial" if len(batch) == 1 else f"trial_{b}"] = column.astype(np.int64)
    table["neuron"] = index[-1].astype(np.int64)
    return table


def spike_table_to_csv(path: str | os.PathLike, table: Mapping[str, ArrayLike]) -> None:
    """Write a table of columns (as returned by `spike_table`) to a CSV file.

    The first line holds the column names; each further line one row. Floats are written
    in their shortest exact decimal form (`0.3`, `12.25`), integers as integers, booleans
    as 0/1. The file is written atomically, like `save`.

    Args:
        path: the file to write (`str` or `pathlib.Path`).
        table: `{column name: 1-D array}`, all of the same length.

    Example:
    ```python
    nj.io.spike_table_to_csv("spikes_E.csv", nj.io.spike_table(rec.spikes["E"], t=rec.t))
    # time_ms,neuron
    # 0.3,12
    # ...
    ```
    """
    owner = "spike_table_to_csv"
    p = _as_path(owner, path)
    if not isinstance(table, Mapping) or not table:
        raise TypeError(f"{owner}: table must be a non-empty dict of columns, got {table!r}")
    columns = {}
    for name, col in table.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{owner}: column names must be non-empty str, got {name!r}")
        arr = np.asarray(col)
        if arr.ndim != 1 or arr.dtype.kind not in "biuf":
            raise ValueError(
                f"{owner}: column {name!r} must be a 1-D numeric array, got shape {arr.shape} "
                f"and dtype {arr.dtype}"
            )
        columns[name] = arr.astype(np.int64) if arr.dtype.kind == "b" else arr
    lengths = {name: arr.shape[0] for name, arr in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{owner}: all columns must have the same length, got {lengths}")
    # NumPy's str conversion writes the shortest repr that reads back exactly.
    text = [arr.astype(str) for arr in columns.values()]

    def write(f: BinaryIO) -> None:
        out = TextIOWrapper(f, encoding="utf-8", newline="")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(list(columns))
        writer.writerows(zip(*text))
        out.flush()
        out.detach()  # leave `f` open: _atomic_write syncs and closes it

    _atomic_write(owner, p, write)
