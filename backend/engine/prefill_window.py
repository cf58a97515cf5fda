"""When chat's new prefills join the running decodes: arrivals gathered over a short window, not one step each.

A step that carries a prefill costs the decoding requests far more than a decode-only step: on an H100 at an open
load on the 0.6B shape it took 6.7–8.5 ms against 2.9–3.6 ms, most of it fixed host time (a mixed batch runs
vLLM's piecewise graphs, not the full decode graph). Taken as they come, Poisson arrivals land about one per
prefill step, and every decoding stream pays for each. `vllm serve` gathered ~1.5× more prefill tokens a step at
the same arrivals (its API server hands requests over in bursts); ours, handing each over at once, ran 1.1–1.6× its
prefill steps and a TPOT 1.16–1.4× its own (docs/benchmarks-history.md, 2026-12-07 (evening)).

So while requests are decoding, the first waiting request holds new prefills for `window_s`, and then every request
waiting joins the same step. TTFT grows by at most the window; with nothing decoding a request starts at once. The
hold is vLLM's own: its scheduler defers prefills when asked (`Scheduler.schedule(throttle_prefills=True)`, which
its data-parallel engine uses for the same end), and never defers once waiting requests outgrow a step. It is the
policy of TGI's `max_waiting_tokens` and of vLLM V0's `scheduler_delay_factor`, in time rather than steps, so a
model whose steps are longer than the window is not held at all.
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

    def should_defer(self, num_waiting: int) -> bool:
        if self.window_s <= 0 or num_waiting == 0:
            self._opened_at = None
            return False
        now = self._clock()
        if self._opened_at is None:
            self._opened_at = now
        if now - self._opened_at < self.window_s:
            return True
        self._opened_at = None  # released: whatever waits now goes in this step; later arrivals open a new window
        return False
