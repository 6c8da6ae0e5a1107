# syntax=docker/dockerfile:1
# The HTTP API: FastAPI + redis.asyncio + tokenizers. No torch, no CUDA, no engine code.
# The Batch API's Celery workers run from the same image (`python -m batch`, the compose service "batch").
#   docker build -f docker/api.Dockerfile -t inferq-api .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 inferq \
    && useradd --system --uid 10001 --gid inferq --create-home --home-dir /home/inferq inferq \
    && mkdir -p /data/files && chown inferq:inferq /data/files

WORKDIR /src
# NOTE: only what the API imports: api/, batch/ (the Batch API's stores and Celery app) and the
# import-light wire contract in worker/ (worker/__init__.py is empty and worker/protocol/ is stdlib
# only). engine/ and kernels/ stay out, so this image cannot pull torch in by accident.
COPY pyproject.toml README.md ./
COPY api ./api
COPY batch ./batch
COPY worker ./worker
RUN pip install ".[api]" \
    && rm -rf /src \
    && cd / && python -c "import sys, importlib.resources as r, api.main, batch.__main__; \
assert 'torch' not in sys.modules, 'the API image must not import torch'; \
assert r.files('api').joinpath('static/index.html').is_file(), 'api/static is missing from the wheel'"

USER inferq
WORKDIR /home/inferq
ENV INFERQ_HOST=0.0.0.0 \
    INFERQ_PORT=8000 \
    INFERQ_FILES_DIR=/data/files
EXPOSE 8000

# Liveness only (/health needs no API key); readiness (a live worker) is /ready.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"INFERQ_PORT\", \"8000\")}/health', timeout=2)"

CMD ["python", "-m", "api"]
