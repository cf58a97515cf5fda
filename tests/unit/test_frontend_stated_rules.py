"""What the frontend refuses is what /openapi.json states (issue 33): schemathesis `--checks all` found schema-valid
bodies refused with a 400 (docs/reliability.md, section 3). Each rule below is now stated in the schema, or, where
JSON Schema cannot say it, described on the field; the server still refuses each violation with a 400 naming the
field, and what the schema calls valid is accepted.

The real app over ASGI with a backend stand-in (tests/unit/test_frontend_errors.py); nothing reaches a backend.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from frontend.backend_client import BackendUnavailable
from frontend.openai_models import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from frontend.pow_models import CALLBACK_URL_PATTERN, InitGenerateRequest
from frontend.responses_models import ResponsesRequest
from tests.unit.test_frontend_errors import Backend, make_app, request

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "tiny", "prompt": "hi"}
RESPONSE = {"model": "tiny", "input": "hi"}
NODE = {"block_hash": "h", "block_height": 1, "public_key": "k", "node_id": 0, "node_count": 1,
        "params": {"model": "tiny", "seq_len": 8}}
GENERATE = {**NODE, "nonces": [1]}


class NoPowBackend(Backend):
    """A body that passes validation reaches `call`: a 503 here tells it passed."""

    async def call(self, msg, timeout_s):
        raise BackendUnavailable("stand-in")


@pytest.fixture(scope="module")
def schema() -> dict:
    return make_app().openapi()


def body_schema(schema: dict, path: str) -> dict:
    ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def members(node: dict, kind: str) -> list[dict]:
    """The members of a property's schema (its anyOf, or itself) of one JSON type."""
    return [m for m in node.get("anyOf", [node]) if m.get("type") == kind]


# --- stated in the schema: each keyword on the field, and the server's 400 naming it ---

STOP_ROUTES = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/v1/responses", RESPONSE)]


@pytest.mark.parametrize("path,body", STOP_ROUTES, ids=lambda v: v if isinstance(v, str) else "")
def test_stop_states_non_empty_strings_and_at_most_16(schema, path, body):
    stop = body_schema(schema, path)["properties"]["stop"]
    [string] = members(stop, "string")
    [array] = members(stop, "array")
    assert string["minLength"] == 1
    assert array["items"]["minLength"] == 1 and array["maxItems"] == 16


