"""The frontend's /openapi.json documents what the routes answer: 400 (never FastAPI's 422) with the error body,
the error statuses each route can give, server-sent events on the streaming routes. The HTTP sweep
(tests/integration/test_http_sweep.py) checks real answers against this document."""

from __future__ import annotations

import pytest

from frontend.app import create_app
from frontend.errors import error_body
from frontend.settings import load_settings

ERROR_REF = "#/components/schemas/ErrorBody"


@pytest.fixture(scope="module")
def schema() -> dict:
    return create_app(load_settings([], {})).openapi()


def _operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            yield f"{method.upper()} {path}", op


def test_openapi_has_no_422_and_no_fastapi_validation_schemas(schema):
    assert not [label for label, op in _operations(schema) if "422" in op["responses"]]
    assert not {"HTTPValidationError", "ValidationError"} & set(schema["components"]["schemas"])


def test_openapi_every_body_route_documents_400_and_413_with_the_error_body(schema):
    with_body = [(label, op) for label, op in _operations(schema) if "requestBody" in op]
    assert len(with_body) == 7, [label for label, _ in with_body]
    for label, op in with_body:
        for status in ("400", "413"):
            media = op["responses"][status]["content"]["application/json"]
            assert media["schema"] == {"$ref": ERROR_REF}, (label, status)


def test_openapi_error_body_schema_matches_what_the_api_sends(schema):
    body = error_body(404, "no such model", param="model")
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(body) == set(schema["components"]["schemas"]["ErrorBody"]["properties"]) == {"error"}
    assert set(body["error"]) == set(detail["properties"]) == set(detail["required"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_openapi_streaming_routes_document_sse(schema, path):
    content = schema["paths"][path]["post"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}


def test_openapi_pow_routes_document_401_and_503(schema):
    pow_ops = [(label, op) for label, op in _operations(schema) if " /api/v1/pow/" in label]
    assert len(pow_ops) == 6
    for label, op in pow_ops:
        assert {"401", "503"} <= set(op["responses"]), label


def test_openapi_health_and_metrics_are_not_json(schema):
    health = schema["paths"]["/health"]["get"]["responses"]
    assert not health["200"].get("content") and "application/json" in health["503"]["content"]
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}


def _integer_nodes(node, path=""):
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _integer_nodes(item, f"{path}/{i}")
    elif isinstance(node, dict):
        if node.get("type") == "integer":
            yield path, node
        for key, value in node.items():
            yield from _integer_nodes(value, f"{path}/{key}")


def test_integer_bounds_are_exact_integers(schema):
    """FastAPI's OpenAPI model makes floats of bounds: 2^63 - 1 became 9.223372036854776e18, which is 2^63, a value
    the server refuses (schemathesis sent it as valid). Every integer's bounds are integers, exact."""
    bounds = {(path, key): node[key] for path, node in _integer_nodes(schema)
              for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if key in node}
    assert bounds and all(type(v) is int for v in bounds.values()), {k: v for k, v in bounds.items()
                                                                     if type(v) is not int}
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "integer", "maximum": 2**63 - 1, "minimum": -1} in chat["top_k"]["anyOf"]
    assert chat["seed"]["anyOf"][0]["exclusiveMaximum"] == 2**63
