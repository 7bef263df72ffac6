"""`to_nir`: neurojax layers and imported graphs written as NIR graphs."""

import math
import os
import pathlib
from typing import Any

import numpy as np

from ..neurons import LIF
from ..training._conv import AvgPool2d, Flatten, SpikingConv, SumPool2d
from ..training._layers import LeakyReadout, Sequential, SpikingDense, SpikingRecurrent
from ._graph import NIRNetwork
from ._require import require_nir

__all__ = ["to_nir"]

_LAYERS = (
    "Sequential, SpikingDense, SpikingRecurrent, LeakyReadout, SpikingConv1d, SpikingConv2d, "
    "SumPool2d, AvgPool2d, Flatten or NIRNetwork"
)


def _f32(x, shape=None) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    return a if shape is None else np.ascontiguousarray(np.broadcast_to(a, shape))


def _lif_node(nir, owner: str, neuron, shape: tuple[int, ...], time_scale: float):
    if type(neuron) is not LIF:
        raise ValueError(
            f"to_nir: {owner} has a {type(neuron).__name__} neuron; NIR has a primitive for "
            "the leaky integrate-and-fire neuron only, so only nj.LIF neurons can be exported"
        )
    t_ref = np.asarray(neuron.t_ref)
    if np.any(t_ref != 0):
        raise ValueError(
            f"to_nir: {owner} has an nj.LIF with t_ref={t_ref.tolist()} ms; NIR's LIF has no "
            "refractory period, so only t_ref=0 can be exported"
        )
    return nir.LIF(
        tau=_f32(neuron.tau_m, shape) * time_scale,
        r=_f32(neuron.r_m, shape),
        v_leak=_f32(neuron.v_rest, shape),
        v_threshold=_f32(neuron.v_th, shape),
        v_reset=_f32(neuron.v_reset, shape),
    )


def _shape(n) -> tuple[int, ...]:
    return (n,) if isinstance(n, int) else tuple(n)


def _layer(nir, i: int, layer, time_scale: float):
    """The nodes of layer `i`, its internal edges, and its entry and exit node names."""
    p = f"layer{i}"
    owner = f"layer {i} ({type(layer).__name__})"
    if isinstance(layer, (SpikingDense, SpikingRecurrent)):
        w = np.asarray(layer.weight).T
        proj = (
            nir.Affine(weight=_f32(w), bias=_f32(layer.bias))
            if layer.bias is not None
            else nir.Linear(weight=_f32(w))
        )
        nodes = {
            f"{p}_affine": proj,
            f"{p}_lif": _lif_node(nir, owner, layer._neuron(), (layer.n_out,), time_scale),
        }
        edges = [(f"{p}_affine", f"{p}_lif")]
        if isinstance(layer, SpikingRecurrent):
            nodes[f"{p}_recurrent"] = nir.Linear(weight=_f32(np.asarray(layer.recurrent).T))
            edges += [(f"{p}_lif", f"{p}_recurrent"), (f"{p}_recurrent", f"{p}_lif")]
        return nodes, edges, f"{p}_affine", f"{p}_lif"
    if isinstance(layer, LeakyReadout):
        w = _f32(np.asarray(layer.weight).T)
        proj = (
            nir.Affine(weight=w, bias=_f32(layer.bias))
            if layer.bias is not None
            else nir.Linear(weight=w)
        )
        shape = (layer.n_out,)
        li = nir.LI(
            tau=_f32(layer._tau(), shape) * time_scale,
            r=np.ones(shape, np.float32),
            v_leak=np.zeros(shape, np.float32),
        )
        nodes = {f"{p}_affine": proj, f"{p}_li": li}
        return nodes, [(f"{p}_affine", f"{p}_li")], f"{p}_affine", f"{p}_li"
    if isinstance(layer, SpikingConv):
        ndim = len(layer.in_shape) - 1
        bias = layer.bias if layer.bias is not None else np.zeros(layer.out_shape[0])
        padding = layer.padding
        if ndim == 1:
            conv = nir.Conv1d(
                input_shape=layer.in_shape[1],
                weight=_f32(layer.weight),
                stride=layer.stride[0],
                padding=padding if isinstance(padding, str) else padding[0],
                dilation=layer.dilation[0],
                groups=layer.groups,
                bias=_f32(bias),
            )
        else:
            conv = nir.Conv2d(
                input_shape=tuple(layer.in_shape[1:]),
                weight=_f32(layer.weight),
                stride=layer.stride,
                padding=padding,
                dilation=layer.dilation,
                groups=layer.groups,
                bias=_f32(bias),
            )
        nodes = {
            f"{p}_conv": conv,
            f"{p}_lif": _lif_node(nir, owner, layer._neuron(), layer.out_shape, time_scale),
        }
        return nodes, [(f"{p}_conv", f"{p}_lif")], f"{p}_conv", f"{p}_lif"
    if isinstance(layer, (SumPool2d, AvgPool2d)):
        cls = nir.SumPool2d if isinstance(layer, SumPool2d) else nir.AvgPool2d
        node = cls(
            kernel_size=np.array(layer.kernel_size),
            stride=np.array(layer.stride),
            padding=np.array(layer.padding),
        )
        # NIR leaves pooling shapes open; the layer knows them, which lets readers that
        # need shapes (and `from_nir` for a feedback edge) have them.
        node.input_type = {"input": np.array(layer.in_shape)}
        node.output_type = {"output": np.array(layer.out_shape)}
        name = f"{p}_{'sumpool' if isinstance(layer, SumPool2d) else 'avgpool'}"
        return {name: node}, [], name, name
    if isinstance(layer, Flatten):
        node = nir.Flatten(input_type={"input": np.array(layer.in_shape)}, start_dim=0, end_dim=-1)
        return {f"{p}_flatten": node}, [], f"{p}_flatten", f"{p}_flatten"
    raise TypeError(f"to_nir: {owner} cannot be exported; layers must be {_LAYERS}")


