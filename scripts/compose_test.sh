#!/usr/bin/env bash
# make compose-test: the compose stacks against a real Docker engine (README, "Docker compose").
#  1. an engine and a compose client: found, or installed from Debian's packages (docker.io, docker-compose,
#     debootstrap) and dockerd started in the background; where none can be had (not root, no apt-get, dockerd
#     does not start) the test is skipped with one line, exit 0;
#  2. `docker-compose config` on every compose file;
#  3. local base images from Debian (scripts/compose_bases.sh), torch's CPU wheel from the host into docker/wheels/;
#  4. the CPU stack's images built (scripts/compose.sh cpu build): the backend in the foreground and, beside it in
#     the background, the frontend and then the GPU backend image on a stand-in base (vLLM's image is out of
#     reach), so every step after its FROM runs;
#  5. the CPU stack up and checked through the load balancer (scripts/compose_check.py), once both builds are done.
# Images stay in the engine between runs (the warm run rebuilds nothing that did not change): the final prune
# removes only untagged images, and the CPU backend's source stage is tagged so that its layers (the cache of the
# one layer after the heavy one) survive it.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { echo "compose-test [$(($(date +%s) - t0))s] $*"; }
skip() { echo "compose-test: SKIPPED: $*"; exit 0; }
venv=${VENV:-.venv}

# --- 1. engine and client ---------------------------------------------------------------------------------------
# dockerd as this machine kind runs it: vfs storage (no overlay inside the VM), no iptables NAT, no default bridge
# (builds use the host's network; the stack's own network is a user-defined bridge, which works without NAT).
dockerd_flags=(--storage-driver=vfs --iptables=false --bridge=none)
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || skip "no Docker engine answers and this user is not root to start one"
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! command -v debootstrap >/dev/null; then
        command -v apt-get >/dev/null || skip "no Docker engine, and no apt-get to install docker.io"
        say "installing docker.io docker-compose debootstrap (apt-get)"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose debootstrap; } \
            >/tmp/pocserve-compose-apt.log 2>&1 \
            || skip "apt-get could not install docker.io docker-compose debootstrap (/tmp/pocserve-compose-apt.log)"
    fi
    say "starting dockerd ${dockerd_flags[*]} (log: /var/log/pocserve-dockerd.log)"
    nohup dockerd "${dockerd_flags[@]}" >/var/log/pocserve-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || skip "dockerd did not start within 60 s (/var/log/pocserve-dockerd.log: \
$(tail -1 /var/log/pocserve-dockerd.log))"
fi
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || skip "no compose client and no way to install one"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/tmp/pocserve-compose-apt.log 2>&1 \
        || skip "apt-get could not install docker-compose"
fi
if ! command -v debootstrap >/dev/null; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || skip "no debootstrap to build the base images"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/tmp/pocserve-compose-apt.log 2>&1 \
        || skip "apt-get could not install debootstrap"
fi
say "engine $(docker version -f '{{.Server.Version}}'), $(docker info -f '{{.Driver}}') storage; client: \
$(docker compose version --short 2>/dev/null || docker-compose version --short)"

