"""The mining round: its configuration, nonce iterator and stats (no I/O, no engine; the loop drives it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from poc.nonces import NonceIterator
from poc.spec import PocSpec
from protocol.pow import NodeIdentity

log = structlog.get_logger(__name__)

PROGRESS_INTERVAL_S = 5.0


@dataclass(frozen=True)
class RoundSpec:
    node: NodeIdentity
    poc: PocSpec
    group_id: int
    n_groups: int
    batch_size: int
    # Callback base URL; None: artifacts are computed and counted, not delivered.
    url: str | None


@dataclass
class MiningRound:
    """One /init/generate round: hands out nonce batches and counts what was processed."""

    spec: RoundSpec
    clock: Callable[[], float] = time.monotonic
    total_processed: int = 0
    num_artifacts: int = 0
    started_at: float = field(init=False)
    _nonces: NonceIterator = field(init=False)
    _last_log_at: float = field(init=False)
    _last_log_processed: int = 0

    def __post_init__(self) -> None:
        self.started_at = self._last_log_at = self.clock()
        s = self.spec
        self._nonces = NonceIterator(s.node.node_id, s.node.node_count, s.group_id, s.n_groups)

    def next_batch(self) -> list[int]:
        return self._nonces.take(self.spec.batch_size)

    def record(self, num_processed: int, num_artifacts: int) -> None:
        """NaN-dropped nonces count as processed (as in the fork): they were computed, not skipped."""
        self.total_processed += num_processed
        self.num_artifacts += num_artifacts
        now = self.clock()
        if now - self._last_log_at >= PROGRESS_INTERVAL_S:
            rate = (self.total_processed - self._last_log_processed) / (now - self._last_log_at)
            log.info("poc_round_progress", total_processed=self.total_processed, nonces_per_s=round(rate, 1),
                     num_artifacts=self.num_artifacts, block_height=self.spec.node.block_height)
            self._last_log_at, self._last_log_processed = now, self.total_processed

    @property
    def nonces_per_second(self) -> float:
        elapsed = self.clock() - self.started_at
        return self.total_processed / elapsed if elapsed > 0 else 0.0
