"""A NIR graph as a steppable neurojax model, and `from_nir` which builds it."""

import dataclasses
import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from .._validation import check_choice, check_dt, default_float, normalize_shape
from ..surrogate import FastSigmoid, Surrogate, as_surrogate
from ._nodes import (
    NODE_TYPES,
    AffineOp,
    ConvOp,
    DelayOp,
    FlattenOp,
    InputOp,
    OutputOp,
    RefusedNode,
    _NeuronOp,
)
from ._require import require_nir

__all__ = ["NIRNetwork", "NIRState", "from_nir"]

_METHODS = ("exact", "euler")


class NIRState(eqx.Module):
    """State of a `NIRNetwork`: each stateful node's state and the last step's output of
    every node whose output is fed back (read one step later)."""

    nodes: dict
    feedback: dict


def _order(names, edges, inputs) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Nodes in execution order and the edges that close a cycle (read one step later).

    A depth-first search from the inputs, visiting successors in the order of the edge list;
    an edge into a node still on the search path is a feedback edge. The order is the
    reverse post-order of the search, a topological order once feedback edges are removed.
    """
    succ: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        succ[a].append(b)
    state: dict[str, int] = {}
    post: list[str] = []
    back: list[tuple[str, str]] = []
    for root in list(inputs) + [n for n in names if n not in inputs]:
        if root in state:
            continue
        stack = [(root, iter(succ[root]))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[node] = 2
                post.append(node)
            elif state.get(nxt) == 1:
                back.append((node, nxt))
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
    return tuple(reversed(post)), tuple(back)


class NIRNetwork(eqx.Module):
    """A NIR graph run by neurojax: nodes are neurojax operations, edges carry arrays.

    Made by `nj.nir.from_nir`; written back by `nj.nir.to_nir`. It follows the step protocol
    (`init_state`, `step(state, x, dt) -> (state, outputs)`) and is callable on a time-major
    sequence; it works under `jit`, `vmap` and `grad` (spikes carry surrogate gradients).

    **Within a step** the nodes run in a topological order from the inputs; a node's input
    is the sum of the outputs on its incoming edges. An edge that closes a cycle (recurrent
    connections) delivers its source's output of the previous step, which is zero at the
    first step; this is the one-step delay of `nj.training.SpikingRecurrent`.

    **Inputs and outputs.** With one `Input` node `x` is an array `(*batch, *shape)`, with
    several a dict by node name; likewise the outputs. `dt` is fixed at import (the delays
    and the discretisation depend on it) and is in the graph's time unit.

    Attributes:
        nodes: node name -> neurojax operation (its parameters are array leaves).
        edges: the graph's edges `(source, target)`.
        dt: the time step the graph was imported for.
        method: `"exact"` or `"euler"` (see `from_nir`).
        time_unit: the graph's time unit as its metadata states it (`"s"`, `"ms"`), which
            `to_nir` writes back; `None` when the graph did not say.
    """

    nodes: dict
    edges: tuple[tuple[str, str], ...] = eqx.field(static=True)
    order: tuple[str, ...] = eqx.field(static=True)
    feedback_edges: tuple[tuple[str, str], ...] = eqx.field(static=True)
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = eqx.field(static=True)
    inputs: tuple[str, ...] = eqx.field(static=True)
    outputs: tuple[str, ...] = eqx.field(static=True)
    dt: float = eqx.field(static=True)
    method: str = eqx.field(static=True)
    time_unit: str | None = eqx.field(static=True, default=None)

    def init_state(
        self, shape: int | tuple[int, ...] = (), *, key: PRNGKeyArray | None = None
    ) -> NIRState:
        """Rest state for a batch of `shape` (`()` for one example); `key` is unused."""
        batch = () if shape == () else normalize_shape("NIRNetwork.init_state", shape)
        nodes = {}
        for name in self.order:
            st = self.nodes[name].init_state(batch)
            if st is not None:
                nodes[name] = st
        shapes = dict(self.shapes)
        feedback = {}
        for src, _ in self.feedback_edges:
            feedback[src] = jnp.zeros(batch + shapes[src], default_float())
        return NIRState(nodes=nodes, feedback=feedback)

    def _check_dt(self, dt) -> None:
        dt = check_dt("NIRNetwork", dt)
        if abs(dt - self.dt) > 1e-9 * self.dt:
            raise ValueError(
                f"NIRNetwork: dt must be the dt the graph was imported with ({self.dt}), got "
                f"{dt}; import it again with from_nir(graph, dt={dt})"
            )

    def _inputs(self, x) -> dict:
        if len(self.inputs) == 1 and not isinstance(x, Mapping):
            return {self.inputs[0]: x}
        if not isinstance(x, Mapping) or set(x) != set(self.inputs):
            got = sorted(x) if isinstance(x, Mapping) else type(x).__name__
            raise ValueError(
                f"NIRNetwork: x must be a dict with one array per input node {list(self.inputs)}"
                f", got {got}"
            )
        return dict(x)

    def step(self, state: NIRState, x, dt: float):
        """One step of every node; `x` and the outputs as described in the class docstring."""
        self._check_dt(dt)
        x = self._inputs(x)
        back = set(self.feedback_edges)
        incoming: dict[str, list[tuple[str, bool]]] = {n: [] for n in self.order}
        for a, b in self.edges:
            incoming[b].append((a, (a, b) in back))
        values: dict[str, Any] = {}
        new_nodes = dict(state.nodes)
        for name in self.order:
            op = self.nodes[name]
            if name in self.inputs:
                inp = jnp.asarray(x[name], default_float())
            else:
                terms = [state.feedback[a] if fb else values[a] for a, fb in incoming[name]]
                if not terms:
                    raise ValueError(f"NIRNetwork: node {name!r} has no incoming edge")
                inp = terms[0]
                for t in terms[1:]:
                    inp = inp + t
            st, values[name] = op.step(state.nodes.get(name), inp, self.dt)
            if name in new_nodes:
                new_nodes[name] = st
        feedback = {src: values[src] for src in state.feedback}
        outs = {name: values[name] for name in self.outputs}
        out = outs[self.outputs[0]] if len(self.outputs) == 1 else outs
        return NIRState(nodes=new_nodes, feedback=feedback), out

    def __call__(self, x_seq, *, state: NIRState | None = None, dt: float | None = None):
        """Run over a time-major input (`(t, *batch, *shape)`, or a dict of such arrays);
        return the outputs with time first. `state` defaults to rest for the batch shape of
        the input; `dt` defaults to the graph's."""
        dt = self.dt if dt is None else dt
        self._check_dt(dt)
        xs = self._inputs(x_seq)
        if state is None:
            first = self.inputs[0]
            arr = jnp.asarray(xs[first])
            shape = self.nodes[first].shape
            batch = arr.shape[1 : arr.ndim - len(shape)]
            if arr.ndim < len(shape) + 1 or arr.shape[arr.ndim - len(shape) :] != shape:
                raise ValueError(
                    f"NIRNetwork: input {first!r} must have shape (t, *batch, "
                    f"{', '.join(map(str, shape))}), got {arr.shape}"
                )
            state = self.init_state(batch)

        def body(st, x):
            return self.step(st, x, dt)

        seq = xs if len(self.inputs) > 1 else xs[self.inputs[0]]
        _, out = jax.lax.scan(body, state, seq)
        return out

    def node_state(self, state: NIRState, name: str):
        """The state of node `name` in `state` (for example to read a membrane `v`)."""
        if name not in state.nodes:
            raise KeyError(
                f"NIRNetwork.node_state: name must be a stateful node, one of "
                f"{sorted(state.nodes)}, got {name!r}"
            )
        return state.nodes[name]


