"""The callback outbox and its sender: durable POSTs of artifacts and job results to the node's receiver.

Every callback is first a row in the SQLite `outbox` (through the `Store`); a row is deleted only once the receiver
acknowledged it (status < 400) or it was dropped (retries spent, or a cap), and the drop is counted. A restart
resends what was not acknowledged; /stop flushes instead of discarding (the fork dropped both).

Two caps, as the fork's: job rows beyond `max_job_rows` (POC_CALLBACK_QUEUE_SIZE, which in the fork bounds the
/generate callback queue only) and mining artifacts beyond `max_artifacts` (POC_CALLBACK_MAX_ARTIFACTS, the fork's
bound on its /generated buffer). Either way the oldest rows not in flight go first, whole rows: a mining row is
one batch, stored and merged as one.

Rows are sent in groups. "stream" rows (one mining batch each) with the same url, meta and encoding form one group,
merged into one POST `{url}/generated` at most every `interval_s` (the first no earlier than `interval_s` after the
first row). A "job" row (one /generate job's result, to `{url}/{path}`) is a group of its own, due at once. After
a failure a group waits 1, 2, 4 … s (capped at `max_backoff_s`) by the highest attempt count among its rows, so
new artifacts arriving during an outage do not speed the retries up.

Threads: callers (the engine thread) only submit inserts to the store, which never blocks. The store hands each
committed row to the dispatcher thread, the only owner of the in-memory view (`_rows`, `_groups`); POSTs run on a
pool of `max_concurrent` threads and report back through the same inbox.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import structlog

from backend.pow import outbox
from backend.pow.outbox import JOB, STREAM, OutboxRow, group_key, merged, num_artifacts
from backend.pow.results import MinedBody
from backend.pow.store import Store, StoreError
from protocol.common import CallbackStats

log = structlog.get_logger(__name__)

# Bounds one merged body after a long outage; the rest goes in the next POST.
_MAX_ROWS_PER_POST = 1000
# The dispatcher re-checks at least this often (new rows and POST results wake it anyway).
_MAX_WAIT_S = 0.5


@dataclass(slots=True)
class _Group:
    key: tuple
    gate_at: float  # no POST before this: the interval after a success, the backoff after a failure
    rows: dict[int, OutboxRow] = field(default_factory=dict)
    is_in_flight: bool = False


@dataclass(slots=True)
class _Result:
    group: _Group
    rows: list[OutboxRow]
    status: int | None
    error: Exception | None


@dataclass
class _Flush:
    """One flush() call: the rows present when the dispatcher saw it, each resolved by its next attempt."""

    deadline: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: set[int] = field(default_factory=set)
    is_started: bool = False
    num_delivered: int = 0
    num_failed_kept: int = 0


class CallbackSender:
    """Delivers outbox rows with retries; the counters are plain ints, readable from any thread."""

    def __init__(self, store: Store, *, interval_s: float = 5.0, max_retries: int = 10, max_backoff_s: float = 30.0,
                 timeout_s: float = 10.0, max_job_rows: int = 10000, max_artifacts: int = 1000000,
                 max_concurrent: int = 10,
                 post: Callable[[str, bytes], int] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self.interval_s = interval_s
        self.max_retries = max_retries
        self.max_backoff_s = max_backoff_s
        self.max_job_rows = max_job_rows
        self.max_artifacts = max_artifacts
        self.max_concurrent = max_concurrent
        self._clock = clock  # wall clock: next_attempt_at is persisted
        # What a previous process left undelivered (blocking: this runs once, at startup).
        loaded = store.call(outbox.select_all)
        self._client: httpx.Client | None = None
        if post is None:
            limits = httpx.Limits(max_connections=max_concurrent, max_keepalive_connections=max_concurrent)
            self._client = httpx.Client(timeout=timeout_s, limits=limits)
            post = self._http_post
        self._post = post
        # Rows delivered / dropped (cap or retries) / failed and rescheduled; rows waiting.
        self.num_delivered = self.num_dropped = self.num_retries = 0
        self.backlog = len(loaded)
        self._inbox: queue.SimpleQueue[OutboxRow | _Result | _Flush | None] = queue.SimpleQueue()
        self._rows: dict[int, OutboxRow] = {}  # insertion order is age order: the caps drop from the front
        # Job rows and the artifacts of stream rows in `_rows`: what the two caps count.
        self._num_job_rows = self._num_artifacts = 0
        self._groups: dict[tuple, _Group] = {}
        self._flushes: list[_Flush] = []
        self._num_in_flight = 0
        self._memory_ids = itertools.count(-1, -1)  # rows the store failed to persist are still sent
        self._is_closed = False
        self._stop_deadline: float | None = None
        self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix="pocserve-callback-post")
        self._thread = threading.Thread(target=self._run, args=(loaded,), name="pocserve-callbacks", daemon=True)
        self._thread.start()

    # --- any thread ---

    def add_generated(self, url: str, batch: MinedBody) -> None:
        """One mining batch for the streamed `{url}/generated` callback; never blocks."""
        self._add(url, "generated", STREAM, batch)

    def enqueue(self, url: str, path: str, body: msgspec.Struct) -> None:
        """One per-job callback to `{url}/{path}`; never blocks. The sender owns `body` from now on."""
        self._add(url, path, JOB, body)

    def stats(self) -> CallbackStats:
        """The sender's counters (its thread writes them; a reader sees each one whole)."""
        return CallbackStats(num_delivered=self.num_delivered, num_dropped=self.num_dropped,
                             num_retries=self.num_retries, backlog=self.backlog)

    def flush(self, timeout_s: float) -> tuple[int, int]:
        """Attempts every row once now, ignoring interval and backoff; waits up to `timeout_s`.

        Returns (delivered, remaining). Remaining rows stay in the outbox and keep retrying."""
        if self._is_closed:
            return 0, self.backlog
        deadline = time.monotonic() + timeout_s
        try:
            # A barrier: rows submitted before this call are committed and in the inbox once it returns.
            self._store.call(lambda conn: None, timeout_s=timeout_s)
        except (TimeoutError, StoreError) as e:
            log.warning("callback_flush_barrier_failed", error=repr(e))
        request = _Flush(deadline=deadline)
        self._inbox.put(request)
        request.done.wait(max(0.0, deadline - time.monotonic()))
        with request.lock:
            if not request.is_started:
                return 0, self.backlog
            return request.num_delivered, len(request.pending) + request.num_failed_kept

    def close(self, timeout_s: float = 2.0) -> None:
        """Stops sending; waits up to `timeout_s` for POSTs in flight. Unsent rows stay for the next start."""
        if self._is_closed:
            return
        self._is_closed = True
        self._stop_deadline = time.monotonic() + timeout_s
        self._inbox.put(None)
        self._thread.join(timeout_s + 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
        log.info("callback_sender_closed", backlog=self.backlog, num_delivered=self.num_delivered,
                 num_dropped=self.num_dropped)

    def _add(self, url: str, path: str, kind: str, body: msgspec.Struct) -> None:
        now = self._clock()
        row = OutboxRow(0, url, path, kind, body, 0, now, now)

        def on_done(result: Any) -> None:
            if isinstance(result, BaseException):
                # Not durable, but still worth sending: dropping it now would lose computed work for sure.
                row.id = next(self._memory_ids)
                log.error("callback_not_persisted", url=url, kind=kind, error=repr(result))
            self._inbox.put(row)

        self._store.submit(outbox.insert(row), on_done)

    def _http_post(self, url: str, body: bytes) -> int:
        assert self._client is not None, "the default poster is the HTTP client's"
        return self._client.post(url, content=body, headers={"content-type": "application/json"}).status_code

    def _post_group(self, group: _Group, rows: list[OutboxRow]) -> None:  # pool thread
        first = rows[0]
        if first.kind == STREAM:  # one POST for the group: its rows differ only in their artifacts
            body = msgspec.json.encode(merged([r.body for r in rows]))
        else:
            body = msgspec.json.encode(first.body)
        try:
            self._inbox.put(_Result(group, rows, self._post(f"{first.url.rstrip('/')}/{first.path}", body), None))
        except Exception as e:  # any transport failure is a failed attempt, retried with backoff
            self._inbox.put(_Result(group, rows, None, e))

    # --- dispatcher thread ---

    def _run(self, loaded: list[OutboxRow]) -> None:
        now = self._clock()
        for row in loaded:
            self._add_row(row, gate_at=now)  # a restart resends everything at once
        if loaded:
            log.info("callback_outbox_loaded", num_rows=len(loaded))
        while self._stop_deadline is None:
            try:
                self._drain(self._wait_s())
                if self._stop_deadline is None:
                    self._enforce_cap()
                    self._dispatch()
                    self._flushes = [f for f in self._flushes
                                     if not f.done.is_set() and time.monotonic() < f.deadline]
            except Exception:  # a bug here must not silently stop every callback: logged, the loop goes on
                log.exception("callback_dispatch_failed")
                time.sleep(_MAX_WAIT_S)
            self.backlog = len(self._rows)
        # Closing: collect the answers to POSTs in flight, so acknowledged rows are deleted, not resent.
        while self._num_in_flight > 0 and (left := self._stop_deadline - time.monotonic()) > 0:
            self._drain(left)
        self.backlog = len(self._rows)

    def _drain(self, timeout_s: float) -> None:
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return
        while True:
            match item:
                case OutboxRow():
                    self._add_row(item)
                case _Result():
                    self._on_result(item)
                case _Flush():
                    self._start_flush(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _wait_s(self) -> float:
        if self._num_in_flight >= self.max_concurrent:
            return _MAX_WAIT_S  # only an answer frees a slot, and answers wake us
        now = self._clock()
        gates = (g.gate_at for g in self._groups.values() if not g.is_in_flight)
        return max(0.0, min(min(gates, default=now + _MAX_WAIT_S), now + _MAX_WAIT_S) - now)

    def _add_row(self, row: OutboxRow, gate_at: float | None = None) -> None:
        self._rows[row.id] = row
        self._count(row, 1)
        row.key = group_key(row)
        group = self._groups.get(row.key)
        if group is None:
            if gate_at is None:
                gate_at = row.created_at + self.interval_s if row.kind == STREAM else row.next_attempt_at
            group = self._groups[row.key] = _Group(row.key, gate_at)
        group.rows[row.id] = row

    def _dispatch(self) -> None:
        now = self._clock()
        forced = set().union(*(f.pending for f in self._flushes))
        for group in list(self._groups.values()):
            if self._num_in_flight >= self.max_concurrent:
                return
            if group.is_in_flight:
                continue
            rows = group.rows.values() if group.gate_at <= now else [r for r in group.rows.values() if r.id in forced]
            rows = list(itertools.islice(rows, _MAX_ROWS_PER_POST))
            if rows:
                group.is_in_flight = True
                self._num_in_flight += 1
                self._pool.submit(self._post_group, group, rows)

    def _on_result(self, result: _Result) -> None:
        group, rows = result.group, result.rows
        group.is_in_flight = False
        self._num_in_flight -= 1
        now = self._clock()
        if result.error is None and result.status is not None and result.status < 400:
            group.gate_at = now + self.interval_s
            self._resolve_flushes(rows, is_ok=True)
            self._remove(rows)
            self.num_delivered += len(rows)
            log.debug("callback_delivered", url=rows[0].url, kind=rows[0].kind, num_rows=len(rows))
            return
        reason = repr(result.error) if result.error is not None else f"status {result.status}"
        for row in rows:
            row.attempts += 1
        dropped = [r for r in rows if r.attempts >= self.max_retries]
        retried = [r for r in rows if r.attempts < self.max_retries]
        self._resolve_flushes(retried, is_ok=False)
        group.gate_at = now + self.interval_s  # all dropped: the next rows wait an interval, as after a success
        if retried:
            attempts = max(r.attempts for r in retried)
            group.gate_at = now + min(2.0 ** (attempts - 1), self.max_backoff_s)
            for row in retried:
                row.next_attempt_at = group.gate_at
            self.num_retries += len(retried)
            self._store.submit(outbox.reschedule(retried))
            log.warning("callback_failed", url=rows[0].url, kind=rows[0].kind, num_rows=len(retried),
                        attempts=attempts, retry_in_s=round(group.gate_at - now, 3), reason=reason)
        if dropped:
            self._drop(dropped, "callback_dropped", reason=reason, attempts=self.max_retries)

    def _enforce_cap(self) -> None:
        excess = self._num_job_rows - self.max_job_rows
        if excess > 0:
            idle = (r for r in self._idle() if r.kind == JOB)
            victims = list(itertools.islice(idle, excess))
            if victims:
                self._drop(victims, "callback_outbox_full", max_job_rows=self.max_job_rows)
        excess = self._num_artifacts - self.max_artifacts
        if excess > 0:
            victims = []
            for row in self._idle():
                if excess <= 0:
                    break
                if row.kind == STREAM:
                    victims.append(row)
                    excess -= num_artifacts(row)
            if victims:
                self._drop(victims, "callback_artifacts_full", max_artifacts=self.max_artifacts,
                           num_artifacts=sum(num_artifacts(r) for r in victims))

    def _idle(self):
        """Rows no POST holds now, oldest first: the ones a cap may drop."""
        return (r for r in self._rows.values() if not self._groups[r.key].is_in_flight)

    def _count(self, row: OutboxRow, sign: int) -> None:
        if row.kind == STREAM:
            self._num_artifacts += sign * num_artifacts(row)
        else:
            self._num_job_rows += sign

    def _drop(self, rows: list[OutboxRow], event: str, **fields: Any) -> None:
        ids = {r.id for r in rows}
        for f in self._flushes:
            with f.lock:
                f.pending -= ids
                if not f.pending:
                    f.done.set()
        self._remove(rows)
        self.num_dropped += len(rows)
        log.error(event, url=rows[0].url, kind=rows[0].kind, num_rows=len(rows), num_dropped=self.num_dropped,
                  **fields)

    def _remove(self, rows: list[OutboxRow]) -> None:
        """Forgets rows here and deletes them from the file (they were delivered or dropped)."""
        for row in rows:
            del self._rows[row.id]
            self._count(row, -1)
            group = self._groups[row.key]
            del group.rows[row.id]
            if not group.rows and not group.is_in_flight:
                del self._groups[row.key]
        stored = [r.id for r in rows if r.id > 0]
        if stored:
            self._store.submit(outbox.delete(stored))

    def _start_flush(self, request: _Flush) -> None:
        with request.lock:
            request.pending = set(self._rows)
            request.is_started = True
        if request.pending:
            self._flushes.append(request)
        else:
            request.done.set()

    def _resolve_flushes(self, rows: list[OutboxRow], *, is_ok: bool) -> None:
        for f in self._flushes:
            with f.lock:
                for row in rows:
                    if row.id in f.pending:
                        f.pending.remove(row.id)
                        if is_ok:
                            f.num_delivered += 1
                        else:
                            f.num_failed_kept += 1
                if not f.pending:
                    f.done.set()

