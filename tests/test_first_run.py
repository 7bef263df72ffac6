"""The first run and the time to a result (issue 41, points 1 and 2): what `import neurojax`
loads, the C++ kernel build's messages and timing, and the compilation cache from Python."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import neurojax as nj
from neurojax import cli
from neurojax.kernels import _build

ROOT = Path(__file__).resolve().parent.parent  # `python -m neurojax` imports this checkout


def _python(code: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("NEUROJAX_COMP", "JAX_COMP"))}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


# --- import neurojax ---------------------------------------------------------------------

IMPORT_PROGRAM = """
import json, sys
import neurojax as nj
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"matplotlib", "scipy"})
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import sparse
# The network layer's BCOO works without SciPy.
conn = nj.connect.fixed_prob(jax.random.key(0), 30, 20, 0.5)
assert isinstance(conn, sparse.BCOO)
dense_ok = bool(np.array_equal(np.asarray(conn.todense()), np.asarray(sparse.BCOO.fromdense(conn.todense()).todense())))
callable(nj.analysis.raster)
still = sorted({m.split(".")[0] for m in sys.modules} & {"matplotlib", "scipy"})
# The SciPy-based solvers are still there, loaded on first use, as the real module.
a = jnp.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])
b = jnp.array([1.0, 2.0, 3.0])
x = sparse.linalg.spsolve(sparse.BCSR.fromdense(a).data, sparse.BCSR.fromdense(a).indices,
                          sparse.BCSR.fromdense(a).indptr, b)
