"""Every registered operation lowers for CUDA and for TPU on this machine, with no device.

`jax.jit(f).trace(*args).lower(lowering_platforms=...)` runs each platform's lowering rules:
for an entry with a GPU slot that means the whole Pallas Triton lowering of its kernels (the
Triton IR is built here; only its compilation to machine code needs the GPU), for the other
entries the lowering of their reference. The lowered module is checked for what the slot
should produce: a Triton kernel call for a GPU slot, none where the reference runs. The
entries' examples give the inputs, unbatched and under `vmap` (the batching rules)."""

import re

import jax
import jax.numpy as jnp
import pytest

import neurojax as nj

# Kernel calls trace every platform's implementation (tests/conftest.py).
pytestmark = pytest.mark.cross_platform

KERNELS = nj.kernels.registry()
TRITON = "__gpu$xla.gpu.triton"
CASES = [
    pytest.param(kernel, example, platform, id=f"{name}-{example.label or i}-{platform}")
    for name, kernel in sorted(KERNELS.items())
    for i, example in enumerate(kernel.examples() if kernel.examples else ())
    for platform in ("cuda", "tpu")
]


def _targets(text: str) -> set[str]:
    return set(re.findall(r'custom_call @?"?([\w$.]+)', text))


def _expects_triton(kernel, example, platform):
    impls = nj.kernels.implementations(kernel, *example.args, **example.static)
    return platform == "cuda" and "cuda" in impls


def _lower(fn, args, platform):
    assert nj.kernels.interpret_mode() == "off"  # interpret mode would lower the CPU loop
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("kernel,example,platform", CASES)
def test_every_kernel_lowers(kernel, example, platform):
    text = _lower(lambda *a: nj.kernels.call(kernel, *a, **example.static), example.args, platform)
    targets = _targets(text)
    assert (TRITON in targets) == _expects_triton(kernel, example, platform), targets
    assert not any(t.startswith("nj_") for t in targets)  # no CPU FFI kernel on an accelerator


@pytest.mark.parametrize("kernel,example,platform", CASES)
def test_every_kernel_lowers_under_vmap(kernel, example, platform):
    argnums = example.vmap_argnums or tuple(
        i for i, a in enumerate(example.args) if isinstance(a, jax.Array) and a.ndim
    )
    axes = [0 if i in argnums else None for i in range(len(example.args))]
    args = [jnp.stack([a, a]) if i in argnums else a for i, a in enumerate(example.args)]
    fn = jax.vmap(lambda *a: nj.kernels.call(kernel, *a, **example.static), in_axes=axes)
    targets = _targets(_lower(fn, args, platform))
    assert (TRITON in targets) == _expects_triton(kernel, example, platform), targets


@pytest.mark.parametrize(
    "kernel,example,platform",
    [c for c in CASES if c.values[1].grad_argnums and c.values[2] == "cuda"],
)
def test_gradients_lower_for_cuda(kernel, example, platform):
    """The derivative goes through the reference, so it lowers wherever the reference does."""

    def loss(*args):
        out = nj.kernels.call(kernel, *args, **example.static)
        leaves = [x for x in jax.tree.leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)]
        return sum(jnp.sum(x) for x in leaves)

    _lower(jax.grad(loss, example.grad_argnums), example.args, platform)


def test_lowering_fails_loudly_for_an_unsupported_kernel():
    """The check above can fail: a Triton kernel that Pallas cannot lower raises here."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def kernel_body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2  # a 3-element block: Triton needs powers of two

    def gpu(x):
        return pl.pallas_call(
            kernel_body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=plgpu.CompilerParams(num_warps=1),
        )(x)

    toy = nj.kernels.Kernel("toy_lowering", lambda x: x * 2, gpu=gpu)
    with pytest.raises(Exception, match="power of 2|powers of 2|power-of-2"):
        _lower(lambda x: nj.kernels.call(toy, x), (jnp.arange(3.0),), "cuda")
