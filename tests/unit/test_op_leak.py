"""bench/op_leak.py: bytes per call read from glibc tell a call that keeps a block from one that frees it."""

import ctypes
import ctypes.util

import pytest

from backend.core.heap_profile import malloc_in_use_bytes
from bench import op_leak

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]


@pytest.fixture(autouse=True)
def _needs_mallinfo2():
    if malloc_in_use_bytes() is None:
        pytest.skip("no glibc mallinfo2")


def test_a_call_that_keeps_a_block_reads_its_chunk():
    kept: list[int] = []
    per_call = op_leak.bytes_per_call(lambda: kept.append(_libc.malloc(64)), calls=20_000, warmup=10)
    for block in kept:
        _libc.free(block)
    # 64 bytes asked are a 80-byte chunk in glibc (size plus its header, 16-byte aligned); the list's own growth
    # adds ~8 bytes a call
    assert 72 <= per_call <= 100, per_call


def test_a_call_that_frees_reads_about_nothing():
    per_call = op_leak.bytes_per_call(lambda: _libc.free(_libc.malloc(64)), calls=20_000, warmup=10)
    assert abs(per_call) < 4, per_call


def test_an_op_that_cannot_be_built_is_reported_not_raised(monkeypatch):
    def no_compiler():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(op_leak, "stable_ops", no_compiler)
    ops, errors = op_leak.build_ops(["stable-str"])
    assert ops == {} and "no C++ compiler" in errors["stable-str"]
