"""Unit tests for the PoC routes (/api/v1/pow/*): the real FastAPI app over ASGI, a fake backend client.

The fake records every wire message and answers with canned replies, so each test checks both directions:
HTTP body → msgspec request (fields and defaults) and backend reply → HTTP body (the fork's exact shapes,
docs/architecture.md, "The network's contract").
No ZMQ, no engine: the app's lifespan is not run; app.state gets the fake instead of a BackendClient.
"""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from frontend.app import create_app
from frontend.backend_client import BackendUnavailable
from frontend.convert import TokenFormat
from frontend.metrics import FrontendMetrics
from frontend.routes.pow import CONTROL_TIMEOUT_S
from frontend.settings import load_settings
from protocol.common import ErrorInfo, Fingerprint
from protocol.poc import Artifact, Encoding
from protocol.pow import (
    JobView,
    NodeIdentity,
    PowGenerateRequest,
    PowInitRequest,
    PowJobReply,
    PowJobRequest,
    PowParams,
    PowStatusReply,
    PowStatusRequest,
    PowStopRequest,
    RoundConfig,
    RoundStats,
    StatTestSpec,
    ValidationOutcome,
)

BASE = "/api/v1/pow"
FP = Fingerprint(protocol_version=1, served_model_name="tiny", model_path="/models/tiny", max_model_len=2048,
                 block_size=16, dtype="bfloat16", vllm_version="0.26.0", engine_device="cuda",
                 poc_code_version="abc123", scheduling_mode="exclusive")
NODE = {"block_hash": "0xabc", "block_height": 1234, "public_key": "02deadbeef", "node_id": 1, "node_count": 3}
PARAMS = {"model": "tiny", "seq_len": 256}
ART = [Artifact(nonce=5, vector_b64="AAA="), Artifact(nonce=9, vector_b64="AQE=")]
ART_JSON = [{"nonce": 5, "vector_b64": "AAA="}, {"nonce": 9, "vector_b64": "AQE="}]
OUTCOME = ValidationOutcome(n_total=2, n_mismatch=1, mismatch_nonces=[9], p_value=0.002, fraud_detected=True)
OUTCOME_JSON = {"n_total": 2, "n_mismatch": 1, "mismatch_nonces": [9], "p_value": 0.002, "fraud_detected": True,
                "n_excluded": 0, "excluded_nonces": []}


class FakeClient:
    """What the routes use of BackendClient: fingerprint, is_alive, stats, new_rid(), call()."""

    def __init__(self) -> None:
        self.fingerprint: Fingerprint | None = FP
        self.is_alive = True
        self.stats = None
        self.incompatible = None
        self.calls: list[tuple[object, float | None]] = []
        # request type → reply, an exception to raise, or "hang" (never answers)
        self.replies: dict[type, object] = {}
        self._rids = itertools.count(1)

    def new_rid(self) -> str:
        return f"rid-{next(self._rids)}"

    async def call(self, req, timeout_s: float | None = None):
        self.calls.append((req, timeout_s))
        answer = self.replies[type(req)]
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        answer.rid = req.rid
        return answer

    @property
    def sent(self) -> list:
        return [req for req, _ in self.calls]


def make_app(environ: dict[str, str] | None = None):
    settings = load_settings([], environ or {})
    app = create_app(settings)
    fake = FakeClient()
    app.state.client = fake
    app.state.metrics = FrontendMetrics(fake)
    app.state.token_format = TokenFormat(as_ids=True)
    return app, fake


@pytest.fixture
async def api():
    app, fake = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http, fake


def _status_reply(status: str = "IDLE", **kw) -> PowStatusReply:
    return PowStatusReply(rid="", status=status, **kw)


def _job_reply(**kw) -> PowJobReply:
    return PowJobReply(rid="", job=JobView(**kw))


def _error_reply(cls, status: int, message: str, type: str = "", param: str | None = None):
    return cls(rid="", error=ErrorInfo(status=status, message=message, type=type, param=param))


