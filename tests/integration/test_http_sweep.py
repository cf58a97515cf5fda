"""Bad-input sweep: schemathesis fuzzes every operation of the frontend's /openapi.json over loopback HTTP.

The requirement: no input makes the server answer 5xx. The backend is up for the whole sweep, so a 503 is as much
a bug here as a 500. Each case also checks that the answer is what /openapi.json documents: a listed status code,
a listed content type, a body that fits the listed schema (frontend/openapi.py), and that a 4xx carries the
project's error body with `code` equal to the status (frontend/errors.py). Not checked:
negative_data_rejection: pydantic's default lax mode accepts some schema-invalid values (false for a float, 0 for
a bool), as vLLM's OpenAI server does; that is leniency, not a server error.

Real processes of this module's own (a backend with its vLLM CPU engine, a frontend): valid bodies start mining
rounds, queue PoC jobs and run chats, and the shared `stack` must stay idle for the other modules. Every callback
URL the sweep sends is pointed at a receiver on loopback, so nothing leaves the machine.

Bounded for CI on 2 cores: MAX_EXAMPLES cases per operation and generation mode, derandomized (the same requests
on every run), no shrinking (a failure is reported with its curl line as found); --max-model-len 256 keeps every
valid chat and PoC batch small. A round that a case starts is stopped before the next case, so later cases never
meet the chat gate (503 by design) or a /generate that waits for the round to end.

A valid chat or response that sets no limit decodes the context's whole room (~250 tokens, over a second on 2
cores), which made these two operations most of the sweep's time. Once one such case per operation has been
answered 200 (the default limit, decoded whole), the positive sweep sets a limit of FILLED_LIMIT tokens where a
body has none; a case that the filled limit alone makes a 400 (a prompt leaving less room) is sent again as
generated. The generated cases themselves are unchanged.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from tests.integration.pow_util import MODEL, Receiver, Server, status, stop

MAX_EXAMPLES = 100
CALL_TIMEOUT_S = 120.0
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
# The operations the sweep must reach (a schema that fails to list them would make it pass vacuously).
EXPECTED = {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "GET /health",
            "POST /api/v1/pow/init/generate", "POST /api/v1/pow/generate", "GET /api/v1/pow/generate/{request_id}",
            "GET /api/v1/pow/status", "POST /api/v1/pow/stop", "GET /api/v1/pow/versions", "POST /tokenize",
            "POST /detokenize"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# The body fields that limit generation, by operation path; any one set counts as a limit.
LIMITS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/responses": ("max_output_tokens",)}
FILLED_LIMIT = 16


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    server = Server.start(model_dir, tmp_path_factory.mktemp("http-sweep"), "--max-model-len", "256",
                          "--stop-flush-timeout-s", "0.5")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def schema(server):
    # An explicit config: no schemathesis config file found on disk changes what the sweep does.
    config = SchemathesisConfig.from_dict({"generation": {"deterministic": True, "database": "none"}})
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json", config=config)


@pytest.fixture(scope="module")
def tally() -> Counter:
    """(operation, status code) → number of requests, over the whole module."""
    return Counter()


def error_body(ctx, response, case) -> None:
    """A 4xx is the project's error body: {"error": {"message", "type", "param", "code"}} with code = status."""
    if not 400 <= response.status_code < 500:
        return
    error = response.json().get("error")
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, response.text[:300]
    assert error["code"] == response.status_code and error["message"], response.text[:300]


def aim(callback_url: str):
    """Points generated bodies at what the backend serves: the served model, callbacks on loopback.

    Without it nearly every valid body would only reach the 404/409 of an unknown model. A url that would pass
    the frontend's check is replaced (keeping its path); other values stay, so the check itself is still fuzzed."""
    def fix(case: Case) -> Case:
        body = case.body
        if not isinstance(body, dict):
            return case
        body = dict(body)
        if isinstance(body.get("model"), str):
            body["model"] = MODEL
        if isinstance(body.get("params"), dict) and isinstance(body["params"].get("model"), str):
            body["params"] = {**body["params"], "model": MODEL}
        if isinstance(body.get("url"), str):
            try:
                parts = urlsplit(body["url"])
            except ValueError:
                parts = None
            if parts is not None and parts.scheme.lower() in ("http", "https") and parts.netloc:
                body["url"] = callback_url + parts.path
        case.body = body
        return case

    return fix


def unlimited(operation, case: Case) -> bool:
    """A body of an operation in LIMITS that sets none of its limits."""
    fields = LIMITS.get(operation.path)
    return fields is not None and isinstance(case.body, dict) and all(case.body.get(f) is None for f in fields)


def fuzz(operation, mode: GenerationMode, server: Server, receiver: Receiver, tally: Counter,
         unlimited_answered: set) -> None:
    checks = [*CHECKS, error_body]

    def call(case: Case):
        """The answer to the case, with FILLED_LIMIT set where the module docstring says."""
        if (mode != GenerationMode.POSITIVE or not unlimited(operation, case)
                or operation.label not in unlimited_answered):
            response = case.call(timeout=CALL_TIMEOUT_S)
            if response.status_code == 200 and unlimited(operation, case):
                unlimited_answered.add(operation.label)
            return response
        generated = case.body
        assert isinstance(generated, dict)
        case.body = {**generated, LIMITS[operation.path][0]: FILLED_LIMIT}
        response = case.call(timeout=CALL_TIMEOUT_S)
        if response.status_code == 400 and response.json()["error"]["param"] in LIMITS[operation.path]:
            case.body = generated
            response = case.call(timeout=CALL_TIMEOUT_S)
        return response

    @SETTINGS
    @given(case=operation.as_strategy(generation_mode=mode).map(aim(receiver.url)))
    def run(case: Case) -> None:
        response = call(case)
        tally[operation.label, response.status_code] += 1
        if operation.path == "/api/v1/pow/init/generate" and response.status_code == 200:
            stop(server.pow)
        case.validate_response(response, checks=checks)

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_sweep_answers_no_5xx(schema, server, receiver, tally, mode):
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= EXPECTED
    failures = []
    unlimited_answered: set[str] = set()
    for operation in operations:
        try:
            fuzz(operation, mode, server, receiver, tally, unlimited_answered)
        except Unsatisfiable:
            continue  # nothing to make invalid: no parameters and no body
        # Failed checks (a group), a lost connection (requests' errors are OSErrors): reported once all ran.
        except (AssertionError, OSError, BaseExceptionGroup) as e:
            failures.append(f"{operation.label} ({mode.value}): {e}")
    print(f"\nsweep {mode.value}: {len(operations)} operations, cumulative requests by (operation, status): "
          + ", ".join(f"{op} {code}: {n}" for (op, code), n in sorted(tally.items())))
    assert not failures, "\n\n".join([*failures, f"backend log:\n{server.backend.tail()}",
                                        f"frontend log:\n{server.frontend.tail()}"])
    if mode == GenerationMode.POSITIVE:  # the default limit (the context's room) was swept too
        assert unlimited_answered == {op.label for op in operations if op.path in LIMITS}, unlimited_answered


def test_sweep_leaves_the_backend_serving(server, tally):
    stop(server.pow)
    assert status(server.pow)["status"] == "IDLE"
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert not [key for key in tally if key[1] >= 500]
    # Errors swallowed on the way (a failed handler, a PoC batch that raised) leave a traceback in a log.
    for proc in (server.backend, server.frontend):
        assert "Traceback" not in proc.log_path.read_text(errors="replace"), proc.tail(60)
