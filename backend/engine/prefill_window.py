"""When chat's new prefills join the running decodes: arrivals gathered over a short window, not one step each.

A step that carries a prefill costs the decoding requests far more than a decode-only step: on an H100 at an open
load on the 0.6B shape an interval with a prefill in or beside it took 1.95–2.65× a decode-only one, on both sides,
though ~150 prompt tokens are little work there (presumably host time: vLLM runs a mixed batch in its piecewise
graphs). Taken as they come, arrivals land about one per prefill step, and every decoding stream pays for each:
ours, taking each request into the next step, ran 1.02–1.61× `vllm serve`'s prefill steps in all six pairs measured
(docs/benchmarks-history.md, 2026-12-07 (evening)). Gathering them at 20 ms brought ours to vLLM's prefill count
there, but not its TPOT (2026-12-07 (night)), so the window is off by default (docs/decisions.md, "The prefill
window").

With a window set, while requests decode the first waiting request holds new prefills for up to `window_s`, then every
request waiting joins the same step. A hold lasts whole steps, so a step is held only where the next one still ends
within the window (the step length read as the time between two schedules): TTFT grows by at most the window, a
model whose steps are longer than the window is never held, and with nothing decoding a request starts at once.
The hold is vLLM's own: its scheduler defers prefills when asked (`Scheduler.schedule(throttle_prefills=True)`,
which its data-parallel engine uses for the same end), and never once waiting requests outgrow a step. It is the
policy of TGI's `max_waiting_tokens` and of vLLM V0's `scheduler_delay_factor`, in time rather than in steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PrefillWindow:
    """Asked at each schedule: should new prefills wait? Engine thread only; the clock is injected for tests."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        # When the first schedule found requests waiting; None while none wait.
        self._opened_at: float | None = None
        self._last_asked_at: float | None = None

    def should_defer(self, num_waiting: int) -> bool:
        now = self._clock()
        step_s = now - self._last_asked_at if self._last_asked_at is not None else float("inf")
        self._last_asked_at = now
        if self.window_s <= 0 or num_waiting == 0:
            self._opened_at = None
            return False
        if self._opened_at is None:
            self._opened_at = now
        if now - self._opened_at + step_s < self.window_s:
            return True  # the next schedule still comes within the window
        self._opened_at = None  # released: whatever waits now goes in this step; later arrivals open a new window
        return False
