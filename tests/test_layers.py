"""The layer order of the package (issue 39): a unit imports only from its own layer or below,
counted with the imports inside functions, and no two units import each other.

The order is declared once, in pyproject.toml's `[tool.importlinter]` contract, which CI checks
with import-linter (`make lint-imports`). These tests check the declaration with a second,
independent count (a walk over the syntax tree of every module, function bodies included, and
of `importlib.import_module("neurojax....")` calls), and check that import-linter itself
counts an import placed inside a function."""

import ast
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neurojax"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS_CONTRACT = next(c for c in CONFIG["contracts"] if c["type"] == "layers")


def _layers(contract: dict) -> tuple[dict[str, int], list[set[str]]]:
    """Unit -> level (0 at the bottom) and the groups of siblings declared independent."""
    level, independent = {}, []
    for i, line in enumerate(reversed(contract["layers"])):
        sep = "|" if "|" in line else ":"
        names = [n.strip().strip("()") for n in line.split(sep)]
        for n in names:
            level[f"neurojax.{n}"] = i
        if sep == "|":
            independent.append({f"neurojax.{n}" for n in names})
    return level, independent


LEVEL, INDEPENDENT = _layers(LAYERS_CONTRACT)
IGNORED = {
    tuple(x.strip() for x in rule.split("->"))
    for contract in CONFIG["contracts"]
    for rule in contract.get("ignore_imports", [])
}


def _module_name(path: Path, root: Path, package: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [package, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every module `source` imports (absolute names, with line numbers): `import` and
    `from ... import` statements anywhere (function bodies, `if` branches, `try` blocks) and
    `importlib.import_module` calls with a literal name."""
    here = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            # `from . import x` imports the submodule x
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            name = node.args[0].value
            if name.startswith(".") and len(node.args) > 1:
                continue  # relative to a package given at run time
            out.append((name, node.lineno))
    return out


def _unit(name: str, package: str = "neurojax") -> str | None:
    parts = name.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def upward_imports(root: Path, package: str, level: dict[str, int], independent, ignored):
    """`(importer, imported unit, line)` of every import that runs upward, between two siblings
    declared independent, or from a unit the layers do not list."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root, package)
        src = _unit(module, package)
        if src is None:
            continue  # the package's __init__ re-exports everything
        for target, line in imports_of(path.read_text(), module, path.name == "__init__.py"):
            dst = _unit(target, package)
            if dst is None or dst == src or dst not in level:
                continue  # inside the unit, or a unit without a layer (its own test)
            if any(module.startswith(a) and target.startswith(b) for a, b in ignored):
                continue
            if (
                src not in level
                or level[dst] > level[src]
                or any({src, dst} <= group for group in independent)
            ):
                if (module, dst, line) not in found:
                    found.append((module, dst, line))
    return found


def test_every_unit_of_the_package_has_a_layer():
    units = {
        f"neurojax.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert units - set(LEVEL) == set(), "give these modules a layer in pyproject.toml"


def test_no_import_runs_upward_counting_imports_inside_functions():
    found = upward_imports(PACKAGE, "neurojax", LEVEL, INDEPENDENT, IGNORED)
    assert found == [], "\n".join(f"{a} -> {b} (line {n})" for a, b, n in found)


def test_the_walk_sees_imports_inside_functions_and_import_module_calls(tmp_path):
    # A package of three layers whose upward imports hide in a function, behind a
    # relative import and in an importlib call: each is found, at its line.
    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from .low import x\n")
    (pkg / "mid.py").write_text("import toy.low\n")
    (pkg / "low" / "__init__.py").write_text("x = 1\n")
    (pkg / "low" / "_a.py").write_text(
        textwrap.dedent(
            """\
            import importlib


            def f():
                from ..mid import y
                return y


            def g():
                return importlib.import_module("toy.high")
            """
        )
    )
    level = {"toy.low": 0, "toy.mid": 1, "toy.high": 2}
    found = upward_imports(pkg, "toy", level, [], set())
    assert sorted(found) == [("toy.low._a", "toy.high", 10), ("toy.low._a", "toy.mid", 5)]
    # declared exceptions are not reported
    assert upward_imports(pkg, "toy", level, [], {("toy.low._a", "toy.mid")}) == [
        ("toy.low._a", "toy.high", 10)
    ]


def test_the_walk_refuses_imports_between_independent_siblings(tmp_path):
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("")
    level = {"toy.a": 0, "toy.b": 0}
    assert upward_imports(pkg, "toy", level, [{"toy.a", "toy.b"}], set()) == [("toy.a", "toy.b", 2)]
    assert upward_imports(pkg, "toy", level, [], set()) == []


def test_the_kernel_registry_is_complete_without_naming_the_packages_above():
    # registry() lists the kernels of the lazily imported subpackages through the providers
    # that the package's __init__ adds, not by importing them by name from the kernels layer.
    source = (PACKAGE / "kernels" / "_registry.py").read_text()
    assert "neurojax.assembly" not in source and "neurojax.training" not in source
    code = (
        "import sys, neurojax as nj\n"
        "assert 'neurojax.assembly' not in sys.modules\n"
        "names = nj.kernels.registry()\n"
        "assert 'assembly_top_k' in names and 'spike_matmul' in names, sorted(names)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e .[dev])")
def test_import_linter_counts_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from . import high\n    return high\n")
    config = tmp_path / ".importlinter"
    config.write_text(
        textwrap.dedent(
            """\
            [importlinter]
            root_package = toy

            [importlinter:contract:1]
            name = toy layers
            type = layers
            containers = toy
            layers =
                high
                low
            """
        )
    )
    out = subprocess.run(
        [LINT, "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 1, out.stdout
    assert "toy layers BROKEN" in out.stdout and "toy.low -> toy.high" in out.stdout


@pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e .[dev])")
def test_import_linter_keeps_the_package_contracts():
    out = subprocess.run(
        [LINT], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
    assert "neurojax layers KEPT" in out.stdout
    assert "neurojax units without circles KEPT" in out.stdout
