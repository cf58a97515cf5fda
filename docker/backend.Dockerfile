# syntax=docker/dockerfile:1
# pocserve backend: the one process that hosts vLLM 0.26.0 in-process (CUDA).
# The base is vLLM's own 0.26.0 image: Python 3.12 + torch 2.11 (cu130), exactly what vLLM 0.26 pins, so nothing
# here installs or moves torch/vLLM. Pin harder with a digest: --build-arg BASE_IMAGE=vllm/vllm-openai@sha256:...
# Build from the repo root:  docker build -f docker/backend.Dockerfile -t pocserve-backend .
ARG BASE_IMAGE=vllm/vllm-openai:v0.26.0
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1

# Some vLLM image tags ship only `python3`; the entrypoint and the healthcheck say `python`.
RUN command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python

# Refuse a base that is not the stack the project is verified on (metadata only: no GPU at build time). The
# versions are arguments only for scripts/compose_test.sh, which builds this file on a stand-in base (the CPU
# backend image) where no registry serves vLLM's image, so that every step below runs there too.
ARG PYTHON_VERSION=3.12
ARG VLLM_VERSION=0.26.0
ARG TORCH_VERSION=2.11.
RUN python -c "import sys; from importlib.metadata import version as v; \
assert '%d.%d' % sys.version_info[:2] == '${PYTHON_VERSION}', sys.version; \
assert v('vllm') == '${VLLM_VERSION}', v('vllm'); \
assert v('torch').startswith('${TORCH_VERSION}'), v('torch'); \
print('base ok: python', sys.version.split()[0], 'vllm', v('vllm'), 'torch', v('torch'))"

WORKDIR /opt/pocserve

# Dependencies first (cached while only the source changes): the core + [backend] pins the image lacks,
# constrained so that nothing vLLM brought is upgraded or downgraded.
COPY pyproject.toml ./
COPY docker/install_deps.py docker/
RUN python docker/install_deps.py pyproject.toml --extra backend --keep-installed

COPY protocol/ protocol/
COPY common/ common/
COPY backend/ backend/
COPY poc/ poc/
COPY sampling/ sampling/
# Bytecode compiled into the image: PYTHONDONTWRITEBYTECODE keeps the container from writing it at run time, and
# without it every start compiled vLLM's and torch's sources again on import (21-24 s of a 35 s restart on an
# H100 host, docs/benchmarks-history.md). The second path is the directory holding vllm and torch; where the base has
# compiled it already, compileall only checks timestamps.
RUN python -m pip install --no-deps -e . \
 && python -m compileall -q -j 0 protocol common backend poc sampling \
    "$(python -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("vllm").origin)))')" \
 && mkdir -p /var/lib/pocserve /models \
 && python -c "import backend.startup.settings"

# Container defaults; every POCSERVE_* one is a backend setting (see backend/startup/settings.py), overridable at run.
ENV POCSERVE_BACKEND_ADDRESS=tcp://0.0.0.0:5555 \
    POCSERVE_BACKEND_BIND_ANY=1 \
    POCSERVE_LOG_FORMAT=json \
    POCSERVE_GPU_MEMORY_UTILIZATION=0.9 \
    POCSERVE_MODEL=/models/tiny-qwen3 \
    POCSERVE_GENERATE_MODEL=none \
    VLLM_USE_V2_MODEL_RUNNER=0 \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1

EXPOSE 5555

# Healthy = the backend answers on its socket and its engine is ready (model load can take minutes).
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=3 \
    CMD python -m backend.tools.probe --address "$POCSERVE_BACKEND_ADDRESS" --once --timeout-s 3 || exit 1

# No `CMD []`: an ENTRYPOINT clears the base's CMD (and on vfs each instruction copies the image).
ENTRYPOINT ["python", "-m", "backend"]
