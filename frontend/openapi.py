"""What /openapi.json says each route answers, so that generated clients and schema checkers see the real API.

FastAPI documents a 422 with its own validation body on every route that takes input; this API answers 400 with
the OpenAI error body instead (frontend/errors.py), so the 422s are replaced. Routes list the error statuses they
can answer with `errors(...)`; streams add text/event-stream to their 200.
"""

from __future__ import annotations

import copy
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(BaseModel):
    """Every error the API answers, as OpenAI's API does."""

    error: ErrorDetail


_WHEN = {
    400: "The request is invalid; `error.param` names the field.",
    401: "Missing or wrong bearer token (only when the frontend has a token set).",
    404: "Unknown model or job.",
    409: "Conflicts with the PoC round in progress (already generating, other model parameters).",
    413: "The request body is larger than the frontend's limit.",
    429: "The PoC job queue is full.",
    503: "The backend is unreachable, not ready, or busy with a PoC round.",
}

# One server-sent event (the OpenAPI spec's generic text/event-stream schema, per event): `data` is a JSON chunk,
# an error body if the stream fails midway, or `[DONE]` last.
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "contentMediaType": "application/json"},
                             "event": {"type": "string"}, "id": {"type": "string"},
                             "retry": {"type": "integer", "minimum": 0}}}
SSE: dict[int | str, dict[str, Any]] = {200: {"description": "JSON, or server-sent events when `stream` is true.",
             "content": {"text/event-stream": {"schema": _SSE_EVENT}}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": _WHEN.get(s, HTTPStatus(s).phrase)} for s in statuses}


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_bounds(fast: Any, exact: Any, components: dict, defs: dict, seen: set[str]) -> None:
    """Puts pydantic's integer bounds back where FastAPI's OpenAPI model made floats of them (its `maximum` is a
    float: 2^63 - 1 became 9.223372036854776e18, which is 2^63, a value the server refuses). Walks FastAPI's schema
    beside pydantic's own, following each side's $refs (the two name shared models differently)."""
    if isinstance(fast, list) and isinstance(exact, list):
        for f, e in zip(fast, exact, strict=False):
            _exact_bounds(f, e, components, defs, seen)
        return
    if not (isinstance(fast, dict) and isinstance(exact, dict)):
        return
    if "$ref" in fast and "$ref" in exact:
        name = fast["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            seen.add(name)
            _exact_bounds(components.get(name), defs.get(exact["$ref"].rsplit("/", 1)[-1]), components, defs, seen)
        return
    for key in _BOUNDS:
        value = exact.get(key)
        if key in fast and isinstance(value, int) and not isinstance(value, bool):
            fast[key] = value
    for key, value in fast.items():
        if key in exact:
            _exact_bounds(value, exact[key], components, defs, seen)


def _small_integer_bounds(node: Any) -> None:
    """The rest (bounds outside the body models, such as an SSE event's `retry`): below 2^53 a float made of an
    integer is exact, so it is turned back."""
    if isinstance(node, list):
        for item in node:
            _small_integer_bounds(item)
    elif isinstance(node, dict):
        if node.get("type") == "integer":
            for key in _BOUNDS:
                value = node.get(key)
                if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
                    node[key] = int(value)
        for value in node.values():
            _small_integer_bounds(value)


def _restore_integer_bounds(app: FastAPI, schema: dict) -> None:
    _small_integer_bounds(schema)
    components = schema.get("components", {}).get("schemas", {})
    for route in app.routes:
        body = getattr(route, "body_field", None)
        model = body.field_info.annotation if body is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        exact = model.model_json_schema(ref_template="#/$defs/{model}")
        name = model.__name__
        refs = [op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
                for op in schema["paths"].get(route.path, {}).values()]  # type: ignore[attr-defined]
        for ref in refs:
            if "$ref" in ref:
                name = ref["$ref"].rsplit("/", 1)[-1]
                _exact_bounds(components.get(name), exact, components, exact.get("$defs", {}), {name})


def _with_vocabulary(app: FastAPI, schema: dict) -> dict:
    """The schema with /detokenize's ids bounded by the served model's vocabulary (the backend answers a 400 naming
    `tokens.<i>` beyond it): known once the backend has sent its fingerprint, so added per request, on a copy."""
    client = getattr(app.state, "client", None)
    fingerprint = getattr(client, "fingerprint", None)
    vocab_size = getattr(fingerprint, "vocab_size", 0)
    components = schema.get("components", {}).get("schemas", {})
    if not vocab_size or "DetokenizeRequest" not in components:
        return schema
    detokenize = copy.deepcopy(components["DetokenizeRequest"])
    detokenize["properties"]["tokens"]["items"]["maximum"] = vocab_size - 1
    return {**schema, "components": {**schema["components"],
                                     "schemas": {**components, "DetokenizeRequest": detokenize}}}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _restore_integer_bounds(app, schema)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return _with_vocabulary(app, app.openapi_schema)

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to adjust the schema