def _check_structure(nir, graph, prefix: str) -> None:
    """Refuse nodes that are not a dict of named NIR nodes and edges that are not pairs of
    node names, before anything reads them."""
    where = f"the graph {prefix[:-1]!r}" if prefix else "the graph"
    if not isinstance(graph.nodes, Mapping):
        raise TypeError(
            f"from_nir: {where}'s nodes must be a dict {{name: NIR node}}, got "
            f"{type(graph.nodes).__name__}"
        )
    for name, node in graph.nodes.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"from_nir: {where} has a node named {name!r}; names must be str")
        if not isinstance(node, nir.NIRNode):
            raise TypeError(
                f"from_nir: node {prefix + name!r} of {where} must be a NIR node, got "
                f"{type(node).__name__}"
            )
    if isinstance(graph.edges, (str, bytes)) or not hasattr(graph.edges, "__iter__"):
        raise TypeError(
            f"from_nir: {where}'s edges must be a list of (source, target) pairs, got "
            f"{graph.edges!r}"
        )
    for i, edge in enumerate(graph.edges):
        ok = (
            isinstance(edge, (tuple, list))
            and len(edge) == 2
            and all(isinstance(end, str) for end in edge)
        )
        if not ok:
            raise ValueError(
                f"from_nir: edge {i} of {where} must be a pair (source, target) of node names, "
                f"got {edge!r}"
            )


