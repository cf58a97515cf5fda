"""Whether this build's KV-cache write leaks host memory on every eager call: measured at start, warned in the log.

vLLM's CUDA builds against torch before 2.14 carry a leak in libtorch's stable ABI: each call of an op with a `str`
argument copies the string to the heap and never frees it (pytorch/pytorch#191340). The chat path's one such op
is the attention backend's KV-cache write, `reshape_and_cache_flash(..., kv_cache_dtype: str, ...)`, called once
per attention layer for every step that runs attention outside a CUDA graph: on an H200 it held a third to two
thirds of the chat soak's heap growth (docs/reliability.md, section 4; docs/decisions.md, "The chat path's heap
growth is a leak in vLLM's build"). Which builds carry it is not a version question alone (vllm-project/vllm#51185
patched vLLM's copy of the header for torch 2.13), so each CUDA worker calls the installed op on a tiny cache of its
own and reads glibc's bytes in use (bench/op_leak.py measures the same op and its controls, in depth).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from backend.core.heap_profile import bytes_per_call, malloc_in_use_bytes

log = structlog.get_logger(__name__)

CALLS = 20_000  # ~0.1 s of launches; a leak of one 48-byte chunk a call reads ~1 MB, far above a start's noise
# A leaked std::string of up to 15 characters is a 32-byte object, a 48-byte glibc chunk; a clean op reads ~0.
LEAKS_AT_BYTES = 16.0


def leaks(readings: list[float]) -> bool:
    """A leak only if every reading says so: another thread's allocation during one reading cannot fake it."""
    return bool(readings) and min(readings) >= LEAKS_AT_BYTES


def kv_cache_write(device) -> Callable[[], object]:
    """vLLM's KV-cache write as its flash-attention backend calls it, on a [blocks, block, heads, head] cache."""
    import torch
    from vllm import _custom_ops

    tokens, heads, head_size, blocks, block_size = 4, 2, 64, 4, 16
    key = torch.randn(tokens, heads, head_size, device=device, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    key_cache = torch.zeros(blocks, block_size, heads, head_size, device=device, dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.arange(tokens, device=device, dtype=torch.int64)
    scale = torch.ones((), device=device, dtype=torch.float32)
    return lambda: _custom_ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "auto", scale,
                                                        scale)


def measure(op: Callable[[], object], calls: int = CALLS, readings: int = 2) -> dict:
    """Bytes per call of op, `readings` times, and the verdict; why not, where it cannot be measured."""
    if malloc_in_use_bytes() is None:
        return {"measured": False, "reason": "no glibc mallinfo2"}
    per_call = [round(bytes_per_call(op, calls), 2) for _ in range(readings)]
    return {"measured": True, "bytes_per_call": per_call, "calls": calls, "leaks": leaks(per_call)}


def report(done: list[dict]) -> None:
    """One log line from every rank's reading: a warning where any rank's build leaks."""
    measured = [d for d in done if d.get("measured")]
    if not measured:
        log.info("kv_write_leak_check", measured=False, reason=done[0].get("reason") if done else "no rank")
        return
    worst = max(min(d["bytes_per_call"]) for d in measured)
    if any(d["leaks"] for d in measured):
        log.warning("kv_write_leaks", bytes_per_call=worst, torch=measured[0].get("torch"),
                    effect="host memory grows with every attention layer of every step outside a CUDA graph",
                    cure="vLLM built against torch >= 2.14 or with vllm-project/vllm#51185",
                    docs="docs/reliability.md, section 4")
    else:
        log.info("kv_write_leak_check", measured=True, bytes_per_call=worst, leaks=False)


class LeakCheckExtension:
    """Worker-side half: every rank measures its own process (each leaks on its own heap)."""

    def kv_write_leak(self) -> dict:
        import torch

        device = torch.device(self.device)  # type: ignore[attr-defined]  # vLLM's Worker: a device or its name
        if device.type != "cuda":
            return {"measured": False, "reason": f"{device.type}: the check is for vLLM's CUDA ops"}
        try:
            op = kv_cache_write(device)
            op()
            torch.cuda.synchronize(device)
        except Exception as e:  # a build without the op or another signature: say so, the start goes on
            return {"measured": False, "reason": f"{type(e).__name__}: {str(e)[:200]}"}
        return {**measure(op), "torch": torch.__version__}
