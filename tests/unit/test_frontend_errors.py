"""The frontend's error answers: the same body for a backend error before and during a stream, Starlette's own
answers with their headers, malformed JSON, and the bearer tokens checked first (frontend/auth.py).

The real app over ASGI with a backend stand-in; the lifespan is not run (as in test_frontend_pow.py).
"""

from __future__ import annotations

import json

import httpx
import pytest

from frontend.app import create_app
from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.convert import TokenFormat
from frontend.metrics import FrontendMetrics
from frontend.settings import load_settings
from protocol.common import ErrorInfo, Fingerprint
from protocol.generate import Delta

FP = Fingerprint(protocol_version=2, served_model_name="tiny", model_path="/models/tiny", max_model_len=2048,
                 block_size=16, dtype="bfloat16", vllm_version="0.29.0", engine_device="cpu",
                 poc_code_version="abc123", scheduling_mode="exclusive")
CHAT = ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
COMPLETION = ("/v1/completions", {"model": "tiny", "prompt": "hi"})
# What a backend may say once a request is under way: the processor's refusal naming a field, the gate's 503.
REFUSED = ErrorInfo(status=400, message="logit_bias: token id 99999 is out of vocabulary", type="BadRequestError",
                    param="logit_bias")
GATED = ErrorInfo(status=503, message="PoC generation is active.", type="service_unavailable")


class Backend:
    """What the routes use of BackendClient: each generation yields `num_deltas` deltas, then raises `error`."""

    is_alive = True
    stats = None
    handshakes = None
    direct = None
    num_malformed_replies = 0
    fingerprint = FP

    def __init__(self, error: Exception | None = None, num_deltas: int = 1) -> None:
        self.error, self.num_deltas = error, num_deltas

    def new_rid(self) -> str:
        return "r"

    async def generate(self, req):
        for i in range(self.num_deltas):
            yield Delta(rid="r", text=f"t{i}", token_ids=[i], num_prompt_tokens=3, num_generated_tokens=i + 1)
        if self.error is not None:
            raise self.error


def make_app(backend: Backend | None = None, environ: dict[str, str] | None = None):
    app = create_app(load_settings([], environ or {}))
    backend = backend or Backend()
    app.state.client = backend
    app.state.metrics = FrontendMetrics(backend)
    app.state.token_format = TokenFormat(as_ids=False)
    return app


async def request(app, method: str, path: str, **kw) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.request(method, path, **kw)


def stream_error(r: httpx.Response) -> dict:
    """The error event that ends a stream, checked to be followed by [DONE]."""
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", r.text
    last = json.loads(events[-2])
    assert set(last) == {"error"}, last
    return last["error"]


# --- a backend error: the same body whether it comes before the stream or during it ---

@pytest.mark.parametrize("route", [CHAT, COMPLETION], ids=["chat", "completions"])
@pytest.mark.parametrize("error,status,type_,param", [
    (BackendRequestError(REFUSED), 400, "BadRequestError", "logit_bias"),
    (BackendRequestError(GATED), 503, "service_unavailable", None),
    (BackendUnavailable("backend not connected"), 503, "ServiceUnavailableError", None),
], ids=["refused", "gated", "unavailable"])
async def test_streamed_error_keeps_the_backends_type_and_param(route, error, status, type_, param):
    path, body = route
    streamed = await request(make_app(Backend(error, num_deltas=2)), "POST", path, json={**body, "stream": True})
    assert streamed.status_code == 200
    in_stream = stream_error(streamed)
    assert (in_stream["code"], in_stream["type"], in_stream["param"]) == (status, type_, param)
    # Before the first delta the same error is the HTTP answer: the stream's event carries the same body.
    whole = await request(make_app(Backend(error, num_deltas=0)), "POST", path, json=body)
    assert whole.status_code == status
    assert whole.json()["error"] == in_stream


# --- Starlette's and FastAPI's own answers ---

async def test_405_keeps_its_allow_header_and_vllms_type():
    r = await request(make_app(), "GET", "/v1/chat/completions")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    # vLLM's HTTPException handler types these with the reason phrase.
    assert r.json()["error"] == {"message": "Method Not Allowed", "type": "Method Not Allowed", "param": None,
                                 "code": 405}


async def test_unknown_route_is_404_typed_as_vllm_types_it():
    r = await request(make_app(), "GET", "/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "Not Found"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/api/v1/pow/generate"])
async def test_malformed_json_is_400_with_a_clear_message_and_no_param(path):
    r = await request(make_app(), "POST", path, content=b'{"model": "tiny",',
                      headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] is None and err["type"] == "BadRequestError"
    # The decoder's reason and where it stopped, not "<offset>: JSON decode error".
    assert err["message"] == "the request body is not valid JSON: Expecting property name enclosed in double " \
                             "quotes (at character 17)", err


async def test_a_field_error_still_names_its_param():
    path, body = CHAT
    r = await request(make_app(), "POST", path, json={**body, "temperature": "hot"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text


async def test_body_over_the_limit_is_413_request_entity_too_large_error():
    path, body = CHAT
    r = await request(make_app(environ={"POCSERVE_MAX_BODY_BYTES": "1024"}), "POST", path,
                      json={**body, "stop": "x" * 2000})
    assert r.status_code == 413 and r.json()["error"]["type"] == "RequestEntityTooLargeError"


async def test_unknown_model_is_404_naming_the_model():
    path, body = CHAT
    r = await request(make_app(), "POST", path, json={**body, "model": "other"})
    assert r.status_code == 404
    assert (r.json()["error"]["type"], r.json()["error"]["param"]) == ("NotFoundError", "model")


# --- types as the schema says them: no coercion ---

@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT[1], "max_tokens": "5"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT[1], "stream": 1}, "stream"),
    ("/v1/chat/completions", {**CHAT[1], "stop_token_ids": [False, True]}, "stop_token_ids.0"),
    ("/v1/chat/completions", {**CHAT[1], "tools": [{"type": "function", "function": {"name": "f", "strict": 0}}]},
     "tools.0.function.strict"),
    ("/detokenize", {"model": "tiny", "tokens": [False, True]}, "tokens.0"),
    ("/api/v1/pow/generate", {"block_hash": "h", "block_height": 1, "public_key": "k", "node_id": 0,
                              "node_count": 1, "nonces": ["1"], "params": {"model": "tiny", "seq_len": 8}},
     "nonces.0"),
])
async def test_values_of_another_type_are_refused_not_coerced(path, body, param):
    """pydantic's lax mode took "5" for 5, false for 0 and 0 for false, where the schema says integer or boolean."""
    r = await request(make_app(), "POST", path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"model": "tiny", "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": []}, "prompt"),
    ("/v1/chat/completions", {**CHAT[1], "tools": []}, "tools"),
])
async def test_what_the_schema_bounds_is_refused_by_the_frontend(path, body, param):
    """The schema says minLength/minItems 1 for these (tests/unit/test_frontend_openapi.py reads it); the frontend
    refuses them, naming the field, rather than the backend later."""
    r = await request(make_app(), "POST", path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    schema = make_app().openapi()["components"]["schemas"]
    model = "CompletionRequest" if path == "/v1/completions" else "ChatCompletionRequest"
    text = str(schema[model]["properties"][param])
    assert "'minLength': 1" in text or "'minItems': 1" in text
