"""Multi-process (multi-host) runs: start `jax.distributed`, build a global mesh, read results.

With `jax.distributed` every process runs the same program (SPMD, "multi-controller" JAX): it
sees ALL devices of the job in `jax.devices()` but owns only its `jax.local_devices()`. A mesh
over `jax.devices()` therefore spans every process, and `nj.parallel.sweep` (with
`to_host=False`) and `nj.parallel.shard_network` run on it unchanged: each device computes its
share and the per-step spike exchange of a sharded network crosses processes through the
platform's collectives (gloo over TCP on CPU, NCCL on GPU, ICI/DCN on TPU).

What differs from one process is reading results: an array spread over several processes is
not "fully addressable", so `np.asarray`, `jax.device_get` (and `sweep(..., to_host=True)`,
`ShardedNetwork.to_host`, `ShardedNetwork.unshard_state`, which use them) raise
`RuntimeError: Fetching value for jax.Array that spans non-addressable ... devices`.
`gather_to_host` is the replacement: a collective that brings every leaf to every process.

```python
# run the same script as process 0 .. n-1 (one per host, or several on one machine):
import neurojax as nj
info = nj.parallel.initialize("10.0.0.1:1234", num_processes=2, process_id=PID)
mesh = nj.parallel.global_mesh("trials")
out = nj.parallel.sweep(fn, params, mesh=mesh, to_host=False)  # global, sharded
out = nj.parallel.gather_to_host(out)                            # NumPy, on every process
```
"""

import ipaddress
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

__all__ = ["initialize", "global_mesh", "gather_to_host"]

_LOOPBACK_NAMES = ("localhost",)


