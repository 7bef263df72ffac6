"""The compiled CPU kernels of event-driven delivery and STDP (`_csr_kernel.cc`), of the
assembly calculus's dense synapse operations (`neurojax/assembly/_dense_kernel.cc`), of
whole runs of uncoupled LIF and Hodgkin-Huxley populations (`neurojax/neurons/_lif_kernel.cc`,
`_hh_kernel.cc`) and of the spike-input products of training layers
(`neurojax/training/_spike_kernel.cc`), built on first use into one library.

XLA:CPU pays a few microseconds per operation per step, and the pure-JAX event path needs
about a dozen operations (compaction, window gathers, scatter) per sending group. The kernel
does the same work in one call through XLA's FFI: one pass over the spike vector, then work
proportional to spikes x fan-out; a second kernel updates plastic weights in place. They are
compiled once per machine and JAX version with the
system C++ compiler (`$CXX`, else `c++`/`g++`) against the FFI headers that ship with jaxlib,
for this CPU's instruction set (`-march=native`; set `NEUROJAX_MARCH` to another target, or
to an empty string for the compiler's default), without fused multiply-add contraction, and
cached in `$NEUROJAX_CACHE_DIR` (default `~/.cache/neurojax`) under a name that also hashes
the CPU's feature flags, so a cache shared between machines never hands one CPU code built
for another.

When no compiler is found or the build fails, neurojax warns once and uses the pure-JAX path,
which gives the same results (for the assembly's input sum, up to the last bit of a float sum
with non-integer weights: the kernel adds rows in list order, XLA in its own; for
Hodgkin-Huxley runs, up to rounding, see `neurojax.neurons._hh_fused`). Set
`NEUROJAX_CPU_KERNEL=0` to always use the pure-JAX path. Other platforms (GPU, TPU) always
use the pure-JAX path.
"""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax

__all__ = [
    "TARGET",
    "STDP_TARGET",
    "ASM_ROWSUM_TARGET",
    "ASM_UPDATE_TARGET",
    "ASM_UPDATE_SUM_TARGET",
    "ASM_CHOOSE_TARGET",
    "ASM_TOPK_TARGET",
    "ASM_BITS_TARGET",
    "ASM_CAP_TARGET",
    "LIF_RUN_TARGET",
    "HH_RUN_TARGET",
    "SPIKE_MATMUL_TARGET",
    "SPIKE_MATMUL_T_TARGET",
    "available",
    "enabled",
]

TARGET = "nj_csr_deliver"
STDP_TARGET = "nj_stdp_update"
ASM_ROWSUM_TARGET = "nj_asm_rowsum"
ASM_UPDATE_TARGET = "nj_asm_update"
ASM_UPDATE_SUM_TARGET = "nj_asm_update_sum"
ASM_CHOOSE_TARGET = "nj_asm_choose"
ASM_TOPK_TARGET = "nj_asm_topk"
ASM_BITS_TARGET = "nj_asm_bits"
ASM_CAP_TARGET = "nj_asm_cap"
LIF_RUN_TARGET = "nj_lif_run"
HH_RUN_TARGET = "nj_hh_run"
SPIKE_MATMUL_TARGET = "nj_spike_matmul"
SPIKE_MATMUL_T_TARGET = "nj_spike_matmul_t"
_SOURCES = (
    Path(__file__).with_name("_csr_kernel.cc"),
    Path(__file__).parent.parent / "assembly" / "_dense_kernel.cc",
    Path(__file__).parent.parent / "neurons" / "_lif_kernel.cc",
    Path(__file__).parent.parent / "neurons" / "_hh_kernel.cc",
    Path(__file__).parent.parent / "training" / "_spike_kernel.cc",
)
# Headers the sources include (by relative path): part of the library's tag, not compiled.
_HEADERS = (Path(__file__).parent.parent / "neurons" / "_run_kernel.h",)
# (FFI target, symbol exported by the library)
_HANDLERS = (
    (TARGET, "NjCsrDeliver"),
    (STDP_TARGET, "NjStdpUpdate"),
    (ASM_ROWSUM_TARGET, "NjAsmRowSum"),
    (ASM_UPDATE_TARGET, "NjAsmUpdate"),
    (ASM_UPDATE_SUM_TARGET, "NjAsmUpdateSum"),
    (ASM_CHOOSE_TARGET, "NjAsmChoose"),
    (ASM_TOPK_TARGET, "NjAsmTopK"),
    (ASM_BITS_TARGET, "NjAsmBits"),
    (ASM_CAP_TARGET, "NjAsmCap"),
    (LIF_RUN_TARGET, "NjLifRun"),
    (HH_RUN_TARGET, "NjHhRun"),
    (SPIKE_MATMUL_TARGET, "NjSpikeMatmul"),
    (SPIKE_MATMUL_T_TARGET, "NjSpikeMatmulT"),
)
_REGISTERED: list[Path] = []  # the library registered with XLA in this process, if any