def _assert_error(r: httpx.Response, status: int, *, param: str | None = None, contains: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["type"]
    assert contains in err["message"]
    if param is not None:
        assert err["param"] == param
    return err


# --- POST /init/generate --------------------------------------------------------------------------------------

async def test_pow_init_defaults_map_to_the_wire_and_answer_generating(api):
    http, fake = api
    fake.replies[PowInitRequest] = _status_reply("GENERATING")
    r = await http.post(f"{BASE}/init/generate", json={**NODE, "params": PARAMS})
    assert r.status_code == 200
    assert r.json() == {"status": "OK", "pow_status": {"status": "GENERATING"}}
    (req, timeout_s), = fake.calls
    assert timeout_s == CONTROL_TIMEOUT_S
    assert req == PowInitRequest(
        rid=req.rid, node=NodeIdentity(**NODE), params=PowParams(model="tiny", seq_len=256, k_dim=12),
        group_id=0, n_groups=1, batch_size=None, url=None, stronger_rng=False)


async def test_pow_init_every_field_maps_to_the_wire(api):
    http, fake = api
    fake.replies[PowInitRequest] = _status_reply("GENERATING")
    body = {**NODE, "params": {**PARAMS, "k_dim": 8}, "group_id": 1, "n_groups": 2, "batch_size": 7,
            "url": "http://dapi:9100/v2/poc-batches/org%252Fmodel", "poc_stronger_rng": True,
            "future_top_level_key": {"x": 1}}  # ignored, as in the fork
    assert (await http.post(f"{BASE}/init/generate", json=body)).status_code == 200
    req = fake.sent[0]
    assert req.params == PowParams(model="tiny", seq_len=256, k_dim=8)
    assert (req.group_id, req.n_groups, req.batch_size, req.stronger_rng) == (1, 2, 7, True)
    assert req.url == "http://dapi:9100/v2/poc-batches/org%252Fmodel"


@pytest.mark.parametrize("route,change,param,message", [
    ("init/generate", {"params": {**PARAMS, "poc_stronger_rng": True}}, "params.poc_stronger_rng",
     "params.poc_stronger_rng: Extra inputs are not permitted"),
    ("generate", {"params": {**PARAMS, "poc_stronger_rng": True}}, "params.poc_stronger_rng", "Extra inputs"),
    ("init/generate", {"params": {"model": "tiny", "seq_len": 0}}, "params.seq_len", "greater than or equal to 1"),
    ("generate", {"nonces": []}, "nonces", "at least 1 item"),
    ("generate", {"url": "file:///etc/passwd"}, "url", "http:// or https://"),
    ("generate", {"stat_test": {"fraud_threshold": 0.01, "p_value_threshold": 0.05}}, "stat_test",
     "fraud_threshold (0.01) and p_value_threshold (0.05)"),
], ids=["init-params-extra", "generate-params-extra", "seq_len", "empty-nonces", "url",
        "threshold-conflict"])
async def test_pow_invalid_body_is_400_naming_the_field(api, route, change, param, message):
    # The full table of rejected bodies is in test_frontend_pow_models.py; this checks the HTTP mapping.
    http, fake = api
    r = await http.post(f"{BASE}/{route}", json={**NODE, "params": PARAMS, "nonces": [5], **change})
    assert _assert_error(r, 400, contains=message)["param"] == param
    assert fake.calls == []


# --- POST /generate -------------------------------------------------------------------------------------------

async def test_pow_generate_queued_defaults_and_shape(api):
    http, fake = api
    fake.replies[PowGenerateRequest] = _job_reply(job_id="job-1", status="queued", num_queued=3)
    r = await http.post(f"{BASE}/generate", json={**NODE, "params": PARAMS, "nonces": [4, 1, 4]})
    assert r.status_code == 200
    assert r.json() == {"status": "queued", "request_id": "job-1", "queued_count": 3}
    (req, timeout_s), = fake.calls
    assert timeout_s == CONTROL_TIMEOUT_S
    assert req == PowGenerateRequest(
        rid=req.rid, node=NodeIdentity(**NODE), params=PowParams(model="tiny", seq_len=256, k_dim=12),
        nonces=[4, 1, 4], batch_size=None, wait=False, url=None, validation=None, stat_test=None,
        stronger_rng=False)


async def test_pow_generate_every_field_maps_to_the_wire(api):
    http, fake = api
    fake.replies[PowGenerateRequest] = _job_reply(job_id="job-2", status="queued", num_queued=2)
    body = {**NODE, "params": {**PARAMS, "k_dim": 6}, "nonces": [5, 9], "batch_size": 2, "url": "https://x/y",
            "validation": {"artifacts": ART_JSON}, "poc_stronger_rng": True,
            # p_value_threshold is what the network client sends; it means fraud_threshold.
            "stat_test": {"dist_threshold": 0.4, "p_mismatch": 0.1, "p_value_threshold": 0.05},
            "unknown_top_level": 1}
    assert (await http.post(f"{BASE}/generate", json=body)).status_code == 200
    req = fake.sent[0]
    assert req.params.k_dim == 6 and req.batch_size == 2 and req.url == "https://x/y" and req.stronger_rng
    assert req.validation == ART
    assert req.stat_test == StatTestSpec(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.05)


async def test_pow_generate_validation_nonce_mismatch_is_decided_by_the_backend(api):
    http, fake = api
    fake.replies[PowGenerateRequest] = _error_reply(
        PowJobReply, 400, "validation.artifacts nonces must match nonces field", param="validation.artifacts")
    body = {**NODE, "params": PARAMS, "nonces": [5, 6], "validation": {"artifacts": ART_JSON}}
    r = await http.post(f"{BASE}/generate", json=body)
    err = _assert_error(r, 400, param="validation.artifacts")
    assert err["message"] == "validation.artifacts nonces must match nonces field"
    assert fake.sent[0].nonces == [5, 6] and [a.nonce for a in fake.sent[0].validation] == [5, 9]


@pytest.mark.parametrize("job,validation,expected", [
    (JobView(job_id="f1", status="completed", encoding=Encoding(k_dim=6), artifacts=ART), None,
     {"status": "completed", "request_id": "f1", "artifacts": ART_JSON,
      "encoding": {"dtype": "f16", "k_dim": 6, "endian": "le"}}),
    (JobView(job_id="f2", status="completed", encoding=Encoding(k_dim=6), artifacts=[]), None,
     {"status": "completed", "request_id": "f2", "artifacts": [],
      "encoding": {"dtype": "f16", "k_dim": 6, "endian": "le"}}),
    (JobView(job_id="f3", status="completed", validation=OUTCOME), {"artifacts": ART_JSON},
     {"status": "completed", "request_id": "f3", **OUTCOME_JSON}),
], ids=["compute", "compute-no-artifacts", "validation"])
async def test_pow_generate_wait_shapes(api, job, validation, expected):
    http, fake = api
    fake.replies[PowGenerateRequest] = PowJobReply(rid="", job=job)
    body = {**NODE, "params": {**PARAMS, "k_dim": 6}, "nonces": [5, 9], "wait": True, "validation": validation}
    r = await http.post(f"{BASE}/generate", json=body)
    assert r.status_code == 200 and r.json() == expected
    (req, timeout_s), = fake.calls
    assert req.wait is True and timeout_s is None  # bounded by the route's own wait timeout instead


async def test_pow_generate_wait_timeout_is_503(api):
    app, fake = make_app({"POCSERVE_POW_WAIT_TIMEOUT_S": "0.05"})
    fake.replies[PowGenerateRequest] = "hang"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        r = await http.post(f"{BASE}/generate", json={**NODE, "params": PARAMS, "nonces": [5], "wait": True})
    err = _assert_error(r, 503)
    assert err["message"] == "Timeout after 0.05s"


BACKEND_ERRORS = [  # (route, reply type, status, type, message): the backend's ErrorInfo is passed through
    ("init/generate", PowStatusReply, 409, "Conflict", "params mismatch: requested model 'x', deployed ['tiny']"),
    ("init/generate", PowStatusReply, 409, "Conflict", "Already generating"),
    ("init/generate", PowStatusReply, 400, "", "seq_len too large"),
    ("generate", PowJobReply, 409, "Conflict", "params mismatch: requested model 'x'"),
    ("generate", PowJobReply, 429, "Too Many Requests", "Queue full: 99999 nonces queued, limit is 100000"),
    ("generate", PowJobReply, 503, "ServiceUnavailableError", "could not compute 1 of 2 nonces"),
    ("generate", PowJobReply, 400, "", "k_dim 99 exceeds the hidden size"),
    ("generate/nope", PowJobReply, 404, "Not Found", "Request nope not found"),
]
REQUEST_TYPES = {"init/generate": PowInitRequest, "generate": PowGenerateRequest, "generate/nope": PowJobRequest}


@pytest.mark.parametrize("route,reply_type,status,type_,message", BACKEND_ERRORS,
                         ids=[f"{row[0]}-{row[2]}-{row[4][:20]}" for row in BACKEND_ERRORS])
async def test_pow_backend_error_keeps_its_status_and_json_body(api, route, reply_type, status, type_, message):
    http, fake = api
    fake.replies[REQUEST_TYPES[route]] = _error_reply(reply_type, status, message, type_)
    body = {**NODE, "params": PARAMS, "nonces": [5]}
    r = await (http.get(f"{BASE}/{route}") if route == "generate/nope" else http.post(f"{BASE}/{route}", json=body))
    err = _assert_error(r, status)
    assert err["message"] == message and err["type"] == (type_ or err["type"])


async def test_pow_generate_backend_unavailable_is_503(api):
    http, fake = api
    fake.replies[PowGenerateRequest] = BackendUnavailable("backend not connected")
    r = await http.post(f"{BASE}/generate", json={**NODE, "params": PARAMS, "nonces": [5]})
    _assert_error(r, 503, contains="backend not connected")


# --- GET /generate/{id} ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("job,expected", [
    (JobView(job_id="j1", status="queued", num_queued=4), {"status": "queued", "request_id": "j1"}),
    (JobView(job_id="j1", status="running"), {"status": "running", "request_id": "j1"}),
    (JobView(job_id="j1", status="completed", encoding=Encoding(k_dim=6), artifacts=ART),
     {"status": "completed", "request_id": "j1", "artifacts": ART_JSON,
      "encoding": {"dtype": "f16", "k_dim": 6, "endian": "le"}}),
    (JobView(job_id="j1", status="completed", validation=OUTCOME),
     {"status": "completed", "request_id": "j1", **OUTCOME_JSON}),
    (JobView(job_id="j1", status="failed", error="Timeout waiting for engine: chunk 0"),
     {"status": "failed", "request_id": "j1", "error": "Timeout waiting for engine: chunk 0"}),
], ids=["queued", "running", "completed-compute", "completed-validation", "failed"])
async def test_pow_job_poll_shapes(api, job, expected):
    http, fake = api
    fake.replies[PowJobRequest] = PowJobReply(rid="", job=job)
    r = await http.get(f"{BASE}/generate/j1")
    assert r.status_code == 200
    assert r.json() == expected
    (req, timeout_s), = fake.calls
    assert req == PowJobRequest(rid=req.rid, job_id="j1") and timeout_s == CONTROL_TIMEOUT_S


