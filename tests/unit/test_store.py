"""Store: WAL mode, schema, ordered writes on one thread, completion callbacks, clear errors for bad files."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from backend.pow.store import SCHEMA_VERSION, Store, StoreError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_store_opens_in_wal_mode_with_normal_sync(store):
    assert store.call(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    # synchronous is per connection: check the writer's own connection (1 = NORMAL).
    assert store.call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 1


def test_store_creates_schema_with_version(store, tmp_path):
    def columns(table):
        return store.call(lambda c: [r[1] for r in c.execute(f"PRAGMA table_info({table})")])

    assert columns("jobs") == ["id", "status", "request", "result", "error", "num_nonces", "created_at",
                               "finished_at"]
    assert columns("outbox") == ["id", "url", "path", "kind", "payload", "attempts", "next_attempt_at",
                                 "created_at"]
    assert store.call(lambda c: c.execute("SELECT version FROM schema_version").fetchall()) == [(SCHEMA_VERSION,)]


def test_store_reopen_keeps_data_and_single_version_row(tmp_path):
    path = tmp_path / "state.db"
    s = Store(path)
    s.call(lambda c: c.execute("INSERT INTO jobs (id, status, request, num_nonces, created_at) "
                               "VALUES ('a', 'queued', '{}', 1, 0)"))
    s.close()
    s = Store(path)
    try:
        assert s.call(lambda c: c.execute("SELECT id FROM jobs").fetchall()) == [("a",)]
        assert s.call(lambda c: c.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0]) == 1
    finally:
        s.close()


def test_store_submit_runs_in_order_on_one_thread(store):
    store.call(lambda c: c.execute("CREATE TABLE t (i INTEGER)"))
    threads = []
    for i in range(500):
        store.submit(lambda c, i=i: (threads.append(threading.current_thread()),
                                     c.execute("INSERT INTO t VALUES (?)", (i,))))
    assert store.call(lambda c: [r[0] for r in c.execute("SELECT i FROM t ORDER BY rowid")]) == list(range(500))
    assert len(set(threads)) == 1 and threads[0] is not threading.current_thread()


def test_store_on_done_gets_result_after_commit(store, tmp_path):
    done = threading.Event()
    seen = []

    def on_done(result):
        # Committed: a second connection already sees the row.
        other = sqlite3.connect(tmp_path / "state.db")
        seen.append((result, other.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]))
        other.close()
        done.set()

    store.submit(lambda c: c.execute("INSERT INTO outbox (url, path, kind, payload, attempts, next_attempt_at, "
                                     "created_at) VALUES ('u', 'p', 'job', '{}', 0, 0, 0)").lastrowid, on_done)
    assert done.wait(5)
    assert seen == [(1, 1)]


def test_store_on_done_gets_exception_and_rolls_back_only_that_function(store):
    results = []
    done = threading.Event()
    store.call(lambda c: c.execute("CREATE TABLE t (i INTEGER)"))

    def bad(c):
        c.execute("INSERT INTO t VALUES (99)")
        raise ValueError("boom")

    store.submit(lambda c: c.execute("INSERT INTO t VALUES (1)"))
    store.submit(bad, lambda r: (results.append(r), done.set()))
    store.submit(lambda c: c.execute("INSERT INTO t VALUES (2)"))
    assert done.wait(5)
    assert isinstance(results[0], ValueError)
    assert store.call(lambda c: [r[0] for r in c.execute("SELECT i FROM t ORDER BY rowid")]) == [1, 2]
    assert store.num_failed == 1


def test_store_call_raises_the_functions_exception(store):
    with pytest.raises(sqlite3.OperationalError):
        store.call(lambda c: c.execute("SELECT * FROM no_such_table"))


def test_store_close_drains_pending_writes(tmp_path):
    path = tmp_path / "state.db"
    s = Store(path)
    s.call(lambda c: c.execute("CREATE TABLE t (i INTEGER)"))
    for i in range(1000):
        s.submit(lambda c, i=i: c.execute("INSERT INTO t VALUES (?)", (i,)))
    s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1000
    conn.close()
    with pytest.raises(StoreError, match="closed"):
        s.submit(lambda c: None)


def test_store_garbage_file_raises_store_error_naming_path(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite at all \x00\xff" * 200)
    with pytest.raises(StoreError, match="corrupt or not an SQLite database") as e:
        Store(path)
    assert str(path) in str(e.value)


def test_store_locked_new_file_raises_store_error_naming_path(tmp_path):
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE x (i INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked") as e:
            Store(path, busy_timeout_s=0.1)
        assert str(path) in str(e.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_store_locked_wal_file_raises_store_error(tmp_path):
    path = tmp_path / "state.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked"):
            Store(path, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_store_newer_schema_version_refused(tmp_path):
    path = tmp_path / "state.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)
