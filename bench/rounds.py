"""`bench.serving --rounds N`: both systems up at once, measured in interleaved rounds of equal work.

A single pass (one system, then the other) cannot tell 10%: on one H200 whichever system ran second gained about
as much as the difference between them (docs/benchmarks.md, issue 43). Here both servers are started once (one after
the other, so that each sizes its memory with the other already resident) and kept up; each is warmed as in the
single pass; then rounds of the same load (the same prompts, the same lengths) alternate A,B,B,A,A,B,... so that
each system runs first in half of the pairs. A pair is one round of each system; its ratio ours/vllm is one
sample, and the summary gives the median of the pairs' ratios with their min–max and IQR, and the medians of the
pairs in which ours ran first and in which it ran second (a drift or an order effect shows as their difference).
Whether the pairs can tell 5% is answered by the geometric mean of the ratios with its 95% interval (Student's t on
the log ratios, the pairs taken as independent samples): narrower than ±5%, a 5% difference stands out; wider, the
summary says how many pairs the same scatter would need. That interval assumes the log ratios scatter normally;
one stray round (`vllm serve` rounds at about half and a third of its others' rate were seen on the CPU engine)
widens it past use, so the median's own interval is given beside it, distribution-free (the sign test's order
statistics), and a round far from its system's others is named.

While one system runs its round the other is idle but up: its CPU is reported ("idle system" CPU %, should be ~0),
and on a GPU it holds its memory share (--gpu-memory-utilization applies to each; 0.4 each on one H200). Each round
waits first (--settle-s at most) until, over half a second, both servers used under 10% of a core: on the CPU
engine `vllm serve`'s worker process keeps spinning on its shared-memory queue for a second after its last step
(vLLM's `SpinCondition`), which took 28-49% of a core from our round after one of its own on 2 cores. With
--quiet-cores C it also waits for the whole machine to use under C cores (a machine shared with other work); the
"foreign" CPU of each round is printed either way, and the pair table shows the larger of its two rounds'.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.load import percentile, run_load, summarize
from bench.perf_counters import close_all, open_main_threads
from bench.procs import Proc, free_port, group_cpu_s, machine_busy_s, stop_all, wait_gpus_free, wait_http_ok
from bench.round_probe import cpu_split, engine_counts, engine_figures, engine_line, process_cpu, split_line
from bench.step_log import (
    FLUSH_S,
    HOST_FIELD,
    INTERVAL_FIELD,
    NO_STEPS,
    SCHED_FIELD,
    equal_batch_ratio,
    round_steps,
    steps_line,
    system_dir,
)

# Starts a system's processes: (args, model dir, port) -> (processes, the URL that answers 200 once ready).
Starter = Callable[[argparse.Namespace, Path, int], tuple[list[Proc], str]]
# Warms a system: (name, base URL, args) -> the warm-up rounds' TTFT p99s.
WarmUp = Callable[[str, str, argparse.Namespace], list[float]]

# Round j of each system sends prompts FIRST_INDEX + j * num_requests onwards: the same prompts for both systems in
# a pair, new ones in every round (the prefix cache must not skip a later round's prefill), all of one digit count
# (the prompts' token counts match across rounds). The warm-up's prompts start at 1,000,000 (bench.serving).
FIRST_INDEX = 10_000_000
# The pair's decode-only step ratio at equal batch sizes, and those of its host phases and of the scheduler's
# phases among them (vLLM's own code on both sides), from its rounds' step logs (bench/step_log.py).
EQUAL_BATCH = "step_decode_equal_batch"
EQUAL_BATCH_HOST = "step_host_equal_batch"
EQUAL_BATCH_SCHED = "step_sched_equal_batch"
PER_BUCKET = {EQUAL_BATCH: INTERVAL_FIELD, EQUAL_BATCH_HOST: HOST_FIELD, EQUAL_BATCH_SCHED: SCHED_FIELD}
RATIO_KEYS = (("requests/s", "req_per_s"), ("output tok/s", "output_tok_per_s"), ("TPOT p50", "tpot_p50_ms"),
              ("TTFT p50", "ttft_p50_ms"), ("e2e p50", "e2e_p50_ms"), ("in decode", "decoding_mean"),
              ("TPOT mean", "tpot_mean_ms"), ("engine ITL", "engine_itl_mean_ms"),
              ("step decode", "step_decode_ms"), ("step mixed", "step_mixed_ms"), ("step eq.batch", EQUAL_BATCH),
              ("host eq.batch", EQUAL_BATCH_HOST), ("sched eq.batch", EQUAL_BATCH_SCHED),
              ("prefill steps", "step_prefill_count"))


def round_order(first: str, second: str, pairs: int) -> list[tuple[int, str]]:
    """(pair, system) in run order: A,B then B,A, then A,B, ... (each system first in every other pair)."""
    order: list[tuple[int, str]] = []
    for pair in range(pairs):
        names = (first, second) if pair % 2 == 0 else (second, first)
        order += [(pair, name) for name in names]
    return order


def start_system(name: str, starter: Starter, args: argparse.Namespace, model_dir: Path) -> tuple[list[Proc], str]:
    """Starts one system and waits until it is ready; its processes and base URL."""
    port = free_port()
    procs, ready_url = starter(args, model_dir, port)
    try:
        startup_s = wait_http_ok(ready_url, procs, args.startup_timeout_s)
    except BaseException:
        stop_all(procs)
        raise
    print(f"[{name}] ready after {startup_s:.0f} s", flush=True)
    return procs, f"http://127.0.0.1:{port}"


SETTLE_WINDOW_S = 0.5
SETTLED_SERVERS_CORES = 0.1


def settle(procs: dict[str, list[Proc]], timeout_s: float, machine_cores: float | None) -> tuple[float, bool]:
    """Waits until a SETTLE_WINDOW_S window in which the servers were idle, and the machine too where machine_cores
    is given (module docstring), at most timeout_s; the seconds waited and whether it settled."""
    pgids = [p.pid for ps in procs.values() for p in ps]
    started = time.monotonic()
    while True:
        machine, servers = machine_busy_s(), group_cpu_s(pgids)
        time.sleep(SETTLE_WINDOW_S)
        servers = (group_cpu_s(pgids) - servers) / SETTLE_WINDOW_S
        machine = (machine_busy_s() - machine) / SETTLE_WINDOW_S
        waited_s = time.monotonic() - started
        if servers < SETTLED_SERVERS_CORES and (machine_cores is None or machine < machine_cores):
            return waited_s, True
        if waited_s >= timeout_s:
            return waited_s, False


def one_round(name: str, base_url: str, index: int, args: argparse.Namespace, procs: dict[str, list[Proc]],
              served_name: str) -> dict:
    """The system's `index`-th round of the load, with the CPU used meanwhile by it, by the idle system, by this
    client and by everything else ("foreign"; 100 % = one core for the whole round); the system's CPU by process
    and its engine's own inter-token latency and steps (bench/round_probe.py)."""
    idle = [p.pid for n, ps in procs.items() if n != name for p in ps]
    mine = [p.pid for p in procs[name]]
    engine_before = engine_counts(base_url)
    by_process = process_cpu(mine)
    cycles = open_main_threads(list(by_process))
    before = (machine_busy_s(), _total_cpu_s(by_process), group_cpu_s(idle), _client_cpu_s())
    started_at = time.time()
    results, duration_s = asyncio.run(run_load(base_url, served_name, num_requests=args.num_requests,
                                               concurrency=args.concurrency, max_tokens=args.max_tokens,
                                               first_index=FIRST_INDEX + index * args.num_requests,
                                               min_tokens=args.min_tokens, request_rate=args.request_rate))
    ended_at = time.time()
    by_process_after = process_cpu(mine)
    cycles_after = close_all(cycles)
    after = (machine_busy_s(), _total_cpu_s(by_process_after), group_cpu_s(idle), _client_cpu_s())
    split = cpu_split(by_process, by_process_after, duration_s)
    machine, server, idle_s, client = (a - b for a, b in zip(after, before, strict=True))
    engine = engine_figures(engine_before, engine_counts(base_url), duration_s)
    engine.update(main_thread_cycles(split, cycles_after, engine["engine_steps_per_s"] * duration_s))
    for ps in procs.values():
        for p in ps:
            p.check_running()
    steps = NO_STEPS
    if args.step_log:
        time.sleep(2 * FLUSH_S)  # the servers' last records of the round written out
        steps = round_steps(system_dir(args.log_dir, name), started_at, ended_at)
    return {**summarize(results, duration_s), **steps, "system": name, "servers_cpu_pct": 100 * server / duration_s,
            "idle_cpu_pct": 100 * idle_s / duration_s, "client_cpu_pct": 100 * client / duration_s,
            "foreign_cpu_pct": 100 * (machine - server - idle_s - client) / duration_s,
            "cpu_by_process": split, **engine}


