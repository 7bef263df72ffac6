"""The kernel layer: the registry walk (every implementation against its reference under jit,
vmap and grad), the dispatch rules (platform switch in jit's cache key, batching folded into
one call, derivatives through the reference) and the build of the CPU library."""

import re
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax.kernels import _build

# Kernel calls trace every platform's implementation (tests/conftest.py).
pytestmark = pytest.mark.cross_platform

KERNELS = nj.kernels.registry()
CASES = [
    pytest.param(kernel, example, id=f"{name}-{example.label or i}")
    for name, kernel in sorted(KERNELS.items())
    for i, example in enumerate(kernel.examples() if kernel.examples else ())
]


def _float_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]


def _assert_close(kernel, got, want):
    if kernel.rtol == 0 and kernel.atol == 0:
        chex.assert_trees_all_equal(got, want)
    else:
        chex.assert_trees_all_close(got, want, rtol=kernel.rtol, atol=kernel.atol)


def _run(kernel, example, args=None):
    return nj.kernels.call(kernel, *(example.args if args is None else args), **example.static)


# FFI handlers that are not registry entries, each with where its reference is checked.
OUTSIDE_THE_REGISTRY = {
    # A whole network run (neurojax.network._cpu_run): its reference and its derivative are
    # the per-step path of the same network (a scan of Network.step), not a function of its
    # flat arguments; tests/test_network_cpu_run.py compares the two bit for bit, with vmap
    # and grad, and tests/test_thread_determinism.py across thread counts.
    "NjNetworkRun": "tests/test_network_cpu_run.py",
}


def test_every_compiled_symbol_is_a_registered_kernel():
    """No FFI handler of the C++ sources lives outside the registry, and every registered
    target names a symbol that exists."""
    defined = set()
    for src in Path(_build.__file__).parent.glob("*.cc"):
        defined |= set(re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)", src.read_text()))
    registered = {sym for k in KERNELS.values() for _, sym in k.ffi_targets}
    assert registered | set(OUTSIDE_THE_REGISTRY) == defined
    for kernel in KERNELS.values():
        assert kernel.examples is not None, f"{kernel.name} has no examples for this test"


@pytest.mark.parametrize("kernel,example", CASES)
def test_implementation_equals_reference_under_jit(kernel, example):
    with nj.kernels.use("reference"):
        want = jax.jit(lambda *a: _run(kernel, example, a))(*example.args)
    if not nj.kernels.implementations(kernel, *example.args, **example.static):
        pytest.skip(f"no implementation of {kernel.name} for this platform and these inputs")
    got = jax.jit(lambda *a: _run(kernel, example, a))(*example.args)
    _assert_close(kernel, got, want)


@pytest.mark.parametrize("mode", ["auto", "reference"])
@pytest.mark.parametrize("kernel,example", CASES)
def test_vmap_equals_stacked_single_calls(kernel, example, mode):
    """Three trials under vmap (folded into one call where the entry folds) equal three calls."""
    argnums = example.vmap_argnums or tuple(
        i for i, a in enumerate(example.args) if isinstance(a, jax.Array) and a.ndim
    )
    trials = []
    for t in range(3):  # distinct trials: the floats scaled
        args = list(example.args)
        for i in argnums:
            if jnp.issubdtype(args[i].dtype, jnp.floating):
                args[i] = args[i] * (1.0 + 0.25 * t)
        trials.append(args)
    with nj.kernels.use(mode):
        singles = [_run(kernel, example, a) for a in trials]
        axes = [0 if i in argnums else None for i in range(len(example.args))]
        stacked = [
            jnp.stack([tr[i] for tr in trials]) if i in argnums else example.args[i]
            for i in range(len(example.args))
        ]
        batched = jax.vmap(lambda *a: _run(kernel, example, a), in_axes=axes)(*stacked)
    want = jax.tree.map(lambda *xs: jnp.stack(xs), *singles)
    _assert_close(kernel, batched, want)


