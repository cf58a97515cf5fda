#!/usr/bin/env bash
# Serving benchmark across commits, for bisecting a regression on a GPU machine in one lease.
#
#   bash scripts/bench_commits.sh prepare SHA...      # here: one source tree per commit under .bisect/
#                                                     # (HEAD's bench/ in each, so the load is the same)
#   bash scripts/bench_commits.sh run TREE...         # on the GPU machine (after .stage/p1/install.sh):
#                                                     # bench.serving --systems ours in each tree; the tree
#                                                     # name "vllm" runs `vllm serve` once instead
# Same flags as `scripts/gpu_check.sh bench-serving`. One model directory is shared by every tree. With
# PYSPY=TREE, py-spy samples that tree's backend during its timed load (needs the py-spy wheel in .whl/).
# Results: $OUT/bisect-<tree>-<run>.json and .txt.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    shift
    mkdir -p .git/info .bisect
    grep -qx '/.bisect/' .git/info/exclude 2>/dev/null || echo '/.bisect/' >> .git/info/exclude
    for c in "$@"; do
      t=.bisect/$(git rev-parse --short "$c")
      rm -rf "$t"; mkdir -p "$t"
      git archive "$c" backend frontend protocol poc sampling pyproject.toml | tar -x -C "$t"
      rm -rf "$t/bench"; git archive HEAD bench | tar -x -C "$t"
      echo "$t"
    done
    ;;
  run)
    shift
    mkdir -p "${OUT:-gpu-out}"; out=$(cd "${OUT:-gpu-out}" && pwd)
    export VLLM_USE_V2_MODEL_RUNNER=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
    [ -n "${PYSPY:-}" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl
    # BENCH_FLAGS replaces these (a smoke test on CPU: BENCH_FLAGS="--num-requests 8 --concurrency 4").
    default="--shape qwen3-0.6b --model-dir /tmp/models/qwen3-0.6b --num-requests 512 --concurrency 64
      --max-tokens 128 --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.5"
    # shellcheck disable=SC2206  # word splitting wanted
    flags=(${BENCH_FLAGS:-$default})
    for tree in "$@"; do
      if [ "$tree" = vllm ]; then dir=.bisect/$(ls .bisect | head -1); systems=vllm; else dir=.bisect/$tree; systems=ours; fi
      run=1; while [ -e "$out/bisect-$tree-$run.txt" ]; do run=$((run + 1)); done  # a tree may run twice
      log="$out/bisect-$tree-$run.txt"
      if [ "${PYSPY:-}" = "$tree" ] && [ "$run" = 1 ]; then
        ( until grep -q "\[ours\] load:" "$log" 2>/dev/null; do sleep 0.5; done
          pid=$(pgrep -f pocserve-backend | head -1)  # setproctitle renames the backend
          /tmp/pyspy/bin/py-spy record --nonblocking --threads --rate 250 --duration "${PYSPY_S:-6}" --format raw \
            -o "$out/pyspy-$tree-$run.txt" --pid "$pid" > "$out/pyspy-$tree-$run.log" 2>&1 ) &
        watcher=$!
      fi
      echo "=== $tree ($systems)"
      (cd "$dir" && PYTHONPATH=/tmp/site:$PWD timeout 400 "${PYTHON:-python3}" -m bench.serving "${flags[@]}" --systems "$systems" \
         --json "$out/bisect-$tree-$run.json" 2>&1 | grep --line-buffered -vE "^(INFO|WARNING|DEBUG)" > "$log") || echo "$tree failed"
      grep -E "requests/s|TPOT p50|TTFT p50|startup|servers CPU|error" "$log" || tail -5 "$log"
      # A bench that failed before its load never prints the line the watcher waits for.
      [ -n "${watcher:-}" ] && { sleep "${PYSPY_S:-6}"; kill "$watcher" 2>/dev/null || true; watcher=; }
    done
    ;;
  *) echo "usage: $0 prepare SHA... | run TREE..." >&2; exit 2 ;;
esac
