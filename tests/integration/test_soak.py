"""The reliability soak (bench/soak.py), CI-sized: ~40 s, 16 streams, one mining + validation cycle.

It starts its own backend and two frontends (the shared session stack must stay idle for other tests), so it
costs one engine start on top of the 40 s. The full-size run is `python -m bench.soak --seconds 180`.
"""

from __future__ import annotations

import pytest

from bench.soak import SoakConfig, run_soak
from bench.soak_split import heap_profiles


@pytest.mark.slow
def test_soak_loses_nothing_and_stays_healthy(model_dir, tmp_path, monkeypatch):
    # The backend's heap profile on (backend/core/heap_profile.py): its lines carry the work counters.
    monkeypatch.setenv("POCSERVE_HEAP_PROFILE_S", "5")
    report = run_soak(SoakConfig(
        work_dir=tmp_path, model_dir=model_dir, seconds=40.0, concurrency=16, num_cycles=1,
        callback_interval_s=1.0, validation_interval_s=1.5, drain_timeout_s=90.0))
    chat, pow_ = report["chat"], report["pow"]
    assert report["problems"] == [], report
    assert chat["sent"] == chat["completed"] > 0 and (chat["failed"], chat["lost"]) == (0, 0)
    assert all(f["sent"] > 0 for f in chat["per_frontend"])  # both frontends carried streams
    assert pow_["nonces_mined"] > 0 and pow_["nonces_delivered"] >= pow_["nonces_mined"]
    assert pow_["mining_nonces_lost"] == 0
    assert pow_["validations_submitted"] > 0
    assert pow_["validated_callbacks"] == pow_["validations_submitted"] and pow_["num_validations_wrong"] == 0
    # Every validated nonce was also recomputed directly, and none is a wrong artifact.
    recomputed = pow_["recomputed"]
    assert recomputed["nonces"] == 8 * pow_["validations_submitted"] and recomputed["past_chain"] == 0, recomputed
    assert report["health"] == {"http": {"frontend0": 200, "frontend1": 200},
                                "alive": {"backend": True, "frontend0": True, "frontend1": True}}
    assert report["backend"]["pocserve_callbacks_dropped_total"] == 0
    # Where the engine's memory sits, first and last sample: the heap and the model's file mappings are resident.
    by_mapping = report["engine_rss_by_mapping"]
    assert set(by_mapping) == {"start_mb", "final_mb"}
    for mb in by_mapping.values():
        assert set(mb) == {"heap", "anonymous", "device", "file", "other"} and mb["heap"] > 0 and mb["file"] > 0
    # The heap profile counted the engine's steps and PoC's forwards as they happened (bench/soak_split.py puts
    # the heap's growth per step and per forward with them).
    profiles = [f for _, f in heap_profiles((tmp_path / "backend.log").read_text(errors="replace"))
                if "engine_steps" in f]  # the lines logged while the engine was still being built have none
    assert len(profiles) >= 4, profiles
    steps, forwards = [f["engine_steps"] for f in profiles], [f["poc_forwards"] for f in profiles]
    assert steps == sorted(steps) and steps[-1] > 0 and forwards == sorted(forwards) and forwards[-1] > 0
