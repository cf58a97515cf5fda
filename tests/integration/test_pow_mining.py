"""PoC mining rounds, queued jobs and their callbacks, against a real HTTP receiver on loopback.

Backends of our own (each ~15 s and 2.4 GB to start): one in shared scheduling mode with a short callback
interval and a queue cap of 8 nonces, used by most tests here; the others run with --chat-share 1, so that a long
chat holds every job in the queue (PoC runs only while chat is idle there), one of them SIGKILLed and restarted on
its state dir. The fork's shapes, queue and callbacks, validation, shared vs exclusive mode, and what the node's
dapi sends and receives (docs/architecture.md, "The network's contract").
"""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import numpy as np
import pytest
from scipy.stats import binomtest

from backend.pow.service import MAX_RUNNING_JOBS
from tests.integration.pow_util import (
    CALLBACK_BASE,
    ENCODING,
    GENERATED_KEYS,
    JOB_GENERATED_KEYS,
    MODEL,
    VALIDATED_KEYS,
    Server,
    artifacts_of,
    chat_holding_poc,
    decode,
    echoed,
    encode,
    generate,
    l2,
    metric,
    negated,
    node,
    params,
    poll_job,
    shifted,
    status,
    stop,
    validation,
    wait_until,
)
from tests.stack import wait_healthy

MAX_QUEUED = 8


@pytest.fixture(scope="module")
def shared(model_dir, tmp_path_factory):
    server = Server.start(model_dir, tmp_path_factory.mktemp("pow-shared"), "--scheduling-mode", "shared",
                          "--callback-interval-s", "0.5", "--max-queued-nonces", str(MAX_QUEUED))
    yield server
    server.stop()


@pytest.fixture
def pow_url(shared, receiver):
    receiver.status = 200
    yield shared.pow
    receiver.status = 200
    stop(shared.pow)  # whatever a test did, the next one starts idle


def init(pow_url: str, **fields) -> httpx.Response:
    body = {**node(), "batch_size": 4, "params": params(32), **fields}
    return httpx.post(f"{pow_url}/init/generate", json=body, timeout=60)


def queue_job(pow_url: str, nonces: list[int], **fields) -> str:
    r = generate(pow_url, nonces, wait=False, **fields)
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["status", "request_id", "queued_count"]
    assert body["status"] == "queued" and body["queued_count"] == len(nonces)
    uuid.UUID(body["request_id"])
    return body["request_id"]


def test_versions_report_shared_mode(shared):
    body = httpx.get(f"{shared.pow}/versions", timeout=10).json()
    assert body["poc_validation_inference"] is True and body["scheduling_mode"] == "shared"


def test_mining_round_streams_generated_callbacks_that_revalidate(pow_url, receiver):
    # Node 1 of 3 in group 1 of 2: the x-th nonce is 1 + 1·3 + x·6 (poc/nonces.py).
    identity = node(block_hash="MINING_BLOCK", block_height=321, public_key="02miner", node_id=1, node_count=3)
    before = len(receiver.bodies("generated"))
    try:
        r = init(pow_url, **identity, group_id=1, n_groups=2, url=receiver.url)
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "OK", "pow_status": {"status": "GENERATING"}}
        wait_until(lambda: sum(len(b["artifacts"]) for b in receiver.bodies("generated")[before:]) >= 8,
                   what="8 artifacts delivered")
        s = status(pow_url)
        assert s["status"] == "GENERATING"
        assert s["config"] == {**identity, "group_id": 1, "n_groups": 2, "seq_len": 32, "k_dim": 12}
        assert s["stats"]["total_processed"] >= 8 and s["stats"]["nonces_per_second"] > 0
        # Jobs run beside the round (the fork made them wait for /stop): a queued one completes meanwhile.
        job_id = queue_job(pow_url, [7])
        assert poll_job(pow_url, job_id)["status"] == "completed"
        assert status(pow_url)["status"] == "GENERATING"
    finally:
        assert stop(pow_url) == {"status": "OK", "pow_status": {"status": "STOPPED"}}
    processed = s["stats"]["total_processed"]
    assert status(pow_url) == {"status": "IDLE", "config": None, "stats": None}
    # /stop flushed what was computed; nothing arrives after it.
    bodies = receiver.bodies("generated")[before:]
    time.sleep(1.0)
    assert len(receiver.bodies("generated")) - before == len(bodies)

    nonces, arts = [], {}
    for body in bodies:
        assert list(body) == GENERATED_KEYS  # no request_id on the streamed callbacks
        assert {k: body[k] for k in ("public_key", "block_hash", "block_height", "node_id")} == {
            "public_key": "02miner", "block_hash": "MINING_BLOCK", "block_height": 321, "node_id": 1}
        assert body["encoding"] == ENCODING
        for a in body["artifacts"]:
            assert list(a) == ["nonce", "vector_b64"]
            v = decode(a["vector_b64"])
            assert v.shape == (12,) and np.isfinite(v).all()
            nonces.append(a["nonce"])
            arts[a["nonce"]] = a["vector_b64"]
    assert len(nonces) >= processed
    assert nonces == [4 + 6 * x for x in range(len(nonces))]  # NonceIterator order, no gap, no repeat

    # Re-validation of what was streamed, the way a validator does it (same block hash and public key).
    sample = dict(list(arts.items())[:8])
    r = generate(pow_url, list(sample), block_hash="MINING_BLOCK", public_key="02miner",
                 validation=validation(sample))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["n_total"], body["n_mismatch"], body["mismatch_nonces"],
            body["fraud_detected"]) == ("completed", 8, 0, [], False)


