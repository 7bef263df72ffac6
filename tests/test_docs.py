"""The documentation contract: every public name has a docstring and an API entry, and the
site's nav points only at pages that exist.

Public names are those re-exported by `neurojax/__init__.py` and by the `__init__.py` of
every subpackage (`from ._x import Y as Y`, names not starting with `_`), the `__all__` of
the public plain modules (`neurojax.io`, `neurojax.surrogate`), and the public methods and
properties of every public class, including those it inherits from neurojax base classes.

A docstring is read from the source (as Griffe, the parser behind mkdocstrings, reads it),
not from `__doc__`: equinox and dataclasses write a signature into `__doc__` of a class that
has none, and a method does not inherit the docstring it overrides when rendered.

An API entry is a `::: dotted.path` directive of `docs/api/*.md` that renders the object.
What mkdocstrings renders (checked on this repository with mkdocstrings-python 2.0):
- `::: a.b.Name` renders that object; a class directive also renders its public methods and
  properties that have a docstring, unless its options say `members: false` or list others;
- `::: package` renders NO re-exported names (`from ._x import Y as Y` are aliases, which it
  leaves out unless listed), so a package directive covers only the names of an explicit
  `members: [...]` list;
- `::: plain.module` renders the public names defined in that module (not those it imports).
"""

import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import neurojax

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API = DOCS / "api"
PACKAGE = "neurojax"


# ------------------------------------------------------------------------------ source reading


@cache
def _tree(module_name: str) -> ast.Module:
    module = importlib.import_module(module_name)
    return ast.parse(Path(module.__file__).read_text(encoding="utf-8"))


def _resolve_from(module_name: str, node: ast.ImportFrom) -> str:
    """The absolute module name of a `from ... import` inside `module_name`."""
    if node.level == 0:
        return node.module or ""
    module = importlib.import_module(module_name)
    package = module_name if hasattr(module, "__path__") else module_name.rpartition(".")[0]
    base = package.split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _reexports(package: str) -> dict[str, tuple[str, str]]:
    """Public names of a package's `__init__.py`: name -> (source module, original name)."""
    out = {}
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            source = _resolve_from(package, node)
            for alias in node.names:
                name = alias.asname or alias.name
                if not name.startswith("_"):
                    out[name] = (source, alias.name)
    return out


def _attribute_docstring(body: list[ast.stmt], index: int) -> str | None:
    """The string literal right after the assignment `body[index]` (an attribute docstring)."""
    if index + 1 < len(body):
        nxt = body[index + 1]
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            return nxt.value.value
    return None


def _assigned_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def source_docstring(module_name: str, name: str) -> str | None:
    """The docstring of top-level `name` as written in `module_name` (following re-exports).

    Modules: the module docstring. Functions and classes: their docstring. Assignments: the
    attribute docstring (a string literal on the next statement). None when there is none.
    """
    body = _tree(module_name).body
    for i, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return ast.get_docstring(node)
        elif name in _assigned_names(node):
            return _attribute_docstring(body, i)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _resolve_from(module_name, node)
                    if source.split(".")[0] != PACKAGE:
                        return None
                    return source_docstring(source, alias.name)
    return None


def _class_node(cls: type) -> ast.ClassDef | None:
    if "." in cls.__qualname__:
        return None
    for node in _tree(cls.__module__).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    return None


def _public_methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    """Public methods and properties defined in a class body (not dunders, not private)."""
    return {
        n.name: n
        for n in node.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")
    }


# ------------------------------------------------------------------------------ public names


class Public:
    """One public name: where it is exported, the object, and where it is written."""

    def __init__(self, path: str, obj: Any, module: str, name: str, owner: type | None = None):
        self.path = path  # e.g. "neurojax.neurons.LIF" or "neurojax.neurons.LIF.step"
        self.obj = obj
        self.module = module  # module whose source holds the definition (or the re-export)
        self.name = name  # name there
        self.owner = owner  # for methods: the class that defines them

    def docstring(self) -> str | None:
        if self.owner is not None:
            node = _class_node(self.owner)
            method = _public_methods(node).get(self.name) if node is not None else None
            return ast.get_docstring(method) if method is not None else None
        if isinstance(self.obj, types.ModuleType):
            return ast.get_docstring(_tree(self.obj.__name__))
        return source_docstring(self.module, self.name)

    def __repr__(self) -> str:
        return self.path


def _is_neurojax_class(obj: Any) -> bool:
    return inspect.isclass(obj) and obj.__module__.split(".")[0] == PACKAGE


