#!/usr/bin/env bash
# Creates .venv and installs minisgl-chat into it (editable) with the right PyTorch build:
# the CUDA build (and FlashInfer) where an NVIDIA GPU is visible, the CPU build elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
"${pip[@]}" --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" torch
  extras="cuda,test"
else
  # A plain `pip install torch` would fetch the multi-GB CUDA build; this release has a CPU
  # build (and is the one already on disk on the team's machines).
  "${pip[@]}" "torch==2.13.0"
  extras="test"
fi
"${pip[@]}" -e ".[${extras}]"
echo "minisgl-chat installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
