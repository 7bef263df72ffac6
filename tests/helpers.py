"""Shared test helpers: the registry of every public neuron model and small utilities.

Each `ModelCase` is one configuration that the contract tests in `test_contract.py` run
through the same checks (jit vs eager, batching, gradients, recompilation, chunking). A new
neuron model is covered by adding one entry here.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import neurojax as nj


@dataclasses.dataclass(frozen=True)
class ModelCase:
    id: str
    make: Callable[[], Any]  # builds the model (inside an x64 context when needed)
    drive: tuple[float, ...]  # one supra-threshold input per neuron (model units)
    sub: float  # a sub-threshold input for smooth-gradient checks
    dt: float  # ms
    n_steps: int
    # a parameter name whose value can be perturbed without changing any static field
    param: str


MODEL_CASES = [
    ModelCase("lif", lambda: nj.LIF(t_ref=2.0), (16.0, 20.0, 30.0), 5.0, 0.1, 400, "tau_m"),
    ModelCase(
        "lif-per-neuron",
        lambda: nj.LIF(tau_m=jnp.array([8.0, 10.0, 12.0]), t_ref=1.0, surrogate="arctan"),
        (16.0, 20.0, 30.0),
        5.0,
        0.1,
        400,
        "v_th",
    ),
    ModelCase(
        "izhikevich-rs-euler",
        lambda: nj.Izhikevich.preset("RS"),
        (6.0, 10.0, 14.0),
        1.0,
        0.1,
        1000,
        "a",
    ),
    ModelCase(
        "izhikevich-rs-published",
        lambda: nj.Izhikevich.preset("RS", method="published"),
        (6.0, 10.0, 14.0),
        1.0,
        0.25,
        400,
        "b",
    ),
    ModelCase(
        "hh-rk4",
        lambda: nj.HodgkinHuxley(method="rk4"),
        (8.0, 10.0, 20.0),
        1.0,
        0.025,
        1000,
        "g_na",
    ),
    ModelCase(
        "hh-exp-euler",
        lambda: nj.HodgkinHuxley(method="exp_euler", surrogate="triangular"),
        (8.0, 10.0, 20.0),
        1.0,
        0.025,
        1000,
        "g_k",
    ),
    ModelCase("adex-euler", lambda: nj.AdEx(method="euler"), (0.8, 1.0, 1.5), 0.2, 0.05, 2000, "a"),
    ModelCase("adex-rk4", lambda: nj.AdEx(method="rk4"), (0.8, 1.0, 1.5), 0.2, 0.05, 2000, "tau_w"),
]


def case_ids(cases=MODEL_CASES) -> list[str]:
    return [c.id for c in cases]


def python_loop(model, state, current, dt: float, n_steps: int):
    """Reference driver: a plain Python loop over `model.step`, eagerly, op by op."""
    spikes, vs = [], []
    for _ in range(n_steps):
        state, s = model.step(state, current, dt)
        spikes.append(np.asarray(s))
        vs.append(np.asarray(state.v))
    return state, np.stack(spikes), np.stack(vs)


def ffi_output_shapes(fn, *args) -> list[tuple[int, ...]]:
    """Shapes of the outputs of every compiled-kernel (FFI) call in `fn`'s jaxpr.

    Under `vmap` a kernel batched into one call shows the vmapped axis in its output shape;
    a kernel run one call per trial shows the unbatched shape inside a loop. The run-start
    check of a traced network's indices (`nj_out_of_range`, one boolean per array checked)
    is not a kernel of the trials and is left out.
    """
    import re

    shapes = []
    lines = str(jax.make_jaxpr(fn)(*args)).splitlines()
    for at, line in enumerate(lines):
        if "= ffi_call[" in line:
            # the call's parameters follow on their own lines, its target among them
            target = next((nxt for nxt in lines[at + 1 :] if "target_name=" in nxt), "")
            if "nj_out_of_range" in target:
                continue
            lhs = line.split("= ffi_call[")[0]
            shapes += [
                tuple(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r":[a-z0-9]+\[([\d,]*)\]", lhs)
            ]
    return shapes


# simulate options under which the fused population runs (`_lif_fused`, `_hh_fused`) must
# give way to the general scan, and the options `simulate` passes to their `applies`.
GENERAL_PATH_OPTIONS = [
    dict(record=("v",)),
    dict(record=nj.Record(spikes="float")),
    dict(check=True),
    dict(gradient=nj.SurrogateGradient(checkpoint=True)),
    dict(gradient=nj.SurrogateGradient(truncate_backprop=50)),
]
FUSED_APPLIES_OPTIONS = dict(
    record_every=1,
    record=None,
    spike_dtype="bool",
    check=False,
    checkpoint=False,
    truncate_backprop=None,
)


def has_cpu_kernel(name: str) -> bool:
    """Whether the registry's kernel `name` runs its compiled CPU implementation here (on a
    CPU, in the `"auto"` mode, with the library built)."""
    kernel = nj.kernels.registry()[name]
    example = next(iter(kernel.examples()))
    return "cpu" in nj.kernels.implementations(kernel, *example.args, **example.static)


def hlo_census(compiled_text: str) -> dict:
    """What in a compiled program would make a GPU wait on the host: the number of
    `conditional` instructions and of `while` loops, and the whiles whose trip count XLA
    does not know (no `known_trip_count` in their backend config)."""
    import re

    conditionals = len(re.findall(r"\sconditional\(", compiled_text))
    whiles = [line for line in compiled_text.splitlines() if re.search(r"\swhile\(", line)]
    unknown = [w for w in whiles if "known_trip_count" not in w]
    return {"conditional": conditionals, "while": len(whiles), "unknown_trip_count": len(unknown)}
