"""GenerateQueue: cap, FIFO, write-through to SQLite, restart recovery, TTL by timer, /stop keeps results."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from backend.errors import RequestError
from backend.pow.jobs import GenerateQueue, QueueFull
from backend.pow.results import ArtifactsResult
from backend.pow.store import Store
from protocol.poc import Artifact, Encoding
from protocol.pow import NodeIdentity, PowGenerateRequest, PowParams, ValidationOutcome


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path):
    return tmp_path / "state.db"


@pytest.fixture
def store(path):
    s = Store(path)
    yield s
    s.close()


def _queue(store, clock=None, **kw) -> GenerateQueue:
    q = GenerateQueue(store, clock=clock or FakeClock(), **kw)
    q.load()
    return q


def _reopen(store, path, clock=None, **kw) -> tuple[Store, GenerateQueue]:
    """Simulates a restart: everything submitted so far is written, then a new process loads the file."""
    store.close()
    new = Store(path)
    return new, _queue(new, clock, **kw)


NODE = NodeIdentity(block_hash="h", block_height=1, public_key="pk", node_id=0, node_count=1)


def _request(n: int, k_dim: int = 12, **kw) -> PowGenerateRequest:
    return PowGenerateRequest(rid="r", node=NODE, params=PowParams(model="m", seq_len=8, k_dim=k_dim),
                              nonces=list(range(n)), **kw)


def _result(*nonces: int) -> ArtifactsResult:
    return ArtifactsResult(artifacts=[Artifact(nonce=n, vector_b64="AA==") for n in nonces], encoding=Encoding())


def test_jobs_cap_raises_queue_full_with_both_numbers(store):
    q = _queue(store, max_queued_nonces=10)
    q.enqueue("a", _request(6), 6)
    running = q.peek_next()
    q.mark_running(running)  # running jobs still count
    q.enqueue("b", _request(4), 4)
    with pytest.raises(QueueFull) as e:
        q.enqueue("c", _request(1), 1)
    assert (e.value.queued, e.value.limit) == (10, 10)
    assert e.value.message == "Queue full: 10 nonces queued, limit is 10"
    assert isinstance(e.value, RequestError) and e.value.status == 429
    assert q.get("c") is None
    q.complete(running, _result())
    assert q.queued_nonces == 4
    q.enqueue("c", _request(6), 6)


def test_jobs_fifo_order(store):
    q = _queue(store)
    for name in "abc":
        q.enqueue(name, _request(1), 1)
    order = []
    while (job := q.peek_next()) is not None:
        order.append(job.id)
        q.mark_running(job)
        q.complete(job, _result())
    assert order == ["a", "b", "c"]
    assert q.queued_nonces == 0


def test_jobs_reload_keeps_fifo_and_requeues_running(store, path):
    clock = FakeClock()
    q = _queue(store, clock)
    for name in "abcd":
        q.enqueue(name, _request(2), 2)  # same timestamp: the insertion order must still hold
    q.mark_running(q.peek_next())  # "a" was running when the process died
    store, q = _reopen(store, path, clock)
    try:
        assert q.peek_next().id == "a"
        assert q.get("a").status == "queued"
        assert q.queued_nonces == 8
        order = []
        while (job := q.peek_next()) is not None:
            order.append(job.id)
            q.mark_running(job)
            q.fail(job, "x")
        assert order == ["a", "b", "c", "d"]
        assert store.call(lambda c: c.execute("SELECT COUNT(*) FROM jobs WHERE status = 'running'").fetchone()[0]) == 0
    finally:
        store.close()


def test_jobs_results_survive_reload(store, path):
    clock = FakeClock()
    q = _queue(store, clock)
    q.enqueue("ok", _request(2, k_dim=6), 2)
    q.enqueue("bad", _request(1), 1)
    q.enqueue("val", _request(1, validation=[Artifact(nonce=0, vector_b64="AA==")]), 1)
    ok, bad, val = q.get("ok"), q.get("bad"), q.get("val")
    q.mark_running(ok)
    q.complete(ok, _result(1))
    q.mark_running(val)
    outcome = ValidationOutcome(n_total=1, n_mismatch=0, mismatch_nonces=[], p_value=1.0, fraud_detected=False)
    q.complete(val, outcome)
    q.mark_running(bad)
    q.fail(bad, "Timeout waiting for engine: chunk 0")
    clock.now += 10
    store, q = _reopen(store, path, clock)
    try:
        ok, bad, val = q.get("ok"), q.get("bad"), q.get("val")
        assert (ok.status, ok.request.params.k_dim, ok.result) == ("completed", 6, _result(1))
        assert (bad.status, bad.error, bad.result) == ("failed", "Timeout waiting for engine: chunk 0", None)
        assert (val.status, val.result) == ("completed", outcome)
        assert q.peek_next() is None and q.queued_nonces == 0
    finally:
        store.close()


def test_jobs_prune_by_injected_clock_and_get_hides_expired(store, path):
    clock = FakeClock()
    q = _queue(store, clock, result_ttl_s=300.0)
    for name in "ab":
        q.enqueue(name, _request(1), 1)
    a = q.peek_next()
    q.mark_running(a)
    q.complete(a, _result())
    clock.now += 100
    b = q.peek_next()
    q.mark_running(b)
    q.fail(b, "boom")
    q.enqueue("queued", _request(1), 1)  # queued jobs never expire
    clock.now += 250  # a is 350 s old, b 250 s
    assert q.get("a") is None  # expired even before the timer prunes it
    assert q.prune_expired() == 1
    assert q.get("b").status == "failed" and q.get("queued") is not None
    assert q.prune_expired(now=clock.now + 1000) == 1
    assert q.get("b") is None and q.get("queued") is not None
    assert store.call(lambda c: [r[0] for r in c.execute("SELECT id FROM jobs")]) == ["queued"]


def test_jobs_reload_drops_expired_results(store, path):
    clock = FakeClock()
    q = _queue(store, clock, result_ttl_s=5.0)
    q.enqueue("a", _request(1), 1)
    a = q.peek_next()
    q.mark_running(a)
    q.complete(a, _result())
    clock.now += 6
    store, q = _reopen(store, path, clock, result_ttl_s=5.0)
    try:
        assert q.get("a") is None
        assert store.call(lambda c: c.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]) == 0
    finally:
        store.close()


def test_jobs_cancel_queued_keeps_results_until_ttl_and_lets_running_jobs_finish(store, path):
    clock = FakeClock()
    q = _queue(store, clock, result_ttl_s=60.0)
    for name in "abcd":
        q.enqueue(name, _request(3), 3)
    a = q.peek_next()
    q.mark_running(a)
    q.complete(a, _result())
    b = q.peek_next()
    q.mark_running(b)  # b running; c, d queued
    assert q.cancel_queued() == 2
    assert [q.get(n).status for n in "abcd"] == ["completed", "running", "cancelled", "cancelled"]
    assert q.peek_next() is None and q.queued_nonces == 3  # b still counts against the cap
    q.complete(b, _result(0))
    assert q.get("b").status == "completed" and q.queued_nonces == 0
    store, q = _reopen(store, path, clock, result_ttl_s=60.0)
    try:
        assert [q.get(n).status for n in "abcd"] == ["completed", "completed", "cancelled", "cancelled"]
        clock.now += 61
        assert q.prune_expired() == 4
    finally:
        store.close()


def test_jobs_on_persisted_called_after_commit(store, path):
    q = _queue(store)
    seen = []
    done = threading.Event()

    def on_persisted(error):
        other = sqlite3.connect(path)  # committed: visible to another connection
        seen.append((error, other.execute("SELECT id, status FROM jobs").fetchall(),
                     threading.current_thread() is threading.main_thread()))
        other.close()
        done.set()

    q.enqueue("a", _request(1), 1, on_persisted=on_persisted)
    assert done.wait(5)
    assert seen == [(None, [("a", "queued")], False)]


def test_jobs_on_persisted_gets_write_error(store):
    q = _queue(store)
    q.enqueue("dup", _request(1), 1)
    store.call(lambda c: c.execute("INSERT INTO jobs (id, status, request, num_nonces, created_at) "
                                   "VALUES ('x', 'queued', '{}', 1, 0)"))
    errors = []
    done = threading.Event()
    q.enqueue("x", _request(1), 1, on_persisted=lambda e: (errors.append(e), done.set()))  # the row exists
    assert done.wait(5)
    assert isinstance(errors[0], sqlite3.IntegrityError)
