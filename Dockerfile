# syntax=docker/dockerfile:1
# Calispec services image. One image runs any service: `python -m <service> ...` (see deploy/k8s).
#   CPU:  docker build -t calispec:cpu .
#   CUDA: docker build -t calispec:cuda \
#           --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#           --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
ARG BASE_IMAGE=python:3.12-slim-bookworm
ARG BUILDER_IMAGE=python:3.12-slim-bookworm

# -- build: wheels and a virtual environment, never shipped with the build tools ---------------
FROM ${BUILDER_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer: it is the big one and changes least often.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY calispec ./calispec
COPY calispec_core ./calispec_core
COPY calispec_tools ./calispec_tools
COPY coordinator ./coordinator
COPY draft_service ./draft_service
COPY target_service ./target_service
COPY memory_service ./memory_service
# the project itself with its `serve` extra (the base install is the light client); not a PyPI package to pin
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[serve]"

# -- runtime: the venv on the chosen base (CPU slim, or CUDA runtime), as a non-root user -------
FROM ${BASE_IMAGE} AS runtime
# The CUDA base images carry no Python; install the same minor version the venv was built with.
# hadolint ignore=DL3008
RUN if ! command -v python3.12 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3.12 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && ln -sf "$(command -v python3.12)" /usr/local/bin/python \
    && groupadd --system --gid 10001 calispec \
    && useradd --system --uid 10001 --gid calispec --home-dir /home/calispec --create-home calispec
COPY --from=build /opt/venv /opt/venv
# The venv's python links to the builder's interpreter path; point it at this image's.
RUN ln -sf /usr/local/bin/python /opt/venv/bin/python
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/tmp/hf \
    XDG_CACHE_HOME=/tmp/cache
USER 10001:10001
WORKDIR /home/calispec
EXPOSE 50050 50051 50052 50053
# No default service: the orchestrator says which one (`python -m coordinator ...`).
CMD ["python", "-m", "coordinator", "--help"]
