"""Unit tests for frontend.backend_client against a fake backend: a real ZMQ ROUTER on ipc in tmp_path."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from frontend.backend_client import BackendRequestError, BackendUnavailable
from protocol.codec import backend_codec
from protocol.common import ErrorInfo
from protocol.control import DeadEvent, PingRequest, ReadyReply
from protocol.generate import AbortRequest, DeltasEvent, GenerateErrorReply, GenerateRequest
from tests.unit.fake_backend import (
    BACKEND_TIMEOUT_S,
    WAIT_S,
    FakeBackend,
    collect,
    delta,
    fingerprint,
    make_client,
    request,
    start_stream,
    wait_until,
)


async def test_backend_client_handshake_makes_it_alive(client, backend):
    assert client.is_alive and not client.is_breaker_open
    assert client.fingerprint == fingerprint()
    assert client.stats is not None and client.stats.link.instance_id == "inst-1"
    assert backend.num_hellos == 1


async def test_backend_client_not_alive_until_ready(address, backend):
    backend.is_ready = False
    c = make_client(address)
    await c.start()
    try:
        await wait_until(lambda: backend.num_hellos >= 2, what="hello retried on the next pong")
        assert not c.is_alive and not c.is_breaker_open
        backend.is_ready = True
        await wait_until(lambda: c.is_alive, what="handshake")
    finally:
        await c.close()


async def test_backend_client_generate_yields_until_finished(client, backend):
    req, task = await start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "a"), delta("someone-else", "x")]))
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "b")]))
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "c", "stop")]))
    deltas = await asyncio.wait_for(task, WAIT_S)
    assert [d.text for d in deltas] == ["a", "b", "c"]
    assert deltas[-1].finish_reason == "stop"
    assert backend.received.empty(), "a finished stream must not send an abort"


async def test_backend_client_generate_error_reply_raises_request_error(client, backend):
    req, task = await start_stream(client, backend)
    info = ErrorInfo(status=400, message="prompt too long", type="BadRequestError", param="prompt")
    await backend.send(GenerateErrorReply(rid=req.rid, error=info))
    with pytest.raises(BackendRequestError) as exc:
        await asyncio.wait_for(task, WAIT_S)
    assert exc.value.info == info
    assert client.is_alive


async def test_backend_client_early_aclose_sends_abort(client, backend):
    req = request(client)
    stream = client.generate(req)
    first = asyncio.ensure_future(anext(stream))
    await backend.expect(GenerateRequest)
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "a")]))
    assert (await asyncio.wait_for(first, WAIT_S)).text == "a"
    await stream.aclose()
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_backend_client_cancelled_consumer_sends_abort(client, backend):
    req, task = await start_stream(client, backend)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_backend_client_dead_event_fails_streams_and_marks_down(client, backend):
    _req, task = await start_stream(client, backend)
    backend.is_answering = False  # a dead backend answers nothing after its DeadEvent
    await backend.send(DeadEvent(reason="engine step raised"))
    with pytest.raises(BackendUnavailable, match="engine step raised"):
        await asyncio.wait_for(task, WAIT_S)
    assert not client.is_alive
    with pytest.raises(BackendUnavailable):
        await collect(client, request(client))
    assert backend.received.empty(), "requests failed by the backend's death must not be aborted"


async def test_backend_client_new_instance_fails_requests_and_rehandshakes(client, backend):
    _req, task = await start_stream(client, backend)
    backend.instance_id = "inst-2"
    with pytest.raises(BackendUnavailable, match="restarted"):
        await asyncio.wait_for(task, WAIT_S)
    await wait_until(lambda: backend.num_hellos == 2 and client.is_alive, what="second handshake")
    assert client.stats.link.instance_id == "inst-2"
    req2, task2 = await start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[delta(req2.rid, "ok", "stop")]))
    assert [d.text for d in await asyncio.wait_for(task2, WAIT_S)] == ["ok"]


@pytest.mark.parametrize("payload", [
    b"\xc1not msgpack",
    msgspec.msgpack.encode({"type": "no-such-tag"}),
    backend_codec().encode(PingRequest(ping_id=1)),  # a request type sent the wrong way
    b"\x82\xa4type\xa4dead\xa6reason\xa2\xc3\x28",  # invalid UTF-8
], ids=["garbage", "unknown-tag", "wrong-direction", "bad-utf8"])
async def test_backend_client_malformed_reply_is_counted_and_survived(client, backend, payload):
    await backend.send_raw(payload)
    await wait_until(lambda: client.num_malformed_replies == 1, what="malformed reply counted")
    req, task = await start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "fine", "stop")]))
    assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["fine"]
    assert client.is_alive


async def test_backend_client_breaker_opens_without_backend_and_recovers(address):
    c = make_client(address)
    await c.start()
    try:
        await wait_until(lambda: c.is_breaker_open, what="breaker open")
        assert not c.is_alive
        started = time.perf_counter()
        with pytest.raises(BackendUnavailable):
            await collect(c, request(c))
        # Failing fast, not waiting out backend_wait_s (BACKEND_TIMEOUT_S) for the backend to come back.
        assert time.perf_counter() - started < BACKEND_TIMEOUT_S / 2

        fake = FakeBackend(address)
        try:
            await wait_until(lambda: c.is_alive, what="recovery")
            assert not c.is_breaker_open
            req, task = await start_stream(c, fake)
            await fake.send(DeltasEvent(deltas=[delta(req.rid, "back", "stop")]))
            assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["back"]
        finally:
            await fake.close()
    finally:
        await c.close()


async def test_backend_client_unresponsive_backend_marks_down(client, backend):
    backend.is_answering = False
    await wait_until(lambda: not client.is_alive, what="marked down")
    await wait_until(lambda: client.is_breaker_open, what="breaker open")
    backend.is_answering = True
    await wait_until(lambda: client.is_alive and not client.is_breaker_open, what="recovery")


async def test_backend_client_refusal_makes_it_incompatible(address, backend):
    c = make_client(address)
    await c.start()
    try:
        await wait_until(lambda: backend.peer is not None, what="first ping")
        await backend.send(ReadyReply(refusal="protocol version 1 != backend's 2"))
        await wait_until(lambda: c.incompatible is not None, what="refusal")
        with pytest.raises(BackendUnavailable, match="incompatible"):
            await collect(c, request(c))
    finally:
        await c.close()