# --- GET /status, POST /stop ----------------------------------------------------------------------------------

CONFIG = RoundConfig(node=NodeIdentity(**NODE), group_id=0, n_groups=1, seq_len=256, k_dim=12)


@pytest.mark.parametrize("reply,expected", [
    (_status_reply("IDLE"), {"status": "IDLE", "config": None, "stats": None}),
    (_status_reply("GENERATING", config=CONFIG, stats=RoundStats(total_processed=640, nonces_per_second=12.5)),
     {"status": "GENERATING", "config": {**NODE, "group_id": 0, "n_groups": 1, "seq_len": 256, "k_dim": 12},
      "stats": {"total_processed": 640, "nonces_per_second": 12.5}}),
], ids=["idle", "generating"])
async def test_pow_status_shapes(api, reply, expected):
    http, fake = api
    fake.replies[PowStatusRequest] = reply
    r = await http.get(f"{BASE}/status")
    assert r.status_code == 200 and r.json() == expected
    assert isinstance(fake.sent[0], PowStatusRequest)


async def test_pow_stop(api):
    http, fake = api
    fake.replies[PowStopRequest] = _status_reply("STOPPED")
    r = await http.post(f"{BASE}/stop")
    assert r.status_code == 200
    assert r.json() == {"status": "OK", "pow_status": {"status": "STOPPED"}}
    (req, timeout_s), = fake.calls
    assert isinstance(req, PowStopRequest) and timeout_s == CONTROL_TIMEOUT_S