def enabled() -> bool:
    """False when `NEUROJAX_CPU_KERNEL=0` asks for the pure-JAX path."""
    return os.environ.get("NEUROJAX_CPU_KERNEL", "1").strip() not in ("0", "false", "no")


def _cache_dir() -> Path:
    base = os.environ.get("NEUROJAX_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "neurojax"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> bytes:
    """The instruction-set flags of this machine's CPU (Linux), part of the library's tag."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in f:
                if line.startswith((b"flags", b"Features")):
                    return line
    except OSError:
        pass
    return b""


def _build() -> Path:
    include = jax.ffi.include_dir()
    source = b"".join(path.read_bytes() for path in _SOURCES + _HEADERS)
    march = os.environ.get("NEUROJAX_MARCH", "native")
    tag = hashlib.sha256(
        source + jax.__version__.encode() + include.encode() + march.encode() + _cpu_flags()
    ).hexdigest()[:16]
    out = _cache_dir() / f"libnj_csr_{tag}.so"
    if out.exists():
        return out
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)

    def command(march_flags: list[str]) -> list[str]:
        return [
            cxx,
            "-O3",
            *march_flags,
            # No implicit fused multiply-add contraction: each kernel writes std::fma where
            # the XLA program it must match has one (XLA:CPU contracts a multiply feeding an
            # add on CPUs with FMA, as in the LIF run) and separate operations elsewhere.
            "-ffp-contract=off",
            # Lets the compiler evaluate both sides of a select and so vectorise branch-free
            # loops (the LIF run); no floating-point exception is trapped, no value changes.
            "-fno-trapping-math",
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",
            f"-I{include}",
            *map(str, _SOURCES),
            "-o",
            tmp,
        ]

    # This CPU's vector instructions (AVX2 on current x86) where the compiler knows them;
    # a compiler that rejects -march gets the portable build.
    attempts = [[f"-march={march}"], []] if march else [[]]
    for flags in attempts:
        cmd = command(flags)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            break
    else:
        os.unlink(tmp)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    os.replace(tmp, out)  # atomic: concurrent builders never see a half-written library
    return out


@functools.cache
def available() -> bool:
    """Build (once) and register the kernel; False, with one warning, if that fails."""
    if not enabled():
        return False
    if _REGISTERED:
        return True
    try:
        path = _build()
        lib = ctypes.cdll.LoadLibrary(str(path))
        for target, symbol in _HANDLERS:
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
            )
        _REGISTERED.append(path)
    except Exception as err:  # any build or load failure falls back to pure JAX
        warnings.warn(
            "neurojax: the compiled CPU kernels (event-driven delivery, STDP, assembly "
            "synapses, LIF and Hodgkin-Huxley population runs, spike-input products) are "
            "unavailable "
            f"({type(err).__name__}: {err}); using the pure-JAX path, which gives the same "
            "results more slowly. Set NEUROJAX_CPU_KERNEL=0 to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True
