"""The histogram of tokens per engine iteration (`vllm:iteration_tokens_total`), with vLLM's buckets.

Both backend processes keep one: the processor for chat steps (from vLLM's IterationStats), the engine thread
for PoC batches, so the series moves on every unit of GPU work (the ML node reads it as a heartbeat).
"""

from __future__ import annotations

import bisect

from protocol.common import TokenHistogram

# vLLM's buckets for vllm:iteration_tokens_total.
ITERATION_TOKEN_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class IterationHistogram:
    def __init__(self) -> None:
        # Per-bucket counts, the last one for +Inf.
        self.counts = [0] * (len(ITERATION_TOKEN_BOUNDS) + 1)
        self.sum = 0
        self.count = 0

    def observe(self, num_tokens: int) -> None:
        self.counts[bisect.bisect_left(ITERATION_TOKEN_BOUNDS, num_tokens)] += 1
        self.sum += num_tokens
        self.count += 1

    def snapshot(self) -> TokenHistogram:
        return TokenHistogram(bounds=[float(b) for b in ITERATION_TOKEN_BOUNDS], counts=list(self.counts),
                              sum=float(self.sum), count=self.count)
