"""The load generator and its statistics: N streaming chat completions at concurrency C over aiohttp.

TTFT is the time to the first SSE `data:` event. Both servers send their first event (the assistant role
chunk) only once the engine has produced the first token, so the definition is the same on both sides and
does not depend on whether the first token decodes to visible text (often not, with the random tiny model).
Output tokens come from the final usage chunk (`stream_options.include_usage`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp

_FILLER = ("Summarise the following notes for a colleague who missed the meeting. The team discussed the "
           "release schedule, the open bugs in the scheduler, and how the cache behaves under load.")


def prompt(i: int) -> str:
    """Deterministic and distinct per request (a shared prefix would let the prefix cache skip prefill)."""
    return f"Request {i}: {_FILLER}"


@dataclass
class Result:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    num_output_tokens: int = 0
    error: str = ""


async def _one(session: aiohttp.ClientSession, url: str, model: str, i: int, max_tokens: int) -> Result:
    body = {"model": model, "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft_s, last = 0.0, b""
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return Result(ok=False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                if not ttft_s:
                    ttft_s = time.perf_counter() - started
                if line.strip() != b"data: [DONE]":
                    last = line
        e2e_s = time.perf_counter() - started
    except aiohttp.ClientError as e:
        return Result(ok=False, error=repr(e))
    # Only the last event is parsed: client CPU is shared with the servers on a small machine.
    final = json.loads(last[len(b"data:"):]) if last else {}
    if "error" in final or not final.get("usage"):
        return Result(ok=False, error=f"bad final event: {last[:200]!r}")
    return Result(ok=True, ttft_s=ttft_s, e2e_s=e2e_s, num_output_tokens=final["usage"]["completion_tokens"])


def tokens_for(i: int, max_tokens: int, min_tokens: int | None) -> int:
    """Request i's max_tokens: all at max_tokens, or spread evenly over [min_tokens, max_tokens] by index (the same
    for every system). Requests of one length in a closed loop end together and come back together: their
    prefills then land in the same steps, in waves, which spread lengths break up (docs/benchmarks-history.md)."""
    if min_tokens is None or min_tokens >= max_tokens:
        return max_tokens
    return min_tokens + (i * 7919) % (max_tokens - min_tokens + 1)


def arrival_offsets(num_requests: int, rate: float, seed: int) -> list[float]:
    """Seconds from the load's start at which each request is sent: a Poisson process of `rate` requests/s
    (exponential gaps), seeded, so every system gets the same schedule for the same seed. The first goes at 0."""
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(num_requests):
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


async def run_load(base_url: str, model: str, *, num_requests: int, concurrency: int, max_tokens: int,
                   first_index: int = 0, min_tokens: int | None = None,
                   request_rate: float | None = None) -> tuple[list[Result], float]:
    """Returns each request's result and the wall time of the whole load (first send to last byte).

    Closed loop by default: a new request as soon as one of the `concurrency` ends, so a server that answers
    sooner holds more requests in decode at once (longer steps, higher TPOT, more throughput). With
    `request_rate` the load is open: requests arrive on a seeded Poisson schedule (the same for every system at
    the same `first_index`) and `concurrency` only caps those in flight, so both systems see the same offered
    load and their TPOT compare at it."""
    url = f"{base_url}/v1/chat/completions"
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    offsets = arrival_offsets(num_requests, request_rate, first_index) if request_rate else [0.0] * num_requests
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as s:
        async def gated(i: int) -> Result:
            if (wait_s := started + offsets[i] - time.perf_counter()) > 0:
                await asyncio.sleep(wait_s)
            async with sem:
                index = first_index + i
                return await _one(s, url, model, index, tokens_for(index, max_tokens, min_tokens))

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(i) for i in range(num_requests)))
        return list(results), time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(results: list[Result], duration_s: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft_ms = [r.ttft_s * 1e3 for r in ok]
    e2e_ms = [r.e2e_s * 1e3 for r in ok]
    # Time per output token after the first, per request (decode speed as one client sees it).
    tpot_ms = [(r.e2e_s - r.ttft_s) * 1e3 / (r.num_output_tokens - 1) for r in ok if r.num_output_tokens > 1]
    # Requests past their first token, on average over the load (Little's law on the client's clock): the decode
    # batch a TPOT was measured at. In a closed loop the system with the lower TTFT holds more (docs/decisions.md).
    decoding_mean = sum(r.e2e_s - r.ttft_s for r in ok) / duration_s if duration_s > 0 else float("nan")
    return {
        "num_requests": len(results), "num_ok": len(ok), "duration_s": duration_s,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "req_per_s": len(ok) / duration_s, "output_tok_per_s": sum(r.num_output_tokens for r in ok) / duration_s,
        "ttft_p50_ms": percentile(ttft_ms, 50), "ttft_p99_ms": percentile(ttft_ms, 99),
        "e2e_p50_ms": percentile(e2e_ms, 50), "e2e_p99_ms": percentile(e2e_ms, 99),
        "tpot_p50_ms": percentile(tpot_ms, 50),
        "tpot_mean_ms": sum(tpot_ms) / len(tpot_ms) if tpot_ms else float("nan"), "decoding_mean": decoding_mean,
    }
