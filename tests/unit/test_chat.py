"""Unit tests for backend/core/chat.py with a fake engine and a recording send: the chat request table through the
processor round trip, aborts (by the frontend, a lost frontend, the PoC gate), stop strings and finishes."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.core.chat import ChatRequests
from backend.errors import gate_error
from backend.processor import PreparedRequests
from backend.transport.peers import FrontendLost
from backend.transport.server import LINK
from protocol.common import ErrorInfo
from protocol.generate import AbortRequest, ChatMessage, GenerateErrorReply, GenerateRequest, SamplingSpec
from protocol.processor import (
    ForgetRequest,
    Prepared,
    PrepareFailed,
    PrepareRequest,
    ProcessorReady,
    StopStringsHit,
    TokenizeJob,
)
from protocol.tokenize import DetokenizeRequest, TokenizeReply, TokenizeRequest

A, B = b"fe-a", b"fe-b"


@dataclass
class FakeRequest:
    request_id: str


@dataclass
class FakeOutput:
    request_id: str
    finish_reason: object = None


@dataclass
class FakeOutputs:
    outputs: list = field(default_factory=list)
    scheduler_stats: object = None


class FakeEngine:
    def __init__(self) -> None:
        self.running: list[str] = []
        self.aborted: list[str] = []
        self.fail_add = False

    def add(self, request: FakeRequest) -> None:
        if self.fail_add:
            raise RuntimeError("boom")
        self.running.append(request.request_id)

    def abort(self, internal_ids: list[str]) -> None:
        self.aborted.extend(internal_ids)
        self.running = [r for r in self.running if r not in internal_ids]

    def has_work(self) -> bool:
        return bool(self.running)


class Sent:
    def __init__(self) -> None:
        self.items: list[tuple[bytes, object]] = []

    def __call__(self, identity: bytes, msg) -> None:
        self.items.append((identity, msg))

    def to_processor(self, msg) -> None:
        """The engine thread's socket to the processor, recorded in the same order as the replies."""
        self.items.append((LINK, msg))

    def to_link(self, kind: type) -> list:
        return [m for i, m in self.items if i == LINK and isinstance(m, kind)]

    def replies(self) -> list[tuple[bytes, GenerateErrorReply]]:
        return [(i, m) for i, m in self.items if isinstance(m, GenerateErrorReply)]


def _chat() -> tuple[ChatRequests, FakeEngine, Sent]:
    engine, sent = FakeEngine(), Sent()
    chat = ChatRequests(engine, sent, sent.to_processor)
    chat.on_processor_ready(LINK, ProcessorReady(pid=1, vocab_size=10))
    return chat, engine, sent


def _rid(identity: bytes, rid: str) -> str:
    return f"{identity.hex()}-{rid}"


def _generate(chat: ChatRequests, identity: bytes, rid: str) -> None:
    chat.on_generate(identity, GenerateRequest(rid=rid, sampling=SamplingSpec(max_tokens=8),
                                               messages=[ChatMessage(role="user", content="hi")], stream=True))


def _prepared(chat: ChatRequests, identity: bytes, rid: str, *internal: str) -> None:
    engine_rid = _rid(identity, rid)
    internal = internal or (f"{engine_rid}-x",)
    chat.on_prepared(LINK, PreparedRequests(Prepared(engine_rid=engine_rid, internal_ids=list(internal)),
                                            [FakeRequest(i) for i in internal]))


def _run(chat: ChatRequests, identity: bytes, rid: str) -> None:
    _generate(chat, identity, rid)
    _prepared(chat, identity, rid)


def test_chat_request_goes_to_the_processor_then_into_the_engine():
    chat, engine, sent = _chat()
    _generate(chat, A, "1")
    [prep] = sent.to_link(PrepareRequest)
    assert (prep.engine_rid, prep.identity, prep.request.rid) == (_rid(A, "1"), A, "1")
    assert _rid(A, "1") in chat.preparing and engine.running == []
    _prepared(chat, A, "1")
    assert engine.running == [f"{_rid(A, '1')}-x"] and not chat.preparing and _rid(A, "1") in chat.owners


