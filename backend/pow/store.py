"""The backend's SQLite database: one writer thread owning the only connection, fed functions through a queue.

Whatever must survive a restart (queued /generate jobs, their results, the callback outbox) goes through here.
Callers never touch the connection: they hand a function `fn(conn)` to `submit` (fire and forget, with an
optional completion callback) or to `call` (wait for the result; for startup and tests). Functions run in
submission order, so writes from one thread land in the order they were made.

Consecutive functions are grouped into one transaction (each in its own savepoint, so one failure rolls back only
its own writes) and completion callbacks run after the commit: a callback seeing success means the write is
durable (WAL + synchronous=NORMAL: durable across a process crash; a power cut may lose the last commits).
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        request TEXT NOT NULL,
        result TEXT,
        error TEXT,
        num_nonces INTEGER NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL
    )""",
    """CREATE TABLE IF NOT EXISTS outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        url TEXT NOT NULL,
        path TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at REAL NOT NULL,
        created_at REAL NOT NULL
    )""",
)

# Functions grouped into one transaction at most: bounds the latency of the first callback in a burst.
_MAX_BATCH = 256


DB_NAME = "pocserve.db"


def open_store(state_dir: Path) -> Store:
    """The backend's database in `state_dir` (created if missing); StoreError if it cannot be used."""
    state_dir.mkdir(parents=True, exist_ok=True)
    return Store(state_dir / DB_NAME)


class StoreError(Exception):
    """The database cannot be opened or used (locked, corrupt, not SQLite, closed); the message names the path."""


@dataclass(slots=True)
class _Op:
    fn: Callable[[sqlite3.Connection], Any]
    on_done: Callable[[Any], None] | None


class Store:
    """Owns the SQLite file at `path` and the one thread that reads and writes it."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.num_failed = 0  # functions that raised (or whose commit failed); read from other threads
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._is_closed = False
        opened: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(opened, busy_timeout_s), name="pocserve-store",
                                        daemon=True)
        self._thread.start()
        try:
            opened.result()
        except StoreError:
            self._thread.join()
            raise

    def submit(self, fn: Callable[[sqlite3.Connection], Any],
               on_done: Callable[[Any], None] | None = None) -> None:
        """Queues `fn(conn)`; never blocks. `on_done(result or exception)` runs on the writer thread after the
        commit, so it must only hand work over (put in a queue, set a flag), never block."""
        if self._is_closed:
            raise StoreError(f"store {self.path} is closed")
        self._ops.put(_Op(fn, on_done))

    def call(self, fn: Callable[[sqlite3.Connection], T], timeout_s: float | None = None) -> T:
        """Runs `fn(conn)` on the writer thread and returns its result (or raises its exception)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("Store.call from the writer thread would deadlock")
        future: Future[T] = Future()

        def done(result: Any) -> None:
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.submit(fn, done)
        return future.result(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Runs what was submitted before (up to `timeout_s`), then stops the thread and closes the file."""
        if self._is_closed:
            return
        self._is_closed = True
        self._ops.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("store_close_timed_out", path=str(self.path), num_pending=self._ops.qsize())
            return
        # A submit racing close() may have queued behind the sentinel: fail it rather than leave a caller waiting.
        while True:
            try:
                op = self._ops.get_nowait()
            except queue.Empty:
                break
            if op is not None:
                self._finish(op, StoreError(f"store {self.path} is closed"))

    # --- writer thread ---

    def _run(self, opened: Future[None], busy_timeout_s: float) -> None:
        try:
            conn = open_database(self.path, busy_timeout_s)
        except StoreError as e:
            opened.set_exception(e)
            return
        opened.set_result(None)
        log.info("store_opened", path=str(self.path))
        try:
            is_running = True
            while is_running:
                batch: list[_Op] = []
                op = self._ops.get()
                while op is not None:  # None: close() asked to stop, after what was submitted before it
                    batch.append(op)
                    if len(batch) == _MAX_BATCH:
                        break
                    try:
                        op = self._ops.get_nowait()
                    except queue.Empty:
                        break
                is_running = op is not None
                if batch:
                    self._run_batch(conn, batch)
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Op]) -> None:
        results: list[Any] = []
        try:
            conn.execute("BEGIN")
            for op in batch:
                conn.execute("SAVEPOINT op")
                try:
                    results.append(op.fn(conn))
                except Exception as e:  # reported to on_done (or logged); the other functions still commit
                    conn.execute("ROLLBACK TO op")
                    results.append(e)
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            # The transaction itself failed (disk full, I/O error): nothing in the batch is durable.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("store_commit_failed", path=str(self.path), error=str(e), num_ops=len(batch))
            results = [e] * len(batch)
        for op, result in zip(batch, results, strict=False):
            self._finish(op, result)

    def _finish(self, op: _Op, result: Any) -> None:
        if isinstance(result, BaseException):
            self.num_failed += 1
            if op.on_done is None:
                log.error("store_write_failed", path=str(self.path), error=repr(result),
                          num_failed=self.num_failed)
        if op.on_done is None:
            return
        try:
            op.on_done(result)
        except Exception:  # a broken callback must not stop the writer; logged with its stack
            log.exception("store_on_done_failed", path=str(self.path))


def execute_many(sql: str, params: list[tuple]) -> Callable[[sqlite3.Connection], None]:
    """A store function (for `Store.submit`) running one statement over every parameter row."""
    def fn(conn: sqlite3.Connection) -> None:
        conn.executemany(sql, params)
    return fn


def open_database(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """Opens (creating if needed) the database in WAL mode with the current schema; StoreError names the path."""
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=True)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open store {path}: {e}") from e
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"store {path}: cannot switch to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=NORMAL")
        # IMMEDIATE takes the write lock now, so a database held by another writer fails here, at startup.
        conn.execute("BEGIN IMMEDIATE")
        _ensure_schema(conn, path)
        conn.execute("COMMIT")
    except sqlite3.Error as e:
        conn.close()
        raise StoreError(_explain(path, e)) from e
    except StoreError:
        conn.close()
        raise
    return conn


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    version = row[0]
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(f"store {path} has schema version {version}, newer than this build's {SCHEMA_VERSION}")
    for statement in _SCHEMA:
        conn.execute(statement)
    if version is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))


def _explain(path: Path, e: sqlite3.Error) -> str:
    text = str(e)
    if "locked" in text or "busy" in text:
        return f"store {path} is locked by another connection or process: {text}"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return f"store {path} is corrupt or not an SQLite database: {text}"
    return f"cannot open store {path}: {text}"
