"""The one compiled CPU library of neurojax's kernels: every `*.cc` file of this folder (with
the headers they include, `*.h`), built on first use into one shared library.

XLA:CPU pays a few microseconds per operation per step; the kernels do a step's work (event
delivery, plasticity, assembly synapses, whole runs of uncoupled populations, spike-input
products) in one call each through XLA's FFI. The library is compiled once per machine and
JAX version with the system C++ compiler (`$CXX`, else `c++`/`g++`/`clang++`) against the FFI
headers that ship with jaxlib, for this CPU's instruction set (`-march=native`; set
`NEUROJAX_MARCH` to another target, or to an empty string for the compiler's default),
without fused multiply-add contraction, and cached in `$NEUROJAX_CACHE_DIR` (default
`~/.cache/neurojax`) under a name that hashes the sources, the JAX version, the flags and the
CPU's feature flags, so a cache shared between machines never hands one CPU code built for
another. The cache folder and the library must belong to this user and be writable by no one
else (no group or other write permission): a folder or file that another user could write is
refused with a warning, and the kernels then run their pure-JAX references.

It is built only when a registered kernel is about to run its CPU implementation (see
`neurojax.kernels.call`): a process that only runs on a GPU or TPU, or in
`nj.kernels.use("reference")` mode, never compiles it. A build says so on stderr: one line
when it starts, with an estimate (the last build's time on this machine, else a typical
range), and one when it ends, with its time; `build_seconds()` is the time this process
spent building, which `neurojax run` reports apart from XLA's compile time.
`python -m neurojax.kernels` builds it ahead of time (what `make demo` does).

It is built on first use rather than when the package is installed: the library is compiled
for the CPU and the jaxlib it runs with (`-march=native`, jaxlib's FFI headers), neither of
which a package build knows (pip builds a wheel in an isolated environment, before the
dependencies are installed, and a wheel may be installed on another machine).

Each kernel entry registers its own FFI targets with XLA the first time it is dispatched.
When no compiler is found or the build fails, neurojax warns once and every kernel runs its
pure-JAX reference, which gives the same results (within each entry's stated tolerance).
"""

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import jax

from .. import _threads
from .._system import cache_dir as _cache_dir
from .._system import check_private_path

__all__ = ["library", "register_targets", "build_seconds"]

_HERE = Path(__file__).parent
_LOCK = threading.Lock()
_REGISTERED: set[str] = set()  # FFI targets registered with XLA in this process
_BUILD_SECONDS = [0.0]  # time this process spent compiling the library
# The last successful build's duration on this machine, beside the libraries: the estimate
# the next build announces.
_LAST_BUILD = "last-build-seconds"
_clock = time.perf_counter  # the build's timer (a test replaces it)


def build_seconds() -> float:
    """Seconds this process has spent compiling the kernel library (0.0 when it was loaded
    from the cache or never needed). Timed apart so that a first run does not report the
    one-time C++ build as XLA compilation."""
    return _BUILD_SECONDS[0]


def _estimate(folder: Path) -> str:
    try:
        last = float((folder / _LAST_BUILD).read_text())
    except (OSError, ValueError):
        return "usually 20-90 s"
    return f"about {last:.0f} s, as the last build here"


def _say(text: str) -> None:
    print(f"neurojax: {text}", file=sys.stderr, flush=True)


def _sources() -> tuple[Path, ...]:
    return tuple(sorted(_HERE.glob("*.cc")))


def _headers() -> tuple[Path, ...]:
    # Included by relative path: part of the library's tag, not compiled on their own.
    return tuple(sorted(_HERE.glob("*.h")))


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


def library_path() -> Path:
    """Where the library of these sources, this JAX, these flags and this CPU is cached."""
    include = jax.ffi.include_dir()
    source = b"".join(path.read_bytes() for path in _sources() + _headers())
    march = os.environ.get("NEUROJAX_MARCH", "native")
    tag = hashlib.sha256(
        source + jax.__version__.encode() + include.encode() + march.encode() + _cpu_flags()
    ).hexdigest()[:16]
    return _cache_dir() / f"libneurojax_{tag}.so"


