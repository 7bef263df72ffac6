"""The neurojax checkpoint format, shared by its two layouts: one file (`neurojax.io`) and a
directory of shards (`neurojax._sharded_io`).

What both layouts write and check in the same way lives here: the header's description of a
tree (its nodes, and per leaf its kind, shape, dtype and PRNG implementation), the static
configuration of its modules and a fingerprint of its structure, the comparison of a header
with the `like` tree given to `load`, and the atomic write of a file. The format itself is
described in `neurojax.io`.
"""

import contextlib
import hashlib
import json
import os
import pathlib
import secrets
import sys
import warnings
from collections.abc import Callable
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

FORMAT = "neurojax-checkpoint"
FORMAT_VERSION = 2
# Version 2 added a SHA-256 to every leaf stored in the header itself (bool, int, float,
# complex, str); version-1 files, which have none there, still load.
_SCALAR_DIGEST_SINCE = 2
_HEADER = "neurojax_checkpoint.json"
_SCALAR_KINDS = ("bool", "int", "float", "complex", "str")
_KINDS = ("array", "key", "object") + _SCALAR_KINDS
_NATIVE_KINDS = "biufcUSmM"  # dtype kinds that .npy stores without pickle

# ----------------------------------------------------------------------------- helpers


def _as_path(owner: str, path: Any) -> pathlib.Path:
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if isinstance(text, str) and text:
            return pathlib.Path(text)
    raise TypeError(f"{owner}: path must be a non-empty str or pathlib.Path, got {path!r}")


def _show(path: str) -> str:
    return path if path else "<root>"


def _is_key_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl(x: Any) -> str:
    if isinstance(x, jax.ShapeDtypeStruct):
        # jax.random.key_impl takes only key arrays; an abstract key exposes its
        # implementation through its dtype.
        impl = getattr(x.dtype, "_impl", None)
        return str(getattr(impl, "name", x.dtype))
    return str(jax.random.key_impl(x))


def _dtype_name(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    # Strings and datetimes need their size or unit; every other dtype is named.
    return dtype.str if dtype.kind in "USmM" else dtype.name


def _bytes_of(arr: np.ndarray) -> np.ndarray:
    return np.asarray(arr, order="C").reshape(-1).view(np.uint8)


def _sha256(arr: np.ndarray) -> str:
    return hashlib.sha256(_bytes_of(arr)).hexdigest()


def _scalar_sha256(kind: str, value: Any) -> str:
    """The SHA-256 of a header-stored leaf: its kind and value in canonical JSON."""
    text = json.dumps([kind, value], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _leaf_spec(owner: str, path: str, x: Any) -> dict[str, Any]:
    """What a leaf is (kind, shape, dtype, key implementation), without its values."""
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"{owner}: leaf {_show(path)} is a traced value; {owner} reads or writes files and "
            "must be called outside jit, vmap and grad"
        )
    if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        shape = [int(s) for s in x.shape]
        if _is_key_dtype(x.dtype):
            data = jax.eval_shape(jax.random.key_data, x)  # abstract: no device work
            return {
                "path": path,
                "kind": "key",
                "impl": _key_impl(x),
                "shape": shape,
                "data_shape": [int(s) for s in data.shape],
            }
        return {"path": path, "kind": "array", "shape": shape, "dtype": _dtype_name(x.dtype)}
    # bool before int: bool is a subclass of int.
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("complex", complex)):
        if isinstance(x, types):
            return {"path": path, "kind": kind}
    if isinstance(x, str):
        return {"path": path, "kind": "str"}
    return {"path": path, "kind": "object", "type": type(x).__qualname__}


def _describe(spec: dict[str, Any]) -> str:
    kind = spec["kind"]
    if kind == "array":
        return f"a {spec['dtype']} array of shape {tuple(spec['shape'])}"
    if kind == "key":
        return f"a PRNG key array ({spec['impl']}) of shape {tuple(spec['shape'])}"
    if kind == "object":
        return f"an object of type {spec.get('type', '?')} (not stored)"
    return f"a Python {kind}"


