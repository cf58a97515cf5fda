"""bench/soak_traffic.py: how a chat stream's outcome is classified (ok / failed / lost), against a fake server."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from bench.soak_traffic import chat_stream

MAX_TOKENS = 4


def _event(payload: dict | str) -> bytes:
    return b"data: " + (payload if isinstance(payload, str) else json.dumps(payload)).encode() + b"\n\n"


CHUNK = _event({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
FINISH = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": MAX_TOKENS}})
DONE = _event("[DONE]")
SCRIPTS = {
    "complete": ([CHUNK, FINISH, USAGE, DONE], "ok"),
    "error_event": ([CHUNK, _event({"error": {"message": "backend died", "code": 503}}), DONE], "failed"),
    "no_usage": ([CHUNK, FINISH, DONE], "failed"),
    "no_finish": ([CHUNK, USAGE, DONE], "failed"),
    "closed_early": ([CHUNK, FINISH], "lost"),
    "stalled": ([CHUNK, None], "lost"),  # None: stop writing and hold the connection open
}


async def _serve(request: web.Request) -> web.StreamResponse:
    script, _ = SCRIPTS[request.match_info["case"]]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for chunk in script:
        if chunk is None:
            await asyncio.sleep(2)
            break
        await resp.write(chunk)
    return resp


async def _refuse(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "gated", "code": 503}}, status=503)


@pytest.fixture
async def server():
    app = web.Application()
    app.router.add_post("/{case}/v1/chat/completions", _serve)
    app.router.add_post("/v1/chat/completions", _refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("case", list(SCRIPTS))
async def test_soak_traffic_chat_stream_outcome(server, case):
    timeout = aiohttp.ClientTimeout(total=None, sock_read=0.5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        stream = await chat_stream(session, f"{server}/{case}", 0, MAX_TOKENS, frontend=1)
    assert (stream.outcome, stream.frontend) == (SCRIPTS[case][1], 1), stream
    if stream.outcome == "ok":
        assert 0 < stream.ttft_s <= stream.e2e_s


async def test_soak_traffic_chat_stream_http_error_is_failed(server):
    async with aiohttp.ClientSession() as session:
        stream = await chat_stream(session, server, 0, MAX_TOKENS, frontend=0)
    assert stream.outcome == "failed" and stream.detail.startswith("HTTP 503")