@pytest.mark.parametrize(("node_id", "node_count", "group_id", "n_groups"), [
    (1, 1, 0, 1),  # one node: NodeNum 1 of 1
    (3, 2, 0, 1),  # answered 400 before (issue 28); the fork mines 3, 5, 7, ...
    (5, 3, 1, 2),  # NodeNum 5 of 3 nodes (some were removed and re-added), the ML node's second backend
])
def test_dapi_node_numbering_is_accepted(pow_url, receiver, node_id, node_count, group_id, n_groups):
    """dapi sends node_id = NodeNum (1-based, only grows) and node_count = its node count, so node_id may exceed
    node_count; the nonces are the fork's: node_id + group_id·N + x·(n_groups·N) (poc/nonces.py)."""
    identity = node(block_hash="DAPI_BLOCK", block_height=654, node_id=node_id, node_count=node_count)
    before = len(receiver.bodies("generated"))
    try:
        r = init(pow_url, **identity, group_id=group_id, n_groups=n_groups, url=receiver.url)
        assert r.status_code == 200, r.text
        assert status(pow_url)["config"] == {**identity, "group_id": group_id, "n_groups": n_groups,
                                             "seq_len": 32, "k_dim": 12}
        wait_until(lambda: sum(len(b["artifacts"]) for b in receiver.bodies("generated")[before:]) >= 4,
                   what="4 artifacts delivered")
    finally:
        stop(pow_url)
    nonces = [a["nonce"] for b in receiver.bodies("generated")[before:] for a in b["artifacts"]]
    offset, step = node_id + group_id * node_count, n_groups * node_count
    assert nonces == [offset + x * step for x in range(len(nonces))]


def test_shared_mode_serves_chat_while_mining_progresses(pow_url, shared):
    try:
        assert init(pow_url).status_code == 200
        wait_until(lambda: status(pow_url)["stats"]["total_processed"] > 0, what="mining progress")
        wait_until(lambda: metric(shared.base_url, "pocserve_poc_mining") == 1.0, timeout_s=10, what="mining gauge")
        before = status(pow_url)["stats"]["total_processed"]
        result = {}

        def run_chat() -> None:
            result["response"] = httpx.post(
                f"{shared.base_url}/v1/chat/completions", timeout=120,
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                      "ignore_eos": True, "logprobs": True})

        thread = threading.Thread(target=run_chat)
        thread.start()
        during = []
        while thread.is_alive():
            during.append(status(pow_url)["stats"]["total_processed"])
            time.sleep(0.1)
        thread.join()
        r = result["response"]
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
        assert during and max(during) > before, (before, during)  # mining went on while the chat ran
        assert status(pow_url)["status"] == "GENERATING"
    finally:
        stop(pow_url)


def test_shared_round_under_chat_load_gives_the_artifacts_computed_alone(pow_url, receiver):
    """Chat's share splits the round's forwards into sizes the credit buys; the artifacts must not depend on it."""
    identity = node(block_hash="SHARED_LOAD", block_height=777)
    before = len(receiver.bodies("generated"))
    with chat_holding_poc(pow_url.removesuffix("/api/v1/pow")):  # running the whole time, or this fails
        try:
            assert init(pow_url, **identity, url=receiver.url).status_code == 200
            wait_until(lambda: sum(len(b["artifacts"]) for b in receiver.bodies("generated")[before:]) >= 16,
                       what="16 artifacts mined beside the chat")
        finally:
            stop(pow_url)
    mined = {a["nonce"]: a["vector_b64"] for b in receiver.bodies("generated")[before:] for a in b["artifacts"]}
    alone = artifacts_of(pow_url, sorted(mined)[:16], block_hash="SHARED_LOAD")
    assert max(l2(mined[n], v) for n, v in alone.items()) < 0.02