def _nodes(tree: Any) -> list[tuple[str, str]]:
    """(path, type name) of every internal node of `tree` (None included), in pre-order."""
    out: list[tuple[str, str]] = []

    def visit(x: Any, path: str) -> None:
        def one_level(y: Any) -> bool:
            return y is not x

        if jtu.tree_structure(x, is_leaf=one_level).node_data() is None:
            return  # a leaf
        out.append((path, type(x).__qualname__))
        children, _ = jtu.tree_flatten_with_path(x, is_leaf=one_level)
        for key_path, child in children:
            visit(child, path + jtu.keystr(key_path))

    visit(tree, "")
    return out


class _NotStored(Exception):
    """Internal: a static value with no exact JSON form (a function, a class)."""


def _static_value(v: Any) -> Any:
    """An exact JSON form of a static field's value (floats as hex, containers tagged)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return ["float", float(v).hex()]
    if isinstance(v, (tuple, list)):
        return ["tuple" if isinstance(v, tuple) else "list", [_static_value(x) for x in v]]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return ["dict", [[k, _static_value(x)] for k, x in v.items()]]
    raise _NotStored


def _show_static(enc: Any) -> str:
    """The value of `_static_value`'s form, as Python writes it."""
    if isinstance(enc, list) and len(enc) == 2 and enc[0] == "float":
        return repr(float.fromhex(enc[1]))
    if isinstance(enc, list) and len(enc) == 2 and enc[0] in ("tuple", "list"):
        items = [_show_static(x) for x in enc[1]]
        if enc[0] == "tuple":
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        return f"[{', '.join(items)}]"
    if isinstance(enc, list) and len(enc) == 2 and enc[0] == "dict":
        return "{" + ", ".join(f"{k!r}: {_show_static(x)}" for k, x in enc[1]) + "}"
    return repr(enc)


def _statics(tree: Any) -> dict[str, dict[str, Any]]:
    """Per module node of `tree` (by path, as in `_nodes`), its static fields (the sizes,
    method names, delays in steps that `load` cannot take from the file's arrays)."""
    import dataclasses

    import equinox as eqx

    out: dict[str, dict[str, Any]] = {}

    def visit(x: Any, path: str) -> None:
        def one_level(y: Any) -> bool:
            return y is not x

        if jtu.tree_structure(x, is_leaf=one_level).node_data() is None:
            return
        if isinstance(x, eqx.Module) and dataclasses.is_dataclass(x):
            fields = _static_fields(x)
            if fields:
                out[path] = fields
        children, _ = jtu.tree_flatten_with_path(x, is_leaf=one_level)
        for key_path, child in children:
            visit(child, path + jtu.keystr(key_path))

    visit(tree, "")
    return out


def _match_statics(where: str, header: dict, like: Any, owner: str = "load") -> None:
    """Refuse a `like` whose static configuration differs from the one saved; warn, naming
    what comes from `like` unchecked, when the header has no `static` section."""
    saved = header.get("static")
    mine = _statics(like)
    if saved is None:
        # Written before static fields were stored, or the section was removed: the sizes,
        # delays in steps and method names of like are taken as they are.
        if mine:
            parts = [f"{_show(path)} ({', '.join(fields)})" for path, fields in mine.items()]
            warnings.warn(
                f"{owner}: checkpoint {where} has no 'static' section (written by an older "
                "neurojax, or edited), so the static configuration of like is used unchecked: "
                f"{'; '.join(parts[:5])}{'; ...' if len(parts) > 5 else ''}. Build like with "
                "the configuration that was saved",
                UserWarning,
                stacklevel=3,
            )
        return
    for path, fields in saved.items():
        ours = mine.get(path, {})
        for name, value in fields.items():
            if name in ours and ours[name] != value:
                raise _mismatch(
                    where,
                    path,
                    f"static field {name!r} is {_show_static(value)} in the checkpoint but "
                    f"{_show_static(ours[name])} in like; build like with the configuration "
                    "that was saved",
                )


