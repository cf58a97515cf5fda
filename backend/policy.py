"""What the engine thread does next: a pure function of a frozen snapshot, tested as a decision table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    # vLLM has unfinished requests (running, waiting or with a step in flight).
    has_engine_work: bool


@dataclass(frozen=True)
class EngineStep:
    """Run one vLLM engine step."""


@dataclass(frozen=True)
class Idle:
    """Nothing to do: block on the inbox."""


Work = EngineStep | Idle


def choose(s: Snapshot) -> Work:
    if s.has_engine_work:
        return EngineStep()
    return Idle()
