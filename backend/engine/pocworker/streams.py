"""Where a PoC forward runs beside chat's steps on one GPU: streams, priorities and an SM partition.

Stream priority alone does not protect chat: the GPU dispatches a high-priority kernel's blocks first only as SMs
free up, and the PoC forward's GEMMs and attention are persistent kernels (one block per SM for the whole kernel),
so each of a decode step's few hundred small kernels waited for a PoC kernel to end (H100, 0.6B shape, 16 streams:
TPOT 2.3 → 32 ms, docs/benchmarks-history.md). So a forward launched while chat runs goes to a green context holding
only PoC's share of the SMs (`poc_sms`), and cuBLAS is told the same count (its SM-count target), leaving the rest to
chat whatever PoC runs. A forward launched while chat is idle takes every SM (the device would idle otherwise);
while chat may come back soon it is paced, and moves to PoC's SMs when chat does (pacing.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

# Green contexts split SMs in groups (8 on Hopper); PoC's count is rounded down to a whole group.
SM_GROUP = 8


def poc_sms(total_sms: int, chat_share: float) -> int | None:
    """SMs a forward beside chat may use: the (1 − chat_share) part of `total_sms`, in whole groups, at least one
    group and leaving chat at least one; None where nothing is split (share 0: chat waits for PoC anyway; share
    1: PoC never starts beside chat)."""
    if chat_share <= 0.0 or chat_share >= 1.0:
        return None
    groups = total_sms // SM_GROUP
    return SM_GROUP * min(max(1, int(groups * (1.0 - chat_share))), groups - 1) if groups > 1 else None


@dataclass
class PocStreams:
    """The streams of one worker's PoC forwards (CUDA)."""

    # Every SM, lowest priority: forwards launched while chat is idle.
    alone: torch.cuda.Stream
    # PoC's SMs only: forwards launched beside chat (the `alone` stream where no partition could be made).
    beside: torch.cuda.Stream
    # Every SM, chat's priority: a finished forward's artifacts, computed while the next forward runs.
    collect: torch.cuda.Stream
    # SMs cuBLAS leaves free while a forward beside chat launches (0: none).
    carveout: int = 0
    description: dict = field(default_factory=dict)
    _green: Any = None  # the green context; its stream lives only as long as it does

    def for_launch(self, is_chat_running: bool) -> tuple[torch.cuda.Stream, int]:
        return (self.beside, self.carveout) if is_chat_running else (self.alone, 0)


def prepare(device: torch.device, chat_share: float) -> PocStreams:
    """Moves this thread's (chat's) work to a highest-priority stream and makes PoC's streams."""
    low, high = torch.cuda.Stream.priority_range()
    torch.cuda.synchronize(device)  # nothing of chat's may still run on the stream it leaves
    # vLLM tracks the current stream through torch.cuda.set_stream (vllm.utils.torch_utils.current_stream); its
    # CUDA graphs replay on whatever stream is current, with that stream's priority.
    torch.cuda.set_stream(torch.cuda.Stream(device, priority=high))
    alone = torch.cuda.Stream(device, priority=low)
    collect = torch.cuda.Stream(device, priority=high)
    total = torch.cuda.get_device_properties(device).multi_processor_count
    sms = poc_sms(total, chat_share)
    description: dict = {"total_sms": total, "poc_sms_beside_chat": sms}
    if sms is None:
        return PocStreams(alone, alone, collect, 0, description)
    try:
        from torch.cuda.green_contexts import GreenContext

        green = GreenContext.create(num_sms=sms, device_id=device.index or 0)
        beside = green.Stream()
        description["partition"] = "green_context"
        return PocStreams(alone, beside, collect, total - sms, description, green)
    except Exception as e:  # torch or the driver without green contexts: cuBLAS's target still holds
        description["partition"] = f"cublas_only ({type(e).__name__}: {e})"[:300]
        return PocStreams(alone, alone, collect, total - sms, description)


@contextmanager
def cublas_carveout(sms: int) -> Iterator[None]:
    """cuBLAS GEMMs launched inside leave `sms` SMs free (torch's SM carveout, read per GEMM call)."""
    if not sms:
        yield
        return
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(previous)
