"""Export of recordings to the formats other neuroscience tools read: SONATA, NWB and Neo.

The three libraries are optional (`pip install 'neurojax[sonata]'`, `'neurojax[nwb]'`,
`'neurojax[neo]'`) and imported only when a function that needs them is called.

Every function reads a `nj.Recording` the same way:

- spikes: the raster of a single population (`(t, *batch, n)`) or a network's
  `{population: raster}`; a spike in row `i` is dated `recording.t[i]`, the end of its
  recorded step (as in `nj.io.spike_table`), and a row holding a count `c` (with
  `record_every > 1`) gives `c` spikes at that time;
- traces: every array of `recording.values` whose leading axis is time. The recorded
  fields of a network (`record={"E": ("v",)}`, stored as `values["v"]["E"]`) belong to
  their population; a single population's fields (`values["v"]`) to that population.
- populations: every writer takes `populations=`; by default a network's inputs (spike
  sources such as the microcircuit's Poisson `background`, `recording.sources`) are left
  out and only neuron populations written; `populations="all"` writes them too. A source
  that emits several spikes per step is recorded by `nj.simulate` as counts, so its
  exported spikes are all it emitted;
- trials: batch axes between time and neurons. Neo keeps them (one `Segment` per trial);
  SONATA and NWB files hold one continuous run, so a batched recording needs `trial=` there.
"""

import datetime
import decimal
import importlib
import json
import os
import pathlib
import uuid
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jaxtyping import PyTree

from ._simulate import Recording
from ._validation import check_dt

__all__ = ["to_sonata", "from_sonata", "to_nwb", "to_neo"]

_SORTINGS = ("by_time", "by_id", "none")
# SONATA's `sorting` enumeration (the spike-file spec; libsonata's and BMTK's codes).
_SORTING_CODES = (("none", 0), ("by_id", 1), ("by_time", 2))
# SONATA's magic number and the version of its spike-file layout (root attributes).
_SONATA_MAGIC = 0x0A7A
_SONATA_VERSION = (0, 1)
_DEFAULT_UNITS = {"v": "mV"}


# ----------------------------------------------------------------------------- helpers


def _import(owner: str, module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{owner} needs the optional package {module!r}, which is not installed: "
            f"pip install 'neurojax[{extra}]'"
        ) from err


def _as_path(owner: str, path: Any) -> pathlib.Path:
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if isinstance(text, str) and text:
            return pathlib.Path(text)
    raise TypeError(f"{owner}: path must be a non-empty str or pathlib.Path, got {path!r}")


def _writable(owner: str, p: pathlib.Path) -> None:
    directory = p.absolute().parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{owner}: the directory {str(directory)!r} of path {str(p)!r} does not exist"
        )
    if p.is_dir():
        raise IsADirectoryError(f"{owner}: path {str(p)!r} is a directory, expected a file")


def _check_recording(owner: str, recording: Any) -> None:
    if not isinstance(recording, Recording):
        raise TypeError(
            f"{owner}: recording must be a neurojax Recording (from nj.simulate), got "
            f"{type(recording).__name__}"
        )
    for leaf in jtu.tree_leaves(recording):
        if isinstance(leaf, jax.core.Tracer):
            raise TypeError(f"{owner}: the recording holds traced values; call it outside jit")


def _times(owner: str, recording: Recording) -> np.ndarray:
    """`recording.t` in float64 ms; float32 times through their shortest decimal form."""
    t = np.asarray(recording.t)
    if t.ndim != 1 or t.dtype.kind not in "iuf" or t.size == 0:
        raise ValueError(
            f"{owner}: recording.t must be a non-empty 1-D array of times [ms], got shape "
            f"{t.shape} and dtype {t.dtype}"
        )
    if t.dtype.kind == "f" and t.dtype.itemsize < 8:
        return t.astype(str).astype(np.float64)
    return t.astype(np.float64)


def _decimals(x: float) -> int:
    return max(0, -int(decimal.Decimal(repr(x)).as_tuple().exponent))


