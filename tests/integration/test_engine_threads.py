"""The CPU engine leaves a core free: cores - 1 OpenMP threads (or OMP_NUM_THREADS), whatever the backend imports
before the engine. With a thread per core, any other busy process preempts one of them and the others spin on
OpenMP barriers: the tiny model's decode steps went from ~15 ms to ~175 ms beside one busy loop."""

from __future__ import annotations

import os
import re

import pytest

from backend.engine import compat


@pytest.mark.skipif(not compat.is_cpu_build(), reason="the CPU engine's thread count")
def test_cpu_engine_runs_one_thread_less_than_the_cores(stack):
    expected = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 2) - 1))
    ready = [line for line in stack.backend.log_path.read_text(errors="replace").splitlines() if "engine_ready" in line]
    assert ready, stack.backend.tail()
    assert re.search(rf"torch_threads={expected}\b", ready[0]), ready[0]
