"""bench/round_probe.py: CPU by process and thread over a round, and the engine's inter-token latency from two
scrapes."""

import math
import os
import time

from bench.round_probe import cpu_split, itl_mean_ms, process_cpu, split_line


def test_the_split_is_per_process_with_its_busiest_thread() -> None:
    before = {10: {"label": "frontend", "cpu_s": 5.0, "threads": {10: 4.0, 11: 1.0}},
              20: {"label": "VLLM::EngineCore", "cpu_s": 1.0, "threads": {20: 1.0}},
              30: {"label": "gone", "cpu_s": 1.0, "threads": {30: 1.0}}}
    after = {10: {"label": "frontend", "cpu_s": 6.0, "threads": {10: 4.9, 11: 1.1}},
             20: {"label": "VLLM::EngineCore", "cpu_s": 2.5, "threads": {20: 1.5, 21: 1.0}},  # 21 started meanwhile
             40: {"label": "new", "cpu_s": 9.0, "threads": {40: 9.0}}}
    split = cpu_split(before, after, duration_s=2.0)
    assert [p["label"] for p in split] == ["VLLM::EngineCore", "frontend"]  # busiest first; 30 and 40 not at both
    assert split[0]["cpu_pct"] == 75.0 and split[0]["top_thread_pct"] == 50.0
    assert round(split[1]["cpu_pct"]) == 50 and round(split[1]["top_thread_pct"]) == 45
    assert split_line(split) == "VLLM::EngineCore 75% (top thread 50%), frontend 50% (top thread 45%)"


def test_this_process_is_found_by_its_group_and_its_cpu_grows() -> None:
    me = os.getpid()
    before = process_cpu([os.getpgrp()])
    assert me in before and before[me]["label"]
    assert before[me]["threads"]  # at least the main thread
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    after = process_cpu([os.getpgrp()])
    mine = next(p for p in cpu_split(before, after, 1.0) if p["pid"] == me)
    assert mine["cpu_pct"] >= 10 and mine["top_thread_pct"] >= 10


def test_the_itl_mean_is_the_rounds_own_tokens() -> None:
    assert itl_mean_ms((1.0, 100), (3.0, 1100)) == 2.0
    assert math.isnan(itl_mean_ms(None, (3.0, 1100)))
    assert math.isnan(itl_mean_ms((1.0, 100), (1.0, 100)))  # no token came