def _row_ms(owner: str, dt: Any, record_every: Any, t: np.ndarray) -> float:
    """The time between recorded rows [ms], checked against `recording.t`."""
    dt = check_dt(owner, dt)
    if isinstance(record_every, bool) or not isinstance(record_every, (int, np.integer)):
        raise TypeError(f"{owner}: record_every must be a positive int, got {record_every!r}")
    if record_every < 1:
        raise ValueError(f"{owner}: record_every must be a positive int, got {record_every}")
    row = round(dt * int(record_every), _decimals(dt))
    if t.size > 1:
        # float32 times lose digits as the clock grows: allow a few float32 ulps of the clock.
        tol = 1e-6 * row + 8 * np.finfo(np.float32).eps * float(np.abs(t).max())
        steps = np.diff(t)
        if np.abs(steps - row).max() > tol:
            raise ValueError(
                f"{owner}: dt * record_every = {row} ms does not match the recording, whose "
                f"rows are {steps.min():g} to {steps.max():g} ms apart; pass the dt and "
                "record_every given to nj.simulate"
            )
    return row


def _chosen(owner: str, recording: Recording, names: list[str], populations: Any) -> list[str]:
    """The populations to write: `populations` checked against `names` (the recording's)."""
    sources = tuple(getattr(recording, "sources", ()))
    if populations is None:
        chosen = [n for n in names if n not in sources]
        if not chosen:
            raise ValueError(
                f"{owner}: every population of the recording is an input (spike source: "
                f"{list(sources)}), and inputs are left out by default; pass "
                "populations='all' or a list of names to write them"
            )
        return chosen
    if isinstance(populations, str):
        if populations == "all":
            return list(names)
        populations = [populations]
    if not isinstance(populations, (list, tuple)) or not populations:
        raise TypeError(
            f"{owner}: populations must be None (every neuron population, inputs left out), "
            f"'all', or a non-empty list of names from {names}, got {populations!r}"
        )
    unknown = [p for p in populations if p not in names]
    if unknown:
        raise ValueError(
            f"{owner}: populations names {unknown!r}, which the recording does not have; it "
            f"has {names}"
        )
    if len(set(populations)) != len(populations):
        raise ValueError(f"{owner}: populations lists a name twice: {list(populations)!r}")
    return [n for n in names if n in populations]