def _build() -> Path:
    out = library_path()
    folder = out.parent
    if not folder.exists():
        # Private from the start (group/other bits off whatever the umask), as checked below.
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    # The library is loaded into this process and run: a folder or file that another user
    # can write is refused (see docs/concepts/reliability.md).
    check_private_path("neurojax kernels", folder, "kernel cache folder")
    if out.exists():
        check_private_path("neurojax kernels", out, "compiled kernel library")
        return out
    _say(
        f"building the C++ CPU kernels ({len(_sources())} sources, once per machine and JAX "
        f"version; {_estimate(folder)}) into {folder} ..."
    )
    t0 = _clock()
    try:
        compile_library(out)
    except BaseException:
        seconds = _clock() - t0
        _BUILD_SECONDS[0] += seconds
        _say(f"the C++ kernel build failed after {seconds:.1f} s")
        raise
    seconds = _clock() - t0
    _BUILD_SECONDS[0] += seconds
    with contextlib.suppress(OSError):
        (folder / _LAST_BUILD).write_text(f"{seconds:.1f}\n")
    _say(f"C++ kernels built in {seconds:.1f} s (later runs load them from the cache)")
    return out


def compile_library(out: Path, extra_flags: tuple[str, ...] = ()) -> None:
    """Compile every kernel source into the shared library `out` (atomically: written under
    a temporary name beside it, then renamed). `extra_flags` are appended to the compiler's
    command line (the tests build an AddressSanitizer copy with them)."""
    include = jax.ffi.include_dir()
    sources = _sources()
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    march = os.environ.get("NEUROJAX_MARCH", "native")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)

    def command(march_flags: list[str]) -> list[str]:
        return [
            cxx,
            "-O3",
            *march_flags,
            *extra_flags,
            # No implicit fused multiply-add contraction: each kernel writes std::fma where
            # the XLA program it must match has one (XLA:CPU contracts a multiply feeding an
            # add on CPUs with FMA, as in the LIF run) and separate operations elsewhere.
            "-ffp-contract=off",
            # Lets the compiler evaluate both sides of a select and so vectorise branch-free
            # loops (the LIF run); no floating-point exception is trapped, no value changes.
            "-fno-trapping-math",
            # The kernels' own thread pool (pool.cc) uses std::thread.
            "-pthread",
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",
            f"-I{include}",
            *map(str, sources),
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


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled library, built (once per process) and loaded; None, with one warning,
    when it cannot be built or loaded."""
    try:
        lib = ctypes.cdll.LoadLibrary(str(_build()))
    except Exception as err:  # any build or load failure falls back to the references
        warnings.warn(
            "neurojax: the compiled CPU kernels (event-driven delivery, plasticity, assembly "
            "synapses, LIF and Hodgkin-Huxley population runs, spike-input products) are "
            f"unavailable ({type(err).__name__}: {err}); every kernel takes the pure-JAX path "
            "(its reference), which gives the same results more slowly. Set NEUROJAX_CPU_KERNEL=0 "
            "(or nj.kernels.set_mode('reference')) to silence this.",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    # The kernels' thread pool follows neurojax's thread setting (nj.use_cpu_threads).
    lib.NjSetThreads.argtypes = [ctypes.c_int]
    lib.NjSetThreads.restype = None
    _threads._on_change(lib.NjSetThreads)
    return lib


def register_targets(targets: tuple[tuple[str, str], ...]) -> bool:
    """Register the FFI `(target, symbol)` pairs of one kernel with XLA (once each), building
    the library first if needed; False when the library is unavailable."""
    if all(t in _REGISTERED for t, _ in targets):
        return True
    lib = library()
    if lib is None:
        return False
    with _LOCK:
        for target, symbol in targets:
            if target not in _REGISTERED:
                jax.ffi.register_ffi_target(
                    target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
                )
                _REGISTERED.add(target)
    return True


def main() -> int:
    """`python -m neurojax.kernels`: build the library now (or find it built) and say where
    it is; exit status 1 when it cannot be built. Where JAX's default backend is not the CPU,
    nothing is built (a CPU run builds it when it needs it)."""
    backend = jax.default_backend()
    if backend != "cpu":
        _say(f"JAX's default backend is {backend}: the C++ CPU kernels are built on first CPU use")
        return 0
    before = build_seconds()
    if library() is None:
        return 1
    if build_seconds() == before:
        _say(f"the C++ CPU kernels are already built: {library_path()}")
    return 0
