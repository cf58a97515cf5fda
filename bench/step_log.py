"""Each engine step's batch and start time, logged the same way inside both systems' engine processes, and what a
round's log says: the step's cost by kind of batch, at equal batch sizes.

The round probe's figures (bench/round_probe.py) cannot split a longer inter-token latency into "more steps carry a
prefill" and "every step costs more": at an open load each system's batch follows from its own step time (Little's
law), and the prefill share from its own arrival handling. This log can: vLLM's `Scheduler.update_from_output` runs
once per finished batch in both engines (ours in its engine thread, `vllm serve`'s in its EngineCore process), so a
wrapper around it (the same code on both sides, a clock read and a tuple appended) records when each batch's outputs
were taken and what the batch held. The time from one record to the next is the engine's cadence; with async
scheduling that interval holds the next batch's scheduling and launch, the wait for this batch and the previous one's
update, so an interval counts as **decode-only** where those three batches carry one token per request, and
**mixed** otherwise. Decode-only intervals are compared per batch size (requests), so the two systems' different
batches do not enter the ratio.

`bench/step_hook/sitecustomize.py` installs the wrapper where POCSERVE_BENCH_STEP_LOG names a directory (given to
both systems by `bench.serving --step-log`); each process appends `steps-PID.tsv` there: wall time, tokens, requests.
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
# An interval longer than this many times the median is an idle gap between loads, not a step.
IDLE_FACTOR = 10.0


class Step(NamedTuple):
    at_s: float  # wall time (time.time()) when the batch's outputs were taken
    tokens: int  # tokens the batch scheduled
    requests: int  # requests in the batch

    @property
    def is_decode(self) -> bool:
        return self.tokens <= self.requests


class StepWriter:
    """One process's records: the engine's thread only appends a tuple; a daemon thread appends them to the file
    every FLUSH_S, so a round's records are on disk within FLUSH_S of its end, with no file write in the step."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"steps-{os.getpid()}.tsv"
        self._buffer: list[tuple[float, int, int]] = []

    def record(self, tokens: int, requests: int) -> None:
        self._buffer.append((time.time(), tokens, requests))

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
                f.write("".join(f"{at:.6f}\t{tokens}\t{requests}\n" for at, tokens, requests in records))


def wrap_update_from_output(scheduler_class, writer: StepWriter) -> None:
    """Records each finished batch before vLLM's own update (timing only; arguments and result untouched)."""
    original = scheduler_class.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        writer.record(scheduler_output.total_num_scheduled_tokens, len(scheduler_output.num_scheduled_tokens))
        return original(self, scheduler_output, model_runner_output)

    update_from_output.__wrapped__ = original  # type: ignore[attr-defined]
    scheduler_class.update_from_output = update_from_output


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
            if len(fields) == 3:
                try:
                    steps.append(Step(float(fields[0]), int(fields[1]), int(fields[2])))
                except ValueError:
                    continue
        out[path.name] = sorted(steps)
    return out


class Interval(NamedTuple):
    ms: float
    requests: int  # the batch whose outputs ended the interval
    is_decode: bool  # it, the batch before and the batch after it carried one token per request


def intervals(steps: list[Step], start_s: float, end_s: float) -> list[Interval]:
    """The intervals between consecutive records that end within [start_s, end_s], idle gaps left out."""
    out = []
    for i in range(1, len(steps) - 1):
        prev, step, after = steps[i - 1], steps[i], steps[i + 1]
        if start_s <= step.at_s <= end_s and step.requests > 0:
            out.append(Interval(1000 * (step.at_s - prev.at_s), step.requests,
                                prev.is_decode and step.is_decode and after.is_decode))
    if not out:
        return out
    limit = IDLE_FACTOR * statistics.median(i.ms for i in out)
    return [i for i in out if i.ms <= limit]


NO_STEPS = {"step_decode_ms": math.nan, "step_mixed_ms": math.nan, "step_decode_count": 0, "step_mixed_count": 0,
            "step_decode_batch": math.nan, "step_decode_by_batch": {}}


def round_steps(directory: Path, start_s: float, end_s: float) -> dict:
    """One round's step figures from the process that stepped most in it (the engine): decode-only and mixed
    intervals' means and counts, the decode-only ones' mean batch, and their mean per BUCKET-request bucket (kept
    for the pair's equal-batch ratio)."""
    best: list[Interval] = []
    for steps in read_steps(directory).values():
        found = intervals(steps, start_s, end_s)
        if len(found) > len(best):
            best = found
    decode = [i for i in best if i.is_decode]
    mixed = [i for i in best if not i.is_decode]
    buckets: dict[int, list[float]] = defaultdict(list)
    for i in decode:
        buckets[i.requests // BUCKET].append(i.ms)
    nan = math.nan
    return {"step_decode_ms": statistics.fmean(i.ms for i in decode) if decode else nan,
            "step_mixed_ms": statistics.fmean(i.ms for i in mixed) if mixed else nan,
            "step_decode_count": len(decode), "step_mixed_count": len(mixed),
            "step_decode_batch": statistics.fmean(i.requests for i in decode) if decode else nan,
            "step_decode_by_batch": {str(k): [statistics.fmean(v), len(v)] for k, v in sorted(buckets.items())}}


def equal_batch_ratio(ours: dict[str, list], theirs: dict[str, list], min_count: int = 20) -> float:
    """Ours' decode-only step over theirs at equal batch: the per-bucket ratios' geometric mean, each weighted by
    the smaller of its two counts (buckets with fewer than min_count intervals on either side left out); NaN where
    no bucket qualifies."""
    total, weight = 0.0, 0.0
    for key, (mean, count) in ours.items():
        if key not in theirs:
            continue
        other_mean, other_count = theirs[key]
        w = min(count, other_count)
        if w >= min_count and mean > 0 and other_mean > 0:
            total += w * math.log(mean / other_mean)
            weight += w
    return math.exp(total / weight) if weight else math.nan


def steps_line(r: dict) -> str:
    """The round's step log in words; empty where the round has none."""
    if not r.get("step_decode_count") and not r.get("step_mixed_count"):
        return ""
    return (f"{r['step_decode_count']} decode-only intervals, {r['step_decode_ms']:.3f} ms mean at "
            f"{r['step_decode_batch']:.1f} requests; {r['step_mixed_count']} mixed, {r['step_mixed_ms']:.3f} ms mean")