@pytest.fixture(scope="module")
def overlapped(model_dir, tmp_path_factory):
    """Forwards launched beside chat steps (--poc-overlap on): on this CPU engine each one runs when launched, so
    this checks the launch/poll path (blocks, queue, routing, a second forward launched behind the first), not the
    overlap itself (a CUDA stream)."""
    server = Server.start(model_dir, tmp_path_factory.mktemp("pow-overlapped"), "--scheduling-mode", "shared",
                          "--poc-overlap", "on", "--callback-interval-s", "0.5")
    yield server
    server.stop()


def test_overlapped_round_under_chat_load_gives_the_artifacts_computed_alone(overlapped, receiver):
    pow_url = overlapped.pow
    identity = node(block_hash="OVERLAP_LOAD", block_height=778)
    before = len(receiver.bodies("generated"))
    with chat_holding_poc(overlapped.base_url):  # running the whole time, or this fails
        try:
            assert init(pow_url, **identity, url=receiver.url).status_code == 200
            wait_until(lambda: sum(len(b["artifacts"]) for b in receiver.bodies("generated")[before:]) >= 16,
                       what="16 artifacts mined beside the chat")
            job = artifacts_of(pow_url, [10**6 + i for i in range(8)], block_hash="OVERLAP_LOAD")  # beside both
        finally:
            stop(pow_url)
    mined = {a["nonce"]: a["vector_b64"] for b in receiver.bodies("generated")[before:] for a in b["artifacts"]}
    computed = {**mined, **job}
    alone = artifacts_of(pow_url, sorted(computed), block_hash="OVERLAP_LOAD")
    assert sorted(alone) == sorted(computed)
    assert max(l2(computed[n], alone[n]) for n in computed) < 0.02


def test_layerwise_forward_beside_chat_gives_the_whole_forwards_artifacts_bit_for_bit(shared, overlapped):
    """The overlapped backend queues a forward a few layers per loop turn while chat runs (LayerwiseForward);
    the shared one (time-sliced here) runs the model whole. Same nonces in one forward: the same bytes."""
    nonces = [7 * i for i in range(8)]
    whole = artifacts_of(shared.pow, nonces, block_hash="LAYERWISE")
    with chat_holding_poc(overlapped.base_url):
        layerwise = artifacts_of(overlapped.pow, nonces, block_hash="LAYERWISE")
    assert layerwise == whole


@pytest.fixture(scope="module")
def overlapped_exclusive(model_dir, tmp_path_factory):
    """The overlapped loop in exclusive mode: chat is gated during a round, and the loop waits for each forward
    with the next queued behind it; on a CUDA engine a shape's forwards after its first are replayed from a CUDA
    graph (backend/engine/pocworker/graphs.py)."""
    server = Server.start(model_dir, tmp_path_factory.mktemp("pow-overlapped-exclusive"), "--scheduling-mode",
                          "exclusive", "--poc-overlap", "on", "--callback-interval-s", "0.5")
    yield server
    server.stop()


def test_jobs_in_an_exclusive_overlapped_round_give_the_whole_forwards_artifacts(shared, overlapped_exclusive,
                                                                                 receiver):
    """Jobs run inside the round, with chat gated: on a CUDA engine their forwards (and the round's, of the same
    shape) are eager once, then captured, then replayed with new inputs on other blocks, one queued behind another
    (the output of the one running copied out first); on the CPU engine they run eager (the launch/poll path). Each
    must give the time-sliced backend's whole forward byte for byte."""
    batches = [[1000 * k + 3 * i for i in range(8)] for k in range(4)]
    whole = [artifacts_of(shared.pow, nonces, block_hash="REPLAYED") for nonces in batches]
    pow_url = overlapped_exclusive.pow
    try:
        assert init(pow_url, **node(block_hash="REPLAYED", block_height=779), url=receiver.url).status_code == 200
        replayed = [artifacts_of(pow_url, nonces, block_hash="REPLAYED") for nonces in batches]
        assert status(pow_url)["status"] == "GENERATING"  # the jobs ran inside the round
    finally:
        stop(pow_url)
    assert replayed == whole


