"""Who is on the other end of the ROUTER: last-seen times per peer identity and the rule that declares one lost.

libzmq gives a ROUTER no usable notice when a DEALER peer dies (a SIGKILLed frontend just stops sending), so
liveness is inferred from traffic: frontends ping every 0.5 s, and a peer silent for longer than `timeout_s` is
forgotten. Owned by the io thread; the clock is injected so the rule is tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# A sweep runs at most this long after a peer crossed the timeout (and at least 4 times per timeout).
_MAX_SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class FrontendLost:
    """Inbox event from the io thread to the loop (never on the wire): this peer went silent and was forgotten."""

    # The name from its Hello; "" for a peer that never said Hello (a probe, a test client).
    frontend_id: str
    silent_s: float


class PeerTable:
    """Last-seen monotonic time of every peer; `sweep` forgets and returns the silent ones. timeout_s=0: never."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.sweep_interval_s = min(_MAX_SWEEP_INTERVAL_S, timeout_s / 4)
        self._clock = clock
        self._last_seen: dict[bytes, float] = {}
        self._swept_at = clock()

    def __len__(self) -> int:
        return len(self._last_seen)

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._last_seen))

    def __contains__(self, identity: bytes) -> bool:
        return identity in self._last_seen

    def seen(self, identity: bytes) -> None:
        self._last_seen[identity] = self._clock()

    def is_sweep_due(self) -> bool:
        return self.timeout_s > 0 and self._clock() - self._swept_at >= self.sweep_interval_s

    def sweep(self) -> list[tuple[bytes, float]]:
        """Forgets every peer silent for longer than the timeout; returns them as (identity, silent_s)."""
        now = self._swept_at = self._clock()
        if self.timeout_s <= 0:
            return []
        lost = [(identity, now - at) for identity, at in self._last_seen.items() if now - at > self.timeout_s]
        for identity, _ in lost:
            del self._last_seen[identity]
        return lost
