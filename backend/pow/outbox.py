"""The callback outbox as the SQLite table holds it: one row per callback, and the store functions that read and write
rows (they run on the store's thread), and how rows group into one POST (`group_key`, `merged`). The sender
(callbacks.py) keeps the in-memory view and decides what to send.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from backend.pow.results import MinedBody
from backend.pow.store import execute_many

# Row kinds: one mining batch (merged with its group's before it is sent), or one /generate job's result.
STREAM = "stream"
JOB = "job"


@dataclass(slots=True)
class OutboxRow:
    id: int
    url: str
    path: str
    kind: str
    # A stream row's body is merged with its group's before it is sent; a job row's goes as it is (a row
    # loaded from the outbox keeps its stored JSON, unparsed).
    body: MinedBody | msgspec.Struct | msgspec.Raw
    attempts: int
    next_attempt_at: float
    created_at: float
    key: tuple = ()  # its group's, set when the dispatcher first sees it


def insert(row: OutboxRow) -> Callable[[sqlite3.Connection], OutboxRow]:
    def fn(conn: sqlite3.Connection) -> OutboxRow:
        cur = conn.execute(
            "INSERT INTO outbox (url, path, kind, payload, attempts, next_attempt_at, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.url, row.path, row.kind, msgspec.json.encode(row.body).decode(), row.attempts,
             row.next_attempt_at, row.created_at))
        assert cur.lastrowid is not None
        row.id = cur.lastrowid  # the row reaches the dispatcher only through on_done, after this
        return row
    return fn


def reschedule(rows: list[OutboxRow]) -> Callable[[sqlite3.Connection], None]:
    """Their attempt counts and next attempt times, as the sender set them after a failure."""
    return execute_many("UPDATE outbox SET attempts = ?, next_attempt_at = ? WHERE id = ?",
                        [(r.attempts, r.next_attempt_at, r.id) for r in rows])


def delete(ids: list[int]) -> Callable[[sqlite3.Connection], None]:
    return execute_many("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])


def select_all(conn: sqlite3.Connection) -> list[OutboxRow]:
    rows = conn.execute("SELECT id, url, path, kind, payload, attempts, next_attempt_at, created_at "
                        "FROM outbox ORDER BY id").fetchall()
    return [OutboxRow(i, url, path, kind, _stored_body(kind, payload), attempts, next_at, created_at)
            for i, url, path, kind, payload, attempts, next_at, created_at in rows]


def _stored_body(kind: str, payload: str) -> MinedBody | msgspec.Raw:
    if kind == STREAM:
        return msgspec.json.decode(payload, type=MinedBody)
    return msgspec.Raw(payload.encode())


def merged(bodies: list) -> MinedBody:
    """Stream rows of one group (the same node and encoding) as one body."""
    first = bodies[0]
    assert isinstance(first, MinedBody), "stream rows are mining batches"
    return msgspec.structs.replace(first, artifacts=[a for b in bodies for a in b.artifacts])


def num_artifacts(row: OutboxRow) -> int:
    assert isinstance(row.body, MinedBody), "stream rows are mining batches"
    return len(row.body.artifacts)


def group_key(row: OutboxRow) -> tuple:
    if row.kind == STREAM:
        return STREAM, row.url, row.path, _without_artifacts(row.body)
    return JOB, row.id


def _without_artifacts(body) -> bytes:
    assert isinstance(body, MinedBody), "stream rows are mining batches"
    return msgspec.json.encode(msgspec.structs.replace(body, artifacts=[]))
