# attnviz web app. CPU image by default; --build-arg TORCH=cuda for the CUDA build of torch.
FROM python:3.11-slim
ARG TORCH=cpu
ENV PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    ATTNVIZ_CACHE=/data/attnviz \
    VENV=none \
    PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 1000 app && mkdir -p /data /app && chown app:app /data /app
WORKDIR /app
COPY --chown=app:app requirements.txt requirements-dev.txt ./
COPY --chown=app:app scripts/ scripts/
# The same install script CI runs (make test -> scripts/install.sh).
RUN if [ "$TORCH" = "cuda" ]; then bash scripts/install.sh --cuda; \
    else TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/install.sh; fi
COPY --chown=app:app . .
USER app
# Bake the built-in models in, pre-converted (the GGUF is de-quantized once, here).
ENV ATTNVIZ_CACHE=/app/.model-cache
RUN python -m attnviz warmup
VOLUME ["/data"]
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status == 200 else 1)"]
CMD ["python", "-m", "streamlit", "run", "app.py", "--server.port=8501", "--server.address=0.0.0.0"]
