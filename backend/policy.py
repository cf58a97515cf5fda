"""What the engine thread does next: a pure function of a frozen snapshot, tested as a decision table.

When chat and PoC work compete, chat keeps its share of the device (`share.py` keeps the account): PoC runs only
once its credit buys an efficient forward (pow/cost.py: at most a fifth of its time fixed overhead), and then as
many sequences as the credit buys. With chat idle, PoC runs whole forwards back to back; with nothing to run, the
loop blocks on its inbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.pow.cost import Cost


@dataclass(frozen=True)
class Snapshot:
    # vLLM has unfinished requests (running, waiting or with a step in flight).
    has_engine_work: bool
    # PoC artifact work is queued (jobs or a round's batch).
    has_poc_work: bool = False
    # The last PoC forward found no free KV blocks: let an engine step free some first.
    is_poc_blocked: bool = False
    # Seconds of PoC the chat share allows now, while both compete.
    poc_credit_s: float = 0.0
    # What the next PoC forward costs, learned (None: none of its seq_len ran yet), and the most sequences it takes.
    poc_cost: Cost | None = None
    poc_max_batch: int = 0


@dataclass(frozen=True)
class EngineStep:
    """Run one vLLM engine step."""


@dataclass(frozen=True)
class PocBatch:
    """Run one PoC forward of the next artifact task on leased KV blocks."""

    # At most this many sequences; None: a whole forward (as many as the engine takes at once).
    limit: int | None = None


@dataclass(frozen=True)
class Idle:
    """Nothing to do: block on the inbox."""


Work = EngineStep | PocBatch | Idle


def choose(s: Snapshot) -> Work:
    poc_ready = s.has_poc_work and not (s.is_poc_blocked and s.has_engine_work)
    if not poc_ready:
        return EngineStep() if s.has_engine_work else Idle()
    if not s.has_engine_work:
        return PocBatch()
    if s.poc_credit_s <= 0:
        return EngineStep()
    if s.poc_credit_s == float("inf"):
        return PocBatch()
    if s.poc_cost is None:
        return PocBatch(limit=1)  # one sequence first: its time starts the cost model
    affordable = s.poc_cost.sequences_within(s.poc_credit_s)
    if affordable < min(s.poc_cost.efficient_size(), s.poc_max_batch):
        return EngineStep()  # keep earning until the forward is worth its overhead
    return PocBatch(limit=affordable)