def _methods_of(cls: type, path: str) -> list[Public]:
    """Public methods of `cls`, each attributed to the neurojax class that defines it."""
    out, seen = [], set()
    for base in cls.__mro__:
        if not _is_neurojax_class(base):
            continue
        node = _class_node(base)
        if node is None:
            continue
        for name in _public_methods(node):
            if name in seen:
                continue
            seen.add(name)
            obj = getattr(cls, name, None)
            out.append(Public(f"{path}.{name}", obj, base.__module__, name, owner=base))
    return out


@cache
def public_modules() -> dict[str, types.ModuleType]:
    """`neurojax` and every module it exports under a public name (`nj.connect` included)."""
    mods = {PACKAGE: neurojax}
    for name in _reexports(PACKAGE):
        obj = getattr(neurojax, name)
        if isinstance(obj, types.ModuleType):
            mods[f"{PACKAGE}.{name}"] = obj
    return mods


@cache
def public_names() -> tuple[Public, ...]:
    names: list[Public] = []
    # Subpackages first: a name exported twice (nj.LIF, nj.neurons.LIF) keeps its
    # subpackage path, the page it is documented on.
    modules = sorted(public_modules().items(), key=lambda item: item[0] == PACKAGE)
    for export_path, module in modules:
        if hasattr(module, "__path__"):  # a package: its __init__ re-exports
            exported = _reexports(module.__name__)
        else:
            assert hasattr(module, "__all__"), f"{module.__name__} (a public module) has no __all__"
            exported = {n: (module.__name__, n) for n in module.__all__}
        for name, (source, original) in exported.items():
            obj = getattr(module, name)
            path = f"{export_path}.{name}"
            names.append(Public(path, obj, source, original))
            if _is_neurojax_class(obj):
                names.extend(_methods_of(obj, path))
    # The same object exported twice (nj.LIF and nj.neurons.LIF) is one name to document.
    unique: dict[Any, Public] = {}
    for p in names:
        key = (id(p.owner), p.name) if p.owner is not None else id(p.obj)
        if isinstance(p.obj, (str, int, float, bool)) and p.owner is None:
            key = p.path
        unique.setdefault(key, p)
    return tuple(unique.values())


# ------------------------------------------------------------------------------ API directives


class Directive:
    def __init__(self, page: Path, path: str, members: Any):
        self.page, self.path, self.members = page, path, members  # members: None, bool, list


def _parse_members(lines: list[str]) -> Any:
    """The `members` option of a directive's indented YAML block (None when absent)."""
    for i, line in enumerate(lines):
        m = re.match(r"\s+members:\s*(.*?)\s*$", line)
        if not m:
            continue
        value = m.group(1)
        if value.startswith("["):
            return [v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()]
        if value.lower() in ("false", "no", "off"):
            return False
        if value.lower() in ("true", "yes", "on"):
            return True
        if value == "":
            items = []
            indent = len(line) - len(line.lstrip())
            for nxt in lines[i + 1 :]:
                im = re.match(r"(\s*)-\s*(\S+)\s*$", nxt)
                if not im or len(im.group(1)) < indent:
                    break
                items.append(im.group(2).strip("'\""))
            return items
    return None


