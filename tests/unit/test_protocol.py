"""Unit tests for protocol/: golden bytes, naming and tag rules, handler coverage, garbage decoding.

Golden bytes live in tests/unit/golden/protocol_v{PROTOCOL_VERSION}.json. After an intended wire change, bump
PROTOCOL_VERSION if it is breaking, then regenerate with
    POCSERVE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_protocol.py
and review the diff of the JSON file.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import pkgutil
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protocol
from backend.core.chat import ChatRequests
from backend.pow.service import PowService
from backend.processor import PreparedRequests
from backend.transport.peers import FrontendLost
from backend.transport.server import SocketServer
from frontend.backend_client import BackendClient, BackendUnavailable
from protocol.codec import ToBackend, ToFrontend, backend_codec, frontend_codec
from protocol.common import (
    BackendStats,
    CallbackStats,
    EngineStats,
    ErrorInfo,
    Fingerprint,
    LinkStats,
    PocStats,
    TokenHistogram,
)
from protocol.control import (
    DeadEvent,
    ErrorReply,
    HelloRequest,
    MetricsReply,
    MetricsRequest,
    PingRequest,
    PongReply,
    ReadyReply,
)
from protocol.generate import (
    AbortRequest,
    ChatMessage,
    Delta,
    DeltasEvent,
    EnforcedToken,
    GenerateErrorReply,
    GenerateRequest,
    ResponseFormat,
    SamplingSpec,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    TopLogprob,
)
from protocol.poc import Artifact, Encoding, PocArtifactsReply, PocArtifactsRequest
from protocol.pow import (
    JobView,
    NodeIdentity,
    PowGenerateRequest,
    PowInitRequest,
    PowJobReply,
    PowJobRequest,
    PowParams,
    PowStatusReply,
    PowStatusRequest,
    PowStopRequest,
    RoundConfig,
    RoundStats,
    StatTestSpec,
    ValidationOutcome,
)
from protocol.processor import (
    EngineOutputs,
    FromProcessor,
    Prepared,
    PrepareFailed,
    ProcessorReady,
    ProcessorStats,
    StopStringsHit,
    ToProcessor,
)
from protocol.tokenize import DetokenizeReply, DetokenizeRequest, TokenizeReply, TokenizeRequest
from protocol.version import PROTOCOL_VERSION

GOLDEN_PATH = Path(__file__).parent / "golden" / f"protocol_v{PROTOCOL_VERSION}.json"
IS_REGEN = os.environ.get("POCSERVE_REGEN_GOLDEN") == "1"
REGEN_HINT = "run POCSERVE_REGEN_GOLDEN=1 pytest tests/unit/test_protocol.py and review the JSON diff"

# The members of each direction's union.
TO_BACKEND_TYPES: tuple[type, ...] = ToBackend.__args__
TO_FRONTEND_TYPES: tuple[type, ...] = ToFrontend.__args__
ALL_MESSAGE_TYPES: tuple[type, ...] = TO_BACKEND_TYPES + TO_FRONTEND_TYPES
# Answered (or passed to the processor) by the io thread itself (backend/transport/server.py
# SocketServer._on_frames), never queued for the engine thread.
CONTROL_PLANE_TYPES = {HelloRequest, PingRequest, MetricsRequest}


# --- canonical instances: every field set to a non-default value (wire shape only, not semantics) ---

def _error_info() -> ErrorInfo:
    return ErrorInfo(status=400, message="bad request", type="BadRequestError", param="messages")


def _fingerprint() -> Fingerprint:
    return Fingerprint(
        protocol_version=PROTOCOL_VERSION, served_model_name="tiny", model_path="/models/tiny-qwen3",
        max_model_len=2048, block_size=16, dtype="bfloat16", vllm_version="0.26.0", engine_device="cuda",
        poc_code_version="poc-v2", scheduling_mode="shared", python_hash_seed="0",
        prefix_caching_hash_algo="sha256", model_aliases=["alias-a", "alias-b"], vocab_size=151936,
        sampling_defaults={"temperature": 0.7, "top_k": 20.0, "max_tokens": 4096.0}, max_tokens_cap=8192)


def _stats() -> BackendStats:
    return BackendStats(
        link=LinkStats(instance_id="inst-1", uptime_s=12.5, num_frontends=2, num_rejected_frames=5, outbox_depth=8,
                       num_curve_refusals=6, is_engine_ready=True, engine_heartbeat_age_s=0.5),
        engine=EngineStats(num_running=3, num_waiting=4, kv_cache_usage=0.25, num_engine_steps=100,
                           num_aborted_requests=1, inbox_depth=7,
                           poc_iteration_tokens=TokenHistogram(bounds=[1.0, 8.0, 64.0], counts=[3, 2, 1, 0],
                                                               sum=150.5, count=6)),
        poc=PocStats(is_mining=True, num_nonces=64, num_validations=2, num_queued_job_nonces=8),
        callbacks=CallbackStats(num_delivered=3, num_dropped=1, num_retries=4, backlog=2),
        chat=ProcessorStats(num_prompt_tokens=1000, num_generation_tokens=2000, num_finished_requests=10,
                            iteration_tokens_counts=[1, 2, 3, 4], iteration_tokens_sum=99.5, iteration_tokens_count=10))


def _sampling() -> SamplingSpec:
    return SamplingSpec(
        n=2, max_tokens=64, min_tokens=1, temperature=0.5, top_p=0.75, top_k=40, min_p=0.125, presence_penalty=0.25,
        frequency_penalty=0.5, repetition_penalty=1.5, seed=42, stop=["\n\n"], stop_token_ids=[151645],
        ignore_eos=True, include_stop_str_in_output=True, skip_special_tokens=False, logprobs=5,
        logprobs_mode="raw_logprobs",
        response_format=ResponseFormat(type="json_schema", json_schema='{"type":"object"}'),
        enforced_tokens=[EnforcedToken(token="Hi", top_tokens=["Hi", "Hello"])], enforced_str="Hi there")


def _delta() -> Delta:
    top = [TopLogprob(token_id=9, token="Hi", logprob=-0.5)]
    return Delta(
        rid="r-1", text="Hi", token_ids=[9],
        logprobs=[TokenLogprob(token_id=9, token="Hi", logprob=-0.5, rank=1, top=top)],
        finish_reason="stop", stop_reason="</s>", num_prompt_tokens=12, num_generated_tokens=1, index=1,
        reasoning="Hmm", tool_calls=[ToolCallDelta(index=0, id="call-1", name="f", arguments='{"x": 1}')],
        num_cached_tokens=16, num_cache_creation_tokens=32)


def _messages() -> list[ChatMessage]:
    call = ToolCall(id="call-1", name="f", arguments='{"x": 1}')
    return [ChatMessage(role="assistant", content="Hello", name="alice", tool_calls=[call], tool_call_id="call-0",
                        reasoning="Hmm")]


def _tools() -> list[ToolSpec]:
    return [ToolSpec(name="f", description="does f", parameters='{"type":"object"}', strict=True)]


def _node() -> NodeIdentity:
    return NodeIdentity(block_hash="TEST_BLOCK", block_height=100, public_key="pk", node_id=1, node_count=2)


def _params() -> PowParams:
    return PowParams(model="tiny", seq_len=64, k_dim=8)


CANONICAL: dict[type, msgspec.Struct] = {
    HelloRequest: HelloRequest(protocol_version=PROTOCOL_VERSION, frontend_id="host-123"),
    PingRequest: PingRequest(ping_id=7),
    GenerateRequest: GenerateRequest(
        rid="r-1", sampling=_sampling(), messages=_messages(), prompt="Hello", stream=True, priority=1,
        tools=_tools(), tool_choice="required", named_tool="f", parallel_tool_calls=False),
    TokenizeRequest: TokenizeRequest(rid="t-1", prompt="Hello", messages=_messages(), tools=_tools(),
                                     add_special_tokens=False, add_generation_prompt=False,
                                     continue_final_message=True, return_token_strs=True),
    TokenizeReply: TokenizeReply(rid="t-1", tokens=[1, 2], token_strs=["a", "b"], max_model_len=2048,
                                 error=_error_info()),
    DetokenizeRequest: DetokenizeRequest(rid="t-2", tokens=[1, 2]),
    DetokenizeReply: DetokenizeReply(rid="t-2", prompt="ab", error=_error_info()),
    MetricsRequest: MetricsRequest(rid="m-1"),
    MetricsReply: MetricsReply(rid="m-1", text=b"# TYPE vllm:prompt_tokens counter\n"),
    AbortRequest: AbortRequest(rids=["r-1", "r-2"]),
    ReadyReply: ReadyReply(fingerprint=_fingerprint(), refusal="protocol version 0 != backend's 1",
                 deltas_endpoint="tcp://0.0.0.0:5556"),
    PongReply: PongReply(ping_id=7, stats=_stats()),
    DeltasEvent: DeltasEvent(deltas=[_delta()]),
    GenerateErrorReply: GenerateErrorReply(rid="r-1", error=_error_info()),
    ErrorReply: ErrorReply(error=_error_info(), rid="r-1"),
    DeadEvent: DeadEvent(reason="engine step raised"),
    PocArtifactsRequest: PocArtifactsRequest(rid="p-1", block_hash="TEST_BLOCK", public_key="test_pub_keys",
                                             nonces=[0, 1, -2], seq_len=64, k_dim=8, stronger_rng=True),
    PocArtifactsReply: PocArtifactsReply(rid="p-1", artifacts=[Artifact(nonce=0, vector_b64="AAA=")],
                                         error=_error_info()),
    PowInitRequest: PowInitRequest(rid="w-1", node=_node(), params=_params(), group_id=1, n_groups=2, batch_size=8,
                                   url="http://cb/v2/poc-batches/m", stronger_rng=True),
    PowGenerateRequest: PowGenerateRequest(
        rid="w-2", node=_node(), params=_params(), nonces=[1, 2], batch_size=8, wait=True, url="http://cb",
        validation=[Artifact(nonce=1, vector_b64="AAA=")],
        stat_test=StatTestSpec(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.05), stronger_rng=True),
    PowJobRequest: PowJobRequest(rid="w-3", job_id="0b9c"),
    PowStatusRequest: PowStatusRequest(rid="w-4"),
    PowStopRequest: PowStopRequest(rid="w-5"),
    PowJobReply: PowJobReply(rid="w-2", job=JobView(
        job_id="0b9c", status="completed", num_queued=2, artifacts=[Artifact(nonce=1, vector_b64="AAA=")],
        encoding=Encoding(dtype="bf16", k_dim=8, endian="be"),
        validation=ValidationOutcome(n_total=2, n_mismatch=1, mismatch_nonces=[2], p_value=0.5,
                                     fraud_detected=True, n_excluded=1, excluded_nonces=[3]), error="boom"),
        error=_error_info()),
    PowStatusReply: PowStatusReply(
        rid="w-4", status="GENERATING", config=RoundConfig(node=_node(), group_id=1, n_groups=2, seq_len=64, k_dim=8),
        stats=RoundStats(total_processed=64, nonces_per_second=12.5),
        error=_error_info()),
}


def _tag(cls: type) -> str:
    return cls.__struct_config__.tag


def _encode(msg: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(msg)


def _default_of(field: msgspec.structs.FieldInfo):
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def _unset_fields(obj, path: str) -> list[str]:
    """Paths of fields left at their default, recursing into nested structs and lists of them."""
    found = []
    if isinstance(obj, msgspec.Struct):
        for field in msgspec.structs.fields(type(obj)):
            value = getattr(obj, field.name)
            if (default := _default_of(field)) is not msgspec.NODEFAULT and value == default:
                found.append(f"{path}.{field.name}")
            found += _unset_fields(value, f"{path}.{field.name}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            found += _unset_fields(item, f"{path}[{i}]")
    return found


@pytest.fixture(scope="module")
def golden() -> dict:
    current = {_tag(cls): {"type": cls.__name__, "hex": _encode(CANONICAL[cls]).hex()}
               for cls in ALL_MESSAGE_TYPES if cls in CANONICAL}
    if IS_REGEN:
        GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
        body = {"protocol_version": PROTOCOL_VERSION, "messages": dict(sorted(current.items()))}
        GOLDEN_PATH.write_text(json.dumps(body, indent=2) + "\n")
    if not GOLDEN_PATH.exists():
        pytest.fail(f"{GOLDEN_PATH} is missing: {REGEN_HINT}")
    body = json.loads(GOLDEN_PATH.read_text())
    assert body["protocol_version"] == PROTOCOL_VERSION
    return body["messages"]


# --- golden bytes and round trips ---

@pytest.mark.parametrize("cls", ALL_MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_protocol_canonical_instance_is_fully_populated(cls):
    assert cls in CANONICAL, f"add a fully-populated canonical {cls.__name__} to CANONICAL, then {REGEN_HINT}"
    assert _unset_fields(CANONICAL[cls], cls.__name__) == []


def test_protocol_golden_has_exactly_the_union_members(golden):
    assert set(golden) == {_tag(cls) for cls in ALL_MESSAGE_TYPES}, REGEN_HINT


@pytest.mark.parametrize("cls", ALL_MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_protocol_encode_matches_golden_bytes(cls, golden):
    entry = golden.get(_tag(cls))
    assert entry is not None, f"no golden entry for {cls.__name__}: {REGEN_HINT}"
    assert entry["type"] == cls.__name__
    encoded = frontend_codec().encode(CANONICAL[cls]) if cls in TO_BACKEND_TYPES else \
        backend_codec().encode(CANONICAL[cls])
    assert encoded.hex() == entry["hex"], f"wire bytes of {cls.__name__} changed: bump PROTOCOL_VERSION if " \
                                         f"breaking, then {REGEN_HINT}"


@pytest.mark.parametrize("cls", ALL_MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_protocol_decode_round_trips(cls):
    assert cls in CANONICAL, f"add a fully-populated canonical {cls.__name__} to CANONICAL"
    codec = backend_codec() if cls in TO_BACKEND_TYPES else frontend_codec()
    msg = CANONICAL[cls]
    decoded = codec.decode(codec.encode(msg))
    assert type(decoded) is cls
    assert decoded == msg


@pytest.mark.parametrize("cls", ALL_MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_protocol_other_direction_rejects_message(cls):
    """A message decoded by the wrong side's codec is an unknown tag, not a silent mis-parse."""
    wrong = frontend_codec() if cls in TO_BACKEND_TYPES else backend_codec()
    with pytest.raises(msgspec.DecodeError):
        wrong.decode(_encode(CANONICAL[cls]))


