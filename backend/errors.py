"""The backend's errors, one type per tier (docs/architecture.md, "Errors"), and the one place that builds the wire
error.

- RequestError: the request is refused: a client mistake (4xx) or a refusal such as the PoC gate or a full queue
  (503, 429). The loop goes on.
- RequestFailed: one request or job failed on our side (5xx). The loop goes on.
- A fatal engine failure is any other exception out of an engine step: the process entry sends the dead sentinel
  and exits non-zero.

Error type strings (`ErrorInfo.type`) come from the status, by the table both processes use
(common/error_types.py); the PoC API's refusals carry the reason phrase, as the fork's (vLLM's HTTPException
handler) do: `pow_error`; chat behind the PoC gate keeps the fork's body, type "service_unavailable", which clients
match on: `gate_error`.
"""

from __future__ import annotations

import traceback

from common.error_types import error_type, reason_phrase
from protocol.common import ErrorInfo

# The fork's body for chat while a mining round holds the engine (exclusive mode); clients match on it.
POC_GATE_MESSAGE = "PoC generation is active. Inference requests are temporarily unavailable."


class BackendError(Exception):
    """What an error reply says: HTTP status, message, the field at fault and the error type string."""

    default_status = 500

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None, type: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status or self.default_status
        self.type = type or error_type(self.status)

    def info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, message=self.message, param=self.param, type=self.type)


class RequestError(BackendError):
    """A client mistake or a refusal of one request; the loop continues."""

    default_status = 400


class RequestFailed(BackendError):
    """One request or job failed on our side; the loop continues."""

    default_status = 500


def pow_error(status: int, message: str, param: str | None = None) -> RequestError:
    """A PoC API refusal, status first as the fork raises it (HTTPException(status, detail)), with the type vLLM's
    HTTPException handler gives it there: the reason phrase (docs/decisions.md, "One status → error type table")."""
    return RequestError(message, param=param, status=status, type=reason_phrase(status))


def gate_error() -> RequestError:
    """Chat while a mining round holds the engine in exclusive mode: the fork's 503 and body (docs/architecture.md,
    "The network's contract"; docs/decisions.md, "Error types: one per tier; the fork's strings where clients match
    on them")."""
    return RequestError(POC_GATE_MESSAGE, status=503, type="service_unavailable")


def fatal_reason(e: BaseException) -> str:
    """What the dead sentinel says of a fatal engine failure: its message, or where it was raised when it has none
    (a bare `assert` in vLLM, such as its CPU MoE refusing a routing it lacks, says nothing otherwise)."""
    if str(e):
        return f"engine failed: {e}"
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"engine failed: {type(e).__name__}{where}"
