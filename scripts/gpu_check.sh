#!/usr/bin/env bash
# Runs the GPU checks on a CUDA machine with vLLM 0.26 from a wheel bundle staged in .stage/ (a machine without a
# package index; the bundle is built outside this repository).
#   bash scripts/gpu_check.sh tests    # the device-agnostic integration suite + tests/gpu on the CUDA engine
#                                      # (tests/gpu/test_tensor_parallel.py needs two GPUs, skipped on one)
#   bash scripts/gpu_check.sh bench-poc       # PoC forward (0.6B shape) vs bare forward, mining via HTTP vs direct
#   bash scripts/gpu_check.sh fp8-default     # the default FP8 kernels on the seeded 235B slice: the choice, PoC,
#                                             # chat against `vllm serve` on the same kernels
#   bash scripts/gpu_check.sh kernels         # the FP8 MoE and linear kernel paths side by side on the 235B slice:
#                                             # nonces/s, MFU, artifacts' L2 between paths (KERNELS, KLAYERS; DeepGEMM
#                                             # staged by scripts/stage_deep_gemm.sh as .stage/p5)
#   bash scripts/gpu_check.sh poc-paths 0.6b|235b  # PoC, an exclusive round's path and the bare forward, with
#                                             # --poc-overlap auto (graphs) and off (pipelined: TP > 1's path)
#   bash scripts/gpu_check.sh poc-host        # the pipelined path at 256 x 32/64 (0.6B): host and device time of
#                                             # each stage, cProfile tables of the round path (host-bound there)
#   bash scripts/gpu_check.sh engine-step     # host work per engine step: ours vs LLMEngine.step (0.6B)
#   bash scripts/gpu_check.sh archs [SHAPES]  # the architecture tests on the CUDA engine (default tiny-minimax-m2)
#   bash scripts/gpu_check.sh bench-serving   # this stack vs `vllm serve`, same install and model
#   bash scripts/gpu_check.sh bench-serving-rounds [custom-ops]  # the same, both servers up at once (0.4 of the
#                                             # GPU each), ROUNDS (default 12) pairs of interleaved rounds; custom-ops
#                                             # gives `vllm serve` our custom_ops ["all"] (one call each, < 9 min);
#                                             # RMODEL="235b LAYERS": the 235B slice (block-FP8, dummy weights)
#   bash scripts/gpu_check.sh prefill-window  # bench-serving-rounds at an open load (RATE, default 60 requests/s),
#                                             # --step-log, once per ours' --prefill-window-ms in WINDOWS (default
#                                             # "0 20"), ROUNDS (default 3) pairs each: one call (< 10 min)
#   bash scripts/gpu_check.sh forward-cost    # the same load with the processor's deltas sent every FLUSH_EVERY
#                                             # (default 8) steps: what the io thread's forwarding costs a step
#   bash scripts/gpu_check.sh bench-beside    # validation jobs and 16 streaming chats beside a round (0.6B)
#   bash scripts/gpu_check.sh bench-moe N Q   # the qwen3-235b-a22b shape at N layers (default 1), Q none|fp8:
#                                             # PoC vs bare forward, chat vs `vllm serve`, first and second start
#   bash scripts/gpu_check.sh round           # bench-serving then bench-beside (one call's worth)
#   bash scripts/gpu_check.sh overlap         # 16 streaming chats beside a round (0.6B): PoC forwards beside chat
#                                             # steps (--poc-overlap auto) vs time-sliced (off) at chat shares
#                                             # (RUNS="auto:0.5 auto:0.25 off:0.5"), then the shared-mode mining
#                                             # tests on the CUDA engine (TESTS=0 skips them)
#   bash scripts/gpu_check.sh bursts          # 16-stream bursts to an idle node, without a round and during one
#                                             # (0.6B), for this tree and others (RUNS="TREE:SHARE ...")
#   bash scripts/gpu_check.sh soak            # bench.soak on the 0.6B shape (SOAK_S seconds, default 600): RSS
#                                             # slope per process after warm-up, nothing lost
#   bash scripts/gpu_check.sh heap-split      # the soak's variants side by side (chat, PoC, mixed, without PoC
#                                             # graphs, chat compiled, chat on Triton attention: bench/soak_split.py
#                                             # VARIANTS): which grows the engine's heap, against the slope the
#                                             # KV-cache write's leak predicts from each one's steps; MEMRAY=S:E
#                                             # records each engine's native allocations from S to E s (memray,
#                                             # staged in .stage/extra) and lists what they left live (leaks.txt)
#   bash scripts/gpu_check.sh op-leak         # host bytes per call of vLLM's KV-cache write and of a stable-ABI op
#                                             # with a `str` argument (bench/op_leak.py): the chat path's leak
#   bash scripts/gpu_check.sh moe-tune        # Triton fused-MoE tiles for the 235B's experts on this GPU where vLLM
#                                             # ships none (bench/moe_tune.py; MOETUNE="N [SPACE]", default 1536)
#   bash scripts/gpu_check.sh soak-start      # the same soak (or SOAK_MODE) outliving the call (setsid); then
#   bash scripts/gpu_check.sh soak-collect    # on the same machine: wait for it, results to $OUT
#   bash scripts/gpu_check.sh startup         # first (cold caches) and second start of the backend, 0.6B and
#                                             # tiny-moe, with each start's phases (bench/startup.py)
#   bash scripts/gpu_check.sh poc-parts N Q   # the qwen3-235b-a22b shape at N layers, Q none|fp8: PoC vs bare at
#                                             # B=32 and 64 with each stage's time and profiler tables
#   bash scripts/gpu_check.sh moe-golden      # the 235B slice's artifacts vs the CPU engine's golden file
#   bash scripts/gpu_check.sh fused-norm      # the reflection fused into the next norm: tests/unit/test_poc_cuda.py,
#                                             # then poc-paths 0.6b's points with POCSERVE_POC_FUSED_NORM=1 and 0
#   bash scripts/gpu_check.sh full-scale      # the 235B model whole (94 layers, dummy weights) at TP=4 through
#                                             # bench.network_launch (FULL="LAYERS TP QUANT CONFIG EXTRA")
#   bash scripts/gpu_check.sh full-poc        # the same model: PoC vs the bare forward at TP=4, peak memory per
#                                             # batch (FULLPOC="LAYERS TP QUANT EXTRA", e.g. EXTRA for expert parallel)
#   bash scripts/gpu_check.sh full-serving    # the same model and TP: chat vs `vllm serve` in steady state, each
#                                             # warmed until its TTFT p99 settles (SERVING="TP SYSTEMS REQUESTS
#                                             # CONCURRENCY EXTRA"; eager decode at 94 layers is ~200 ms a
#                                             # step: 256 requests of each system fit one 10-minute call)
#   bash scripts/gpu_check.sh full-shared     # the same model: shared mode, chat and a round each against alone
#                                             # (FULLSHARED="LAYERS TP QUANT")
#   bash scripts/gpu_check.sh launch          # the ML node's command line with a network config on this GPU
#                                             # (bench.network_launch; LAUNCH="SHAPE LAYERS QUANT CONFIG")
#   bash scripts/gpu_check.sh topologies P L  # several GPUs: artifacts on tp1, tp2, pp2 (and tp4, tp2xpp2 on 4+),
#                                             # every pair's L2 and verdicts, nonces/s. Parts P, each one device
#                                             # call's worth on 2 GPUs: dense (the 0.6B shape), moe-bf16 and
#                                             # moe-fp8 (the qwen3-235b-a22b shape at L layers, default 4), serving
#                                             # (chat vs `vllm serve` at the widest TP), tests (TP/PP/multi-node);
#                                             # all (default) runs them in turn
# Results go to $OUT (default ./gpu-out).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
bash .stage/p1/install.sh
compgen -G ".stage/extra/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --target /tmp/site .stage/extra/*.whl 2>&1 | grep -v "already exists" || true
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PWD/.stage/extra/bin:$PATH  # py-spy, where staged in .stage/extra
# These machines set PYTHONDONTWRITEBYTECODE=1, so every process compiled vLLM's and torch's sources again on
# import: 21-24 s of a 35 s start (a node's image has them compiled). The first process here writes them.
unset PYTHONDONTWRITEBYTECODE
export VLLM_USE_V2_MODEL_RUNNER=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
# vLLM's vendored DeepGEMM, where staged (scripts/stage_deep_gemm.sh): it compiles its kernels with nvcc at run
# time, which these machines have (CUDA 13.0) though not always on PATH. Without it, VLLM_USE_DEEP_GEMM=0.
if [ -f .stage/p5/deep_gemm.tar.xz ] && [ ! -f /tmp/site/.staged-p5 ]; then
  tar xJf .stage/p5/deep_gemm.tar.xz -C /tmp/site && touch /tmp/site/.staged-p5
