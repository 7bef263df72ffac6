"""The proxy count of the kernels one network step launches on a GPU, without a GPU (issue #37).

The step is traced with the GPU slots (`nj.kernels.interpret("gpu")`), every Pallas call
replaced by an opaque host callback (one custom call, standing for one Triton kernel), compiled
by the CPU compiler, and the instructions of the compiled step that launch work are counted:
fusions, custom calls and unfused operations. Free: constants, parameters, bitcasts, tuples and
their elements, and a copy of an argument returned unchanged (a value the step passes through:
inside `lax.scan` it is the loop carry, updated in place, and jit copies it only because its
arguments are not donated). XLA:GPU fuses at least as much as XLA:CPU (its multi-output fusion
joins sibling loops that XLA:CPU keeps apart), so the count is an upper bound of its kernels per
step.

Used by `tests/test_gpu_step.py` and by `benchmarks/gpu.py --dry-run`.
"""

import collections
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import neurojax as nj

__all__ = ["kernels_per_step", "FREE"]

FREE = {"constant", "parameter", "bitcast", "get-tuple-element", "tuple", "after-all"}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.-]+) = (?:\([^=]*?\)|\S+) ([\w-]+)\(([^)]*)\)")


def _stub_pallas_call(kernel, out_shape, **_):
    """A Pallas call as one opaque custom call with the same results (zeros)."""

    def call(*args):
        single = isinstance(out_shape, jax.ShapeDtypeStruct)
        flat = (out_shape,) if single else tuple(out_shape)
        out = jax.pure_callback(
            lambda *_: tuple(np.zeros(o.shape, o.dtype) for o in flat),
            flat,
            *args,
            vmap_method="broadcast_all",  # compiled, never run: the shapes do not matter
        )
        return out[0] if single else out

    return call


def kernels_per_step(fn: Callable[..., Any], *args) -> tuple[int, int, collections.Counter]:
    """`(kernels, stubbed Triton calls, instruction counts)` of `fn(*args)` (one step),
    traced with the GPU slots and compiled by the CPU compiler (module docstring)."""
    from jax.experimental import pallas as pl

    original = pl.pallas_call
    pl.pallas_call = _stub_pallas_call
    try:
        with nj.kernels.interpret("gpu"):
            text = jax.jit(fn).lower(*args).compile().as_text()
    finally:
        pl.pallas_call = original
    entry = text[text.index("ENTRY") :]
    entry = entry[: entry.index("\n}\n")]
    ops = collections.Counter()
    params, stubs = set(), 0
    for line in entry.splitlines()[1:]:
        # A tuple-shaped result names its elements' positions in comments (`/*index=5*/`).
        m = _INSTRUCTION.search(re.sub(r"/\*.*?\*/", "", line))
        if not m:
            continue
        name, op, operands = m.groups()
        if op == "parameter":
            params.add(name)
        if op == "copy" and operands.strip().lstrip("%") in params:
            op = "copy-of-argument"
        ops[op] += 1
        stubs += op == "custom-call" and "callback" in line
    launched = sum(c for op, c in ops.items() if op not in FREE | {"copy-of-argument"})
    return launched, stubs, ops
