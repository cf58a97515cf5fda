"""bench/perf_counters.py: a thread's counters through perf_event_open, and the round's figures made of them."""

import math
import os
import threading
import time

import pytest

from bench.perf_counters import (
    PERF_TYPE_SOFTWARE,
    SW_TASK_CLOCK,
    Cycles,
    ThreadCycles,
    close_all,
    open_counter,
    open_main_threads,
    read_counter,
)
from bench.rounds import main_thread_cycles


def _task_clock_fd() -> int:
    try:
        return open_counter(threading.get_native_id(), PERF_TYPE_SOFTWARE, SW_TASK_CLOCK)
    except OSError as e:  # a sandbox's seccomp filter, or kernel.perf_event_paranoid 3
        pytest.skip(f"perf_event_open refused here: {e}")


def test_a_counter_counts_its_threads_time_on_a_cpu() -> None:
    fd = _task_clock_fd()
    try:
        before = read_counter(fd)
        started = time.process_time()
        while time.process_time() - started < 0.05:
            pass
        grown_ns = read_counter(fd) - before
    finally:
        os.close(fd)
    assert grown_ns >= 0.02e9  # at least 20 of the 50 ms spent on a CPU in user mode (the rest may be the kernel's)


def test_machines_without_hardware_counters_give_no_figures() -> None:
    try:
        counters = ThreadCycles(threading.get_native_id())
    except OSError:
        assert open_main_threads([threading.get_native_id()]) == {}
        return
    first = counters.read()  # this machine has a PMU: the counters must count
    sum(range(100_000))
    totals = close_all({1: counters})
    assert totals[1].instructions > first.instructions and totals[1].cycles > first.cycles


def test_the_round_takes_the_busiest_processs_main_thread() -> None:
    split = [{"pid": 7}, {"pid": 9}]
    figures = main_thread_cycles(split, {7: Cycles(cycles=2e9, instructions=3e9), 9: Cycles(1.0, 1.0)}, steps=1000)
    assert figures == {"engine_ipc": 1.5, "engine_instructions_per_step": 3e6}
    assert all(math.isnan(v) for v in main_thread_cycles(split, {9: Cycles(1.0, 1.0)}, 1000).values())
    assert math.isnan(main_thread_cycles(split, {7: Cycles(2e9, 3e9)}, steps=math.nan)["engine_instructions_per_step"])
