"""What /openapi.json says each route answers, so that generated clients and schema checkers see the real API.

FastAPI documents a 422 with its own validation body on every route that takes input; this API answers 400 with
the OpenAI error body instead (frontend/errors.py), so the 422s are replaced. Routes list the error statuses they
can answer with `errors(...)`; streams add text/event-stream to their 200.
"""

from __future__ import annotations

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


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to adjust the schema