# --- GET /versions --------------------------------------------------------------------------------------------

def _fingerprint(**changes) -> Fingerprint:
    return Fingerprint(**{**{f: getattr(FP, f) for f in FP.__struct_fields__}, **changes})


@pytest.mark.parametrize("fp,mode", [(FP, "exclusive"), (_fingerprint(scheduling_mode="shared"), "shared")])
async def test_pow_versions_from_the_fingerprint(api, fp, mode):
    http, fake = api
    fake.fingerprint = fp
    r = await http.get(f"{BASE}/versions")
    assert r.status_code == 200
    assert r.json() == {
        "vllm_version": "0.26.0", "poc_validation_inference": True, "scheduling_mode": mode, "protocol_version": 1}
    assert fake.calls == []


async def test_pow_versions_before_handshake_is_503(api):
    http, fake = api
    fake.fingerprint = None
    _assert_error(await http.get(f"{BASE}/versions"), 503)


# --- bearer token ---------------------------------------------------------------------------------------------

ROUTES = [
    ("POST", "init/generate", {**NODE, "params": PARAMS}),
    ("POST", "generate", {**NODE, "params": PARAMS, "nonces": [1]}),
    ("GET", "generate/j1", None),
    ("GET", "status", None),
    ("POST", "stop", None),
    ("GET", "versions", None),
]


