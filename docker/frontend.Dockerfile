# syntax=docker/dockerfile:1
# pocserve frontend: FastAPI + uvicorn only. Installs pyproject's core dependencies and the frontend, protocol and
# common packages, nothing else: the image has no torch and no vLLM, and the build fails if either shows up.
# Build from the repo root:  docker build -f docker/frontend.Dockerfile -t pocserve-frontend .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /tmp/src

# Core dependencies only (pyproject [project].dependencies, pinned there), cached while only the source changes.
COPY pyproject.toml ./
COPY docker/install_deps.py docker/
RUN python docker/install_deps.py pyproject.toml

# Only the packages the frontend may import; the install is --no-deps, so nothing else comes in.
COPY protocol/ protocol/
COPY common/ common/
COPY frontend/ frontend/
RUN python -m pip install --no-deps . \
 && cd / && rm -rf /tmp/src \
 && python -c "import importlib.util as u, frontend.app; \
heavy = [m for m in ('torch', 'vllm') if u.find_spec(m)]; \
assert not heavy, f'frontend image must not contain {heavy}'"

RUN groupadd --system --gid 10001 pocserve \
 && useradd --system --uid 10001 --gid pocserve --home-dir /nonexistent --shell /usr/sbin/nologin pocserve
USER 10001:10001
WORKDIR /

# Container defaults; every POCSERVE_* one is a frontend setting (see frontend/settings.py), overridable at run.
ENV POCSERVE_HOST=0.0.0.0 \
    POCSERVE_PORT=8000 \
    POCSERVE_BACKEND_ADDRESS=tcp://backend:5555 \
    POCSERVE_LOG_FORMAT=json

EXPOSE 8000

# Healthy = /health answers 200, i.e. this frontend is up and its backend is ready (503 while it is not).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('POCSERVE_PORT', '8000'), timeout=3)"]

ENTRYPOINT ["python", "-m", "frontend"]
CMD []
