"""bench/round_probe.py: CPU by process and thread over a round, and the engine's inter-token latency and steps from
two scrapes."""

import math
import os
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.round_probe import (
    ThreadSample,
    cpu_split,
    engine_figures,
    engine_line,
    itl_mean_ms,
    parse_engine_counts,
    process_cpu,
    split_line,
)


def cpu(seconds: float, sys_s: float = 0.0, wait_s: float = 0.0, faults: int = 0, preempted: int = 0,
        blocked: int = 0) -> ThreadSample:
    return ThreadSample(seconds, sys_s, wait_s, faults, preempted, blocked)


def test_the_split_is_per_process_with_its_busiest_thread() -> None:
    before = {10: {"label": "frontend", "cpu_s": 5.0, "threads": {10: cpu(4.0), 11: cpu(1.0)}},
              20: {"label": "VLLM::EngineCore", "cpu_s": 1.0, "threads": {20: cpu(1.0, 0.5, 0.1, 100, 7, 50)}},
              30: {"label": "gone", "cpu_s": 1.0, "threads": {30: cpu(1.0)}}}
    after = {10: {"label": "frontend", "cpu_s": 6.0, "threads": {10: cpu(4.9), 11: cpu(1.1)}},
             # 21 started meanwhile: all its counters are the round's
             20: {"label": "VLLM::EngineCore", "cpu_s": 2.5,
                  "threads": {20: cpu(2.0, 0.6, 0.3, 300, 27, 850), 21: cpu(0.5)}},
             40: {"label": "new", "cpu_s": 9.0, "threads": {40: cpu(9.0)}}}
    split = cpu_split(before, after, duration_s=2.0)
    assert [p["label"] for p in split] == ["VLLM::EngineCore", "frontend"]  # busiest first; 30 and 40 not at both
    engine = split[0]
    assert engine["cpu_pct"] == 75.0 and engine["top_thread_pct"] == 50.0
    assert round(engine["top_thread_sys_pct"]) == 5 and round(engine["top_thread_wait_pct"]) == 10
    assert engine["top_thread_faults_per_s"] == 100 and engine["top_thread_preempted_per_s"] == 10
    assert engine["top_thread_blocked_per_s"] == 400
    assert round(split[1]["cpu_pct"]) == 50 and round(split[1]["top_thread_pct"]) == 45
    assert split_line(split) == ("VLLM::EngineCore 75% (top thread 50%: sys 5%, run-queue wait 10.0%, 100 faults/s, "
                                 "10 preempted/s, 400 blocked/s), frontend 50% (top thread 45%)")


def test_this_process_is_found_by_its_group_and_its_cpu_grows() -> None:
    me = os.getpid()
    before = process_cpu([os.getpgrp()])
    assert me in before and before[me]["label"]
    assert before[me]["threads"]  # at least the main thread
    time.sleep(0.01)  # a wait that sleeps: one voluntary switch at least
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    after = process_cpu([os.getpgrp()])
    mine = next(p for p in cpu_split(before, after, 1.0) if p["pid"] == me)
    assert mine["cpu_pct"] >= 10 and mine["top_thread_pct"] >= 10
    assert mine["top_thread_blocked_per_s"] >= 1
    assert mine["top_thread_sys_pct"] >= 0 and mine["top_thread_wait_pct"] >= 0 and mine["top_thread_faults_per_s"] >= 0


def test_the_itl_mean_is_the_rounds_own_tokens() -> None:
    assert itl_mean_ms((1.0, 100), (3.0, 1100)) == 2.0
    assert math.isnan(itl_mean_ms(None, (3.0, 1100)))
    assert math.isnan(itl_mean_ms((1.0, 100), (1.0, 100)))  # no token came


def _metrics_text(steps: list[int], itls_s: list[float]) -> str:
    """A /metrics text as vLLM's Prometheus logger writes these two histograms (its buckets, its labels)."""
    registry = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    tokens = Histogram("vllm:iteration_tokens_total", "tokens per engine step", list(labels),
                       buckets=[1, 8, 16, 32, 64, 128, 256, 512], registry=registry).labels(**labels)
    itl = Histogram("vllm:inter_token_latency_seconds", "ITL", list(labels), buckets=[0.01, 0.1],
                    registry=registry).labels(**labels)
    for n in steps:
        tokens.observe(n)
    for s in itls_s:
        itl.observe(s)
    return generate_latest(registry).decode()


def test_engine_figures_count_the_rounds_own_steps() -> None:
    before = parse_engine_counts(_metrics_text([20, 20, 100], [0.002] * 10))
    after = parse_engine_counts(_metrics_text([20, 20, 100, 30, 30, 30, 90], [0.002] * 10 + [0.003] * 20))
    assert before is not None and after is not None
    assert (before.steps, before.tokens, before.small_steps) == (3, 140, 2)
    figures = engine_figures(before, after, duration_s=2.0)
    assert figures["engine_steps_per_s"] == 2.0  # 4 steps in 2 s
    assert figures["engine_tokens_per_step"] == 45.0  # (3 × 30 + 90) / 4
    assert figures["engine_steps_over_cut_pct"] == 25.0  # the 90, over PREFILL_CUT
    assert figures["engine_itl_mean_ms"] == pytest.approx(3.0)
    assert parse_engine_counts("# no engine here\n") is None
    itl_only = parse_engine_counts(_metrics_text([], [0.002]).replace("vllm:iteration_tokens_total", "other"))
    assert itl_only is not None and itl_only.steps == 0
    assert math.isnan(engine_figures(itl_only, itl_only, 2.0)["engine_steps_per_s"])
    assert all(math.isnan(v) for v in engine_figures(None, after, 2.0).values())
    assert math.isnan(engine_figures(after, after, 2.0)["engine_steps_per_s"])  # nothing stepped


def test_the_engine_line_names_the_instructions_only_where_counted() -> None:
    nan = math.nan
    r = {"engine_steps_per_s": 395.2, "engine_tokens_per_step": 21.34, "engine_steps_over_cut_pct": 14.06,
         "engine_ipc": nan, "engine_instructions_per_step": nan}
    assert engine_line(r) == "395 steps/s, 21.3 tokens a step, 14.1% of steps over 64 tokens"
    r |= {"engine_ipc": 1.234, "engine_instructions_per_step": 12.3e6}
    assert engine_line(r).endswith("; engine thread 1.23 instructions a cycle, 12.3 M a step")
    assert engine_line({**r, "engine_steps_per_s": nan}) == ""
