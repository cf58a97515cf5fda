#!/usr/bin/env bash
# Stages vLLM 0.26's vendored DeepGEMM (vllm/third_party/deep_gemm: its host library for Python 3.12, its CUTLASS and
# CuTe headers, kernels compiled at run time by nvcc) as .stage/p5, which the GPU bundle leaves out (it strips the
# folder from vLLM's Python code). scripts/gpu_check.sh unpacks it where present. Needs the vLLM wheel the bundle
# downloaded (GPU_STAGE_CACHE, default ~/.cache/gpu-stage). Usage, from the repo root, once the bundle is built:
#   bash scripts/stage_deep_gemm.sh      # ~1.5 MB: carry .stage/p5 with a small part (p3, p4)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${GPU_STAGE_CACHE:-$HOME/.cache/gpu-stage}
wheel=$(ls "$cache"/vllm-0.26.0-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no vLLM 0.26.0 wheel in $cache: build the GPU bundle first" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
prefix = "vllm/third_party/deep_gemm/"
# The GPU machines run Python 3.12: the other Pythons' host libraries are most of the folder's size.
names = [n for n in z.namelist() if n.startswith(prefix) and not (n.endswith(".so") and "cpython-312" not in n)]
z.extractall(sys.argv[2], names)
PY
mkdir -p .stage/p5
(cd "$tmp" && tar cf - vllm | xz -9 -T0 > "$OLDPWD/.stage/p5/deep_gemm.tar.xz")
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || echo '/.stage/' >> .git/info/exclude
du -sh .stage/p5
