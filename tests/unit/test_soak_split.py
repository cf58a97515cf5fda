"""bench.soak_split: the engine's heap_profile lines read back from its log, and each variant's slopes."""

from __future__ import annotations

import pytest

from bench.soak import slope_per_min
from bench.soak_split import (
    VARIANTS,
    attention_layers,
    heap_profiles,
    kv_write_bytes_per_call,
    kv_write_prediction,
    main,
    summarize,
)

LINE = ("2026-12-03T16:43:{s:02d}.000000Z [info     ] heap_profile                   [backend.core.heap_profile] "
        "malloc_free_mb=2.4 malloc_in_use_mb={mb} malloc_mmapped_mb=569.1 rss_mb=1259.2")


def test_profile_lines_are_read_with_their_time():
    log = "\n".join([LINE.format(s=0, mb=200.0), "2026-12-03T16:43:01Z [info ] engine_ready elapsed_s=3.0",
                     LINE.format(s=30, mb=-1.5), "garbage heap_profile line"])
    profiles = heap_profiles(log)
    assert [f["malloc_in_use_mb"] for _, f in profiles] == [200.0, -1.5]
    assert profiles[1][0] - profiles[0][0] == pytest.approx(30.0)
    assert profiles[0][1]["malloc_mmapped_mb"] == 569.1


def test_slope_is_per_minute_and_skips_the_warm_up():
    # +100 MB in the first minute (warm-up), then +2 MB/min
    points = [(0.0, 0.0), (30.0, 50.0), (60.0, 100.0)] + [(60.0 + 30 * i, 100.0 + i) for i in range(1, 9)]
    assert slope_per_min(points) == pytest.approx(2.0)
    assert slope_per_min(points[:2]) is None


def test_growth_is_given_per_thousand_of_each_kind_of_work():
    profiles = [(60.0 * i, {"malloc_in_use_mb": 100.0 + 3 * i, "rss_mb": 1000.0}) for i in range(10)]
    report = {"load_s": 600.0, "ok": True, "problems": [], "chat": {"completed": 2000},
              "pow": {"nonces_mined": 0, "validations_submitted": 0}}
    row = summarize("chat", report, profiles)
    assert row["malloc_in_use_mb_per_min"] == pytest.approx(3.0)
    # 3 MB/min over 10 min = 30 MB for 2,000 chats: 15 MB per thousand
    assert row["malloc_in_use_mb_kb_per_1k_chats"] == pytest.approx(15 * 1024)
    assert row["malloc_in_use_mb_kb_per_1k_nonces"] is None
    assert row["rss_mb_per_min"] == 0.0
    assert row["malloc_mmapped_mb_per_min"] is None  # not in these lines


def test_unknown_variants_are_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["--variants", "mixed,nope", "--out", str(tmp_path)])
    assert "nope" in capsys.readouterr().err
    assert {"mixed", "chat", "poc"} <= set(VARIANTS)


def _clean_report(validations: int) -> dict:
    return {"chat": {"lost": 0, "failed": 0},
            "pow": {"callbacks_lost": 0, "num_validations_wrong": 0, "recomputed": {"past_chain": 0}, "errors": [],
                    "validations_submitted": validations},
            "backend": {"pocserve_callbacks_dropped_total": 0, "pocserve_callback_backlog": 0,
                        "vllm:num_requests_running": 0},
            "health": {"http": {"frontend0": 200}, "alive": {"backend": True}}}


def test_a_chat_only_soak_expects_no_validation():
    from bench.soak import verdict
    assert verdict(_clean_report(0), poc=False) == []
    assert verdict(_clean_report(0)) == ["no validation was submitted"]
    assert verdict(_clean_report(3)) == []


def _rendered(level: str, event: str, **fields) -> str:
    """A line as the backend logs it (common/logs.py: structlog's console renderer after an ISO timestamp)."""
    import structlog

    renderer = structlog.dev.ConsoleRenderer(colors=False)
    return renderer(None, level, {"timestamp": "2026-12-05T21:00:00.000000Z", "level": level, "event": event,
                                  "logger": "backend.engine.leak_check", **fields})


def test_the_kv_write_bytes_come_from_the_start_up_check():
    leaks = _rendered("warning", "kv_write_leaks", bytes_per_call=48.02, torch="2.11.0", cure="a build")
    clean = _rendered("info", "kv_write_leak_check", measured=True, bytes_per_call=0.0, leaks=False)
    unmeasured = _rendered("info", "kv_write_leak_check", measured=False, reason="no glibc mallinfo2")
    assert kv_write_bytes_per_call(f"engine_ready\n{leaks}\nheap_profile rss_mb=1.0") == 48.02
    assert kv_write_bytes_per_call(clean) == 0.0
    assert kv_write_bytes_per_call(unmeasured) is None and kv_write_bytes_per_call("") is None


def _counted(steps_per_min: float, forwards_per_min: float) -> list[tuple[float, dict[str, float]]]:
    return [(30.0 * i, {"engine_steps": steps_per_min * i / 2, "poc_forwards": forwards_per_min * i / 2,
                        "malloc_in_use_mb": 500.0}) for i in range(10)]


def test_the_leak_predicts_a_slope_from_the_variants_eager_work():
    profiles = _counted(steps_per_min=1200, forwards_per_min=60)
    chat = kv_write_prediction(VARIANTS["chat"], profiles, layers=28, bytes_per_call=48.0)
    assert (chat["steps_per_min"], chat["forwards_per_min"]) == (1200.0, 60.0)
    assert chat["kv_write_predicted_mb_per_min"] == round(1200 * 28 * 48 / 2**20, 2)  # 1.54
    both = kv_write_prediction(VARIANTS["mixed-no-poc-graphs"], profiles, layers=28, bytes_per_call=48.0)
    assert both["kv_write_predicted_mb_per_min"] == round(1260 * 28 * 48 / 2**20, 2)
    # The control writes the cache with Triton: nothing predicted, whatever it served.
    control = kv_write_prediction(VARIANTS["chat-triton-attn"], profiles, layers=28, bytes_per_call=48.0)
    assert control["kv_write_predicted_mb_per_min"] == 0.0
    assert kv_write_prediction(VARIANTS["chat-compiled"], profiles, 28, 48.0)["kv_write_prediction_is_bound"]
    # Without the start-up check's figure, or the counters (a backend before them), nothing is predicted.
    assert kv_write_prediction(VARIANTS["chat"], profiles, 28, None)["kv_write_predicted_mb_per_min"] is None
    uncounted = [(t, {"malloc_in_use_mb": f["malloc_in_use_mb"]}) for t, f in profiles]
    assert kv_write_prediction(VARIANTS["chat"], uncounted, 28, 48.0)["kv_write_predicted_mb_per_min"] is None


def test_the_variants_say_what_they_run():
    for name, variant in VARIANTS.items():
        serves_chat = "--concurrency" not in variant.flags
        if "steps" in variant.eager_writes:
            assert serves_chat, name
        # PoC's forwards write the cache outside a graph only where its graphs are off.
        assert ("forwards" in variant.eager_writes) == (variant.env.get("POCSERVE_POC_GRAPHS") == "0"), name
    assert "--backend-arg=--attention-backend=TRITON_ATTN" in VARIANTS["chat-triton-attn"].flags


def test_attention_layers_are_the_models(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 28, "hidden_size": 1024}')
    assert attention_layers(tmp_path) == 28
