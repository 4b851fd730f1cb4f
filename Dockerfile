# attnviz web app.
#   docker build -t attnviz .                        CPU-only torch (small image)
#   docker build -t attnviz --build-arg TORCH=cuda .  CUDA build of the same torch version
#   docker run -p 8501:8501 -v attnviz-data:/data [-e ATTNVIZ_DEMO=1] [-e HF_TOKEN=...] attnviz
# Hub downloads (HF_HOME) live on the /data volume; the built-in models are baked into the image.
FROM python:3.11-slim

ARG TORCH=cpu
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VENV=none \
    HF_HOME=/data/hf \
    ATTNVIZ_CACHE=/opt/attnviz/models \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    STREAMLIT_SERVER_HEADLESS=true

# uid/gid 1000, owning only what it must write: the volume and the baked model cache.
RUN groupadd --gid 1000 app \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /app /data/hf /opt/attnviz/models \
 && chown -R 1000:1000 /data /opt/attnviz
WORKDIR /app

# The same install script `make test` runs (make test -> make dev -> scripts/install.sh), for the
# pinned dependencies only: just the files it reads are copied first, so code edits do not
# re-install torch.
COPY requirements.txt requirements-dev.txt ./
COPY scripts/install.sh scripts/install.sh
RUN case "$TORCH" in \
      cuda) bash scripts/install.sh --cuda --deps-only ;; \
      cpu) TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/install.sh --deps-only ;; \
      *) echo "TORCH must be cpu or cuda, got '$TORCH'" >&2; exit 2 ;; \
    esac

# Code is root-owned and read-only to the app user. The project is installed the way users
# install it (a wheel built from the checkout; dependencies are already in place), which also
# puts the `attnviz` command on PATH.
COPY . .
RUN python -m pip install --no-deps . \
 && python -I -c "import attnviz; assert 'site-packages' in attnviz.__file__, attnviz.__file__"
USER 1000:1000

# Bake the built-in models in, pre-converted (SmolLM2's GGUF is de-quantized once, here),
# so the first page load only reads safetensors.
RUN python -m attnviz warmup

VOLUME ["/data"]
EXPOSE 8501
# No curl in the slim image: the health check is Python's urllib against Streamlit's endpoint.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status != 200)"]
# The installed command serves the app shipped in the package (the same one `pip install` users run).
CMD ["attnviz", "app", "--port", "8501", "--address", "0.0.0.0"]