def _within(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it (paths as written by `jtu.keystr`)."""
    return not root or path == root or (path.startswith(root) and path[len(root)] in ".[")


def _static_fields(x: Any) -> dict[str, Any]:
    """The static fields of module `x` that have an exact JSON form (see `_statics`)."""
    import dataclasses

    fields = {}
    for field in dataclasses.fields(x):
        if not field.metadata.get("static", False):
            continue
        try:
            fields[field.name] = _static_value(getattr(x, field.name))
        except (_NotStored, AttributeError):
            continue
    return fields


def _structure(tree: Any) -> dict[str, dict[str, str]]:
    """A fingerprint of the structure of every module of `tree`, by node path: its type, its
    role (`"model"` for an object with `init_state` and `step`, such as a network, else
    `"state"`) and a 64-bit hash of what `load` compares (the node types, the kind, shape,
    dtype and key implementation of every leaf, and the static fields) within it. Two modules
    with the same fingerprint differ at most in their values. One pass over the tree, each
    node's hash made from its children's."""
    import dataclasses

    import equinox as eqx

    out: dict[str, dict[str, str]] = {}

    def digest(item: Any) -> str:
        text = json.dumps(item, separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def visit(x: Any, path: str) -> str:
        def one_level(y: Any) -> bool:
            return y is not x

        if jtu.tree_structure(x, is_leaf=one_level).node_data() is None:
            spec = _leaf_spec("save", path, x)
            return digest([spec["kind"], spec.get("shape"), spec.get("dtype"), spec.get("impl")])
        children = [
            [jtu.keystr(key_path), visit(child, path + jtu.keystr(key_path))]
            for key_path, child in jtu.tree_flatten_with_path(x, is_leaf=one_level)[0]
        ]
        module = isinstance(x, eqx.Module) and dataclasses.is_dataclass(x)
        statics = _static_fields(x) if module else {}
        mine = digest([type(x).__qualname__, statics, children])
        if module:
            model = callable(getattr(x, "init_state", None)) and callable(getattr(x, "step", None))
            out[path] = {
                "type": type(x).__qualname__,
                "role": "model" if model else "state",
                "fingerprint": mine,
            }
        return mine

    visit(tree, "")
    return out


def _structure_note(header: dict, like: Any) -> str:
    """What the structure fingerprints of the header and of `like` say about a mismatch:
    which modules differ, and whether a model (a network) or only a state does. Empty for
    files written before fingerprints were stored."""
    saved = header.get("structure")
    if not isinstance(saved, dict):
        return ""
    try:
        mine = _structure(like)
    except Exception:  # noqa: BLE001  (the mismatch itself is the error to report)
        return ""

    def fingerprint(table: dict, path: str) -> Any:
        entry = table.get(path)
        return entry.get("fingerprint") if isinstance(entry, dict) else None

    differ = sorted(
        p for p in set(saved) | set(mine) if fingerprint(saved, p) != fingerprint(mine, p)
    )
    # The shallowest differing modules below the root, then, inside each, the deepest.
    tops = [p for p in differ if p and not any(q and q != p and _within(p, q) for q in differ)]
    if not tops:
        tops = [p for p in differ if not p]
    if not tops:
        return ""

    def describe(path: str) -> str:
        entry = mine.get(path) or saved.get(path) or {}
        inner = [
            q
            for q in differ
            if q != path and _within(q, path) and not any(r != q and _within(r, q) for r in differ)
        ]
        where = f"; inside it {', '.join(_show(q) for q in inner[:3])}" if inner else ""
        return f"{_show(path)} (a {entry.get('type', '?')}, {entry.get('role', '?')}{where})"

    def role(path: str) -> str:
        return (mine.get(path) or saved.get(path) or {}).get("role", "state")

    models = [p for p in tops if role(p) == "model"]
    listed = "; ".join(describe(p) for p in tops[:4])
    if models:
        return (
            f". The structure fingerprints stored in the checkpoint show that the model "
            f"itself differs, not only a state: {listed}. like was built with another "
            "structure (for a network: connectivity drawn from another key, or other "
            "arguments); build it as the saved one was (the same key and arguments)"
        )
    return (
        f". The structure fingerprints stored in the checkpoint show that a state differs: "
        f"{listed}. A state's shapes come from the model that made it (a network drawn from "
        "another key has other ring buffers and synapse states): make like with the "
        "init_state of the model that was saved (the same key and arguments)"
    )


def _neurojax_version() -> str:
    package = sys.modules.get(__name__.rpartition(".")[0])
    return str(getattr(package, "__version__", "unknown"))


def _fsync_directory(directory: pathlib.Path) -> None:
    # Makes the rename itself durable; not possible on every platform (Windows), hence best
    # effort.
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Temporary files of a save: `.<target name>.<host>-<pid>.<random>.tmp` beside the target,
# so that a later save can tell a file of a writer that no longer exists (killed) from one
# still being written by another process.
_HOST = "".join(c if c.isalnum() or c == "-" else "_" for c in os.uname().nodename) or "host"


def _writer_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _remove_stale_temporaries(path: pathlib.Path) -> list[pathlib.Path]:
    """Remove the temporary files of earlier saves to `path` whose writer process (on this
    host) no longer exists: a save killed between creating its temporary file and renaming
    it leaves one behind. Files of live writers, of other hosts and of other targets are
    kept. Returns the paths removed."""
    removed = []
    prefix = f".{path.name}.{_HOST}-"
    try:
        entries = list(os.scandir(path.absolute().parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit() or _writer_alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(pathlib.Path(entry.path))
    return removed


def _atomic_write(owner: str, path: pathlib.Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file with `write(fileobj)` so that `path` is either the old or the new file.

    Temporary files that killed saves to the same `path` left behind are removed first
    (`_remove_stale_temporaries`). An `OSError` (a full disk, a read-only folder) is raised
    again, of the same class and errno, with `owner` and the target path in its message."""
    directory = path.absolute().parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{owner}: the directory {str(directory)!r} of path {str(path)!r} does not exist"
        )
    if path.is_dir():
        raise IsADirectoryError(f"{owner}: path {str(path)!r} is a directory, expected a file")
    _remove_stale_temporaries(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    tmp = None
    try:
        while True:
            tmp = directory / f".{path.name}.{_HOST}-{os.getpid()}.{secrets.token_hex(8)}.tmp"
            try:
                # Mode 0o666 lets the umask decide the permissions, as for any new file.
                fd = os.open(tmp, flags, 0o666)
                break
            except FileExistsError:
                continue
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(err, OSError):
            reason = err.strerror or str(err)
            new = type(err)(f"{owner}: cannot write {str(path)!r}: {reason}")
            # errno only: with strerror or filename set, str() would drop the message.
            new.errno = err.errno
            raise new from err
        raise
    _fsync_directory(directory)


def _encode(owner: str, spec: dict[str, Any], x: Any, index: int) -> np.ndarray | None:
    """Complete `spec` with how the leaf is stored; return the array to store (or None)."""
    kind, path = spec["kind"], spec["path"]
    if isinstance(x, jax.ShapeDtypeStruct):
        raise TypeError(
            f"{owner}: leaf {_show(path)} is a jax.ShapeDtypeStruct, which has no values to save"
        )
    if kind in ("array", "key"):
        if kind == "key":
            data = np.asarray(jax.random.key_data(x))
            spec["data_shape"] = [int(s) for s in data.shape]
            spec["data_dtype"] = _dtype_name(data.dtype)
            encoding = "npy"
        else:
            data = np.asarray(x)
            if data.dtype.kind == "O" or data.dtype.names is not None:
                raise TypeError(
                    f"{owner}: leaf {_show(path)} is a NumPy array of dtype {data.dtype}, which "
                    "cannot be stored without pickle; only numeric, bool and string arrays can"
                )
            if data.dtype.kind in _NATIVE_KINDS:
                encoding = "npy"
            else:
                try:
                    known = jnp.dtype(data.dtype.name) == data.dtype
                except TypeError:
                    known = False
                if not known:
                    raise TypeError(
                        f"{owner}: leaf {_show(path)} has dtype {data.dtype}, which neither .npy "
                        "nor jax.numpy can name"
                    )
                encoding = "raw"
                data = _bytes_of(data).reshape(data.shape + (data.dtype.itemsize,))
        spec["encoding"] = encoding
        spec["member"] = f"leaves/{index:05d}.npy"
        spec["sha256"] = _sha256(data)
        return data
    if kind == "bool":
        spec["value"] = bool(x)
    elif kind == "int":
        spec["value"] = int(x)
    elif kind == "float":
        spec["value"] = float(x).hex()
    elif kind == "complex":
        spec["value"] = [complex(x).real.hex(), complex(x).imag.hex()]
    elif kind == "str":
        spec["value"] = str(x)
    if kind in _SCALAR_KINDS:
        spec["sha256"] = _scalar_sha256(kind, spec["value"])
    return None


# ----------------------------------------------------------------------------- load


class _Corrupt(Exception):
    """Internal: what is wrong with a checkpoint file (turned into a ValueError)."""


def _check_header(header: Any, members: set[str]) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise _Corrupt(f"its header is invalid: {what}")

    def is_shape(s: Any) -> bool:
        return isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s)

    def is_sha256(s: Any) -> bool:
        return isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s)

    need(isinstance(header, dict), "not a JSON object")
    need(header.get("format") == FORMAT, f"format is {header.get('format')!r}, not {FORMAT!r}")
    version = header.get("format_version")
    need(isinstance(version, int) and version >= 1, f"format_version is {version!r}")
    if version > FORMAT_VERSION:
        raise _Corrupt(
            f"it has format_version {version}, written by a newer neurojax "
            f"({header.get('neurojax_version')}); this one reads versions up to "
            f"{FORMAT_VERSION}; upgrade neurojax"
        )
    nodes, leaves = header.get("nodes"), header.get("leaves")
    need(
        isinstance(nodes, list)
        and all(
            isinstance(n, list) and len(n) == 2 and all(isinstance(s, str) for s in n)
            for n in nodes
        ),
        "nodes must be a list of [path, type] pairs",
    )
    need(isinstance(leaves, list), "leaves must be a list")
    structure = header.get("structure", {})
    need(
        isinstance(structure, dict) and all(isinstance(f, dict) for f in structure.values()),
        "structure must map node paths to objects",
    )
    static = header.get("static", {})
    need(
        isinstance(static, dict) and all(isinstance(f, dict) for f in static.values()),
        "static must map node paths to objects of static fields",
    )
    for i, spec in enumerate(leaves):
        need(isinstance(spec, dict), f"leaves[{i}] is not an object")
        need(isinstance(spec.get("path"), str), f"leaves[{i}] has no path")
        kind = spec.get("kind")
        need(kind in _KINDS, f"leaves[{i}] has unknown kind {kind!r}")
        where = f"leaf {_show(spec['path'])}"
        if kind in ("array", "key"):
            need(is_shape(spec.get("shape")), f"{where} has no valid shape")
            member = spec.get("member")
            need(
                isinstance(member, str) and member in members,
                f"{where}: its array is missing from the archive",
            )
            need(is_sha256(spec.get("sha256")), f"{where} has no SHA-256")
            need(spec.get("encoding") in ("npy", "raw"), f"{where} has unknown encoding")
        if kind == "array":
            need(isinstance(spec.get("dtype"), str), f"{where} has no dtype")
        if kind == "key":
            need(isinstance(spec.get("impl"), str), f"{where} has no PRNG implementation")
            need(is_shape(spec.get("data_shape")), f"{where} has no key data shape")
            need(isinstance(spec.get("data_dtype"), str), f"{where} has no key data dtype")
            need(spec.get("encoding") == "npy", f"{where} has unknown encoding")
        value = spec.get("value")
        if kind in _SCALAR_KINDS and (version >= _SCALAR_DIGEST_SINCE or "sha256" in spec):
            # Array leaves are checked against their SHA-256 when read; a value kept in the
            # header is checked here, so an edited header cannot change it silently.
            need(is_sha256(spec.get("sha256")), f"{where} has no SHA-256")
            if spec["sha256"] != _scalar_sha256(kind, value):
                raise _Corrupt(f"the value of {where} does not match its SHA-256 checksum")
        if kind in ("bool", "int", "str"):
            need(type(value) is {"bool": bool, "int": int, "str": str}[kind], f"{where}: bad value")
        if kind in ("float", "complex"):
            parts = [value] if kind == "float" else value
            need(
                isinstance(parts, list) and len(parts) == (1 if kind == "float" else 2),
                f"{where}: bad value",
            )
            try:
                for part in parts:
                    float.fromhex(part)
            except (TypeError, ValueError):
                raise _Corrupt(f"its header is invalid: {where}: bad value") from None


