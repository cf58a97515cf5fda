"""bench/procs.py: a process's resident memory by kind of mapping, as the soak reports it for the engine."""

import os

from bench.procs import rss_by_mapping_mb


def test_a_large_allocation_shows_as_anonymous_memory():
    before = rss_by_mapping_mb(os.getpid())
    block = bytearray(64 << 20)  # glibc maps an allocation this large on its own, outside the heap
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    after = rss_by_mapping_mb(os.getpid())
    assert set(after) == {"heap", "anonymous", "device", "file", "other"}
    assert after["anonymous"] - before["anonymous"] > 60
    assert after["file"] > 0  # the interpreter's own binary and libraries
    del block


def test_a_process_that_is_gone_has_no_mappings():
    assert rss_by_mapping_mb(2**22 + 12345) == {}