def _check_int(owner: str, name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{owner}: {name} must be an int >= {low}, got {value!r}")
    return int(value)


def _split_address(address: Any) -> tuple[str, int]:
    """`"host:port"` (IPv6 hosts in brackets: `"[::1]:1234"`) -> (host, port)."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(
            f"initialize: coordinator_address must be a 'host:port' string, got {address!r}"
        )
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            "initialize: coordinator_address must be 'host:port' with a port in [1, 65535], "
            f"got {address!r}"
        )
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _backend_started() -> bool:
    # Private, but the only way to fail with a clear message before jax.config rejects
    # `jax_num_cpu_devices` or jax.distributed rejects a late call with a generic one.
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - layout of another jax version
        return False
    return bool(xla_bridge.backends_are_initialized())


def _pin_gloo(host: str) -> str | None:
    """Make the CPU backend's gloo collectives listen on the loopback address `host`.

    jax builds gloo without a host name, so gloo binds to whatever this machine's host name
    resolves to, which may be a network interface even when every process is local. With a
    loopback coordinator the CPU backend is registered again, before it starts, with gloo
    pinned to the same address. This uses jax internals (jax 0.10); where they differ,
    returns None and leaves jax's default in place.
    """
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        client = distributed.global_state.client
        make_gloo, make_client = _jax.make_gloo_tcp_collectives, xla_bridge.make_cpu_client
        register = xla_bridge.register_backend_factory
    except (ImportError, AttributeError):  # pragma: no cover - another jax version
        return None
    address = "127.0.0.1" if host == "localhost" else host

    def factory():
        return make_client(collectives=make_gloo(distributed_client=client, hostname=address))

    register("cpu", factory, priority=0, fail_quietly=False)
    return address


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    local_device_count: int | None = None,
    timeout_s: int = 300,
) -> dict[str, Any]:
    """Join this process to a multi-process JAX job (`jax.distributed.initialize`).

    Call it first, before anything that touches a device (creating an array, `jax.devices()`,
    building a network or a model), in every process of the job, with the same
    `coordinator_address` and `num_processes` and a distinct `process_id` in
    `[0, num_processes)`. Process 0 hosts the coordinator; the call returns once every
    process has joined (or raises after `timeout_s` seconds).

    On CPU the cross-process collectives are set to gloo (TCP;
    `jax_cpu_collectives_implementation="gloo"`, jax 0.10's default, set explicitly because
    older versions had none): gloo listens on the address this machine's host name resolves
    to. When the coordinator address is a loopback address (`127.0.0.1`, `::1`,
    `localhost`: several processes on one machine), the coordinator and gloo bind to that
    address only (not to every interface, jax's default for the coordinator, nor to the host
    name's address for gloo), so nothing listens outside the machine.

    Args:
        coordinator_address: `"host:port"` of process 0, reachable from every process
            (`"127.0.0.1:PORT"` for processes on one machine).
        num_processes: the number of processes in the job (`>= 1`).
        process_id: this process's index in `[0, num_processes)`.
        local_device_count: CPU only: the number of CPU devices this process exposes
            (`jax_num_cpu_devices`, the same as
            `XLA_FLAGS=--xla_force_host_platform_device_count=N`); default: JAX's (1, or
            that flag). Ignored by GPU and TPU backends, which expose their chips.
        timeout_s: seconds to wait for all processes to join.

    Returns:
        A summary `{"process_id", "num_processes", "platform", "local_devices",
        "global_devices", "cpu_collectives", "gloo_host"}` (JSON-serialisable; `gloo_host`
        is the address gloo was pinned to, `None` when jax chose it).

    Raises:
        ValueError: a malformed address, a non-positive count, or a `process_id` out of range.
        RuntimeError: JAX's backend already started in this process, or `initialize` was
            already called.
    """
    host, port = _split_address(coordinator_address)
    num_processes = _check_int("initialize", "num_processes", num_processes, 1)
    process_id = _check_int("initialize", "process_id", process_id, 0)
    if process_id >= num_processes:
        raise ValueError(
            f"initialize: process_id must be in [0, num_processes) = [0, {num_processes}), "
            f"got {process_id}"
        )
    if local_device_count is not None:
        local_device_count = _check_int("initialize", "local_device_count", local_device_count, 1)
    timeout_s = _check_int("initialize", "timeout_s", timeout_s, 1)
    if jax.distributed.is_initialized():
        raise RuntimeError(
            "initialize: jax.distributed is already initialized in this process (call it once)"
        )
    if _backend_started():
        raise RuntimeError(
            "initialize: JAX's backend has already started in this process (something created "
            "an array or listed devices); call nj.parallel.initialize first, before any JAX "
            "computation"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", local_device_count)
    bind = coordinator_address if _is_loopback(host) else None
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s,
        coordinator_bind_address=bind,
    )
    gloo_host = _pin_gloo(host) if _is_loopback(host) else None
    # Listing the devices starts the backend, which waits for every process's topology.
    return {
        "process_id": jax.process_index(),
        "num_processes": jax.process_count(),
        "platform": jax.default_backend(),
        "local_devices": jax.local_device_count(),
        "global_devices": jax.device_count(),
        "cpu_collectives": jax.config.jax_cpu_collectives_implementation,
        "gloo_host": gloo_host,
    }


def global_mesh(axis_name: str = "devices") -> Mesh:
    """A 1-D mesh over every device of every process, along `axis_name`.

    Devices are in `jax.devices()` order (process 0's first), so with a sharded network
    process `p` holds the contiguous neuron blocks of its devices. The mesh is the same
    object description on every process, as SPMD requires. Works in a single process too
    (then it is `jax.make_mesh((jax.device_count(),), (axis_name,))`).
    """
    if not isinstance(axis_name, str) or not axis_name:
        raise ValueError(f"global_mesh: axis_name must be a non-empty str, got {axis_name!r}")
    devices = jax.devices()
    return jax.make_mesh((len(devices),), (axis_name,), devices=devices)


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _gather_one(x: Any) -> Any:
    if _is_key(x):
        # NumPy cannot hold typed keys: gather their raw data, wrap it again (local device).
        data = _gather_one(jax.random.key_data(x))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array):
        if not x.is_fully_addressable:
            return multihost_utils.process_allgather(x, tiled=True)
        return np.asarray(x)
    if isinstance(x, (np.ndarray, np.generic, int, float, complex)):
        return np.asarray(x)
    return x


def gather_to_host(tree: Any) -> Any:
    """Every array leaf of `tree` as a NumPy array on this process's host, whole.

    A global array spread over devices of several processes is gathered (a collective:
    EVERY process must call `gather_to_host` on the same arrays in the same order, or the
    job hangs); a fully addressable array or a NumPy value is converted locally. Typed PRNG
    key leaves come back as key arrays on a local device. Non-array leaves (`None`,
    strings) pass through.

    The whole array lands in every process's memory (and, transiently, replicated on its
    devices): fine for spike counts and sweep results; for a large raster read only this
    process's part with `[s.data for s in x.addressable_shards]` (no communication).

    Example: `spikes = gather_to_host(rec.spikes)["E"][:, :sharded.size("E")]`.
    """
    return jtu.tree_map(_gather_one, tree)
