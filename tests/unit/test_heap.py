"""backend/core/heap.py: malloc_trim gives freed heap pages back, and the trimmer thread calls it on its interval."""

import ctypes
import time

import pytest

from backend.core.heap import HeapTrimmer, malloc_trim, rss_bytes

trim = malloc_trim()
pytestmark = pytest.mark.skipif(trim is None, reason="no glibc malloc_trim")


def _fragment_heap() -> None:
    """Leaves ~200 MB of freed chunks below a live one, where glibc's own trim (the heap's top) cannot reach."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(100_000) for _ in range(2000)]  # under the mmap threshold: from the heap itself
    for c in chunks:
        ctypes.memset(c, 1, 100_000)  # touched, so resident
    for c in chunks[:-1]:
        libc.free(c)  # the last one stays live and pins the heap's top


def test_trim_once_returns_freed_pages_and_counts_them() -> None:
    _fragment_heap()
    trimmer = HeapTrimmer()
    before = rss_bytes()
    returned = trimmer.trim_once(trim)
    assert returned >= 100 * 2**20, (before, returned)
    assert trimmer.trims == 1 and trimmer.returned_bytes == returned


def test_thread_trims_on_its_interval_and_stops() -> None:
    trimmer = HeapTrimmer(interval_s=0.05).start()
    deadline = time.monotonic() + 30
    while trimmer.trims < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    trimmer.stop()
    assert trimmer.trims >= 2
    done = trimmer.trims
    time.sleep(0.2)
    assert trimmer.trims == done  # stopped: no trim after stop()


def test_interval_zero_starts_no_thread() -> None:
    trimmer = HeapTrimmer(interval_s=0).start()
    assert trimmer._thread is None and trimmer.trims == 0
    trimmer.stop()
