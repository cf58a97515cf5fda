"""The soak's traffic: chat streams that must each end in a terminal event, and PoC mining/validation cycles.

A stream's outcome is `ok` (a `finish_reason`, a usage chunk with the requested token count, then `[DONE]`),
`failed` (an HTTP error, an SSE error event, or a malformed completion: an answer, but a wrong one) or `lost`
(the response started and then ended, broke or stalled past the read timeout without a terminal event).

PoC traffic follows the network's phases (dapi's generation phase, then its validation phase): a mining round,
then /stop, then validation jobs for nonces sampled from what that round delivered through its /generated
callbacks. Validations are not submitted during a round on purpose: in the fork jobs wait while a round is active,
and /stop cancels the queued ones there and here (docs/decisions.md, "Validation jobs run beside a mining round"),
so a validation queued mid-round may never be answered, by design.

Validations carry the chain's thresholds (`CHAIN_STAT_TEST`), as the network's validators send them: with the fork's
code default (`dist_threshold` 0.02) honest GPU artifacts fail wherever mining and validation ran on other kernels
(docs/decisions.md, "MoE near-tie routing"), and the H200 soak of 2026-12-02 did (52 of 120 validations). So that a
soak still sees how far apart they are, each validation's nonces are also recomputed directly (`/generate` with
`wait`) and their L2 to the delivered artifacts recorded: the bulk past 0.02 is kernel noise, one past 0.4 is a
wrong artifact.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import aiohttp

from bench.kernel_paths import CHAIN
from bench.load import percentile, prompt
from poc.validation import StatTest
from tests.integration.pow_util import Receiver, l2

MODEL = "tiny"
PUBLIC_KEY = "soak_pub_key"
# The chain's validation parameters (bench/kernel_paths.py, docs/decisions.md) as a request's `stat_test`, and the
# fork's code default threshold (poc/validation.py), reported beside them.
CHAIN_STAT_TEST = asdict(CHAIN)
FORK_DIST_THRESHOLD = StatTest().dist_threshold


@dataclass
class Stream:
    frontend: int
    outcome: str  # "ok" | "failed" | "lost"
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    detail: str = ""


async def chat_stream(session: aiohttp.ClientSession, base_url: str, i: int, max_tokens: int,
                      frontend: int) -> Stream:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft_s, finish, usage, error, is_open = 0.0, None, None, None, False
    try:
        async with session.post(f"{base_url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return Stream(frontend, "failed", detail=f"HTTP {resp.status}: {(await resp.text())[:160]}")
            is_open = True
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                ttft_s = ttft_s or time.perf_counter() - started
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    error = str(event["error"].get("message"))[:160]
                for choice in event.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                usage = event.get("usage") or usage
            else:
                return Stream(frontend, "lost", detail="stream ended without [DONE]")
    except (aiohttp.ClientError, TimeoutError) as e:
        return Stream(frontend, "lost" if is_open else "failed", detail=repr(e)[:160])
    except ValueError as e:  # an event that is not JSON: an answer, but a broken one
        return Stream(frontend, "failed", detail=f"malformed event: {e}"[:160])
    e2e_s = time.perf_counter() - started
    if error is not None:
        return Stream(frontend, "failed", detail=f"error event: {error}")
    if finish is None or not usage or usage.get("completion_tokens") != max_tokens:
        return Stream(frontend, "failed", detail=f"incomplete: finish_reason={finish} usage={usage}")
    return Stream(frontend, "ok", ttft_s=ttft_s, e2e_s=e2e_s)


async def chat_worker(session: aiohttp.ClientSession, base_urls: list[str], worker: int, stop_at: float,
                      max_tokens: int, ids, out: list[Stream]) -> None:
    """Keeps one stream open on its frontend until `stop_at`; the last one started is allowed to finish."""
    frontend = worker % len(base_urls)
    while time.monotonic() < stop_at:
        out.append(await chat_stream(session, base_urls[frontend], next(ids), max_tokens, frontend))


def summarize_chat(streams: list[Stream], duration_s: float, num_frontends: int) -> dict:
    ok = [s for s in streams if s.outcome == "ok"]
    outcomes = Counter(s.outcome for s in streams)
    per_frontend = [dict(Counter(s.outcome for s in streams if s.frontend == f), sent=sum(
        1 for s in streams if s.frontend == f)) for f in range(num_frontends)]
    return {
        "sent": len(streams), "completed": outcomes["ok"], "failed": outcomes["failed"], "lost": outcomes["lost"],
        "per_frontend": per_frontend,
        "errors": [f"{n}x {d}" for d, n in Counter(s.detail for s in streams if s.detail).most_common(5)],
        "req_per_s": len(ok) / duration_s,
        "ttft_p50_ms": percentile([s.ttft_s * 1e3 for s in ok], 50),
        "ttft_p99_ms": percentile([s.ttft_s * 1e3 for s in ok], 99),
        "e2e_p50_ms": percentile([s.e2e_s * 1e3 for s in ok], 50),
        "e2e_p99_ms": percentile([s.e2e_s * 1e3 for s in ok], 99),
    }


@dataclass(frozen=True)
class PowPlan:
    num_cycles: int
    mine_s: float
    validate_s: float
    validation_interval_s: float
    nonces_per_validation: int
    batch_size: int
    seq_len: int


@dataclass
class PowDriver:
    """Runs the plan's cycles through the frontends (alternating) and records what it asked for."""

    session: aiohttp.ClientSession
    base_urls: list[str]
    receiver: Receiver
    plan: PowPlan
    rounds: list[dict] = field(default_factory=list)
    # job id → the block hash and nonces it validates
    jobs: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    is_mining: bool = False
    # L2 between a delivered artifact and the same nonce recomputed directly, one per nonce validated
    distances: list[float] = field(default_factory=list)

    def _node(self, block_hash: str) -> dict:
        return {"block_hash": block_hash, "block_height": 1000, "public_key": PUBLIC_KEY, "node_id": 0,
                "node_count": 1, "params": {"model": MODEL, "seq_len": self.plan.seq_len},
                "batch_size": self.plan.batch_size, "url": self.receiver.url}

    async def _call(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
        async with self.session.request(method, url, json=body) as resp:
            return resp.status, await resp.json(content_type=None)

    async def run(self) -> None:
        for cycle in range(self.plan.num_cycles):
            pow_url = f"{self.base_urls[cycle % len(self.base_urls)]}/api/v1/pow"
            await self._mine(pow_url, f"SOAK_{cycle}")
            await self._validate(pow_url, f"SOAK_{cycle}", random.Random(cycle))

    async def stop(self, pow_url: str) -> None:
        status, body = await self._call("POST", f"{pow_url}/stop")
        if status != 200 or body.get("pow_status") != {"status": "STOPPED"}:
            self.errors.append(f"/stop: HTTP {status} {body}")
        self.is_mining = False

    async def _mine(self, pow_url: str, block_hash: str) -> None:
        status, body = await self._call("POST", f"{pow_url}/init/generate", self._node(block_hash))
        if status != 200:
            self.errors.append(f"/init/generate {block_hash}: HTTP {status} {body}")
            return
        self.is_mining = True
        started = time.monotonic()
        last = {}
        while time.monotonic() - started < self.plan.mine_s:
            await asyncio.sleep(1.0)
            status, body = await self._call("GET", f"{pow_url}/status")
            if status == 200 and body.get("status") == "GENERATING":
                last = body["stats"]
        await self.stop(pow_url)
        self.rounds.append({"block_hash": block_hash, "mine_s": time.monotonic() - started,
                            "total_processed": last.get("total_processed", 0),
                            "nonces_per_s": last.get("nonces_per_second", 0.0)})

    async def _validate(self, pow_url: str, block_hash: str, rng: random.Random) -> None:
        """Queued validations of honest artifacts: nonces sampled from the round's /generated callbacks."""
        arts = delivered_artifacts(self.receiver, block_hash)
        k = self.plan.nonces_per_validation
        started = time.monotonic()
        while time.monotonic() - started < self.plan.validate_s:
            if len(arts) < k:
                self.errors.append(f"{block_hash}: only {len(arts)} artifacts delivered, no validation sent")
                return
            nonces = sorted(rng.sample(sorted(arts), k))
            body = {**self._node(block_hash), "nonces": nonces, "wait": False, "stat_test": CHAIN_STAT_TEST,
                    "validation": {"artifacts": [{"nonce": n, "vector_b64": arts[n]} for n in nonces]}}
            status, reply = await self._call("POST", f"{pow_url}/generate", body)
            if status == 200 and reply.get("status") == "queued":
                self.jobs[reply["request_id"]] = (block_hash, nonces)
            else:
                self.errors.append(f"/generate {block_hash}: HTTP {status} {reply}")
            status, reply = await self._call("POST", f"{pow_url}/generate",
                                             {**self._node(block_hash), "nonces": nonces, "wait": True})
            if status == 200 and reply.get("status") == "completed":
                again = {a["nonce"]: a["vector_b64"] for a in reply["artifacts"]}
                self.distances += [l2(arts[n], again[n]) for n in nonces if n in again]
            else:
                self.errors.append(f"/generate wait {block_hash}: HTTP {status} {str(reply)[:300]}")
            await asyncio.sleep(self.plan.validation_interval_s)


def delivered_artifacts(receiver: Receiver, block_hash: str) -> dict[int, str]:
    return {a["nonce"]: a["vector_b64"] for b in receiver.bodies("generated") if b["block_hash"] == block_hash
            for a in b["artifacts"]}


def missing_validations(receiver: Receiver, jobs: dict[str, tuple[str, list[int]]]) -> list[str]:
    answered = {b["request_id"] for b in receiver.bodies("validated")}
    return [job_id for job_id in jobs if job_id not in answered]


def summarize_pow(driver: PowDriver) -> dict:
    """Checks every round's stream (no gap, nothing short of what /status counted) and every validation."""
    rounds, num_gaps = [], 0
    generated = receiver_nonces(driver.receiver)
    for r in driver.rounds:
        nonces = generated.get(r["block_hash"], [])
        unique = set(nonces)
        missing = (max(unique) + 1 - len(unique)) if unique else 0  # node 0 of 1: nonce x is x (poc/nonces.py)
        short = max(0, r["total_processed"] - len(unique))
        num_gaps += missing + short
        rounds.append({**r, "delivered": len(unique), "duplicates": len(nonces) - len(unique),
                       "missing": missing + short})
    validated = {b["request_id"]: b for b in driver.receiver.bodies("validated")}
    wrong = [f"{j}: {validated[j]}" for j, (_, nonces) in driver.jobs.items() if j in validated and (
        validated[j]["n_total"], validated[j]["n_mismatch"], validated[j]["fraud_detected"]) != (len(nonces), 0,
                                                                                                False)]
    missing_jobs = missing_validations(driver.receiver, driver.jobs)
    return {
        "rounds": rounds,
        "nonces_mined": sum(r["total_processed"] for r in rounds),
        "nonces_delivered": sum(r["delivered"] for r in rounds),
        "mining_nonces_lost": num_gaps,
        "validations_submitted": len(driver.jobs),
        "validated_callbacks": len(driver.jobs) - len(missing_jobs),
        "validations_without_callback": missing_jobs,
        "validations_wrong": wrong[:5], "num_validations_wrong": len(wrong),
        "recomputed": {"nonces": len(driver.distances), "max_l2": max(driver.distances, default=0.0),
                       "past_fork_default": sum(d > FORK_DIST_THRESHOLD for d in driver.distances),
                       "past_chain": sum(d > CHAIN_STAT_TEST["dist_threshold"] for d in driver.distances)},
        "callbacks_lost": num_gaps + len(missing_jobs),
        "errors": driver.errors[:10],
    }


def receiver_nonces(receiver: Receiver) -> dict[str, list[int]]:
    """Block hash → every nonce delivered by streamed /generated callbacks (duplicates kept)."""
    out: dict[str, list[int]] = {}
    for b in receiver.bodies("generated"):
        if "request_id" not in b:
            out.setdefault(b["block_hash"], []).extend(a["nonce"] for a in b["artifacts"])
    return out