# --- naming and tag rules ---

def _protocol_structs() -> list[type]:
    structs = []
    for info in pkgutil.iter_modules(protocol.__path__):
        module = importlib.import_module(f"protocol.{info.name}")
        structs += [obj for obj in vars(module).values() if inspect.isclass(obj) and
                    issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__]
    return structs


@pytest.mark.parametrize("cls", TO_BACKEND_TYPES, ids=lambda c: c.__name__)
def test_protocol_to_backend_names_end_in_request(cls):
    assert cls.__name__.endswith("Request")


@pytest.mark.parametrize("cls", TO_FRONTEND_TYPES, ids=lambda c: c.__name__)
def test_protocol_to_frontend_names_end_in_reply_or_event(cls):
    assert cls.__name__.endswith(("Reply", "Event"))


@pytest.mark.parametrize("cls", ALL_MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_protocol_union_members_have_explicit_string_tags(cls):
    tag = _tag(cls)
    # tag=True would make the tag the class name: the style guide wants short explicit ones.
    assert isinstance(tag, str) and tag and tag != cls.__name__
    assert cls.__struct_config__.tag_field == "type"


def test_protocol_tags_are_unique_across_both_unions():
    tags = [_tag(cls) for cls in ALL_MESSAGE_TYPES]
    assert len(tags) == len(set(tags))
    assert len(set(ALL_MESSAGE_TYPES)) == len(ALL_MESSAGE_TYPES)


def test_protocol_no_struct_is_array_like():
    structs = _protocol_structs()
    assert set(ALL_MESSAGE_TYPES) <= set(structs)
    assert [s.__name__ for s in structs if s.__struct_config__.array_like] == []


# --- every union member has a handler ---

def test_protocol_every_to_backend_type_has_one_handler():
    chat = ChatRequests(engine=None, send=lambda identity, msg: None, to_processor=lambda msg: None)
    pow_service = object.__new__(PowService)  # its handler table needs no state
    handlers = [*chat.handlers(), *pow_service.handlers()]
    assert len(handlers) == len(set(handlers)), "a type is handled twice on the engine thread"
    # The io thread's and the processor's own inbox events reach the same table but never the wire.
    internal_types = {FrontendLost, PreparedRequests, PrepareFailed, StopStringsHit, ProcessorReady}
    assert not internal_types & set(TO_BACKEND_TYPES)
    engine_types = set(handlers) - internal_types
    assert not engine_types & CONTROL_PLANE_TYPES, "a type is handled by both the io thread and the engine thread"
    assert engine_types | CONTROL_PLANE_TYPES == set(TO_BACKEND_TYPES)
    io_source = inspect.getsource(SocketServer._on_frames)
    for cls in CONTROL_PLANE_TYPES:
        assert cls.__name__ in io_source, f"{cls.__name__} is no longer answered in SocketServer._on_frames"


def test_protocol_every_message_from_the_processor_has_one_handler():
    chat = ChatRequests(engine=None, send=lambda identity, msg: None, to_processor=lambda msg: None)
    # Prepared arrives with its engine requests (PreparedRequests); ProcessorStats is kept by the io thread.
    handled = {PreparedRequests if t is PreparedRequests else t for t in chat.handlers()}
    expected = {PreparedRequests if t is Prepared else t for t in FROM_PROCESSOR_TYPES} - {ProcessorStats}
    assert expected <= handled
    assert "ProcessorStats" in inspect.getsource(SocketServer._on_link)


FROM_PROCESSOR_TYPES = FromProcessor.__args__


def test_protocol_every_message_to_the_processor_has_a_case():
    # EngineOutputs arrives as vLLM's EngineCoreOutputs (the match's last case); every other header by name.
    # Read as text: importing the processor imports vLLM.
    source = (Path(__file__).parents[2] / "backend" / "processor" / "main.py").read_text()
    for cls in set(ToProcessor.__args__) - {EngineOutputs}:
        assert f"case {cls.__name__}()" in source, f"the processor has no case for {cls.__name__}"


class _RecordingLog:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append(event)


def _check_deltas(client: BackendClient, log: _RecordingLog) -> None:
    q = client._streams["r-1"] = asyncio.Queue()
    other = Delta(rid="not-mine", text="x", token_ids=[1])
    client._dispatch(DeltasEvent(deltas=[_delta(), other]))
    assert q.get_nowait() == _delta()
    assert q.empty()


def _check_generate_error(client: BackendClient, log: _RecordingLog) -> None:
    q = client._streams["r-1"] = asyncio.Queue()
    client._dispatch(GenerateErrorReply(rid="r-1", error=_error_info()))
    assert q.get_nowait() == _error_info()


def _check_pong(client: BackendClient, log: _RecordingLog) -> None:
    fut = client._pings[7] = asyncio.get_running_loop().create_future()
    client._dispatch(PongReply(ping_id=7, stats=_stats()))
    assert fut.result() == _stats()
    client._dispatch(PongReply(ping_id=8, stats=_stats()))  # no one waits for it: dropped


def _check_ready(client: BackendClient, log: _RecordingLog) -> None:
    client._dispatch(ReadyReply(fingerprint=_fingerprint()))
    assert client.fingerprint == _fingerprint()
    assert client.is_alive


def _check_error(client: BackendClient, log: _RecordingLog) -> None:
    client._dispatch(ErrorReply(error=_error_info()))
    assert "backend_rejected_frame" in log.events


def _check_dead(client: BackendClient, log: _RecordingLog) -> None:
    client._alive.set()
    q = client._streams["r-1"] = asyncio.Queue()
    client._dispatch(DeadEvent(reason="engine step raised"))
    assert not client.is_alive
    assert "engine step raised" in q.get_nowait()


def _check_poc_artifacts(client: BackendClient, log: _RecordingLog) -> None:
    fut = client._calls["p-1"] = asyncio.get_running_loop().create_future()
    reply = PocArtifactsReply(rid="p-1", artifacts=[Artifact(nonce=0, vector_b64="AAA=")])
    client._dispatch(reply)
    assert fut.result() == reply


def _check_pow_reply(cls):
    def check(client: BackendClient, log: _RecordingLog) -> None:
        msg = CANONICAL[cls]
        fut = client._calls[msg.rid] = asyncio.get_running_loop().create_future()
        client._dispatch(msg)
        assert fut.result() == msg
    return check


DISPATCH_CHECKS = {
    PowJobReply: _check_pow_reply(PowJobReply), PowStatusReply: _check_pow_reply(PowStatusReply),
    TokenizeReply: _check_pow_reply(TokenizeReply), DetokenizeReply: _check_pow_reply(DetokenizeReply),
    MetricsReply: _check_pow_reply(MetricsReply),
    PocArtifactsReply: _check_poc_artifacts,
    DeltasEvent: _check_deltas, GenerateErrorReply: _check_generate_error, PongReply: _check_pong,
    ReadyReply: _check_ready, ErrorReply: _check_error, DeadEvent: _check_dead,
}


@pytest.fixture
def client_log(monkeypatch) -> _RecordingLog:
    rec = _RecordingLog()
    monkeypatch.setattr("frontend.backend_client.log", rec)
    return rec


@pytest.fixture
async def bare_client(client_log):
    """A client that was never started: no socket, no tasks; only _dispatch is exercised."""
    client = BackendClient("ipc:///nonexistent/pocserve-test.ipc", "test-frontend")
    yield client
    await client.close()


@pytest.mark.parametrize("cls", TO_FRONTEND_TYPES, ids=lambda c: c.__name__)
async def test_protocol_every_to_frontend_type_is_dispatched(cls, bare_client, client_log):
    assert cls in DISPATCH_CHECKS, f"BackendClient._dispatch has no test for {cls.__name__}"
    DISPATCH_CHECKS[cls](bare_client, client_log)


async def test_protocol_ready_refusal_marks_client_incompatible(bare_client):
    bare_client._dispatch(ReadyReply(refusal="protocol version 2 != backend's 1"))
    assert bare_client.incompatible is not None and "protocol version 2" in bare_client.incompatible
    assert not bare_client.is_alive


async def test_protocol_ready_without_fingerprint_or_refusal_is_counted_malformed(bare_client):
    bare_client._dispatch(ReadyReply())
    assert bare_client.num_malformed_replies == 1
    assert not bare_client.is_alive and bare_client.incompatible is None


# --- decoding garbage ---

def _valid_to_backend_frames() -> list[bytes]:
    return [_encode(CANONICAL[cls]) for cls in TO_BACKEND_TYPES]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_protocol_random_bytes_raise_decode_error(data):
    with pytest.raises(msgspec.DecodeError):
        backend_codec().decode(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_protocol_truncated_frames_raise_decode_error(data):
    frame = data.draw(st.sampled_from(_valid_to_backend_frames()))
    cut = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    with pytest.raises(msgspec.DecodeError):
        backend_codec().decode(frame[:cut])


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_protocol_mutated_frames_decode_or_raise_decode_error(data):
    """Byte-level mutations of valid frames either still decode to a union member or raise DecodeError."""
    frame = bytearray(data.draw(st.sampled_from(_valid_to_backend_frames())))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        pos = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
        frame[pos] = data.draw(st.integers(min_value=0, max_value=255))
    try:
        msg = backend_codec().decode(bytes(frame))
    except msgspec.DecodeError:
        return
    assert type(msg) in TO_BACKEND_TYPES


def test_protocol_unknown_tag_raises_decode_error():
    frame = msgspec.msgpack.encode({"type": "no-such-tag", "ping_id": 1})
    with pytest.raises(msgspec.DecodeError):
        backend_codec().decode(frame)


_DEEP_ARRAY = b"\x91" * 100_000 + b"\x01"
_DEEP_MAP = b"\x81\xa1a" * 100_000 + b"\x01"


@pytest.mark.parametrize("make_codec,frame", [
    # an unknown field whose value nests deeper than the interpreter's recursion limit
    (backend_codec, b"\x83\xa4type\xa4ping\xa7ping_id\x01\xa1x" + _DEEP_ARRAY),
    (backend_codec, b"\x83\xa4type\xa4ping\xa7ping_id\x01\xa1x" + _DEEP_MAP),
    (frontend_codec, b"\x83\xa4type\xa4dead\xa6reason\xa1r\xa1x" + _DEEP_ARRAY),
    # invalid UTF-8 inside a str field
    (backend_codec, b"\x82\xa4type\xa5abort\xa4rids\x91\xa2a\xff"),
    (frontend_codec, b"\x82\xa4type\xa4dead\xa6reason\xa2\xc3\x28"),
], ids=["backend-deep-array", "backend-deep-map", "frontend-deep-array", "backend-bad-utf8", "frontend-bad-utf8"])
def test_protocol_hostile_frames_raise_decode_error(make_codec, frame):
    """These used to escape as RecursionError / UnicodeDecodeError and kill the thread or task decoding them."""
    with pytest.raises(msgspec.DecodeError):
        make_codec().decode(frame)


async def test_close_ends_the_pinger_even_when_its_ping_swallows_the_cancel(bare_client, monkeypatch):
    """On Python 3.11 asyncio.wait_for returns its future's outcome instead of raising CancelledError when both land
    in one loop iteration (a pong, or the failure a lost backend sets): the pinger must still end at close, or the
    frontend's shutdown hangs until its supervisor kills it."""
    async def ping_that_swallows_the_cancel(timeout_s=None):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise BackendUnavailable("the backend went away as the cancel came") from None

    monkeypatch.setattr(bare_client, "ping", ping_that_swallows_the_cancel)
    bare_client.ping_interval_s = 0.01
    pinger = asyncio.create_task(bare_client._pinger())
    bare_client._tasks = [pinger]
    await asyncio.sleep(0.05)  # the pinger is waiting on its ping
    try:
        await asyncio.wait_for(asyncio.shield(bare_client.close()), 10)
    finally:
        for _ in range(1000):  # a pinger that outlived close: cancelled while it sleeps, so the fixture's close ends
            if pinger.done():
                break
            pinger.cancel()
            await asyncio.sleep(0.002)