def main_thread_cycles(split: list[dict], cycles: dict, steps: float) -> dict[str, float]:
    """Instructions per cycle of the busiest process's main thread (both systems' engine loop) over the round, and
    its instructions a step (bench/perf_counters.py); NaN where the machine has no hardware counters."""
    top = cycles.get(split[0]["pid"]) if split else None
    if top is None or not top.cycles:
        return {"engine_ipc": math.nan, "engine_instructions_per_step": math.nan}
    return {"engine_ipc": top.instructions / top.cycles,
            "engine_instructions_per_step": top.instructions / steps if steps > 0 else math.nan}


def _total_cpu_s(by_process: dict[int, dict]) -> float:
    """The system's CPU seconds so far, from its processes' (bench/round_probe.py process_cpu)."""
    return sum(p["cpu_s"] for p in by_process.values())


def _client_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_rounds(args: argparse.Namespace, model_dir: Path, starters: dict[str, Starter], warm_up: WarmUp,
               served_name: str) -> dict:
    """Starts args.systems (in that order), warms each, runs args.rounds pairs; stops both, also on Ctrl-C, and
    returns the rounds measured so far with their summary ("interrupted" says whether all ran)."""
    first, second = args.systems
    rounds: list[dict] = []
    procs: dict[str, list[Proc]] = {}
    interrupted = False
    try:
        waited_s, held = wait_gpus_free(args.gpu_free_timeout_s)
        if held:
            print(f"GPUs still held after {waited_s:.0f} s: {held}", flush=True)
        urls = {}
        for name in (first, second):
            procs[name], urls[name] = start_system(name, starters[name], args, model_dir)
        for name in (first, second):
            warm_up(name, urls[name], args)
        done = dict.fromkeys((first, second), 0)
        for pair, name in round_order(first, second, args.rounds):
            settle_s, settled = settle(procs, args.settle_s, args.quiet_cores)
            figures = {**one_round(name, urls[name], done[name], args, procs, served_name), "pair": pair,
                       "settle_s": settle_s, "settled": settled}
            done[name] += 1
            rounds.append(figures)
            print(round_line(len(rounds), figures), flush=True)
    except KeyboardInterrupt:  # a device call's time limit: the rounds measured so far are still summarised
        interrupted = True
    finally:
        for ps in reversed(list(procs.values())):
            stop_all(ps)
    return {"rounds": rounds, "summary": summarize_pairs(rounds), "interrupted": interrupted}


