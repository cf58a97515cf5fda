"""Streaming chats as bench.beside_mining sends them: one stream's TTFT, TPOT and tokens (`stream_chat`), and
--streams of them kept going for --seconds (`chat_load`)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import numpy as np

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


def stream_chat(client: httpx.Client, base: str, args, out: list) -> None:
    """One streaming chat: (TTFT, TPOT, tokens). Events are told apart by bytes, not parsed: 16 streams of
    JSON parsing in one Python process capped the client near the H100's idle rate."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "Tell me a story."}], "stream": True,
            "max_tokens": args.max_tokens, "ignore_eos": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = None
    tokens = 0
    pending = b""
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            now = time.perf_counter()
            *events, pending = (pending + chunk).split(b"\n\n")
            for event in events:
                # The role preamble comes with the first token, on both servers. Text is not required: a
                # model of dummy weights samples tokens that detokenize to nothing, and those send no event.
                first = first or now
                if b'"usage":{' in event:
                    match = _COMPLETION_TOKENS.search(event)
                    tokens = int(match.group(1)) if match else 0
                elif event.strip() != b"data: [DONE]":
                    last = now
    assert first is not None and last is not None and tokens > 1, (first, last, tokens)
    out.append((first - started, (last - first) / (tokens - 1), tokens))


def chat_load(base: str, args) -> dict:
    """--streams concurrent streams, each restarted when it ends, for --seconds (each runs at least once)."""
    results: list = []
    deadline = time.perf_counter() + args.seconds
    started = time.perf_counter()
    errors: list[BaseException] = []

    def worker() -> None:
        # One client per stream, its connection kept: a client made per request (httpx.stream) builds an SSL
        # context each time, ~10-25 ms of the client's CPU under the GIL, and that counted as TTFT.
        try:
            with httpx.Client(timeout=600) as client:
                stream_chat(client, base, args, results)
                while time.perf_counter() < deadline:
                    stream_chat(client, base, args, results)
        except Exception as e:  # a dead stream would leave the figures of fewer streams than asked
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {args.streams} streams failed, the first: {errors[0]!r}")
    elapsed = time.perf_counter() - started
    ttft, tpot, tokens = (np.array(x) for x in zip(*results, strict=True))
    return {"tokens_per_s": float(tokens.sum() / elapsed), "num_requests": len(results),
            "ttft_p50_ms": float(np.percentile(ttft, 50) * 1000), "ttft_p99_ms": float(np.percentile(ttft, 99) * 1000),
            "tpot_p50_ms": float(np.percentile(tpot, 50) * 1000), "tpot_p99_ms": float(np.percentile(tpot, 99) * 1000)}
