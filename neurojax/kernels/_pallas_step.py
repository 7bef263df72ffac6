r"""Element-wise updates over several neuron index spaces as one Pallas Triton kernel: the
building block of the network's per-step GPU path (`neurojax.network._phases`), where the
arrivals of every projection (its synaptic kinetics) and the update of every population of a
group each become one kernel per step instead of one XLA kernel per state array.

A *segment* is one index space (a projection's postsynaptic neurons, a population's neurons)
with a body, `body(t, i, ic, ok, ins, outs)`, that loads what it needs at trial `t` and lanes
`i` (`ic`: `i` clipped into the segment, `ok`: the lanes inside it), computes, and stores with
`store`. The grid is `(trial, programs)`: the segments' blocks of `block` neurons laid end to
end, program `g` running the body of the segment that holds block `g` (`lax.cond` on static
block ranges, so a program computes one segment only).

Operands are described by `Leaf`s (`Operands.leaf`): a value the kernel reads for every lane
of a segment is a compile-time constant when it is concrete and uniform (a parameter given as
one number, or an array of one value: it is not broadcast to an array, read from memory or
passed at all), a scalar input, a per-neuron vector shared by the trials, or one vector per
trial. A leaf that is none of these (a parameter that differs per trial inside a batched state,
say) makes `Operands.leaf` answer None, and the caller keeps its XLA path.

**Barriers.** None: every output element is written by exactly one program and no program
reads what another writes (an aliased buffer, the ring read by the arrivals, is read and
written at the same elements by the same program). The kernel starts after XLA has produced
its inputs.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _pallas

__all__ = ["Leaf", "Operands", "segments_call", "store", "with_reference_jvp"]


class Leaf(NamedTuple):
    """How a kernel body reads one value (see the module docstring).

    Attributes:
        kind: `"const"` (a Python scalar baked into the kernel), `"scalar"` (input of shape
            `(1,)`), `"shared"` (a vector of `n` read at `offset + i`), `"trial"` (`T` vectors
            of `n`, flattened, read at `t * n + offset + i`), `"trial_scalar"` (one value per
            trial, read at `t`).
        pos: the operand's position among the kernel's inputs (-1 for a constant).
        n: the length of the vector (of each trial's vector).
        offset: where the segment starts in that vector.
        value: the constant (kind `"const"`).
        dtype: the value's dtype.
    """

    kind: str
    pos: int
    n: int
    offset: int
    value: Any
    dtype: Any

    def whole(self, arrays: Sequence[jax.Array], shape: tuple[int, ...]) -> jax.Array:
        """The whole value the leaf was made from (`shape`), out of the kernel's inputs
        `arrays`: what a reference of the kernel computes on."""
        if self.kind == "const":
            return jnp.broadcast_to(jnp.asarray(self.value, self.dtype), shape)
        return jnp.reshape(arrays[self.pos], shape)

    def load(self, ins: Sequence[Any], t: jax.Array, ic: jax.Array) -> jax.Array:
        """The value at trial `t`, lanes `ic` (a scalar for the scalar kinds)."""
        if self.kind == "const":
            return jnp.asarray(self.value, self.dtype)
        ref = ins[self.pos]
        if self.kind == "scalar":
            return ref[0]
        if self.kind == "trial_scalar":
            return ref[t]
        if self.kind == "shared":
            return ref[self.offset + ic]
        return ref[t * self.n + self.offset + ic]


class Operands:
    """The inputs of one kernel, gathered while its segments are described."""

    def __init__(self) -> None:
        self.arrays: list[jax.Array] = []

    def add(self, x: jax.Array) -> int:
        """Append the flat `x`; its position among the inputs."""
        self.arrays.append(jnp.reshape(x, (-1,)))
        return len(self.arrays) - 1

    def leaf(self, x: Any, n: int, lead: tuple[int, ...], offset: int = 0) -> Leaf | None:
        """How a body reads `x` for lanes of a vector of `n` (from `offset`), trials `lead`:
        `x` is a scalar, a vector of `n` or one per trial (`lead + (n,)`), broadcast as
        NumPy would against `lead + (n,)`. None for any other shape."""
        if not isinstance(x, (jax.Array, np.ndarray)):
            return None
        shape, dtype = tuple(x.shape), x.dtype
        if shape not in ((), (n,), lead + (n,)):
            return None
        value = _pallas.uniform_value(x)
        if value is not None:
            return Leaf("const", -1, n, offset, value, dtype)
        if shape == ():
            return Leaf("scalar", self.add(x), 1, 0, None, dtype)
        if shape == (n,):
            return Leaf("shared", self.add(x), n, offset, None, dtype)
        return Leaf("trial", self.add(x), n, offset, None, dtype)

    def step(self, step: jax.Array, lead: tuple[int, ...]) -> Leaf | None:
        """How a body reads the step counter: one for all trials, or one per trial (`lead`,
        a vmapped or batched counter). None for any other shape."""
        shape = tuple(jnp.shape(step))
        if shape == ():
            return Leaf("scalar", self.add(jnp.asarray(step, jnp.int32)), 1, 0, None, jnp.int32)
        if lead and shape == lead:
            pos = self.add(jnp.asarray(step, jnp.int32))
            return Leaf("trial_scalar", pos, 1, 0, None, jnp.int32)
        return None


def with_reference_jvp(
    fused: Callable[[Sequence[jax.Array]], tuple[jax.Array, ...]],
    reference: Callable[[Sequence[jax.Array]], tuple[jax.Array, ...]],
    arrays: Sequence[jax.Array],
) -> tuple[jax.Array, ...]:
    """`fused(arrays)` (a Pallas kernel) with the derivative of `reference(arrays)`, the same
    computation in XLA: gradients never go through the kernel (Pallas has no derivative of a
    kernel that updates a buffer in place), as for the registry's entries."""

    @jax.custom_jvp
    def call(*xs):
        return tuple(fused(xs))

    @call.defjvp
    def _jvp(primals, tangents):
        _, tangent = jax.jvp(lambda *xs: tuple(reference(xs)), primals, tangents)
        return call(*primals), tangent

    return call(*arrays)


def store(ref, idx: jax.Array, val: jax.Array, ok: jax.Array) -> None:
    """`ref[idx] = val` where `ok`, `val` broadcast to the lanes and cast to `ref`'s dtype."""
    val = jnp.broadcast_to(jnp.asarray(val).astype(ref.dtype), idx.shape)
    _pallas.masked_store(ref, idx, val, ok, _pallas.pallas_interpret())


def segments_call(
    segments: Sequence[tuple[int, Callable[..., None]]],
    arrays: Sequence[jax.Array],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    *,
    n_trials: int,
    aliases: dict[int, int] | None = None,
    block: int = 256,
    num_warps: int = 4,
    name: str = "nj_segments",
) -> tuple[jax.Array, ...]:
    """One Pallas Triton call running every segment `(size, body)` over `n_trials` trials
    (module docstring); `arrays` are the flat inputs, `out_shapes` the flat outputs,
    `aliases` maps inputs to the outputs they are updated in place as. Returns the outputs.

    `block` (a power of two is used, at most the largest segment's size) is the neurons per
    program; `num_warps` Triton's warps per program."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    if not segments:
        raise ValueError("segments_call: segments must not be empty")
    for size, _ in segments:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"segments_call: every segment size must be an int >= 1, got {size!r}")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"segments_call: n_trials must be an int >= 1, got {n_trials!r}")
    bs = _pallas.next_pow2(min(block, max(size for size, _ in segments)))
    bounds = [0]
    for size, _ in segments:
        bounds.append(bounds[-1] + -(-size // bs))
    n_in = len(arrays)

    def kernel(*refs):
        ins, outs = refs[:n_in], refs[n_in:]
        t = pl.program_id(0).astype(jnp.int32)
        g = pl.program_id(1).astype(jnp.int32)
        lane = jnp.arange(bs, dtype=jnp.int32)
        for (size, body), lo, hi in zip(segments, bounds, bounds[1:], strict=False):

            def run(size=size, body=body, lo=lo):
                i = (g - lo) * bs + lane
                body(t, i, jnp.minimum(i, size - 1), i < size, ins, outs)

            if len(segments) == 1:
                run()
            else:
                lax.cond((g >= lo) & (g < hi), run, lambda: None)

    return tuple(
        pl.pallas_call(
            kernel,
            out_shape=tuple(out_shapes),
            grid=(n_trials, bounds[-1]),
            input_output_aliases=dict(aliases or {}),
            compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
            interpret=_pallas.pallas_interpret(),
            name=name,
        )(*arrays)
    )
