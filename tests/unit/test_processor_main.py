"""Unit tests for backend/processor/main.py: the processor's loop on its link, driven from the engine's end of a
real PAIR socket, with stand-ins for the preparer, presenter and /tokenize (no engine, no tokenizer)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import zmq
from structlog.testing import capture_logs
from vllm import SamplingParams
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest

from backend.errors import RequestError
from backend.processor import PreparedRequests, cost
from backend.processor.cost import INLINE_CHARS, INLINE_IDS, INLINE_MESSAGES
from backend.processor.link import EngineOut, EngineSide, ProcessorSide
from backend.processor.main import Processor
from backend.processor.prepare import EngineRequests
from common.sockets import make_socket
from protocol.codec import frontend_codec
from protocol.control import MetricsReply
from protocol.generate import ChatMessage, DeltasEvent, GenerateRequest, SamplingSpec, ToolCall, ToolSpec
from protocol.processor import (
    FORWARD,
    EngineBuilt,
    ForgetRequest,
    MetricsJob,
    PrepareFailed,
    PrepareRequest,
    ProcessorReady,
    ProcessorStats,
    StopStringsHit,
    TokenizeJob,
)
from protocol.tokenize import DetokenizeRequest, TokenizeReply, TokenizeRequest
from tests.unit.fake_backend import delta

WAIT_MS = 5000


class Stop(Exception):
    """Raised inside the loop (by the presenter's stats) to end a test's processor thread."""


@dataclass
class Tokenized:
    parsing: object = None


class FakePreparer:
    """tokenize answers Tokenized() or raises `tokenize_error`; to_engine one request per choice or `engine_error`.
    Records the thread each tokenize ran on."""

    def __init__(self) -> None:
        self.tokenize_error: Exception | None = None
        self.engine_error: Exception | None = None
        self.threads: list[str] = []
        self.max_model_len = 0

    def engine_built(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    def tokenize(self, req: GenerateRequest) -> Tokenized:
        self.threads.append(threading.current_thread().name)
        if self.tokenize_error is not None:
            raise self.tokenize_error
        return Tokenized()

    def to_engine(self, engine_rid: str, req: GenerateRequest, tokenized: Tokenized) -> EngineRequests:
        if self.engine_error is not None:
            raise self.engine_error
        return EngineRequests([_engine_request(f"{i}_{engine_rid}-int") for i in range(req.sampling.n)])


def _engine_request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id=request_id, prompt_token_ids=[1, 2], mm_features=None,
                             sampling_params=SamplingParams(max_tokens=4), pooling_params=None, arrival_time=0.0,
                             lora_request=None, cache_salt=None, data_parallel_rank=None)


@dataclass
class Iterations:
    count: int = 0


@dataclass
class Stats:
    iterations: Iterations = field(default_factory=Iterations)
    stop: bool = False

    def snapshot(self) -> ProcessorStats:
        if self.stop:
            raise Stop
        return ProcessorStats(num_prompt_tokens=0, num_generation_tokens=self.iterations.count,
                              num_finished_requests=0, iteration_tokens_counts=[], iteration_tokens_sum=0.0,
                              iteration_tokens_count=self.iterations.count)


class FakeMetrics:
    def __init__(self) -> None:
        self.num_gpu_blocks: int | None = None

    def render(self) -> bytes:
        return b"vllm:num_requests_running 0\n"

    def engine_built(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks


class FakePresenter:
    def __init__(self) -> None:
        self.stats = Stats()
        self.metrics = FakeMetrics()
        self.added: list[tuple] = []
        self.forgotten: list[str] = []
        self.direct: list[bool] = []
        self.outputs: tuple[dict, list[str]] = ({}, [])

    def add(self, engine, identity, rid, num_top_logprobs, is_stream, parsing=None, *, is_direct=False) -> None:
        self.added.append((identity, rid, num_top_logprobs, is_stream, [r.request_id for r in engine.requests]))
        self.direct.append(is_direct)

    def forget(self, engine_rids: list[str]) -> None:
        self.forgotten += engine_rids

    def present(self, outputs: EngineCoreOutputs) -> tuple[dict, list[str]]:
        return self.outputs


class FakeTokenization:
    def __init__(self) -> None:
        self.threads: list[str] = []

    def answer(self, req: TokenizeRequest) -> TokenizeReply:
        self.threads.append(threading.current_thread().name)
        return TokenizeReply(rid=req.rid, tokens=[len(getattr(req, "prompt", None) or "")])


class Engine:
    """The engine process's ends of the processor's two sockets: `send` as the engine thread sends (on its own
    socket), `send_link` as the io thread does (on the link, which carries everything back)."""

    def __init__(self, sock: zmq.Socket, own: zmq.Socket, processor: Processor) -> None:
        self.sock = sock
        self.own = own
        self.processor = processor
        self.codec = EngineSide()
        self.frontend = frontend_codec()

    def send(self, msg) -> None:
        self.own.send_multipart(self.codec.encode(msg))

    def send_link(self, msg) -> None:
        self.sock.send_multipart(self.codec.encode(msg))

    def receive(self):
        """The next message from the processor other than its periodic stats: a FromProcessor struct, a
        PreparedRequests, or (FORWARD) a list of (identity, decoded ToFrontend message)."""
        while True:
            assert self.sock.poll(WAIT_MS), "no message from the processor"
            frames = self.sock.recv_multipart()
            if frames[0] == FORWARD:
                return [(frames[i], self.frontend.decode(frames[i + 1])) for i in range(1, len(frames), 2)]
            msg = self.codec.decode(frames)
            if not isinstance(msg, ProcessorStats):
                return msg

    def next_stats(self, ms: int) -> ProcessorStats | None:
        """The next stats snapshot within `ms` (None if none came), skipping anything else."""
        while self.sock.poll(ms):
            msg = self.codec.decode(self.sock.recv_multipart())
            if isinstance(msg, ProcessorStats):
                return msg
        return None

    def is_quiet(self, ms: int = 200) -> bool:
        """Nothing but stats arrives for `ms`."""
        while self.sock.poll(ms):
            if not isinstance(self.codec.decode(self.sock.recv_multipart()), ProcessorStats):
                return False
        return True


@pytest.fixture
def parts():
    return FakePreparer(), FakePresenter(), FakeTokenization()


@contextlib.contextmanager
def serving(ctx: zmq.Context, parts, direct=None) -> Iterator[Engine]:
    """A Processor on `parts` served on a thread, with the engine process's ends of its two sockets (and `direct`,
    the processor's own socket to the frontends, if given); stopped on leaving."""
    preparer, presenter, tokenizing = parts
    link, peer = make_socket(ctx, zmq.PAIR), make_socket(ctx, zmq.PAIR)
    link.bind("inproc://link")
    peer.connect("inproc://link")
    own, own_peer = make_socket(ctx, zmq.PAIR), make_socket(ctx, zmq.PAIR)
    own.bind("inproc://engine")
    own_peer.connect("inproc://engine")
    processor = Processor(ctx, link, own_peer, preparer, presenter, tokenizing, direct)
    ready = ProcessorReady(pid=7, vocab_size=512, deltas_endpoint=direct.endpoint if direct is not None else None)

    def serve() -> None:
        with contextlib.suppress(Stop):
            processor.run(ready)

    thread = threading.Thread(target=serve, name="processor", daemon=True)
    thread.start()
    side = Engine(peer, own, processor)
    assert side.receive() == ready
    yield side
    presenter.stats.stop = True
    presenter.stats.iterations.count += 1  # the loop reads the snapshot only when the count changed
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture
def engine(parts) -> Iterator[Engine]:
    ctx = zmq.Context()
    with serving(ctx, parts) as side:
        yield side
    ctx.destroy(linger=0)


def _prepare(engine_rid: str = "e1", n: int = 1, prompt: str = "hi", **kw) -> PrepareRequest:
    request = GenerateRequest(rid="r1", sampling=SamplingSpec(n=n, logprobs=2), prompt=prompt, stream=True, **kw)
    return PrepareRequest(engine_rid=engine_rid, identity=b"fe-1", request=request)


def test_the_cost_counts_everything_the_template_and_tokenizer_read():
    call = ToolCall(id="c1", name="f", arguments='{"a":1}')
    req = GenerateRequest(rid="r", sampling=SamplingSpec(enforced_str="abc", stop_token_ids=[1, 2]),
                          messages=[ChatMessage(role="user", content="hi"),
                                    ChatMessage(role="assistant", content="", tool_calls=[call], reasoning="why")],
                          tools=[ToolSpec(name="f", description="d", parameters="{}")])
    assert cost.of_generate(req) == cost.Cost(messages=3, chars=4 + 2 + 9 + (2 + 1 + 7) + 3 + 4 + 3, ids=2)
    assert cost.of_generate(_prepare(prompt="hello").request) == cost.Cost(chars=5, ids=0, text_param="prompt")
    assert cost.of_tokenize(DetokenizeRequest(rid="d", tokens=[1, 2, 3])) == cost.Cost(ids=3)


def test_empty_messages_are_not_inline_work():
    """500,000 empty messages have no text, yet the template renders each: judged by count, not characters."""
    empty = [ChatMessage(role="user", content="")]
    assert cost.inline(_prepare(prompt=None, messages=empty * INLINE_MESSAGES).request)
    assert not cost.inline(_prepare(prompt=None, messages=empty * (INLINE_MESSAGES + 1)).request)
    assert not cost.inline(TokenizeRequest(rid="t", messages=empty * (INLINE_MESSAGES + 1)))
    assert cost.inline(DetokenizeRequest(rid="d", tokens=[1] * INLINE_IDS))
    assert not cost.inline(DetokenizeRequest(rid="d", tokens=[1] * (INLINE_IDS + 1)))
    many_calls = [ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="c", name="f", arguments="")]
                              * (INLINE_MESSAGES + 1))]
    assert not cost.inline(_prepare(prompt=None, messages=many_calls).request)
    assert not cost.inline(GenerateRequest(rid="r", sampling=SamplingSpec(stop_token_ids=[1] * (INLINE_IDS + 1)),
                                           prompt="hi"))


