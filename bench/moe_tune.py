"""Tile configs for vLLM's Triton fused MoE where vLLM ships none: block-FP8 experts of one GPU's shape.

    python -m bench.moe_tune --experts 128 --intermediate 1536 --hidden 4096 --topk 8 --out moe-configs

vLLM 0.26 picks the Triton MoE kernel's tiles per batch size from a JSON file named by the experts, the
intermediate size per GPU (N), the device and the quantization (`get_config_file_name`), first in
VLLM_TUNED_CONFIG_FOLDER, then in its own `fused_moe/configs/`. For the network's Qwen3-235B-A22B-FP8 it ships H200
files for N=768 and 384 (TP=2 and 4), none for N=1536 (one GPU) or 192 (TP=8), and falls back to one heuristic
config ("Using default MoE config"). This times vLLM's own `fused_experts` (both GEMMs, the activation's
quantisation, the sum over top-k) under `override_config` for each candidate in `search_space` at each batch size,
on random FP8 weights with 128 × 128 block scales, and writes the fastest per batch size under that file name. Each
candidate is timed as a CUDA graph of `--iters` calls, the GPU's time alone, as a graphed decode step runs it; the
default config is timed alike, for the gain, and is a candidate itself: where no tile beats it, the file keeps it.
Compiling a candidate takes Triton about a second, and at PoC's token counts timing one takes as long again:
`--budget-s` bounds a run, trying the likely tiles of each batch first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

# vLLM's batch-size grid for its shipped files (a decode step's token counts, then prefill chunks), then PoC's:
# fused_experts takes the whole forward as M (no chunking), 32-64 nonces x 1024 tokens, and vLLM uses the nearest
# key, so without these a PoC forward runs on the tiles tuned for 4096 tokens.
BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096,
               8192, 16384, 32768, 65536)


def search_space(block_shape: tuple[int, int], size: str = "small") -> list[dict[str, int]]:
    """Candidate tiles. The N and K tiles divide the quantisation block (the kernel reads one scale per block);
    `small` drops the rarely-best corners (GROUP_SIZE_M 32, 5 stages)."""
    block_n, block_k = block_shape
    groups, stages = ((1, 16, 64), (3, 4)) if size == "small" else ((1, 16, 32, 64), (3, 4, 5))
    out = []
    for m, n, k, g, w, s in itertools.product((16, 32, 64, 128), (64, 128), (64, 128), groups, (4, 8), stages):
        if block_n % n or block_k % k or (size == "small" and k != block_k):
            continue
        out.append({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": g, "num_warps": w,
                    "num_stages": s})
    return out


def likely_first(space: list[dict[str, int]], m: int, experts: int, topk: int) -> list[dict[str, int]]:
    """The candidates in the order worth trying at batch m, so that a search cut by the budget has tried the likely
    winners: BLOCK_SIZE_M nearest the tokens each expert gets (m x topk / experts, a power of two in 16..128), then
    the wider N tile. Only the order changes, never the set."""
    per_expert = max(1, m * topk // experts)
    want = min(128, max(16, 1 << (per_expert - 1).bit_length()))
    return sorted(space, key=lambda c: (abs(math.log2(c["BLOCK_SIZE_M"] / want)), -c["BLOCK_SIZE_N"]))


def iters_for(m: int, iters: int) -> int:
    """Calls per CUDA graph at batch m: fewer at PoC's token counts, where one call is tens of milliseconds and a
    graph of ten, replayed four times per candidate, made one batch size outlast a device call (2026-12-06, H100:
    a run cut at 250 s had not finished M=32768's 96 candidates); at least 2, so a graph still times back-to-back
    calls."""
    return max(2, min(iters, iters * 2048 // m))


def best_per_batch(timings: dict[int, list[tuple[float, dict[str, int]]]]) -> dict[int, dict]:
    """The fastest config per batch size, of (microseconds, config) pairs; failed candidates are left out before."""
    return {m: min(pairs, key=lambda p: p[0])[1] for m, pairs in sorted(timings.items()) if pairs}


def config_file(best: dict[int, dict], triton_version: str) -> str:
    """The JSON vLLM reads: batch size to config, and the Triton version it was tuned with (vLLM drops that key)."""
    body: dict[str, object] = {"triton_version": triton_version}
    body.update({str(m): cfg for m, cfg in sorted(best.items())})
    return json.dumps(body, indent=4) + "\n"


def vllm_default_config(experts: int, intermediate: int, hidden: int, topk: int, block: tuple[int, int],
                        m: int) -> dict[str, int]:
    """The tiles vLLM itself picks at batch m without a tuned file (its shipped file where one exists, else its
    heuristic), as the kernel's config dict."""
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    w1_shape, w2_shape = (experts, 2 * intermediate, hidden), (experts, hidden, intermediate)
    return dict(try_get_optimal_moe_config(w1_shape, w2_shape, topk, "fp8_w8a8", m, list(block)))


class Problem:
    """One layer's experts in block FP8 and a batch's routing: what `fused_experts` is timed on."""

    def __init__(self, experts: int, intermediate: int, hidden: int, topk: int, block: tuple[int, int]):
        import torch
        from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

        fp8 = torch.float8_e4m3fn
        self.experts, self.hidden, self.topk = experts, hidden, topk
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.w1 = (torch.randn(experts, 2 * intermediate, hidden, device="cuda", generator=gen) * 0.05).to(fp8)
        self.w2 = (torch.randn(experts, hidden, intermediate, device="cuda", generator=gen) * 0.05).to(fp8)
        bn, bk = block
        self.w1_scale = torch.rand(experts, -(-2 * intermediate // bn), -(-hidden // bk), device="cuda",
                                   generator=gen) * 0.01 + 0.001
        self.w2_scale = torch.rand(experts, -(-hidden // bn), -(-intermediate // bk), device="cuda",
                                   generator=gen) * 0.01 + 0.001
        self.quant = fp8_w8a8_moe_quant_config(w1_scale=self.w1_scale, w2_scale=self.w2_scale, block_shape=list(block))

    def inputs(self, m: int):
        import torch

        gen = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, self.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        logits = torch.randn(m, self.experts, device="cuda", generator=gen)
        weights, ids = torch.softmax(logits, dim=-1).topk(self.topk, dim=-1)
        return x, weights.float(), ids.to(torch.int32)

    def call(self, x, weights, ids):
        from vllm.model_executor.layers.fused_moe import fused_experts

        return fused_experts(x, self.w1, self.w2, weights, ids, quant_config=self.quant)


def time_config(problem: Problem, m: int, config: dict | None, iters: int) -> float:
    """Microseconds per call of `fused_experts` at batch m under config (None: vLLM's own pick), as a CUDA graph
    of `iters` calls replayed three times; the first call outside compiles the kernels."""
    import torch
    from vllm.model_executor.layers.fused_moe import override_config

    x, weights, ids = problem.inputs(m)
    with override_config(config):
        problem.call(x, weights, ids)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                problem.call(x, weights, ids)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (3 * iters)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=1536, help="the experts' intermediate size on one GPU (N)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--block", default="128,128", help="the weights' quantisation block, N,K")
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--space", choices=("small", "full"), default="small")
    p.add_argument("--iters", type=int, default=10, help="calls per CUDA graph")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop once this many seconds have passed: the batch size in progress keeps the best of the "
                        "candidates tried (the likely ones come first), the file keeps the batch sizes done (vLLM "
                        "takes the nearest one)")
    p.add_argument("--out", type=Path, required=True, help="a folder for VLLM_TUNED_CONFIG_FOLDER")
    p.add_argument("--json", help="every timing, to this file")
    args = p.parse_args(argv)
    import torch
    import triton
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    block_n, block_k = (int(v) for v in args.block.split(","))
    block = (block_n, block_k)
    batch_sizes = [int(v) for v in args.batch_sizes.split(",") if v]
    space = search_space(block, args.space)
    problem = Problem(args.experts, args.intermediate, args.hidden, args.topk, block)
    name = get_config_file_name(args.experts, args.intermediate, "fp8_w8a8", list(block))
    print(f"{torch.cuda.get_device_name()}: {name}, {len(space)} candidates x {len(batch_sizes)} batch sizes",
          flush=True)
    timings: dict[int, list[tuple[float, dict[str, int]]]] = {}
    rows, started = [], time.monotonic()

    def spent() -> bool:
        return args.budget_s is not None and time.monotonic() - started > args.budget_s

    for m in batch_sizes:
        iters = iters_for(m, args.iters)
        default_us = time_config(problem, m, None, iters)
        # vLLM's own pick competes: on an H100 (2026-12-06) no tile of the space beat it at M=32768 or 65536, and
        # the file's slower M=65536 tile made the 64 x 1024 PoC forward 15% slower than no file at all.
        default_cfg = vllm_default_config(args.experts, args.intermediate, args.hidden, args.topk, block, m)
        timings[m] = [(default_us, default_cfg)]
        tried = 0
        for cfg in likely_first(space, m, args.experts, args.topk):
            if spent() and tried:
                break
            tried += 1
            try:
                timings[m].append((time_config(problem, m, cfg, iters), cfg))
            except Exception as e:  # out of shared memory or registers for this tile: not a candidate here
                print(f"  M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        best_us, best_cfg = min(timings[m], key=lambda t: t[0])
        kept = best_cfg == default_cfg
        rows.append({"batch": m, "default_us": round(default_us, 2), "best_us": round(best_us, 2), "best": best_cfg,
                     "default": default_cfg, "default_kept": kept, "tried": tried, "candidates": len(space)})
        print(f"M={m:5d}  default {default_us:9.1f} us  best {best_us:9.1f} us  gain {default_us / best_us:5.2f}x  "
              f"{'vLLM default kept ' if kept else ''}{best_cfg}  ({tried}/{len(space)} tried, "
              f"{time.monotonic() - started:.0f} s)", flush=True)
        # Written after every batch size: a run cut short (a device call's limit) still leaves a usable file.
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / name).write_text(config_file(best_per_batch(timings), triton.__version__))
        if args.json:
            Path(args.json).write_text(json.dumps({"file": name, "rows": rows}, indent=1))
        if spent() and m != batch_sizes[-1]:
            print(f"budget of {args.budget_s:.0f} s spent: stopped after M={m}")
            break
    print(f"wrote {args.out / name} ({len(rows)} batch sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