def test_chat_finished_output_leaves_the_table_and_outputs_go_to_the_processor():
    chat, _engine, sent = _chat()
    _run(chat, A, "1")
    _run(chat, A, "2")
    outputs = FakeOutputs([FakeOutput(f"{_rid(A, '1')}-x", finish_reason=0), FakeOutput(f"{_rid(A, '2')}-x")])
    chat.route(outputs)
    assert list(chat.owners) == [_rid(A, "2")]
    assert [m for i, m in sent.items if i == LINK][-1] is outputs
    chat.route(FakeOutputs([]))  # nothing to present: nothing sent
    chat.route(None)
    assert [m for i, m in sent.items if i == LINK][-1] is outputs
    # A step with no outputs but the scheduler's stats (a chunk of a long prefill) still goes: vLLM's metrics
    # count its prefix-cache queries.
    chat.route(stats_only := FakeOutputs([], scheduler_stats=object()))
    assert [m for i, m in sent.items if i == LINK][-1] is stats_only


def test_chat_frontend_lost_aborts_its_requests_and_answers_503():
    chat, engine, sent = _chat()
    for identity, rid in ((A, "1"), (B, "1"), (A, "2")):
        _run(chat, identity, rid)
    chat.on_frontend_lost(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    assert engine.aborted == [f"{_rid(A, '1')}-x", f"{_rid(A, '2')}-x"]
    assert engine.running == [f"{_rid(B, '1')}-x"] and list(chat.owners) == [_rid(B, "1")]
    assert chat.num_aborted == 2
    assert sent.to_link(ForgetRequest)[-1].engine_rids == [_rid(A, "1"), _rid(A, "2")]
    assert [(identity, msg.rid) for identity, msg in sent.replies()] == [(A, "1"), (A, "2")]
    for _, msg in sent.replies():
        assert (msg.error.status, msg.error.message) == (503, "frontend timed out")


def test_chat_frontend_lost_without_requests_changes_nothing():
    chat, engine, sent = _chat()
    _run(chat, B, "1")
    before = list(sent.items)
    chat.on_frontend_lost(b"probe", FrontendLost(frontend_id="", silent_s=9.0))
    assert engine.aborted == [] and chat.num_aborted == 0 and sent.items == before and len(chat.owners) == 1


def test_chat_abort_request_after_frontend_lost_is_not_counted_twice():
    chat, engine, _ = _chat()
    _run(chat, A, "1")
    chat.on_frontend_lost(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    chat.on_abort(A, AbortRequest(rids=["1"]))  # the frontend was only partitioned: it aborts its orphans
    assert engine.aborted == [f"{_rid(A, '1')}-x"] and chat.num_aborted == 1


def test_chat_frontend_that_returns_can_reuse_its_request_ids():
    chat, engine, sent = _chat()
    _run(chat, A, "1")
    chat.on_frontend_lost(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    _run(chat, A, "1")
    assert engine.running == [f"{_rid(A, '1')}-x"] and _rid(A, "1") in chat.owners
    assert len(sent.replies()) == 1  # only the 503 for the aborted stream


def test_chat_aborted_while_preparing_never_reaches_the_engine():
    chat, engine, sent = _chat()
    _generate(chat, A, "1")
    chat.on_abort(A, AbortRequest(rids=["1"]))
    assert chat.num_aborted == 1 and sent.to_link(ForgetRequest)[-1].engine_rids == [_rid(A, "1")]
    _prepared(chat, A, "1")  # the processor finished it meanwhile: it is told to forget it again
    assert engine.running == [] and engine.aborted == [] and chat.num_aborted == 1
    assert sent.replies() == [] and not chat.preparing and not chat.owners
    assert sent.to_link(ForgetRequest)[-1].engine_rids == [_rid(A, "1")]


def test_chat_frontend_lost_while_preparing_answers_503_once():
    chat, engine, sent = _chat()
    _generate(chat, A, "1")
    chat.on_frontend_lost(A, FrontendLost(frontend_id="fe-1", silent_s=5.5))
    _prepared(chat, A, "1")
    assert engine.running == [] and chat.num_aborted == 1
    assert [(identity, msg.rid, msg.error.status) for identity, msg in sent.replies()] == [(A, "1", 503)]


def test_chat_request_refused_by_the_processor_gets_its_400():
    chat, engine, sent = _chat()
    _generate(chat, A, "1")
    error = ErrorInfo(status=400, message="prompt too long", param="prompt", type="BadRequestError")
    chat.on_prepare_failed(LINK, PrepareFailed(engine_rid=_rid(A, "1"), error=error))
    assert engine.running == [] and not chat.preparing
    [(identity, msg)] = sent.replies()
    assert (identity, msg.rid, msg.error.status, msg.error.param) == (A, "1", 400, "prompt")


def test_chat_request_id_in_use_while_preparing_is_refused():
    chat, engine, sent = _chat()
    _generate(chat, A, "1")
    _generate(chat, A, "1")
    _prepared(chat, A, "1")
    assert engine.running == [f"{_rid(A, '1')}-x"] and len(sent.to_link(PrepareRequest)) == 1
    [(_, msg)] = sent.replies()
    assert msg.error.param == "rid" and "already in use" in msg.error.message


def test_chat_stop_string_stops_the_request_in_the_engine_without_a_reply():
    chat, engine, sent = _chat()
    _run(chat, A, "1")
    chat.on_stop_strings(LINK, StopStringsHit(internal_ids=[f"{_rid(A, '1')}-x", "gone"]))
    assert engine.aborted == [f"{_rid(A, '1')}-x"] and not chat.owners
    assert sent.replies() == [] and sent.to_link(ForgetRequest) == [] and chat.num_aborted == 0


def test_chat_stop_string_of_one_choice_leaves_the_others_running():
    chat, engine, _ = _chat()
    _generate(chat, A, "1")
    _prepared(chat, A, "1", "0_r", "1_r")
    chat.on_stop_strings(LINK, StopStringsHit(internal_ids=["0_r"]))
    assert engine.aborted == ["0_r"] and engine.running == ["1_r"]
    assert chat.owners[_rid(A, "1")].internal_ids == ["1_r"]
    chat.on_stop_strings(LINK, StopStringsHit(internal_ids=["1_r"]))
    assert not chat.owners and engine.running == []


def test_chat_tokenize_goes_to_the_processor_with_the_frontend_identity():
    chat, _, sent = _chat()
    chat.on_tokenize(A, TokenizeRequest(rid="t1", prompt="hi"))
    chat.on_tokenize(A, DetokenizeRequest(rid="t2", tokens=[1, 2]))
    jobs = sent.to_link(TokenizeJob)
    assert [(j.identity, j.request.rid) for j in jobs] == [(A, "t1"), (A, "t2")]


def test_chat_tokenize_before_the_processor_is_ready_is_503():
    engine, sent = FakeEngine(), Sent()
    chat = ChatRequests(engine, sent, sent.to_processor)
    chat.on_tokenize(A, TokenizeRequest(rid="t1", prompt="hi"))
    [(identity, reply)] = sent.items
    assert identity == A and isinstance(reply, TokenizeReply) and reply.error.status == 503


def test_chat_gate_refuses_new_requests_and_aborts_those_in_flight():
    chat, engine, sent = _chat()
    _run(chat, A, "1")
    _generate(chat, A, "2")
    assert chat.gate(gate_error().info()) == 2
    assert chat.is_gated and engine.running == [] and not chat.owners and not chat.preparing
    _generate(chat, B, "3")
    _prepared(chat, A, "2")  # prepared before the gate closed: refused once more, nothing runs
    assert engine.running == [] and len(sent.to_link(PrepareRequest)) == 2
    statuses = [(i, m.rid, m.error.status, m.error.type) for i, m in sent.replies()]
    assert statuses[:2] == [(A, "1", 503, "service_unavailable"), (A, "2", 503, "service_unavailable")]
    assert statuses[2] == (B, "3", 503, "service_unavailable")
    chat.ungate()
    _run(chat, B, "4")
    assert engine.running == [f"{_rid(B, '4')}-x"]


def test_chat_refuses_requests_until_the_processor_is_ready():
    engine, sent = FakeEngine(), Sent()
    ready: list[bool] = []
    chat = ChatRequests(engine, sent, sent.to_processor, on_ready=lambda: ready.append(True))
    _generate(chat, A, "1")
    [(_, msg)] = sent.replies()
    assert msg.error.status == 503 and sent.to_link(PrepareRequest) == []
    chat.on_processor_ready(LINK, ProcessorReady(pid=1, vocab_size=10))
    assert ready == [True]
    _generate(chat, A, "1")
    assert len(sent.to_link(PrepareRequest)) == 1


def test_chat_engine_refusing_a_prepared_request_fails_it_with_a_500():
    chat, engine, sent = _chat()
    engine.fail_add = True
    _generate(chat, A, "1")
    _prepared(chat, A, "1")
    [(_, msg)] = sent.replies()
    assert msg.error.status == 500 and not chat.owners and not chat.preparing
    assert sent.to_link(ForgetRequest)[-1].engine_rids == [_rid(A, "1")]


def test_chat_choices_finish_one_by_one():
    chat, _engine, _ = _chat()
    _generate(chat, A, "1")
    _prepared(chat, A, "1", "c0", "c1")
    chat.route(FakeOutputs([FakeOutput("c0", finish_reason=0)]))
    assert _rid(A, "1") in chat.owners
    chat.route(FakeOutputs([FakeOutput("c1", finish_reason=1)]))
    assert not chat.owners
