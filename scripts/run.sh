#!/usr/bin/env bash
# Runs one backend and one frontend on the embedded default (CPU engine, generated tiny model).
# Every setting can be overridden with its POCSERVE_* environment variable (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${VENV:-.venv}/bin/python
$py -m backend &
backend=$!
trap 'kill $backend 2>/dev/null; wait $backend 2>/dev/null' EXIT INT TERM
$py -m frontend