def _flatten_graph(nir, graph, prefix: str = ""):
    """Nodes and edges of `graph` with nested graphs inlined (names joined with '.')."""
    _check_structure(nir, graph, prefix)
    nodes, edges = {}, []
    entry, exit_ = {}, {}
    for name, node in graph.nodes.items():
        full = prefix + name
        if isinstance(node, nir.NIRGraph):
            sub_nodes, sub_edges = _flatten_graph(nir, node, full + ".")
            ins = [k for k, v in node.nodes.items() if isinstance(v, nir.Input)]
            outs = [k for k, v in node.nodes.items() if isinstance(v, nir.Output)]
            # The sub-graph's Input and Output nodes become pass-through nodes inside.
            nodes.update(sub_nodes)
            edges.extend(sub_edges)
            entry[name] = [f"{full}.{k}" for k in ins]
            exit_[name] = [f"{full}.{k}" for k in outs]
        else:
            nodes[full] = node
    for a, b in graph.edges:
        srcs = exit_.get(a, [prefix + a]) if a in graph.nodes else [prefix + a]
        dsts = entry.get(b, [prefix + b]) if b in graph.nodes else [prefix + b]
        for s in srcs:
            for d in dsts:
                edges.append((s, d))
    return nodes, edges


def _input_shape_from_successors(name, ops, edges):
    for a, b in edges:
        if a != name:
            continue
        op = ops[b]
        if isinstance(op, AffineOp):
            return (int(op.weight.shape[1]),)
        if isinstance(op, ConvOp) and op.input_shape is not None:
            return (int(op.weight.shape[1]) * op.groups,) + tuple(op.input_shape)
    return None


def _infer_shapes(ops, raw_nodes, order, edges, back, inputs, dt):
    """The unbatched output shape of every node, walking the graph in execution order.

    NIR leaves some shapes open: an `Input` may have none, neuron parameters may be scalars
    shared by a whole layer, pooling and convolution nodes may omit their input shape. An
    open `Input` takes the input size of the node it feeds (an `Affine`, `Linear` or a
    convolution with `input_shape`); a neuron or delay node with scalar parameters, and a
    `Flatten` without `input_type`, take the shape of their input; every other node's output
    shape is traced with `jax.eval_shape`.
    """
    ops = dict(ops)
    shapes: dict[str, tuple[int, ...]] = {}
    back = set(back)

    def kind(n):
        return type(raw_nodes[n]).__name__

    for name in order:
        op = ops[name]
        if name in inputs:
            shape = (
                op.shape if op.shape is not None else _input_shape_from_successors(name, ops, edges)
            )
            if shape is None:
                raise RefusedNode(
                    f"from_nir: node {name!r} (Input): shape must be given, or inferable from the "
                    "node it feeds (an Affine, Linear or a convolution with input_shape); got None"
                )
            ops[name] = dataclasses.replace(op, shape=tuple(shape))
            shapes[name] = tuple(shape)
            continue
        preds = [a for a, b in edges if b == name and (a, b) not in back and a in shapes]
        if not preds:
            raise ValueError(
                f"from_nir: node {name!r} ({kind(name)}) is not reached from any Input node"
            )
        in_shape = shapes[preds[0]]
        for other in preds[1:]:
            if shapes[other] != in_shape:
                raise ValueError(
                    f"from_nir: node {name!r} ({kind(name)}) sums inputs of different shapes: "
                    f"{preds[0]!r} gives {in_shape}, {other!r} gives {shapes[other]}"
                )
        if isinstance(op, OutputOp):
            if op.shape is None:
                op = ops[name] = dataclasses.replace(op, shape=in_shape)
            shapes[name] = tuple(op.shape)
        elif isinstance(op, (_NeuronOp, DelayOp)):
            if op.shape == () and in_shape != ():
                op = ops[name] = dataclasses.replace(op, shape=in_shape)
            if tuple(op.shape) != in_shape:
                raise RefusedNode(
                    f"from_nir: node {name!r} ({kind(name)}): its parameters have shape "
                    f"{tuple(op.shape)} but its input has shape {in_shape}"
                )
            shapes[name] = tuple(op.shape)
        else:
            if isinstance(op, FlattenOp) and op.in_shape is None:
                try:
                    op = ops[name] = op.resolved(in_shape)
                except ValueError as err:
                    raise RefusedNode(f"from_nir: node {name!r} (Flatten): {err}") from err
            elif isinstance(op, FlattenOp) and op.in_shape != in_shape:
                raise RefusedNode(
                    f"from_nir: node {name!r} (Flatten): input_type {op.in_shape} differs from "
                    f"the shape of its input, {in_shape}"
                )
            x = jax.ShapeDtypeStruct(in_shape, default_float())
            try:
                out = jax.eval_shape(lambda x, op=op: op.step(None, x, dt)[1], x)
            except (ValueError, TypeError) as err:
                raise RefusedNode(
                    f"from_nir: node {name!r} ({kind(name)}) cannot take an input of shape "
                    f"{in_shape}: {err}"
                ) from err
            shapes[name] = tuple(out.shape)
    return ops, shapes


