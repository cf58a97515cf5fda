"""Each engine step's batch, end time and host phases, logged the same way inside both systems' engine processes,
and what a round's log says: the step's cost by kind of batch, at equal batch sizes.

The round probe's figures (bench/round_probe.py) cannot split a longer inter-token latency into "more steps carry a
prefill" and "every step costs more": at an open load each system's batch follows from its own step time (Little's
law), and the prefill share from its own arrival handling. This log can. vLLM's `Scheduler.update_from_output` runs
once per finished batch in both engines (ours in its engine thread, `vllm serve`'s in its EngineCore process), so a
wrapper around it (the same code on both sides: a clock read and a tuple appended) records when each batch's outputs
were taken and what the batch held. The time from one record to the next is the engine's cadence. With async
scheduling that interval holds the next batch's scheduling, model-runner calls and launch, the wait for this batch
and its update; it counts as **decode-only** where this batch and its two neighbours carry one token per request,
and **mixed** otherwise. Decode-only intervals are compared per batch size (requests), so the two systems'
different batches do not enter the ratio. The steps that carry a prefill are counted too: at the same arrivals, a
system that gathers fewer arrivals into each such step runs more of them (issue 43's lead (a)); their tokens
beyond one a request are the prompt tokens each computed (the part the prefix cache did not hold).

The same wrapper times the interval's **host phases**, each vLLM's own code on both sides: `Scheduler.schedule`,
`GPUModelRunner.execute_model` and `sample_tokens` (for the next batch) and `update_from_output`. Identical code at
an equal batch that takes longer in one process runs slower there (caches, the GIL, a busy core), not longer; an
interval longer at equal phases spends its extra outside them (the loop around the step, waits). The model
runner's two phases also hold the waits for the device (sample_tokens reads the batch's tokens back); the
scheduler's two (schedule, update_from_output) are Python alone, the purest "same code, slower?" figure. On the
CPU build `vllm serve`'s model runner lives in a worker process: its two runner phases are missing there, and only
the scheduler's compare.

`bench/step_hook/sitecustomize.py` installs the wrappers where POCSERVE_BENCH_STEP_LOG names a directory (given to
both systems by `bench.serving --step-log`); each process that steps appends `steps-PID.tsv` there.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
ENV = "POCSERVE_BENCH_STEP_LOG"
# How often a process's records are written out (by a thread of the hook's, not the engine's).
FLUSH_S = 0.5
# Requests per batch-size bucket for the equal-batch comparison.
BUCKET = 8
# The figures of a bucket's list in round_steps' step_decode_by_batch that equal_batch_ratio compares: the interval,
# the host phases' sum, the scheduler's two phases (the list's field 1 is its count).
INTERVAL_FIELD, HOST_FIELD, SCHED_FIELD = 0, 2, 3
# An interval longer than this many times the median is an idle gap between loads, not a step.
IDLE_FACTOR = 10.0
# The host phases timed, in the order they are logged; the last is update_from_output itself.
PHASES = ("schedule", "execute", "sample", "update")
# module -> (class, {method: phase}) wrapped by the hook; update_from_output is wrap_scheduler's.
TIMED = {"vllm.v1.core.sched.scheduler": ("Scheduler", {"schedule": "schedule"}),
         "vllm.v1.worker.gpu_model_runner": ("GPUModelRunner", {"execute_model": "execute", "sample_tokens": "sample"})}


class Step(NamedTuple):
    at_s: float  # wall time (time.time()) when the batch's update ended
    tokens: int  # tokens the batch scheduled
    requests: int  # requests in the batch
    phases_ms: tuple[float, ...] = ()  # PHASES' latest durations; NaN where this process ran none

    @property
    def is_decode(self) -> bool:
        return self.tokens <= self.requests


class StepWriter:
    """One process's records: the engine's thread only appends a tuple; a daemon thread appends them to the file
    every FLUSH_S, so a round's records are on disk within FLUSH_S of its end, with no file write in the step."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"steps-{os.getpid()}.tsv"
        self._buffer: list[tuple] = []
        # The latest duration of each phase but the update (ms); -1 until the phase runs in this process.
        self.latest_ms = dict.fromkeys(PHASES[:-1], -1.0)

    def record(self, tokens: int, requests: int, update_ms: float) -> None:
        self._buffer.append((time.time(), tokens, requests, *self.latest_ms.values(), update_ms))

    def start(self) -> StepWriter:
        threading.Thread(target=self._flush_forever, name="bench-step-log", daemon=True).start()
        return self

    def _flush_forever(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        # Swapped before it is read: an append racing the swap lands in the list written below, never in none.
        records, self._buffer = self._buffer, []
        if records:
            with open(self.path, "a") as f:
                f.write("".join("\t".join(f"{v:.6f}" if isinstance(v, float) else str(v) for v in r) + "\n"
                                for r in records))


_writer: StepWriter | None = None


def writer() -> StepWriter:
    """This process's writer, started on first use (both wrapped modules share it)."""
    global _writer
    if _writer is None:
        _writer = StepWriter(os.environ[ENV]).start()
    return _writer


def wrap_timed(cls, methods: dict[str, str], log: StepWriter) -> None:
    """Each method's duration kept as its phase's latest (timing only; arguments and result untouched)."""
    for name, phase in methods.items():
        setattr(cls, name, _timed(getattr(cls, name), phase, log))


def _timed(method, phase: str, log: StepWriter):
    def call(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            log.latest_ms[phase] = 1000 * (time.perf_counter() - started)

    call.__wrapped__ = method  # type: ignore[attr-defined]
    call.step_log_phase = phase  # type: ignore[attr-defined]  # (vLLM's own decorators set __wrapped__ too)
    return call


def wrap_scheduler(scheduler_class, log: StepWriter) -> None:
    """Records each finished batch after vLLM's own update, with the phases' latest durations."""
    original = scheduler_class.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        started = time.perf_counter()
        result = original(self, scheduler_output, model_runner_output)
        log.record(scheduler_output.total_num_scheduled_tokens, len(scheduler_output.num_scheduled_tokens),
                   1000 * (time.perf_counter() - started))
        return result

    update_from_output.__wrapped__ = original  # type: ignore[attr-defined]
    update_from_output.step_log_phase = "update"  # type: ignore[attr-defined]
    scheduler_class.update_from_output = update_from_output


def install(module) -> None:
    """The hook's call once a TIMED module has loaded in a process that logs steps."""
    class_name, methods = TIMED[module.__name__]
    cls = getattr(module, class_name)
    wrap_timed(cls, methods, writer())
    if class_name == "Scheduler":
        wrap_scheduler(cls, writer())


def server_env(log_dir: Path, name: str, enabled: bool) -> dict[str, str]:
    """Where enabled, the environment that makes a system's processes log each engine step into system_dir (the
    hook first on their PYTHONPATH, then the repository for this module); else none."""
    if not enabled:
        return {}
    directory = system_dir(log_dir, name)
    directory.mkdir(parents=True, exist_ok=True)
    path = [str(REPO / "bench" / "step_hook"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {ENV: str(directory), "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def system_dir(log_dir: Path, name: str) -> Path:
    """Where one system's processes write their step logs under the bench's log directory."""
    return log_dir / f"steps-{name}"


def read_steps(directory: Path) -> dict[str, list[Step]]:
    """Every process's records in `directory`, by file name, in time order (a torn last line is skipped)."""
    out = {}
    for path in sorted(directory.glob("steps-*.tsv")):
        steps = []
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 3 + len(PHASES):
                try:
                    phases = tuple(ms if (ms := float(f)) >= 0 else math.nan for f in fields[3:])
                    steps.append(Step(float(fields[0]), int(fields[1]), int(fields[2]), phases))
                except ValueError:
                    continue
        out[path.name] = sorted(steps)
    return out


class Interval(NamedTuple):
    ms: float
    requests: int  # the batch whose update ended the interval
    is_decode: bool  # it, the batch before and the batch after it carried one token per request
    phases_ms: tuple[float, ...]


def intervals(steps: list[Step], start_s: float, end_s: float) -> list[Interval]:
    """The intervals between consecutive records that end within [start_s, end_s], idle gaps left out."""
    out = []
    for i in range(1, len(steps) - 1):
        prev, step, after = steps[i - 1], steps[i], steps[i + 1]
        if start_s <= step.at_s <= end_s and step.requests > 0:
            out.append(Interval(1000 * (step.at_s - prev.at_s), step.requests,
                                prev.is_decode and step.is_decode and after.is_decode, step.phases_ms))
    if not out:
        return out
    limit = IDLE_FACTOR * statistics.median(i.ms for i in out)
    return [i for i in out if i.ms <= limit]


NO_STEPS = {"step_decode_ms": math.nan, "step_mixed_ms": math.nan, "step_decode_count": 0, "step_mixed_count": 0,
            "step_prefill_count": math.nan, "step_prefill_tokens": math.nan,
            "step_decode_batch": math.nan, "step_decode_host_ms": math.nan, "step_decode_phases_ms": [],
            "step_decode_by_batch": {}}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def round_steps(directory: Path, start_s: float, end_s: float) -> dict:
    """One round's step figures from the process that stepped most in it (the engine): decode-only and mixed
    intervals' means and counts, the decode-only ones' mean batch, host phases and their sum (NaN where a phase ran
    elsewhere), per BUCKET-request bucket [interval mean, count, host mean, scheduler mean] for the pair's
    equal-batch ratios, and the steps with a prefill: how many, and their mean tokens beyond one a request."""
    best: list[Interval] = []
    best_steps: list[Step] = []
    for steps in read_steps(directory).values():
        found = intervals(steps, start_s, end_s)
        if len(found) > len(best):
            best, best_steps = found, steps
    decode = [i for i in best if i.is_decode]
    prefills = [s for s in best_steps if start_s <= s.at_s <= end_s and not s.is_decode]
    buckets: dict[int, list[Interval]] = defaultdict(list)
    for i in decode:
        buckets[i.requests // BUCKET].append(i)
    return {"step_decode_ms": _mean([i.ms for i in decode]),
            "step_mixed_ms": _mean([i.ms for i in best if not i.is_decode]),
            "step_decode_count": len(decode), "step_mixed_count": len(best) - len(decode),
            "step_prefill_count": len(prefills),
            "step_prefill_tokens": _mean([s.tokens - s.requests for s in prefills]),
            "step_decode_batch": _mean([i.requests for i in decode]),
            "step_decode_host_ms": _mean([sum(i.phases_ms) for i in decode]),
            "step_decode_phases_ms": [_mean([i.phases_ms[k] for i in decode]) for k in range(len(PHASES))],
            "step_decode_by_batch": {str(k): [_mean([i.ms for i in v]), len(v), _mean([sum(i.phases_ms) for i in v]),
                                         _mean([i.phases_ms[0] + i.phases_ms[-1] for i in v])]  # schedule, update
                                     for k, v in sorted(buckets.items())}}


def equal_batch_ratio(ours: dict[str, list], theirs: dict[str, list], field: int = INTERVAL_FIELD,
                      min_count: int = 20) -> float:
    """Ours' decode-only figure over theirs at equal batch (field 0: the interval, 2: the host phases' sum, 3: the
    scheduler's two, schedule and update_from_output): the per-bucket ratios' geometric mean, each weighted by the
    smaller of its two counts (buckets with fewer than min_count intervals on either side, or without the figure,
    left out); NaN where no bucket qualifies."""
    total, weight = 0.0, 0.0
    for key, mine in ours.items():
        if key not in theirs:
            continue
        other = theirs[key]
        w = min(mine[1], other[1])
        if w >= min_count and mine[field] > 0 and other[field] > 0:  # False for NaN
            total += w * math.log(mine[field] / other[field])
            weight += w
    return math.exp(total / weight) if weight else math.nan


def steps_line(r: dict) -> str:
    """The round's step log in words; empty where the round has none."""
    if not r["step_decode_count"] and not r["step_mixed_count"]:
        return ""
    phases = ", ".join(f"{name} {ms:.3f}" for name, ms in zip(PHASES, r["step_decode_phases_ms"], strict=True))
    return (f"{r['step_decode_count']} decode-only intervals, {r['step_decode_ms']:.3f} ms mean at "
            f"{r['step_decode_batch']:.1f} requests (host phases ms: {phases}; outside them "
            f"{r['step_decode_ms'] - r['step_decode_host_ms']:.3f}); {r['step_mixed_count']} mixed, "
            f"{r['step_mixed_ms']:.3f} ms mean; {r['step_prefill_count']} steps with a prefill, "
            f"{r['step_prefill_tokens']:.0f} prefill tokens each")
