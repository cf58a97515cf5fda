#!/usr/bin/env bash
# Runs the compose client on one of the project's stacks, after checking what compose would otherwise report late
# or not at all (README, "Docker compose"):
#
#   scripts/compose.sh cpu ARGS...   # docker-compose.cpu.yml, project pocserve-cpu: vLLM on CPU, no GPU needed
#   scripts/compose.sh gpu ARGS...   # docker-compose.yml, project pocserve: vLLM 0.26 on NVIDIA GPUs
#
# ARGS are the compose client's (up -d --build, up -d --scale frontend=4, ps, logs backend, down, ...). The client
# is `docker compose` (v2) where the engine's CLI has it, else `docker-compose` (1.29 or later: Debian's); COMPOSE
# names another. Before `up`: a compose client too old, a MODEL_DIR that is not a directory (or lacks the model),
# and a load balancer port (LB_PORT, default 8000) that something else holds each stop it with one line, exit 2.
# The project name is given here (-p) rather than in the files, where docker-compose 1.29 refuses it.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "compose.sh: $*" >&2; exit 2; }

stack=${1:-}
case "$stack" in
    cpu) file=docker-compose.cpu.yml project=pocserve-cpu ;;
    gpu) file=docker-compose.yml project=pocserve ;;
    *) fail "usage: scripts/compose.sh cpu|gpu COMPOSE-ARGS... (got '${stack}')" ;;
esac
shift

# The client: `docker compose` v2, or docker-compose; `service_completed_successfully` (curve-keys) needs 1.29.
if [ -n "${COMPOSE:-}" ]; then
    read -r -a client <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    client=(docker compose)
elif command -v docker-compose >/dev/null; then
    client=(docker-compose)
else
    fail "no compose client: install the Docker compose plugin (docker compose) or docker-compose >= 1.29"
fi
version=$("${client[@]}" version --short 2>/dev/null || "${client[@]}" version 2>/dev/null | head -1) \
    || fail "'${client[*]}' does not run"
version=$(grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' <<<"$version" | head -1 || true)
IFS=. read -r major minor _ <<<"${version:-0.0}"
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 29 ]; }; then
    fail "${client[*]} ${version:-(unknown version)} is too old: docker-compose >= 1.29 or docker compose v2 is needed"
fi

if [ "${1:-}" = up ]; then
    # The model directory: a host directory when MODEL_DIR is set; the GPU stack has no other (./models).
    model=${POCSERVE_MODEL:-/models/tiny-qwen3}
    if [ -n "${MODEL_DIR:-}" ] || [ "$stack" = gpu ]; then
        dir=${MODEL_DIR:-./models}
        [ -d "$dir" ] || fail "MODEL_DIR=$dir is not a directory (the models to serve, mounted at /models)"
        generate=${POCSERVE_GENERATE_MODEL:-$([ "$stack" = cpu ] && echo tiny || echo none)}
        if [ "${model#/models/}" != "$model" ] && [ "$generate" = none ] && [ ! -d "$dir/${model#/models/}" ]; then
            fail "model directory $dir/${model#/models/} does not exist (POCSERVE_MODEL=$model; generate one with \
python -m backend.tools.modelgen --out $dir/${model#/models/} --shape tiny)"
        fi
    fi
    # The load balancer's host port, unless this project's own balancer holds it (a second `up` that scales).
    port=${LB_PORT:-8000}
    own=$(${DOCKER:-docker} ps -q --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=lb" 2>/dev/null || true)
    if [ -z "$own" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        fail "port $port is in use on this host (the load balancer's; set LB_PORT to another)"
    fi
fi

exec "${client[@]}" -p "$project" -f "$file" "$@"
