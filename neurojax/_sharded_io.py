"""Checkpoints of sharded and multi-process states: `nj.save` / `nj.load` of a directory.

The single-file format of `neurojax.io` reads every array into one process's memory. A state
whose arrays are spread over the devices of several processes (`jax.distributed`, for
example a `nj.parallel.shard_network` state on a global mesh) cannot be read that way, and a
large one on many local devices should not be. This layout writes each process's shards
itself, with orbax-checkpoint (`pip install 'neurojax[orbax]'`), and keeps the guarantees of
the single file:

- **atomic**: the arrays go to a new subdirectory `data-<token>` (orbax writes it under a
  temporary name and renames it when complete); the commit is the atomic replacement
  (`os.replace`) of the header `neurojax_checkpoint.json`, which names that subdirectory.
  A save interrupted at any point leaves the previous header and its data intact; what it
  left behind (orbax's `*.orbax-checkpoint-tmp*` folders, data no header names) is removed
  when the next save to the directory starts.
- **verified**: the header stores, per array, a 64-bit checksum of its values computed on the
  devices where the array lives, in unsigned 32-bit arithmetic whose sum does not depend on
  the sharding or the order of the reduction; `load` recomputes it on what it read.
- **like-checked**: the header lists the tree's nodes and leaves exactly as the single-file
  format does, and `load` compares them with `like` before reading any array.

In a multi-process job every process calls `save` and `load` with the same arguments (they are
collective) and the directory must be on a file system all processes share. Process 0 writes
the header and removes the data of the previous checkpoint.
"""

import json
import pathlib
import secrets
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.experimental import multihost_utils

from ._checkpoint import (
    _HEADER,
    FORMAT,
    FORMAT_VERSION,
    _atomic_write,
    _check_header,
    _Corrupt,
    _dtype_name,
    _encode,
    _leaf_spec,
    _match,
    _match_statics,
    _neurojax_version,
    _nodes,
    _show,
    _statics,
    _structure,
    _structure_note,
)

__all__ = ["save_sharded", "load_sharded", "wants_sharded", "spans_processes", "digest"]

LAYOUT = "sharded"
_DATA_PREFIX = "data-"
_NUMERIC = "biufc"
# Constants of the checksum: odd multipliers (golden ratio, MurmurHash3's finaliser).
_C1, _C2, _C3 = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35


def _orbax(owner: str) -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:
        raise ImportError(
            f"{owner}: checkpoints of sharded or multi-process states need the optional "
            "package 'orbax-checkpoint', which is not installed: "
            "pip install 'neurojax[orbax]'"
        ) from err
    return ocp


# ----------------------------------------------------------------------------- checksums


def _fmix(xp: Any, h: Any) -> Any:
    """MurmurHash3's 32-bit finaliser: every input bit affects every output bit."""
    h = h ^ (h >> xp.uint32(16))
    h = h * xp.uint32(_C2)
    h = h ^ (h >> xp.uint32(13))
    h = h * xp.uint32(_C3)
    return h ^ (h >> xp.uint32(16))


def _digest_words(xp: Any, w: Any) -> Any:
    """Two uint32 sums of mixed (word, position) pairs. Sums of uint32 wrap modulo 2**32,
    which is associative and commutative: the result is the same for every sharding and
    reduction order."""
    idx = xp.arange(w.shape[0], dtype=xp.uint32)
    a = _fmix(xp, w ^ _fmix(xp, idx + xp.uint32(_C1)))
    b = _fmix(xp, w + idx * xp.uint32(_C2) + xp.uint32(_C3))
    return xp.stack([xp.sum(a, dtype=xp.uint32), xp.sum(b, dtype=xp.uint32)])


def _words_numpy(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.bool_:
        return a.astype(np.uint32)
    if a.dtype.kind == "c":
        a = a.view(a.real.dtype)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[a.dtype.itemsize]
    return a.view(unsigned).astype(np.uint32)


def _words_jax(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        return x.reshape(-1).astype(jnp.uint32)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], axis=-1)
    size = x.dtype.itemsize
    if size == 8:
        # A 64-bit element gives two 32-bit words, low word first (as NumPy's view on the
        # little-endian hosts JAX runs on).
        return lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
    return lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)


@jax.jit
def _digest_jax(x: jax.Array) -> jax.Array:
    return _digest_words(jnp, _words_jax(x))


def _hex(pair: Any) -> str:
    a, b = (int(v) for v in np.asarray(pair))
    return f"{a:08x}{b:08x}"


