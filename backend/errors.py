"""Typed request errors raised inside the backend and turned into error replies at the boundary."""

from __future__ import annotations

from protocol.common import ErrorInfo

_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 429: "RateLimitError",
          503: "ServiceUnavailableError"}


class RequestError(Exception):
    """A client mistake or a refusal for one request; the loop continues."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, message=self.message, param=self.param,
                         type=_TYPES.get(self.status, "InternalServerError"))
