#!/usr/bin/env bash
# Runs one backend and one frontend on the embedded default (CPU engine, generated tiny model).
# Every setting can be overridden with its POCSERVE_* environment variable (see README).
# When either process ends (a backend that could not start, say), the other is stopped and this exits with the
# first one's status: nothing supervises them here to restart one.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${VENV:-.venv}/bin/python
$py -m backend &
backend=$!
$py -m frontend &
frontend=$!
trap 'kill $backend $frontend 2>/dev/null; wait 2>/dev/null' EXIT INT TERM
status=0
wait -n "$backend" "$frontend" || status=$?
kill -0 "$backend" 2>/dev/null && who=frontend || who=backend
echo "make run: the $who exited with status $status; stopping the other" >&2
exit "$status"
