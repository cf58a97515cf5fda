#!/usr/bin/env bash
# Runs the GPU checks on a CUDA machine with the staged vLLM 0.26 bundle (see ../shared/gpu/README.md).
#   bash scripts/gpu_check.sh tests    # the device-agnostic integration suite + tests/gpu on the CUDA engine
#                                      # (tests/gpu/test_tensor_parallel.py needs two GPUs, skipped on one)
#   bash scripts/gpu_check.sh bench-poc       # PoC forward (0.6B shape) vs bare forward, mining via HTTP vs direct
#   bash scripts/gpu_check.sh bench-serving   # this stack vs `vllm serve`, same install and model
# Results go to $OUT (default ./gpu-out).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
bash .stage/p1/install.sh
[ -d .stage/extra ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .stage/extra/*.whl 2>&1 | grep -v "already exists" || true
export PYTHONPATH=/tmp/site:$PWD
export VLLM_USE_V2_MODEL_RUNNER=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
case "${1:-tests}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning \
      tests/gpu tests/unit/test_engine_compat.py tests/unit/test_poc_cuda.py tests/integration/test_openai_api.py tests/integration/test_poc_artifacts.py \
      tests/integration/test_validation_replay.py tests/integration/test_logprobs_mode.py \
      tests/integration/test_grammar_degradation.py tests/integration/test_pow_api.py \
      tests/integration/test_pow_mining.py tests/integration/test_resilience.py -s \
      --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt" | grep -vE "^(INFO|WARNING|DEBUG)"
    ;;
  bench-poc)
    python3 -m bench.poc_forward --shape qwen3-0.6b --seq-lens 256 1024 --batches 32 64 --iters 10 \
      --gpu-memory-utilization 0.6 --parts --json "$out/poc_forward.json" 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" \
      | tee "$out/poc_forward.txt"
    python3 -m bench.mining --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --seconds 20 --shared \
      --gpu-memory-utilization 0.5 --json "$out/mining.json" 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" \
      | tail -5 | tee "$out/mining.txt"
    ;;
  bench-serving)
    python3 -m bench.serving --shape qwen3-0.6b --model-dir models/qwen3-0.6b --num-requests 512 \
      --concurrency 64 --max-tokens 128 --max-num-seqs 256 --max-num-batched-tokens 8192 \
      --gpu-memory-utilization 0.5 --device-note "$(nvidia-smi --query-gpu=name --format=csv,noheader)" \
      --json "$out/serving.json" 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" | tail -40 | tee "$out/serving.txt"
    ;;
esac
