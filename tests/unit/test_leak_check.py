"""backend/engine/leak_check.py: the start-up check tells a KV-cache write that keeps a block per call from one
that frees it, a stray allocation cannot fake a leak, and the log says which."""

import ctypes
import ctypes.util

import pytest
from structlog.testing import capture_logs

from backend.core.heap_profile import malloc_in_use_bytes
from backend.engine import leak_check

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]


@pytest.fixture
def kept_blocks():
    """A call that keeps a 32-byte block (the size of a leaked std::string) in a preallocated table, freed after."""
    table = (ctypes.c_void_p * 50_000)()
    count = [0]

    def keep() -> None:
        table[count[0]] = _libc.malloc(32)
        count[0] += 1

    yield keep
    for i in range(count[0]):
        _libc.free(table[i])


@pytest.mark.skipif(malloc_in_use_bytes() is None, reason="no glibc mallinfo2")
def test_an_op_that_keeps_a_string_per_call_leaks(kept_blocks):
    result = leak_check.measure(kept_blocks, calls=10_000)
    assert result["measured"] and result["leaks"], result
    assert all(40 <= b <= 56 for b in result["bytes_per_call"]), result  # 32 bytes asked: a 48-byte chunk


@pytest.mark.skipif(malloc_in_use_bytes() is None, reason="no glibc mallinfo2")
def test_an_op_that_frees_does_not():
    result = leak_check.measure(lambda: _libc.free(_libc.malloc(32)), calls=10_000)
    assert result["measured"] and not result["leaks"], result


def test_one_reading_alone_is_no_leak():
    assert leak_check.leaks([48.0, 47.5])
    assert not leak_check.leaks([48.0, 0.4])  # another thread allocated during the first reading
    assert not leak_check.leaks([])


def test_the_log_warns_where_any_rank_leaks():
    clean = {"measured": True, "bytes_per_call": [0.1, 0.0], "leaks": False, "torch": "2.11.0+cu130"}
    leaky = {"measured": True, "bytes_per_call": [48.0, 48.1], "leaks": True, "torch": "2.11.0+cu130"}
    with capture_logs() as logs:
        leak_check.report([clean, leaky])
    assert [(e["event"], e["log_level"]) for e in logs] == [("kv_write_leaks", "warning")]
    assert logs[0]["bytes_per_call"] == 48.0 and "51185" in logs[0]["cure"]
    with capture_logs() as logs:
        leak_check.report([clean, clean])
    assert [(e["event"], e["log_level"], e["leaks"]) for e in logs] == [("kv_write_leak_check", "info", False)]


def test_a_rank_that_could_not_measure_says_why():
    with capture_logs() as logs:
        leak_check.report([{"measured": False, "reason": "AttributeError: no reshape_and_cache_flash"}])
    assert logs[0]["measured"] is False and "reshape_and_cache_flash" in logs[0]["reason"]


def test_a_cpu_worker_is_not_measured():
    worker = leak_check.LeakCheckExtension()
    worker.device = "cpu"  # type: ignore[attr-defined]
    result = worker.kv_write_leak()
    assert result["measured"] is False and "cpu" in result["reason"]
