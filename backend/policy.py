"""What the engine thread does next: a pure function of a frozen snapshot, tested as a decision table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    # vLLM has unfinished requests (running, waiting or with a step in flight).
    has_engine_work: bool
    # PoC artifact batches are queued.
    has_poc_work: bool = False
    # PoC batches run since the last engine step.
    num_poc_since_step: int = 0
    # How many PoC batches may run per engine step while both compete (the PoC share).
    poc_batches_per_step: int = 1
    # The last PoC batch found no free KV blocks: let an engine step free some first.
    is_poc_blocked: bool = False


@dataclass(frozen=True)
class EngineStep:
    """Run one vLLM engine step."""


@dataclass(frozen=True)
class PocBatch:
    """Run one PoC forward (one batch of the oldest queued artifact job) on leased KV blocks."""


@dataclass(frozen=True)
class Idle:
    """Nothing to do: block on the inbox."""


Work = EngineStep | PocBatch | Idle


def choose(s: Snapshot) -> Work:
    poc_ready = s.has_poc_work and not (s.is_poc_blocked and s.has_engine_work)
    if poc_ready and (not s.has_engine_work or s.num_poc_since_step < s.poc_batches_per_step):
        return PocBatch()
    if s.has_engine_work:
        return EngineStep()
    return Idle()