@pytest.mark.parametrize("kernel,example", [c for c in CASES if c.values[1].grad_argnums])
def test_gradient_is_the_reference_gradient(kernel, example):
    """The derivative of the dispatched kernel equals that of its differentiable definition."""
    fn = kernel.differentiable or kernel.reference
    outs = jax.eval_shape(lambda *a: _run(kernel, example, a), *example.args)
    weights = jax.tree.map(
        lambda o: (
            jnp.linspace(0.5, 1.5, int(np.prod(o.shape)), dtype=o.dtype).reshape(o.shape)
            if jnp.issubdtype(o.dtype, jnp.floating)
            else None
        ),
        outs,
    )

    def loss(f):
        def inner(*args):
            out = f(*args, **example.static)
            return sum(jnp.sum(o * w) for o, w in zip(_float_leaves(out), _float_leaves(weights)))

        return inner

    got = jax.grad(loss(lambda *a, **s: nj.kernels.call(kernel, *a, **s)), example.grad_argnums)(
        *example.args
    )
    want = jax.grad(loss(fn), example.grad_argnums)(*example.args)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the dispatch rules


def _toy(**kw):
    """A kernel whose 'CPU implementation' is visibly different from its reference, to see
    which one ran (never registered)."""
    calls = []

    def cpu(x, w, *, offset):
        calls.append(x.shape)
        return jax.lax.stop_gradient(x * w + offset + 1000.0)

    def reference(x, w, *, offset):
        return x * w + offset

    kernel = nj.kernels.Kernel("toy", reference, cpu=cpu, **kw)
    return kernel, calls


def test_mode_is_part_of_the_jit_cache_key():
    kernel, _ = _toy()
    f = jax.jit(lambda x: nj.kernels.call(kernel, x, jnp.float32(2.0), offset=1.0))
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(f(x), x * 2 + 1001)  # the CPU implementation
    with nj.kernels.use("reference"):
        np.testing.assert_array_equal(f(x), x * 2 + 1)  # no cache to clear
    np.testing.assert_array_equal(f(x), x * 2 + 1001)
    nj.kernels.set_mode("reference")
    try:
        assert nj.kernels.mode() == "reference"
        np.testing.assert_array_equal(f(x), x * 2 + 1)
    finally:
        nj.kernels.set_mode("auto")


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match=r"mode must be one of \('auto', 'reference'\), got 'gpu'"):
        nj.kernels.set_mode("gpu")
    with pytest.raises(ValueError, match="got 3"):
        with nj.kernels.use(3):
            pass


def test_environment_form_of_the_switch():
    code = "import neurojax as nj; print(nj.kernels.mode())"
    for value, want in (("0", "reference"), ("false", "reference"), ("1", "auto")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "NEUROJAX_CPU_KERNEL": value},
            check=True,
        )
        assert out.stdout.strip() == want


def _primitives(fn, *args):
    """Names of the loop primitives anywhere in the (nested) program of `fn`."""
    return set(re.findall(r"\b(scan|while)\[", str(jax.make_jaxpr(fn)(*args))))


def test_fold_batching_makes_one_call_for_the_batch():
    kernel, calls = _toy(batching=nj.kernels.Fold(trial=(0,), shared=(1,)))
    x = jnp.arange(12.0).reshape(4, 3)
    f = jax.vmap(lambda xi: nj.kernels.call(kernel, xi, jnp.float32(2.0), offset=0.0))
    np.testing.assert_array_equal(f(x), x * 2 + 1000)
    assert calls[-1] == (4, 3)  # the vmapped axis folded into the trials of one call
    assert not _primitives(f, x) & {"scan", "while"}
    # A vmapped shared argument cannot be folded: one call per element, in a loop.
    w = jnp.arange(4.0)
    g = jax.vmap(lambda xi, wi: nj.kernels.call(kernel, xi, wi, offset=0.0))
    np.testing.assert_array_equal(g(x, w), x * w[:, None] + 1000)
    assert _primitives(g, x, w) & {"scan", "while"}


def test_gradient_goes_through_the_reference():
    kernel, _ = _toy()  # the CPU implementation stops gradients; the reference does not
    g = jax.grad(lambda w: nj.kernels.call(kernel, jnp.arange(3.0), w, offset=0.0).sum())(2.0)
    assert float(g) == 3.0


