"""backend/processor/direct.py: the processor's own socket to the frontends, driven through the processor's loop
(real sockets: the engine's ends as in test_processor_main.py, a frontend's DEALER with its routing id)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq
from structlog.testing import capture_logs
from vllm.v1.engine import EngineCoreOutputs

from backend.processor.direct import DirectDeltas, bind_address
from common.sockets import make_client_socket, make_socket
from protocol.codec import frontend_codec
from protocol.control import HelloRequest
from protocol.generate import DeltasEvent
from protocol.processor import FORWARD, TokenizeJob
from protocol.tokenize import TokenizeReply, TokenizeRequest
from tests.unit.fake_backend import delta
from tests.unit.test_processor_main import (
    WAIT_MS,
    Engine,
    FakePreparer,
    FakePresenter,
    FakeTokenization,
    _prepare,
    serving,
)

DELTAS = "inproc://deltas"


@pytest.mark.parametrize("setting,backend,bound", [
    ("auto", "tcp://10.0.0.5:5555", "tcp://10.0.0.5:5556"),
    ("auto", "tcp://0.0.0.0:5555", "tcp://0.0.0.0:5556"),
    ("auto", "ipc:///tmp/pocserve/backend.ipc", "ipc:///tmp/pocserve/backend.ipc.deltas"),
    ("auto", "tcp://10.0.0.5:65535", None),  # no port above it
    ("auto", "inproc://backend", None),  # another process could not reach it
    ("off", "tcp://10.0.0.5:5555", None),
    ("tcp://10.0.0.5:7000", "tcp://10.0.0.5:5555", "tcp://10.0.0.5:7000"),
])
def test_the_address_the_processor_binds(setting, backend, bound):
    assert bind_address(setting, backend) == bound


def test_an_address_that_cannot_be_bound_leaves_the_socket_off_and_says_so():
    ctx = zmq.Context()
    try:
        taken = make_socket(ctx, zmq.ROUTER)
        taken.bind("inproc://taken")
        with capture_logs() as logs:
            assert DirectDeltas.open(ctx, "inproc://taken") is None
        assert [e["event"] for e in logs] == ["deltas_socket_unbound"]
        assert DirectDeltas.open(ctx, None) is None
    finally:
        ctx.destroy(linger=0)


class Frontend:
    """A frontend's second DEALER (the routing id its main one has), saying Hello as frontend/direct.py does."""

    def __init__(self, ctx: zmq.Context, routing_id: bytes) -> None:
        self.sock = make_client_socket(ctx, routing_id, heartbeat_ivl_ms=500, timeout_ms=1500)
        self.sock.connect(DELTAS)
        self.codec = frontend_codec()

    def hello(self) -> None:
        self.sock.send(self.codec.encode(HelloRequest(protocol_version=1, frontend_id="fe")))

    def receive(self):
        assert self.sock.poll(WAIT_MS), "nothing came on the direct socket"
        return self.codec.decode(self.sock.recv())


@pytest.fixture
def stack() -> Iterator[tuple[Engine, FakePresenter, DirectDeltas, zmq.Context]]:
    presenter = FakePresenter()
    ctx = zmq.Context()
    direct = DirectDeltas.open(ctx, DELTAS)
    assert direct is not None and direct.endpoint == DELTAS
    with serving(ctx, (FakePreparer(), presenter, FakeTokenization()), direct) as side:
        yield side, presenter, direct, ctx
    ctx.destroy(linger=0)


def _until_direct(engine: Engine, frontend: Frontend) -> None:
    """Hello, then /tokenize jobs until one's reply comes directly: the processor has read the Hello."""
    frontend.hello()
    for _ in range(100):
        engine.send(TokenizeJob(identity=b"fe-1", request=TokenizeRequest(rid="t", prompt="ab")))
        deadline = time.monotonic() + WAIT_MS / 1000
        while time.monotonic() < deadline:
            if frontend.sock.poll(10):
                assert frontend.codec.decode(frontend.sock.recv()) == TokenizeReply(rid="t", tokens=[2])
                return
            if (forwarded := _forwarded(engine, 10)) is not None:  # not yet: through the link
                assert forwarded == [(b"fe-1", TokenizeReply(rid="t", tokens=[2]))]
                break
        time.sleep(0.01)
    raise AssertionError("the processor never took the frontend's Hello")


def _forwarded(engine: Engine, ms: int) -> list | None:
    """What the processor forwarded through the link within `ms`, if anything (its stats skipped)."""
    deadline = time.monotonic() + ms / 1000
    while engine.sock.poll(max(0, int(1000 * (deadline - time.monotonic())))):
        frames = engine.sock.recv_multipart()
        if frames[0] == FORWARD:
            return [(frames[i], engine.frontend.decode(frames[i + 1])) for i in range(1, len(frames), 2)]
    return None


def test_a_request_prepared_after_its_frontends_hello_streams_directly_for_its_whole_life(stack):
    engine, presenter, direct, ctx = stack
    engine.send(_prepare("e0"))
    engine.receive()  # Prepared
    frontend = Frontend(ctx, b"fe-1")
    _until_direct(engine, frontend)
    engine.send(_prepare("e1"))
    engine.receive()
    assert presenter.direct == [False, True]  # e0 came before the Hello: through the engine process to its end
    presenter.outputs = ({(b"fe-1", True): [delta("r1", "a")], (b"fe-1", False): [delta("r0", "b")],
                          (b"fe-2", False): [delta("r2", "c")]}, [])
    engine.send(EngineCoreOutputs(outputs=[]))
    assert frontend.receive() == DeltasEvent(deltas=[delta("r1", "a")])
    forwarded = engine.receive()
    assert [(identity, [d.rid for d in msg.deltas]) for identity, msg in forwarded] == [
        (b"fe-1", ["r0"]), (b"fe-2", ["r2"])]
    assert direct.num_sent >= 2 and direct.num_fallbacks == 0


def test_a_direct_stream_whose_frontend_left_goes_on_through_the_engine_process(stack):
    engine, presenter, direct, ctx = stack
    frontend = Frontend(ctx, b"fe-1")
    _until_direct(engine, frontend)
    frontend.sock.close(linger=0)
    presenter.outputs = ({(b"fe-1", True): [delta("r1", "a")]}, [])
    deadline = time.monotonic() + WAIT_MS / 1000
    received = None
    with capture_logs() as logs:
        while received is None and time.monotonic() < deadline:  # until libzmq has dropped the closed pipe
            engine.send(EngineCoreOutputs(outputs=[]))
            received = _forwarded(engine, 50)
    assert received == [(b"fe-1", DeltasEvent(deltas=[delta("r1", "a")]))]
    assert direct.num_fallbacks == 1
    assert "frontend_direct_lost" in [e["event"] for e in logs]
    engine.send(_prepare("e2"))
    engine.receive()
    assert presenter.direct[-1] is False  # forgotten until its next Hello


def test_only_hello_is_read_on_the_direct_socket(stack):
    _, _, direct, ctx = stack
    frontend = Frontend(ctx, b"fe-1")
    frontend.sock.send(b"not a message")
    frontend.sock.send(frontend.codec.encode(TokenizeRequest(rid="t", prompt="ab")))
    deadline = time.monotonic() + WAIT_MS / 1000
    while direct.num_ignored < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert direct.num_ignored == 2 and not direct.is_direct(b"fe-1")
