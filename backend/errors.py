"""Typed request errors raised inside the backend and turned into error replies at the boundary."""

from __future__ import annotations

from protocol.common import ErrorInfo

# The fork's body for chat while a mining round holds the engine (exclusive mode); clients match on it.
POC_GATE_MESSAGE = "PoC generation is active. Inference requests are temporarily unavailable."

_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 429: "RateLimitError",
          503: "ServiceUnavailableError"}


class RequestError(Exception):
    """A client mistake or a refusal for one request; the loop continues."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, type: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type or _TYPES.get(status, "InternalServerError")

    def info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, message=self.message, param=self.param, type=self.type)