def test_queued_validation_delivers_the_exact_validated_callback(pow_url, receiver):
    nonces = [0, 1, 2, 3]
    honest = artifacts_of(pow_url, nonces)
    # dapi escapes the model id twice: the path must reach the receiver byte for byte.
    url = f"{receiver.root}/v2/poc-batches/Qwen%252FQwen3-0.6B"
    # The validator's own NodeNum, echoed back; above its node count, as dapi sends after nodes were re-added.
    identity = node(block_height=77, node_id=7, node_count=2)
    job_id = queue_job(pow_url, nonces, url=url, validation=validation(honest), **identity)
    result = poll_job(pow_url, job_id)
    assert result == {"status": "completed", "request_id": job_id, "n_total": 4, "n_mismatch": 0,
                      "mismatch_nonces": [], "p_value": 1.0, "fraud_detected": False, "n_excluded": 0,
                      "excluded_nonces": []}
    path, body = wait_until(lambda: receiver.by_request_id(job_id), what="validated callback")[0]
    assert path == "/v2/poc-batches/Qwen%252FQwen3-0.6B/validated"
    assert list(body) == VALIDATED_KEYS
    assert body == {"request_id": job_id, "block_hash": "TEST_BLOCK", "block_height": 77,
                    "public_key": "test_pub_keys", "node_id": 7, "n_total": 4, "n_mismatch": 0,
                    "mismatch_nonces": [], "p_value": 1.0, "fraud_detected": False, "n_excluded": 0,
                    "excluded_nonces": []}

    # Tampered: nonce 0 has a NaN, nonce 1 is flipped (L2 ≈ 2), nonce 3 moved by 0.05 (> the default 0.02),
    # nonce 2 by 0.005 (within it).
    with_nan = decode(honest[0]).copy()
    with_nan[5] = np.nan
    tampered = {0: encode(with_nan), 1: negated(honest[1]), 2: shifted(honest[2], 0.005),
                3: shifted(honest[3], 0.05)}
    job_id = queue_job(pow_url, nonces, url=receiver.url, validation=validation(tampered))
    result = poll_job(pow_url, job_id)
    assert (result["status"], result["n_total"], result["n_mismatch"], result["mismatch_nonces"],
            result["fraud_detected"]) == ("completed", 4, 3, [0, 1, 3], True)
    assert result["p_value"] == pytest.approx(binomtest(3, 4, 0.001, alternative="greater").pvalue, rel=1e-9)
    path, body = wait_until(lambda: receiver.by_request_id(job_id), what="validated callback")[0]
    assert path == f"{CALLBACK_BASE}/validated"
    assert {k: body[k] for k in VALIDATED_KEYS[5:]} == {k: result[k] for k in VALIDATED_KEYS[5:]}


def test_validation_of_malformed_vectors(pow_url):
    nonces = [0, 1, 2, 3]
    honest = artifacts_of(pow_url, nonces)
    received = {0: "", 1: encode(decode(honest[1])[:11]), 2: honest[2], 3: "not base64!"}
    r = generate(pow_url, nonces, validation=validation(received))
    assert r.status_code == 200, r.text
    body = r.json()
    # Empty: skipped (counted in n_total, never a mismatch); wrong shape and undecodable: mismatches.
    assert (body["n_total"], body["n_mismatch"], body["mismatch_nonces"]) == (4, 2, [1, 3])


def test_stat_test_p_value_threshold_is_the_fraud_threshold(pow_url):
    nonces = [20, 21, 22, 23]
    honest = artifacts_of(pow_url, nonces)
    # Production values (dist 0.4, p_mismatch 0.1): 2 of 4 flipped → p = P[X ≥ 2] ≈ 0.0523.
    tampered = {**honest, 20: negated(honest[20]), 21: negated(honest[21]), 22: shifted(honest[22], 0.3)}
    base = {"dist_threshold": 0.4, "p_mismatch": 0.1}
    outcomes = {}
    for name, extra in (("default", {}), ("p_value_threshold", {"p_value_threshold": 0.06}),
                        ("fraud_threshold", {"fraud_threshold": 0.06})):
        r = generate(pow_url, nonces, validation=validation(tampered), stat_test={**base, **extra})
        assert r.status_code == 200, r.text
        outcomes[name] = r.json()
    for body in outcomes.values():
        assert (body["n_mismatch"], body["mismatch_nonces"]) == (2, [20, 21])
        assert body["p_value"] == pytest.approx(binomtest(2, 4, 0.1, alternative="greater").pvalue, rel=1e-9)
    assert outcomes["default"]["fraud_detected"] is False  # default fraud threshold 0.01
    assert outcomes["p_value_threshold"]["fraud_detected"] is True  # dapi's name is honoured
    assert outcomes["fraud_threshold"]["fraud_detected"] is True
    r = generate(pow_url, nonces, validation=validation(tampered),
                 stat_test={"p_value_threshold": 0.06, "fraud_threshold": 0.05})
    assert r.status_code == 400, r.text  # two names for one setting: one of them per body


