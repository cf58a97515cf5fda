"""Chat's share of the device while chat and PoC compete, kept as an account of measured times.

After each engine step that ran while PoC work waited, PoC earns step time × (1 − share) / share seconds of
credit; each PoC forward that ran while chat waited spends its own time. So over any stretch where both have
work, chat gets `share` of the device however long steps and forwards take, and a misjudged forward size only
moves the next one. Credit is capped at two steps' worth, or at two of the smallest efficient forwards if that is
more (forwards that are mostly overhead would waste PoC's share), so PoC cannot bank a burst while chat is heavy;
it is dropped whenever the competition ends (chat idle: PoC runs freely; PoC idle: nothing is owed).
share 1: PoC only runs when chat is idle. share 0: chat only steps when PoC is idle (or waits for KV blocks).
Engine thread only.
"""

from __future__ import annotations

INFINITE = float("inf")


class ChatShare:
    def __init__(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {share}")
        self.share = share
        self.credit_s = INFINITE if share == 0.0 else 0.0

    def _earn_rate(self) -> float:
        return INFINITE if self.share == 0.0 else (1.0 - self.share) / self.share

    def after_step(self, elapsed_s: float, is_poc_waiting: bool, min_forward_s: float = 0.0) -> None:
        """An engine step ran for `elapsed_s`; `min_forward_s`: what the smallest efficient PoC forward costs."""
        if self.share == 0.0:
            return
        if not is_poc_waiting:
            self.credit_s = 0.0
            return
        earned = elapsed_s * self._earn_rate()
        self.credit_s = min(self.credit_s + earned, 2 * max(earned, min_forward_s))

    def after_poc(self, elapsed_s: float, is_chat_waiting: bool) -> None:
        """A PoC forward ran for `elapsed_s`."""
        if self.share == 0.0:
            return
        if is_chat_waiting:
            self.credit_s -= elapsed_s
        else:
            self.credit_s = 0.0