def digest(x: Any) -> str:
    """A 64-bit checksum (16 hex digits) of an array's values, equal for a NumPy array and a
    JAX array with the same values, whatever the JAX array's sharding."""
    if isinstance(x, jax.Array):
        if x.size == 0:
            return "0" * 16
        # The result is replicated on every device: readable in every process.
        return _hex(_digest_jax(x))
    a = np.asarray(x)
    if a.size == 0:
        return "0" * 16
    with np.errstate(over="ignore"):
        return _hex(_digest_words(np, _words_numpy(a)))


# ----------------------------------------------------------------------------- save


def wants_sharded(tree: Any) -> bool:
    """Whether `save` should write the sharded layout: in a multi-process job, or when an
    array of `tree` is not fully addressable from this process."""
    if jax.process_count() > 1:
        return True
    return any(spans_processes(x) for x in jtu.tree_leaves(tree))


def spans_processes(x: Any) -> bool:
    # Traced leaves are reported by `save` itself, with its own message.
    return (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and not x.is_fully_addressable
    )


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _token() -> str:
    """A random name for this save's data, the same in every process."""
    words = np.frombuffer(secrets.token_bytes(8), dtype=np.uint32)
    if jax.process_count() > 1:
        words = np.asarray(multihost_utils.broadcast_one_to_all(words))
    return "".join(f"{int(w):08x}" for w in words)


def _storable(owner: str, spec: dict, x: Any) -> Any:
    """What orbax stores for an array or key leaf (a global JAX array or a NumPy array)."""
    path = spec["path"]
    if isinstance(x, jax.ShapeDtypeStruct):
        raise TypeError(
            f"{owner}: leaf {_show(path)} is a jax.ShapeDtypeStruct, which has no values to save"
        )
    if spec["kind"] == "key":
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array):
        if jax.process_count() > 1 and x.is_fully_addressable:
            # A process-local array (not on the global mesh) holds the same values in every
            # process of an SPMD program: orbax stores NumPy arrays from process 0.
            return np.asarray(x)
        return x
    a = np.asarray(x)
    if a.dtype.kind not in _NUMERIC or a.dtype.names is not None:
        raise TypeError(
            f"{owner}: leaf {_show(path)} has dtype {a.dtype}; the sharded checkpoint layout "
            "stores bool, integer, float and complex arrays only (use the single-file layout, "
            "sharded=False, in a single process)"
        )
    return a


def save_sharded(owner: str, p: pathlib.Path, tree: Any) -> None:
    """Write `tree` to the directory `p` in the sharded layout (see the module docstring)."""
    directory = p.absolute().parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{owner}: the directory {str(directory)!r} of path {str(p)!r} does not exist"
        )
    if p.exists() and not p.is_dir():
        raise FileExistsError(
            f"{owner}: path {str(p)!r} is a file (a single-file checkpoint?); a sharded "
            "checkpoint is a directory: choose another path or remove the file"
        )
    if p.is_dir() and any(p.iterdir()) and not (p / _HEADER).is_file():
        raise FileExistsError(
            f"{owner}: path {str(p)!r} is a directory that is not a neurojax checkpoint "
            f"(no {_HEADER}); choose an empty or new directory"
        )
    flat, _ = jtu.tree_flatten_with_path(tree)
    specs, items = [], {}
    for index, (key_path, x) in enumerate(flat):
        spec = _leaf_spec(owner, jtu.keystr(key_path), x)
        if spec["kind"] in ("array", "key"):
            stored = _storable(owner, spec, x)
            if spec["kind"] == "key":
                spec["data_dtype"] = _dtype_name(stored.dtype)
            if stored.size == 0:
                # orbax refuses arrays without elements; the header's shape and dtype are
                # all there is to store.
                spec["item"], spec["digest"] = None, digest(stored)
            else:
                spec["item"] = f"{index:05d}"
                items[spec["item"]] = stored
        else:
            _encode(owner, spec, x, index)
        specs.append(spec)
    ocp = _orbax(owner)
    # Checksums before writing: computed where the shards live, collectively.
    for spec in specs:
        if spec.get("item") is not None:
            spec["digest"] = digest(items[spec["item"]])
    name = _DATA_PREFIX + _token()
    if jax.process_index() == 0:
        p.mkdir(exist_ok=True)
        _remove_leftovers(p)
        if not items:
            (p / name).mkdir()
    _barrier("neurojax-save-mkdir")
    if items:
        ocp.PyTreeCheckpointer().save(p / name, args=ocp.args.PyTreeSave(items))
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "layout": LAYOUT,
        "data": name,
        "process_count": jax.process_count(),
        "neurojax_version": _neurojax_version(),
        "jax_version": jax.__version__,
        "numpy_version": np.__version__,
        "orbax_version": getattr(ocp, "__version__", "unknown"),
        "nodes": [list(node) for node in _nodes(tree)],
        "leaves": specs,
        "static": _statics(tree),
        "structure": _structure(tree),
    }
    header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if jax.process_index() == 0:
        _atomic_write(owner, p / _HEADER, lambda f: f.write(header_bytes))
        # The new header is durable: the previous checkpoint's data (and what an interrupted
        # save left behind) can go.
        for old in p.iterdir():
            if old.name.startswith(_DATA_PREFIX) and old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    _barrier("neurojax-save-commit")