def _rasters(
    owner: str, recording: Recording, population: Any, populations: Any = None
) -> dict[str, np.ndarray]:
    spikes = recording.spikes
    if isinstance(spikes, Mapping):
        if population is not None:
            raise ValueError(
                f"{owner}: population names a single population's recording; this one is a "
                f"network's with populations {sorted(spikes)} (got population={population!r}); "
                "use populations=[...] to choose which to write"
            )
        if not spikes:
            raise ValueError(f"{owner}: the recording has no populations")
        keep = _chosen(owner, recording, list(spikes), populations)
        items = [(name, spikes[name]) for name in keep]
    else:
        name = "neurons" if population is None else population
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(
                f"{owner}: population must be a non-empty str without '/', got {population!r}"
            )
        items = [(name, spikes)]
        _chosen(owner, recording, [name], populations)
    out: dict[str, np.ndarray] = {}
    for name, raster in items:
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(
                f"{owner}: population names must be non-empty str without '/', got {name!r}"
            )
        a = np.asarray(raster)
        if a.ndim < 2 or a.dtype.kind not in "biuf":
            raise ValueError(
                f"{owner}: the spikes of population {name!r} must be a raster (t, *batch, n) "
                f"of booleans or counts, got shape {a.shape} and dtype {a.dtype}"
            )
        if a.dtype.kind in "iuf" and a.size:
            bad = ~np.isfinite(a) | (a < 0) | (a != np.round(a))
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"{owner}: the spikes of population {name!r} must be 0/1 or whole counts "
                    f">= 0, got {a[where].item()!r} at index {where}"
                )
        out[name] = a
    shapes = {name: a.shape[:-1] for name, a in out.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(
            f"{owner}: every population must have the same time and batch axes, got {shapes}"
        )
    return out


def _entry(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _traces(
    owner: str, recording: Recording, rasters: dict[str, np.ndarray]
) -> list[tuple[str, str | None, np.ndarray]]:
    """(name, population or None, array (t, *batch, k)) for every time-major recorded value
    (those of the populations left out of `rasters` excluded)."""
    n_t, batch = next(iter(rasters.values())).shape[0], next(iter(rasters.values())).shape[1:-1]
    single = next(iter(rasters)) if len(rasters) == 1 else None
    spikes = recording.spikes
    left_out = set(spikes) - set(rasters) if isinstance(spikes, Mapping) else set()
    out = []
    for key_path, x in jtu.tree_flatten_with_path(recording.values)[0]:
        parts = [_entry(e) for e in key_path]
        if left_out.intersection(parts):
            continue
        name = "/".join(parts) or "values"
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(f"{owner}: recorded value {name!r} holds PRNG keys, not a trace")
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{owner}: recorded value {name!r} has dtype {a.dtype}, not numeric")
        if a.ndim < 1 + len(batch) or a.shape[: 1 + len(batch)] != (n_t, *batch):
            raise ValueError(
                f"{owner}: recorded value {name!r} has shape {a.shape}; a trace must be "
                f"time-major with the recording's axes ({n_t}, {', '.join(map(str, batch))}"
                f"{', ' if batch else ''}...)"
            )
        a = a.reshape(a.shape[: 1 + len(batch)] + (-1,))
        pop = next((p for p in parts if p in rasters), single)
        out.append((name, pop, a))
    return out


def _trial_index(owner: str, trial: Any, batch: tuple[int, ...]) -> tuple[int, ...]:
    if not batch:
        if trial is not None:
            raise ValueError(
                f"{owner}: trial selects one trial of a batched recording; this recording "
                f"has no batch axes (got trial={trial!r})"
            )
        return ()
    if trial is None:
        raise ValueError(
            f"{owner}: the recording is batched (batch shape {batch}), and a file holds one "
            f"run: pass trial=<index> (an int, or a tuple of {len(batch)} ints) to export one "
            "trial, or use nj.io.to_neo, which keeps every trial"
        )
    index = (trial,) if not isinstance(trial, tuple) else trial
    ok = len(index) == len(batch) and all(
        not isinstance(i, bool) and isinstance(i, (int, np.integer)) and 0 <= i < b
        for i, b in zip(index, batch)
    )
    if not ok:
        raise ValueError(
            f"{owner}: trial must be {'an int' if len(batch) == 1 else 'a tuple of ints'} "
            f"indexing the batch shape {batch} (each in [0, size)), got {trial!r}"
        )
    return tuple(int(i) for i in index)


def _select(a: np.ndarray, index: tuple[int, ...]) -> np.ndarray:
    return a[(slice(None), *index)]


def _spike_times(raster: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times [ms], neuron ids) of a 2-D raster `(t, n)`, ordered by time then neuron."""
    rows, cols = np.nonzero(raster)
    if raster.dtype.kind != "b":
        counts = raster[rows, cols].astype(np.int64)
        rows, cols = np.repeat(rows, counts), np.repeat(cols, counts)
    return t[rows], cols.astype(np.int64)


def _check_str(owner: str, name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{owner}: {name} must be a non-empty str, got {value!r}")
    return value


def _check_units(owner: str, units: Any) -> dict[str, str]:
    if units is None:
        return dict(_DEFAULT_UNITS)
    if not isinstance(units, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in units.items()
    ):
        raise TypeError(
            f"{owner}: units must be a dict {{field: unit}} of non-empty str (e.g. "
            f"{{'v': 'mV'}}), got {units!r}"
        )
    return {**_DEFAULT_UNITS, **units}


def _unit_of(units: dict[str, str], name: str) -> str | None:
    field = name.split("/")[0]
    return units.get(name, units.get(field))


# ----------------------------------------------------------------------------- SONATA


def _sorting_dtype(h5py: ModuleType) -> Any:
    # SONATA's enum, base type uint8, as libsonata and BMTK write and read it.
    return h5py.enum_dtype(dict(_SORTING_CODES), basetype=np.uint8)


def to_sonata(
    recording: Recording,
    path: str | os.PathLike,
    *,
    population: str | None = None,
    populations: str | list[str] | None = None,
    trial: int | tuple[int, ...] | None = None,
    sorting: str = "by_time",
) -> None:
    """Write the spikes of a recording to a SONATA spike file (HDF5), as NEST, NEURON and
    BMTK write them.

    Layout: one group per population, `/spikes/<population>`, with the attribute `sorting`
    (SONATA's enumeration, an HDF5 enum over `uint8` with `none = 0`, `by_id = 1`,
    `by_time = 2`, the form libsonata and BMTK read) and two datasets of equal length,
    `timestamps` (float64, attribute `units = "ms"`) and `node_ids` (uint64, the neuron's
    index in its population). The root carries SONATA's `magic` and `version` attributes.
    A spike in row `i` of the raster is dated `recording.t[i]` [ms]; a row holding a count
    `c` gives `c` identical entries. Spike sources that emit several spikes per step (the
    microcircuit's Poisson `background`) are recorded by `nj.simulate` as counts, so the file
    holds every spike they emitted. Needs `h5py` (`pip install 'neurojax[sonata]'`).

    Args:
        recording: the `Recording` of `nj.simulate`, of one population or a network.
        path: the `.h5` file to write (its folder must exist); an existing file is replaced.
        population: the group name for a single population's recording (default
            `"neurons"`); a network's recording uses its population names.
        populations: which of a network's populations to write: `None` (default)
            every neuron population, leaving out the inputs (spike sources such as
            `nj.PoissonSource` or the microcircuit's `background`, listed in
            `recording.sources`); `"all"` every population, inputs included; or a list of
            names.
        trial: for a batched recording, the trial to write (an int, or a tuple of ints for
            several batch axes); a SONATA file holds one run.
        sorting: the order of the spikes: `"by_time"` (then by id), `"by_id"` (then by
            time) or `"none"` (the order of the raster, which is by time).

    Example:
    ```python
    _, rec = nj.simulate(net, state, dt=0.1, n_steps=2000)
    nj.io.to_sonata(rec, "spikes.h5")                       # neurons only
    nj.io.to_sonata(rec, "all.h5", populations="all")       # inputs too
    nj.io.from_sonata("spikes.h5")["E"]["timestamps"][:3]
    ```
    """
    owner = "to_sonata"
    _check_recording(owner, recording)
    p = _as_path(owner, path)
    if sorting not in _SORTINGS:
        raise ValueError(f"{owner}: sorting must be one of {_SORTINGS}, got {sorting!r}")
    t = _times(owner, recording)
    rasters = _rasters(owner, recording, population, populations)
    first = next(iter(rasters.values()))
    if first.shape[0] != t.size:
        raise ValueError(
            f"{owner}: the spikes have {first.shape[0]} rows but recording.t has {t.size} times"
        )
    index = _trial_index(owner, trial, first.shape[1:-1])
    _writable(owner, p)
    h5py = _import(owner, "h5py", "sonata")
    with h5py.File(p, "w") as f:
        f.attrs["magic"] = np.uint32(_SONATA_MAGIC)
        f.attrs["version"] = np.array(_SONATA_VERSION, dtype=np.uint32)
        spikes = f.create_group("spikes")
        for name, raster in rasters.items():
            times, ids = _spike_times(_select(raster, index), t)
            if sorting == "by_id":
                order = np.lexsort((times, ids))
                times, ids = times[order], ids[order]
            group = spikes.create_group(name)
            group.attrs.create("sorting", dict(_SORTING_CODES)[sorting], dtype=_sorting_dtype(h5py))
            ts = group.create_dataset("timestamps", data=times.astype(np.float64))
            # Strings as variable-length UTF-8, as BMTK and libsonata write them.
            ts.attrs.create("units", "ms", dtype=h5py.string_dtype())
            group.create_dataset("node_ids", data=ids.astype(np.uint64))


def _read_sorting(owner: str, where: str, h5py: ModuleType, group: Any) -> str:
    """The `sorting` attribute of a population group: SONATA's enum, or its name as a
    string (older neurojax files); `"none"` when absent."""
    if "sorting" not in group.attrs:
        return "none"
    try:
        value = group.attrs["sorting"]
        dtype = group.attrs.get_id("sorting").dtype
    except (OSError, TypeError, ValueError) as err:
        raise ValueError(f"{owner}: {where}: attribute sorting cannot be read ({err})") from None
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        name = value
    else:
        arr = np.asarray(value)
        if arr.shape != () or arr.dtype.kind not in "iu":
            raise ValueError(
                f"{owner}: {where}: attribute sorting must be SONATA's enum {_SORTINGS} or "
                f"its name, got {value!r}"
            )
        codes = h5py.check_enum_dtype(dtype) or dict(_SORTING_CODES)
        names = {int(v): k for k, v in codes.items()}
        name = names.get(int(arr), f"<code {int(arr)}>")
    if name not in _SORTINGS:
        raise ValueError(
            f"{owner}: {where}: attribute sorting must be one of {_SORTINGS}, got {name!r}"
        )
    return name


def from_sonata(path: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """Read the spikes of a SONATA spike file (written by `to_sonata`, NEST, NEURON or BMTK).

    Every group `/spikes/<population>` holding `timestamps` and `node_ids` is read (the
    older name `gids` for the ids is accepted). Timestamps in seconds (`units = "s"`) are
    converted to ms. The `sorting` attribute is read in SONATA's enum form (what libsonata,
    BMTK and `to_sonata` write) or as a string (what neurojax wrote before). Needs `h5py`
    (`pip install 'neurojax[sonata]'`).

    The file is checked before anything is returned, and a bad one is refused with a
    `ValueError` naming the file, the population and the field: node ids must be an integer
    dataset with no negative value (ids 0.7 or -3 are not rounded or passed through),
    timestamps a real-valued dataset without NaN or infinite values, both 1-D and of equal
    length, `units` `"ms"` or `"s"`, `sorting` one of `"none"`, `"by_id"`, `"by_time"`.

    Args:
        path: the HDF5 file.

    Returns:
        `{population: {"timestamps": float64 [ms], "node_ids": int64, "sorting": str}}`,
        in the file's order; `sorting` is `"none"` when the file does not say.

    Raises:
        FileNotFoundError: if there is no file at `path`.
        ValueError: if the file is not HDF5, has no `/spikes` group with populations, or a
            population's data breaks a rule above.

    Example:
    ```python
    spikes = nj.io.from_sonata("output/spikes.h5")
    spikes["E"]["node_ids"], spikes["E"]["timestamps"]
    ```
    """
    owner = "from_sonata"
    p = _as_path(owner, path)
    if p.is_dir():
        raise IsADirectoryError(f"{owner}: {str(p)!r} is a directory, expected a SONATA file")
    if not p.is_file():
        raise FileNotFoundError(f"{owner}: no file at {str(p)!r}")
    h5py = _import(owner, "h5py", "sonata")
    file = repr(str(p))

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    out: dict[str, dict[str, np.ndarray]] = {}
    try:
        f = h5py.File(p, "r")
    except OSError as err:
        raise ValueError(
            f"{owner}: {file} is not an HDF5 file, or is truncated or damaged ({err})"
        ) from None
    with f:
        spikes = f.get("spikes")
        if not isinstance(spikes, h5py.Group):
            raise ValueError(f"{owner}: {file} has no /spikes group (not a SONATA spike file)")
        for name, group in spikes.items():
            where = f"{file}, population /spikes/{name}"
            if not isinstance(group, h5py.Group):
                continue
            if "timestamps" not in group:
                if "node_ids" in group or "gids" in group:
                    raise ValueError(f"{owner}: {where} has node_ids but no timestamps")
                continue
            ids_name = "node_ids" if "node_ids" in group else "gids"
            if ids_name not in group:
                raise ValueError(f"{owner}: {where} has timestamps but no node_ids")
            ts_set, id_set = group["timestamps"], group[ids_name]
            for field, ds in (("timestamps", ts_set), (ids_name, id_set)):
                if not isinstance(ds, h5py.Dataset):
                    raise ValueError(f"{owner}: {where}: {field} must be a dataset, got a group")
            if ts_set.dtype.kind not in "iuf":
                raise ValueError(
                    f"{owner}: {where}: timestamps must be a dataset of real numbers, got "
                    f"dtype {ts_set.dtype}"
                )
            if id_set.dtype.kind not in "iu":
                raise ValueError(
                    f"{owner}: {where}: {ids_name} must be a dataset of integers (node ids), "
                    f"got dtype {id_set.dtype}"
                )
            try:
                times = np.asarray(ts_set[()], dtype=np.float64)
                raw_ids = np.asarray(id_set[()])
            except (OSError, ValueError, TypeError) as err:
                raise ValueError(f"{owner}: {where}: its data cannot be read ({err})") from None
            if times.shape != raw_ids.shape or times.ndim != 1:
                raise ValueError(
                    f"{owner}: {where}: timestamps {times.shape} and {ids_name} "
                    f"{raw_ids.shape} must be 1-D of equal length"
                )
            if not np.isfinite(times).all():
                i = int(np.argmin(np.isfinite(times)))
                raise ValueError(
                    f"{owner}: {where}: timestamps must be finite, got {float(times[i])!r} at "
                    f"index {i}"
                )
            if raw_ids.dtype.kind == "i" and (raw_ids < 0).any():
                i = int(np.argmax(raw_ids < 0))
                raise ValueError(
                    f"{owner}: {where}: {ids_name} must be >= 0, got {int(raw_ids[i])} at index {i}"
                )
            if (
                raw_ids.dtype.kind == "u"
                and raw_ids.size
                and raw_ids.max() > np.iinfo(np.int64).max
            ):
                i = int(np.argmax(raw_ids > np.iinfo(np.int64).max))
                raise ValueError(
                    f"{owner}: {where}: {ids_name} must be below 2**63, got {int(raw_ids[i])} "
                    f"at index {i}"
                )
            ids = raw_ids.astype(np.int64)
            unit = text(ts_set.attrs.get("units", "ms"))
            if unit == "s":
                times = times * 1000.0
            elif unit != "ms":
                raise ValueError(
                    f"{owner}: {where}: timestamps has units {unit!r}; 'ms' or 's' allowed"
                )
            sorting = _read_sorting(owner, where, h5py, group)
            out[name] = {"timestamps": times, "node_ids": ids, "sorting": sorting}
    if not out:
        raise ValueError(f"{owner}: {file} has no populations under /spikes")
    return out


# ----------------------------------------------------------------------------- NWB


def _parameters(owner: str, model: Any) -> dict[str, Any]:
    """The array and scalar leaves of a model as `{path: value}`, JSON-ready."""
    out: dict[str, Any] = {}
    for key_path, x in jtu.tree_flatten_with_path(model)[0]:
        path = jtu.keystr(key_path) or "<root>"
        if isinstance(x, jax.core.Tracer):
            raise TypeError(f"{owner}: model leaf {path} is traced; call it outside jit")
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            a = np.asarray(x)
            if a.dtype.kind == "f" and a.dtype.itemsize < 8:
                # float32 parameters by their shortest decimal form: 1.62, not 1.6200000047...
                a = a.astype(str).astype(np.float64)
            if a.dtype.kind in "biuf":
                out[path] = a.tolist()
        elif isinstance(x, (bool, int, float, str)):
            out[path] = x
    return out


def _sparse_parameters(params: dict[str, Any], limit: int = 4096) -> dict[str, Any]:
    """Large leaves (connectivity, weights) are summarised, not copied into the metadata."""
    out = {}
    for path, value in params.items():
        a = np.asarray(value)
        if a.size > limit:
            out[path] = {
                "shape": list(a.shape),
                "dtype": str(a.dtype),
                "mean": float(a.mean()),
                "min": float(a.min()),
                "max": float(a.max()),
            }
        else:
            out[path] = value
    return out


def to_nwb(
    recording: Recording,
    path: str | os.PathLike,
    *,
    dt: float,
    record_every: int = 1,
    model: PyTree | None = None,
    population: str | None = None,
    populations: str | list[str] | None = None,
    trial: int | tuple[int, ...] | None = None,
    units: Mapping[str, str] | None = None,
    session_description: str = "neurojax simulation",
    identifier: str | None = None,
    session_start_time: datetime.datetime | None = None,
) -> None:
    """Write a recording to a Neurodata Without Borders (NWB 2) file with pynwb.

    - **Spikes**: the units table has one row per neuron, with its spike times [s] and the
      columns `population` and `neuron` (its index in the population). A spike in row `i`
      is dated `recording.t[i]`.
    - **Traces**: every recorded value (`record=("v",)`, or a network's
      `record={"E": ("v",)}`) is a `TimeSeries` in `acquisition`, named by its path with
      `_` for `/` (`v_E`), data `(t, neurons)`, `starting_time = recording.t[0]` [s] and
      `rate = 1000 / (dt * record_every)` [Hz], its unit from `units`.
    - **Model**: with `model=`, its parameters (every numeric leaf, by its path as written by
      `jax.tree_util.keystr`; leaves of more than 4096 elements, such as weights, by their
      shape, dtype, mean, min and max), its type and, for a network, its population sizes,
      as JSON in the scratch entry `neurojax_model`.

    Times in NWB are in seconds; neurojax's ms are divided by 1000. Needs `pynwb`
    (`pip install 'neurojax[nwb]'`).

    Args:
        recording: the `Recording` of `nj.simulate`.
        path: the `.nwb` file to write; an existing file is replaced.
        dt: the simulation step given to `nj.simulate` [ms].
        record_every: steps per recorded row, as given to `nj.simulate`.
        model: the simulated model (a neuron population or a `nj.Network`), or `None`.
        population: the name of a single population's recording (default `"neurons"`).
        populations: which of a network's populations to write: `None` (default)
            every neuron population, leaving out the inputs (spike sources such as
            `nj.PoissonSource` or the microcircuit's `background`, listed in
            `recording.sources`); `"all"` every population, inputs included; or a list of
            names.
        trial: for a batched recording, the trial to write; an NWB file holds one run.
        units: the unit of each recorded field, `{field: unit}` (default `{"v": "mV"}`;
            fields not listed get `"unknown"`).
        session_description: NWB's required description of the session.
        identifier: NWB's unique identifier of the file (default: a new UUID).
        session_start_time: a timezone-aware start time (default: now, UTC).

    Example:
    ```python
    final, rec = nj.simulate(net, state, dt=0.1, n_steps=2000, record={"E": ("v",)})
    nj.io.to_nwb(rec, "run.nwb", dt=0.1, model=net)
    with pynwb.NWBHDF5IO("run.nwb", "r") as io:
        units = io.read().units.to_dataframe()
    ```
    """
    owner = "to_nwb"
    _check_recording(owner, recording)
    p = _as_path(owner, path)
    t = _times(owner, recording)
    row = _row_ms(owner, dt, record_every, t)
    rasters = _rasters(owner, recording, population, populations)
    first = next(iter(rasters.values()))
    if first.shape[0] != t.size:
        raise ValueError(
            f"{owner}: the spikes have {first.shape[0]} rows but recording.t has {t.size} times"
        )
    index = _trial_index(owner, trial, first.shape[1:-1])
    traces = _traces(owner, recording, rasters)
    unit_of = _check_units(owner, units)
    _check_str(owner, "session_description", session_description)
    if identifier is not None:
        _check_str(owner, "identifier", identifier)
    if session_start_time is None:
        session_start_time = datetime.datetime.now(datetime.UTC)
    elif not isinstance(session_start_time, datetime.datetime) or session_start_time.tzinfo is None:
        raise TypeError(
            f"{owner}: session_start_time must be a timezone-aware datetime.datetime, got "
            f"{session_start_time!r}"
        )
    params = None if model is None else _sparse_parameters(_parameters(owner, model))
    _writable(owner, p)
    pynwb = _import(owner, "pynwb", "nwb")

    nwb = pynwb.NWBFile(
        session_description=session_description,
        identifier=identifier or str(uuid.uuid4()),
        session_start_time=session_start_time,
        source_script="neurojax",
        source_script_file_name="neurojax",
    )
    nwb.add_unit_column(name="population", description="neurojax population of the neuron")
    nwb.add_unit_column(name="neuron", description="index of the neuron in its population")
    for name, raster in rasters.items():
        r = _select(raster, index)
        times, ids = _spike_times(r, t)
        order = np.argsort(ids, kind="stable")
        split = np.searchsorted(ids[order], np.arange(r.shape[-1] + 1))
        times_s = times[order] / 1000.0
        for i in range(r.shape[-1]):
            nwb.add_unit(spike_times=times_s[split[i] : split[i + 1]], population=name, neuron=i)
    for name, _pop, trace in traces:
        nwb.add_acquisition(
            pynwb.TimeSeries(
                name=name.replace("/", "_"),
                data=_select(trace, index),
                unit=_unit_of(unit_of, name) or "unknown",
                starting_time=float(t[0]) / 1000.0,
                rate=1000.0 / row,
                description=f"neurojax recorded value {name!r}, time first, one column per neuron",
            )
        )
    if params is not None:
        meta: dict[str, Any] = {"type": type(model).__qualname__}
        sizes = getattr(model, "sizes", None)
        if isinstance(sizes, Mapping):
            meta["populations"] = {str(k): int(v) for k, v in sizes.items()}
        meta["parameters"] = params
        nwb.add_scratch(
            json.dumps(meta, allow_nan=True),
            name="neurojax_model",
            description="the simulated neurojax model: its type and parameters (JSON)",
        )
    with pynwb.NWBHDF5IO(str(p), "w") as io:
        io.write(nwb)


# ----------------------------------------------------------------------------- Neo


def to_neo(
    recording: Recording,
    *,
    dt: float,
    record_every: int = 1,
    population: str | None = None,
    populations: str | list[str] | None = None,
    units: Mapping[str, str] | None = None,
    name: str = "neurojax simulation",
) -> Any:
    """A `neo.Block` holding a recording: spike trains per neuron and traces as signals.

    - One `neo.Segment` per trial: a single one for an unbatched recording, else one per
      element of the batch axes, in C order, annotated with its `trial` index (a tuple).
    - In each segment, one `neo.SpikeTrain` per neuron [ms], from `t_start = t[0] - dt *
      record_every` (the start of the recording) to `t_stop = t[-1]`, annotated with its
      `population` and `neuron` index; a spike in row `i` is dated `recording.t[i]`.
    - In each segment, one `neo.AnalogSignal` per recorded value `(t, neurons)` named by its
      path (`v/E`), sampled every `dt * record_every` ms from `t[0]`.
    - The block's `groups`: one `neo.Group` per population, holding its spike trains and
      traces of every segment.

    The spike counts and the duration are those `nj.analysis` uses, so Elephant's rates and
    ISI statistics of the trains equal `nj.analysis.firing_rates` and `cv_isi`. Needs `neo`
    (`pip install 'neurojax[neo]'`).

    Args:
        recording: the `Recording` of `nj.simulate`.
        dt: the simulation step given to `nj.simulate` [ms].
        record_every: steps per recorded row, as given to `nj.simulate`.
        population: the name of a single population's recording (default `"neurons"`).
        populations: which of a network's populations to write: `None` (default)
            every neuron population, leaving out the inputs (spike sources such as
            `nj.PoissonSource` or the microcircuit's `background`, listed in
            `recording.sources`); `"all"` every population, inputs included; or a list of
            names.
        units: the unit of each recorded field, `{field: unit}` as `quantities` spells it
            (default `{"v": "mV"}`; other fields are dimensionless).
        name: the block's name.

    Returns:
        The `neo.Block`.

    Example:
    ```python
    block = nj.io.to_neo(rec, dt=0.1)
    trains = block.segments[0].spiketrains
    elephant.statistics.mean_firing_rate(trains[0]).rescale("Hz")
    ```
    """
    owner = "to_neo"
    _check_recording(owner, recording)
    t = _times(owner, recording)
    row = _row_ms(owner, dt, record_every, t)
    rasters = _rasters(owner, recording, population, populations)
    first = next(iter(rasters.values()))
    if first.shape[0] != t.size:
        raise ValueError(
            f"{owner}: the spikes have {first.shape[0]} rows but recording.t has {t.size} times"
        )
    traces = _traces(owner, recording, rasters)
    unit_of = _check_units(owner, units)
    _check_str(owner, "name", name)
    neo = _import(owner, "neo", "neo")
    pq = _import(owner, "quantities", "neo")
    for field, unit in unit_of.items():
        try:
            pq.Quantity(1.0, unit)
        except (LookupError, ValueError) as err:
            raise ValueError(
                f"{owner}: units[{field!r}] = {unit!r} is not a unit quantities knows ({err})"
            ) from None

    batch = first.shape[1:-1]
    t_start = round(float(t[0]) - row, max(_decimals(row), _decimals(float(t[0]))))
    t_stop = float(t[-1])
    block = neo.Block(name=name)
    groups = {pop: neo.Group(name=pop) for pop in rasters}
    for index in np.ndindex(*batch):
        label = f"trial {index}" if batch else "run"
        segment = neo.Segment(name=label, trial=tuple(int(i) for i in index))
        for pop, raster in rasters.items():
            r = _select(raster, index)
            times, ids = _spike_times(r, t)
            order = np.argsort(ids, kind="stable")
            split = np.searchsorted(ids[order], np.arange(r.shape[-1] + 1))
            times = times[order]
            for i in range(r.shape[-1]):
                train = neo.SpikeTrain(
                    times[split[i] : split[i + 1]],
                    units="ms",
                    t_start=t_start,
                    t_stop=t_stop,
                    name=f"{pop}[{i}]",
                    population=pop,
                    neuron=i,
                )
                segment.spiketrains.append(train)
                groups[pop].add(train)
        for trace_name, pop, trace in traces:
            unit = _unit_of(unit_of, trace_name) or "dimensionless"
            signal = neo.AnalogSignal(
                _select(trace, index),
                units=unit,
                t_start=float(t[0]) * pq.ms,
                sampling_period=row * pq.ms,
                name=trace_name,
                population=pop,
            )
            segment.analogsignals.append(signal)
            if pop is not None:
                groups[pop].add(signal)
        block.segments.append(segment)
    block.groups.extend(groups.values())
    block.check_relationships()
    return block
