"""The size of XLA's CPU thread pool (neurojax/_threads.py): one worker fewer than the cores,
every thread's CPU affinity restored after the client is created, and the cases left alone."""

import json
import os
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


def _probe(env_extra: dict[str, str], cpus: set[int] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NEUROJAX_CPU_THREADS")}
    env.update(env_extra)

    def pin():
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=pin,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pool_workers_rule():
    assert pool_workers(1, None) == 0  # one core: XLA's default (one worker)
    assert pool_workers(2, None) == 1
    assert pool_workers(16, None) == 15
    assert pool_workers(8, 3) == 3
    assert pool_workers(2, 5) == 2  # asking for more than the cores: the cores
    assert pool_workers(8, 0) == 0  # 0: XLA's default


needs_two = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and at least 2 cores",
)


@needs_two
def test_client_created_with_one_worker_fewer_and_affinity_restored():
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    got = _probe({}, cpus)
    assert got["workers"] == 1
    # Every thread, XLA's workers included, may run on both cores again.
    assert got["before"] == sorted(cpus)
    assert got["masks"] == [sorted(cpus)]


@needs_two
def test_environment_variable_and_multi_device_runs_keep_xla_pool():
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    assert _probe({"NEUROJAX_CPU_THREADS": "0"}, cpus)["workers"] is None
    forced = _probe({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, cpus)
    assert forced["workers"] is None and forced["devices"] == 4


@needs_two
def test_bad_environment_value_warns_and_uses_default():
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["NEUROJAX_CPU_THREADS"] = "many"
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        check=True,
    )
    assert "NEUROJAX_CPU_THREADS='many' is not a non-negative integer" in out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["workers"] == 1