def _remove_leftovers(p: pathlib.Path) -> list[pathlib.Path]:
    """Remove what killed saves left in the checkpoint directory `p`: orbax's temporary
    folders (`data-<token>.orbax-checkpoint-tmp...`) and complete data folders that no
    header names. The data of the committed header is kept. Saves to one directory are
    collective and never concurrent, so nothing else writes there now."""
    current = None
    try:
        header = json.loads((p / _HEADER).read_bytes().decode("utf-8"))
        current = header.get("data") if isinstance(header, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    removed = []
    for entry in p.iterdir():
        if entry.name.startswith(_DATA_PREFIX) and entry.name != current:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


# ----------------------------------------------------------------------------- load


def _check_sharded_header(header: Any, p: pathlib.Path) -> None:
    if not isinstance(header, dict) or header.get("layout") != LAYOUT:
        raise _Corrupt(f"its header does not describe the {LAYOUT!r} layout")
    leaves = header.get("leaves")
    if not isinstance(leaves, list) or not all(isinstance(s, dict) for s in leaves):
        raise _Corrupt("its header is invalid: leaves must be a list of objects")
    # The single-file checks cover the format, version, nodes and Python scalars.
    scalars = [s for s in leaves if s.get("kind") not in ("array", "key")]
    _check_header({**header, "leaves": scalars}, set())
    data = header.get("data")
    if not isinstance(data, str) or not data.startswith(_DATA_PREFIX) or "/" in data:
        raise _Corrupt(f"its header is invalid: data is {data!r}")
    if not (p / data).is_dir():
        raise _Corrupt(f"its data directory {data!r} is missing")

    def is_shape(s: Any) -> bool:
        return isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s)

    for i, spec in enumerate(leaves):
        kind = spec.get("kind")
        if kind not in ("array", "key"):
            continue
        where = f"leaf {_show(str(spec.get('path')))}"
        ok = (
            isinstance(spec.get("path"), str)
            and is_shape(spec.get("shape"))
            and (isinstance(spec.get("item"), str) or spec.get("item") is None)
            and isinstance(spec.get("digest"), str)
            and len(spec["digest"]) == 16
            and all(c in "0123456789abcdef" for c in spec["digest"])
        )
        if kind == "array":
            ok = ok and isinstance(spec.get("dtype"), str)
        else:
            ok = (
                ok
                and isinstance(spec.get("impl"), str)
                and is_shape(spec.get("data_shape"))
                and isinstance(spec.get("data_dtype"), str)
            )
        if not ok:
            raise _Corrupt(f"its header is invalid: leaves[{i}] ({where}) is incomplete")


