"""The queue of /generate wait=false jobs and their results, kept in memory and written through to SQLite.

Used only from the engine thread. The in-memory state is authoritative; every change is also handed to the
`Store` (never awaited), and the store applies them in order, so the database always holds a prefix of the
history. On restart, `load()` brings back queued jobs in FIFO order, jobs that were running (their work was lost
with the process) as queued again, and finished results until their TTL.

Differences from the fork, on purpose: results expire by a timer (`prune_expired`, called from the loop), not only
when another job finishes; /stop (`cancel_queued`) cancels the jobs that have not started but lets running ones
finish (a validation in progress decides a vote; a late /stop must not throw it away), and keeps finished results
until their TTL.

The queue takes ownership of the request and result structs it is given: they are serialised later (msgspec JSON),
on the store's thread, so callers must not mutate them afterwards.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from backend.errors import RequestError, pow_error
from backend.pow.results import ArtifactsResult, JobResult
from backend.pow.store import Store, execute_many
from protocol.pow import PowGenerateRequest, ValidationOutcome

log = structlog.get_logger(__name__)

QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
_FINISHED = (COMPLETED, FAILED, CANCELLED)


class QueueFull(RequestError):
    """Accepting the job would put more nonces in the queue (queued + running) than the limit allows."""

    def __init__(self, queued: int, limit: int) -> None:
        error = pow_error(429, f"Queue full: {queued} nonces queued, limit is {limit}")
        super().__init__(error.message, status=error.status, type=error.type)
        self.queued = queued
        self.limit = limit


@dataclass(slots=True)
class Job:
    id: str
    status: str
    request: PowGenerateRequest
    num_nonces: int
    created_at: float
    result: JobResult | None = None
    error: str | None = None
    finished_at: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.status in _FINISHED


class GenerateQueue:
    """FIFO of queued jobs, the running ones, and finished results until `result_ttl_s` after they finished."""

    def __init__(self, store: Store, max_queued_nonces: int = 100000, result_ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self.max_queued_nonces = max_queued_nonces
        self.result_ttl_s = result_ttl_s
        # Wall clock, not monotonic: timestamps are persisted and compared across restarts.
        self._clock = clock
        self._jobs: dict[str, Job] = {}
        self._queued: OrderedDict[str, Job] = OrderedDict()
        self._running: dict[str, Job] = {}
        # Finished jobs in the order they finished, so pruning stops at the first one still fresh.
        self._finished: OrderedDict[str, Job] = OrderedDict()
        self._active_nonces = 0

    @property
    def queued_nonces(self) -> int:
        """Nonces of queued and running jobs: what the cap counts."""
        return self._active_nonces

    @property
    def num_queued(self) -> int:
        return len(self._queued)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def load(self) -> None:
        """Restores the persisted jobs (blocking; call once at startup, before anything is enqueued)."""
        if self._jobs:
            raise RuntimeError("GenerateQueue.load() after jobs were added")
        rows = self._store.call(_select_all)
        now = self._clock()
        requeued: list[str] = []
        expired: list[str] = []
        finished: list[Job] = []
        for row in rows:
            job = _job_from_row(row)
            if job.status == RUNNING:
                # Its work died with the previous process; run it again rather than lose it.
                job.status = QUEUED
                requeued.append(job.id)
            if job.status == QUEUED:
                self._jobs[job.id] = job
                self._queued[job.id] = job
                self._active_nonces += job.num_nonces
            elif self._is_expired(job, now):
                expired.append(job.id)
            else:
                self._jobs[job.id] = job
                finished.append(job)
        for job in sorted(finished, key=lambda j: j.finished_at or 0.0):
            self._finished[job.id] = job
        if requeued:
            self._store.submit(_set_status(requeued, QUEUED))
        if expired:
            self._store.submit(_delete(expired))
        log.info("jobs_loaded", num_queued=len(self._queued), num_requeued=len(requeued),
                 num_results=len(self._finished), num_expired=len(expired), queued_nonces=self._active_nonces)

    def enqueue(self, job_id: str, request: PowGenerateRequest, num_nonces: int,
                on_persisted: Callable[[BaseException | None], None] | None = None) -> Job:
        """Adds a queued job; raises QueueFull (429) past the cap.

        `on_persisted(None)` runs once the row is committed (or `on_persisted(error)` if the write failed), on
        the store's thread: answer the client from there, so an accepted job is never lost to a crash."""
        if self._active_nonces + num_nonces > self.max_queued_nonces:
            raise QueueFull(self._active_nonces, self.max_queued_nonces)
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} already exists")
        job = Job(id=job_id, status=QUEUED, request=request, num_nonces=num_nonces, created_at=self._clock())
        self._jobs[job_id] = job
        self._queued[job_id] = job
        self._active_nonces += num_nonces
        on_done = None
        if on_persisted is not None:
            def on_done(result: Any) -> None:
                on_persisted(result if isinstance(result, BaseException) else None)
        self._store.submit(_insert(job), on_done)
        return job

    def peek_next(self) -> Job | None:
        """The oldest queued job, or None."""
        return next(iter(self._queued.values()), None)

    def mark_running(self, job: Job) -> None:
        if job.status != QUEUED:
            raise RuntimeError(f"job {job.id} is {job.status}, not queued")
        del self._queued[job.id]
        self._running[job.id] = job
        job.status = RUNNING
        self._store.submit(_set_status([job.id], RUNNING))

    def complete(self, job: Job, result: JobResult) -> None:
        self._finish(job, COMPLETED, result, None)

    def fail(self, job: Job, error: str) -> None:
        self._finish(job, FAILED, None, error)

    def get(self, job_id: str) -> Job | None:
        """The job, or None if unknown or its result has expired (even if not pruned yet)."""
        job = self._jobs.get(job_id)
        if job is None or self._is_expired(job, self._clock()):
            return None
        return job

    def prune_expired(self, now: float | None = None) -> int:
        """Forgets finished jobs older than the TTL; returns how many. Call it on a timer."""
        now = self._clock() if now is None else now
        expired: list[str] = []
        for job in self._finished.values():
            if not self._is_expired(job, now):
                break
            expired.append(job.id)
        for job_id in expired:
            del self._finished[job_id]
            del self._jobs[job_id]
        if expired:
            self._store.submit(_delete(expired))
            log.info("job_results_expired", num_expired=len(expired), num_results=len(self._finished))
        return len(expired)

    def cancel_queued(self) -> int:
        """/stop: jobs that have not started become cancelled (kept until the TTL like any result); running ones
        go on. Returns how many were cancelled."""
        now = self._clock()
        cancelled = list(self._queued.values())
        for job in cancelled:
            job.status = CANCELLED
            job.finished_at = now
            self._finished[job.id] = job
            self._active_nonces -= job.num_nonces
        self._queued.clear()
        if cancelled:
            self._store.submit(_finish_rows([(CANCELLED, None, None, now, j.id) for j in cancelled]))
            log.info("jobs_cancelled", num_cancelled=len(cancelled))
        return len(cancelled)

    # --- internals ---

    def _finish(self, job: Job, status: str, result: JobResult | None, error: str | None) -> None:
        if self._jobs.get(job.id) is not job:
            log.warning("job_result_for_unknown_job", job_id=job.id, status=status)
            return
        if job.status not in (QUEUED, RUNNING):
            raise RuntimeError(f"job {job.id} already {job.status}")
        (self._queued if job.status == QUEUED else self._running).pop(job.id)
        self._active_nonces -= job.num_nonces
        job.status, job.result, job.error, job.finished_at = status, result, error, self._clock()
        self._finished[job.id] = job
        self._store.submit(_finish_rows([(status, result, error, job.finished_at, job.id)]))

    def _is_expired(self, job: Job, now: float) -> bool:
        return job.is_finished and job.finished_at is not None and now - job.finished_at > self.result_ttl_s


