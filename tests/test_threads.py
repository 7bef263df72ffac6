"""The size of XLA's CPU thread pool (neurojax/_threads.py): one worker fewer than the cores,
every thread's CPU affinity restored after the client is created, and the cases left alone."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from neurojax._threads import pool_workers

_PROBE = """
import json, os
before = sorted(os.sched_getaffinity(0))
import jax, neurojax
jax.devices()
masks = set()
for tid in os.listdir("/proc/self/task"):
    try:
        masks.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
    except OSError:
        pass
print(json.dumps({
    "workers": neurojax._threads._created_with[0],
    "before": before,
    "masks": sorted(masks),
    "devices": jax.device_count(),
}))
"""


def _two_cpus() -> str:
    # The machine's first two CPUs, not this process's affinity: a test of the command line
    # that ran earlier in this worker may have pinned the process to one core.
    return "0,1"


def _run(env_extra: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NEUROJAX_CPU_THREADS")}
    env.update(env_extra)
    # taskset sets the child's CPUs (a preexec_fn would fork this multithreaded process).
    return subprocess.run(
        ["taskset", "-c", _two_cpus(), sys.executable, *flags, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _probe(env_extra: dict[str, str]) -> dict:
    return json.loads(_run(env_extra).stdout.strip().splitlines()[-1])


def test_pool_workers_rule():
    assert pool_workers(1, None) == 0  # one core: XLA's default (one worker)
    assert pool_workers(2, None) == 1
    assert pool_workers(16, None) == 15
    assert pool_workers(8, 3) == 3
    assert pool_workers(2, 5) == 2  # asking for more than the cores: the cores
    assert pool_workers(8, 0) == 0  # 0: XLA's default


needs_two = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity")
    or (os.cpu_count() or 1) < 2
    or not shutil.which("taskset"),
    reason="needs Linux CPU affinity, taskset and at least 2 CPUs",
)


@needs_two
def test_client_created_with_one_worker_fewer_and_affinity_restored():
    got = _probe({})
    assert got["workers"] == 1
    # Every thread, XLA's workers included, may run on both cores again.
    assert got["before"] == [0, 1]
    assert got["masks"] == [[0, 1]]


@needs_two
def test_environment_variable_and_multi_device_runs_keep_xla_pool():
    assert _probe({"NEUROJAX_CPU_THREADS": "0"})["workers"] is None
    forced = _probe({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert forced["workers"] is None and forced["devices"] == 4


@needs_two
def test_bad_environment_value_warns_and_uses_default():
    out = _run({"NEUROJAX_CPU_THREADS": "many"}, "-W", "always")
    assert "NEUROJAX_CPU_THREADS='many' is not a non-negative integer" in out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["workers"] == 1
