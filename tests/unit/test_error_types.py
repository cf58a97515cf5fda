"""The one status -> error type table (common/error_types.py), and the backend and the frontend both typing their
errors by it."""

from __future__ import annotations

import openai
import pytest

from backend.errors import BackendError, RequestError, RequestFailed, gate_error, pow_error
from common.error_types import ERROR_TYPES, error_type
from frontend.errors import error_body

# What vLLM's own server answers (create_error_response in vllm/entrypoints/serve/exception_handling/).
VLLM_NAMES = {400: "BadRequestError", 404: "NotFoundError", 422: "UnprocessableEntityError",
              500: "InternalServerError", 501: "NotImplementedError"}
# Statuses vLLM never types itself, named as the OpenAI SDK names their exceptions.
SDK_NAMES = {401: "AuthenticationError", 403: "PermissionDeniedError", 409: "ConflictError", 429: "RateLimitError"}
# Off the table: vLLM's catch-alls for a client's mistake and for the rest.
UNLISTED = {418: "BadRequestError", 451: "BadRequestError", 507: "InternalServerError", 599: "InternalServerError"}


def test_error_types_vllm_names_where_vllm_answers_the_status():
    assert {s: ERROR_TYPES[s] for s in VLLM_NAMES} == VLLM_NAMES


@pytest.mark.parametrize("status,name", sorted(SDK_NAMES.items()))
def test_error_types_openai_sdk_names_elsewhere(status, name):
    assert ERROR_TYPES[status] == name
    assert issubclass(getattr(openai, name), openai.APIStatusError)  # the class a client catches for it


def test_error_types_one_word_ending_in_error():
    for status, name in ERROR_TYPES.items():
        assert name.isalpha() and name[0].isupper() and name.endswith("Error"), (status, name)
    # The names the three old tables gave 413 ("RequestTooLargeError", "RequestEntityTooLarge", a phrase-derived
    # one) and 405 agree now.
    assert ERROR_TYPES[413] == "RequestEntityTooLargeError" and ERROR_TYPES[405] == "MethodNotAllowedError"


@pytest.mark.parametrize("status,name", sorted(UNLISTED.items()))
def test_error_types_unlisted_status_gets_the_catch_all(status, name):
    assert status not in ERROR_TYPES
    assert error_type(status) == name


@pytest.mark.parametrize("status", sorted([*ERROR_TYPES, *UNLISTED]))
def test_error_types_backend_and_frontend_agree(status):
    expected = error_type(status)
    assert BackendError("m", status=status).type == expected
    assert error_body(status, "m")["error"]["type"] == expected


def test_error_types_backend_tiers_and_the_poc_api_use_the_table():
    assert RequestError("bad").info().type == "BadRequestError"
    assert RequestFailed("broke").info().type == "InternalServerError"
    # The PoC API's refusals carry the reason phrase, as the fork's HTTPException answers do.
    assert pow_error(409, "Already generating").info().type == "Conflict"
    assert pow_error(429, "Queue full").info().type == "Too Many Requests"
    assert pow_error(404, "Request x not found").info().type == "Not Found"
    info = pow_error(400, "bad nonces", param="nonces").info()
    assert (info.status, info.type, info.param) == (400, "Bad Request", "nonces")


def test_error_types_an_explicit_type_still_wins():
    # Chat behind the PoC gate: the fork's body, which clients match on.
    assert gate_error().info().type == "service_unavailable"
    assert error_body(404, "no such response", type="invalid_request_error")["error"]["type"] == "invalid_request_error"


def test_reason_phrases_are_python_3_12s_written_out():
    """What vLLM's HTTPException handler (and so the fork's PoC routes) writes, on the fork's Python; written out so
    that a newer Python's wording changes no wire string."""
    from http import HTTPStatus

    from common.error_types import REASON_PHRASES, reason_phrase

    for status, phrase in REASON_PHRASES.items():
        assert phrase == HTTPStatus(status).phrase or (status, phrase) == (413, "Request Entity Too Large")
    assert (reason_phrase(418), reason_phrase(502)) == ("Bad Request", "Internal Server Error")
