"""The error `type` string of every error body, by HTTP status: one table for the backend and the frontend.

The names are vLLM's where vLLM's OpenAI server answers the status itself (create_error_response in
vllm/entrypoints/serve/exception_handling/error_response.py: 400 BadRequestError, 404 NotFoundError, 422
UnprocessableEntityError, 500 InternalServerError, 501 NotImplementedError), the OpenAI SDK's exception class
names where vLLM has none (401 AuthenticationError, 403 PermissionDeniedError, 409 ConflictError, 429
RateLimitError), and otherwise the reason phrase in one word with "Error", as the SDK forms its names. They are
written out, not derived from `http.HTTPStatus`, whose phrases follow the RFCs (Python 3.13 names 413 "Content
Too Large"): a Python upgrade must not change what clients match on.

Two answers carry a type of their own, by contract rather than by status, and pass it explicitly: chat behind
the PoC gate ("service_unavailable", the fork's body: backend/errors.py `gate_error`) and the Responses API's
unknown response id ("invalid_request_error", as vLLM's Responses serving answers it). And answers that vLLM's
HTTPException handler would write carry the reason phrase instead (`reason_phrase`): the PoC API's refusals (the
fork raises them as HTTPException, so the network sees "Conflict", "Too Many Requests") and Starlette's own 404 and
405 (vllm/entrypoints/serve/exception_handling/handlers/http.py).
"""

from __future__ import annotations

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    499: "ClientClosedRequestError",  # nginx's status for a client that left; only the frontend's metrics see it
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """The type for `status`; a status not in the table gets vLLM's catch-alls: BadRequestError for anything the
    client caused (4xx), InternalServerError for the rest."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "BadRequestError" if 400 <= status < 500 else "InternalServerError"


# As Python 3.12 (the fork's) words them; written out so that a newer Python's wording (3.13: 413 "Content Too
# Large") changes no wire string.
REASON_PHRASES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Request Entity Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def reason_phrase(status: int) -> str:
    """The type vLLM's HTTPException handler gives `status` (HTTPStatus(status).phrase)."""
    return REASON_PHRASES.get(status, "Bad Request" if 400 <= status < 500 else "Internal Server Error")
