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
unknown response id ("invalid_request_error", as vLLM's Responses serving answers it).
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
