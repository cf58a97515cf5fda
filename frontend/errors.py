"""HTTP status mapping in one place: every error leaves as an OpenAI error body, typed by common/error_types.py."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from common.error_types import error_type, reason_phrase
from frontend.backend_client import BackendRequestError, BackendUnavailable


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type


def error_body(status: int, message: str, *, param: str | None = None, type: str | None = None) -> dict:
    return {"error": {"message": message, "type": type or error_type(status), "param": param, "code": status}}


def backend_error_body(e: BackendUnavailable | BackendRequestError) -> dict:
    """A backend failure's body, the same whether it answers the request or ends a stream already under way: the
    backend's status, message, type and param."""
    if isinstance(e, BackendUnavailable):
        return error_body(503, f"backend unavailable: {e}")
    i = e.info
    return error_body(i.status, i.message, param=i.param, type=i.type or None)


def error_response(status: int, message: str, *, param: str | None = None, type: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param=param, type=type), status_code=status, headers=headers)


def _param_of(loc: tuple) -> str | None:
    # A union adds the member that failed to the location (`function-after[...]`, `list[ContentPart]`): a type,
    # not a step of the field's path.
    parts = [str(p) for p in loc if p != "body" and "[" not in str(p)]
    return ".".join(parts) or None


def _validation_message(first: dict) -> tuple[str, str | None]:
    """The message and param of a validation error (the first of a request's)."""
    if first.get("type") == "json_invalid":
        # FastAPI puts the decoder's character offset where the field's path goes: no field is at fault.
        reason = first.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON: {reason} (at character {first['loc'][-1]})", None
    param = _param_of(tuple(first.get("loc", ())))
    return (f"{param}: {first['msg']}" if param else str(first["msg"])), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        message, param = _validation_message(first)
        return error_response(400, message, param=param)

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, param=exc.param, type=exc.type)

    @app.exception_handler(BackendUnavailable)
    @app.exception_handler(BackendRequestError)
    async def _backend(_: Request, exc: BackendUnavailable | BackendRequestError) -> JSONResponse:
        body = backend_error_body(exc)
        return JSONResponse(body, status_code=body["error"]["code"])

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own answers carry headers the client needs: a 405's Allow lists the methods the route takes.
        # Typed as vLLM's HTTPException handler types them: the reason phrase.
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers,
                              type=reason_phrase(exc.status_code))
