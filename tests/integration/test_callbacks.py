"""CallbackSender against a real HTTP receiver on loopback: merging, paths, retries, drops, restart, flush."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

from backend.pow.callbacks import CallbackSender
from backend.pow.results import GeneratedBody, MinedBody, ValidatedBody
from backend.pow.store import Store
from protocol.poc import Artifact, Encoding

BASE_PATH = "/v2/poc-batches/model"
META = {"public_key": "pk", "block_hash": "h1", "block_height": 7, "node_id": 2}
ENCODING = {"dtype": "f16", "k_dim": 12, "endian": "le"}


class Receiver:
    """A callback receiver; `mode` is "ok", "500", "hang" (answers after `hang_s`) or "reset" (TCP RST)."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"
        self.hang_s = 1.0
        self.received: list[tuple[float, str, dict]] = []  # answered < 400: (monotonic time, path, body)
        self.num_requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so the sender's connection reuse is exercised

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.num_requests += 1
                mode = receiver.mode
                if mode == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if mode == "hang":
                    time.sleep(receiver.hang_s)
                status = 500 if mode == "500" else 200
                if status < 400 and mode == "ok":
                    receiver.received.append((time.monotonic(), self.path, body))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # resets and timed-out clients are the point of these tests

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{BASE_PATH}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def bodies(self, path: str = "") -> list[dict]:
        return [b for _, p, b in self.received if p.endswith(path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def frozen_clock() -> Callable[[], float]:
    """A clock that never moves: a failed row waits out its backoff forever, unless flush() forces it."""
    now = time.time()
    return lambda: now


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outbox_count(store: Store) -> int:
    return store.call(lambda c: c.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def artifacts(*nonces: int) -> list[dict]:
    return [{"nonce": n, "vector_b64": f"v{n}"} for n in nonces]


def batch(*nonces: int, meta: dict = META) -> MinedBody:
    """One mining batch of these nonces, as the PoC service hands it to the sender."""
    return MinedBody(artifacts=[Artifact(nonce=n, vector_b64=f"v{n}") for n in nonces],
                         encoding=msgspec.convert(ENCODING, Encoding), **meta)


class Job(msgspec.Struct):
    """A minimal job callback body: the sender posts any struct as it is."""

    request_id: str


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


@pytest.fixture
def make_sender(store):
    senders = []

    def make(**kw) -> CallbackSender:
        kw.setdefault("timeout_s", 1.0)
        senders.append(CallbackSender(kw.pop("store", store), **kw))
        return senders[-1]

    yield make
    for s in senders:
        s.close()


def test_callbacks_stream_merged_into_one_post_per_interval(receiver, make_sender):
    sender = make_sender(interval_s=0.5)
    t0 = time.monotonic()
    for i in range(3):
        sender.add_generated(receiver.url, batch(i * 10, i * 10 + 1))
    other = {**META, "block_hash": "h2"}
    sender.add_generated(receiver.url, batch(99, meta=other))
    wait_until(lambda: len(receiver.received) == 2)
    first = {b["block_hash"]: (t, p, b) for t, p, b in receiver.received}
    t1, path, body = first["h1"]
    assert t1 - t0 >= 0.45  # no send before the interval
    assert path == f"{BASE_PATH}/generated"
    assert list(body) == ["public_key", "block_hash", "block_height", "node_id", "artifacts", "encoding"]
    assert body == {**META, "artifacts": artifacts(0, 1, 10, 11, 20, 21), "encoding": ENCODING}
    assert first["h2"][2]["artifacts"] == artifacts(99)

    for i in range(2):
        sender.add_generated(receiver.url, batch(100 + i))
    wait_until(lambda: len(receiver.received) == 3)
    t2, _, body2 = receiver.received[2]
    assert t2 - t1 >= 0.45  # at most one POST per interval
    assert body2["artifacts"] == artifacts(100, 101)
    wait_until(lambda: sender.backlog == 0)
    assert (sender.num_delivered, sender.num_dropped, sender.num_retries) == (6, 0, 0)


def test_callbacks_job_callbacks_use_their_paths_at_once(receiver, make_sender, store):
    sender = make_sender(interval_s=60.0)
    generated = {"request_id": "r1", "block_hash": "h", "block_height": 1, "public_key": "pk", "node_id": 0,
                 "artifacts": artifacts(1), "encoding": ENCODING}
    validated = {"request_id": "r2", "block_hash": "h", "block_height": 1, "public_key": "pk", "node_id": 0,
                 "n_total": 3, "n_mismatch": 0, "mismatch_nonces": [], "p_value": 1.0, "fraud_detected": False,
                 "n_excluded": 1, "excluded_nonces": [5]}
    sender.enqueue(receiver.url, "generated", msgspec.convert(generated, GeneratedBody))
    sender.enqueue(receiver.url + "/", "validated", msgspec.convert(validated, ValidatedBody))
    wait_until(lambda: len(receiver.received) == 2, timeout_s=2.0)  # well before the stream interval
    assert {p: b for _, p, b in receiver.received} == {f"{BASE_PATH}/generated": generated,
                                                      f"{BASE_PATH}/validated": validated}
    wait_until(lambda: outbox_count(store) == 0)


def test_callbacks_receiver_down_then_up_delivers(make_sender, store):
    port = closed_port()
    url = f"http://127.0.0.1:{port}{BASE_PATH}"
    sender = make_sender(interval_s=0.1, max_backoff_s=0.2)
    sender.enqueue(url, "validated", Job("r"))
    sender.add_generated(url, batch(1))
    wait_until(lambda: sender.num_retries >= 4)
    receiver = Receiver(port)
    try:
        wait_until(lambda: len(receiver.received) == 2)
        assert sorted(p for _, p, _ in receiver.received) == [f"{BASE_PATH}/generated", f"{BASE_PATH}/validated"]
        wait_until(lambda: sender.backlog == 0 and outbox_count(store) == 0)
        assert (sender.num_delivered, sender.num_dropped) == (2, 0)
    finally:
        receiver.close()


@pytest.mark.parametrize("mode", ["500", "hang", "reset"])
def test_callbacks_failure_modes_retry_then_recover(receiver, make_sender, mode):
    receiver.mode, receiver.hang_s = mode, 1.0
    sender = make_sender(max_backoff_s=0.2, timeout_s=0.5)
    sender.enqueue(receiver.url, "generated", Job("r"))
    wait_until(lambda: sender.num_retries >= 1)
    receiver.mode = "ok"
    wait_until(lambda: sender.num_delivered == 1)
    # At least once: on a loaded machine an answer may come after the timeout and be sent again.
    bodies = receiver.bodies("/generated")
    assert bodies and all(b == {"request_id": "r"} for b in bodies)
    assert sender.num_dropped == 0


def test_callbacks_max_retries_drops_and_counts(receiver, make_sender, store):
    receiver.mode = "500"
    sender = make_sender(max_retries=3, max_backoff_s=0.05)
    sender.enqueue(receiver.url, "validated", Job("r"))
    wait_until(lambda: sender.num_dropped == 1)
    assert receiver.num_requests == 3
    assert (sender.num_retries, sender.num_delivered) == (2, 0)
    wait_until(lambda: outbox_count(store) == 0 and sender.backlog == 0)


def test_callbacks_outbox_cap_drops_oldest(receiver, make_sender, store):
    down = f"http://127.0.0.1:{closed_port()}{BASE_PATH}"
    first = make_sender(clock=frozen_clock())
    for i in range(5):
        first.enqueue(down, "generated", Job(f"r{i}"))
    wait_until(lambda: first.num_retries == 5)
    first.close()
    # The outbox now holds 5 rows; a sender capped at 3 keeps the newest 3.
    store.call(lambda c: c.execute("UPDATE outbox SET url = ?", (receiver.url,)))
    second = make_sender(max_job_rows=3)
    wait_until(lambda: second.num_delivered == 3)
    assert sorted(b["request_id"] for b in receiver.bodies()) == ["r2", "r3", "r4"]
    assert second.num_dropped == 2
    wait_until(lambda: outbox_count(store) == 0)


def test_callbacks_rows_survive_restart(receiver, tmp_path):
    path = tmp_path / "restart.db"
    down = f"http://127.0.0.1:{closed_port()}{BASE_PATH}"
    store = Store(path)
    sender = CallbackSender(store, interval_s=0.0, timeout_s=1.0, clock=frozen_clock())
    sender.enqueue(down, "validated", Job("r"))
    sender.add_generated(down, batch(5, 6))
    wait_until(lambda: sender.num_retries == 2)
    sender.close()
    store.close()

    store = Store(path)
    try:
        rows = store.call(lambda c: c.execute("SELECT kind, attempts FROM outbox ORDER BY id").fetchall())
        assert rows == [("job", 1), ("stream", 1)]
        store.call(lambda c: c.execute("UPDATE outbox SET url = ?", (receiver.url,)))  # the receiver is back
        sender = CallbackSender(store, interval_s=60.0, max_backoff_s=30.0, timeout_s=1.0)
        try:
            wait_until(lambda: sender.num_delivered == 2)  # at once: no interval or backoff wait after a restart
            assert receiver.bodies("/validated") == [{"request_id": "r"}]
            assert receiver.bodies("/generated") == [{**META, "artifacts": artifacts(5, 6), "encoding": ENCODING}]
            wait_until(lambda: outbox_count(store) == 0)
        finally:
            sender.close()
    finally:
        store.close()


def test_callbacks_flush_sends_now_and_returns_counts(receiver, make_sender, store):
    receiver.mode = "500"
    sender = make_sender(clock=frozen_clock())
    sender.enqueue(receiver.url, "validated", Job("r"))
    wait_until(lambda: sender.num_retries == 1)  # now waiting out its backoff (forever: the clock is frozen)
    receiver.mode = "ok"
    for i in range(3):
        sender.add_generated(receiver.url, batch(i))
    t0 = time.monotonic()
    assert sender.flush(5.0) == (4, 0)  # the rows just added are included, interval and backoff ignored
    assert time.monotonic() - t0 < 2.0
    assert receiver.bodies("/generated") == [{**META, "artifacts": artifacts(0, 1, 2), "encoding": ENCODING}]
    assert receiver.bodies("/validated") == [{"request_id": "r"}]


def test_callbacks_flush_keeps_undelivered_rows(make_sender, store):
    down = f"http://127.0.0.1:{closed_port()}{BASE_PATH}"
    sender = make_sender(interval_s=60.0, max_backoff_s=30.0)
    sender.add_generated(down, batch(1))
    sender.add_generated(down, batch(2))
    sender.enqueue(down, "validated", Job("r"))
    t0 = time.monotonic()
    assert sender.flush(3.0) == (0, 3)
    assert time.monotonic() - t0 < 2.0  # refused at once: no need to wait out the timeout
    assert sender.num_dropped == 0 and sender.backlog == 3
    assert outbox_count(store) == 3


def test_callbacks_flush_times_out_with_rows_remaining(receiver, make_sender, store):
    receiver.mode, receiver.hang_s = "hang", 1.5
    sender = make_sender(interval_s=60.0, timeout_s=1.0)
    sender.add_generated(receiver.url, batch(1))
    t0 = time.monotonic()
    assert sender.flush(0.3) == (0, 1)
    assert time.monotonic() - t0 < 0.8
    assert outbox_count(store) == 1