def _check_time_scale(time_scale) -> float:
    if isinstance(time_scale, bool) or not isinstance(time_scale, (int, float)):
        raise TypeError(f"to_nir: time_scale must be a positive number, got {time_scale!r}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"to_nir: time_scale must be finite and > 0, got {time_scale!r}")
    return float(time_scale)


def _check_path(path: Any) -> pathlib.Path:
    """The target file, refused (as `nj.save` does) when it is not a path, its folder does
    not exist or it is a folder, before anything is written."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"to_nir: path must be a non-empty str or pathlib.Path, got {path!r}")
    p = pathlib.Path(os.fspath(path))
    directory = p.absolute().parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"to_nir: the directory {str(directory)!r} of path {str(p)!r} does not exist"
        )
    if p.is_dir():
        raise IsADirectoryError(f"to_nir: path {str(p)!r} is a directory, expected a file")
    return p


# The unit a time_scale writes, stated in the graph's metadata (`from_nir` reads it).
_UNITS = {1e-3: "s", 1.0: "ms"}


def to_nir(model: Any, path: Any = None, *, time_scale: float | None = None) -> Any:
    r"""Write a neurojax model as a NIR graph (and optionally to a `.nir` file).

    Supported models and the nodes they become (`i` is the layer's index):

    | neurojax | NIR nodes |
    | --- | --- |
    | `SpikingDense` | `layer{i}_affine` (`Affine`; `Linear` without bias) -> `layer{i}_lif` |
    | `SpikingRecurrent` | as `SpikingDense`, and `layer{i}_lif` <-> `layer{i}_recurrent` |
    | `LeakyReadout` | `layer{i}_affine` -> `layer{i}_li` (`LI` with `r = 1`, `v_leak = 0`) |
    | `SpikingConv1d`, `SpikingConv2d` | `layer{i}_conv` (`Conv1d`/`Conv2d`) -> `layer{i}_lif` |
    | `SumPool2d`, `AvgPool2d`, `Flatten` | the node of the same name |
    | `Sequential` | its layers in a chain between `input` and `output` |
    | `NIRNetwork` (from `from_nir`) | its nodes and edges, names kept (nested graphs inlined) |

    `layer{i}_lif` is a `LIF` node; `layer{i}_recurrent` a `Linear` from it back to itself.
    An `nj.LIF` neuron becomes NIR's LIF with `tau = tau_m`, `r = r_m`, `v_leak = v_rest`,
    `v_threshold = v_th`, `v_reset = v_reset` (broadcast to one value per neuron); weights are
    transposed to NIR's `(n_out, n_in)`. A layer's bias is the `Affine`'s bias. Models NIR
    cannot express raise `ValueError` naming the layer and the reason: neurons other than
    `nj.LIF`, and a refractory period `t_ref > 0`. A layer with `learn_tau=True` is written
    with its effective (clamped) time constant. NIR describes continuous-time dynamics, so
    `dt` is not part of the graph; `nj.nir.from_nir(graph, dt=...)` reads it back exactly
    (`method="exact"`, the same integration as `nj.LIF`'s default).

    **Units.** neurojax works in ms; NIR fixes no unit and the tools that read it (snnTorch,
    Norse, Sinabs, Lava, ...) assume seconds. By default the time constants of neurojax
    layers are therefore written in seconds (`time_scale=1e-3`: `tau_m = 10` ms becomes
    `tau = 0.01`), and the graph's metadata says so (`graph.metadata["time_unit"] = "s"`;
    `"ms"` with `time_scale=1.0`). Read it back with `dt` in seconds: `from_nir(graph,
    dt=1e-4)` for 0.1 ms steps. An imported `NIRNetwork` is written in its own unit (by
    default `time_scale=1.0`, its `time_unit` kept).

    Args:
        model: the model to export (see the table).
        path: where to write the graph as a `.nir` (HDF5) file (its folder must exist; an
            existing file is replaced); `None` writes nothing.
        time_scale: factor applied to every time constant and delay (and the inverse to
            the `r` of `I`/`IF`, whose ODE has no time constant). `None` (default): `1e-3`
            for neurojax layers (ms to s), `1.0` for a `NIRNetwork`.

    Returns:
        The `nir.NIRGraph`.

    Raises:
        TypeError, ValueError: for a model NIR cannot express or a bad `time_scale`.
        FileNotFoundError, IsADirectoryError: for a `path` whose folder does not exist or
            that is a folder, before anything is written.

    Example:
    ```python
    graph = nj.nir.to_nir(model, "model.nir")       # time constants in s
    net = nj.nir.from_nir("model.nir", dt=1e-4)     # 0.1 ms steps, in s
    ```
    """
    nir = require_nir("nj.nir.to_nir")
    if time_scale is None:
        time_scale = 1.0 if isinstance(model, NIRNetwork) else 1e-3
    time_scale = _check_time_scale(time_scale)
    target = None if path is None else _check_path(path)
    if isinstance(model, NIRNetwork):
        nodes = {name: op.to_nir(nir, time_scale) for name, op in model.nodes.items()}
        graph = nir.NIRGraph(nodes=nodes, edges=[tuple(e) for e in model.edges], type_check=False)
        unit = model.time_unit if time_scale == 1.0 else None
    else:
        layers = model.layers if isinstance(model, Sequential) else (model,)
        if not hasattr(layers[0], "n_in"):
            raise TypeError(f"to_nir: model must be {_LAYERS}, got {type(model).__name__}")
        nodes = {"input": nir.Input(input_type=np.array(_shape(layers[0].n_in)))}
        edges = []
        prev = "input"
        for i, layer in enumerate(layers):
            layer_nodes, layer_edges, entry, exit_ = _layer(nir, i, layer, time_scale)
            nodes.update(layer_nodes)
            edges += [(prev, entry)] + layer_edges
            prev = exit_
        nodes["output"] = nir.Output(output_type=np.array(_shape(layers[-1].n_out)))
        edges.append((prev, "output"))
        graph = nir.NIRGraph(nodes=nodes, edges=edges, type_check=False)
        unit = _UNITS.get(time_scale)
    if unit is not None:
        graph.metadata["time_unit"] = unit
    if target is not None:
        try:
            nir.write(target, graph)
        except OSError as err:
            raise type(err)(f"to_nir: cannot write {str(target)!r}: {err}") from err
    return graph
