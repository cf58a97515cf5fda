"""The prefill window (backend/engine/prefill_window.py): when new prefills wait for others, on a fake clock."""

from __future__ import annotations

from backend.engine.prefill_window import PrefillWindow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(window: PrefillWindow, clock: Clock, step_s: float, waiting: list[int]) -> list[bool]:
    """One schedule per step of `step_s`, finding `waiting[i]` requests waiting at the i-th."""
    held = []
    for n in waiting:
        clock.now += step_s
        held.append(window.should_defer(n))
    return held


def test_prefill_window_holds_whole_steps_that_end_within_the_window_then_lets_all_in():
    clock = Clock()
    window = PrefillWindow(0.0095, clock)
    _steps(window, clock, 0.002, [0, 0])  # decoding, nothing waiting: 2 ms steps
    # Opened at the first step that finds one waiting; later arrivals join without restarting it. Held while the
    # next step still ends inside 9.5 ms: at 0, 2, 4 and 6 ms; at 8 ms the next would end at 10, so all go in.
    assert _steps(window, clock, 0.002, [1, 1, 2, 3, 3]) == [True, True, True, True, False]


def test_prefill_window_never_holds_where_a_step_outlasts_the_window():
    clock = Clock()
    window = PrefillWindow(0.010, clock)
    assert _steps(window, clock, 0.040, [0, 1, 1, 2]) == [False] * 4


def test_prefill_window_the_first_schedule_after_idle_is_not_held():
    clock = Clock()
    window = PrefillWindow(0.010, clock)
    assert not window.should_defer(1)  # no step measured yet (an idle engine: vLLM would not defer anyway)


def test_prefill_window_opens_anew_after_a_release_and_after_the_queue_empties():
    clock = Clock()
    window = PrefillWindow(0.0095, clock)
    _steps(window, clock, 0.002, [0])
    assert _steps(window, clock, 0.002, [1, 1, 1, 1, 1]) == [True] * 4 + [False]
    assert _steps(window, clock, 0.002, [1]) == [True]  # still (or newly) waiting: a fresh window from here
    assert _steps(window, clock, 0.002, [0]) == [False]  # the queue emptied
    assert _steps(window, clock, 0.002, [2, 2]) == [True, True]  # the old opening time is not carried over


def test_prefill_window_zero_never_defers():
    clock = Clock()
    window = PrefillWindow(0.0, clock)
    assert _steps(window, clock, 0.001, [1, 5, 0, 3]) == [False] * 4