@pytest.mark.parametrize("path,body", STOP_ROUTES, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("stop", ["", [""], ["a", ""], ["a"] * 17], ids=["empty", "list-empty", "one-empty", "17"])
async def test_stop_violations_are_400_naming_stop(path, body, stop):
    r = await request(make_app(), "POST", path, json={**body, "stop": stop})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop" and "stop takes up to 16 non-empty strings" in error["message"], error


@pytest.mark.parametrize("model,body", [(ChatCompletionRequest, CHAT), (CompletionRequest, COMPLETION),
                                        (ResponsesRequest, RESPONSE)])
def test_stop_the_schema_calls_valid_is_accepted(model, body):
    for stop, expected in [("x", ["x"]), (["a"] * 16, ["a"] * 16), (None, []), ([], [])]:
        assert model.model_validate({**body, "stop": stop}).stop == expected


@pytest.mark.parametrize("path,field,body,param", [
    ("/tokenize", "messages", {"model": "tiny", "messages": []}, "messages"),
    ("/v1/chat/completions", "messages", {**CHAT, "messages": []}, "messages"),
    ("/v1/responses", "input", {**RESPONSE, "input": []}, "input"),
])
async def test_lists_that_need_an_item_state_min_items(schema, path, field, body, param):
    [array] = members(body_schema(schema, path)["properties"][field], "array")
    assert array["minItems"] == 1
    r = await request(make_app(), "POST", path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tokenize_one_message_is_still_accepted():
    body = TokenizeRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert body.messages is not None and len(body.messages) == 1
    assert TokenizeRequest.model_validate({"prompt": "hi"}).messages is None


# --- the callback url: the pattern the schema states is the one the validator applies ---

@pytest.mark.parametrize("path", ["/api/v1/pow/init/generate", "/api/v1/pow/generate"])
def test_callback_url_states_the_validators_pattern(schema, path):
    [string] = members(body_schema(schema, path)["properties"]["url"], "string")
    assert string["pattern"] == CALLBACK_URL_PATTERN
    assert "http://" in string["description"]


ACCEPTED = ["http://dapi", "https://dapi:9100/v2/poc-batches/org%252Fmodel", "HTTPS://dapi:9100/v2/poc-batches/m",
            "http://user:pw@10.0.0.1:80/x?y=1#z", "http://[::1]:8080/cb", "http://[2001:db8::8a2e:370:7334]/",
            "http://[::ffff:192.0.2.1]", "http://my_node.local:65535", "http://h:", "http://h:00080/"]
REFUSED = ["ftp://dapi/x", "dapi:9100", "http://", "http://dapi:99999/x", "http://dapi:port/x", "http://:9100/x",
           "file:///etc/passwd", "http://[::1", "http://[:::]/", "http://[1.2.3.4]/", "http://dapi/a b",
           " http://dapi", "http://dapi\t/x", "http://dapi/\u00e9", "http://a:1:2/", "http//dapi", "http:dapi"]


async def _generate_answers(valid: bool, change: dict, param: str, phrase: str) -> None:
    """/api/v1/pow/generate with `change`: past validation (at the stand-in backend, 503) when `valid`, else a 400
    naming `param` whose message holds `phrase`."""
    r = await request(make_app(NoPowBackend()), "POST", "/api/v1/pow/generate", json={**GENERATE, **change})
    if valid:
        assert r.status_code == 503, r.text  # past validation, at the stand-in backend
    else:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and phrase in error["message"], error


@pytest.mark.parametrize("url", ACCEPTED + REFUSED)
async def test_callback_url_is_accepted_exactly_when_the_schema_says_valid(schema, url):
    [string] = members(body_schema(schema, "/api/v1/pow/generate")["properties"]["url"], "string")
    valid = jsonschema.Draft202012Validator(string).is_valid(url)
    assert valid == (url in ACCEPTED)
    await _generate_answers(valid, {"url": url}, "url", "http:// or https:// URL")


def _parses_as_before(url: str) -> bool:
    """The check the validator made before it applied the pattern: what the backend's callbacks rely on."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a port past 65535, or not a number, raises here)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(url=st.from_regex(re.compile(CALLBACK_URL_PATTERN)))
def test_every_url_the_pattern_matches_is_accepted_and_parses(url):
    """What schemathesis draws as a valid url is accepted, and is a URL the old urlsplit checks took."""
    assert _parses_as_before(url), url
    assert InitGenerateRequest.model_validate({**NODE, "url": url}).url == url


# --- rules the schema cannot state: described on the field, still a 400 naming it ---

@pytest.mark.parametrize("path,tools,choice", [
    ("/v1/chat/completions", [{"type": "function", "function": {"name": "f"}}],
     {"type": "function", "function": {"name": "g"}}),
    ("/v1/responses", [{"type": "function", "name": "f"}], {"type": "function", "name": "g"}),
])
async def test_tool_choice_rule_is_described_and_refused(schema, path, tools, choice):
    description = body_schema(schema, path)["properties"]["tool_choice"]["description"]
    assert "`tools`" in description and "400" in description
    body = CHAT if path == "/v1/chat/completions" else RESPONSE
    r = await request(make_app(), "POST", path, json={**body, "tools": tools, "tool_choice": choice})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"


def test_detokenize_vocabulary_bound_is_described(schema):
    description = body_schema(schema, "/detokenize")["properties"]["tokens"]["description"]
    assert "vocabulary" in description and "400" in description


async def test_the_two_threshold_names_state_one_of_them(schema):
    """Either name alone is accepted; both in one body (equal or not) are refused, as the schema's `not` says."""
    stat_test = schema["components"]["schemas"]["StatTestModel"]
    for name, other in [("fraud_threshold", "p_value_threshold"), ("p_value_threshold", "fraud_threshold")]:
        description = stat_test["properties"][name]["description"]
        assert f"`{other}`" in description and "400" in description and "one of them" in description
    validator = jsonschema.Draft202012Validator({**schema, "$ref": "#/components/schemas/StatTestModel"})
    for body, valid in [({"fraud_threshold": 0.1}, True), ({"p_value_threshold": 0.1}, True),
                        ({"fraud_threshold": 0.1, "p_value_threshold": None}, True), ({}, True),
                        ({"fraud_threshold": 0.1, "p_value_threshold": 0.1}, False),
                        ({"fraud_threshold": 0.1, "p_value_threshold": 0.2}, False)]:
        assert validator.is_valid(body) == valid, body
        await _generate_answers(valid, {"stat_test": body}, "stat_test", "send one of them")


# --- /v1/responses/{id}: vLLM's 404 for every id, left out of the schema ---

@pytest.mark.parametrize("method,path", [("get", "/v1/responses/{response_id}"),
                                         ("post", "/v1/responses/{response_id}/cancel")])
async def test_stored_response_routes_answer_404_and_are_not_stated(schema, method, path):
    """No response is ever found (nothing is stored), so the schema does not offer the routes: stated, they made a
    POST /v1/responses look like it created something to fetch (schemathesis' ST302)."""
    assert path not in schema["paths"]
    store = body_schema(schema, "/v1/responses")["properties"]["store"]["description"]
    assert "nothing is stored" in store
    r = await request(make_app(), method.upper(), path.format(response_id="resp_1"))
    # vLLM's answer without a response store: the same status, message and param.
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "Response with id 'resp_1' not found.", "type": "invalid_request_error",
                                 "param": "response_id", "code": 404}


def test_the_models_still_refuse_what_they_refused():
    """The schema-only bounds did not loosen the validators."""
    for model, body in [(CompletionRequest, {**COMPLETION, "stop": [""]}),
                        (ResponsesRequest, {**RESPONSE, "input": []}),
                        (InitGenerateRequest, {**NODE, "url": "ftp://x"})]:
        with pytest.raises(ValidationError):
            model.model_validate(body)
