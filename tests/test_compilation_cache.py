"""The persistent compilation cache: `nj.enable_compilation_cache` and `neurojax run`'s
default (issue "first hour", point 0). Each case runs in a fresh process, as a user's
repeated command does."""

import json
import os
import subprocess
import sys

import pytest

import neurojax as nj

PROGRAM = """
import json, sys, jax, jax.numpy as jnp, neurojax as nj
folder = nj.enable_compilation_cache(sys.argv[1])
misses = []
jax.monitoring.register_event_listener(
    lambda name, **kw: misses.append(name) if "cache_miss" in name else None
)
f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 3.0 + x ** 2))
f(jnp.arange(1000.0)).block_until_ready()
print(json.dumps({"folder": str(folder), "misses": len(misses)}))
"""


def run_program(folder):
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(folder)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_program(tmp_path):
    folder = tmp_path / "xla"
    first = run_program(folder)
    assert first["folder"] == str(folder)
    entries = sorted(p.name for p in folder.iterdir())
    assert entries, "the first process wrote nothing to the cache"
    second = run_program(folder)
    assert second["misses"] < first["misses"]  # the program came from disk
    assert sorted(p.name for p in folder.iterdir()) == entries  # nothing new to write


def test_default_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUROJAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert nj.compilation_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("NEUROJAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(tmp_path / "nj"))
    assert nj.compilation_cache_dir() == tmp_path / "nj" / "xla"


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"min_compile_time_s must be >= 0, got -1"):
        nj.enable_compilation_cache(tmp_path, min_compile_time_s=-1)
    with pytest.raises(TypeError, match=r"min_compile_time_s must be a number >= 0, got 'a'"):
        nj.enable_compilation_cache(tmp_path, min_compile_time_s="a")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"cannot create the cache folder"):
        nj.enable_compilation_cache(blocker / "sub")


@pytest.mark.parametrize("flag", [None, "--no-compilation-cache"])
def test_cli_run_uses_the_cache_unless_told_not_to(tmp_path, flag):
    env = dict(os.environ, NEUROJAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"))
    cmd = [sys.executable, "-m", "neurojax", "run", "cuba", "--duration", "20", "--json"]
    if flag:
        cmd.append(flag)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "xla"
    written = folder.exists() and any(folder.iterdir())
    assert written == (flag is None)
