"""What a system's servers did during one round, beside the client's figures (bench/rounds.py).

- **CPU by process**: each process of the system's groups, its share of a core over the round and that of its
  busiest thread. A Python process whose busiest thread nears 100% is bound by one GIL: it paces what passes
  through it, whatever the GPU could do. For that thread also what can slow it at the same share of a core: time
  in the kernel, time runnable but waiting for a core (the scheduler's run queue), page faults, preemptions, and
  how often it blocked (voluntary switches: each wait that slept, for the GIL among them; an engine thread that
  hands the GIL to another thread of its process every step blocks more often than one that does not).
- **The engine's own inter-token latency**: vLLM's `vllm:inter_token_latency_seconds` histogram, which both
  systems export on /metrics (ours from its processor process). vLLM times it by `EngineCoreOutputs.timestamp`,
  stamped in the engine process when a step's outputs are made, so its mean over the round is the engine's step
  cadence as each request saw it, before any detokenizing, HTTP or client. The client's TPOT minus it is the
  delivery's share.
- **The engine's steps**: vLLM's `vllm:iteration_tokens_total` histogram (tokens scheduled per step, both systems):
  steps per second, tokens per step, and the share of steps over 64 tokens. At the bench's load (prompts of ~190
  tokens: the generated models' tokenizer is byte-level; at most 64 requests in flight) a step carries more than 64
  tokens exactly when a prefill is in it. Such a mixed step runs chat's piecewise graph, not the full one, so two
  systems at the same arrival rate can differ in how many of their steps pay for it.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import httpx

from bench.procs import read_stat, stat_fields
from bench.prom import labelled, totals

ITL = "vllm:inter_token_latency_seconds"
STEPS = "vllm:iteration_tokens_total"
# The histogram bound that splits the bench's decode-only steps from those with a prefill (see the docstring).
PREFILL_CUT = 64


def _label(pid: str) -> str:
    """A process's title (setproctitle's, e.g. VLLM::EngineCore) or `python -m` module, else its program."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if "-m" in argv[:3] and argv.index("-m") + 1 < len(argv):
        return argv[argv.index("-m") + 1]
    return os.path.basename(argv[0].split()[0])


class ThreadSample(NamedTuple):
    """One thread's counters so far (Linux /proc/PID/task/TID)."""

    cpu_s: float  # user + kernel
    sys_s: float  # kernel
    wait_s: float  # runnable, waiting on the run queue for a core (schedstat; 0 where the kernel keeps none)
    faults: int  # minor page faults
    preempted: int  # involuntary context switches
    blocked: int  # voluntary context switches: each wait (for the GIL, a lock, the GPU, a socket) that slept


def thread_sample(task: str, tick: float) -> ThreadSample | None:
    """A thread's counters from its /proc task directory; None once it is gone."""
    if (fields := stat_fields(f"{task}/stat")) is None:
        return None
    try:
        with open(f"{task}/status") as f:
            switches = {k: int(v) for k, _, v in (line.partition(":\t") for line in f) if k.endswith("ctxt_switches")}
    except OSError:
        return None
    try:
        with open(f"{task}/schedstat") as f:
            wait_s = int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        wait_s = 0.0
    return ThreadSample((int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick, wait_s, int(fields[7]),
                        switches.get("nonvoluntary_ctxt_switches", 0), switches.get("voluntary_ctxt_switches", 0))


def process_cpu(pgids: list[int]) -> dict[int, dict]:
    """pid → its label, CPU seconds so far and each thread's counters (ThreadSample), for the live members of
    these process groups (Linux /proc; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK")
    wanted, out = set(pgids), {}
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        stat = read_stat(f"/proc/{pid}/stat")
        if stat is None or stat[0] not in wanted:
            continue
        threads = {}
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            if (t := thread_sample(f"/proc/{pid}/task/{tid}", tick)) is not None:
                threads[int(tid)] = t
        out[int(pid)] = {"label": _label(pid), "cpu_s": stat[1] / tick, "threads": threads}
    return out


_NONE = ThreadSample(0.0, 0.0, 0.0, 0, 0, 0)


def cpu_split(before: dict[int, dict], after: dict[int, dict], duration_s: float) -> list[dict]:
    """Per process alive at both ends: CPU % and its busiest thread's over the round (100 = one core), busiest
    process first; for that thread also its kernel %, run-queue wait %, page faults, preemptions and blocks per
    second."""
    out = []
    for pid, a in after.items():
        if (b := before.get(pid)) is None:
            continue
        deltas = [ThreadSample(*(x - y for x, y in zip(s, b["threads"].get(tid, _NONE), strict=True)))
                  for tid, s in a["threads"].items()]
        top = max(deltas, key=lambda d: d.cpu_s, default=_NONE)
        out.append({"pid": pid, "label": a["label"], "cpu_pct": 100 * (a["cpu_s"] - b["cpu_s"]) / duration_s,
                    "top_thread_pct": 100 * top.cpu_s / duration_s, "top_thread_sys_pct": 100 * top.sys_s / duration_s,
                    "top_thread_wait_pct": 100 * top.wait_s / duration_s,
                    "top_thread_faults_per_s": top.faults / duration_s,
                    "top_thread_preempted_per_s": top.preempted / duration_s,
                    "top_thread_blocked_per_s": top.blocked / duration_s})
    return sorted(out, key=lambda p: -p["cpu_pct"])


class EngineCounts(NamedTuple):
    """The server's engine histograms so far (vLLM's /metrics)."""

    itl_sum_s: float
    itl_count: float
    steps: float
    tokens: float
    small_steps: float  # steps of at most PREFILL_CUT tokens


def engine_counts(base_url: str) -> EngineCounts | None:
    """The engine's histograms from one /metrics scrape; None where it fails or lacks them."""
    try:
        return parse_engine_counts(httpx.get(f"{base_url}/metrics", timeout=30).text)
    except httpx.HTTPError:
        return None


