"""bench/step_log.py: the step records each engine process writes, and what a round's records say (decode-only and
mixed intervals, their host phases, the ratios at equal batch)."""

import math
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import step_log
from bench.step_log import (
    PHASES,
    Step,
    StepWriter,
    equal_batch_ratio,
    intervals,
    read_steps,
    round_steps,
    server_env,
    steps_line,
    wrap_scheduler,
    wrap_timed,
)


def _write(path: Path, steps: list[tuple], phases: tuple = (0.1, 0.5, 0.2, 0.3)) -> None:
    path.write_text("".join("\t".join(str(v) for v in (*s, *phases)) + "\n" for s in steps))


def test_records_reach_the_file_on_flush_and_read_back_in_order(tmp_path: Path) -> None:
    writer = StepWriter(str(tmp_path))
    writer.record(64, 64, 0.25)
    writer.latest_ms.update(schedule=0.5, execute=1.5, sample=0.75)
    writer.record(250, 65, 0.5)
    assert not writer.path.exists()  # the engine's thread only appends
    writer.flush()
    writer.flush()  # nothing new: nothing written
    (tmp_path / "steps-1.tsv").write_text("1.0\t8\t8\t1\t1\t1\t1\n2.0\t8\t8\t1")  # a torn last line
    found = read_steps(tmp_path)
    assert writer.path.name == f"steps-{os.getpid()}.tsv"
    mine = found[writer.path.name]
    assert [(s.tokens, s.requests) for s in mine] == [(64, 64), (250, 65)]
    assert mine[0].at_s <= mine[1].at_s <= time.time()
    assert all(math.isnan(ms) for ms in mine[0].phases_ms[:3])  # no runner phase had run yet in this process
    assert mine[0].phases_ms[3] == 0.25
    assert mine[1].phases_ms == (0.5, 1.5, 0.75, 0.5)
    assert found["steps-1.tsv"] == [Step(1.0, 8, 8, (1.0, 1.0, 1.0, 1.0))]


