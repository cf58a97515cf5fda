"""The backend's errors, one type per tier (ARCHITECTURE §7), and the one place that builds the wire error.

- RequestError: the request is refused: a client mistake (4xx) or a refusal such as the PoC gate or a full queue
  (503, 429). The loop goes on.
- RequestFailed: one request or job failed on our side (5xx). The loop goes on.
- A fatal engine failure is any other exception out of an engine step: the process entry sends the dead sentinel
  and exits non-zero.

Error type strings (`ErrorInfo.type`), kept for the clients that match on them:
- the PoC API (/api/v1/pow/*) answers with the HTTP reason phrase ("Conflict", "Too Many Requests", ...), which
  is what the fork's FastAPI HTTPException handler writes (spec §2.3): `pow_error`;
- chat behind the PoC gate answers the fork's body, type "service_unavailable" (spec §7): `gate_error`;
- everything else has OpenAI's error type names ("BadRequestError", ...).
"""

from __future__ import annotations

from http import HTTPStatus

from protocol.common import ErrorInfo

# The fork's body for chat while a mining round holds the engine (exclusive mode); clients match on it.
POC_GATE_MESSAGE = "PoC generation is active. Inference requests are temporarily unavailable."

_OPENAI_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 409: "ConflictError",
                 413: "RequestTooLargeError", 429: "RateLimitError", 500: "InternalServerError",
                 503: "ServiceUnavailableError"}


class BackendError(Exception):
    """What an error reply says: HTTP status, message, the field at fault and the error type string."""

    default_status = 500

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None, type: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status or self.default_status
        self.type = type or _OPENAI_TYPES.get(self.status, "InternalServerError")

    def info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, message=self.message, param=self.param, type=self.type)


class RequestError(BackendError):
    """A client mistake or a refusal of one request; the loop continues."""

    default_status = 400


class RequestFailed(BackendError):
    """One request or job failed on our side; the loop continues."""

    default_status = 500


def pow_error(status: int, message: str, param: str | None = None) -> RequestError:
    """A PoC API refusal, typed with the HTTP reason phrase as the fork answers (spec §2.3)."""
    return RequestError(message, param=param, status=status, type=HTTPStatus(status).phrase)


def gate_error() -> RequestError:
    """Chat while a mining round holds the engine in exclusive mode (spec §7)."""
    return RequestError(POC_GATE_MESSAGE, status=503, type="service_unavailable")
