"""The Gonka PoC API (/api/v1/pow/*) end to end on the shared stack (exclusive mode): artifacts, errors, gating.

The contract (docs/architecture.md, "The network's contract"): routes, shapes and check order; chat gated with
503 and aborted in flight; and our versions of the fork's live tests tests/gonka/test_live_poc.py and
tests/gonka/test_live_chat_priority.py. Every test that starts a mining round stops it in `finally`, so the
stack is left idle for the other modules. Mining here never has a callback url (nothing lands in the stack's
default state dir); callbacks are covered by test_pow_mining.py on a backend of its own.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from tests.integration.pow_util import (
    ENCODING,
    GATE_BODY,
    MODEL,
    artifacts_of,
    decode,
    generate,
    l2,
    metric,
    node,
    params,
    status,
    stop,
    validation,
    wait_until,
)
from tests.stack import LONG_MAX_TOKENS, Proc, free_port, frontend_args, wait_healthy

TOKEN = "secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 8,
        "temperature": 0.99, "seed": 42, "logprobs": True, "top_logprobs": 5}


@pytest.fixture(scope="module")
def pow_url(stack) -> str:
    url = f"{stack.base_url}/api/v1/pow"
    stop(url)  # each module starts from an idle backend, as the fork's live tests do
    return url


@pytest.fixture(scope="module")
def token_frontend(stack, tmp_path_factory) -> str:
    """A second frontend on the stack's backend that demands a bearer token on /api/v1/pow."""
    port = free_port()
    proc = Proc(frontend_args(stack.address, port, "--pow-api-token", TOKEN),
                tmp_path_factory.mktemp("token-frontend") / "frontend.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=60)
        yield url
    finally:
        proc.stop()


def init(pow_url: str, *, block_height: int = 100, headers: dict | None = None, **fields) -> httpx.Response:
    body = {**node(block_height=block_height), "batch_size": 4, "params": params(64, 12), **fields}
    return httpx.post(f"{pow_url}/init/generate", json=body, timeout=60, headers=headers)


def chat(base_url: str, **fields) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", json={**CHAT, **fields}, timeout=120)


def assert_error(r: httpx.Response, status_code: int, message: str | None = None, *, param: str | None = None,
                 type: str | None = None) -> dict:
    assert r.status_code == status_code, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status_code
    if message is not None:
        assert error["message"] == message
    if param is not None:
        assert error["param"] == param
    if type is not None:
        assert error["type"] == type
    return error


# --- artifacts through /generate wait=true (the fork's tests/gonka/test_live_poc.py) ---

def test_generate_four_finite_artifacts_with_exact_shape(pow_url):
    r = generate(pow_url, [0, 1, 2, 3], seq_len=64)
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["status", "request_id", "artifacts", "encoding"]
    assert body["status"] == "completed" and body["encoding"] == ENCODING
    uuid.UUID(body["request_id"])
    assert [a["nonce"] for a in body["artifacts"]] == [0, 1, 2, 3]  # set == requested, in request order
    for a in body["artifacts"]:
        assert list(a) == ["nonce", "vector_b64"]
        v = decode(a["vector_b64"])
        assert v.shape == (12,) and np.isfinite(v).all() and np.linalg.norm(v) > 0
    # The id of a wait=true answer is fresh and not stored (as in the fork).
    assert httpx.get(f"{pow_url}/generate/{body['request_id']}", timeout=10).status_code == 404


def test_generate_is_reproducible_and_depends_on_block_hash(pow_url):
    first = artifacts_of(pow_url, [42, 43, 44, 45], seq_len=64)
    second = artifacts_of(pow_url, [42, 43, 44, 45], seq_len=64)
    assert first == second  # identical here, well within the fork's L2 < 0.2
    a = artifacts_of(pow_url, [0, 1, 2, 3], seq_len=64, block_hash="BLOCK_A")
    b = artifacts_of(pow_url, [0, 1, 2, 3], seq_len=64, block_hash="BLOCK_B")
    assert l2(a[0], b[0]) > 0.01


def test_generate_then_validate_is_completed_without_mismatch(pow_url):
    arts = artifacts_of(pow_url, [10, 11, 12, 13], seq_len=64)
    r = generate(pow_url, [10, 11, 12, 13], seq_len=64, validation=validation(arts))
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["status", "request_id", "n_total", "n_mismatch", "mismatch_nonces", "p_value",
                          "fraud_detected", "n_excluded", "excluded_nonces"]
    assert body["status"] == "completed"
    assert (body["n_total"], body["n_mismatch"], body["mismatch_nonces"], body["p_value"],
            body["fraud_detected"]) == (4, 0, [], 1.0, False)


def test_generate_five_rounds_are_stable(pow_url):
    distances = []
    for i in range(5):
        nonces = list(range(4 * i, 4 * i + 4))
        first, second = artifacts_of(pow_url, nonces, seq_len=64), artifacts_of(pow_url, nonces, seq_len=64)
        assert sorted(first) == sorted(second) == nonces
        distances += [l2(first[n], second[n]) for n in nonces]
    assert len(distances) == 20 and np.mean(distances) < 0.1 and max(distances) < 0.3


# --- errors (the fork's status codes and bodies) ---

def test_params_model_mismatch_is_409_with_a_json_body(pow_url, stack):
    for path, body in (("init/generate", {**node(), "params": params(64, model="other")}),
                       ("generate", {**node(), "nonces": [1], "params": params(64, model="other"), "wait": True})):
        r = httpx.post(f"{pow_url}/{path}", json=body, timeout=30)
        error = assert_error(r, 409, param="params.model", type="Conflict")
        assert error["message"].startswith("params mismatch") and "'other'" in error["message"]
    # The served name and the model path are both accepted (the fork: path ∪ served names).
    model_path = str(stack.model_dir)
    assert artifacts_of(pow_url, [1], params=params(16, model=model_path)).keys() == {1}
    assert status(pow_url)["status"] == "IDLE"


@pytest.mark.parametrize(("p", "field"), [
    ({"k_dim": 0}, "params.k_dim"), ({"seq_len": 0}, "params.seq_len"), ({"k_dim": 100000}, "params.k_dim"),
    ({"poc_stronger_rng": True}, "params.poc_stronger_rng"),
])
def test_bad_params_are_400_naming_the_field(pow_url, p, field):
    for path, extra in (("init/generate", {}), ("generate", {"nonces": [1], "wait": True})):
        r = httpx.post(f"{pow_url}/{path}", json={**node(), "params": {**params(16), **p}, **extra}, timeout=30)
        assert_error(r, 400, param=field)
    assert status(pow_url)["status"] == "IDLE"  # a refused init starts nothing


def test_request_shape_errors_are_400(pow_url):
    assert_error(generate(pow_url, []), 400, param="nonces")
    for bad, param in (({"node_id": -1}, "node_id"), ({"node_count": 0}, "node_count"), ({"n_groups": 0}, "n_groups"),
                       ({"batch_size": 0}, "batch_size"), ({"url": "ftp://dapi/x"}, "url")):
        r = httpx.post(f"{pow_url}/init/generate", json={**node(), "params": params(), **bad}, timeout=30)
        assert_error(r, 400, param=param)
    assert status(pow_url)["status"] == "IDLE"
    r = httpx.post(f"{pow_url}/generate", json={**node(), "nonces": [1], "params": params(), "wait": True,
                                                "stat_test": {"p_mismatch": 2.0}}, timeout=30)
    assert_error(r, 400, param="stat_test.p_mismatch")


def test_validation_nonce_set_mismatch_is_400(pow_url):
    arts = {0: "AAAA", 1: "AAAA"}
    for wait in (True, False):
        r = generate(pow_url, [0, 1, 2], wait=wait, validation=validation(arts))
        assert_error(r, 400, "validation.artifacts nonces must match nonces field", param="validation.artifacts")
    # Duplicates are allowed: the check is on sets.
    r = generate(pow_url, [0, 1, 1], seq_len=16, validation=validation(arts))
    assert r.status_code == 200 and r.json()["n_total"] == 3, r.text


def test_unknown_job_id_is_404(pow_url):
    job_id = str(uuid.uuid4())
    assert_error(httpx.get(f"{pow_url}/generate/{job_id}", timeout=10), 404, f"Request {job_id} not found")


def test_init_twice_is_409_already_generating(pow_url):
    try:
        r = init(pow_url)
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "OK", "pow_status": {"status": "GENERATING"}}
        assert_error(init(pow_url, block_height=101), 409, "Already generating", type="Conflict")
        assert status(pow_url)["config"]["block_height"] == 100  # the first round goes on unchanged
    finally:
        assert stop(pow_url) == {"status": "OK", "pow_status": {"status": "STOPPED"}}
    assert status(pow_url) == {"status": "IDLE", "config": None, "stats": None}
    assert stop(pow_url) == {"status": "OK", "pow_status": {"status": "STOPPED"}}  # stop when idle: still 200


