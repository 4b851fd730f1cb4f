#!/usr/bin/env bash
# `make gpu-check`: prove the GPU path on a machine with one CUDA GPU, within 9 minutes.
#   scripts/gpu_check.sh [--out REPORT.md] [--no-write] [--sizes 1024,8192,32768,131072]
# The GPU suite (pytest -m gpu), then the benchmark rows of the Llama-3.2-3B-shaped random bf16 model
# (attnviz/bench/gpu.py), then the hybrid rows (Qwen3.5- and Bamba-shaped bf16: which fla / mamba_ssm /
# causal_conv1d kernel ran behind each mixer, and its self-check; attnviz/bench/gpu_hybrid.py), into
# one Markdown report (test-output/gpu-check.md, and the gpu-check section of docs/benchmarks.md).
# Exits non-zero on any failure. Installs what it needs from the project's own files
# (scripts/install.sh --dev --cuda: the CUDA build of torch) when the venv cannot see the GPU.
# Without a GPU it exits at once (status 0) with one line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
smi="${NVIDIA_SMI:-nvidia-smi}"
if ! "$smi" -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu-check: no CUDA GPU on this machine ($smi lists none); nothing was run"
  exit 0
fi
venv="${VENV:-.venv}"
py="$venv/bin/python"
if ! { [ -x "$py" ] && "$py" -c 'import sys, torch, pytest; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }; then
  echo "gpu-check: installing the CUDA build of torch and the dev tools into $venv (scripts/install.sh --dev --cuda)"
  VENV="$venv" bash scripts/install.sh --dev --cuda
fi
exec timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-540}" "$py" scripts/gpu_check.py "$@"
