"""Gives the engine process's freed heap back to the OS now and then (glibc's malloc_trim).

The CPU engine allocates activations in sizes that change with every batch (chats of every length beside PoC
forwards). glibc keeps freed chunks inside its heap and returns only the top of it, so the engine process's RSS
grew ~100 MB/min in a mixed soak with nothing live behind it: one malloc_trim(0) gave back 666 MB at once
(docs/reliability.md, section 4). A daemon thread trims every --heap-trim-interval-s (TRIM_INTERVAL_S by
default; 0: never). ctypes releases the GIL for the call, so the engine keeps stepping; it waits only where it
allocates from the arena being trimmed, for the trim's duration (logged at debug): ~0.1 ms per MB given back.
The soak freed ~7 MB/s that glibc kept: every 30 s the RSS swung by ~200 MB between trims; every 5 s a trim
gives back ~35 MB in ~3 ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

TRIM_INTERVAL_S = 5.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class HeapTrimmer:
    """Calls malloc_trim(0) every interval_s until stopped (never where interval_s is 0)."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.returned_bytes = 0
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HeapTrimmer:
        if self.interval_s <= 0:
            log.info("heap_trim_off")
            return self
        trim = malloc_trim()
        if trim is None:
            log.info("heap_trim_unavailable")
            return self
        self._thread = threading.Thread(target=self._run, args=(trim,), name="heap-trim", daemon=True)
        self._thread.start()
        return self

    def trim_once(self, trim: Callable[[int], int]) -> int:
        """One trim; the bytes of RSS it gave back."""
        before, started = rss_bytes(), time.perf_counter()
        trim(0)
        returned = max(0, before - rss_bytes())
        self.trims += 1
        self.returned_bytes += returned
        log.debug("heap_trimmed", returned_mb=round(returned / 2**20, 1),
                  duration_ms=round((time.perf_counter() - started) * 1e3, 2))
        return returned

    def _run(self, trim: Callable[[int], int]) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim_once(trim)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