def test_init_with_a_huge_batch_size_mines_in_engine_sized_batches(pow_url):
    # Each mining batch was a list of batch_size nonces built at once: the sweep (test_http_sweep.py) sent ~4e9 and
    # the backend was OOM-killed. Batches are now capped at what one forward takes, so progress shows at once.
    try:
        assert init(pow_url, batch_size=10**6).status_code == 200
        wait_until(lambda: status(pow_url)["stats"]["total_processed"], timeout_s=30, what="mining progress")
    finally:
        stop(pow_url)
    assert status(pow_url)["status"] == "IDLE"


def test_text_with_a_lone_surrogate_is_400(pow_url):
    # JSON may escape a lone UTF-16 surrogate ("\ud800"), which nothing can encode as UTF-8 (it was a 500).
    for path, extra in (("init/generate", {}), ("generate", {"nonces": [1], "wait": True})):
        body = {**node(block_hash="\ud800"), "params": params(16), **extra}
        r = httpx.post(f"{pow_url}/{path}", content=json.dumps(body), headers={"content-type": "application/json"},
                       timeout=30)
        assert_error(r, 400, param="block_hash")
    assert status(pow_url)["status"] == "IDLE"


# --- bearer token, two frontends ---

def test_bearer_token_guards_only_the_pow_routes(token_frontend):
    url = f"{token_frontend}/api/v1/pow"
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.get(f"{url}/status", headers=headers, timeout=10)
        assert_error(r, 401, type="AuthenticationError")
        assert r.headers["www-authenticate"] == "Bearer"
    assert_error(generate(url, [1], seq_len=16), 401)
    assert status(url, headers=AUTH)["status"] == "IDLE"
    r = generate(url, [1], seq_len=16, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    assert httpx.get(f"{url}/versions", headers=AUTH, timeout=10).json()["scheduling_mode"] == "exclusive"
    assert httpx.get(f"{token_frontend}/health", timeout=10).status_code == 200
    assert httpx.get(f"{token_frontend}/v1/models", timeout=10).status_code == 200


def test_two_frontends_report_the_same_status_during_a_round(pow_url, token_frontend):
    other = f"{token_frontend}/api/v1/pow"
    try:
        assert init(pow_url, block_height=150, node_id=1, node_count=2).status_code == 200
        wait_until(lambda: status(pow_url)["stats"]["total_processed"] > 0, what="mining progress")
        a, b = status(pow_url), status(other, headers=AUTH)
        assert a["status"] == b["status"] == "GENERATING"
        assert a["config"] == b["config"] == {**node(block_height=150, node_id=1, node_count=2), "group_id": 0,
                                              "n_groups": 1, "seq_len": 64, "k_dim": 12}
        assert b["stats"]["total_processed"] >= a["stats"]["total_processed"] > 0
        # Either frontend controls the one round.
        assert_error(init(other, headers=AUTH), 409, "Already generating")
        assert stop(other, headers=AUTH)["pow_status"] == {"status": "STOPPED"}
        assert status(pow_url)["status"] == status(other, headers=AUTH)["status"] == "IDLE"
    finally:
        stop(pow_url)


# --- chat priority (exclusive mode; the fork's tests/gonka/test_live_chat_priority.py) ---

def test_chat_is_503_during_mining_and_200_after_stop(pow_url, stack):
    assert chat(stack.base_url).status_code == 200  # 01: baseline
    try:
        r = init(pow_url, block_height=400)
        assert r.status_code == 200, r.text
        time.sleep(0.3)
        for path, body in (("chat/completions", CHAT), ("chat/completions", {**CHAT, "stream": True}),
                           ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4})):
            r = httpx.post(f"{stack.base_url}/v1/{path}", json=body, timeout=60)
            assert r.status_code == 503 and r.json() == GATE_BODY, (path, r.text)
        # A malformed body is still a 400: the gate is checked after request validation.
        assert httpx.post(f"{stack.base_url}/v1/chat/completions", json={"model": MODEL},
                          timeout=30).status_code == 400
    finally:
        stop(pow_url)
    r = chat(stack.base_url)
    assert r.status_code == 200, r.text  # 05: served again, logprobs intact
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(len(p["top_logprobs"]) == 5 for p in content)