def test_callback_refused_with_500_is_retried_until_delivered(pow_url, shared, receiver):
    retries_before = metric(shared.base_url, "pocserve_callback_retries_total")
    receiver.status = 500
    job_id = queue_job(pow_url, [50, 51], url=receiver.url, block_height=500, params=params(16, k_dim=8))
    result = poll_job(pow_url, job_id)
    assert result["status"] == "completed" and [a["nonce"] for a in result["artifacts"]] == [50, 51]
    assert result["encoding"] == {**ENCODING, "k_dim": 8}  # the job's k_dim, kept with the stored result
    assert all(decode(a["vector_b64"]).shape == (8,) for a in result["artifacts"])
    wait_until(lambda: metric(shared.base_url, "pocserve_callback_retries_total") > retries_before,
               what="a retry counted in /metrics")
    assert receiver.num_failed >= 1 and not receiver.by_request_id(job_id)
    receiver.status = 200
    path, body = wait_until(lambda: receiver.by_request_id(job_id), timeout_s=30, what="redelivery")[0]
    assert path.endswith("/v2/poc-batches/tiny/generated")
    assert list(body) == JOB_GENERATED_KEYS
    assert body == {"request_id": job_id, **echoed(block_height=500), "artifacts": result["artifacts"],
                    "encoding": {**ENCODING, "k_dim": 8}}
    wait_until(lambda: metric(shared.base_url, "pocserve_callback_backlog") == 0, what="empty outbox")


@pytest.fixture(scope="module")
def held(model_dir, tmp_path_factory):
    """PoC only while chat is idle: a long chat holds every job where it is (chat_holding_poc)."""
    server = Server.start(model_dir, tmp_path_factory.mktemp("pow-held"), "--chat-share", "1",
                          "--max-queued-nonces", str(MAX_QUEUED))
    yield server
    server.stop()


# Only what the fork's arithmetic gives no sequence for, or no sender means (poc/nonces.py); node_id above
# node_count is accepted (test_dapi_node_numbering_is_accepted).
@pytest.mark.parametrize("node_id,node_count,group_id,n_groups,field", [
    (-1, 2, 0, 1, "node_id"),
    (0, 0, 0, 1, "node_count"),
    (0, 1, 0, 0, "n_groups"),
    (0, 1, -1, 2, "group_id"),
])
def test_impossible_node_numbers_are_a_400_naming_the_field(pow_url, node_id, node_count, group_id, n_groups,
                                                            field):
    identity = node(node_id=node_id, node_count=node_count)
    r = init(pow_url, **identity, group_id=group_id, n_groups=n_groups)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]
    assert status(pow_url)["status"] == "IDLE"
    if field.startswith("node"):
        r = generate(pow_url, [1], node_id=node_id, node_count=node_count)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("node_id,node_count", [(0, 2), (1, 2), (2, 2), (3, 2), (7, 2)])
def test_validators_node_numbers_are_accepted(pow_url, node_id, node_count):
    # A validator sends its own NodeNum with the count of its nodes serving the model (as the fork, any node_id).
    r = generate(pow_url, [1], node_id=node_id, node_count=node_count)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"


def test_wait_true_validation_answers_during_a_mining_round_which_goes_on(pow_url, receiver):
    honest = artifacts_of(pow_url, [30, 31, 32, 33])
    try:
        assert init(pow_url, url=receiver.url).status_code == 200
        wait_until(lambda: status(pow_url)["stats"]["total_processed"] > 0, what="mining progress")
        r = generate(pow_url, [30, 31, 32, 33], validation=validation(honest))  # wait=true
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["n_total"], r.json()["n_mismatch"]) == ("completed", 4, 0)
        after_job = status(pow_url)
        assert after_job["status"] == "GENERATING"
        wait_until(lambda: status(pow_url)["stats"]["total_processed"] > after_job["stats"]["total_processed"],
                   what="mining after the job")
    finally:
        stop(pow_url)


