"""What a PoC forward costs, learned from the ones that ran: time(n) = overhead + n × per-sequence, per seq_len.

A forward has a fixed part (the RPC, attention metadata, hooks, the artifacts' post-processing) and a part that
grows with its sequences; sizing forwards to a time budget from time/n alone would overrate small forwards and
keep them small. A least-squares line over the recent forwards of each seq_len separates the two once sizes
vary; until then the whole time counts as per-sequence.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Recent forwards kept per seq_len.
_WINDOW = 32
# Forwards smaller than this share of fixed cost are "efficient": at most 20% of their time is overhead.
MAX_OVERHEAD_SHARE = 0.2


@dataclass(frozen=True)
class Cost:
    overhead_s: float
    per_seq_s: float
    # The one size every recent forward had (0 once sizes vary): overhead cannot be told from per-sequence cost
    # then, and counts as none, so a forward of that size always looks efficient (backend/core/policy.py probes).
    only_size: int = 0

    def seconds(self, num_seqs: int) -> float:
        return self.overhead_s + num_seqs * self.per_seq_s

    def sequences_within(self, budget_s: float) -> int:
        """The most sequences one forward can take within `budget_s` (0 if not even one)."""
        return max(0, int((budget_s - self.overhead_s) / self.per_seq_s))

    def efficient_size(self, max_overhead_share: float = MAX_OVERHEAD_SHARE) -> int:
        """The fewest sequences whose forward spends at most `max_overhead_share` of its time on overhead."""
        share = max_overhead_share
        return max(1, math.ceil(self.overhead_s * (1 - share) / (share * self.per_seq_s)))


class CostModel:
    def __init__(self) -> None:
        self._seen: dict[int, deque[tuple[int, float]]] = {}
        self._fitted: dict[int, Cost] = {}

    def observe(self, seq_len: int, num_seqs: int, elapsed_s: float) -> None:
        self._seen.setdefault(seq_len, deque(maxlen=_WINDOW)).append((num_seqs, elapsed_s))

    def cost(self, seq_len: int) -> Cost | None:
        seen = self._seen.get(seq_len)
        if not seen:
            return None
        n_mean = sum(n for n, _ in seen) / len(seen)
        t_mean = sum(t for _, t in seen) / len(seen)
        var = sum((n - n_mean) ** 2 for n, _ in seen)
        if var > 0:
            slope = sum((n - n_mean) * (t - t_mean) for n, t in seen) / var
            intercept = t_mean - slope * n_mean
            if slope > 0 and intercept >= 0:
                self._fitted[seq_len] = Cost(intercept, slope)
        elif seq_len not in self._fitted:
            return Cost(0.0, t_mean / n_mean, only_size=seen[0][0])
        # Recent forwards all of one size, or a fit that noise made meaningless: the last good fit, if any.
        return self._fitted.get(seq_len, Cost(0.0, t_mean / n_mean))