# --- store functions (run on the store's thread; they capture values, never a live Job) ---

def _insert(job: Job) -> Callable[[sqlite3.Connection], None]:
    values = (job.id, job.status, job.request, job.num_nonces, job.created_at)

    def fn(conn: sqlite3.Connection) -> None:
        job_id, status, request, num_nonces, created_at = values
        conn.execute("INSERT INTO jobs (id, status, request, num_nonces, created_at) VALUES (?, ?, ?, ?, ?)",
                     (job_id, status, msgspec.json.encode(request).decode(), num_nonces, created_at))
    return fn


def _set_status(job_ids: list[str], status: str) -> Callable[[sqlite3.Connection], None]:
    return execute_many("UPDATE jobs SET status = ? WHERE id = ?", [(status, i) for i in job_ids])


def _finish_rows(rows: list[tuple[str, JobResult | None, str | None, float, str]]) -> Callable[[sqlite3.Connection],
                                                                                                  None]:
    # The results are encoded on the store's thread, not the caller's (the engine thread).
    def fn(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "UPDATE jobs SET status = ?, result = ?, error = ?, finished_at = ? WHERE id = ?",
            [(s, None if r is None else msgspec.json.encode(r).decode(), e, t, i) for s, r, e, t, i in rows])
    return fn


def _delete(job_ids: list[str]) -> Callable[[sqlite3.Connection], None]:
    return execute_many("DELETE FROM jobs WHERE id = ?", [(i,) for i in job_ids])


def _select_all(conn: sqlite3.Connection) -> list[tuple]:
    # rowid breaks ties between jobs created within one clock tick, keeping FIFO order.
    return conn.execute("SELECT id, status, request, result, error, num_nonces, created_at, finished_at "
                        "FROM jobs ORDER BY created_at, rowid").fetchall()


def _job_from_row(row: tuple) -> Job:
    job_id, status, request, result, error, num_nonces, created_at, finished_at = row
    msg = msgspec.json.decode(request, type=PowGenerateRequest)
    return Job(id=job_id, status=status, request=msg, num_nonces=num_nonces, created_at=created_at,
               result=None if result is None else _decode_result(result, msg), error=error, finished_at=finished_at)


def _decode_result(text: str, msg: PowGenerateRequest) -> JobResult:
    """Which of the two result types a row holds, its request says."""
    if msg.validation is None:
        return msgspec.json.decode(text, type=ArtifactsResult)
    return msgspec.json.decode(text, type=ValidationOutcome)
