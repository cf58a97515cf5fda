"""Large bodies are parsed and validated in the frontend's worker process (frontend/body.py): the same answers as
FastAPI's own path, lists that can never fit refused before their items are validated, and the event loop free
meanwhile.

The real app over ASGI with a backend stand-in (tests/unit/test_frontend_errors.py's); the worker is real.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from frontend.body import INLINE_BODY_BYTES, BodyWorker
from tests.unit.test_frontend_errors import FP, make_app, request

PAD = "x" * (INLINE_BODY_BYTES + 1)  # a content that makes a body large


class CountingWorker(BodyWorker):
    """The real worker, counting the bodies it parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.parsed = 0

    async def parse(self, *args):
        self.parsed += 1
        return await super().parse(*args)


@pytest.fixture
def app():
    app = make_app()
    app.state.body_worker = CountingWorker()
    yield app
    app.state.body_worker.close()


def chat(content: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}


async def test_a_large_body_is_parsed_by_the_worker_and_served_as_a_small_one(app):
    small = await request(app, "POST", "/v1/chat/completions", json=chat("hi"))
    assert app.state.body_worker.parsed == 0
    large = await request(app, "POST", "/v1/chat/completions", json=chat(PAD))
    assert app.state.body_worker.parsed == 1
    assert small.status_code == large.status_code == 200, large.text
    assert large.json()["choices"] == small.json()["choices"]


@pytest.mark.parametrize("defect,param", [({"temperature": 5}, "temperature"), ({"bogus": 1}, "bogus"),
                                          ({"model": 7}, "model")])
async def test_a_large_bodys_validation_error_is_the_small_bodys(app, defect, param):
    small = await request(app, "POST", "/v1/chat/completions", json=chat("hi", **defect))
    large = await request(app, "POST", "/v1/chat/completions", json=chat(PAD, **defect))
    assert app.state.body_worker.parsed == 1
    assert small.status_code == large.status_code == 400
    assert large.json() == small.json()
    assert large.json()["error"]["param"] == param


async def test_a_large_malformed_body_is_the_same_400_as_a_small_one(app):
    headers = {"content-type": "application/json"}
    small = await request(app, "POST", "/v1/chat/completions", content=b'{"model": "tiny",', headers=headers)
    large = await request(app, "POST", "/v1/chat/completions",
                          content=b'{"model": "tiny", "x": "' + PAD.encode() + b'",', headers=headers)
    assert small.status_code == large.status_code == 400
    assert large.json()["error"]["message"].startswith("the request body is not valid JSON: ")
    assert large.json()["error"]["param"] is small.json()["error"]["param"] is None


# More messages than the context has tokens, and a large body (a small one is the processor's to refuse).
TOO_MANY = [{"role": "user", "content": ""}] * max(FP.max_model_len + 1, INLINE_BODY_BYTES // 20)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"model": "tiny", "messages": TOO_MANY}, "messages"),
    ("/tokenize", {"model": "tiny", "messages": TOO_MANY}, "messages"),
    ("/v1/responses", {"model": "tiny", "input": TOO_MANY}, "input"),
    ("/detokenize", {"model": "tiny", "tokens": [1] * (INLINE_BODY_BYTES // 2)}, "tokens"),
])
async def test_lists_longer_than_the_context_are_refused_by_count(app, path, body, param):
    r = await request(app, "POST", path, json=body)
    assert app.state.body_worker.parsed == 1
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert f"({FP.max_model_len}" in r.json()["error"]["message"]


async def test_the_event_loop_runs_while_a_huge_body_is_parsed(app):
    """500,000 empty messages (15 MB): the worker spends a while on them; the loop meanwhile goes on ticking.
    Parsed inline, the loop would stop for about as long as the request takes, in every attempt; a machine shared
    with other work starves this process now and then for a moment, which the next attempt does not repeat."""
    content = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": ""}] * 500_000}).encode()
    await request(app, "POST", "/v1/chat/completions", json=chat(PAD))  # the worker is up
    stalls = []
    for _ in range(3):
        gap, took = await _largest_loop_gap(app, content)
        if gap < took / 2:
            return
        stalls.append((round(gap, 3), round(took, 3)))
    raise AssertionError(f"the loop stopped in every attempt (gap, request, in s): {stalls}")


async def _largest_loop_gap(app, content: bytes) -> tuple[float, float]:
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    r = await request(app, "POST", "/v1/chat/completions", content=content,
                      headers={"content-type": "application/json"})
    took = time.monotonic() - started
    done.set()
    await ticker
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    return max(gaps, default=took), took  # no tick at all: the loop never ran while the request did
