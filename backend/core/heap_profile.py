"""What the engine process's heap holds over time, for finding a leak (off unless POCSERVE_HEAP_PROFILE_S is set).

The soak on a GPU found the engine's glibc heap growing ~5 MB/min despite the trims of heap.py (docs/reliability.md,
section 4). Two questions tell the causes apart, and this answers both from inside the process:
- Is the growth live memory or freed memory glibc keeps? glibc's mallinfo2: bytes in use in its arenas, bytes free
  inside them, bytes in its own mmapped chunks.
- If live, is it Python's? With POCSERVE_TRACEMALLOC=N (frames per trace) tracemalloc runs from the start, and each
  profile logs the Python allocation sites that grew most since the first profile (a baseline taken after the
  first interval, once the warm-up's allocations are in), by traceback. What it does not see is C/C++'s own malloc
  (torch, CUDA's libraries): live growth without a Python site is theirs.

- Per unit of what work? Each profile also logs the work counters the backend gives it (`counters`: engine steps
  and PoC forwards so far), so growth can be put per step or per forward: a leak of so many bytes per call of an
  op called once per layer per step predicts its own slope (bench/soak_split.py does that arithmetic).

- If native, whose? With POCSERVE_MEMRAY=START_S:STOP_S:PATH memray records every allocation, with its native and
  Python stack, from START_S to STOP_S after the profiler starts, into PATH (its aggregated format: per stack, what
  is still live at STOP_S). Opened after the warm-up, the window's live allocations at its end are the growth, and
  `python -m bench.heap_leaks PATH` lists them by stack (run it where the process ran: it reads the libraries'
  symbols). memray is in the test extra, not the backend's.

Every POCSERVE_HEAP_PROFILE_S seconds one `heap_profile` line is logged. tracemalloc costs the whole process: each
allocation records its traceback (several times slower Python allocations), and a snapshot holds the GIL while it
walks every trace (~1 s per million); memray's native stacks slow every malloc too. For diagnosis, never for a
node at work.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import os
import threading
import tracemalloc
from collections.abc import Callable

import structlog

from backend.core.heap import rss_bytes

log = structlog.get_logger(__name__)

# Growth sites logged per profile.
TOP_SITES = 12
_MB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(name), "mallinfo2", None) if name else None  # glibc >= 2.33
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


def malloc_in_use_bytes() -> int | None:
    """glibc's bytes in use in all its arenas (mallinfo2's uordblks); None where it has no mallinfo2."""
    fn = _mallinfo2()
    return None if fn is None else int(fn().uordblks)


def bytes_per_call(fn: Callable[[], object], calls: int, warmup: int = 1000) -> float:
    """glibc's growth in bytes in use over `calls` calls of fn, per call, after `warmup` calls (caches filled)."""
    for _ in range(warmup):
        fn()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # a collection inside the loop would free unrelated memory and read as a negative leak
    try:
        before = malloc_in_use_bytes()
        for _ in range(calls):
            fn()
        after = malloc_in_use_bytes()
    finally:
        if enabled:
            gc.enable()
    if before is None or after is None:
        raise RuntimeError("glibc's mallinfo2 is not available here (glibc >= 2.33 needed)")
    return (after - before) / calls


def malloc_stats_mb() -> dict[str, float]:
    """glibc's view of its heap, MB: in use, free but kept, and its mmapped chunks; {} where it has no mallinfo2."""
    fn = _mallinfo2()
    if fn is None:
        return {}
    info = fn()
    return {"malloc_in_use_mb": round(info.uordblks / _MB, 1), "malloc_free_mb": round(info.fordblks / _MB, 1),
            "malloc_mmapped_mb": round(info.hblkhd / _MB, 1)}


def growth_sites(now: tracemalloc.Snapshot, baseline: tracemalloc.Snapshot, top: int = TOP_SITES) -> list[dict]:
    """The allocation sites (by traceback) whose live bytes grew most from `baseline` to `now`."""
    out = []
    for stat in now.compare_to(baseline, "traceback")[:top]:
        if stat.size_diff <= 0:
            break
        frames = [f"{f.filename.rsplit('/site-packages/', 1)[-1]}:{f.lineno}" for f in stat.traceback]
        out.append({"kb": round(stat.size_diff / 1024, 1), "count": stat.count_diff, "at": " < ".join(frames)})
    return out