def test_queue_cap_is_429_and_stop_cancels_the_jobs_not_started(held):
    pow_url = held.pow
    job_status = lambda job_id: httpx.get(f"{pow_url}/generate/{job_id}", timeout=10).json()["status"]  # noqa: E731
    with chat_holding_poc(held.base_url):
        jobs = [queue_job(pow_url, [n]) for n in range(MAX_QUEUED)]  # one nonce each: the cap is reached
        r = generate(pow_url, [99], wait=False)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["message"] == f"Queue full: {MAX_QUEUED} nonces queued, limit is {MAX_QUEUED}"
        # The first MAX_RUNNING_JOBS are in the engine's queue (running), the rest wait for a place (queued).
        running, queued = jobs[:MAX_RUNNING_JOBS], jobs[MAX_RUNNING_JOBS:]
        assert [job_status(j) for j in jobs] == ["running"] * len(running) + ["queued"] * len(queued)
        stop(pow_url)
        # /stop cancels what has not started (kept as "cancelled" until the TTL; the fork erased them) and frees
        # their share of the cap; running jobs go on (a late /stop must not throw a validation away).
        assert [job_status(j) for j in queued] == ["cancelled"] * len(queued)
        assert generate(pow_url, list(range(len(queued))), wait=False).status_code == 200
    for job_id in running:
        assert poll_job(pow_url, job_id)["status"] == "completed"


def test_queued_jobs_and_undelivered_callbacks_survive_a_backend_kill(model_dir, tmp_path, receiver):
    server = Server.start(model_dir, tmp_path, "--chat-share", "1", "--scheduling-mode", "shared")
    pow_url = server.pow
    try:
        honest = artifacts_of(pow_url, [30, 31, 32, 33])
        # A finished job whose callback the receiver keeps refusing: it sits in the outbox, retrying.
        receiver.status = 500
        pending_id = queue_job(pow_url, [40], url=receiver.url, block_height=899)
        pending = poll_job(pow_url, pending_id)
        wait_until(lambda: receiver.num_failed >= 1, what="a refused callback")
        assert init(pow_url).status_code == 200
        # The chat holds the jobs where they are, until the kill ends it too.
        with chat_holding_poc(server.base_url, outlives_block=False):
            compute_id = queue_job(pow_url, [100, 101, 102], url=receiver.url, block_height=900)
            validate_id = queue_job(pow_url, [30, 31, 32, 33], url=receiver.url, block_height=901,
                                    validation=validation(honest))
            for job_id in (compute_id, validate_id):
                assert httpx.get(f"{pow_url}/generate/{job_id}", timeout=10).json()["status"] in ("queued", "running")
            server.restart_backend()  # SIGKILL: no shutdown hook runs, nothing is flushed
        wait_until(lambda: httpx.get(f"{server.base_url}/health", timeout=2).status_code != 200,
                   timeout_s=10, what="backend seen down")
        receiver.status = 200
        wait_healthy(server.base_url, server.frontend, server.backend)

        assert status(pow_url)["status"] == "IDLE"  # the round died with the process; the queue did not
        assert poll_job(pow_url, pending_id) == pending  # finished results are persisted too
        computed = poll_job(pow_url, compute_id)
        validated = poll_job(pow_url, validate_id)
        assert computed["status"] == "completed" and [a["nonce"] for a in computed["artifacts"]] == [100, 101, 102]
        assert computed["encoding"] == ENCODING
        assert (validated["status"], validated["n_total"], validated["n_mismatch"], validated["fraud_detected"]) \
            == ("completed", 4, 0, False)
        bodies = {}
        for job_id in (pending_id, compute_id, validate_id):
            callbacks = wait_until(lambda j=job_id: receiver.by_request_id(j), what=f"callback of {job_id}")
            assert len(callbacks) == 1, callbacks
            bodies[job_id] = callbacks[0]
        path, body = bodies[pending_id]
        assert path.endswith("/generated") and body == {"request_id": pending_id, **echoed(block_height=899),
                                                        "artifacts": pending["artifacts"], "encoding": ENCODING}
        assert bodies[compute_id][1] == {"request_id": compute_id, **echoed(block_height=900),
                                         "artifacts": computed["artifacts"], "encoding": ENCODING}
        path, body = bodies[validate_id]
        assert path.endswith("/validated") and body["block_height"] == 901 and body["n_mismatch"] == 0
        # The restarted backend computes the same vectors.
        assert artifacts_of(pow_url, [30, 31, 32, 33]) == honest
    finally:
        receiver.status = 200
        server.stop()