def test_what_can_never_fit_is_refused_naming_the_field():
    with pytest.raises(RequestError) as e:
        cost.check(cost.Cost(messages=101), 100, 10_000)
    assert (e.value.status, e.value.param) == (400, "messages")
    with pytest.raises(RequestError) as e:
        cost.check(cost.Cost(chars=10_001, text_param="prompt"), 100, 10_000)
    assert e.value.param == "prompt" and "10001 characters" in e.value.message
    with pytest.raises(RequestError) as e:
        cost.check(cost.Cost(ids=101), 100, 10_000, detokenize=True)
    assert e.value.param == "tokens"
    cost.check(cost.Cost(messages=100, chars=10_000, ids=101), 100, 10_000)  # ids bound /detokenize only


def test_a_prepared_request_is_routed_and_its_engine_requests_sent(engine, parts):
    preparer, presenter, _ = parts
    engine.send(_prepare(n=2))
    reply = engine.receive()
    assert isinstance(reply, PreparedRequests)
    assert (reply.header.engine_rid, reply.header.internal_ids) == ("e1", ["0_e1-int", "1_e1-int"])
    assert [r.request_id for r in reply.requests] == ["0_e1-int", "1_e1-int"]
    assert presenter.added == [(b"fe-1", "r1", 2, True, ["0_e1-int", "1_e1-int"])] and presenter.direct == [False]
    assert preparer.threads == ["processor"]  # short prompts are tokenized inline