@dataclasses.dataclass(frozen=True)
class MemrayWindow:
    """memray tracking from start_s to stop_s after the profiler starts, into path (module docstring)."""

    start_s: float
    stop_s: float
    path: str

    @classmethod
    def parse(cls, spec: str) -> MemrayWindow:
        try:
            start, stop, path = spec.split(":", 2)
            window = cls(float(start), float(stop), path)
        except ValueError:
            raise ValueError(f"POCSERVE_MEMRAY={spec!r}: expected START_S:STOP_S:PATH") from None
        if not 0 <= window.start_s < window.stop_s or not path:
            raise ValueError(f"POCSERVE_MEMRAY={spec!r}: expected 0 <= START_S < STOP_S and a path")
        return window

    def run(self, stopped: threading.Event, on: threading.Event) -> None:
        """Tracks from start_s until stop_s or `stopped`; sets `on` once tracking has begun (memray creates the file
        before that)."""
        import memray  # the test extra's; asked for by name, so a missing one is an error worth its traceback

        if stopped.wait(self.start_s):
            return
        tracker = memray.Tracker(self.path, native_traces=True,
                                 file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS)
        with tracker:
            on.set()
            log.info("heap_memray_on", path=self.path, until_s=self.stop_s)
            stopped.wait(self.stop_s - self.start_s)
        log.info("heap_memray_written", path=self.path, read_with=f"python -m bench.heap_leaks {self.path}")


class HeapProfiler:
    """Logs `heap_profile` every interval_s (module docstring)."""

    def __init__(self, interval_s: float, frames: int = 0, memray: MemrayWindow | None = None) -> None:
        self.interval_s = interval_s
        self.frames = frames
        self.memray = memray
        self._baseline: tracemalloc.Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._memray_thread: threading.Thread | None = None
        # Set once the memray window's tracking has begun.
        self.memray_on = threading.Event()
        # The work done so far (name → count), read from this thread; set once the engine loop exists.
        self.counters: Callable[[], dict[str, int]] | None = None

    @classmethod
    def from_env(cls, environ=os.environ) -> HeapProfiler | None:
        interval = float(environ.get("POCSERVE_HEAP_PROFILE_S", "0") or 0)
        if interval <= 0:
            return None
        spec = environ.get("POCSERVE_MEMRAY", "")
        return cls(interval, int(environ.get("POCSERVE_TRACEMALLOC", "0") or 0),
                   MemrayWindow.parse(spec) if spec else None)

    def start(self) -> HeapProfiler:
        if self.frames > 0 and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        log.info("heap_profile_on", interval_s=self.interval_s, tracemalloc_frames=self.frames)
        self._thread = threading.Thread(target=self._run, name="heap-profile", daemon=True)
        self._thread.start()
        if self.memray is not None:
            self._memray_thread = threading.Thread(target=self.memray.run, args=(self._stop, self.memray_on),
                                                   name="heap-memray", daemon=True)
            self._memray_thread.start()
        return self

    def profile(self) -> dict:
        """One profile: RSS, glibc's figures, the work counters, and with tracemalloc its traced bytes and the
        growth sites."""
        out: dict = {"rss_mb": round(rss_bytes() / _MB, 1), **malloc_stats_mb()}
        if self.counters is not None:
            out.update(self.counters())
        if tracemalloc.is_tracing():
            current, _ = tracemalloc.get_traced_memory()
            out["python_traced_mb"] = round(current / _MB, 1)
            out["tracemalloc_own_mb"] = round(tracemalloc.get_tracemalloc_memory() / _MB, 1)
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            if self._baseline is None:
                self._baseline = snapshot
            else:
                out["grew"] = growth_sites(snapshot, self._baseline)
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            log.info("heap_profile", **self.profile())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._memray_thread is not None:  # a window cut short by the shutdown still writes its file
            self._memray_thread.join(timeout=60)