@pytest.fixture
async def guarded():
    app, fake = make_app({"POCSERVE_POW_API_TOKEN": "s3cret-token"})
    fake.replies.update({
        PowInitRequest: _status_reply("GENERATING"), PowStatusRequest: _status_reply("IDLE"),
        PowStopRequest: _status_reply("STOPPED"),
        PowGenerateRequest: _job_reply(job_id="j1", status="queued", num_queued=1),
        PowJobRequest: _job_reply(job_id="j1", status="running"),
    })
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http, fake


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer s3cret-tokenX", "Basic s3cret-token",
                                  "s3cret-token", "Bearer "],
                         ids=["missing", "wrong", "longer", "basic", "no-scheme", "empty"])
async def test_pow_token_missing_or_wrong_is_401(guarded, method, path, body, auth):
    http, fake = guarded
    headers = {"Authorization": auth} if auth is not None else {}
    r = await http.request(method, f"{BASE}/{path}", json=body, headers=headers)
    _assert_error(r, 401)
    assert r.headers["www-authenticate"] == "Bearer"
    assert fake.calls == []


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_pow_token_right_is_200(guarded, method, path, body):
    http, _fake = guarded
    r = await http.request(method, f"{BASE}/{path}", json=body,
                           headers={"Authorization": "Bearer s3cret-token"})
    assert r.status_code == 200, r.text


async def test_pow_token_checked_before_the_body(guarded):
    http, _fake = guarded
    r = await http.post(f"{BASE}/init/generate", json={"params": {"bogus": 1}})
    _assert_error(r, 401)


async def test_pow_token_does_not_guard_other_routes(guarded):
    http, _ = guarded
    assert (await http.get("/health")).status_code == 200


async def test_api_key_guards_the_v1_routes_only():
    """vLLM's --api-key (POCSERVE_API_KEY): every /v1 route, not /health nor the PoC routes."""
    app, fake = make_app({"POCSERVE_API_KEY": "k3y"})
    fake.replies[PowStatusRequest] = _status_reply("IDLE")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        for r in (await http.get("/v1/models"), await http.post("/v1/chat/completions", json=body),
                  await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})):
            assert _assert_error(r, 401)["message"] == "missing or invalid bearer token for /v1"
        assert fake.calls == []
        assert (await http.get("/v1/models", headers={"Authorization": "Bearer k3y"})).status_code == 200
        assert (await http.get("/health")).status_code == 200
        assert (await http.get(f"{BASE}/status")).status_code == 200



async def test_frontend_body_over_the_limit_is_413():
    app, _fake = make_app({"POCSERVE_MAX_BODY_BYTES": "2048"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = await client.post("/v1/chat/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == 413

        async def chunks():  # no Content-Length: the limit applies while the body streams in
            for _ in range(5):
                yield b"x" * 1000
        r = await client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
