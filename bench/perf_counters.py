"""A thread's CPU counters in user mode (Linux perf_event_open through ctypes): cycles and instructions.

Why: issue 43 asks whether ours' engine thread does more work a step than `vllm serve`'s, or the same work more
slowly. Both engine threads run at ~97-99% of a core with their Python spread alike over the same functions, so
samples cannot tell. Instructions a step tell the first (more code run); instructions per cycle the second (the
same code waiting on caches, memory or a busy SMT sibling). Where the machine exposes no hardware counters (many
VMs: no `cpu` under /sys/bus/event_source/devices), opening fails and the figures are left out.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import struct
from typing import NamedTuple

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
HW_CPU_CYCLES = 0
HW_INSTRUCTIONS = 1
SW_TASK_CLOCK = 1  # the thread's on-CPU nanoseconds: a software event every kernel has (tests)

_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_READ_FORMAT = 1 | 2  # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING: the share of time counted, when counters multiplex
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6


class _Attr(ctypes.Structure):
    """struct perf_event_attr, its first 64 bytes (PERF_ATTR_SIZE_VER0); `flags` holds the bitfield."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def open_counter(tid: int, kind: int, config: int) -> int:
    """A counting fd for one event of thread `tid`, user mode only, running from now on; OSError where the
    machine or the permissions (kernel.perf_event_paranoid) do not allow it."""
    if _SYSCALL is None:
        raise OSError(f"perf_event_open: no syscall number for {platform.machine()}")
    attr = _Attr(type=kind, size=ctypes.sizeof(_Attr), config=config, read_format=_READ_FORMAT,
                 flags=_EXCLUDE_KERNEL | _EXCLUDE_HV)
    fd = _libc.syscall(_SYSCALL, ctypes.byref(attr), tid, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open(tid {tid}): {os.strerror(err)}")
    return fd


def read_counter(fd: int) -> float:
    """The event's count so far, scaled up by the share of time it was counted (multiplexed counters)."""
    value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
    return value * enabled / running if running else 0.0


class Cycles(NamedTuple):
    cycles: float
    instructions: float


class ThreadCycles:
    """Cycles and instructions of one thread from now on; `read()` the totals so far, `close()` when done."""

    def __init__(self, tid: int) -> None:
        self._fds: list[int] = []
        try:
            for config in (HW_CPU_CYCLES, HW_INSTRUCTIONS):
                self._fds.append(open_counter(tid, PERF_TYPE_HARDWARE, config))
        except OSError:
            self.close()
            raise

    def read(self) -> Cycles:
        return Cycles(*(read_counter(fd) for fd in self._fds))

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def open_main_threads(pids: list[int]) -> dict[int, ThreadCycles]:
    """Counters on each process's main thread (where both systems' engine loops run), for those that allow it;
    empty where the machine has no hardware counters."""
    out = {}
    for pid in pids:
        try:
            out[pid] = ThreadCycles(pid)
        except OSError:
            continue
    return out


def close_all(counters: dict[int, ThreadCycles]) -> dict[int, Cycles]:
    """Each thread's totals, then its counters closed."""
    out = {}
    for pid, c in counters.items():
        with contextlib.suppress(OSError):
            out[pid] = c.read()
        c.close()
    return out
