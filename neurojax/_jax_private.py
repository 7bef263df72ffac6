"""Every use of JAX's private modules (`jax._src`) in neurojax, in one place.

JAX does not promise that anything under `jax._src` stays; neurojax reads it only through the
functions here, each of which says what it needs. `tests/test_threads.py` calls every one
of them against the installed JAX, so an upgrade that moves or renames what they read fails
that test by name rather than changing neurojax's behaviour silently. Nothing here changes
JAX's state.
"""

__all__ = ["cpu_backend_started"]


def cpu_backend_started() -> bool:
    """Whether JAX has created its CPU client in this process (after which XLA's CPU thread
    pool has its size: `PJRT_NPROC` is read when the client is created).

    Reads `jax._src.xla_bridge._backends`, the table of created backends (a dict keyed by
    platform name).
    """
    from jax._src import xla_bridge

    backends = xla_bridge._backends
    if not isinstance(backends, dict):
        raise RuntimeError(
            "neurojax._jax_private.cpu_backend_started: jax._src.xla_bridge._backends is "
            f"{type(backends).__name__}, expected a dict (JAX changed; update this adapter)"
        )
    return "cpu" in backends