fi
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc 2>/dev/null | head -1 || true)
[ -n "$nvcc" ] && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")} PATH=$PATH:$(dirname "$nvcc")
# With it, pocserve's default for block-FP8 checkpoints (backend/engine/kernels.py); `kernels` sets each path.
[ -f /tmp/site/.staged-p5 ] && [ -n "$nvcc" ] || export VLLM_USE_DEEP_GEMM=0
quiet() { grep --line-buffered -vE "^(INFO|WARNING|DEBUG)|^\(EngineCore"; }  # line by line: a cut run keeps its lines
# The servers' logs of the latest bench.serving run, into $out/logs-TAG (their start phases explain start times).
keep_logs() {
  local dir; dir=$(ls -dt /tmp/pocserve-bench-* 2>/dev/null | head -1) || return 0
  [ -n "$dir" ] || return 0
  mkdir -p "$out/logs-$1"
  for f in "$dir"/*.log; do [ -f "$f" ] && tail -c 300000 "$f" > "$out/logs-$1/$(basename "$f")"; done
  for d in "$dir"/steps-*; do [ -d "$d" ] && cp -r "$d" "$out/logs-$1/"; done; return 0  # --step-log's records
}
bench_serving() {
  python3 -m bench.serving --shape qwen3-0.6b --model-dir models/qwen3-0.6b --num-requests 512 \
    --concurrency 64 --max-tokens 128 --max-num-seqs 256 --max-num-batched-tokens 8192 \
    --gpu-memory-utilization 0.5 --device-note "$(nvidia-smi --query-gpu=name --format=csv,noheader)" \
    --json "$out/serving.json" 2>&1 | quiet | tail -40 | tee "$out/serving.txt"
  keep_logs serving
}
bench_beside() {
  python3 -m bench.beside_mining --part jobs --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --seconds 10 \
    --gpu-memory-utilization 0.5 --json "$out/beside_jobs.json" 2>&1 | quiet | tail -8 | tee "$out/beside_jobs.txt"
  python3 -m bench.beside_mining --part chat --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --streams 16 \
    --max-tokens 128 --seconds 15 --chat-share 0.5 --gpu-memory-utilization 0.5 --json "$out/beside_chat.json" \
    2>&1 | quiet | tail -8 | tee "$out/beside_chat.txt"
}
# The 235B shape's config, tokenizer and quantization config, no tensors (weights: --load-format dummy), into $dir.
config_only() {
  dir=models/qwen3-235b-a22b-$1l-$2-config-only
  python3 -m backend.tools.modelgen --out "$dir" --shape qwen3-235b-a22b --num-layers "$1" \
    $([ "$2" = fp8 ] && echo --quant fp8) --config-only
}
# A call that timed out can leave engine workers (their own session) holding the GPUs into the next call, and a run
# cut during a JIT build (FlashInfer's ninja and nvcc: minutes an object) leaves its compilers on the host's cores.
free_gpus() {
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9 2>/dev/null
  local name count
  for name in ninja nvcc cicc ptxas 'cudafe\+\+'; do  # one name a pattern: pgrep matches none past 15 characters
    count=$(pgrep -c -x "$name" || true)
    [ "${count:-0}" -gt 0 ] && echo "free_gpus: stopping $count leftover $name" >&2 && { pkill -9 -x "$name" || true; }
  done
  sleep 2
}
# spy LOG SECONDS: once LOG shows bench.rounds' first round, py-spy samples our backend and `vllm serve`, each with
# its subprocesses, for SECONDS (non-blocking, busy threads only, collapsed stacks by thread) into $out/spy-*.txt.
# SPY_FLAGS replaces "--nonblocking" in the two engine recordings (e.g. "--native": C frames too, such as the
# collector's or a wait for the GIL; py-spy then pauses the process for each sample).
spy() {
  command -v py-spy > /dev/null || { echo "spy: py-spy is not staged (scripts/stage_extra.sh, carry .stage/extra)"; return 0; }
  for _ in $(seq 900); do grep -q "^round  1 " "$1" 2>/dev/null && break; sleep 1; done
  local ours vllm frontend
  ours=$(pgrep -f "^pocserve-backend" | head -1 || true)  # its title (common/process.py set_title)
  frontend=$(pgrep -f "python3? -m frontend" | head -1 || true)
  vllm=$(pgrep -f "vllm.entrypoints.openai.api_server" | head -1 || true)
  [ -n "$ours" ] && py-spy record ${SPY_FLAGS:---nonblocking} --subprocesses --threads -f raw -d "$2" -p "$ours" \
    -o "$out/spy-ours.txt" > "$out/spy-ours.log" 2>&1 &
  [ -n "$frontend" ] && py-spy record --nonblocking --threads -f raw -d "$2" -p "$frontend" \
    -o "$out/spy-ours-frontend.txt" > "$out/spy-ours-frontend.log" 2>&1 &
  [ -n "$vllm" ] && py-spy record ${SPY_FLAGS:---nonblocking} --subprocesses --threads -f raw -d "$2" -p "$vllm" \
    -o "$out/spy-vllm.txt" > "$out/spy-vllm.log" 2>&1 &
  # The same engine processes again, only the samples whose thread holds the GIL (what waits for it shows as the
  # difference to the files above).
  [ -n "$ours" ] && py-spy record --nonblocking --gil --threads -f raw -d "$2" -p "$ours" \
    -o "$out/spy-ours-gil.txt" > "$out/spy-ours-gil.log" 2>&1 &
  [ -n "$vllm" ] && py-spy record --nonblocking --gil --subprocesses --threads -f raw -d "$2" -p "$vllm" \
    -o "$out/spy-vllm-gil.txt" > "$out/spy-vllm-gil.log" 2>&1 &
  wait
  python3 -m bench.spy_split "$out"/spy-*.txt --top 20 > "$out/spy-split.txt" 2>&1 || true
  # A device call returns at most 8 files: the samples travel as one archive beside their split.
  local samples
  samples=$(cd "$out" && ls spy-*.txt spy-*.log | grep -v '^spy-split.txt$' || true)
  [ -n "$samples" ] && (cd "$out" && tar czf spy.tgz $samples && rm -f $samples) || true
}
# With the host's transparent-huge-page mode (under "always" a fault after a malloc_trim can zero 2 MiB, not 4 KiB)
# and whether it has hardware counters (the rounds' instructions a step, bench/perf_counters.py: a `cpu` PMU).
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
  echo "pmu: $(ls /sys/bus/event_source/devices 2>/dev/null | tr '\n' ' ')paranoid $(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo ?)"
} | tee "$out/gpu.txt"
case "${1:-tests}" in
  tests)  # one device call: SIGINT at ${SUITE_S:-510} s makes pytest stop and still print its summary line
    started=$(date +%s)
    rc=0
    timeout --signal=INT "${SUITE_S:-510}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      -W ignore::pytest.PytestConfigWarning --durations=15 \
      tests/gpu tests/unit/test_engine_compat.py tests/unit/test_poc_cuda.py tests/integration/test_openai_api.py \
      tests/integration/test_poc_artifacts.py tests/integration/test_validation_replay.py \
      tests/integration/test_logprobs_mode.py tests/integration/test_grammar_degradation.py \
      tests/integration/test_pow_api.py tests/integration/test_pow_mining.py tests/integration/test_resilience.py -s \
      --junitxml "$out/gpu-tests.xml" > "$out/gpu-tests.txt" 2>&1 || rc=$?
    grep -vE "^(INFO|WARNING|DEBUG)|^\(EngineCore" "$out/gpu-tests.txt" | tail -150
    echo "gpu suite: exit $rc in $(( $(date +%s) - started )) s"
    exit "$rc"
    ;;
  full-scale)  # the network's model at its real size with vLLM's dummy weights (no disk): FULL="LAYERS TP QUANT
               # CONFIG EXTRA" (default: 94 layers, TP=4, block-FP8, node-config, eager) through bench.network_launch
    read -r layers tp quant config extra <<< "${FULL:-94 4 fp8 node-config --enforce-eager}"
    config_only "$layers" "$quant"
    python3 -m bench.network_launch --model-dir "$dir" --config "$config" --tp "$tp" \
      --extra "--load-format dummy $extra" --timeout-s "${TIMEOUT_S:-420}" --log "$out/full-scale.log" \
      --json "$out/full-scale.json" 2>&1 | quiet | tail -60
    grep -E "KV cache|Available KV|engine_ready|Loading weights|Model loading took|init engine" "$out/full-scale.log" \
      | cut -c1-300 | tail -12
    ;;
  full-poc)  # FULLPOC="LAYERS TP QUANT EXTRA" (default: 94 layers, TP=4, block-FP8): PoC vs the bare forward at
             # batch 8, 16, 32 × 1024 on dummy weights, each batch's own peak memory, with the node's step of 32768
    read -r layers tp quant extra <<< "${FULLPOC:-94 4 fp8}"
    qflag=(); [ "$quant" = fp8 ] && qflag=(--quant fp8)
    tag=$(echo "tp$tp$extra" | tr -cs 'a-zA-Z0-9\n' '-')  # plain characters for the files' names
    free_gpus
    timeout --signal=INT "${TIMEOUT_S:-420}" python3 -m bench.poc_forward --shape qwen3-235b-a22b \
      --num-layers "$layers" "${qflag[@]}" --config-only --model-dir "models/qwen3-235b-a22b-${layers}l-$quant-config-only" \
      --seq-lens 1024 --batches 8 16 32 64 --iters 3 --rounds 3 --max-num-batched-tokens 32768 \
      --gpu-memory-utilization 0.9 --engine-arg=--tensor-parallel-size="$tp" --engine-arg=--enforce-eager $extra \
      --json "$out/full-poc-$tag.json" 2>&1 | tee "$out/full-poc-$tag.log" \
      | grep -E "^L=|^device|kernel_warmup|engine_ready|Error|Traceback" | cut -c1-400 | tee -a "$out/full-poc.txt"
    grep -A40 "^Traceback" "$out/full-poc-$tag.log" | tail -40 || true  # the whole error, where one
    free_gpus
    ;;
  full-serving)
    read -r tp systems requests concurrency extra <<< "${SERVING:-4 ours,vllm 256 128 --enforce-eager --max-warmup-rounds 2}"
    config_only 94 fp8
    free_gpus
    timeout --signal=INT "${TIMEOUT_S:-540}" python3 -m bench.serving --model-dir "$dir" --tensor-parallel-size "$tp" \
      --systems "$systems" \
      --engine-arg=--load-format --engine-arg=dummy --num-requests "$requests" --concurrency "$concurrency" \
      --num-warmup "$concurrency" --max-tokens 64 --max-model-len 8192 --max-num-seqs 256 --max-num-batched-tokens 8192 \
      --gpu-memory-utilization 0.9 $extra --device-note "$(nvidia-smi --query-gpu=name --format=csv,noheader \
      | sort | uniq -c | xargs)" --json "$out/full-serving.json" 2>&1 | quiet | tee "$out/full-serving.txt" | tail -40
    keep_logs full-serving
    # Triton builds after ready (vLLM warns once per kernel) and our warm-up's, in each server's log
    grep -cH "JIT compilation during inference" "$out"/logs-full-serving/*.log || true
    grep -h "kernel_warmup\|engine_ready" "$out"/logs-full-serving/*.log | cut -c1-300 || true
    free_gpus
    ;;
  full-shared)  # FULLSHARED="LAYERS TP QUANT" (default: 94 layers, TP=4, block-FP8): shared mode at its default
                # share on dummy weights: 16 chat streams and a round, each against alone (bench.beside_mining)
    read -r layers tp quant <<< "${FULLSHARED:-94 4 fp8}"
    config_only "$layers" "$quant"
    free_gpus
    timeout --signal=INT "${TIMEOUT_S:-540}" python3 -m bench.beside_mining --part chat --model-dir "$dir" \
      --seq-len 1024 --batch-size 32 --streams 16 --max-tokens 64 --seconds 20 --gpu-memory-utilization 0.9 \
      --backend-arg=--load-format=dummy --backend-arg=--tensor-parallel-size="$tp" --backend-arg=--enforce-eager \
      --json "$out/full-shared-tp$tp.json" 2>&1 | quiet | tail -12 | tee "$out/full-shared.txt"
    tail -c 200000 /tmp/pocserve-bench-beside/backend-shared.log > "$out/full-shared-backend.log" || true
    free_gpus
    ;;
  launch)  # the network's launch on this GPU: LAUNCH="SHAPE LAYERS QUANT CONFIG" (default: the 235B shape at
           # 2 layers, block-FP8, the release-candidate config) through bench.network_launch
    read -r shape layers quant config <<< "${LAUNCH:-qwen3-235b-a22b 2 fp8 release-candidate}"
    dir=models/$shape-${layers}l-$quant
    python3 -m backend.tools.modelgen --out "$dir" --shape "$shape" --num-layers "$layers" \
      $([ "$quant" = fp8 ] && echo --quant fp8) 2>&1 | tail -1
    python3 -m bench.network_launch --model-dir "$dir" --config "$config" --log "$out/launch.log" \
      --json "$out/launch.json" 2>&1 | quiet | tail -60
    ;;
  kernels)  # every FP8 MoE and linear path on the 235B slice (KLAYERS layers, default 12; block-FP8, dummy
            # weights): PoC vs bare at 32 and 64 x 1024, the FP8 peak, 256 nonces' artifacts per path and every
            # pair's L2 and verdicts (bench/kernel_paths.py). KERNELS="NAME:MOE:LINEAR:DEEP_GEMM:E8M0[:TUNED] ..."
            # TUNED: a folder of Triton fused-MoE configs (moe-tune's), given as VLLM_TUNED_CONFIG_FOLDER
    layers=${KLAYERS:-12}
    weights=(--config-only)  # vLLM's dummy weights: for speed; their layers barely move the residual stream, so
    if [ "${KWEIGHTS:-dummy}" = seeded ]; then  # the artifacts' distances between paths need the seeded ones
      dir=models/qwen3-235b-a22b-${layers}l-fp8 weights=()
      python3 -m backend.tools.modelgen --out "$dir" --shape qwen3-235b-a22b --num-layers "$layers" --quant fp8 \
        2>&1 | tail -1
    else
      config_only "$layers" fp8
    fi
    kout=/tmp/kernels-${KWEIGHTS:-dummy}; mkdir -p "$kout"
    # The KV cache PoC leases: two forwards in flight of 64 x 1024 tokens, twice over, at 2 KiB a token and layer.
    # Left to 0.85 of an H100 it took 23.6 GiB and the forwards' activations ran out of memory (2026-12-06).
    kv=${KKV:-$(( layers * 512 ))M}
    echo "nvcc: ${nvcc:-none}  CUDA_HOME: ${CUDA_HOME:-unset}  DeepGEMM staged: $([ -f /tmp/site/.staged-p5 ] && echo yes || echo no)" | tee -a "$out/kernels.txt"
    for spec in ${KERNELS:-triton:triton:auto:0:0 stock:auto:auto:1:1 deepgemm:deep_gemm:deep_gemm:1:0 deepgemm_e8m0:deep_gemm:deep_gemm:1:1}; do
      IFS=: read -r name moe linear dg e8m0 tuned <<< "$spec"
      free_gpus
      echo "== $name: --moe-backend $moe --linear-backend $linear VLLM_USE_DEEP_GEMM=$dg VLLM_USE_DEEP_GEMM_E8M0=$e8m0${tuned:+ VLLM_TUNED_CONFIG_FOLDER=$tuned ($(ls "$tuned" 2>&1 | tr '\n' ' '))}" | tee -a "$out/kernels.txt"
      started=$(date +%s)
      env ${tuned:+VLLM_TUNED_CONFIG_FOLDER=$tuned} VLLM_USE_DEEP_GEMM=$dg VLLM_MOE_USE_DEEP_GEMM=$dg VLLM_USE_DEEP_GEMM_E8M0=$e8m0 VLLM_DEEP_GEMM_WARMUP=skip \
      timeout --signal=INT "${KTIMEOUT_S:-240}" python3 -m bench.poc_forward --shape qwen3-235b-a22b \
        --num-layers "$layers" --quant fp8 "${weights[@]}" --model-dir "$dir" --seq-lens 1024 --batches ${KBATCHES:-32 64} \
        --iters "${KITERS:-2}" --rounds 3 --gpu-memory-utilization 0.85 --engine-arg=--enforce-eager \
        --engine-arg=--kv-cache-memory-bytes="$kv" --engine-arg=--moe-backend="$moe" \
        --engine-arg=--linear-backend="$linear" --engine-arg=--kernel-warmup=off \
        --artifacts-out "$kout/kernels-$name.json" --json "$kout/bench-$name.json" > "$kout/log-$name.txt" 2>&1 \
        || echo "$name: exit $?" | tee -a "$out/kernels.txt"
      grep -E "^L=|^device|Fp8 MoE backend|for Fp8LinearMethod|[Dd]eep[_ ]?[Gg][Ee][Mm][Mm]|poc_graph|Error|error:" \
        "$kout/log-$name.txt" | grep -v "^INFO.*import" | cut -c1-400 | sort -u | head -30 | tee -a "$out/kernels.txt"
      echo "$name: $(( $(date +%s) - started )) s" | tee -a "$out/kernels.txt"
    done
    free_gpus
    ls "$kout"/kernels-*.json >/dev/null 2>&1 && python3 -m bench.kernel_paths "$kout"/kernels-*.json \
      --reference triton --json "$kout/pairs.json" 2>&1 | tee -a "$out/kernels.txt"
    tar czf "$out/kernels.tar.gz" -C "$kout" .
    ;;
  fp8-default)  # the default FP8 kernels on the seeded 235B slice (2 layers): the choice from the log, PoC vs
                # bare, then chat against `vllm serve` on the same kernels (VLLM_USE_DEEP_GEMM_E8M0=0 for both)
    dir=models/qwen3-235b-a22b-2l-fp8
    python3 -m backend.tools.modelgen --out "$dir" --shape qwen3-235b-a22b --num-layers 2 --quant fp8 2>&1 | tail -1
    free_gpus
    timeout 200 python3 -m bench.poc_forward --shape qwen3-235b-a22b --num-layers 2 --quant fp8 --model-dir "$dir" \
      --seq-lens 1024 --batches 32 64 --iters 2 --rounds 3 --gpu-memory-utilization 0.85 --engine-arg=--enforce-eager \
      > "$out/fp8-default-poc.log" 2>&1 || echo "poc: exit $?"
    grep -E "fp8_kernels|Fp8 MoE backend|for Fp8LinearMethod|^L=|^device|Error" "$out/fp8-default-poc.log" | cut -c1-300
    free_gpus
    VLLM_USE_DEEP_GEMM_E8M0=0 timeout "${TIMEOUT_S:-330}" python3 -m bench.serving --model-dir "$dir" \
      --num-requests 256 --concurrency 64 --max-tokens 64 --max-model-len 2048 --max-num-seqs 128 \
      --max-num-batched-tokens 8192 --gpu-memory-utilization 0.85 --enforce-eager --max-warmup-rounds 2 \
      --systems ours,vllm --json "$out/fp8-default-serving.json" 2>&1 | quiet | tail -25
    keep_logs fp8-default
    grep -h "Fp8 MoE backend\|for Fp8LinearMethod" "$out"/logs-fp8-default/*.log | cut -c1-160 | sort | uniq -c || true
    free_gpus
    ;;
  poc-paths)  # poc-paths 0.6b|235b: PoC, the exclusive round's path and the bare forward (bench.poc_forward) with
              # --poc-overlap auto (one GPU: PoC's stream, CUDA graphs) and off (pipelined on chat's stream, eager:
              # the path of TP > 1); 0.6b: 32/64 x 256/1024 and torch.profiler tables; 235b: PLAYERS (default 12)
              # block-FP8 layers, dummy weights, 32 x 1024
    case "${2:-0.6b}" in
      0.6b) shape=(--shape qwen3-0.6b) points=(--seq-lens 256 1024 --batches 32 64 --iters 10) mem=0.6 ;;
      235b) config_only "${PLAYERS:-12}" fp8
            shape=(--shape qwen3-235b-a22b --num-layers "${PLAYERS:-12}" --quant fp8 --config-only --model-dir "$dir")
            points=(--seq-lens 1024 --batches 32 --iters 3) mem=0.85 ;;
      *) echo "poc-paths: unknown part $2 (0.6b, 235b)" >&2; exit 2 ;;
    esac
    for mode in auto off; do
      free_gpus
      prof=(); [ "$2" = 0.6b ] && [ "$mode" = auto ] && prof=(--profile "$out/profile-$2")
      timeout --signal=INT "${PTIMEOUT_S:-240}" python3 -m bench.poc_forward "${shape[@]}" "${points[@]}" --rounds 3 \
        --gpu-memory-utilization "$mem" --engine-arg=--enforce-eager --engine-arg=--kernel-warmup=off \
        --engine-arg=--poc-overlap="$mode" "${prof[@]}" --json "$out/poc-paths-$2-$mode.json" \
        > "$out/poc-paths-$2-$mode.log" 2>&1 || echo "poc-paths $2 $mode: exit $?"
      echo "== $2, --poc-overlap $mode" | tee -a "$out/poc-paths.txt"
      grep -E "^L=|^device|poc_graph|fp8_kernels|Traceback|Error" "$out/poc-paths-$2-$mode.log" | cut -c1-600 \
        | tee -a "$out/poc-paths.txt"
    done
    free_gpus
    ;;
  poc-host)  # the 0.6B shape at 256 x 32 and 64 with --poc-overlap off (the pipelined path of TP > 1): each
              # stage's host and device time (--parts) and cProfile tables of the round path's host work
    free_gpus
    timeout --signal=INT "${PTIMEOUT_S:-240}" python3 -m bench.poc_forward --shape qwen3-0.6b --seq-lens 256 \
      --batches 32 64 --iters 10 --rounds 3 --parts --host-profile "$out/host" --gpu-memory-utilization 0.6 \
      --engine-arg=--enforce-eager --engine-arg=--kernel-warmup=off --engine-arg=--poc-overlap=off \
      --json "$out/poc-host.json" > "$out/poc-host.log" 2>&1 || echo "poc-host: exit $?"
    grep -E "^L=|stage ms|^device|Traceback|Error|poc_triton_direct" "$out/poc-host.log" | cut -c1-700 \
      | tee "$out/poc-host.txt"
    python3 -m bench.triton_launch 2>&1 | tail -3 | tee -a "$out/poc-host.txt"
    python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/unit/test_poc_cuda.py 2>&1 | tail -3 \
      | tee -a "$out/poc-host.txt"
    ;;
  engine-step)  # bench.engine_step on the 0.6B shape: host work per engine step outside the model, this backend's
                # engine loop against `vllm serve`'s engine core and vLLM's LLMEngine.step (ENGINE_STEP="REQUESTS
                # TOKENS", default 64 128; ESYSTEMS, default vllm-core,ours; EFLAGS: more backend flags, e.g.
                # "--poc-overlap off"; ETAG names the files; EARRIVALS: bench.engine_step --arrivals). The step log
                # (bench/step_log.py) gives vLLM's own phases at equal batch in both engines, in the same layout.
    read -r esr est <<< "${ENGINE_STEP:-64 128}"
    free_gpus
    timeout --signal=INT "${TIMEOUT_S:-400}" python3 -m bench.engine_step --model-dir models/qwen3-0.6b \
      --shape qwen3-0.6b --requests "$esr" --tokens "$est" --systems "${ESYSTEMS:-vllm-core,ours}" \
      --arrivals "${EARRIVALS:-0}" --step-log "$(mktemp -d)" \
      --json "$out/engine-step-$esr${ETAG:-}.json" -- --gpu-memory-utilization 0.4 --max-model-len 2048 ${EFLAGS:-} \
      > "$out/engine-step-$esr${ETAG:-}.log" 2>&1 || echo "engine-step: exit $?"
    quiet < "$out/engine-step-$esr${ETAG:-}.log" | tail -25 | tee "$out/engine-step-$esr${ETAG:-}.txt"
    free_gpus
    ;;
  archs)  # archs [SHAPE,...]: tests/integration/test_architectures.py on the CUDA engine (default: MiniMax-M2, which
          # vLLM's CPU build cannot run)
    POCSERVE_TEST_ARCHS=${2:-tiny-minimax-m2} timeout --signal=INT "${SUITE_S:-400}" python3 -m pytest -q \
      -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning tests/integration/test_architectures.py \
      -s > "$out/archs.txt" 2>&1 || echo "archs: exit $?"
    grep -vE "^(INFO|WARNING|DEBUG)|^\(EngineCore" "$out/archs.txt" | grep -E "L2|passed|failed|Error|assert|^E " \
      | cut -c1-400 | tail -60
    ;;
  bench-poc)
    python3 -m bench.poc_forward --shape qwen3-0.6b --seq-lens 256 1024 --batches 32 64 --iters 10 \
      --gpu-memory-utilization 0.6 --parts --json "$out/poc_forward.json" 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" \
      | tee "$out/poc_forward.txt"
    python3 -m bench.mining --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --seconds 20 --shared \
      --gpu-memory-utilization 0.5 --json "$out/mining.json" 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" \
      | tail -5 | tee "$out/mining.txt"
    ;;
  bench-serving) bench_serving ;;
  bench-beside) bench_beside ;;
  round) bench_serving; bench_beside ;;
  overlap)  # RUNS="MODE:SHARE[:GRAPHS[:FLIGHT]] ..." (default: auto:0.5 off:0.5; GRAPHS sets POCSERVE_POC_GRAPHS,
            # default 1; FLIGHT POCSERVE_POC_FORWARDS_IN_FLIGHT, default 2); TESTS=0 skips the tests
    for run in ${RUNS:-auto:0.5 off:0.5}; do
      IFS=: read -r mode share graphs flight <<< "$run"
      graphs=${graphs:-1}; flight=${flight:-2}
      tag=$mode-$share; [ "$graphs" != 1 ] && tag=$tag-graphs_$graphs; [ "$flight" != 2 ] && tag=$tag-flight_$flight
      rm -f /tmp/pocserve-bench-beside/backend-shared.log
      echo "run $run: POCSERVE_POC_GRAPHS=$graphs POCSERVE_POC_FORWARDS_IN_FLIGHT=$flight" | tee -a "$out/overlap.txt"
      POCSERVE_POC_GRAPHS=$graphs POCSERVE_POC_FORWARDS_IN_FLIGHT=$flight \
      python3 -m bench.beside_mining --part chat --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --streams 16 \
        --max-tokens 128 --seconds 15 --chat-share "$share" --gpu-memory-utilization 0.5 \
        --backend-arg=--poc-overlap --backend-arg="$mode" --backend-arg=--log-level --backend-arg=debug \
        --json "$out/overlap-$tag.json" 2>&1 | quiet \
        | tail -9 | tee -a "$out/overlap.txt" || echo "overlap run $run failed" | tee -a "$out/overlap.txt"
      { grep -hE "poc_graph" /tmp/pocserve-bench-beside/backend-shared.log | head -4; grep -hE "engine_ready|poc_streams|poc_batch_failed|Error" /tmp/pocserve-bench-beside/backend-shared.log | tail -5; } \
        | cut -c1-600 > "$out/overlap-$tag-backend.txt" || true
      python3 - "$out/overlap-$tag-backend.txt" <<'PY' || true  # the engine thread's host time per launch
import re, statistics, sys
rows = [(m.group(1), float(m.group(2))) for m in (re.search(r"beside_chat=(\w+) .*?host_ms=([\d.]+)", line)
        for line in open("/tmp/pocserve-bench-beside/backend-shared.log")) if m]
with open(sys.argv[1], "a") as out:
    for beside in ("True", "False"):
        ms = sorted(v for b, v in rows if b == beside)
        if ms:
            print(f"launch host ms, beside_chat={beside}: n={len(ms)} p50={statistics.median(ms):.2f} "
                  f"p90={ms[int(0.9 * (len(ms) - 1))]:.2f} max={ms[-1]:.2f}", file=out)
PY
    done
    if [ "${TESTS:-1}" = 1 ]; then
      python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/integration/test_pow_mining.py \
        -k "overlapped or layerwise or shared_round or shared_mode_serves" -s --junitxml "$out/overlap-tests.xml" 2>&1 | quiet \
        | tail -15 | tee "$out/overlap-tests.txt"
    fi
    ;;
  bursts)  # RUNS="TREE:SHARE ..." (default .:0.6): 16-stream bursts to an idle node, without a round and during one
           # (0.6B). TREE: this tree (.) or a directory holding another tree of the project, for a before/after pair
           # in one lease (e.g. git archive of the commit before, carried under .stage/)
    abs_out=$(cd "$out" && pwd)
    for run in ${RUNS:-.:0.6}; do
      IFS=: read -r tree share <<< "$run"
      tag=$(basename "$(cd "$tree" && pwd)")-$share
      [ "$tree" != . ] && [ ! -e "$tree/models" ] && ln -s "$PWD/models" "$tree/models"
      echo "bursts $run" | tee -a "$out/bursts.txt"
      rm -f /tmp/pocserve-bench-beside/backend-shared.log
      (cd "$tree" && PYTHONPATH=/tmp/site:$PWD python3 -m bench.beside_mining --part bursts --shape qwen3-0.6b \
        --seq-len 1024 --batch-size 32 --streams 16 --max-tokens 128 --chat-share "$share" \
        --gpu-memory-utilization 0.5 --json "$abs_out/bursts-$tag.json" ${BURSTS_ARGS:-}) 2>&1 | quiet | tail -6 \
        | tee -a "$out/bursts.txt" || echo "bursts run $run failed" | tee -a "$out/bursts.txt"
      # With --backend-arg=--log-level --backend-arg=debug in BURSTS_ARGS: the paced forwards' layer time and dry count
      grep -h "poc_paced" /tmp/pocserve-bench-beside/backend-shared.log 2>/dev/null \
        | tail -3 | cut -c1-300 | tee -a "$out/bursts.txt" || true
    done
    ;;
  soak)  # bench.soak on the 0.6B shape: RSS slope per process after warm-up (SOAK_S seconds, default 600)
    python3 -m bench.soak --shape qwen3-0.6b --model-dir models/qwen3-0.6b --seconds "${SOAK_S:-600}" \
      --json "$out/soak.json" 2>&1 | quiet | tail -30 | tee "$out/soak.txt"
    ;;
  heap-split)  # bench.soak_split on the 0.6B shape: the soak's variants side by side (SPLIT, default all), each
               # with its own stack on 0.12 of the GPU, SOAK_S seconds (default 360): the engine's heap slope of each
    python3 -m bench.soak_split --shape qwen3-0.6b --model-dir models/qwen3-0.6b --seconds "${SOAK_S:-360}" \
      ${SPLIT:+--variants "$SPLIT"} ${MEMRAY:+--memray "$MEMRAY"} --backend-arg=--gpu-memory-utilization=0.12 \
      --backend-arg=--kv-cache-memory-bytes=2G --out "$out/split" 2>&1 | quiet | tail -20 | tee "$out/split.txt"
    find "$out" -name "*.memray" -delete  # read here into leaks.txt; its native frames resolve only on this machine
    ;;
  op-leak)  # seconds: builds bench/op_leak.cpp (g++, ninja) and calls each op 200k times
    python3 -m bench.op_leak --json "$out/op_leak.json" 2>&1 | quiet | tee "$out/op_leak.txt"
    ;;
  moe-tune)  # the file lands in $out/moe-configs, for VLLM_TUNED_CONFIG_FOLDER; MOETUNE_BUDGET (s) stops it before
             # the next batch size, MOETUNE_BATCHES="M,M,..." picks them (and their order)
    read -r n space <<< "${MOETUNE:-1536 small}"
    python3 -m bench.moe_tune --intermediate "$n" --space "${space:-small}" --out "$out/moe-configs" \
      ${MOETUNE_BUDGET:+--budget-s "$MOETUNE_BUDGET"} ${MOETUNE_BATCHES:+--batch-sizes "$MOETUNE_BATCHES"} \
      --json "$out/moe_tune.json" 2>&1 | quiet | tee "$out/moe_tune.txt"
    ;;
  soak-start)  # the soak (or SOAK_MODE, e.g. heap-split) in its own session, outliving this call (10 minutes and
               # the start exceed one call's limit); `soak-collect` in the next call, on the same machine, waits
    mkdir -p /tmp/soak-out
    # the run writes its own pid: soak-collect waits on it (a pgrep on the command would match the caller's own)
    OUT=/tmp/soak-out setsid nohup bash -c 'echo $$ > /tmp/soak-out/soak.pid; exec bash scripts/gpu_check.sh "$0"' \
      "${SOAK_MODE:-soak}" > /tmp/soak-out/run.log 2>&1 < /dev/null &
    sleep "${WAIT_S:-30}"; tail -5 /tmp/soak-out/run.log
    ;;
  soak-collect)  # waits COLLECT_S at most (default 540, inside one call); still running, it returns what is there
    pid=$(cat /tmp/soak-out/soak.pid 2>/dev/null || true); waited=0
    while [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null && [ "$waited" -lt "${COLLECT_S:-540}" ]; do
      sleep 5; waited=$((waited + 5))
    done
    [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null && echo "soak-collect: still running after $waited s (collect again)"
    cp -r /tmp/soak-out/. "$out/"; tail -30 "$out/run.log"
    # With POCSERVE_HEAP_PROFILE_S given to soak-start: the engine's heap_profile lines (backend/core/heap_profile.py)
    work=$(python3 -c "import json; print(json.load(open('$out/soak.json'))['config']['work_dir'])" 2>/dev/null || true)
    [ -n "$work" ] && grep -h "heap_profile" "$work/backend.log" > "$out/heap_profile.log" 2>/dev/null || true
    # heap-split's stacks: each backend's heap_profile lines, then every log cut to its tail (what comes back)
    for log in "$out"/split/*/work/backend.log; do
      [ -f "$log" ] && grep -hE "heap_profile|kernel_warmup|JIT compilation|engine_ready" "$log" \
        > "$(dirname "$(dirname "$log")")/key_lines.log" || true
    done
    find "$out" -name "*.log" -size +1M -exec sh -c 'tail -c 200000 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
    ;;
  startup)  # startup [SHAPE...] (default: qwen3-0.6b tiny-moe)
    shift; shapes=("$@"); [ ${#shapes[@]} -eq 0 ] && shapes=(qwen3-0.6b tiny-moe)
    python3 -X importtime -c "import backend.engine.adapter, backend.processor.build" 2> "$out/importtime.txt"
    for shape in "${shapes[@]}"; do
      python3 -m bench.startup --shape "$shape" --runs 2 --json "$out/startup-$shape.json" 2>&1 | quiet \
        | tee -a "$out/startup.txt"
    done
    ;;
  poc-parts)  # poc-parts LAYERS none|fp8
    layers=${2:-1}; quant=${3:-none}
    dir=models/q235-${layers}l-$quant
    qflag=(); [ "$quant" = fp8 ] && qflag=(--quant fp8)
    python3 -m bench.poc_forward --shape qwen3-235b-a22b --num-layers "$layers" "${qflag[@]}" --model-dir "$dir" \
      --seq-lens 1024 --batches 32 64 --iters 5 --gpu-memory-utilization 0.8 --parts \
      --profile "$out/profile-$quant-${layers}l" --json "$out/poc-parts-$quant-${layers}l.json" 2>&1 | quiet \
      | grep -E "^L=|^device|stage ms|Error" | tee -a "$out/poc-parts.txt"
    ;;
  fused-norm)  # A/B in one call: each --poc-overlap mode with the fusion on and off, back to back
    python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/unit/test_poc_cuda.py -s 2>&1 | quiet \
      | grep -E "passed|failed|error|equal|Error|assert|H=" | tail -30 | tee "$out/fused-norm.txt"
    grep -q " failed\| error" "$out/fused-norm.txt" && exit 1
    # FUSED_ORDER: the settings in turn (a repeat gets its own files); FUSED_MODES; FUSED_POINTS (bench.poc_forward's
    # --seq-lens/--batches); FUSED_PARTS=1 adds --parts (each stage's host and device time).
    read -ra points <<< "${FUSED_POINTS:---seq-lens 256 1024 --batches 32 64}"
    parts=(); [ "${FUSED_PARTS:-0}" = 1 ] && parts=(--parts)
    for mode in ${FUSED_MODES:-auto off}; do
      run=0
      for fused in ${FUSED_ORDER:-1 0}; do
        free_gpus
        run=$((run + 1)); tag="$fused-$mode-$run"
        POCSERVE_POC_FUSED_NORM=$fused timeout --signal=INT "${PTIMEOUT_S:-130}" python3 -m bench.poc_forward \
          --shape qwen3-0.6b "${points[@]}" --iters 10 --rounds 3 "${parts[@]}" \
          --gpu-memory-utilization 0.6 --engine-arg=--enforce-eager --engine-arg=--kernel-warmup=off \
          --engine-arg=--poc-overlap="$mode" --json "$out/fused-$tag.json" > "$out/fused-$tag.log" \
          2>&1 || echo "fused-norm $tag: exit $?"
        echo "== POCSERVE_POC_FUSED_NORM=$fused, --poc-overlap $mode (run $run)" | tee -a "$out/fused-norm.txt"
        grep -E "^L=|stage ms|^device|Traceback|Error" "$out/fused-$tag.log" | cut -c1-700 | tee -a "$out/fused-norm.txt"
      done
    done
    # FUSED_ARTIFACTS=1 (default): 256 nonces at 1024 with the fusion on and off, then their L2 and the
    # validator's verdict each way (bench/kernel_paths.py): what the norm's other summation order changes.
    if [ "${FUSED_ARTIFACTS:-1}" = 1 ]; then
      aout=/tmp/fused-artifacts; mkdir -p "$aout"
      for fused in 0 1; do
        free_gpus
        POCSERVE_POC_FUSED_NORM=$fused timeout --signal=INT "${PTIMEOUT_S:-130}" python3 -m bench.poc_forward \
          --shape qwen3-0.6b --seq-lens 1024 --batches 32 --iters 1 --rounds 1 --gpu-memory-utilization 0.6 \
          --engine-arg=--enforce-eager --engine-arg=--kernel-warmup=off --artifacts-out "$aout/kernels-fused$fused.json" \
          > "$out/fused-artifacts-$fused.log" 2>&1 || echo "fused-norm artifacts $fused: exit $?"
      done
      python3 -m bench.kernel_paths "$aout"/kernels-fused*.json --reference fused0 --json "$out/fused-pairs.json" \
        2>&1 | tee -a "$out/fused-norm.txt"
    fi
    free_gpus
    ;;
  moe-golden)
    python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu/test_gpu_artifacts.py -k large -s \
      2>&1 | quiet | tee "$out/moe-golden.txt"
    ;;
  topologies)  # topologies PART [LAYERS]: the multi-GPU runs, one part per device call (docs/benchmarks.md)
    part=${2:-all}; layers=${3:-4}
    gpus=$(nvidia-smi -L | wc -l)
    tops=(tp1 tp2 pp2); widest=2
    [ "$gpus" -ge 4 ] && tops+=(tp4 tp2xpp2) && widest=4
    case "$part" in
      dense|moe-bf16|moe-fp8|serving|tests|all) ;;
      *) echo "topologies: unknown part $part" >&2; exit 2 ;;
    esac
    # Eager engines: the PoC forward runs eagerly either way (backend/engine/pocworker/forward.py); the starts skip
    # compilation.
    topo() { python3 -m bench.topologies --topologies "${tops[@]}" --nonces 256 --seq-len 1024 --enforce-eager \
      --gpu-memory-utilization 0.8 "$@" 2>&1 | quiet | tee -a "$out/topologies.txt"; }
    case "$part" in dense|all) topo --shape qwen3-0.6b --json "$out/topologies-0.6b.json" ;; esac
    case "$part" in moe-bf16|all) topo --shape qwen3-235b-a22b --num-layers "$layers" \
      --json "$out/topologies-235b-none.json" ;; esac
    case "$part" in moe-fp8|all) topo --shape qwen3-235b-a22b --num-layers "$layers" --quant fp8 \
      --json "$out/topologies-235b-fp8.json" ;; esac
    case "$part" in serving|all)
      # Compiled on both sides, as nodes run. Where NVLink multicast is off, vLLM's fused all-reduce + RMSNorm
      # dies in the profiling forward (docs/decisions.md): our backend turns it off itself (--allreduce-fusion
      # auto), and bench.serving gives `vllm serve` the same decision. EAGER=1 runs both eager, as on 2026-11-25
      # (late night); SYSTEMS=vllm,ours runs `vllm serve` first.
      mode=(); if [ "${EAGER:-0}" = 1 ]; then mode=(--enforce-eager); fi
      extra=(--ours-arg=--log-level --ours-arg=info)  # info: its allreduce_fusion_off line
      python3 -m bench.serving "${mode[@]}" "${extra[@]}" --systems "${SYSTEMS:-ours,vllm}" \
        --shape qwen3-235b-a22b --num-layers "$layers" \
        --model-dir "models/qwen3-235b-a22b-${layers}l" --tensor-parallel-size "$widest" --num-requests 256 \
        --concurrency 32 --max-tokens 128 --max-model-len 2048 --max-num-seqs 64 --max-num-batched-tokens 8192 \
        --gpu-memory-utilization 0.8 --json "$out/serving-tp$widest.json" 2>&1 | quiet | tail -14 \
        | tee -a "$out/topologies.txt"
      keep_logs "serving-tp$widest"
      grep -h "allreduce_fusion" "$out/logs-serving-tp$widest"/ours-backend.log | tee -a "$out/topologies.txt" || true
      ;;
    esac
    case "$part" in tests|all)
      python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu/test_tensor_parallel.py \
        tests/integration/test_parallel.py tests/integration/test_multinode.py -s \
        --junitxml "$out/topology-tests.xml" 2>&1 | quiet | tee "$out/topology-tests.txt" ;;
    esac
    ;;
  bench-moe)  # bench-moe LAYERS none|fp8: one quantization per call (generating the weights takes minutes)
    layers=${2:-1}; quant=${3:-none}
    dir=models/q235-${layers}l-$quant
    qflag=(); [ "$quant" = fp8 ] && qflag=(--quant fp8)
    started=$(date +%s)
    python3 -m backend.tools.modelgen --out "$dir" --shape qwen3-235b-a22b --num-layers "$layers" "${qflag[@]}" \
      2>&1 | tail -1
    echo "generated $dir in $(( $(date +%s) - started )) s" | tee -a "$out/moe-$quant.txt"
    python3 -m bench.poc_forward --shape qwen3-235b-a22b --num-layers "$layers" "${qflag[@]}" --model-dir "$dir" \
      --seq-lens 1024 --batches 32 64 --iters 5 --gpu-memory-utilization 0.8 --json "$out/moe-poc-$quant.json" \
      2>&1 | quiet | grep -E "^L=|^device|Error" | tee -a "$out/moe-$quant.txt"
    for systems in ours,vllm ours; do  # the second "ours" start finds the compile caches of the first
      python3 -m bench.serving --shape qwen3-235b-a22b --num-layers "$layers" "${qflag[@]}" --model-dir "$dir" \
        --systems "$systems" --num-requests 256 --concurrency 32 --max-tokens 128 --max-model-len 2048 \
        --max-num-seqs 64 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.8 \
        --json "$out/moe-serving-$quant-${systems/,/-}.json" 2>&1 | quiet | tail -14 | tee -a "$out/moe-$quant.txt"
      keep_logs "moe-$quant-${systems/,/-}"
    done
    ;;
  bench-serving-rounds)  # bench-serving-rounds [none|custom-ops]: bench-serving's load, both servers kept up,
                         # rounds A,B,B,A,... (bench/rounds.py); SIGINT at TIMEOUT_S still prints the pairs done.
                         # EXTRA adds bench.serving flags (e.g. EXTRA="--min-tokens 64": spread lengths, lead (a)).
                         # SPY_S (where py-spy is staged): both servers' processes sampled by py-spy for SPY_S s
                         # from the first round on (spy-ours.txt, spy-vllm.txt: collapsed stacks, busy samples only;
                         # -gil.txt: GIL holders only; all in spy.tgz), split by thread and function in spy-split.txt
                         # (bench/spy_split.py); SPY_FLAGS=--native: with C frames. The servers' logs: logs-TAG.tgz
                         # RMODEL="235b LAYERS": the 235B shape's block-FP8 slice, dummy weights, on both servers.
                         # 12 pairs: the H200's scatter of 2026-12-02 needs ~11 for a ±5% interval (bench/rounds.py)
    control=${2:-none}
    case "$control" in
      none) vflags=() ;;
      custom-ops) vflags=(--vllm-arg=--compilation-config '--vllm-arg={"custom_ops":["all"]}') ;;  # lead (b)
      *) echo "bench-serving-rounds: unknown control $control (none, custom-ops)" >&2; exit 2 ;;
    esac
    read -r rshape rlayers <<< "${RMODEL:-0.6b}"
    case "$rshape" in
      0.6b) model=(--shape qwen3-0.6b --model-dir models/qwen3-0.6b) ;;
      235b)  # both servers on the same block-FP8 kernels; DeepGEMM's JIT warm-up would take the call's minutes
        config_only "${rlayers:-8}" fp8
        model=(--model-dir "$dir" --engine-arg=--load-format --engine-arg=dummy --max-model-len 8192)
        export VLLM_DEEP_GEMM_WARMUP=skip VLLM_USE_DEEP_GEMM_E8M0=0 ;;
      *) echo "bench-serving-rounds: unknown RMODEL $RMODEL (0.6b, 235b LAYERS)" >&2; exit 2 ;;
    esac
    free_gpus
    name=serving-rounds-${TAG:-$control}  # TAG names this call's files (e.g. one per load, EXTRA="--request-rate 90")
    log=$out/$name.log
    [ -n "${SPY_S:-}" ] && spy "$log" "$SPY_S" &
    timeout --signal=INT "${TIMEOUT_S:-450}" python3 -m bench.serving "${model[@]}" \
      --num-requests "${NREQ:-512}" --concurrency 64 --max-tokens 128 --max-num-seqs 256 \
      --max-num-batched-tokens 8192 --gpu-memory-utilization 0.4 --rounds "${ROUNDS:-12}" --max-warmup-rounds 4 \
      --settle-s 3 "${vflags[@]}" ${EXTRA:-} --device-note "$(nvidia-smi --query-gpu=name --format=csv,noheader)" \
      --json "$out/$name.json" > "$log" 2>&1 || echo "bench.serving: exit $? (130: cut by TIMEOUT_S)"
    wait
    quiet < "$log" | tail -60 | tee "$out/$name.txt"
    keep_logs "$name"
    # One archive for the servers' logs: with py-spy's (spy.tgz, spy-split.txt) the call stays within 8 files.
    tar czf "$out/logs-$name.tgz" -C "$out" "logs-$name" && rm -r "${out:?}/logs-$name" || true
    free_gpus
    ;;
  prefill-window)  # prefill-window: ours' --prefill-window-ms at each of WINDOWS, each against `vllm serve`
    # Each window's run starts both servers again: ~100 s each on a fresh machine (cold compile caches, 2026-12-07:
    # 240 s left the first window one round), ~60 s once warm; three pairs take ~100 s more.
    for w in ${WINDOWS:-0 20}; do
      EXTRA="--request-rate ${RATE:-60} --step-log --ours-arg=--prefill-window-ms=$w ${EXTRA:-}" \
        TAG="open${RATE:-60}-window$w" ROUNDS="${ROUNDS:-3}" TIMEOUT_S="${TIMEOUT_S:-290}" \
        bash "$0" bench-serving-rounds none | grep -E "^(pair|  (requests/s|TPOT p50|TTFT p50|e2e p50|prefill))" \
        || true
    done
    # Within the 8 files a call brings back: the summaries as they are, the rest in one archive.
    tar czf "$out/prefill-window.tgz" -C "$out" $(cd "$out" && ls serving-rounds-*.json serving-rounds-*.log \
      logs-serving-rounds-*.tgz 2>/dev/null) && rm -f "$out"/serving-rounds-*.json "$out"/serving-rounds-*.log \
      "$out"/logs-serving-rounds-*.tgz
    ;;
  forward-cost)  # the io thread's forwarding of the processor's deltas, measured by taking most of it away
    # The processor sends the deltas every FLUSH_EVERY engine steps (and when idle) instead of every step: a patch of
    # the device's copy only, reverted after (not a setting: it delays every stream). The step log then says whether
    # ours' engine thread blocks less a step and spends less outside vLLM's phases (docs/benchmarks-history.md,
    # 2026-12-07 (night)). Cold servers take ~100 s to start: TIMEOUT_S 330 holds 3 pairs.
    patch=bench/experiments/processor-flush-every.patch
    git apply "$patch" || { echo "forward-cost: $patch no longer applies to backend/processor/main.py"; exit 1; }
    EXTRA="--request-rate ${RATE:-60} --step-log --ours-env POCSERVE_EXPERIMENT_FLUSH_EVERY=${FLUSH_EVERY:-8} ${EXTRA:-}" \
      TAG="open${RATE:-60}-flush${FLUSH_EVERY:-8}" ROUNDS="${ROUNDS:-3}" TIMEOUT_S="${TIMEOUT_S:-330}" \
      bash "$0" bench-serving-rounds none || true
    git apply -R "$patch"
    ;;
esac
