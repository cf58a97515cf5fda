"""usage.prompt_tokens_details (--enable-prompt-tokens-details) as vllm serve 0.26/0.29 shapes it: the shapes
alone, then through the real app over ASGI with a backend stand-in (which engine output's count each mode reads).

vLLM's rules (vllm/entrypoints/openai/chat_completion/serving.py, vllm/entrypoints/openai/completion/serving.py):
off, no details; on, a
whole response carries PromptTokenUsageInfo dumped with its nulls, the closing usage chunk of a stream carries it
without them, continuous usage chunks never; chat adds created_cache_tokens, completions do not.
"""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from frontend.app import create_app
from frontend.convert import TokenFormat
from frontend.metrics import FrontendMetrics
from frontend.settings import load_settings
from frontend.shape import ChatShape, CompletionShape
from protocol.common import Fingerprint
from protocol.generate import Delta

FMT = TokenFormat(as_ids=False)
FP = Fingerprint(protocol_version=2, served_model_name="tiny", model_path="/models/tiny", max_model_len=2048,
                 block_size=16, dtype="bfloat16", vllm_version="0.29.0", engine_device="cpu",
                 poc_code_version="abc123", scheduling_mode="exclusive")


def _delta(**kw) -> Delta:
    return Delta(**{"rid": "r", "text": "x", "token_ids": [1], "num_prompt_tokens": 40, "num_generated_tokens": 2,
                    "finish_reason": "stop", "num_cached_tokens": 32, "num_cache_creation_tokens": 0, **kw})


# --- shapes ---

def test_prompt_details_whole_chat_and_completion_as_vllm_dumps_them():
    d = _delta(num_cached_tokens=32, num_cache_creation_tokens=8)
    chat = ChatShape("chat", "m", FMT, is_prompt_details=True).response([d], d)
    assert chat["usage"] == {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42, "prompt_tokens_details":
                             {"cached_tokens": 32, "created_cache_tokens": 8, "multimodal_tokens": None}}
    completion = CompletionShape("completions", "m", FMT, is_prompt_details=True).response([d], d)
    assert completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 32, "created_cache_tokens": None,
                                                            "multimodal_tokens": None}


def test_prompt_details_stream_usage_chunk_drops_nulls():
    d = _delta(num_cached_tokens=0, num_cache_creation_tokens=32)
    chat = ChatShape("chat", "m", FMT, is_prompt_details=True).usage_chunk({0: d}, d)
    assert chat["choices"] == [] and chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 0,
                                                                                "created_cache_tokens": 32}
    completion = CompletionShape("completions", "m", FMT, is_prompt_details=True).usage_chunk({0: d}, d)
    assert completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("shape_cls", [ChatShape, CompletionShape])
def test_prompt_details_off_or_not_sent_leaves_usage_as_before(shape_cls):
    plain = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
    d = _delta()
    off = shape_cls("k", "m", FMT)
    assert off.response([d], d)["usage"] == plain and off.usage_chunk({0: d}, d)["usage"] == plain
    # A backend older than the field sends no counts: no details, as vLLM when the engine gives none.
    old = _delta(num_cached_tokens=None, num_cache_creation_tokens=None)
    on = shape_cls("k", "m", FMT, is_prompt_details=True)
    assert on.response([old], old)["usage"] == plain and on.usage_chunk({0: old}, old)["usage"] == plain


@pytest.mark.parametrize("shape_cls", [ChatShape, CompletionShape])
def test_prompt_details_never_in_continuous_usage_chunks(shape_cls):
    shape = shape_cls("k", "m", FMT, is_continuous_usage=True, is_prompt_details=True)
    for chunk in [*shape.preamble(1, 40), *shape.chunks(_delta())]:
        assert set(chunk["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


# --- through the app: which delta's counts a request reports ---

class Backend:
    """What the routes use of BackendClient; every generation answers with `deltas`."""

    is_alive = True
    stats = None
    handshakes = None
    direct = None
    num_malformed_replies = 0
    fingerprint = FP

    def __init__(self, deltas: list[Delta]) -> None:
        self.deltas = deltas

    def new_rid(self) -> str:
        return "r"

    async def generate(self, req):
        for d in self.deltas:
            yield d


# Two engine outputs with different counts, as the two choices of n=2 may have: vLLM reads a stream's first
# output and a whole response's last one.
TWO_OUTPUTS = [_delta(index=0, finish_reason=None, num_cached_tokens=16, num_cache_creation_tokens=16),
               _delta(index=1, num_cached_tokens=32, num_cache_creation_tokens=0),
               _delta(index=0, text="y", num_cached_tokens=32, num_cache_creation_tokens=0)]


def _app(deltas: list[Delta], environ: dict[str, str]):
    app = create_app(load_settings([], environ))
    backend = Backend(deltas)
    app.state.client = backend
    app.state.metrics = FrontendMetrics(backend)
    app.state.token_format = FMT
    return app


async def _post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.post(path, json=body)


def _usage_chunk(r: httpx.Response) -> dict:
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])["usage"]


ON = {"POCSERVE_ENABLE_PROMPT_TOKENS_DETAILS": "1"}
ROUTES = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
          ("/v1/completions", {"prompt": "hi"})]


@pytest.mark.parametrize(("path", "fields"), ROUTES)
async def test_prompt_details_whole_response_reads_the_last_output(path, fields):
    r = await _post(_app(TWO_OUTPUTS, ON), path, {"model": "tiny", "n": 2, **fields})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


@pytest.mark.parametrize(("path", "fields"), ROUTES)
async def test_prompt_details_stream_reads_the_first_output(path, fields):
    body = {"model": "tiny", "n": 2, "stream": True, "stream_options": {"include_usage": True}, **fields}
    usage = _usage_chunk(await _post(_app(TWO_OUTPUTS, ON), path, body))
    assert usage["prompt_tokens_details"]["cached_tokens"] == 16


@pytest.mark.parametrize(("path", "fields"), ROUTES)
async def test_prompt_details_off_by_default(path, fields):
    app = _app(TWO_OUTPUTS, {})
    r = await _post(app, path, {"model": "tiny", "n": 2, **fields})
    assert "prompt_tokens_details" not in r.json()["usage"]
    body = {"model": "tiny", "n": 2, "stream": True, "stream_options": {"include_usage": True}, **fields}
    assert "prompt_tokens_details" not in _usage_chunk(await _post(app, path, body))


def test_prompt_details_setting_flag_and_variable():
    assert load_settings([], {}).enable_prompt_tokens_details is False
    assert load_settings(["--enable-prompt-tokens-details"], {}).enable_prompt_tokens_details is True
    assert load_settings([], ON).enable_prompt_tokens_details is True


def test_prompt_details_counts_are_optional_on_the_wire():
    """Both ends of the link may be of different builds (frontends scale apart): either side decodes the other."""

    class OldDelta(msgspec.Struct, kw_only=True):  # Delta before the counts
        rid: str
        text: str
        token_ids: list[int]

    assert msgspec.msgpack.decode(msgspec.msgpack.encode(OldDelta(rid="r", text="x", token_ids=[1])),
                                  type=Delta).num_cached_tokens is None
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(_delta()), type=OldDelta).text == "x"
