#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels that `make bench-gpu` installs on the GPU
# machine (Python 3.12, manylinux x86-64, no network there). They land in .whl/ (git-ignored):
#
#   .whl/       the GPU peers: BrainPy (brainpy.state) with brainevent, brainstate, brainunit,
#               braintools, and snnTorch, plus the pure-Python packages they need that the
#               GPU image lacks. The image already has jax, torch, cupy, triton, numba, numpy,
#               scipy, matplotlib, pandas, msgpack, typing-extensions: those are not fetched.
#   .whl/core/  neurojax's own dependencies at the versions of the development environment
#               (equinox, jaxtyping, wadler-lindig, optax, chex, tqdm). The GPU image has
#               them already; `make bench-gpu` installs these only when an import fails.
#
# Every wheel is fetched with --no-deps, so the lists below are the whole closure; a new
# version of a peer that needs another package shows up as an ImportError in the peer's
# `error` line of the GPU run. Usage: bash benchmarks/gpu_wheels.sh [DEST]  (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYTHON=${PYTHON:-python3}
mkdir -p "$DEST/core"

PEERS=(
  brainpy==2.9.0
  brainevent==0.3.0
  brainstate==0.6.0
  brainunit==0.6.0
  saiunit==0.6.0
  braintools==0.4.0
  snntorch==1.0.0
)
CORE=(
  equinox==0.13.8
  jaxtyping==0.3.11
  wadler-lindig==0.1.8
  optax==0.2.8
  chex==0.1.92
  tqdm==4.70.1
)

download() {  # download DIR SPEC...
  local dir=$1
  shift
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$dir" "$@"
}

download "$DEST" "${PEERS[@]}"
download "$DEST/core" "${CORE[@]}"
ls -l "$DEST" "$DEST/core" | grep '\.whl$' || true
du -ch "$DEST"/*.whl "$DEST"/core/*.whl | tail -1
