"""The prefill window (backend/engine/prefill_window.py): when new prefills wait for others, on a fake clock."""

from __future__ import annotations

from backend.engine.prefill_window import PrefillWindow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_prefill_window_holds_the_first_waiting_request_for_the_window_then_lets_all_in():
    clock = Clock()
    window = PrefillWindow(0.010, clock)
    assert window.should_defer(1)  # the first schedule that finds one waiting opens the window
    clock.now += 0.006
    assert window.should_defer(3)  # later arrivals join it; it is not restarted by them
    clock.now += 0.004
    assert not window.should_defer(3)  # 10 ms after it opened: every request waiting goes in this step


def test_prefill_window_opens_anew_after_a_release_and_after_the_queue_empties():
    clock = Clock()
    window = PrefillWindow(0.010, clock)
    window.should_defer(1)
    clock.now += 0.010
    assert not window.should_defer(1)
    clock.now += 0.001
    assert window.should_defer(1)  # someone still (or newly) waiting: a fresh window, counted from now
    assert not window.should_defer(0)  # the queue emptied (vLLM scheduled them: nothing decoding held them)
    clock.now += 0.020
    assert window.should_defer(2)  # the next arrival is held again: the old opening time is not carried over
    clock.now += 0.009
    assert window.should_defer(2)


def test_prefill_window_zero_never_defers():
    window = PrefillWindow(0.0, Clock())
    assert not any(window.should_defer(n) for n in (1, 5, 0, 3))