def pair_ratios(rounds: list[dict]) -> list[dict]:
    """Per complete pair: which system ran first and the ratio ours/vllm of each RATIO_KEYS figure."""
    by_pair: dict[int, dict[str, dict]] = {}
    for r in rounds:  # in run order: a pair's first entry is the system that ran first
        by_pair.setdefault(r["pair"], {})[r["system"]] = r
    out = []
    for pair, systems in sorted(by_pair.items()):
        if set(systems) != {"ours", "vllm"}:
            continue  # the last pair of an interrupted run
        first = next(iter(systems))
        foreign = max(r["foreign_cpu_pct"] for r in systems.values())
        ours, vllm = systems["ours"], systems["vllm"]
        buckets = ours["step_decode_by_batch"], vllm["step_decode_by_batch"]
        out.append({"pair": pair, "first": first, "foreign_cpu_pct_max": foreign,
                    **{key: _ratio(ours[key], vllm[key]) for _, key in RATIO_KEYS if key not in PER_BUCKET},
                    **{key: equal_batch_ratio(*buckets, field=field) for key, field in PER_BUCKET.items()}})
    return out


def _ratio(mine: float, other: float) -> float:
    return mine / other if other else math.nan  # a count of none on vLLM's side (prefill steps) has no ratio


# Student's t at 0.975 (a two-sided 95% interval) for 1..30 degrees of freedom; the normal's 1.96 beyond.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
TELLS = 0.05  # the difference the bench must tell (issue 43)


