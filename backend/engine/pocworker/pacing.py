"""Paced PoC forwards: how much of a forward started while chat is idle may be queued ahead on every SM.

A forward launched while chat is idle runs on every SM (streams.py), and its kernels are persistent: a chat request
that arrives meanwhile gets SMs only as each PoC kernel ends, so its prefill waited for whatever PoC had queued,
up to two whole forwards (~85 ms each at 32 x 1024 on an H200, 0.6B shape: TTFT p50 28 → 123 ms in 16-stream
bursts, docs/benchmarks-history.md). A paced forward is queued a layer at a time, never more than AHEAD_S of device work
ahead of the GPU (by the layer time measured on the forwards' own events, an event per layer); the moment chat
arrives, chat's step is queued, and the rest of the forward goes onto PoC's share of the SMs (extension.py
`_unpace`). So a request waits for about AHEAD_S (one layer at least) for PoC's work on every SM. Measured on an
H200 with 16-stream bursts: TTFT p50 during a round 116 → 44-47 ms (idle 38-44), p99 +114 → +8/+25 ms over idle,
PoC during the bursts 0.92-0.94x today's, artifacts bit-identical.

Pacing costs host time (eager layers, no CUDA graph), so a forward whose whole device time is within AHEAD_S is
not paced: it cannot hold a request longer than the bound anyway.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

# Device work a paced forward keeps queued ahead: the longest a request arriving while chat was idle waits for it.
# Above the engine thread's poll interval (1 ms) plus a layer's host time (~0.5 ms eager), so the GPU seldom waits
# for the next layer: on an H200 (0.6B shape, 32 x 1024, ~3 ms a layer) 5 ms kept PoC alone at 362-364 nonces/s
# against 375 with whole graphs, and 10 ms at 372 with 16-stream bursts' TTFT p99 +43 ms in one of two runs
# (docs/benchmarks-history.md). POCSERVE_POC_PACED_AHEAD_MS sets it (benchmarks).
AHEAD_S = float(os.environ.get("POCSERVE_POC_PACED_AHEAD_MS", "5")) / 1000
# Layers queued ahead before a shape's layer time is known.
FIRST_AHEAD_LAYERS = 2
# Weight of each new measurement in a shape's layer time.
_SMOOTHING = 0.3


@dataclass
class _Chunk:
    key: Hashable  # the forward's shape
    layers: int
    event: Any  # a timing CUDA event recorded after the chunk's last kernel
    # The chunk was queued while the one before it still ran: the time between their events is this chunk's own.
    back_to_back: bool


class Pacer:
    """One worker's paced chunks in flight (oldest first) and the layer time of each forward shape."""

    def __init__(self, new_event: Callable[[], Any], ahead_s: float = AHEAD_S) -> None:
        self._new_event = new_event
        self.ahead_s = ahead_s
        self._pending: deque[_Chunk] = deque()
        self._last_done: _Chunk | None = None
        self.layer_s: dict[Hashable, float] = {}
        # Times a paced forward found nothing of PoC's queued on the GPU: it had run dry (a measure of pacing's cost).
        self.num_dry = 0

    def is_worth_pacing(self, key: Hashable, num_layers: int) -> bool:
        """A forward of this shape is paced: its shape's time is unknown yet, or longer than the bound."""
        layer_s = self.layer_s.get(key)
        return layer_s is None or layer_s * num_layers > self.ahead_s

    def layers_to_queue(self, key: Hashable) -> int:
        """Layers of a forward of shape `key` that may be queued now (0: the GPU has enough ahead)."""
        self._retire()
        layer_s = self.layer_s.get(key)
        ahead = FIRST_AHEAD_LAYERS if layer_s is None else max(1, math.ceil(self.ahead_s / layer_s))
        self.num_dry += not self._pending
        return max(0, ahead - sum(c.layers for c in self._pending))

    def queued(self, key: Hashable, layers: int, stream) -> None:
        """`layers` more layers of a forward of shape `key` were queued on `stream`."""
        if layers <= 0:
            return
        back_to_back = bool(self._pending) and not self._pending[-1].event.query()
        event = self._new_event()
        event.record(stream)
        self._pending.append(_Chunk(key, layers, event, back_to_back))

    def clear(self) -> None:
        """Forgets the chunks in flight (the forwards were dropped after a failure)."""
        self._pending.clear()
        self._last_done = None

    def _retire(self) -> None:
        while self._pending and self._pending[0].event.query():
            chunk = self._pending.popleft()
            before = self._last_done
            if chunk.back_to_back and before is not None and before.key == chunk.key:
                seconds = before.event.elapsed_time(chunk.event) / 1000 / chunk.layers
                old = self.layer_s.get(chunk.key)
                self.layer_s[chunk.key] = seconds if old is None else old + _SMOOTHING * (seconds - old)
            self._last_done = chunk
