# attnviz web app (README "Docker"; `make test-docker` builds and runs this image).
#   docker build -t attnviz .                          CPU-only torch (small image)
#   docker build -t attnviz --build-arg TORCH=cuda .   CUDA build of the same torch version
#   docker build -t attnviz --build-arg TORCH=wheel .  the torch wheel placed in wheels/ (no torch index)
#   docker build -t attnviz --build-arg BASE_IMAGE=attnviz-base .   another Python 3.11 base
#   docker run -p 8501:8501 -v attnviz-data:/data [-e ATTNVIZ_DEMO=1] [-e HF_TOKEN] attnviz
# Hub downloads (HF_HOME) live on the /data volume; the built-in models are baked into the image.
# Three stages, so that a code change rebuilds in seconds: `deps` (the pinned dependencies, from
# requirements.txt and scripts/install.sh only), `models` (the built-ins converted once, from the
# engine's code only), and the app itself.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS deps
ARG TORCH=cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VENV=/opt/venv
WORKDIR /build
# The same install script `make test` runs (make test -> make dev -> scripts/install.sh), for the
# pinned dependencies only, into the virtual environment the app stage copies. `wheel[s]` copies
# the wheels/ folder's files when there is one and nothing otherwise.
COPY requirements.txt wheel[s] ./
COPY scripts/install.sh scripts/install.sh
RUN case "$TORCH" in \
      cuda) bash scripts/install.sh --cuda --deps-only ;; \
      cpu) TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/install.sh --deps-only ;; \
      wheel) set -- torch-*.whl \
             && if [ ! -f "$1" ]; then echo "TORCH=wheel: put a torch 2.13.0 wheel in wheels/" >&2; exit 2; fi \
             && TORCH_WHEEL="$1" bash scripts/install.sh --deps-only ;; \
      *) echo "TORCH must be cpu, cuda or wheel, got '$TORCH'" >&2; exit 2 ;; \
    esac \
 && /opt/venv/bin/python -m pip install --quiet hatchling==1.33.0 \
 && /opt/venv/bin/python -c "import torch; print('torch', torch.__version__)"

# The built-in models, converted once (SmolLM2's GGUF is de-quantized to safetensors here), so
# the first page load only reads them. Only the engine's code is copied: a change to the app's
# pages or to anything else outside attnviz/ does not convert again.
FROM deps AS models
COPY attnviz /build/attnviz
RUN ATTNVIZ_CACHE=/opt/attnviz/models ATTNVIZ_FETCH_BUILTINS=0 HF_HUB_OFFLINE=1 \
    PYTHONPATH=/build /opt/venv/bin/python -m attnviz warmup \
 && chmod -R a+rX /opt/attnviz/models

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/hf \
    ATTNVIZ_CACHE=/opt/attnviz/models \
    ATTNVIZ_STATUS_FILE=/tmp/attnviz-queue.json \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    STREAMLIT_SERVER_HEADLESS=true

# uid/gid 1000 (as on Hugging Face Spaces), owning only what it writes: the /data volume.
RUN groupadd --gid 1000 app \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /data/hf \
 && chown -R 1000:1000 /data
COPY --from=deps /opt/venv /opt/venv
COPY --from=models /opt/attnviz/models /opt/attnviz/models

# Code is root-owned and read-only to the app user. The project is installed the way users
# install it (a wheel built from the checkout; dependencies are already in place), which also
# puts the `attnviz` command on PATH. Only what the wheel holds is copied (not tests/, docs/, wheels/).
COPY pyproject.toml README.md app.py /src/
COPY .streamlit/config.toml /src/.streamlit/config.toml
COPY attnviz /src/attnviz
COPY ui /src/ui
COPY pages /src/pages
RUN python -m pip install --quiet --no-deps --no-build-isolation /src \
 && python -I -c "import attnviz; assert 'site-packages' in attnviz.__file__, attnviz.__file__"

USER 1000:1000
# Relative paths (`attnviz extract --out x.npz`) land on the volume.
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8501
# No curl in the slim image: the health check is a standard-library script (no torch import)
# against Streamlit's endpoint and, on a demo, the queue's status file (is it moving?); its one
# line (queue length, oldest ticket) is what `docker inspect` shows under State.Health.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-I", "/src/attnviz/server/healthcheck.py", "http://127.0.0.1:8501/_stcore/health"]
# The installed command serves the app shipped in the package (the same one `pip install` users
# run) and becomes the server process, so `docker stop`'s SIGTERM reaches Streamlit.
CMD ["attnviz", "app", "--port", "8501", "--address", "0.0.0.0"]
