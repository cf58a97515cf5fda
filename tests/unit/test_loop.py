"""Unit tests for backend/loop.py's handlers with a fake engine and server: a lost frontend's requests end;
long requests are tokenized off the engine thread and can be aborted meanwhile."""

from __future__ import annotations

import queue
import threading

from backend.control import ControlPlane
from backend.errors import RequestError
from backend.loop import INLINE_TEXT_CHARS, BackendLoop, PreparedRequest
from backend.peers import FrontendLost
from protocol.generate import AbortRequest, ChatMessage, GenerateErrorReply, GenerateRequest, SamplingSpec

A, B = b"fe-a", b"fe-b"


class FakeEngine:
    poc = None

    def __init__(self) -> None:
        self.running: list[str] = []
        self.aborted: list[str] = []
        self.prepared_on: list[str] = []  # thread names
        self.release = threading.Event()
        self.release.set()
        self.refuse = False

    def prepare(self, msg: GenerateRequest) -> str:
        self.prepared_on.append(threading.current_thread().name)
        self.release.wait(5)
        if self.refuse:
            raise RequestError("prompt too long", param="prompt")
        return f"prepared {msg.rid}"

    def add(self, engine_rid: str, msg: GenerateRequest, prepared=None) -> None:
        assert prepared in (None, f"prepared {msg.rid}")
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


def _generate_long(loop: BackendLoop, identity: bytes, rid: str) -> None:
    loop._handle(identity, GenerateRequest(rid=rid, sampling=SamplingSpec(max_tokens=8),
                                           prompt="x" * (INLINE_TEXT_CHARS + 1), stream=True))


def _deliver_prepared(loop: BackendLoop) -> PreparedRequest:
    """Waits for the prepare thread's inbox item and handles it on this (the engine) thread."""
    identity, item = loop.inbox.get(timeout=5)
    assert isinstance(item, PreparedRequest)
    loop._handle(identity, item)
    return item


def test_loop_long_prompt_is_prepared_off_the_engine_thread_then_added():
    loop, engine, server = _loop()
    _generate(loop, A, "short")
    _generate_long(loop, A, "long")
    assert engine.running == [f"{A.hex()}-short"] and f"{A.hex()}-long" in loop.preparing
    _deliver_prepared(loop)
    assert engine.running == [f"{A.hex()}-short", f"{A.hex()}-long"] and not loop.preparing
    assert engine.prepared_on == ["prepare_0"] and server.sent == []


def test_loop_long_prompt_aborted_while_preparing_never_reaches_the_engine():
    loop, engine, server = _loop()
    engine.release.clear()
    _generate_long(loop, A, "1")
    loop._handle(A, AbortRequest(rids=["1"]))
    engine.release.set()
    _deliver_prepared(loop)
    assert engine.running == [] and engine.aborted == [] and loop.num_aborted == 1
    assert server.sent == [] and not loop.preparing and not loop.owners


def test_loop_frontend_lost_while_preparing_answers_503_once():
    loop, engine, server = _loop()
    engine.release.clear()
    _generate_long(loop, A, "1")
    loop._handle(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    engine.release.set()
    _deliver_prepared(loop)
    assert engine.running == [] and loop.num_aborted == 1
    assert [(identity, msg.rid, msg.error.status) for identity, msg in server.sent] == [(A, "1", 503)]


def test_loop_long_prompt_refused_by_prepare_gets_its_400():
    loop, engine, server = _loop()
    engine.refuse = True
    _generate_long(loop, A, "1")
    _deliver_prepared(loop)
    assert engine.running == [] and not loop.preparing
    [(identity, msg)] = server.sent
    assert (identity, msg.rid, msg.error.status, msg.error.param) == (A, "1", 400, "prompt")


def test_loop_request_id_in_use_while_preparing_is_refused():
    loop, engine, server = _loop()
    engine.release.clear()
    _generate_long(loop, A, "1")
    _generate(loop, A, "1")
    engine.release.set()
    _deliver_prepared(loop)
    assert engine.running == [f"{A.hex()}-1"]
    [(_, msg)] = server.sent
    assert msg.error.param == "rid" and "already in use" in msg.error.message