def _t975(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else 1.96


def interval(ratios: list[float]) -> dict[str, float] | None:
    """The geometric mean of the pairs' ratios and its 95% interval, on the log ratios (a ratio and its inverse
    weigh alike); its half-width in percent; and the pairs a ±TELLS interval would need at this scatter. None
    below two pairs."""
    n = len(ratios)
    if n < 2:
        return None
    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = _t975(n - 1) * sd / math.sqrt(n)
    limit = math.log1p(TELLS)
    needed = next((m for m in range(2, 10_000) if _t975(m - 1) * sd / math.sqrt(m) <= limit), 10_000)
    return {"geomean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half),
            "half_width_pct": 100 * math.expm1(half), "pairs_needed": needed}


def median_interval(ratios: list[float]) -> dict[str, float] | None:
    """The median of the pairs' ratios and a distribution-free interval for it of at least 95% coverage: the k-th
    smallest and k-th largest ratio, k the largest with P(Binomial(n, 1/2) < k) <= 2.5% (the sign test's order
    statistics). One stray pair moves it by one place at most. None below six pairs, where even [min, max] covers
    less than 95%."""
    n = len(ratios)
    tail = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    k = 0
    while sum(tail[:k + 1]) <= 0.025:
        k += 1
    if k == 0:
        return None
    ordered = sorted(ratios)
    return {"median": statistics.median(ordered), "low": ordered[k - 1], "high": ordered[n - k],
            "coverage": 1 - 2 * sum(tail[:k])}


# A round this many scaled median absolute deviations from its system's median requests/s is named as stray.
STRAY_MADS = 5.0


def stray_rounds(rounds: list[dict]) -> list[dict]:
    """Rounds whose requests/s lies more than STRAY_MADS scaled MADs (1.4826 × the MAD, the normal's σ) from the
    median of their system's rounds, with that median; none where a system has under four rounds or no scatter."""
    out = []
    for name in ("ours", "vllm"):
        mine = [(i, r) for i, r in enumerate(rounds) if r["system"] == name]
        values = [r["req_per_s"] for _, r in mine]
        if len(values) < 4:
            continue
        middle = statistics.median(values)
        mad = 1.4826 * statistics.median(abs(v - middle) for v in values)
        out += [{"round": i + 1, "system": name, "req_per_s": r["req_per_s"], "system_median": middle}
                for i, r in mine if mad > 0 and abs(r["req_per_s"] - middle) > STRAY_MADS * mad]
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": percentile(values, 50), "min": min(values), "max": max(values),
            "q1": percentile(values, 25), "q3": percentile(values, 75)}


def summarize_pairs(rounds: list[dict]) -> dict:
    """Each ratio's spread over the pairs, its medians by which system ran first, and each system's own spread of
    requests/s over its rounds (how much the machine moves between rounds of one system)."""
    pairs = pair_ratios(rounds)
    if not pairs:
        return {}
    # A figure a system could not give (engine ITL where /metrics lacks vLLM's histogram) is NaN: left out.
    values = {key: [p[key] for p in pairs if math.isfinite(p[key])] for _, key in RATIO_KEYS}
    ratios = {key: spread(v) for key, v in values.items() if v}
    intervals = {key: interval(v) for key, v in values.items()}
    median_intervals = {key: median_interval(v) for key, v in values.items()}
    by_first = {}
    for first in ("ours", "vllm"):
        chosen = [p["req_per_s"] for p in pairs if p["first"] == first]
        if chosen:
            by_first[first] = percentile(chosen, 50)
    own = {name: spread([r["req_per_s"] for r in rounds if r["system"] == name]) for name in ("ours", "vllm")}
    return {"pairs": pairs, "ratios": ratios, "intervals": intervals, "median_intervals": median_intervals,
            "req_per_s_ratio_by_first": by_first, "req_per_s_by_system": own,
            "req_per_s_by_previous": by_previous(rounds), "stray_rounds": stray_rounds(rounds)}


def by_previous(rounds: list[dict]) -> dict[str, dict[str, float]]:
    """Each system's median requests/s over its rounds after one of its own and after one of the other's (the
    first round follows the warm-ups, counted as neither). In A,B,B,A,... "first in the pair" goes with "after
    the other's round", so an effect of the previous round shows here and in the by-first medians alike."""
    out: dict[str, dict[str, float]] = {}
    for name in ("ours", "vllm"):
        for label, same in (("after_own", True), ("after_other", False)):
            values = [r["req_per_s"] for prev, r in itertools.pairwise(rounds)
                      if r["system"] == name and (prev["system"] == name) == same]
            if values:
                out.setdefault(name, {})[label] = percentile(values, 50)
    return out


