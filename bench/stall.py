"""One hostile request beside normal chats: how long does a normal chat's first token wait while it runs?

    .venv/bin/python -m bench.stall [--cases all] [--json /tmp/stall.json]

Starts its own backend (embedded CPU engine, the generated tiny model, tests/stack.py's arguments) and one
frontend, then measures a normal streaming chat's TTFT (time to the first SSE event) on an idle stack, and again
while each hostile request of issue 33 is in flight on the same frontend:

- `chat_500k_empty`: a chat with 500,000 empty messages (15 MB);
- `tokenize_900k_empty`: /tokenize with 900,000 empty messages (27 MB);
- `detokenize_10m`: /detokenize of 10 million ids (20 MB);
- `chat_4096_empty`: a chat of 4,096 empty messages, as many as the context allows, so templated and tokenized
  (off the streams' path) before its 400.

Normal chats run one after another from just before the hostile request is sent until it is answered; each
case reports the hostile request's status and duration and the probes' TTFT (max, p95, p50, how many were over
the target, 2 × idle p50 + 50 ms). The hostile request goes from a thread of its own, so that its upload does
not hold the probes' event loop. The figures are for docs/benchmarks.md; nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.stack import running_stack

_PROBE = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there, how are you?"}], "max_tokens": 4,
          "stream": True, "ignore_eos": True}


def hostile_bodies() -> dict[str, tuple[str, bytes]]:
    """Case name → (path, JSON body), built once (their encoding is not part of what is measured)."""
    empty = b'{"role":"user","content":""}'
    return {
        "chat_500k_empty": ("/v1/chat/completions", b'{"model":"tiny","max_tokens":4,"messages":['
                            + b",".join([empty] * 500_000) + b"]}"),
        "tokenize_900k_empty": ("/tokenize", b'{"model":"tiny","messages":[' + b",".join([empty] * 900_000)
                                + b"]}"),
        "detokenize_10m": ("/detokenize", b'{"model":"tiny","tokens":[' + b",".join([b"1"] * 10_000_000) + b"]}"),
        # Within every count limit (4096 = the stack's max_model_len): templated on the processor's tokenize
        # thread, then refused by its token count.
        "chat_4096_empty": ("/v1/chat/completions", b'{"model":"tiny","max_tokens":4,"messages":['
                            + b",".join([empty] * 4096) + b"]}"),
    }


async def probe(session: aiohttp.ClientSession, base: str, failures: list[str] | None = None) -> float:
    """A normal chat's TTFT; a probe that fails (a stalled frontend is declared lost by the backend, which
    aborts its streams with 503) counts the time it took, and its error is kept in `failures`."""
    started = time.perf_counter()
    ttft = 0.0
    async with session.post(f"{base}/v1/chat/completions", json=_PROBE) as resp:
        if resp.status != 200 and failures is not None:
            failures.append(f"{resp.status}: {(await resp.text())[:120]}")
            return time.perf_counter() - started
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data:") and not ttft:
                ttft = time.perf_counter() - started
            if b'"error"' in line and failures is not None:
                failures.append(line[:120].decode(errors="replace"))
    return ttft


def post_raw(base_url: str, path: str, content: bytes) -> tuple[int, bytes]:
    """POST over a plain socket (sendall, one C loop without the GIL). httpx's sync writer slices the rest of the
    body after each send(), copying up to 20 MB a time with the GIL held: the test's own threads then stall for
    a second, which would be counted against the server."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=300) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                  f"content-length: {len(content)}\r\nconnection: close\r\n\r\n".encode())
        s.sendall(content)
        chunks = []
        while chunk := s.recv(1 << 20):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return int(head.split(b" ", 2)[1]), body


def _unchunk(data: bytes) -> bytes:
    out = []
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out.append(data[:n])
        data = data[n + 2:]
    return b"".join(out)


async def run_case(session: aiohttp.ClientSession, base: str, path: str, body: bytes, target_s: float) -> dict:
    """The hostile request is sent from a thread over a plain socket (`post_raw`): uploading 20 MB from the
    probes' own event loop, or with httpx, would delay the probes on the client's side."""
    outcome: dict = {}

    def hostile() -> None:
        started = time.perf_counter()
        try:
            status, answer = post_raw(base, path, body)
            outcome.update(status=status, response_bytes=len(answer), body_head=answer[:160].decode(errors="replace"))
        except OSError as e:
            outcome.update(status=None, error=repr(e))
        outcome["duration_s"] = round(time.perf_counter() - started, 3)

    task = asyncio.ensure_future(asyncio.to_thread(hostile))
    ttfts: list[float] = []
    failures: list[str] = []
    while not task.done():
        ttfts.append(await probe(session, base, failures))
    await task
    ordered = sorted(ttfts)
    return {**outcome, "probes": len(ttfts), "probe_failures": failures,
            "ttft_max_ms": round(1000 * ordered[-1], 1),
            "ttft_p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "probes_over_target": sum(t > target_s for t in ttfts)}


async def measure(base: str, cases: list[str], idle_n: int) -> dict:
    bodies = hostile_bodies()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(3):  # warm-up
            await probe(session, base)
        idle = [await probe(session, base) for _ in range(idle_n)]
        p50 = statistics.median(idle)
        report: dict = {"idle_ttft_p50_ms": round(1000 * p50, 1), "idle_ttft_max_ms": round(1000 * max(idle), 1),
                        "target_ms": round(1000 * (2 * p50 + 0.05), 1), "cases": {}}
        for name in cases:
            path, body = bodies[name]
            report["cases"][name] = {"body_mb": round(len(body) / 1e6, 1),
                                     **await run_case(session, base, path, body, 2 * p50 + 0.05)}
            print(name, report["cases"][name], flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="all", help="comma-separated case names, or all")
    parser.add_argument("--idle-probes", type=int, default=20)
    parser.add_argument("--model-dir", type=Path, default=Path("models/tiny-qwen3"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from backend.tools.modelgen import ensure_model

    cases = list(hostile_bodies()) if args.cases == "all" else args.cases.split(",")
    model_dir = ensure_model(args.model_dir, "tiny")
    with tempfile.TemporaryDirectory(prefix="stall-") as work, running_stack(model_dir, Path(work)) as stack:
        report = asyncio.run(measure(stack.base_url, cases, args.idle_probes))
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
