"""More of what /openapi.json states and the frontend applies alike (issue 33, schemathesis `--checks all` at
1550ade): integers written as `1.0`, the rules across /tokenize's fields, tool_choice without tools, the values of
/v1/responses' fields that this server serves, and /detokenize's vocabulary bound. For each, what the schema calls
valid is accepted and what it calls invalid is a 400 naming the field (jsonschema reads the schema here, as a
checker would). The real app over ASGI with a backend stand-in; nothing reaches a backend.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

import jsonschema
import msgspec
import pytest
from pydantic import BaseModel

from frontend.fields import INTEGRAL
from frontend.openai_models import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from frontend.pow_models import GenerateRequest, InitGenerateRequest
from frontend.responses_models import ResponsesRequest
from tests.unit.test_frontend_errors import FP, Backend, make_app, request
from tests.unit.test_frontend_stated_rules import CHAT, COMPLETION, GENERATE, NODE, RESPONSE, NoPowBackend


@pytest.fixture(scope="module")
def schema() -> dict:
    return make_app().openapi()


def validator(schema: dict, component: str) -> jsonschema.Draft202012Validator:
    """A validator of one request body, its $refs read in the whole document."""
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/components/schemas/{component}"})


# --- integers: 1.0 is 1 in every integer field, 1.5 is a 400 ---

def _bare_ints(annotation: Any, metadata: tuple = (), seen: set | None = None) -> list[str]:
    """Integer types in a field's annotation (nested models included) that do not take integral floats."""
    seen = set() if seen is None else seen
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        return _bare_ints(base, (*metadata, *extra), seen)
    if annotation is int:
        return [] if INTEGRAL in metadata else [repr(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return []
        seen.add(annotation)
        return [f"{annotation.__name__}.{name}: {found}" for name, field in annotation.model_fields.items()
                for found in _bare_ints(field.annotation, tuple(field.metadata), seen)]
    return [found for arg in get_args(annotation) for found in _bare_ints(arg, (), seen)]


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest,
                                   ResponsesRequest, InitGenerateRequest, GenerateRequest],
                         ids=lambda m: m.__name__)
def test_every_integer_field_takes_integral_floats(model):
    """Each integer field has a type of frontend/fields.py, so a field added later with a plain `int` fails here."""
    assert _bare_ints(model) == []


@pytest.mark.parametrize("path,body,field,backend", [
    ("/api/v1/pow/init/generate", NODE, ("params", "seq_len"), NoPowBackend),
    ("/api/v1/pow/generate", GENERATE, ("nonces", 0), NoPowBackend),
    ("/v1/completions", COMPLETION, ("stop_token_ids", 0), Backend),
    ("/v1/chat/completions", CHAT, ("seed",), Backend),
    ("/v1/responses", RESPONSE, ("max_output_tokens",), Backend),
], ids=lambda v: v if isinstance(v, str) else None)
async def test_integral_floats_are_accepted_and_fractions_refused(path, body, field, backend):
    def with_value(value: float) -> dict:
        copy = msgspec.json.decode(msgspec.json.encode(body))
        node = copy
        for key in field[:-1]:
            node = node.setdefault(key, {})
        if field[-1] == 0:
            copy[field[0]] = [value]
        else:
            node[field[-1]] = value
        return copy

    r = await request(make_app(backend()), "POST", path, json=with_value(8.0))
    assert r.status_code in (200, 503), r.text  # 503: past validation, at the PoC stand-in
    r = await request(make_app(backend()), "POST", path, json=with_value(8.5))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == ".".join(map(str, field)) and "valid integer" in error["message"], error


def test_integral_float_is_the_integer_itself():
    assert InitGenerateRequest.model_validate({**NODE, "params": {"model": "m", "seq_len": 8.0}}).params.seq_len == 8
    assert type(CompletionRequest.model_validate({**COMPLETION, "stop_token_ids": [2.0]}).stop_token_ids[0]) is int
    for value in ["8", True, float("inf"), 1e300, -1.0]:  # strings and booleans stay refused, and the bounds hold
        with pytest.raises(ValueError):
            InitGenerateRequest.model_validate({**NODE, "params": {"model": "m", "seq_len": value}})


# --- /tokenize: exactly one of prompt and messages; continue_final_message needs add_generation_prompt false ---

MESSAGES = [{"role": "user", "content": "hi"}]
TOKENIZE = [
    ({"prompt": "hi"}, True),
    ({"messages": MESSAGES}, True),
    ({"prompt": "hi", "messages": None}, True),
    ({"prompt": "hi", "messages": MESSAGES}, False),
    ({}, False),
    ({"prompt": None, "messages": None}, False),
    ({"messages": MESSAGES, "continue_final_message": True}, False),  # add_generation_prompt defaults to true
    ({"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": True}, False),
    ({"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": False}, True),
    ({"prompt": "hi", "continue_final_message": True}, True),  # the flags apply to messages only
]