def test_a_kernel_with_its_own_jvp():
    def jvp(out, primals, tangents, *, offset):
        x, w = primals
        dx, dw = tangents
        return 2.0 * (dx * w + x * dw)  # a deliberately different rule, to see it is used

    kernel, _ = _toy(jvp=jvp)
    g = jax.grad(lambda w: nj.kernels.call(kernel, jnp.arange(3.0), w, offset=0.0).sum())(2.0)
    assert float(g) == 6.0


def test_registration_rejects_duplicates_and_bad_entries():
    kernel, _ = _toy()
    with pytest.raises(TypeError, match="expected a Kernel"):
        nj.kernels.register("toy")
    name = next(iter(KERNELS), None)
    if name is not None:
        with pytest.raises(ValueError, match="already registered"):
            nj.kernels.register(nj.kernels.Kernel(name, lambda x: x))
    with pytest.raises(ValueError, match="rtol must be >= 0"):
        nj.kernels.Kernel("bad", lambda x: x, rtol=-1.0)
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        nj.kernels.Kernel("", lambda x: x)


def test_library_is_not_built_in_reference_mode(tmp_path):
    """A process that never runs a CPU implementation never compiles the library."""
    code = (
        "import jax, neurojax as nj\n"
        "net, st = nj.models.coba(jax.random.key(0), n_exc=80, n_inh=20, p=0.1)\n"
        "nj.simulate(net, st, dt=0.1, n_steps=20)\n"
        "from neurojax.kernels import _build\n"
        "print(_build.library.cache_info().currsize)\n"
    )
    env = {
        **__import__("os").environ,
        "NEUROJAX_CPU_KERNEL": "0",
        "NEUROJAX_CACHE_DIR": str(tmp_path),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
    assert not list(tmp_path.glob("*.so"))


# ------------------------------------------------------------------ the build


def test_kernel_build_retries_without_march_and_tags_the_cpu(monkeypatch, tmp_path):
    """A compiler that rejects -march gets the portable build; the library's name hashes the
    target and the CPU's flags, and every build compiles without FMA contraction."""
    real = _build._compiler()
    if real is None:
        pytest.skip("no C++ compiler here")
    log = tmp_path / "calls.txt"
    wrapper = tmp_path / "cxx"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$*" in *-march=*) echo "unknown option -march" >&2; exit 1;; esac\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("NEUROJAX_MARCH", "native")
    path = _build._build()
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "-march=native" in calls[0] and "-march" not in calls[1]
    assert all("-ffp-contract=off" in c for c in calls)
    assert path.exists() and path.parent == tmp_path / "cache"
    monkeypatch.setenv("NEUROJAX_MARCH", "x86-64")  # another target: another library
    monkeypatch.setattr(_build, "_compiler", lambda: None)  # and it is not built here
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        _build._build()
    monkeypatch.setenv("NEUROJAX_MARCH", "native")
    cpu_flags = _build._cpu_flags
    assert cpu_flags().startswith((b"flags", b"Features")) or cpu_flags() == b""
    monkeypatch.setattr(_build, "_cpu_flags", lambda: b"flags: another cpu")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        _build._build()  # another CPU never reuses this CPU's library
    monkeypatch.setattr(_build, "_cpu_flags", cpu_flags)
    assert _build._build() == path  # cached: no compiler needed


def test_kernel_build_failure_falls_back_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/compiler")
    monkeypatch.setattr(_build.shutil, "which", lambda name: None)
    monkeypatch.setattr(_build, "_REGISTERED", set())  # as in a process that never built it
    _build.library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="pure-JAX path"):
            assert _build.register_targets((("nj_never", "NjNever"),)) is False
        assert _build.register_targets((("nj_never", "NjNever"),)) is False  # no 2nd warning
        kernel, _ = _toy()
        kernel = nj.kernels.Kernel(
            "toy_ffi", kernel.reference, cpu=kernel.cpu, ffi_targets=(("nj_never", "NjNever"),)
        )
        assert nj.kernels.implementations(kernel, jnp.ones(2), 1.0, offset=0.0) == {}
    finally:
        _build.library.cache_clear()
