"""A fake backend for the frontend's BackendClient tests: a real ZMQ ROUTER on ipc, and the helpers around it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from frontend.backend_client import BackendClient
from protocol.codec import backend_codec
from protocol.common import BackendStats, Fingerprint, LinkStats
from protocol.control import HelloRequest, PingRequest, PongReply, ReadyReply
from protocol.generate import Delta, GenerateRequest, SamplingSpec
from protocol.version import PROTOCOL_VERSION

PING_INTERVAL_S = 0.05
BACKEND_TIMEOUT_S = 0.2
# A backend still connected but not answering counts as hung after this (the client's backend_busy_s).
BUSY_S = 0.6
WAIT_S = 5.0


def fingerprint() -> Fingerprint:
    return Fingerprint(protocol_version=PROTOCOL_VERSION, served_model_name="tiny", model_path="/m/tiny",
                       max_model_len=2048, block_size=16, dtype="bfloat16", vllm_version="0.26.0",
                       engine_device="cpu", poc_code_version="poc-v2")


def stats(instance_id: str) -> BackendStats:
    return BackendStats(link=LinkStats(
        instance_id=instance_id, uptime_s=1.0, num_frontends=1, num_rejected_frames=0, outbox_depth=0,
        num_curve_refusals=0, is_engine_ready=True, engine_heartbeat_age_s=0.0))


class FakeBackend:
    """Plays the backend: answers pings and hellos itself, queues every other message for the test."""

    def __init__(self, address: str, instance_id: str = "inst-1", deltas_endpoint: str | None = None) -> None:
        self.instance_id = instance_id
        # Told in ReadyReply: where a (fake) processor sends deltas itself (backend/processor/direct.py).
        self.deltas_endpoint = deltas_endpoint
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
                        await self.send(PongReply(ping_id=ping_id, stats=stats(self.instance_id)))
                case HelloRequest():
                    self.num_hellos += 1
                    if self.is_answering and self.is_ready:
                        await self.send(ReadyReply(fingerprint=fingerprint(), deltas_endpoint=self.deltas_endpoint))
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


def make_client(address: str, busy_s: float = BUSY_S) -> BackendClient:
    return BackendClient(address, "fe-test", ping_interval_s=PING_INTERVAL_S, backend_timeout_s=BACKEND_TIMEOUT_S,
                         backend_wait_s=BACKEND_TIMEOUT_S, breaker_misses=3, backend_busy_s=busy_s)


def request(client: BackendClient) -> GenerateRequest:
    return GenerateRequest(rid=client.new_rid(), sampling=SamplingSpec(max_tokens=4), prompt="hi", stream=True)


def delta(rid: str, text: str, finish_reason: str | None = None) -> Delta:
    return Delta(rid=rid, text=text, token_ids=[len(text)], finish_reason=finish_reason)


async def collect(client: BackendClient, req: GenerateRequest) -> list[Delta]:
    return [d async for d in client.generate(req)]


async def start_stream(client: BackendClient, backend: FakeBackend) -> tuple[GenerateRequest, asyncio.Task]:
    """A generate() in flight: the backend has received the request and sent nothing back yet."""
    req = request(client)
    task = asyncio.create_task(collect(client, req))
    assert await backend.expect(GenerateRequest) == req
    return req, task
