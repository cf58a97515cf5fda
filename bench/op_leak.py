"""Host bytes a custom op leaves allocated per call: which eager op grows the engine's native heap.

    python -m bench.op_leak [--calls 200000] [--ops stable-str,stable-int,kv-cache-update,cuda-copy] [--json F]

Each op runs `--calls` times after a warm-up; glibc's bytes in use (mallinfo2) before and after give bytes per
call. An op that frees what it allocates reads ~0; a per-call leak reads its size in glibc chunks (a heap
std::string of 32 bytes is a 48-byte chunk). Found with a memray window on the chat soak (docs/reliability.md,
section 4):

- stable-str, stable-int: bench/op_leak.cpp, built here by torch's cpp_extension (a C++ compiler and ninja): one
  op of libtorch's stable ABI with a `str` argument, one without. Whether the installed torch's stable headers
  leak the string on every call (pytorch/pytorch#191340, fixed in torch 2.14).
- kv-cache-update (CUDA): vLLM's own reshape_and_cache_flash, which takes `str kv_cache_dtype`, on a tiny cache.
  Whether the installed vLLM build carries that leak (vllm-project/vllm#51185 patched its copy of the header for
  builds against torch 2.13); cuda-copy is a plain aten op of the same size, for the launch's own cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from backend.core.heap_profile import bytes_per_call
from backend.engine.leak_check import kv_cache_write

HERE = Path(__file__).resolve().parent


def stable_ops() -> dict[str, Callable[[], object]]:
    """bench/op_leak.cpp built against the installed torch and loaded: its two ops, on a CPU tensor."""
    import torch
    from torch.utils import cpp_extension

    build = tempfile.mkdtemp(prefix="op-leak-")
    cpp_extension.load(name="pocserve_op_leak", sources=[str(HERE / "op_leak.cpp")], build_directory=build,
                       is_python_module=False)
    x, ops = torch.zeros(1), torch.ops.pocserve_op_leak
    return {"stable-str": lambda: ops.with_str(x, "auto"), "stable-int": lambda: ops.without_str(x, 4)}


def cuda_ops() -> dict[str, Callable[[], object]]:
    """vLLM's KV-cache write as the engine's start-up check calls it (backend/engine/leak_check.py), and a plain
    copy of the same size."""
    import torch

    key = torch.randn(4, 2, 64, device="cuda", dtype=torch.bfloat16)
    scratch = torch.empty_like(key)
    return {"kv-cache-update": kv_cache_write(torch.device("cuda")), "cuda-copy": lambda: scratch.copy_(key)}


STABLE_OPS, CUDA_OPS = ("stable-str", "stable-int"), ("kv-cache-update", "cuda-copy")


def build_ops(names: list[str]) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The ops asked for, and for each that could not be built, why."""
    ops: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    for builder, provides in ((stable_ops, STABLE_OPS), (cuda_ops, CUDA_OPS)):
        wanted = [n for n in names if n in provides]
        if not wanted:
            continue
        try:
            built = builder()
        except Exception as e:  # no compiler, no ninja, no GPU: say so and measure the others
            errors.update({n: f"{type(e).__name__}: {str(e)[:300]}" for n in wanted})
            continue
        ops.update({n: built[n] for n in wanted})
    return ops, errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--ops", help="comma-separated (default: the stable pair, and the CUDA pair where a GPU is)")
    p.add_argument("--json", help="the figures, to this file")
    args = p.parse_args(argv)
    if args.ops:
        names = [n for n in args.ops.split(",") if n]
    else:
        import torch

        names = [*STABLE_OPS, *(CUDA_OPS if torch.cuda.is_available() else ())]
    known = STABLE_OPS + CUDA_OPS
    if unknown := [n for n in names if n not in known]:
        p.error(f"unknown ops {unknown}; known: {', '.join(known)}")
    ops, errors = build_ops(names)
    rows = []
    for name in names:
        if name in errors:
            rows.append({"op": name, "error": errors[name]})
            print(f"{name:16s} not measured: {errors[name]}")
            continue
        per_call = bytes_per_call(ops[name], args.calls)  # a launch's host memory is taken at the launch: no sync
        rows.append({"op": name, "calls": args.calls, "bytes_per_call": round(per_call, 2)})
        print(f"{name:16s} {per_call:8.2f} B/call  ({per_call * args.calls / 2**20:.2f} MB over {args.calls} calls)")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "ops": rows}, indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