def test_the_flush_thread_writes_without_the_engine_thread(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(step_log, "FLUSH_S", 0.01)
    writer = StepWriter(str(tmp_path)).start()
    writer.record(8, 8, 0.1)
    # The file is created by the flush's open, a moment before its write: wait for the line, not the file.
    deadline = time.monotonic() + 30
    while "\n" not in (text := writer.path.read_text() if writer.path.exists() else "") and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert "\t8\t8\t" in text
    assert any(t.name == "bench-step-log" and t.daemon for t in threading.enumerate())


def test_an_interval_is_decode_only_where_it_and_its_neighbours_carry_one_token_a_request() -> None:
    # 10 ms apart; the batch at t=0.04 carried a prefill (200 tokens for 11 requests)
    steps = [Step(0.01 * i, 10, 10) for i in range(4)] + [Step(0.04, 200, 11)] + \
        [Step(0.01 * i, 11, 11) for i in range(5, 9)]
    found = intervals(steps, 0.0, 1.0)
    assert [round(i.ms, 3) for i in found] == [10.0] * 7  # the first and last record end no whole interval
    assert [i.is_decode for i in found] == [True, True, False, False, False, True, True]
    assert [i.requests for i in found] == [10, 10, 10, 11, 11, 11, 11]
    assert [round(i.ms) for i in intervals(steps, 0.025, 0.055)] == [10, 10, 10]  # ends at 0.03, 0.04, 0.05


def test_idle_gaps_and_empty_batches_are_not_steps() -> None:
    steps = [Step(0.01 * i, 8, 8) for i in range(20)] + [Step(5.0, 8, 8), Step(5.01, 0, 0), Step(5.02, 8, 8),
                                                       Step(5.03, 8, 8)]
    found = intervals(steps, 0.0, 10.0)
    assert all(i.ms < 20 for i in found)  # the 4.81 s gap before 5.0 is left out
    assert all(i.requests > 0 for i in found)
    assert intervals([], 0.0, 1.0) == []


def test_a_round_is_read_from_the_process_that_stepped_most(tmp_path: Path) -> None:
    engine = [(1000 + 0.002 * i, 32 if i % 10 else 220, 32) for i in range(101)]
    _write(tmp_path / "steps-10.tsv", engine)
    _write(tmp_path / "steps-11.tsv", [(1000.0, 4, 4), (1000.1, 4, 4), (1000.2, 4, 4)])  # another process
    r = round_steps(tmp_path, 1000.0, 1001.0)
    assert r["step_decode_count"] + r["step_mixed_count"] == 99
    assert r["step_mixed_count"] == 3 * 10 - 1  # each prefill batch and its two neighbours' intervals; one at the end
    assert r["step_decode_ms"] == pytest.approx(2.0, rel=1e-3)
    assert r["step_mixed_ms"] == pytest.approx(2.0, rel=1e-3)
    assert r["step_decode_batch"] == 32
    assert r["step_decode_host_ms"] == pytest.approx(1.1)
    assert r["step_decode_phases_ms"] == pytest.approx([0.1, 0.5, 0.2, 0.3])
    assert list(r["step_decode_by_batch"]) == ["4"]  # 32 // BUCKET
    assert r["step_decode_by_batch"]["4"] == pytest.approx([2.0, r["step_decode_count"], 1.1, 0.4], rel=1e-3)
    assert (r["step_prefill_count"], r["step_prefill_tokens"]) == (11, 188)  # steps 0, 10, ..., 100; 220 - 32
    assert steps_line(r) == (
        "70 decode-only intervals, 2.000 ms mean at 32.0 requests (host phases ms: schedule 0.100, execute 0.500, "
        "sample 0.200, update 0.300; outside them 0.900); 29 mixed, 2.000 ms mean; 11 steps with a prefill, "
        "188 prefill tokens each")
    assert round_steps(tmp_path, 1000.005, 1000.099)["step_prefill_count"] == 4  # steps 10, 20, 30, 40 end within
    empty = round_steps(tmp_path, 0.0, 1.0)
    assert empty["step_decode_count"] == 0 and math.isnan(empty["step_decode_ms"])
    assert steps_line(empty) == ""


def test_the_equal_batch_ratios_weigh_buckets_both_sides_fill() -> None:
    ours = {"3": [2.2, 100, 1.0], "4": [2.4, 50, 1.5], "5": [9.0, 5, 9.0]}
    theirs = {"3": [2.0, 40, 1.0], "4": [2.0, 100, math.nan], "6": [1.0, 100, 1.0]}
    # buckets 3 (weight 40, ratio 1.1) and 4 (weight 50, ratio 1.2); 5 too few, 6 on one side only
    expected = math.exp((40 * math.log(1.1) + 50 * math.log(1.2)) / 90)
    assert equal_batch_ratio(ours, theirs) == pytest.approx(expected)
    assert equal_batch_ratio(ours, theirs, field=2) == pytest.approx(1.0)  # bucket 4 has no host figure on one side
    assert math.isnan(equal_batch_ratio(ours, {"6": [1.0, 100, 1.0]}))
    assert math.isnan(equal_batch_ratio({}, {}))


def test_the_wrappers_record_each_batch_with_its_phases_and_change_nothing(tmp_path: Path) -> None:
    class Scheduler:
        def schedule(self, throttle=False):
            return f"batch {throttle}"

        def update_from_output(self, scheduler_output, model_runner_output):
            return {"outputs": model_runner_output}

    writer = StepWriter(str(tmp_path))
    original = Scheduler.update_from_output
    wrap_timed(Scheduler, {"schedule": "schedule"}, writer)
    wrap_scheduler(Scheduler, writer)
    scheduler = Scheduler()
    assert scheduler.schedule(throttle=True) == "batch True"
    out = SimpleNamespace(total_num_scheduled_tokens=230, num_scheduled_tokens={"a": 200, "b": 30})
    assert scheduler.update_from_output(out, "model output") == {"outputs": "model output"}
    assert Scheduler.update_from_output.__wrapped__ is original
    assert (Scheduler.update_from_output.step_log_phase, Scheduler.schedule.step_log_phase) == ("update", "schedule")
    writer.flush()
    [step] = read_steps(tmp_path)[writer.path.name]
    assert (step.tokens, step.requests) == (230, 2)
    schedule_ms, execute_ms, sample_ms, update_ms = step.phases_ms
    assert 0 <= schedule_ms < 1000 and 0 <= update_ms < 1000
    assert math.isnan(execute_ms) and math.isnan(sample_ms)
    assert len(PHASES) == 4


def test_the_servers_get_the_hook_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert server_env(tmp_path, "ours", False) == {}
    env = server_env(tmp_path, "vllm", True)
    assert env[step_log.ENV] == str(tmp_path / "steps-vllm")
    assert (tmp_path / "steps-vllm").is_dir()
    hook, repo, given = env["PYTHONPATH"].split(os.pathsep)
    assert (Path(hook) / "sitecustomize.py").is_file()
    assert (Path(repo) / "bench" / "step_log.py").is_file()
    assert given == "/elsewhere"


def test_engine_step_compares_vllms_phases_at_equal_batch_over_each_measured_window(tmp_path: Path) -> None:
    """bench.engine_step --step-log: each system's log read over its own measured steps (window_s), ours over the
    other system at equal batch. Ours' phases cost twice theirs at the same 8 requests; its intervals 1.5x."""
    from bench.engine_step import step_log_lines

    for system, gap, phases, start in (("ours", 0.015, (0.2, 1.0, 0.4, 0.6), 100.0),
                                       ("vllm-core", 0.010, (0.1, 0.5, 0.2, 0.3), 200.0)):
        directory = step_log.system_dir(tmp_path, system)
        directory.mkdir()
        # 10 warm-up steps of 16 requests before the window, then 40 of 8 inside it
        _write(directory / "steps-7.tsv", [(start + gap * i, 16 if i < 10 else 8, 16 if i < 10 else 8)
                                           for i in range(50)], phases)
    figures = {"ours": {"window_s": [100.0 + 0.015 * 9.5, 101.0]},
               "vllm-core": {"window_s": [200.0 + 0.010 * 9.5, 201.0]}}
    lines = step_log_lines(tmp_path, figures)
    assert lines[0].startswith("ours  step log: ") and "at 8.0 requests" in lines[0]  # the warm-up left out
    assert lines[1].startswith("vllm-core step log: ")
    assert lines[2] == ("ours/vllm-core at equal batch: decode interval 1.500, vLLM's phases 2.000, "
                        "the scheduler's 2.000")
