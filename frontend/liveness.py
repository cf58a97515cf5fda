"""The frontend's verdict on its backend from pongs, missed pings and the connection (backend_client.py acts on it).

Down has two speeds. A lost connection (frontend/handshakes.py: the backend's process ended, or its network went
silent past the ZMTP heartbeat timeout) is down at once. Pings unanswered while the connection stays up mean the
backend's process lives but its Python does not answer: its engine thread can hold the GIL for seconds in a native
call (a kernel's JIT compile stalled every stream for 1.5 s+ on an H100, docs/decisions.md). Such a backend is busy:
its streams and new requests wait, up to `busy_s`, before it counts as hung and down.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


@dataclass
class Liveness:
    address: str
    timeout_s: float
    busy_s: float
    breaker_misses: int
    last_pong: float = 0.0
    misses: int = 0
    # Since when a connected backend has left pings unanswered (None: it answers, or is not connected).
    busy_since: float | None = None
    # Busy spells so far, and the seconds of those that ended (exported on /metrics: frontend/metrics.py).
    num_busy: int = 0
    busy_s_ended: float = 0.0

    @property
    def is_busy(self) -> bool:
        return self.busy_since is not None

    @property
    def is_breaker_open(self) -> bool:
        return self.misses >= self.breaker_misses

    def busy_seconds(self, now: float) -> float:
        """Seconds spent busy so far, the current spell included."""
        return self.busy_s_ended + (now - self.busy_since if self.busy_since is not None else 0.0)

    def end_busy(self, now: float) -> None:
        """The spell ends: the backend answered, or it is down."""
        if self.busy_since is not None:
            self.busy_s_ended += now - self.busy_since
            self.busy_since = None

    def on_pong(self, now: float) -> None:
        self.last_pong = now
        if self.misses:
            log.info("backend_reachable", after_misses=self.misses)
        if self.busy_since is not None:
            log.info("backend_answering", after_s=round(now - self.busy_since, 2))
            self.end_busy(now)
        self.misses = 0

    def on_miss(self, now: float, *, is_alive: bool, is_connected: bool, num_streams: int) -> bool:
        """A ping went unanswered; True where a backend counted alive is now down (its streams fail)."""
        silent_s = now - self.last_pong
        if is_alive and is_connected and silent_s <= self.busy_s:
            # Its process lives (libzmq answers the heartbeats) but its Python is held up: streams wait for it.
            if self.busy_since is None:
                self.busy_since = self.last_pong
                self.num_busy += 1
                log.warning("backend_busy", address=self.address, silent_s=round(silent_s, 2),
                            streams=num_streams, waits_up_to_s=self.busy_s)
            return False
        self.misses += 1
        is_down = is_alive and silent_s > self.timeout_s
        if is_down:
            log.warning("backend_unreachable", address=self.address, silent_s=round(silent_s, 2))
        if self.misses == self.breaker_misses:
            log.warning("backend_breaker_open", misses=self.misses)
        return is_down
