# syntax=docker/dockerfile:1
# pocserve frontend: FastAPI + uvicorn only. Installs pyproject's core dependencies and the frontend, protocol and
# common packages, nothing else: the image has no torch and no vLLM, and the build fails if either shows up.
# Build from the repo root:  docker build -f docker/frontend.Dockerfile -t pocserve-frontend .
#
# Few instructions: on storage drivers without copy-on-write (vfs, where `make compose-test` runs) every one, ENV
# and EXPOSE included, copies the image's whole file system (~25 s each there), so the settings are one ENV, the
# user is made with the dependencies, the build works in /tmp/src by absolute paths (no WORKDIR: the container's
# is /, the base's), and there is no `CMD []` (an ENTRYPOINT already clears the base's CMD).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# Container defaults; every POCSERVE_* one is a frontend setting (see frontend/settings.py), overridable at run.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    POCSERVE_HOST=0.0.0.0 \
    POCSERVE_PORT=8000 \
    POCSERVE_BACKEND_ADDRESS=tcp://backend:5555 \
    POCSERVE_LOG_FORMAT=json

# Core dependencies only (pyproject [project].dependencies, pinned there), cached while only the source changes;
# the unprivileged user with them.
COPY pyproject.toml /tmp/src/
COPY docker/install_deps.py /tmp/src/docker/
RUN cd /tmp/src && python docker/install_deps.py pyproject.toml \
 && groupadd --system --gid 10001 pocserve \
 && useradd --system --uid 10001 --gid pocserve --home-dir /nonexistent --shell /usr/sbin/nologin pocserve

# Only the packages the frontend may import; the install is --no-deps, so nothing else comes in.
COPY protocol/ /tmp/src/protocol/
COPY common/ /tmp/src/common/
COPY frontend/ /tmp/src/frontend/
RUN cd /tmp/src && python -m pip install --no-deps . \
 && cd / && rm -rf /tmp/src \
 && python -c "import importlib.util as u, frontend.app; \
heavy = [m for m in ('torch', 'vllm') if u.find_spec(m)]; \
assert not heavy, f'frontend image must not contain {heavy}'"

USER 10001:10001
EXPOSE 8000

# Healthy = /health answers 200, i.e. this frontend is up and its backend is ready (503 while it is not).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('POCSERVE_PORT', '8000'), timeout=3)"]

ENTRYPOINT ["python", "-m", "frontend"]