# --- 2. every compose file parses and interpolates ------------------------------------------------------------
export POCSERVE_POW_API_TOKEN=${POCSERVE_POW_API_TOKEN:-compose-test-token}
check_config() {  # a file (or files) with the variables its :? interpolations require
    "$@" config -q || { echo "compose-test: FAILED: $* config"; exit 1; }
}
client=$(docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
check_config $client -f docker-compose.yml
check_config $client -f docker-compose.cpu.yml
POCSERVE_NNODES=2 POCSERVE_MASTER_ADDR=10.0.0.1 check_config $client -f docker-compose.yml -f docker-compose.multinode.yml
POCSERVE_NNODES=2 POCSERVE_NODE_RANK=1 POCSERVE_MASTER_ADDR=10.0.0.1 VLLM_HOST_IP=10.0.0.2 \
    check_config $client -f docker-compose.worker.yml
say "config: docker-compose.yml, docker-compose.cpu.yml, + docker-compose.multinode.yml, docker-compose.worker.yml"

# --- 3. base images and torch's CPU wheel ------------------------------------------------------------------------
bash scripts/compose_bases.sh
export PYTHON_IMAGE=pocserve-local/python:3.11 LB_IMAGE=pocserve-local/haproxy:2.6
# PyTorch's CPU index is out of reach here: the host's own wheel (pip's configured find-links) goes in the build
# context instead. Where pip finds none, the build asks the index (TORCH_INDEX_URL).
if ls docker/wheels/torch-2.13.0+cpu-cp311-*.whl >/dev/null 2>&1 \
   || "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d docker/wheels "torch==2.13.0+cpu" >/dev/null 2>&1; then
    export TORCH_INDEX_URL=
    say "torch: $(basename docker/wheels/torch-2.13.0+cpu-cp311-*.whl) from the host"
fi

# --- 4. the images: the CPU backend; beside it, the frontend and the GPU backend on a stand-in base ---------------
# Two lanes, each about 8 minutes cold on the 2-core CI machine: the CPU backend (its pip install waits on the
# network much of its time), and in the background the frontend and then docker/backend.Dockerfile, which need
# nothing of it. vLLM's CUDA image is out of reach: the stand-in is the local Python image with vllm 0.26.0 and
# torch 2.11.0 as installed metadata (empty packages), so that docker/backend.Dockerfile's version check, its
# --keep-installed dependency install, the source, `pip install -e`, compileall and `import backend.startup.settings` all
# run. Its Python is 3.11 (Debian's), not the vLLM image's 3.12: the one version check given another value.
gpu_build() {
    docker build -q -t pocserve-local/vllm-standin:0.26.0 - <<'DOCKERFILE' \
        || { echo "compose-test: FAILED: building the stand-in base"; return 1; }
FROM pocserve-local/python:3.11
RUN set -e; sp=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    for nv in vllm:0.26.0 torch:2.11.0; do n=${nv%%:*} v=${nv#*:}; mkdir -p "$sp/$n" "$sp/$n-$v.dist-info"; \
      printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$n" "$v" >"$sp/$n-$v.dist-info/METADATA"; \
      echo "# stand-in for the vLLM image's $n $v" >"$sp/$n/__init__".py; done
DOCKERFILE
    docker build -q --network host -f docker/backend.Dockerfile -t pocserve-backend-standin:latest \
        --build-arg BASE_IMAGE=pocserve-local/vllm-standin:0.26.0 --build-arg PYTHON_VERSION=3.11 . \
        || { echo "compose-test: FAILED: docker/backend.Dockerfile on the stand-in base"; return 1; }
}
background_builds() {
    scripts/compose.sh cpu build frontend || { echo "compose-test: FAILED: the frontend image"; return 1; }
    echo "compose-test [$(($(date +%s) - t0))s] frontend image built"
    gpu_build
}
bg_log=$(mktemp /tmp/pocserve-compose-builds.XXXXXX.log)
say "building the frontend, then docker/backend.Dockerfile on a stand-in base, in the background (log: $bg_log)"
background_builds >"$bg_log" 2>&1 &
bg_pid=$!
trap 'kill "$bg_pid" 2>/dev/null || true' EXIT  # a failed backend build leaves no build behind

say "building the CPU backend image (scripts/compose.sh cpu build backend)"
scripts/compose.sh cpu build backend
# The source stage of docker/backend-cpu.Dockerfile, tagged (every step cached: seconds): untagged, the final prune
# would take it, and the next build would redo the layer after the heavy one (two full copies of ~4 GB under vfs).
docker build -q --network host --target source -f docker/backend-cpu.Dockerfile \
    --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" -t pocserve-local/backend-cpu-source:latest . >/dev/null
say "CPU backend image built"
wait "$bg_pid" || { tail -20 "$bg_log"; echo "compose-test: FAILED: a background build (log: $bg_log)"; exit 1; }
trap - EXIT
grep -h "frontend image built" "$bg_log" || true
rm -f "$bg_log"
say "frontend and GPU backend (stand-in base, pocserve-backend-standin:latest) images built"

# --- 5. the CPU stack -----------------------------------------------------------------------------------------------
export LB_PORT=${LB_PORT:-18000}
"$venv/bin/python" scripts/compose_check.py
say "the stack's checks passed"

docker image prune -f >/dev/null  # the dangling layers replaced images leave (vfs keeps whole copies)
say "compose-test: passed in $(($(date +%s) - t0)) s"
