#!/usr/bin/env bash
# Create .venv with perfbudget and the right torch build for this machine.
#   With an NVIDIA GPU: torch from PyPI (CUDA build, which pins its own triton).
#   Without one: torch's CPU build (never the multi-GB CUDA build) and the matching triton.
# Usage: scripts/setup.sh            (idempotent; PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${PERFBUDGET_TORCH:-2.13.0}
TRITON_FOR_CPU=${PERFBUDGET_TRITON:-3.7.1}   # the triton PyPI's CUDA torch 2.13.0 pins
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
    pip install "triton==$TRITON_FOR_CPU"
fi
pip install -e ".[dev]"
.venv/bin/python - <<'PY'
import torch, triton
cuda = torch.version.cuda
print(f"setup: torch {torch.__version__} (CUDA {cuda or 'none'}), triton {triton.__version__}, "
      f"GPU available: {torch.cuda.is_available()}")
PY
