"""Unit tests for frontend.backend_client against a fake backend: a real ZMQ ROUTER on ipc in tmp_path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import msgspec
import pytest
import zmq
import zmq.asyncio

from frontend.backend_client import BackendClient, BackendRequestError, BackendUnavailable
from protocol.codec import backend_codec
from protocol.common import BackendStats, ErrorInfo, Fingerprint
from protocol.control import DeadEvent, HelloRequest, PingRequest, PongReply, ReadyReply
from protocol.generate import AbortRequest, Delta, DeltasEvent, GenerateErrorReply, GenerateRequest, SamplingSpec
from protocol.version import PROTOCOL_VERSION

PING_INTERVAL_S = 0.05
BACKEND_TIMEOUT_S = 0.2
WAIT_S = 5.0


def _fingerprint() -> Fingerprint:
    return Fingerprint(protocol_version=PROTOCOL_VERSION, served_model_name="tiny", model_path="/m/tiny",
                       max_model_len=2048, block_size=16, dtype="bfloat16", vllm_version="0.26.0",
                       engine_device="cpu", poc_code_version="poc-v2")


def _stats(instance_id: str) -> BackendStats:
    return BackendStats(
        instance_id=instance_id, uptime_s=1.0, num_frontends=1, num_running=0, num_waiting=0, kv_cache_usage=0.0,
        num_engine_steps=0, num_prompt_tokens=0, num_generation_tokens=0, num_finished_requests=0,
        num_aborted_requests=0, num_rejected_frames=0, is_engine_ready=True)


class FakeBackend:
    """Plays the backend: answers pings and hellos itself, queues every other message for the test."""

    def __init__(self, address: str, instance_id: str = "inst-1") -> None:
        self.instance_id = instance_id
        self.is_answering = True
        # False while the engine "loads": hellos go unanswered, pings are still answered.
        self.is_ready = True
        self.num_hellos = 0
        self.received: asyncio.Queue = asyncio.Queue()
        self.peer: bytes | None = None
        self._codec = backend_codec()
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            self.peer = identity
            msg = self._codec.decode(payload)
            match msg:
                case PingRequest(ping_id=ping_id):
                    if self.is_answering:
                        await self.send(PongReply(ping_id=ping_id, stats=_stats(self.instance_id)))
                case HelloRequest():
                    self.num_hellos += 1
                    if self.is_answering and self.is_ready:
                        await self.send(ReadyReply(fingerprint=_fingerprint()))
                case _:
                    self.received.put_nowait(msg)

    async def send(self, msg: msgspec.Struct) -> None:
        await self.send_raw(self._codec.encode(msg))

    async def send_raw(self, payload: bytes) -> None:
        assert self.peer is not None, "no frontend has talked to the fake backend yet"
        await self._sock.send_multipart([self.peer, payload])

    async def expect(self, kind: type, timeout_s: float = WAIT_S):
        """The next queued message, which must be of `kind`."""
        msg = await asyncio.wait_for(self.received.get(), timeout_s)
        assert isinstance(msg, kind), msg
        return msg

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.term()


async def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        await asyncio.sleep(0.01)


@pytest.fixture
def address(tmp_path) -> str:
    return f"ipc://{tmp_path}/backend.ipc"


@pytest.fixture
async def backend(address) -> AsyncIterator[FakeBackend]:
    fake = FakeBackend(address)
    yield fake
    await fake.close()


def _make_client(address: str) -> BackendClient:
    return BackendClient(address, "fe-test", ping_interval_s=PING_INTERVAL_S, backend_timeout_s=BACKEND_TIMEOUT_S,
                         backend_wait_s=BACKEND_TIMEOUT_S, breaker_misses=3)


@pytest.fixture
async def client(address, backend) -> AsyncIterator[BackendClient]:
    """A client that finished its handshake with `backend`."""
    c = _make_client(address)
    await c.start()
    await wait_until(lambda: c.is_alive, what="handshake")
    yield c
    await c.close()


def _request(client: BackendClient) -> GenerateRequest:
    return GenerateRequest(rid=client.new_rid(), sampling=SamplingSpec(max_tokens=4), prompt="hi", stream=True)


def _delta(rid: str, text: str, finish_reason: str | None = None) -> Delta:
    return Delta(rid=rid, text=text, token_ids=[len(text)], finish_reason=finish_reason)


async def _collect(client: BackendClient, req: GenerateRequest) -> list[Delta]:
    return [d async for d in client.generate(req)]


async def _start_stream(client: BackendClient, backend: FakeBackend) -> tuple[GenerateRequest, asyncio.Task]:
    """A generate() in flight: the backend has received the request and sent nothing back yet."""
    req = _request(client)
    task = asyncio.create_task(_collect(client, req))
    assert await backend.expect(GenerateRequest) == req
    return req, task


async def test_backend_client_handshake_makes_it_alive(client, backend):
    assert client.is_alive and not client.is_breaker_open
    assert client.fingerprint == _fingerprint()
    assert client.stats is not None and client.stats.instance_id == "inst-1"
    assert backend.num_hellos == 1


async def test_backend_client_not_alive_until_ready(address, backend):
    backend.is_ready = False
    c = _make_client(address)
    await c.start()
    try:
        await wait_until(lambda: backend.num_hellos >= 2, what="hello retried on the next pong")
        assert not c.is_alive and not c.is_breaker_open
        backend.is_ready = True
        await wait_until(lambda: c.is_alive, what="handshake")
    finally:
        await c.close()


async def test_backend_client_generate_yields_until_finished(client, backend):
    req, task = await _start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[_delta(req.rid, "a"), _delta("someone-else", "x")]))
    await backend.send(DeltasEvent(deltas=[_delta(req.rid, "b")]))
    await backend.send(DeltasEvent(deltas=[_delta(req.rid, "c", "stop")]))
    deltas = await asyncio.wait_for(task, WAIT_S)
    assert [d.text for d in deltas] == ["a", "b", "c"]
    assert deltas[-1].finish_reason == "stop"
    assert backend.received.empty(), "a finished stream must not send an abort"


async def test_backend_client_generate_error_reply_raises_request_error(client, backend):
    req, task = await _start_stream(client, backend)
    info = ErrorInfo(status=400, message="prompt too long", type="BadRequestError", param="prompt")
    await backend.send(GenerateErrorReply(rid=req.rid, error=info))
    with pytest.raises(BackendRequestError) as exc:
        await asyncio.wait_for(task, WAIT_S)
    assert exc.value.info == info
    assert client.is_alive


async def test_backend_client_early_aclose_sends_abort(client, backend):
    req = _request(client)
    stream = client.generate(req)
    first = asyncio.ensure_future(anext(stream))
    await backend.expect(GenerateRequest)
    await backend.send(DeltasEvent(deltas=[_delta(req.rid, "a")]))
    assert (await asyncio.wait_for(first, WAIT_S)).text == "a"
    await stream.aclose()
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_backend_client_cancelled_consumer_sends_abort(client, backend):
    req, task = await _start_stream(client, backend)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_backend_client_dead_event_fails_streams_and_marks_down(client, backend):
    req, task = await _start_stream(client, backend)
    backend.is_answering = False  # a dead backend answers nothing after its DeadEvent
    await backend.send(DeadEvent(reason="engine step raised"))
    with pytest.raises(BackendUnavailable, match="engine step raised"):
        await asyncio.wait_for(task, WAIT_S)
    assert not client.is_alive
    with pytest.raises(BackendUnavailable):
        await _collect(client, _request(client))
    assert backend.received.empty(), "requests failed by the backend's death must not be aborted"


async def test_backend_client_new_instance_fails_requests_and_rehandshakes(client, backend):
    req, task = await _start_stream(client, backend)
    backend.instance_id = "inst-2"
    with pytest.raises(BackendUnavailable, match="restarted"):
        await asyncio.wait_for(task, WAIT_S)
    await wait_until(lambda: backend.num_hellos == 2 and client.is_alive, what="second handshake")
    assert client.stats.instance_id == "inst-2"
    req2, task2 = await _start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[_delta(req2.rid, "ok", "stop")]))
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
    req, task = await _start_stream(client, backend)
    await backend.send(DeltasEvent(deltas=[_delta(req.rid, "fine", "stop")]))
    assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["fine"]
    assert client.is_alive


async def test_backend_client_breaker_opens_without_backend_and_recovers(address):
    c = _make_client(address)
    await c.start()
    try:
        await wait_until(lambda: c.is_breaker_open, what="breaker open")
        assert not c.is_alive
        started = time.perf_counter()
        with pytest.raises(BackendUnavailable):
            await _collect(c, _request(c))
        assert time.perf_counter() - started < 0.05

        fake = FakeBackend(address)
        try:
            await wait_until(lambda: c.is_alive, what="recovery")
            assert not c.is_breaker_open
            req, task = await _start_stream(c, fake)
            await fake.send(DeltasEvent(deltas=[_delta(req.rid, "back", "stop")]))
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
    c = _make_client(address)
    await c.start()
    try:
        await wait_until(lambda: backend.peer is not None, what="first ping")
        await backend.send(ReadyReply(refusal="protocol version 1 != backend's 2"))
        await wait_until(lambda: c.incompatible is not None, what="refusal")
        with pytest.raises(BackendUnavailable, match="incompatible"):
            await _collect(c, _request(c))
    finally:
        await c.close()
