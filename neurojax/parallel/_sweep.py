"""`sweep`: run one function over a batch of parameter sets or trials with vmap.

The batch is cut into chunks of a fixed size (so memory is bounded and every chunk reuses one
compiled program), each chunk is vmapped, and with a `mesh` each chunk is laid out along the
batch axis over the mesh's devices (`NamedSharding`), so that every device runs its share of
the trials in the same program.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._validation import check_positive_int

__all__ = ["sweep"]


def _batch_size_of(params: Any) -> int:
    leaves = jtu.tree_leaves(params)
    if not leaves:
        raise ValueError(f"sweep: params must contain at least one array, got {params!r}")
    sizes = {np.shape(x)[0] if np.ndim(x) >= 1 else None for x in leaves}
    if None in sizes or len(sizes) != 1:
        shapes = [tuple(np.shape(x)) for x in leaves]
        raise ValueError(
            "sweep: every leaf of params needs the same leading batch axis (one entry per "
            f"parameter set or trial); got leaves of shapes {shapes}"
        )
    n = sizes.pop()
    if n == 0:
        raise ValueError("sweep: params has an empty batch axis (0 parameter sets)")
    return n


def _mesh_axes(mesh: Mesh | None, axis: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if mesh is None:
        if axis is not None:
            raise ValueError(f"sweep: axis={axis!r} needs a mesh; got mesh=None")
        return ()
    if not isinstance(mesh, Mesh):
        raise TypeError(f"sweep: mesh must be a jax.sharding.Mesh or None, got {type(mesh)!r}")
    if axis is None:
        return tuple(mesh.axis_names)
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    unknown = [a for a in names if a not in mesh.axis_names]
    if unknown:
        raise ValueError(f"sweep: axis {unknown} not in the mesh's axes {tuple(mesh.axis_names)}")
    return names


def _run(fn, chunk, sharding):
    if sharding is None:
        return jax.vmap(fn)(chunk)
    # shard_map rather than sharding annotations: each device vmaps fn over its own slice
    # of the batch, with no cross-device communication and no reliance on the partitioner
    # propagating shardings through the scans inside fn.
    spec = sharding.spec
    return jax.shard_map(
        jax.vmap(fn), mesh=sharding.mesh, in_specs=(spec,), out_specs=spec, check_vma=False
    )(chunk)


_run_jit = eqx.filter_jit(_run)


def _pad(chunk: Any, size: int) -> Any:
    """Fill a short last chunk up to `size` by repeating its first entry (dropped afterwards)."""
    n = _batch_size_of(chunk)
    if n == size:
        return chunk

    # Gathering works for every leaf type, typed PRNG key arrays included.
    index = np.concatenate([np.arange(n), np.zeros(size - n, np.int64)])
    return jtu.tree_map(lambda x: x[index], chunk)


def sweep(
    fn: Callable,
    params: Any,
    *,
    batch_size: int | None = None,
    mesh: Mesh | None = None,
    axis: str | tuple[str, ...] | None = None,
    to_host: bool = True,
    progress: bool = False,
) -> Any:
    """Evaluate `fn` on every entry of a batch of parameter sets or trials.

    `fn(p)` takes ONE entry (the leaves of `params` without their leading axis) and returns a
    PyTree of arrays; `sweep` returns the same PyTree with a leading axis of the batch size,
    entry `i` equal to `fn(params[i])`: the same program vmapped, so equal to a Python loop
    up to the rounding of vectorised code (a chunk may be vectorised differently from a
    single call; simulations of neuron models come out bit for bit equal in the tests).

    Args:
        fn: the function of one parameter set. A plain function is part of the compiled
            program's identity (the same function object reuses it across calls); an
            `equinox.Module` with `__call__` keeps its array fields as traced inputs.
        params: a PyTree whose leaves share a leading batch axis `B`: parameter values, a
            batch of `jax.random` keys, initial states, or any mix.
        batch_size: evaluate at most this many entries at once (a bound on memory). The
            batch is cut into chunks of this size, each run by one compiled program; a short
            last chunk is padded (its extra results are dropped). Default: all `B` at once.
            It is also a speed setting: on CPU a chunk whose states stay in cache runs
            fastest (for the 4000-neuron COBA network, chunks of 4-16 trials cost 0.94-0.99
            of one trial each against 1.3 for all 64 at once, `benchmarks/RESULTS.md`); a
            GPU wants chunks large enough to fill it.
        mesh: a `jax.sharding.Mesh`; each chunk is split along its batch axis over the
            devices of `axis` (a chunk is padded up to a multiple of their number).
        axis: the mesh axis name (or names) to shard the batch over; default all axes.
        to_host: return NumPy arrays on the host (default); `False` keeps JAX arrays on
            the device (sharded along the batch axis when a mesh is given, and concatenated
            on the device when there are several chunks).
        progress: show a progress bar (tqdm) over the chunks.

    Returns:
        `fn`'s output PyTree with a leading batch axis of size `B`.

    Example:
    ```python
    import jax.numpy as jnp, neurojax as nj
    lif = nj.LIF(tau_m=10.0, v_rest=-70.0, v_reset=-70.0, v_th=-55.0, r_m=40.0)

    def rate(current):          # one trial: spike count of one neuron in 200 ms
        _, rec = nj.simulate(lif, lif.init_state(1), current, dt=0.1, n_steps=2000)
        return rec.spikes.sum() / 0.2

    rates = nj.parallel.sweep(rate, jnp.linspace(0.3, 1.0, 64)[:, None], batch_size=16)
    ```
    """
    if not callable(fn):
        raise TypeError(f"sweep: fn must be callable, got {type(fn).__name__}")
    n = _batch_size_of(params)
    if batch_size is not None:
        batch_size = check_positive_int("sweep", "batch_size", batch_size)
    if not isinstance(to_host, bool):
        raise TypeError(f"sweep: to_host must be a bool, got {to_host!r}")
    axes = _mesh_axes(mesh, axis)
    chunk = min(n, batch_size) if batch_size is not None else n
    sharding = None
    if mesh is not None:
        n_dev = int(np.prod([mesh.shape[a] for a in axes]))
        chunk = -(-chunk // n_dev) * n_dev
        sharding = NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0]))
    params = jtu.tree_map(lambda x: x if isinstance(x, jax.Array) else jnp.asarray(x), params)
    _check_outputs(fn, params)

    starts = list(range(0, n, chunk))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, unit="trial", desc="sweep", dynamic_ncols=True)
    parts = []
    try:
        for start in starts:
            stop = min(start + chunk, n)
            part = jtu.tree_map(lambda x, a=start, b=stop: x[a:b], params)
            part = _pad(part, chunk)
            if sharding is not None:
                part = jax.device_put(part, sharding)
            out = _run_jit(fn, part, sharding)
            if to_host:
                out = jax.device_get(out)
            if stop - start < chunk:
                out = _trim(out, stop - start, sharding)
            parts.append(out)
            if bar is not None:
                jax.block_until_ready(out)
                bar.update(stop - start)
    finally:
        if bar is not None:
            bar.close()
    if len(parts) == 1:
        return parts[0]
    if to_host:
        return jtu.tree_map(lambda *xs: np.concatenate(xs, axis=0), *parts)
    if sharding is None:
        return jtu.tree_map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)
    # Concatenate on the host-visible global arrays and lay the result out again along the
    # batch axis when it divides evenly over the devices, else replicate it.
    host = jtu.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs], axis=0), *parts)
    return jax.device_put(host, _layout(sharding, n))


def _check_outputs(fn: Any, params: Any) -> None:
    """Trace `fn` on one abstract entry (nothing is compiled or run) and refuse outputs that
    are not arrays, naming the leaf, before the sweep compiles."""
    one = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), params)
    out = eqx.filter_eval_shape(fn, one)
    for path, leaf in jtu.tree_leaves_with_path(out):
        if not isinstance(leaf, jax.ShapeDtypeStruct) and not isinstance(
            leaf, (bool, int, float, np.ndarray, np.generic)
        ):
            where = jtu.keystr(path) or "its output"
            raise TypeError(
                f"sweep: fn returned {type(leaf).__name__} {leaf!r:.60} at {where}, not an "
                "array; fn must return a PyTree of arrays (one entry of the results)"
            )


def _layout(sharding: NamedSharding, n: int) -> NamedSharding:
    n_dev = sharding.num_devices
    return sharding if n % n_dev == 0 else NamedSharding(sharding.mesh, P())


def _trim(out: Any, m: int, sharding: NamedSharding | None) -> Any:
    """The first `m` entries of a padded chunk's results."""
    if sharding is None or not isinstance(jtu.tree_leaves(out)[0], jax.Array):
        return jtu.tree_map(lambda x: x[:m], out)
    # A sharded array cut to a length the devices do not divide cannot keep its layout.
    host = jtu.tree_map(lambda x: np.asarray(x)[:m], out)
    return jax.device_put(host, _layout(sharding, m))