def _sharding_of(owner: str, spec: dict, like: Any) -> Any:
    sharding = getattr(like, "sharding", None)
    if sharding is not None:
        return sharding
    if jax.process_count() > 1:
        raise ValueError(
            f"{owner}: like leaf {_show(spec['path'])} is a jax.ShapeDtypeStruct without a "
            "sharding; in a multi-process job every abstract leaf needs one "
            "(jax.ShapeDtypeStruct(shape, dtype, sharding=...))"
        )
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def load_sharded(owner: str, p: pathlib.Path, like: Any) -> Any:
    """Read the sharded checkpoint in the directory `p` into a tree like `like`."""
    where = repr(str(p))
    flat, treedef = jtu.tree_flatten_with_path(like)
    like_leaves = [x for _, x in flat]
    like_specs = [_leaf_spec(owner, jtu.keystr(kp), x) for kp, x in flat]
    like_nodes = _nodes(like)
    header_path = p / _HEADER
    if not header_path.is_file():
        raise ValueError(
            f"{owner}: cannot read checkpoint {where}: it is a directory without {_HEADER} "
            "(not a neurojax checkpoint, or its first save did not complete)"
        )
    try:
        try:
            header = json.loads(header_path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise _Corrupt(f"its header is damaged ({err})") from None
        _check_sharded_header(header, p)
    except _Corrupt as err:
        raise ValueError(f"{owner}: cannot read checkpoint {where}: {err}") from None
    try:
        _match(where, header, like_nodes, like_specs)
        _match_statics(where, header, like, owner)
    except ValueError as err:
        raise ValueError(str(err) + _structure_note(header, like)) from None
    ocp = _orbax(owner)
    restore_args, empty = {}, {}
    for spec, x in zip(header["leaves"], like_leaves, strict=True):
        if spec["kind"] not in ("array", "key"):
            continue
        if spec["kind"] == "key":
            shape, dtype = tuple(spec["data_shape"]), jnp.dtype(spec["data_dtype"])
        else:
            shape, dtype = tuple(spec["shape"]), jnp.dtype(spec["dtype"])
        host = isinstance(x, (np.ndarray, np.generic))
        sharding = None if host else _sharding_of(owner, spec, x)
        if spec["item"] is None:
            empty[spec["path"]] = _empty(shape, dtype, sharding)
        elif host:
            restore_args[spec["item"]] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
        else:
            restore_args[spec["item"]] = ocp.ArrayRestoreArgs(
                sharding=sharding, global_shape=shape, dtype=dtype
            )
    values: dict[str, Any] = {}
    if restore_args:
        try:
            values = ocp.PyTreeCheckpointer().restore(
                p / header["data"],
                args=ocp.args.PyTreeRestore(item=None, restore_args=restore_args),
            )
        except Exception as err:  # noqa: BLE001  (orbax and tensorstore raise many types)
            raise ValueError(
                f"{owner}: cannot read checkpoint {where}: its data is damaged or incomplete "
                f"({type(err).__name__}: {str(err)[:500]})"
            ) from None
    leaves = []
    for spec, x in zip(header["leaves"], like_leaves, strict=True):
        kind = spec["kind"]
        if kind not in ("array", "key"):
            leaves.append(_scalar(spec, x))
            continue
        if spec["item"] is None:
            value = empty[spec["path"]]
        else:
            value = values.get(spec["item"]) if isinstance(values, dict) else None
        if value is None:
            raise ValueError(
                f"{owner}: cannot read checkpoint {where}: the array of leaf "
                f"{_show(spec['path'])} is missing from its data"
            )
        if tuple(np.shape(value)) != tuple(spec["data_shape" if kind == "key" else "shape"]):
            raise ValueError(
                f"{owner}: cannot read checkpoint {where}: the array of leaf "
                f"{_show(spec['path'])} has shape {np.shape(value)}, the header says "
                f"{tuple(spec['shape'])}"
            )
        if digest(value) != spec["digest"]:
            raise ValueError(
                f"{owner}: cannot read checkpoint {where}: the values of leaf "
                f"{_show(spec['path'])} do not match their checksum (the data is damaged)"
            )
        leaves.append(_array(spec, value, x))
    return jtu.tree_unflatten(treedef, leaves)


def _empty(shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
    """An array without elements, on the host (`sharding=None`) or placed by `sharding`."""
    zeros = np.zeros(shape, dtype)
    if sharding is None:
        return zeros
    return jax.make_array_from_callback(shape, sharding, lambda index: zeros[index])


def _scalar(spec: dict, like: Any) -> Any:
    kind = spec["kind"]
    if kind == "object":
        return like
    if kind in ("bool", "int", "str"):
        return spec["value"]
    if kind == "float":
        return float.fromhex(spec["value"])
    return complex(float.fromhex(spec["value"][0]), float.fromhex(spec["value"][1]))


def _array(spec: dict, value: Any, like: Any) -> Any:
    if spec["kind"] == "key":
        if isinstance(value, np.ndarray):
            value = jnp.asarray(value)
        return jax.random.wrap_key_data(value, impl=spec["impl"])
    if isinstance(like, np.generic):
        return np.asarray(value)[()]
    if isinstance(like, np.ndarray):
        return np.asarray(value)
    if getattr(like, "weak_type", False) and isinstance(like, jax.Array):
        # As in the single-file layout: a weakly typed leaf stays weak.
        return lax.full_like(like, 0).at[...].set(value)
    return value