@pytest.mark.parametrize("body,valid", TOKENIZE)
async def test_tokenize_rules_are_stated_and_applied(schema, body, valid):
    assert validator(schema, "TokenizeRequest").is_valid(body) == valid
    r = await request(make_app(NoPowBackend()), "POST", "/tokenize", json=body)
    if valid:
        assert r.status_code == 503, r.text  # past every check, at the stand-in backend
    else:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] in ("prompt", "continue_final_message")


# --- tool_choice without tools ---

TOOLS = [{"type": "function", "function": {"name": "f"}}]
CHAT_CHOICES = [
    ({}, True), ({"tool_choice": "none"}, True), ({"tool_choice": None}, True),
    ({"tool_choice": "auto"}, False), ({"tool_choice": "required"}, False),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, False),
    ({"tool_choice": "auto", "tools": TOOLS}, True), ({"tool_choice": "required", "tools": TOOLS}, True),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": TOOLS}, True),
]


@pytest.mark.parametrize("extra,valid", CHAT_CHOICES)
async def test_chat_tool_choice_needs_tools_as_stated(schema, extra, valid):
    assert validator(schema, "ChatCompletionRequest").is_valid({**CHAT, **extra}) == valid
    r = await request(make_app(), "POST", "/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == (200 if valid else 400), r.text
    if not valid:
        assert r.json()["error"]["param"] == "tool_choice"


# --- /v1/responses: the values served, stated; the others refused with their own message ---

RESPONSE_TOOLS = [{"type": "function", "name": "f"}]
NARROWED = [
    ({"truncation": "auto"}, "truncation", "never truncated"),
    ({"background": True}, "background", "background"),
    ({"prompt": {"id": "p"}}, "prompt", "prompt template"),
    ({"reasoning": {"effort": "low"}}, "reasoning.effort", "reasoning effort"),
    ({"previous_response_id": "resp_1"}, "response_id", "not found"),
    ({"tool_choice": "required"}, "tool_choice", "'required'"),
]


@pytest.mark.parametrize("extra,param,message", NARROWED, ids=[n[1] for n in NARROWED])
async def test_responses_schema_states_only_the_values_served(schema, extra, param, message):
    assert not validator(schema, "ResponsesRequest").is_valid({**RESPONSE, **extra})
    r = await request(make_app(), "POST", "/v1/responses", json={**RESPONSE, **extra})
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


@pytest.mark.parametrize("extra", [{"truncation": "disabled"}, {"truncation": None}, {"background": False},
                                   {"prompt": None}, {"reasoning": {"effort": None, "summary": "auto"}},
                                   {"previous_response_id": None}, {"store": True}, {"store": False},
                                   {"tool_choice": "required", "tools": RESPONSE_TOOLS},
                                   {"tool_choice": "auto"}])
async def test_responses_values_the_schema_calls_valid_are_served(schema, extra):
    assert validator(schema, "ResponsesRequest").is_valid({**RESPONSE, **extra})
    r = await request(make_app(), "POST", "/v1/responses", json={**RESPONSE, **extra})
    assert r.status_code == 200, r.text


# --- /detokenize: ids bounded by the vocabulary once the backend says its size ---

class VocabBackend(Backend):
    fingerprint = msgspec.structs.replace(FP, vocab_size=512)


async def test_detokenize_states_the_vocabulary_once_known(schema):
    [before] = [schema["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]]
    assert before["maximum"] == 2**63 - 1  # no fingerprint size: msgspec's bound only
    app = make_app(VocabBackend())
    stated = app.openapi()
    assert stated["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == 511
    # A copy per request: the cached document keeps no model's bound.
    assert app.openapi_schema["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"][
        "maximum"] == 2**63 - 1
    served = (await request(app, "GET", "/openapi.json")).json()
    assert served["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == 511
    check = validator(stated, "DetokenizeRequest")
    assert check.is_valid({"tokens": [0, 511]}) and not check.is_valid({"tokens": [512]})


@pytest.mark.parametrize("model,body,tools", [
    (ChatCompletionRequest, CHAT, [{"type": "function", "function": {"name": "f"}}] * 2),
    (ResponsesRequest, RESPONSE, [{"type": "function", "name": "f"}] * 2),
], ids=["chat", "responses"])
def test_tools_sharing_a_name_are_served_as_vllm_serves_them(schema, model, body, tools):
    """vLLM (the network's nodes) takes them; a validator replaying such a request must not refuse it."""
    assert "share a function name" in schema["components"]["schemas"][model.__name__]["properties"]["tools"][
        "description"]
    assert len(model.model_validate({**body, "tools": tools}).tools) == 2
