"""neurojax's thread setting (neurojax/_threads.py) and the adapter of JAX's private modules
(neurojax/_jax_private.py): `import neurojax` changes nothing in JAX or in the process;
`nj.use_cpu_threads` and `NEUROJAX_CPU_THREADS` set the kernels' threads and, before JAX's
CPU client exists, XLA's pool through its `PJRT_NPROC`; bad values are refused."""

import json
import os
import subprocess
import sys

import pytest

import neurojax as nj
from neurojax import _jax_private, _threads

_PROBE = """
import json, os
before = sorted(os.sched_getaffinity(0))
import jax
factory = jax._src.xla_bridge._backend_factories["cpu"].factory
import neurojax as nj
from neurojax import _jax_private
after_import = {
    "factory_unchanged": jax._src.xla_bridge._backend_factories["cpu"].factory is factory,
    "affinity": sorted(os.sched_getaffinity(0)) == before,
    "pjrt_nproc": os.environ.get("PJRT_NPROC"),
    "started": _jax_private.cpu_backend_started(),
}
if os.environ.get("PROBE_CALL"):
    nj.use_cpu_threads(int(os.environ["PROBE_CALL"]))
jax.numpy.ones(3).block_until_ready()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps({
    **after_import,
    "pjrt_nproc_after": os.environ.get("PJRT_NPROC"),
    "xla_flags_after": os.environ.get("XLA_FLAGS"),
    "xla_workers": sum(n.endswith("XLAEigen") for n in names),
    "threads": nj.cpu_threads(),
    "started_after": _jax_private.cpu_backend_started(),
}))
"""


def _probe(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "NEUROJAX_CPU_THREADS", "PJRT_NPROC", "PROBE_CALL")
    }
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_changes_nothing_in_jax_or_the_process():
    out = _result(_probe({}))
    assert out["factory_unchanged"] and out["affinity"]
    assert out["pjrt_nproc"] is None and out["pjrt_nproc_after"] is None
    assert out["xla_flags_after"] is None
    assert not out["started"] and out["started_after"]
    # XLA's own default: one worker per CPU of the process
    assert out["xla_workers"] == len(os.sched_getaffinity(0))
    assert out["threads"] == len(os.sched_getaffinity(0))


def test_use_cpu_threads_sizes_the_kernels_and_xla_before_the_client():
    out = _result(_probe({"PROBE_CALL": "3"}))
    assert out["factory_unchanged"] and out["affinity"]
    assert out["threads"] == 3
    assert out["pjrt_nproc_after"] == "2" and out["xla_workers"] == 2
    assert out["xla_flags_after"] == "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def test_xla_flags_of_the_user_are_kept_and_extended_once():
    flag = "xla_cpu_enable_concurrency_optimized_scheduler"
    out = _result(_probe({"PROBE_CALL": "2", "XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"}))
    assert out["xla_flags_after"] == f"--xla_cpu_use_thunk_runtime=true --{flag}=false"
    # the user's own choice of that flag wins
    out = _result(_probe({"PROBE_CALL": "2", "XLA_FLAGS": f"--{flag}=true"}))
    assert out["xla_flags_after"] == f"--{flag}=true"


def test_environment_variable_acts_as_the_call():
    out = _result(_probe({"NEUROJAX_CPU_THREADS": "1"}))
    assert out["threads"] == 1 and out["pjrt_nproc"] == "1" and out["xla_workers"] == 1
    # a PJRT_NPROC of the user's own is kept
    out = _result(_probe({"NEUROJAX_CPU_THREADS": "4", "PJRT_NPROC": "1"}))
    assert out["threads"] == 4 and out["pjrt_nproc"] == "1" and out["xla_workers"] == 1
    out = _result(_probe({"NEUROJAX_CPU_THREADS": "auto"}))
    assert out["threads"] == len(os.sched_getaffinity(0)) and out["pjrt_nproc"] is None


@pytest.mark.parametrize("value", ["many", "0", "-2", "1.5", "2 threads"])
def test_bad_environment_value_is_refused_in_one_line(value):
    proc = _probe({"NEUROJAX_CPU_THREADS": value})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"ValueError: NEUROJAX_CPU_THREADS={value!r} is not allowed: use a positive integer "
        "(the number of CPU threads) or 'auto' (every CPU the process may run on)"
    )


def test_parse_env():
    assert _threads.parse_env(None) is None
    assert _threads.parse_env("") is None
    assert _threads.parse_env(" AUTO ") is None
    assert _threads.parse_env("12") == 12
    with pytest.raises(ValueError, match=r"NEUROJAX_CPU_THREADS='x' is not allowed"):
        _threads.parse_env("x")


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_use_cpu_threads_refuses_bad_counts(bad):
    with pytest.raises(ValueError, match=r"use_cpu_threads: n must be a positive integer"):
        nj.use_cpu_threads(bad)
    with pytest.raises(ValueError, match=r"use_cpu_threads: xla must be True or False"):
        nj.use_cpu_threads(2, xla=1)


def test_late_call_warns_and_still_sets_the_kernels():
    """In this test process JAX's CPU client exists: XLA's pool keeps its size."""
    import jax

    jax.numpy.ones(1).block_until_ready()
    old = _threads._setting[0]
    had = os.environ.pop("PJRT_NPROC", None)
    try:
        with pytest.warns(RuntimeWarning, match="XLA's thread pool keeps its size"):
            nj.use_cpu_threads(3)
        assert nj.cpu_threads() == 3 and "PJRT_NPROC" not in os.environ
    finally:
        if had is not None:
            os.environ["PJRT_NPROC"] = had
        _threads.use_cpu_threads(old, xla=False)


def test_listeners_follow_the_setting():
    old = _threads._setting[0]
    seen = []
    _threads._on_change(seen.append)
    try:
        _threads.use_cpu_threads(5, xla=False)
        _threads.use_cpu_threads(None, xla=False)
    finally:
        _threads._listeners.remove(seen.append)
        _threads.use_cpu_threads(old, xla=False)
    assert seen[1:] == [5, _threads.allowed_cpus()]


def test_jax_private_adapter_reads_what_it_expects():
    """Fails by name when JAX moves what the adapter reads (`jax._src.xla_bridge._backends`)."""
    from jax._src import xla_bridge

    assert isinstance(xla_bridge._backends, dict)
    import jax

    jax.numpy.ones(1).block_until_ready()
    assert _jax_private.cpu_backend_started() is True


def test_no_other_module_reads_jax_private():
    """`jax._src` appears in no neurojax module but the adapter and those that the layers
    work (issue 39) moves there: none of this module's own files."""
    root = os.path.dirname(nj.__file__)
    for name in ("_threads.py", os.path.join("kernels", "_build.py")):
        with open(os.path.join(root, name)) as f:
            assert "jax._src" not in f.read(), name