def api_directives() -> list[Directive]:
    out = []
    for page in sorted(API.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^:::\s+(\S+)\s*$", line)
            if not m:
                continue
            block = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and not nxt.startswith("    "):
                    break
                block.append(nxt)
            out.append(Directive(page, m.group(1), _parse_members(block)))
    return out


def resolve(path: str) -> Any:
    """Import `a.b.c.Name.attr`: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def rendered() -> tuple[set[int], set[tuple[int, str]], set[str]]:
    """What the API pages render: object ids, (class id, method) pairs, module names."""
    objects: set[int] = set()
    methods: set[tuple[int, str]] = set()
    modules: set[str] = set()
    for d in api_directives():
        obj = resolve(d.path)
        if isinstance(obj, types.ModuleType):
            modules.add(obj.__name__)
            if isinstance(d.members, list):
                chosen = [getattr(obj, n) for n in d.members]
            elif d.members is False or hasattr(obj, "__path__"):
                chosen = []  # a package renders none of its re-exports unless listed
            else:  # a plain module renders what it defines (griffe ignores its imports)
                chosen = [
                    v
                    for n, v in vars(obj).items()
                    if not n.startswith("_")
                    and getattr(v, "__module__", obj.__name__) == obj.__name__
                    and not isinstance(v, types.ModuleType)
                ]
            for c in chosen:
                objects.add(id(c))
                if _is_neurojax_class(c):
                    methods.update((id(c), name) for name in dir(c))
            continue
        objects.add(id(obj))
        if inspect.isclass(obj) and d.members is not False:
            names = d.members if isinstance(d.members, list) else dir(obj)
            methods.update((id(obj), name) for name in names)
    return objects, methods, modules


# ------------------------------------------------------------------------------ tests


def test_public_names_are_found():
    paths = {p.path for p in public_names()}
    # A few anchors, so that a broken collector cannot pass the tests below vacuously.
    for expected in (
        "neurojax.simulate",
        "neurojax.neurons",
        "neurojax.neurons.LIF",
        "neurojax.neurons.LIF.step",
        "neurojax.neurons.LIF.init_state",
        "neurojax.connect.fixed_prob",
        "neurojax.models.COBA_PARAMS",
        "neurojax.surrogate.FastSigmoid",
        "neurojax.io.save",
        "neurojax.parallel.shard_network",
    ):
        assert expected in paths, f"{expected} not collected"
    assert len(paths) > 150


def test_every_public_name_has_a_docstring():
    missing = [p.path for p in public_names() if not (p.docstring() or "").strip()]
    assert missing == [], (
        "public names without a docstring (write one in the source; mkdocstrings renders "
        f"nothing for them): {missing}"
    )


def test_every_public_name_has_an_api_entry():
    objects, methods, modules = rendered()
    missing = []
    for p in public_names():
        if isinstance(p.obj, types.ModuleType):
            if p.obj.__name__ not in modules:
                missing.append(f"{p.path} (module {p.obj.__name__}: no `::: {p.obj.__name__}`)")
        elif p.owner is not None:
            if (id(p.owner), p.name) not in methods:
                where = f"{p.owner.__module__}.{p.owner.__qualname__}"
                missing.append(f"{p.path} (defined in {where}; no API entry renders it)")
        elif id(p.obj) not in objects:
            missing.append(p.path)
    assert missing == [], f"public names without an entry in docs/api/*.md: {missing}"


def test_api_directives_resolve_and_pages_are_one_per_subpackage():
    for d in api_directives():
        try:
            resolve(d.path)
        except (ImportError, AttributeError) as err:
            pytest.fail(f"{d.page.name}: `::: {d.path}` does not resolve ({err})")
    pages = {p.stem for p in API.glob("*.md")}
    subpackages = {name.rpartition(".")[2] for name in public_modules() if name != PACKAGE}
    assert subpackages <= pages, f"subpackages without an API page: {subpackages - pages}"


def _nav_paths() -> list[str]:
    """Every page path the nav of mkdocs.yml names (read without a YAML parser)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r"[\w./-]+\.(?:md|ipynb)\b", nav)


def test_nav_references_only_pages_that_exist_and_lists_every_page():
    paths = _nav_paths()
    assert "index.md" in paths and "benchmarks.md" in paths
    missing = [p for p in paths if not (DOCS / p).is_file()]
    assert missing == [], f"mkdocs.yml nav names pages that do not exist: {missing}"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(pages - set(paths)) == [], "pages in docs/ missing from the nav"


def _hooks():
    spec = importlib.util.spec_from_file_location("neurojax_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hooks_list_the_notebooks_that_exist(tmp_path):
    hooks = _hooks()
    for entry in hooks.notebook_nav():
        (path,) = entry.values()
        assert (ROOT / path).is_file()
    # Discovered by glob, in file-name order, titled by their first heading.
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "02_b.ipynb").write_text(
        '{"cells": [{"cell_type": "markdown", "source": ["# COBA network\\n", "text"]}]}'
    )
    (tmp_path / "notebooks" / "01_single_neurons.ipynb").write_text('{"cells": []}')
    (tmp_path / "notebooks" / "scratch.ipynb").write_text('{"cells": []}')
    assert hooks.notebook_nav(tmp_path) == [
        {"Single neurons": "notebooks/01_single_neurons.ipynb"},
        {"COBA network": "notebooks/02_b.ipynb"},
    ]


def test_benchmark_page_includes_results_with_working_links():
    hooks = _hooks()
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert hooks.RESULTS_MARKER in page
    text = hooks.results_markdown()
    assert (
        "| figure | neurojax | peer | peer / neurojax |" in text
    )  # the current table came through
    assert not re.search(r"^# ", text, re.M)  # one level below the page title
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith("http"):
            continue
        assert (DOCS / target).is_file(), f"RESULTS.md link {target} does not resolve in docs/"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e .[docs])")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    pytest.importorskip("mkdocs_jupyter", reason="the docs extra is not installed")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (tmp_path / "api" / "neurons" / "index.html").is_file()
