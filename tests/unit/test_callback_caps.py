"""The callback sender's two caps, as the fork's: mining artifacts beyond POC_CALLBACK_MAX_ARTIFACTS and job
callbacks beyond POC_CALLBACK_QUEUE_SIZE, oldest idle rows first, each cap blind to the other kind. A fake POST and
a clock that never moves (a stream row is never due, a failed row never retried, unless flush() forces them); the
sender's own thread is only waited for, never timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest

from backend.pow.callbacks import CallbackSender
from backend.pow.results import MinedBody
from backend.pow.store import Store
from protocol.poc import Artifact, Encoding

URL = "http://receiver/v2/poc-batches/model"
META = {"public_key": "pk", "block_hash": "h1", "block_height": 7, "node_id": 2}


class FakePost:
    """Answers every POST with `status`; records the path and body of those answered < 400."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.lock = threading.Lock()
        self.delivered: list[tuple[str, dict]] = []

    def __call__(self, url: str, body: bytes) -> int:
        with self.lock:
            if self.status < 400:
                self.delivered.append((url.removeprefix(URL + "/"), msgspec.json.decode(body)))
            return self.status


class Job(msgspec.Struct):
    request_id: str


def _batch(*nonces: int) -> MinedBody:
    return MinedBody(artifacts=[Artifact(nonce=n, vector_b64=f"v{n}") for n in nonces], encoding=Encoding(),
                     **META)


def _wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30.0  # only a bound on a hung sender thread
    while not predicate():
        assert time.monotonic() < deadline, "the sender's thread did not get there"
        time.sleep(0.005)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


@pytest.fixture
def make_sender(store):
    senders: list[CallbackSender] = []

    def make(post: FakePost, **kw) -> CallbackSender:
        senders.append(CallbackSender(store, interval_s=60.0, post=post, clock=lambda: 1000.0, **kw))
        return senders[-1]

    yield make
    for s in senders:
        s.close()


def _rows(store: Store) -> list[tuple[str, int]]:
    return store.call(lambda c: c.execute("SELECT kind, attempts FROM outbox ORDER BY id").fetchall())


def test_callbacks_max_artifacts_drops_the_oldest_mining_batches(make_sender, store):
    post = FakePost(200)
    sender = make_sender(post, max_artifacts=7)
    for first in (0, 3, 6):
        sender.add_generated(URL, _batch(first, first + 1, first + 2))
    _wait_until(lambda: sender.num_dropped == 1 and sender.backlog == 2)  # 9 > 7: the oldest batch of 3 goes
    sender.add_generated(URL, _batch(9))  # 7: at the cap, kept
    _wait_until(lambda: sender.backlog == 3)
    assert sender.num_dropped == 1
    assert sender.flush(10.0) == (3, 0)
    [(path, body)] = post.delivered
    assert path == "generated" and [a["nonce"] for a in body["artifacts"]] == list(range(3, 10))
    _wait_until(lambda: _rows(store) == [])


def test_callbacks_each_cap_counts_its_own_kind(make_sender, store):
    post = FakePost(500)
    sender = make_sender(post, max_artifacts=3, max_job_rows=1)
    sender.add_generated(URL, _batch(0, 1, 2))  # at the artifact cap: kept, whatever the job rows do
    sender.enqueue(URL, "validated", Job("r0"))
    _wait_until(lambda: sender.num_retries == 1)  # r0 failed once; it waits out a backoff that never ends
    sender.enqueue(URL, "validated", Job("r1"))  # a second job row: the oldest idle one (r0) goes
    _wait_until(lambda: sender.num_dropped == 1 and sender.num_retries == 2)
    _wait_until(lambda: _rows(store) == [("stream", 0), ("job", 1)])
    post.status = 200
    assert sender.flush(10.0) == (2, 0)
    assert sorted(path for path, _ in post.delivered) == ["generated", "validated"]
    assert {"request_id": "r1"} in [body for _, body in post.delivered]
    assert sender.num_dropped == 1