def test_init_aborts_chats_in_flight(pow_url, stack):
    """The fork's tests/gonka/test_live_chat_priority.py test 03: a streaming and a non-streaming long chat are
    running when init arrives."""
    started = threading.Event()
    seen: dict = {"tokens": 0, "errors": [], "done": False}
    long_chat = {"model": MODEL, "messages": CHAT["messages"], "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}

    def stream_long_chat() -> None:
        try:
            with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json={**long_chat, "stream": True},
                              timeout=120) as r:
                seen["status"] = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        seen["done"] = True
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        seen["errors"].append(event["error"])
                    elif event["choices"] and event["choices"][0]["delta"].get("content"):
                        seen["tokens"] += 1
                        if seen["tokens"] >= 3:
                            started.set()
        except httpx.HTTPError as e:  # a broken connection counts as aborted too
            seen["exception"] = repr(e)
        finally:
            started.set()

    def plain_long_chat() -> None:
        try:
            seen["plain"] = httpx.post(f"{stack.base_url}/v1/chat/completions", json=long_chat, timeout=120)
        except httpx.HTTPError as e:
            seen["plain_exception"] = repr(e)

    threads = [threading.Thread(target=stream_long_chat), threading.Thread(target=plain_long_chat)]
    for t in threads:
        t.start()
    try:
        assert started.wait(60), "chat never started streaming"
        wait_until(lambda: metric(stack.base_url, "vllm:num_requests_running") == 2, what="both chats running")
        r = init(pow_url, block_height=200)
        assert r.status_code == 200, r.text
        init_done = time.monotonic()
        time.sleep(0.3)
        r = chat(stack.base_url)
        assert r.status_code == 503 and r.json() == GATE_BODY
        for t in threads:
            t.join(15)
        assert not any(t.is_alive() for t in threads), "a chat in flight was not aborted"
        assert time.monotonic() - init_done < 15
    finally:
        stop(pow_url)
        for t in threads:
            t.join(60)
    assert seen["tokens"] < LONG_MAX_TOKENS, seen
    assert "exception" in seen or any(e["code"] == 503 and "PoC generation is active" in e["message"]
                                      for e in seen["errors"]), seen
    # Non-streaming: the fork answered 200 with truncated text or dropped the connection; we answer the gate's 503.
    assert seen["plain"].status_code == 503 and seen["plain"].json() == GATE_BODY, seen
    time.sleep(0.5)
    assert chat(stack.base_url).status_code == 200
    # Nothing leaked in the engine (stats reach /metrics with the next pong, hence the wait).
    wait_until(lambda: metric(stack.base_url, "vllm:num_requests_running") == 0, timeout_s=10, what="idle engine")
