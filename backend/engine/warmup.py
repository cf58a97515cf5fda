"""The kernel warm-up: the model run once at each step size whose kernels would otherwise compile at a first chat.

vLLM's fused-MoE Triton kernel picks its tiles from the tokens in a step, M: from a tuned table keyed by vLLM's
tuning batch sizes, or from defaults that change at M = 4, 8, 16, 32, 64, 96 and 512. Triton builds one binary per
tile configuration and per specialisation of its integer arguments (M × top-k divisible by 16 or not: M even or
odd). vLLM's own warm-up runs one size eager (max_num_batched_tokens) and, compiled, its CUDA graph sizes, so every
other configuration is built at the first chat step that meets it: on the 235B shape at TP=4, `vllm serve`'s "Triton
kernel JIT compilation during inference: fused_moe_kernel" warning and TTFT p99 of 4-6 s in its first rounds
(docs/benchmarks-history.md). Running the model at each tuning size and its odd neighbour pays that before ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# vLLM's MoE tuning batch sizes (the keys of its tuned config tables); above them, powers of two.
TUNING_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


def warmup_sizes(max_tokens: int) -> list[int]:
    """Token counts to run, largest first (the allocator reaches its peak in the first run): every tuning size,
    the powers of two above them, the odd neighbour of each, and max_tokens itself, all ≤ max_tokens."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    bases = list(TUNING_SIZES)
    while bases[-1] < max_tokens:
        bases.append(bases[-1] * 2)
    sizes = {n for b in bases for n in (b, b + 1) if n <= max_tokens} | {max_tokens}
    return sorted(sizes, reverse=True)


def wanted(mode: str, device_type: str, is_moe: bool) -> bool:
    """--kernel-warmup: on, off, or auto = MoE models (vLLM's ModelConfig.is_moe) on CUDA (the CPU engine compiles
    no Triton kernels)."""
    return mode == "on" or (mode == "auto" and device_type == "cuda" and is_moe)


def counting_triton_builds() -> tuple[Callable[[], int], Callable[[], None]]:
    """Counts Triton kernel builds until restored, in place of vLLM's JIT monitor hook: the builds of the warm-up
    are expected, and vLLM warns only once per kernel name, so they would hide a later miss."""
    try:
        from triton import knobs  # type: ignore[import-untyped,unused-ignore]
        previous = knobs.runtime.jit_post_compile_hook
    except (ImportError, AttributeError):  # no Triton (the CPU build), or one without the hook: nothing to count
        return (lambda: 0), (lambda: None)
    builds = [0]

    def count(**_kwargs: Any) -> None:
        builds[0] += 1

    knobs.runtime.jit_post_compile_hook = count

    def restore() -> None:
        knobs.runtime.jit_post_compile_hook = previous

    return (lambda: builds[0]), restore


class KernelWarmupExtension:
    """Worker-side half (collective_rpc runs it on every rank at once, so the runs' collectives pair up)."""

    model_runner: Any

    def warm_up_kernels(self, sizes: list[int]) -> dict[str, float]:
        import torch
        started = time.perf_counter()
        builds, restore = counting_triton_builds()
        try:
            with torch.inference_mode():
                for n in sizes:
                    self.model_runner._dummy_run(n, skip_eplb=True)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        finally:
            restore()
        return {"runs": len(sizes), "triton_builds": builds(), "elapsed_s": time.perf_counter() - started}