def from_nir(
    graph: Any,
    *,
    dt: float,
    method: str = "exact",
    surrogate: Surrogate | str | None = None,
) -> NIRNetwork:
    r"""Read a NIR graph into a `NIRNetwork` that neurojax steps, jits, vmaps and differentiates.

    `graph` is a `nir.NIRGraph` or the path of a `.nir` file. Supported primitives: Input,
    Output, Affine, Linear, Scale, Delay, Threshold, Flatten, Conv1d, Conv2d, SumPool2d,
    AvgPool2d, I, IF, LI, LIF, CubaLI, CubaLIF, and nested graphs (inlined, their nodes named
    `outer.inner`). Anything else, and any parameter that neurojax cannot represent, raises
    `ValueError` naming the node, its type and the field.

    **Discretisation.** NIR neurons are continuous-time ODEs; every input arriving at a node
    is held constant over a step of length `dt` (a spike of the previous layer is a pulse of
    height 1 lasting one step). With `method="exact"` (default) the linear ODEs are then
    integrated exactly over the step:

    - LI, LIF: `v <- v_inf + (v - v_inf) exp(-dt / tau)`, `v_inf = v_leak + r I`;
    - I, IF: `v <- v + dt r I`;
    - CubaLI, CubaLIF: `I <- w_in x + (I - w_in x) a` and the membrane's exact solution of the
      linear pair, `v - v_leak <- (v - v_leak) b + r (w_in x (1 - b) + (I - w_in x) c)` with
      `a = exp(-dt / tau_syn)`, `b = exp(-dt / tau_mem)`,
      `c = tau_syn (a - b) / (tau_syn - tau_mem)` (its limit `b dt / tau_mem` when equal).

    so the only error is the threshold: a crossing is detected at the end of the step in
    which it happens (spike times on the `dt` grid) and the reset to `v_reset` happens there.
    With `method="euler"` the same equations are stepped by forward Euler (for CubaLI/CubaLIF
    the current first and the membrane with the new current), which reproduces simulators
    that discretise this way, such as snnTorch (whose export sets `tau = dt / (1 - beta)`).
    A neuron spikes where `v > v_threshold` after the step, then `v = v_reset`; the spike's
    gradient is `surrogate`'s. Delays become whole numbers of steps and must be multiples of
    `dt`. Neurons start at `v = v_leak` (0 for I and IF) with no synaptic current.

    **Time unit.** NIR fixes no time unit, so `dt` is read in the graph's: snnTorch, Norse
    and `nj.nir.to_nir` (by default) write seconds, so 0.1 ms is `dt=1e-4`. A graph whose
    metadata states its unit (`graph.metadata["time_unit"]`, `"s"` or `"ms"`, as `to_nir`
    writes it) keeps it in `NIRNetwork.time_unit`. When the median time constant of the
    graph's neurons is more than 1000 times `dt`, or less than a tenth of it (a graph in ms
    read with a dt in s, or the reverse), `from_nir` warns (`UserWarning`) naming both.

    **Recipes for graphs of other tools** (checked in `tests/test_nir.py` with snnTorch 1.0
    and Norse 1.1; both need `torch`, and snnTorch's export also `nirtorch`:
    `pip install snntorch torch nirtorch`, `pip install norse torch`):

    - snnTorch (`snntorch.export_nir.export_to_nir(net, sample)`) writes a `Leaky`'s `beta`
      as `tau = dt / (1 - beta)` and `r = tau / dt` for its fixed `dt = 1e-4` s, and steps
      by forward Euler: read it with `from_nir(graph, dt=1e-4, method="euler")`, which
      steps `v <- beta v + x` and gives snnTorch's spikes exactly (for `reset_mechanism=
      "zero"`; its default reset by subtraction is not what the exported `LIF` describes).
      Another `dt` describes another neuron (with `dt=1e-3` and `beta = 0.9`, forward
      Euler's factor `1 - dt / tau` is 0, not 0.9) and gives other spikes.
    - Norse (`norse.torch.to_nir(model)`) writes each `LIF`'s `tau` as `dt / tau_mem_inv`
      (`dt` times the time constant, Norse 1.1); set `graph.nodes[name].tau = 1 /
      tau_mem_inv` (seconds), then `from_nir(graph, dt=1e-3, method="euler")` gives Norse's
      spikes.

    **Files and graphs refused.** A path with no file, a folder, a file that is not HDF5, a
    truncated or damaged one, or an HDF5 file that is not a NIR graph raise
    (`FileNotFoundError`, `IsADirectoryError`, `ValueError`) naming `from_nir` and the file;
    nodes that are not NIR nodes, edges that are not `(source, target)` pairs of node names
    (`"input->node"`), and `Input`/`Output`/`Flatten` shapes that are not positive integers
    (`[-2]`) are refused naming the node or edge, before any array is made.

    Args:
        graph: a `nir.NIRGraph` or a path to a `.nir` file.
        dt: the time step, static, > 0, in the graph's time unit (see Time unit).
        method: `"exact"` or `"euler"` (see Discretisation).
        surrogate: surrogate gradient of the spikes (default `FastSigmoid()`).

    Returns:
        The `NIRNetwork`.

    Example:
    ```python
    net = nj.nir.from_nir("lif.nir", dt=1e-4)    # a graph in seconds, 0.1 ms steps
    spikes = net(x)                              # x: (t, *batch, n_in), time first
    ```
    """
    nir = require_nir("nj.nir.from_nir")
    dt = check_dt("from_nir", dt)
    check_choice("from_nir", "method", method, _METHODS)
    surrogate = FastSigmoid() if surrogate is None else as_surrogate(surrogate)
    if isinstance(graph, (str, bytes)) or hasattr(graph, "__fspath__"):
        graph = _read(nir, graph)
    if not isinstance(graph, nir.NIRGraph):
        raise TypeError(
            f"from_nir: graph must be a nir.NIRGraph or a path to a .nir file, got "
            f"{type(graph).__name__}"
        )
    raw_nodes, edges = _flatten_graph(nir, graph)
    ops = {}
    for name, node in raw_nodes.items():
        kind = type(node).__name__
        reader = NODE_TYPES.get(kind)
        if reader is None:
            raise RefusedNode(
                f"from_nir: node {name!r} has type {kind}, which neurojax does not support; "
                f"supported: {', '.join(NODE_TYPES)} and nested NIRGraph"
            )
        ops[name] = reader(name, node, method, surrogate, dt)
    for a, b in edges:
        for end, role in ((a, "source"), (b, "target")):
            if end not in ops:
                raise ValueError(
                    f"from_nir: an edge {a!r} -> {b!r} has {role} {end!r}, which is not a node "
                    f"of the graph"
                )
    targets = {b for _, b in edges}
    sources = {a for a, _ in edges}
    # Input and Output nodes of inlined sub-graphs have edges on both sides: pass-throughs.
    inputs = tuple(
        n
        for n, op in ops.items()
        if isinstance(op, InputOp) and not isinstance(op, OutputOp) and n not in targets
    )
    outputs = tuple(n for n, op in ops.items() if isinstance(op, OutputOp) and n not in sources)
    if not inputs or not outputs:
        raise ValueError(
            f"from_nir: graph must have at least one Input and one Output node, got inputs "
            f"{list(inputs)} and outputs {list(outputs)}"
        )
    order, back = _order(list(ops), edges, inputs)
    ops, shapes = _infer_shapes(ops, raw_nodes, order, edges, back, inputs, dt)
    unit = _time_unit(graph)
    _warn_if_units_differ(ops, dt, unit)
    return NIRNetwork(
        nodes=ops,
        edges=tuple((a, b) for a, b in edges),
        order=order,
        feedback_edges=back,
        shapes=tuple((n, shapes[n]) for n in order),
        inputs=inputs,
        outputs=outputs,
        dt=dt,
        method=method,
        time_unit=unit,
    )


