"""Unit tests for backend/loop.py's handlers with a fake engine and server: a lost frontend's requests end."""

from __future__ import annotations

import queue

from backend.control import ControlPlane
from backend.loop import BackendLoop
from backend.peers import FrontendLost
from protocol.generate import AbortRequest, ChatMessage, GenerateErrorReply, GenerateRequest, SamplingSpec

A, B = b"fe-a", b"fe-b"


class FakeEngine:
    poc = None

    def __init__(self) -> None:
        self.running: list[str] = []
        self.aborted: list[str] = []

    def add(self, engine_rid: str, msg: GenerateRequest) -> None:
        self.running.append(engine_rid)

    def abort(self, engine_rids: list[str]) -> None:
        self.aborted.extend(engine_rids)
        self.running = [r for r in self.running if r not in engine_rids]


class FakeServer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def send(self, identity: bytes, msg) -> None:
        self.sent.append((identity, msg))


def _loop() -> tuple[BackendLoop, FakeEngine, FakeServer]:
    engine, server = FakeEngine(), FakeServer()
    return BackendLoop(engine, server, queue.Queue(), ControlPlane("inst")), engine, server


def _generate(loop: BackendLoop, identity: bytes, rid: str) -> None:
    loop._handle(identity, GenerateRequest(rid=rid, sampling=SamplingSpec(max_tokens=8),
                                           messages=[ChatMessage(role="user", content="hi")], stream=True))


def test_loop_frontend_lost_aborts_its_requests_and_answers_503():
    loop, engine, server = _loop()
    for identity, rid in ((A, "1"), (B, "1"), (A, "2")):
        _generate(loop, identity, rid)
    loop._handle(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    assert engine.aborted == [f"{A.hex()}-1", f"{A.hex()}-2"]
    assert engine.running == [f"{B.hex()}-1"] and list(loop.owners) == [f"{B.hex()}-1"]
    assert loop.num_aborted == 2 and loop.num_handler_errors == 0
    assert [(identity, msg.rid) for identity, msg in server.sent] == [(A, "1"), (A, "2")]
    for _, msg in server.sent:
        assert isinstance(msg, GenerateErrorReply)
        assert (msg.error.status, msg.error.message) == (503, "frontend timed out")


def test_loop_frontend_lost_without_requests_changes_nothing():
    loop, engine, server = _loop()
    _generate(loop, B, "1")
    loop._handle(b"probe", FrontendLost(frontend_id="", silent_s=9.0))
    assert engine.aborted == [] and loop.num_aborted == 0 and server.sent == [] and len(loop.owners) == 1


def test_loop_abort_request_after_frontend_lost_is_not_counted_twice():
    loop, engine, _ = _loop()
    _generate(loop, A, "1")
    loop._handle(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    loop._handle(A, AbortRequest(rids=["1"]))  # the frontend was only partitioned: it aborts its orphans
    assert engine.aborted == [f"{A.hex()}-1"] and loop.num_aborted == 1


def test_loop_frontend_that_returns_can_reuse_its_request_ids():
    loop, engine, server = _loop()
    _generate(loop, A, "1")
    loop._handle(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    _generate(loop, A, "1")
    assert engine.running == [f"{A.hex()}-1"] and f"{A.hex()}-1" in loop.owners
    assert len(server.sent) == 1  # only the 503 for the aborted stream
