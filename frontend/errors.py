"""HTTP status mapping in one place: every error leaves as an OpenAI error body."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from frontend.backend_client import BackendRequestError, BackendUnavailable


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type
        # Extra response headers, e.g. WWW-Authenticate on a 401.
        self.headers = headers


def error_body(status: int, message: str, *, param: str | None = None, type: str | None = None) -> dict:
    if not type:
        type = HTTPStatus(status).phrase.replace(" ", "") + "Error" if status in HTTPStatus._value2member_map_ \
            else "Error"
    return {"error": {"message": message, "type": type, "param": param, "code": status}}


def error_response(status: int, message: str, *, param: str | None = None, type: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param=param, type=type), status_code=status, headers=headers)


def _param_of(loc: tuple) -> str | None:
    # A union adds the member that failed to the location (`function-after[...]`, `list[ContentPart]`): a type,
    # not a step of the field's path.
    parts = [str(p) for p in loc if p != "body" and "[" not in str(p)]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = _param_of(tuple(first.get("loc", ())))
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        return error_response(400, message, param=param)

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, param=exc.param, type=exc.type, headers=exc.headers)

    @app.exception_handler(BackendUnavailable)
    async def _unavailable(_: Request, exc: BackendUnavailable) -> JSONResponse:
        return error_response(503, f"backend unavailable: {exc}", type="ServiceUnavailableError")

    @app.exception_handler(BackendRequestError)
    async def _backend(_: Request, exc: BackendRequestError) -> JSONResponse:
        i = exc.info
        return error_response(i.status, i.message, param=i.param, type=i.type or None)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))