real = sys.modules["jax.experimental.sparse.linalg"]
print(json.dumps({
    "loaded": loaded, "after_build": still, "dense_ok": dense_ok,
    "x": np.asarray(x).tolist(), "expected": np.linalg.solve(np.asarray(a), np.asarray(b)).tolist(),
    "same": real is sparse.linalg, "real": type(real).__name__, "file": real.__file__,
    "scipy_now": "scipy" in sys.modules,
}))
"""


def test_import_loads_neither_matplotlib_nor_scipy():
    res = json.loads(_python(IMPORT_PROGRAM).stdout.strip().splitlines()[-1])
    assert res["loaded"] == []
    assert res["after_build"] == []  # a connectivity build and nj.analysis do not load them
    assert res["dense_ok"]
    # jax.experimental.sparse.linalg is the real module once used, and computes as before
    # (against NumPy's dense solve; float32 tolerance).
    np.testing.assert_allclose(res["x"], res["expected"], rtol=1e-5)
    assert res["same"] and res["real"] == "module" and res["file"].endswith("linalg.py")
    assert res["scipy_now"]


# --- the C++ kernel build ------------------------------------------------------------------


@pytest.fixture
def built_library():
    """The kernel library of this checkout, built (once per machine) if needed."""
    if _build._compiler() is None or nj.kernels.mode() != "auto":
        pytest.skip("no C++ compiler or the kernels are off")
    if _build.library() is None:
        pytest.skip("the kernel library cannot be built here")
    return _build.library_path()


def test_a_build_says_what_it_does_and_is_timed_apart(tmp_path, monkeypatch, capsys, built_library):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(cache))
    ticks = iter([100.0, 112.5])
    monkeypatch.setattr(_build, "_clock", lambda: next(ticks))
    compiled = []

    # Stands for the compiler: writes the library it would produce (a copy of the real one).
    def compile_library(out, extra_flags=()):
        compiled.append(out)
        shutil.copy(built_library, out)

    monkeypatch.setattr(_build, "compile_library", compile_library)
    before = _build.build_seconds()
    out = _build._build()
    err = capsys.readouterr().err.splitlines()
    assert compiled == [cache / built_library.name] and out == compiled[0]
    assert err == [
        f"neurojax: building the C++ CPU kernels ({len(_build._sources())} sources, once per "
        f"machine and JAX version; usually 20-90 s) into {cache} ...",
        "neurojax: C++ kernels built in 12.5 s (later runs load them from the cache)",
    ]
    assert _build.build_seconds() - before == pytest.approx(12.5)
    # The next build here announces the last one's time; a cached library says nothing.
    assert _build._build() == out and capsys.readouterr().err == ""
    assert (cache / "last-build-seconds").read_text() == "12.5\n"
    out.unlink()
    ticks = iter([0.0, 3.0])
    monkeypatch.setattr(_build, "_clock", lambda: next(ticks))

    def failing(out, extra_flags=()):
        raise RuntimeError("c++ failed: no such header")

    monkeypatch.setattr(_build, "compile_library", failing)
    with pytest.raises(RuntimeError, match="no such header"):
        _build._build()
    assert capsys.readouterr().err.splitlines() == [
        f"neurojax: building the C++ CPU kernels ({len(_build._sources())} sources, once per "
        f"machine and JAX version; about 12 s, as the last build here) into {cache} ...",
        "neurojax: the C++ kernel build failed after 3.0 s",
    ]


def test_cli_rows_put_the_kernel_build_before_the_compile_time(capsys):
    rows = [("build time", "0.20 s"), ("compile time", "0.30 s"), ("run time", "0.1 s")]
    cli.print_rows(rows, {"kernel_build_s": 41.234})
    assert capsys.readouterr().out.splitlines() == [
        "build time    0.20 s",
        "kernel build  41.23 s",
        "compile time  0.30 s",
        "run time      0.1 s",
    ]
    cli.print_rows(rows, {"kernel_build_s": 0.0})  # loaded from the cache: no row
    assert "kernel build" not in capsys.readouterr().out


def _run_coba(cache, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEUROJAX_COMP")}
    env.update(NEUROJAX_CACHE_DIR=str(cache), NEUROJAX_CPU_KERNEL="1")
    cmd = [sys.executable, "-m", "neurojax", "run", "coba", "--duration", "20", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow  # compiles the C++ kernels from scratch: 20-100 s on 2 cores
def test_cli_first_run_on_a_fresh_kernel_cache_announces_and_times_the_build(tmp_path):
    if _build._compiler() is None:
        pytest.skip("no C++ compiler")
    cache = tmp_path / "nj"
    first = _run_coba(cache)
    assert "neurojax: building the C++ CPU kernels" in first.stderr
    assert "neurojax: C++ kernels built in" in first.stderr
    rows = dict(line.split(None, 2)[::2] for line in first.stdout.splitlines() if "time" in line)
    kernel = [line for line in first.stdout.splitlines() if line.startswith("kernel build")]
    assert len(kernel) == 1 and float(kernel[0].split()[2]) > 1.0
    # The build is not counted as XLA's compile time (which is a few seconds at most here).
    assert float(rows["compile"].split()[0]) < float(kernel[0].split()[2])
    again = json.loads(_run_coba(cache, "--json").stdout)
    assert again["kernel_build_s"] == 0.0
    assert "building" not in _run_coba(cache).stderr


# --- the compilation cache from Python -----------------------------------------------------

CACHE_PROGRAM = """
import json, os, sys, jax, jax.numpy as jnp
import neurojax as nj
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir}))
"""


def test_compilation_cache_is_off_from_python_unless_asked(tmp_path):
    def folder(**env):
        return json.loads(_python(CACHE_PROGRAM, **env).stdout.strip().splitlines()[-1])["dir"]

    assert folder(NEUROJAX_CACHE_DIR=str(tmp_path)) is None
    assert folder(NEUROJAX_CACHE_DIR=str(tmp_path), NEUROJAX_COMPILATION_CACHE="0") is None
    on = folder(NEUROJAX_CACHE_DIR=str(tmp_path), NEUROJAX_COMPILATION_CACHE="1")
    assert on == str(tmp_path / "xla")
    # The user's own JAX cache is kept, by the environment switch and by the call.
    theirs = str(tmp_path / "theirs")
    assert folder(NEUROJAX_COMPILATION_CACHE="1", JAX_COMPILATION_CACHE_DIR=theirs) == theirs
    kept = _python(
        "import jax, neurojax as nj; print(nj.enable_compilation_cache(), "
        "jax.config.jax_compilation_cache_dir)",
        JAX_COMPILATION_CACHE_DIR=theirs,
    )
    assert kept.stdout.split() == [theirs, theirs]


def test_a_bad_switch_value_warns_and_leaves_the_cache_off(tmp_path):
    out = _python(CACHE_PROGRAM, NEUROJAX_COMPILATION_CACHE="yes")
    assert json.loads(out.stdout.strip().splitlines()[-1])["dir"] is None
    assert "NEUROJAX_COMPILATION_CACHE must be 1 (compilation cache on) or 0 (off), got 'yes'" in (
        out.stderr
    )


SWITCH_PROGRAM = """
import sys, jax, jax.numpy as jnp, neurojax as nj
from pathlib import Path
a, b = Path(sys.argv[1]), Path(sys.argv[2])
nj.enable_compilation_cache(a)
jax.jit(lambda x: jnp.sin(x) * 2.0)(jnp.arange(5.0)).block_until_ready()
nj.enable_compilation_cache(b)
jax.jit(lambda x: jnp.cos(x) * 3.0)(jnp.arange(7.0)).block_until_ready()
print(len(list(a.iterdir())), len(list(b.iterdir())))
"""


def test_a_new_cache_folder_takes_effect_after_a_compilation(tmp_path):
    code = SWITCH_PROGRAM.replace("sys.argv[1]", repr(str(tmp_path / "a")))
    code = code.replace("sys.argv[2]", repr(str(tmp_path / "b")))
    in_a, in_b = map(int, _python(code).stdout.split())
    assert in_a >= 1 and in_b >= 1  # the second program went to the second folder


def test_the_console_command_ends_with_its_output_complete(tmp_path):
    """`neurojax run` ends its process without the interpreter's teardown (os._exit): what it
    printed to a pipe and the plot it saved must be whole, and its exit status kept."""
    png = tmp_path / "hh.png"
    cmd = [sys.executable, "-m", "neurojax", "run", "hh", "--duration", "5", "--json"]
    out = subprocess.run(
        [*cmd, "--plot", str(png)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)  # the whole JSON document reached the pipe
    assert res["plot"] == str(png) and "kernel_build_s" in res
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[-12:-4] == b"\x00\x00\x00\x00IEND"
    bad = subprocess.run(
        [*cmd, "--dt", "-1"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert bad.returncode == 2 and "--dt" in bad.stderr


def test_python_m_neurojax_kernels_builds_only_for_a_cpu_backend(
    monkeypatch, capsys, built_library
):
    assert _build.main() == 0  # already built (by the fixture): says where
    assert capsys.readouterr().err == (
        f"neurojax: the C++ CPU kernels are already built: {built_library}\n"
    )

    def no_build():
        raise AssertionError("built for a GPU backend")

    monkeypatch.setattr(_build, "library", no_build)
    monkeypatch.setattr(_build.jax, "default_backend", lambda: "gpu")
    assert _build.main() == 0
    assert capsys.readouterr().err == (
        "neurojax: JAX's default backend is gpu: the C++ CPU kernels are built on first CPU use\n"
    )
