#!/usr/bin/env bash
# Create .venv with perfbudget and the right torch build for this machine.
#   With an NVIDIA GPU: torch from PyPI (CUDA build, which pins its own triton).
#   Without one: torch's CPU build (never the multi-GB CUDA build) and the matching triton.
# Usage: scripts/setup.sh            (idempotent; PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${PERFBUDGET_TORCH:-2.13.0}
# The oldest triton pyproject.toml allows (the H200 image's the GPU check runs on), so CI tests the low end of
# the range; scripts/test-triton-newest.sh tests the newest.
TRITON_FOR_CPU=${PERFBUDGET_TRITON:-3.6.0}
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found: installing torch==$TORCH_VERSION (CUDA build)"
    pip install "torch==$TORCH_VERSION"
else
    echo "setup: no GPU: installing torch==$TORCH_VERSION+cpu"
    # A local or mirrored +cpu wheel first; otherwise PyTorch's CPU index.
    pip install "torch==$TORCH_VERSION+cpu" 2>/dev/null \
        || pip install --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION+cpu"
    # triton 3.6's interpreter (TRITON_INTERPRET=1, how the CPU tests run the Triton kernels)
    # converts one-element arrays with int(), which numpy 2.4 refuses; triton 3.7 does not.
    numpy_cap=()
    case $TRITON_FOR_CPU in 3.6|3.6.*) numpy_cap=("numpy<2.4") ;; esac
    pip install "triton==$TRITON_FOR_CPU" "${numpy_cap[@]}"
fi
pip install -e ".[dev]"
.venv/bin/python - <<'PY'
import torch, triton
cuda = torch.version.cuda
print(f"setup: torch {torch.__version__} (CUDA {cuda or 'none'}), triton {triton.__version__}, "
      f"GPU available: {torch.cuda.is_available()}")
PY
