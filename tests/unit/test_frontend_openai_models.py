"""Unit tests for the OpenAI request models: inputs that must be a 400 at the edge, not a 500 further in."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from frontend import convert
from frontend.openai_models import ChatCompletionRequest, CompletionRequest
from protocol.codec import frontend_codec

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
    frontend_codec().encode(convert.chat_request("r1", body))
    body = CompletionRequest.model_validate({**COMPLETION, "max_tokens": 2**63 - 1, "stop_token_ids": [0]})
    frontend_codec().encode(convert.completion_request("r2", body))