def _mismatch(where: str, path: str, what: str) -> ValueError:
    return ValueError(f"load: like does not match the checkpoint {where} at {_show(path)}: {what}")


def _match(where: str, header: dict, like_nodes: list, like_specs: list) -> None:
    """Raise a ValueError naming the first leaf or node where `like` differs."""
    saved: dict[str, tuple[str, Any]] = {}
    for path, kind in header["nodes"]:
        saved[path] = ("node", kind)
    for spec in header["leaves"]:
        saved[spec["path"]] = ("leaf", spec)
    mine: dict[str, tuple[str, Any]] = {}
    for path, kind in like_nodes:
        mine[path] = ("node", kind)
    for spec in like_specs:
        mine[spec["path"]] = ("leaf", spec)

    def text(entry: tuple[str, Any]) -> str:
        what, item = entry
        if what == "node":
            return "None" if item == "NoneType" else f"a {item}"
        return _describe(item)

    def top_level(paths: list[str]) -> list[str]:
        # A missing subtree is reported once, by its root.
        out: list[str] = []
        for p in paths:
            if not any(p.startswith(q) and p[len(q) : len(q) + 1] in (".", "[") for q in out):
                out.append(p)
        return out

    for path in list(saved) + [p for p in mine if p not in saved]:
        a, b = saved.get(path), mine.get(path)
        if a is None:
            extra = top_level([p for p in mine if p not in saved])
            raise _mismatch(
                where,
                path,
                f"like has {text(b)} here, which the checkpoint does not have (parts of like not "
                f"in the checkpoint: {', '.join(_show(p) for p in extra[:5])}"
                f"{', ...' if len(extra) > 5 else ''}); the checkpoint has "
                f"{len(header['leaves'])} leaves, like {len(like_specs)}",
            )
        if b is None:
            missing = top_level([p for p in saved if p not in mine])
            raise _mismatch(
                where,
                path,
                f"the checkpoint has {text(a)} here, which like does not have (parts of the "
                f"checkpoint missing from like: {', '.join(_show(p) for p in missing[:5])}"
                f"{', ...' if len(missing) > 5 else ''}); the checkpoint has "
                f"{len(header['leaves'])} leaves, like {len(like_specs)}",
            )
        if a[0] != b[0] or (a[0] == "node" and a[1] != b[1]):
            raise _mismatch(where, path, f"the checkpoint has {text(a)}, like {text(b)}")
        if a[0] == "node":
            continue
        s, m = a[1], b[1]
        if s["kind"] != m["kind"]:
            raise _mismatch(where, path, f"the checkpoint has {text(a)}, like {text(b)}")
        if s["kind"] == "key" and s["impl"] != m["impl"]:
            raise _mismatch(
                where,
                path,
                f"the checkpoint has a PRNG key of implementation {s['impl']!r}, like one of "
                f"{m['impl']!r}",
            )
        if s["kind"] in ("array", "key") and s["shape"] != m["shape"]:
            raise _mismatch(
                where,
                path,
                f"the checkpoint has shape {tuple(s['shape'])}, like {tuple(m['shape'])}",
            )
        if s["kind"] == "key" and s["data_shape"] != m["data_shape"]:
            raise ValueError(
                f"load: cannot read checkpoint {where}: its header is invalid: leaf "
                f"{_show(path)} holds key data of shape {tuple(s['data_shape'])}, but keys of "
                f"shape {tuple(s['shape'])} ({s['impl']}) have data of shape "
                f"{tuple(m['data_shape'])}"
            )
        if s["kind"] == "array" and s["dtype"] != m["dtype"]:
            raise _mismatch(
                where, path, f"the checkpoint has dtype {s['dtype']}, like {m['dtype']}"
            )
    order = [spec["path"] for spec in header["leaves"]]
    if order != [spec["path"] for spec in like_specs]:
        raise ValueError(
            f"load: like has the leaves of the checkpoint {where} in a different order; "
            "build like with the same container types as the saved tree"
        )
