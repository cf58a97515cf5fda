#!/usr/bin/env bash
# Stages py-spy for the GPU machines in .stage/extra (no index there; scripts/gpu_check.sh installs every wheel it
# finds in that folder): the sampler behind bench-serving-rounds' SPY_S. Carry .stage/extra with a later part, e.g.
# carry [".stage/p3", ".stage/extra"]. The wheel is downloaded here for their Python (3.12, x86_64 Linux).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .stage/extra
python3 -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --dest .stage/extra py-spy
# pip's --target leaves a wheel's scripts out of /tmp/site/bin on those machines, so the binary itself travels too
# (scripts/gpu_check.sh puts .stage/extra/bin on PATH).
mkdir -p .stage/extra/bin
python3 - <<'PY'
import glob, os, zipfile
wheel = zipfile.ZipFile(sorted(glob.glob(".stage/extra/py_spy-*.whl"))[-1])
name = next(n for n in wheel.namelist() if n.endswith("/scripts/py-spy"))
with open(".stage/extra/bin/py-spy", "wb") as f:
    f.write(wheel.read(name))
os.chmod(".stage/extra/bin/py-spy", 0o755)
PY
ls -l .stage/extra .stage/extra/bin
