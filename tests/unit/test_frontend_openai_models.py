"""Unit tests for the OpenAI request models: inputs that must be a 400 at the edge, not a 500 further in."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from frontend import convert
from frontend.openai_models import ChatCompletionRequest, CompletionRequest
from protocol.codec import backend_codec, frontend_codec

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "tiny", "prompt": "hi"}


def _rejects_at(model, body: dict, path: tuple) -> bool:
    """The first error lies under `path` (a union adds the member that failed, e.g. `list[str]`, after it)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return info.value.errors()[0]["loc"][:len(path)] == path


# Found by the schemathesis sweep (tests/integration/test_http_sweep.py): each was a 500 before.
@pytest.mark.parametrize("change,path", [
    # msgspec cannot encode integers past 64 bits for the backend.
    ({"stop_token_ids": [2**64]}, ("stop_token_ids", 0)),
    ({"stop_token_ids": [-1]}, ("stop_token_ids", 0)),
    ({"top_k": 2**64}, ("top_k",)),
    ({"min_tokens": 2**64}, ("min_tokens",)),
    ({"max_tokens": 2**64}, ("max_tokens",)),
    ({"max_completion_tokens": 2**64}, ("max_completion_tokens",)),
    # JSON bodies may carry Infinity (Python's json accepts it); vLLM refuses a non-finite penalty.
    ({"repetition_penalty": float("inf")}, ("repetition_penalty",)),
    ({"repetition_penalty": float("nan")}, ("repetition_penalty",)),
    # A lone UTF-16 surrogate ("\ud800" in JSON) cannot be encoded as UTF-8 for the backend.
    ({"messages": [{"role": "user", "content": "\ud800"}]}, ("messages", 0, "content")),
    ({"messages": [{"role": "user", "content": "hi", "name": "a\udfff"}]}, ("messages", 0, "name")),
    ({"enforced_str": "\ud800"}, ("enforced_str",)),
    ({"enforced_tokens": {"tokens": [{"token": "\ud800"}]}}, ("enforced_tokens", "tokens", 0, "token")),
    ({"model": "\ud800"}, ("model",)),
], ids=lambda v: str(v))
def test_openai_models_chat_rejects(change, path):
    assert _rejects_at(ChatCompletionRequest, {**CHAT, **change}, path)


@pytest.mark.parametrize("change,path", [
    ({"prompt": "\udc00"}, ("prompt",)),
    ({"prompt": ["\udc00"]}, ("prompt",)),
    ({"max_tokens": 2**64}, ("max_tokens",)),
], ids=lambda v: str(v))
def test_openai_models_completion_rejects(change, path):
    assert _rejects_at(CompletionRequest, {**COMPLETION, **change}, path)


def test_openai_models_largest_accepted_values_encode_for_the_backend():
    body = ChatCompletionRequest.model_validate({
        **CHAT, "messages": [{"role": "user", "content": "\U0001f600 ok"}], "stop_token_ids": [2**63 - 1],
        "top_k": 2**63 - 1, "min_tokens": 2**63 - 1, "max_tokens": 2**63 - 1, "seed": -(2**63),
        "repetition_penalty": 1e308})
    msg = backend_codec().decode(frontend_codec().encode(convert.chat_request("r1", body)))
    s = msg.sampling
    assert msg.rid == "r1" and [m.content for m in msg.messages] == ["\U0001f600 ok"]
    assert (s.stop_token_ids, s.top_k, s.min_tokens, s.max_tokens, s.seed, s.repetition_penalty) == (
        [2**63 - 1], 2**63 - 1, 2**63 - 1, 2**63 - 1, -(2**63), 1e308)
    body = CompletionRequest.model_validate({**COMPLETION, "max_tokens": 2**63 - 1, "stop_token_ids": [0]})
    msg = backend_codec().decode(frontend_codec().encode(convert.completion_request("r2", body)))
    assert (msg.rid, msg.prompt, msg.sampling.max_tokens, msg.sampling.stop_token_ids) == ("r2", "hi", 2**63 - 1, [0])


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("change,path", [
    ({"tools": []}, ("tools",)),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, ("tools", 0, "function", "name")),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     ("tools", 0, "function", "parameters")),
    ({"tool_choice": "required"}, ("tool_choice",)),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, ("tool_choice",)),
    ({"tools": [TOOL], "tool_choice": "always"}, ("tool_choice",)),
    ({"n": 0}, ("n",)),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}]},
     ("messages", 0, "tool_calls", 0, "function", "arguments")),
], ids=lambda v: str(v))
def test_openai_models_tool_fields_rejects(change, path):
    assert _rejects_at(ChatCompletionRequest, {**CHAT, **change}, path)


def test_openai_models_tools_and_history_reach_the_wire():
    body = ChatCompletionRequest.model_validate({
        **CHAT, "n": 3, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "refusal": None, "reasoning_content": "hmm",
                      "tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})
    gen = convert.chat_request("r1", body)
    assert gen.sampling.n == 3 and gen.named_tool == "get_weather" and gen.tool_choice is None
    assert not gen.parallel_tool_calls
    assert [t.name for t in gen.tools or ()] == ["get_weather"] and gen.tools[0].parameters == '{"type": "object"}'
    assistant, tool = gen.messages[1], gen.messages[2]
    assert assistant.content == "" and assistant.reasoning == "hmm" and assistant.tool_calls[0].id == "c1"
    assert tool.tool_call_id == "c1"
    frontend_codec().encode(gen)