def round_line(number: int, r: dict) -> str:
    return (f"round {number:2d} (pair {r['pair'] + 1}) {r['system']:>4}: {r['num_ok']}/{r['num_requests']} ok, "
            f"{r['req_per_s']:.2f} req/s, {r['output_tok_per_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.1f} ms, "
            f"TPOT p50 {r['tpot_p50_ms']:.2f} ms (mean {r['tpot_mean_ms']:.2f}, engine ITL mean "
            f"{r['engine_itl_mean_ms']:.2f}) at {r['decoding_mean']:.1f} in decode; CPU % servers "
            f"{r['servers_cpu_pct']:.0f}, idle system {r['idle_cpu_pct']:.0f}, client {r['client_cpu_pct']:.0f}, "
            f"foreign {r['foreign_cpu_pct']:.0f}; "
            f"{'settled' if r['settled'] else 'NOT settled'} after {r['settle_s']:.1f} s"
            + (f"\n    engine: {line}" if (line := engine_line(r)) else "")
            + (f"\n    steps: {line}" if (line := steps_line(r)) else "")
            + (f"\n    CPU by process: {split_line(r['cpu_by_process'])}" if r.get("cpu_by_process") else ""))


def print_summary(summary: dict) -> None:
    if not summary:
        print("no complete pair of rounds: no ratio")
        return
    pairs = summary["pairs"]
    shown = [(label, key) for label, key in RATIO_KEYS if any(math.isfinite(p[key]) for p in pairs)]
    print(f"\nper pair, ours/vllm:{'':9}" + "".join(f"{label:>15}" for label, _ in shown) + "  foreign CPU %")
    for p in pairs:
        print(f"pair {p['pair'] + 1:2d} ({p['first']} first)" + " " * (12 - len(p["first"]))
              + "".join(f"{p[key]:>15.3f}" for _, key in shown) + f"{p['foreign_cpu_pct_max']:>15.0f}")
    print(f"\nours/vllm over {len(pairs)} pairs: median [min–max] (IQR)")
    for label, key in RATIO_KEYS:
        if (s := summary["ratios"].get(key)) is None:
            continue
        width = 100 * (s["max"] - s["min"]) / s["median"]
        print(f"  {label:14} {s['median']:.3f} [{s['min']:.3f}–{s['max']:.3f}] (IQR {s['q1']:.3f}–{s['q3']:.3f}); "
              f"min–max {width:.1f}% of the median")
    print(f"ours/vllm, geometric mean [95% interval]: a {100 * TELLS:.0f}% difference stands out where the interval "
          f"is narrower than ±{100 * TELLS:.0f}%")
    for label, key in RATIO_KEYS:
        if (i := summary["intervals"][key]) is None:
            continue
        verdict = ("stands out" if i["half_width_pct"] <= 100 * TELLS
                   else f"does not; ~{i['pairs_needed']} pairs would at this scatter")
        print(f"  {label:14} {i['geomean']:.3f} [{i['low']:.3f}–{i['high']:.3f}], ±{i['half_width_pct']:.1f}%: "
              f"{100 * TELLS:.0f}% {verdict}")
    print("ours/vllm, median [distribution-free interval]: the sign test's, one stray pair cannot widen it far")
    for label, key in RATIO_KEYS:
        if (m := summary["median_intervals"][key]) is None:
            continue
        print(f"  {label:14} {m['median']:.3f} [{m['low']:.3f}–{m['high']:.3f}] ({100 * m['coverage']:.1f}% "
              f"coverage); {'excludes' if not m['low'] <= 1 <= m['high'] else 'holds'} 1.0")
    for r in summary["stray_rounds"]:
        print(f"  stray round {r['round']} ({r['system']}): {r['req_per_s']:.2f} req/s against its system's median "
              f"{r['system_median']:.2f}")
    by_first = summary["req_per_s_ratio_by_first"]
    print("  requests/s ratio, median by first system: "
          + ", ".join(f"{name} first {value:.3f}" for name, value in by_first.items()))
    for name, s in summary["req_per_s_by_system"].items():
        previous = summary["req_per_s_by_previous"].get(name, {})
        print(f"  {name} requests/s over its rounds: median {s['median']:.2f} [{s['min']:.2f}–{s['max']:.2f}]; "
              + ", ".join(f"{label.replace('_', ' ')} {value:.2f}" for label, value in previous.items()))
    print("TPOT/TTFT/e2e ratios: lower is better for ours; throughput target >= 0.95. 'in decode': the requests past "
          "their first token on average, the batch each TPOT was measured at")
