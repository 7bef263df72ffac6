"""Which platforms' kernel implementations a call traces: by default only the default
backend's (on this CPU machine: the C++ kernel's call and the reference), under
`nj.kernels.cross_platform()` every platform's, so that a program lowered for CUDA still gets
its Triton kernels."""

import re

import jax
import pytest

import neurojax as nj

DELIVER = nj.kernels.registry()["csr_deliver"]
EXAMPLE = next(iter(DELIVER.examples()))


def _call(*args):
    return nj.kernels.call(DELIVER, *args, **EXAMPLE.static)


def _jaxpr_text() -> str:
    return str(jax.make_jaxpr(_call)(*EXAMPLE.args))


def test_default_traces_no_accelerator_kernel_on_cpu():
    assert jax.default_backend() == "cpu"
    with nj.kernels.cross_platform(False):
        assert set(nj.kernels.implementations(DELIVER, *EXAMPLE.args, **EXAMPLE.static)) <= {"cpu"}
        assert "pallas_call" not in _jaxpr_text()


def test_cross_platform_traces_the_gpu_and_tpu_kernels():
    with nj.kernels.cross_platform():
        impls = nj.kernels.implementations(DELIVER, *EXAMPLE.args, **EXAMPLE.static)
        assert {"cuda", "tpu"} <= set(impls)
        assert "pallas_call" in _jaxpr_text()


def test_lowering_for_cuda_without_cross_platform_runs_the_reference():
    with nj.kernels.cross_platform(False):
        text = jax.jit(_call).trace(*EXAMPLE.args).lower(lowering_platforms=("cuda",)).as_text()
    targets = set(re.findall(r'custom_call @?"?([\w$.]+)', text))
    assert not any("triton" in t or t.startswith("nj_") for t in targets), targets
    with nj.kernels.cross_platform():
        text = jax.jit(_call).trace(*EXAMPLE.args).lower(lowering_platforms=("cuda",)).as_text()
    assert any("triton" in t for t in re.findall(r'custom_call @?"?([\w$.]+)', text))


def test_the_setting_is_part_of_the_jit_cache_key():
    f = jax.jit(_call)
    with nj.kernels.cross_platform(False):
        plain = f.trace(*EXAMPLE.args).jaxpr
    with nj.kernels.cross_platform():
        crossed = f.trace(*EXAMPLE.args).jaxpr
    assert "pallas_call" not in str(plain) and "pallas_call" in str(crossed)


def test_bad_flag_is_refused():
    with pytest.raises(TypeError, match="enabled must be True or False, got 'yes'"):
        with nj.kernels.cross_platform("yes"):
            pass