def test_a_long_prompt_is_tokenized_on_the_helper_thread(engine, parts):
    preparer, _, tokenizing = parts
    engine.send(_prepare(prompt="x" * (INLINE_CHARS + 1)))
    assert isinstance(engine.receive(), PreparedRequests)
    engine.send(TokenizeJob(identity=b"fe-2", request=TokenizeRequest(rid="t1", prompt="y" * (INLINE_CHARS + 1))))
    assert engine.receive() == [(b"fe-2", TokenizeReply(rid="t1", tokens=[INLINE_CHARS + 1]))]
    assert preparer.threads == tokenizing.threads == ["tokenize"]


def test_many_empty_messages_are_prepared_on_the_helper_thread(engine, parts):
    preparer, _, tokenizing = parts
    empty = [ChatMessage(role="user", content="")] * (INLINE_MESSAGES + 1)
    engine.send(_prepare(prompt=None, messages=empty))
    assert isinstance(engine.receive(), PreparedRequests)
    engine.send(TokenizeJob(identity=b"fe-2", request=DetokenizeRequest(rid="d1", tokens=[5] * (INLINE_IDS + 1))))
    engine.receive()
    assert preparer.threads == tokenizing.threads == ["tokenize"]


def test_a_refused_request_gets_prepare_failed_with_the_error(engine, parts):
    preparer, presenter, _ = parts
    preparer.tokenize_error = RequestError("n must be between 1 and 4", param="n")
    engine.send(_prepare())
    assert engine.receive() == PrepareFailed(engine_rid="e1", error=RequestError("n must be between 1 and 4",
                                                                                  param="n").info())
    preparer.tokenize_error = None
    preparer.engine_error = RequestError("invalid response_format: bad", param="response_format")
    engine.send(_prepare("e2"))
    reply = engine.receive()
    assert (reply.engine_rid, reply.error.param, reply.error.status) == ("e2", "response_format", 400)
    assert presenter.added == []