def parse_engine_counts(text: str) -> EngineCounts | None:
    """The engine's histograms in a /metrics text; None where it lacks the inter-token latency (the steps count as
    none where only they are missing)."""
    found = totals(text)
    if f"{ITL}_count" not in found:
        return None
    return EngineCounts(found[f"{ITL}_sum"], found[f"{ITL}_count"], found.get(f"{STEPS}_count", 0.0),
                        found.get(f"{STEPS}_sum", 0.0), labelled(text, f"{STEPS}_bucket", le=f"{float(PREFILL_CUT)}"))


def engine_figures(before: EngineCounts | None, after: EngineCounts | None, duration_s: float) -> dict[str, float]:
    """The round's engine ITL mean (ms), steps per second, tokens per step and % of steps over PREFILL_CUT tokens;
    NaN where either scrape failed or nothing was stepped."""
    nan = float("nan")
    out = {"engine_itl_mean_ms": nan, "engine_steps_per_s": nan, "engine_tokens_per_step": nan,
           "engine_steps_over_cut_pct": nan}
    if before is None or after is None:
        return out
    out["engine_itl_mean_ms"] = itl_mean_ms((before.itl_sum_s, before.itl_count), (after.itl_sum_s, after.itl_count))
    if (steps := after.steps - before.steps) > 0:
        out["engine_steps_per_s"] = steps / duration_s
        out["engine_tokens_per_step"] = (after.tokens - before.tokens) / steps
        out["engine_steps_over_cut_pct"] = 100 * (1 - (after.small_steps - before.small_steps) / steps)
    return out


def itl_mean_ms(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float:
    """The round's mean engine inter-token latency in ms (NaN where either scrape failed or no token came)."""
    if before is None or after is None or after[1] <= before[1]:
        return float("nan")
    return 1000 * (after[0] - before[0]) / (after[1] - before[1])


def split_line(split: list[dict], limit: int = 5) -> str:
    """'label cpu% (top thread%)' for the busiest processes; for the busiest one's top thread also its kernel
    share, run-queue wait, page faults, preemptions and blocks."""
    parts = []
    for i, p in enumerate(p for p in split[:limit] if p["cpu_pct"] >= 1):
        more = ""
        if i == 0:
            more = (f": sys {p['top_thread_sys_pct']:.0f}%, run-queue wait {p['top_thread_wait_pct']:.1f}%, "
                    f"{p['top_thread_faults_per_s']:.0f} faults/s, {p['top_thread_preempted_per_s']:.0f} preempted/s, "
                    f"{p['top_thread_blocked_per_s']:.0f} blocked/s")
        parts.append(f"{p['label']} {p['cpu_pct']:.0f}% (top thread {p['top_thread_pct']:.0f}%{more})")
    return ", ".join(parts)


def engine_line(r: dict) -> str:
    """The round's engine steps, and its engine thread's instructions where the machine counts them; empty where
    no steps were counted."""
    if not math.isfinite(r["engine_steps_per_s"]):
        return ""
    line = (f"{r['engine_steps_per_s']:.0f} steps/s, {r['engine_tokens_per_step']:.1f} tokens a step, "
            f"{r['engine_steps_over_cut_pct']:.1f}% of steps over {PREFILL_CUT} tokens")
    if math.isfinite(r["engine_ipc"]):
        line += (f"; engine thread {r['engine_ipc']:.2f} instructions a cycle, "
                 f"{r['engine_instructions_per_step'] / 1e6:.1f} M a step")
    return line