def _read(nir, path: Any):
    """The graph in the `.nir` file at `path`; a missing, non-HDF5, truncated or non-NIR file
    is refused naming the function and the file."""
    import h5py  # a dependency of nir

    p = pathlib.Path(os.fsdecode(path))
    where = repr(str(p))
    if p.is_dir():
        raise IsADirectoryError(f"from_nir: graph {where} is a directory, expected a .nir file")
    if not p.is_file():
        raise FileNotFoundError(f"from_nir: no file at {where} (graph)")
    try:
        hdf5 = h5py.is_hdf5(p)
    except OSError:
        hdf5 = False
    if not hdf5:
        raise ValueError(
            f"from_nir: graph {where} is not an HDF5 file (a .nir file is HDF5 written by "
            "nir.write); it is of another format or damaged"
        )
    try:
        graph = nir.read(p)
    except Exception as err:  # noqa: BLE001  (h5py and nir raise many types for a bad file)
        raise ValueError(
            f"from_nir: graph {where} is not a readable NIR graph (truncated, damaged or not "
            f"written by nir.write): {type(err).__name__}: {str(err)[:300]}"
        ) from None
    if not isinstance(graph, nir.NIRGraph):
        raise ValueError(
            f"from_nir: graph {where} holds a single {type(graph).__name__} node, not a "
            "NIRGraph; wrap it with nir.NIRGraph.from_list"
        )
    return graph