def test_an_unexpected_failure_fails_that_request_only(engine, parts):
    preparer, _, _ = parts
    preparer.engine_error = KeyError("boom")
    engine.send(_prepare())
    reply = engine.receive()
    assert isinstance(reply, PrepareFailed) and reply.engine_rid == "e1"
    assert reply.error.status == 500 and reply.error.message == "internal error: 'boom'"
    preparer.engine_error = None
    engine.send(_prepare("e2"))
    assert isinstance(engine.receive(), PreparedRequests)  # the processor goes on


def test_outputs_become_deltas_per_frontend_and_stop_strings_go_to_the_engine(engine, parts):
    _, presenter, _ = parts
    presenter.outputs = ({(b"fe-1", False): [delta("r1", "a")],
                          (b"fe-2", False): [delta("r2", "b"), delta("r3", "c", "stop")]}, ["0_e3-int"])
    engine.send(EngineCoreOutputs(outputs=[]))
    forwarded = engine.receive()
    assert [(identity, [d.rid for d in msg.deltas]) for identity, msg in forwarded] == [
        (b"fe-1", ["r1"]), (b"fe-2", ["r2", "r3"])]
    assert all(isinstance(msg, DeltasEvent) for _, msg in forwarded)
    assert engine.receive() == StopStringsHit(internal_ids=["0_e3-int"])
    presenter.outputs = ({}, [])
    engine.send(EngineCoreOutputs(outputs=[]))
    assert engine.is_quiet()  # nothing to send for an empty step


def test_tokenize_metrics_forget_and_engine_built(engine, parts):
    preparer, presenter, _ = parts
    engine.send(TokenizeJob(identity=b"fe-1", request=TokenizeRequest(rid="t1", prompt="abc")))
    assert engine.receive() == [(b"fe-1", TokenizeReply(rid="t1", tokens=[3]))]
    engine.send_link(MetricsJob(identity=b"fe-2", rid="m1"))
    assert engine.receive() == [(b"fe-2", MetricsReply(rid="m1", text=b"vllm:num_requests_running 0\n"))]
    engine.send(ForgetRequest(engine_rids=["e1", "e2"]))
    engine.send(EngineBuilt(num_gpu_blocks=321, max_model_len=2048))
    # Answered after the two above were handled: the engine thread's messages keep their order.
    engine.send(TokenizeJob(identity=b"fe-1", request=TokenizeRequest(rid="t2", prompt="ab")))
    assert engine.receive() == [(b"fe-1", TokenizeReply(rid="t2", tokens=[2]))]
    assert presenter.forgotten == ["e1", "e2"] and presenter.metrics.num_gpu_blocks == 321
    assert preparer.max_model_len == 2048  # the engine's fitted context: every length check reads it


def test_stats_go_to_the_engine_when_the_iterations_change(engine, parts):
    _, presenter, _ = parts
    assert engine.next_stats(WAIT_MS).iteration_tokens_count == 0  # the first snapshot goes at once
    assert engine.next_stats(500) is None  # no new iteration, no new snapshot
    presenter.stats.iterations.count = 5
    assert engine.next_stats(WAIT_MS).iteration_tokens_count == 5


def test_the_engine_threads_socket_sends_its_messages_in_order_and_never_blocks():
    """EngineOut: what the engine thread sends reaches the processor's end decoded as sent, in order; with no
    processor connected the send is logged and dropped, not waited for."""
    ctx = zmq.Context()
    try:
        out = EngineOut(ctx, "inproc://engine-out")
        peer = make_socket(ctx, zmq.PAIR)
        peer.connect("inproc://engine-out")
        side = ProcessorSide()
        out.send(EngineBuilt(num_gpu_blocks=3, max_model_len=64))
        out.send(EngineCoreOutputs(outputs=[], timestamp=1.5))
        out.send(ForgetRequest(engine_rids=["e1"]))
        received = []
        for _ in range(3):
            assert peer.poll(WAIT_MS)
            received.append(side.decode(peer.recv_multipart()))
        assert received[0] == EngineBuilt(num_gpu_blocks=3, max_model_len=64)
        assert isinstance(received[1], EngineCoreOutputs) and received[1].timestamp == 1.5
        assert received[2] == ForgetRequest(engine_rids=["e1"])
        out.close()
        peer.close()
        alone = EngineOut(ctx, "inproc://engine-out-alone")
        with capture_logs() as logs:
            alone.send(ForgetRequest(engine_rids=["e2"]))
        assert [e["event"] for e in logs] == ["processor_link_unwritable"]
        alone.close()
    finally:
        ctx.destroy(linger=0)
