"""bench.soak's memory sampler: the engine's RSS by mapping kind becomes series of their own, each with a slope."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

import bench.soak
from bench.soak import MemorySampler


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc only")
def test_engine_mapping_kinds_are_sampled_as_series(monkeypatch):
    monkeypatch.setattr(bench.soak, "MAPPING_EVERY_S", 0.0)
    sampler = MemorySampler([SimpleNamespace(pid=os.getpid(), name="backend")])
    for _ in range(12):
        sampler.sample()
    sampler.finish()
    kinds = ("heap", "anonymous", "device", "file", "other")
    assert all(len(sampler.samples[f"engine {kind}"]) == 13 for kind in kinds)
    assert set(sampler.engine_mappings) == {"start_mb", "final_mb"}
    slopes = sampler.slopes()
    assert {f"engine {kind}" for kind in kinds} <= set(slopes)


def test_engine_mappings_are_sampled_at_most_every_interval(monkeypatch):
    monkeypatch.setattr(bench.soak, "MAPPING_EVERY_S", 3600.0)
    sampler = MemorySampler([SimpleNamespace(pid=os.getpid(), name="backend")])
    for _ in range(5):
        sampler.sample()
    assert len(sampler.samples.get("engine heap", [])) <= 1  # the first sample only (none off Linux)