_TIME_UNITS = ("s", "ms")


def _time_unit(graph) -> str | None:
    metadata = getattr(graph, "metadata", None)
    unit = metadata.get("time_unit") if isinstance(metadata, Mapping) else None
    if isinstance(unit, bytes):
        unit = unit.decode("utf-8", "replace")
    return unit if unit in _TIME_UNITS else None


def _warn_if_units_differ(ops, dt: float, unit: str | None) -> None:
    """Warn when the graph's time constants and `dt` are orders of magnitude apart: the
    typical sign of a graph in ms read with a dt in s, or the reverse."""
    taus = [
        np.asarray(getattr(op, field), np.float64).reshape(-1)
        for op in ops.values()
        for field in ("tau", "tau_syn", "tau_mem")
        if isinstance(op, _NeuronOp) and getattr(op, field, None) is not None
    ]
    if not taus:
        return
    values = np.concatenate(taus)
    ratio = float(np.median(values)) / dt
    if 0.1 <= ratio <= 1e3:
        return
    said = (
        f"; the graph's metadata says its time unit is {unit!r}"
        if unit
        else " (the graph does not state its time unit)"
    )
    warnings.warn(
        f"from_nir: the graph's time constants (median {float(np.median(values)):g}, from "
        f"{values.min():g} to {values.max():g}) are {ratio:.3g} times dt={dt:g}{said}. dt is "
        "read in the graph's time unit: a graph in seconds (snnTorch, Norse, nj.nir.to_nir) "
        "needs dt in seconds (0.1 ms is dt=1e-4), a graph in ms (nj.nir.to_nir with "
        "time_scale=1.0) dt in ms. See the recipes in from_nir's documentation",
        UserWarning,
        stacklevel=3,
    )
