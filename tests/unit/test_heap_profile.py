"""backend/core/heap_profile.py: glibc's figures, and tracemalloc's growth sites naming the line that allocates."""

import tracemalloc

import pytest

from backend.core.heap_profile import HeapProfiler, growth_sites, malloc_stats_mb


def test_off_unless_asked():
    assert HeapProfiler.from_env({}) is None
    assert HeapProfiler.from_env({"POCSERVE_HEAP_PROFILE_S": "0"}) is None
    profiler = HeapProfiler.from_env({"POCSERVE_HEAP_PROFILE_S": "30", "POCSERVE_TRACEMALLOC": "4"})
    assert (profiler.interval_s, profiler.frames) == (30.0, 4)


def test_malloc_in_use_counts_live_blocks():
    before = malloc_stats_mb()
    if not before:
        pytest.skip("no glibc mallinfo2")
    held = [bytearray(64 * 1024) for _ in range(160)]  # 10 MB in blocks glibc serves from its arenas
    after = malloc_stats_mb()
    grew = sum(after[k] - before[k] for k in ("malloc_in_use_mb", "malloc_mmapped_mb"))
    assert grew >= 9, (before, after)
    del held


def _leak(into: list) -> None:
    into.append(bytearray(256 * 1024))


def test_growth_sites_name_the_allocating_line():
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start(2)
    try:
        baseline = tracemalloc.take_snapshot()
        kept: list = []
        for _ in range(8):
            _leak(kept)
        sites = growth_sites(tracemalloc.take_snapshot(), baseline)
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert sites and sites[0]["kb"] >= 8 * 256
    assert "test_heap_profile.py" in sites[0]["at"] and sites[0]["count"] >= 8


def test_profile_has_a_baseline_then_sites():
    profiler = HeapProfiler(interval_s=3600, frames=1)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start(1)
    try:
        first = profiler.profile()
        kept = [bytearray(512 * 1024) for _ in range(4)]
        second = profiler.profile()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert "grew" not in first and first["rss_mb"] > 0
    assert second["grew"][0]["kb"] >= 4 * 512 and kept
