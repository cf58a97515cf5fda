"""The Gonka PoC API's decisions, in the engine thread: mining round, gating, generate jobs, callbacks.

Handlers change state and reply; `feed()` keeps the artifact queue supplied between engine steps, and the loop
runs its batches (`run_batch`). Jobs (/generate) run beside a mining round, before its batches (unlike the fork,
where they waited for /stop): a validation has a deadline (artifact_queue.py says how the device is shared).
The queue (SQLite) and the callback sender (its own thread) are passed in; nothing here blocks on I/O except
/stop's bounded flush, which runs on a short-lived thread of its own.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from backend.errors import RequestError, gate_error, pow_error
from backend.pow.artifact_queue import MINING, ArtifactQueue, ArtifactTask, ChunkTimeout
from backend.pow.callbacks import CallbackSender
from backend.pow.jobs import GenerateQueue, Job, QueueFull
from backend.pow.results import MinedBody, callback_body, echo, job_result, job_view
from backend.pow.store import Store
from backend.startup.settings import BackendSettings
from poc.errors import PocInputError
from poc.manager import MiningRound, RoundSpec
from poc.nonces import check_node
from poc.spec import ArtifactJob, PocSpec
from protocol.common import ErrorInfo, PocStats
from protocol.poc import Artifact, PocArtifactsReply, PocArtifactsRequest
from protocol.pow import (
    PowGenerateRequest,
    PowInitRequest,
    PowJobReply,
    PowJobRequest,
    PowParams,
    PowStatusReply,
    PowStatusRequest,
    PowStopRequest,
    RoundConfig,
    RoundStats,
)

log = structlog.get_logger(__name__)

# Queued jobs in the artifact queue at once (taken in FIFO order, then run round-robin): the rest stay queued.
MAX_RUNNING_JOBS = 4
# A round's batches kept in the artifact queue: one for the forward running and one for the forward launched behind
# it (--poc-forwards-in-flight).
MINING_QUEUED = 2


@dataclass
class _WaitingCall:
    """A /generate wait=true request: answered directly, never persisted."""

    identity: bytes
    msg: PowGenerateRequest
    work: ArtifactJob  # built and checked when the request came


class PowService:
    def __init__(self, *, artifacts: ArtifactQueue, jobs: GenerateQueue, callbacks, send: Callable, chat,
                 model_names: list[str], mode: str, default_batch_size: int,
                 stop_flush_timeout_s: float = 5.0, chunk_timeout_s: float | None = None) -> None:
        self.artifacts = artifacts
        self.jobs = jobs
        self.callbacks = callbacks
        self._send = send
        # The chat request table: gated (and its requests aborted) while an exclusive-mode round mines.
        self._chat = chat
        self.model_names = model_names
        self.mode = mode
        self.default_batch_size = default_batch_size
        self.stop_flush_timeout_s = stop_flush_timeout_s
        # POC_GENERATE_CHUNK_TIMEOUT_SEC: how long a /generate job's next chunk may wait (None: as long as it takes).
        self.chunk_timeout_s = chunk_timeout_s
        self.round: MiningRound | None = None
        self._num_mining_queued = 0  # the round's batches in the artifact queue
        # Persisted jobs now in the artifact queue (wait=true calls go there at once and are not counted).
        self._num_running_jobs = 0
        self._waiting: deque[_WaitingCall] = deque()
        # The work of each persisted job this process accepted (built and checked then) until it goes to the artifact
        # queue; a job loaded from the store after a restart is not here and is checked again against this engine.
        self._accepted: dict[str, ArtifactJob] = {}
        self.num_validations = 0
        self.num_nonces = 0

    def handlers(self) -> dict[type, Callable]:
        return {PowInitRequest: self.on_init, PowGenerateRequest: self.on_generate, PowJobRequest: self.on_job,
                PowStatusRequest: self.on_status, PowStopRequest: self.on_stop,
                PocArtifactsRequest: self.on_artifacts}

    # --- the loop's view (the loop runs the artifact queue's batches itself) ---

    def has_work(self) -> bool:
        """Batches queued, or work that feed() could turn into batches."""
        return len(self.artifacts) > 0 or self.has_pending()

    def on_timer(self) -> None:
        self.jobs.prune_expired()
        self.artifacts.expire()

    # --- handlers ---

    def on_init(self, identity: bytes, msg: PowInitRequest) -> None:
        reply = PowStatusReply(rid=msg.rid)
        try:
            self._check_params(msg.params)
            _check_node(msg.node.node_id, msg.node.node_count, msg.group_id, msg.n_groups)
            if self.round is not None:
                raise pow_error(409, "Already generating")
            spec = RoundSpec(msg.node, PocSpec.of(msg.node, msg.params, msg.stronger_rng), msg.group_id,
                             msg.n_groups, msg.batch_size or self.default_batch_size, msg.url)
            self._start_round(spec)
            reply.status, reply.config, reply.stats = self._status()
        except RequestError as e:
            reply.error = e.info()
        self._send(identity, reply)

    def on_generate(self, identity: bytes, msg: PowGenerateRequest) -> None:
        try:
            self._check_params(msg.params)
            work = self._checked_job(msg)
        except RequestError as e:
            self._send(identity, PowJobReply(rid=msg.rid, error=e.info()))
            return
        if msg.wait:
            self._waiting.append(_WaitingCall(identity, msg, work))
            return
        job_id = str(uuid.uuid4())

        def persisted(error: BaseException | None) -> None:
            # Answered only once the job is on disk: an accepted job survives a crash.
            if error is not None:
                info = pow_error(503, f"could not persist the job: {error}").info()
                self._send(identity, PowJobReply(rid=msg.rid, error=info))
            else:
                self._send(identity, PowJobReply(rid=msg.rid, job=job_view(job_id, "queued",
                                                                           num_queued=len(msg.nonces))))

        try:
            self.jobs.enqueue(job_id, msg, len(msg.nonces), on_persisted=persisted)
        except QueueFull as e:
            self._send(identity, PowJobReply(rid=msg.rid, error=e.info()))
            return
        self._accepted[job_id] = work

    def on_job(self, identity: bytes, msg: PowJobRequest) -> None:
        job = self.jobs.get(msg.job_id)
        if job is None:
            error = pow_error(404, f"Request {msg.job_id} not found").info()
            self._send(identity, PowJobReply(rid=msg.rid, error=error))
            return
        self._send(identity, PowJobReply(rid=msg.rid, job=job_view(job.id, job.status, job.result, job.error)))

    def on_artifacts(self, identity: bytes, msg: PocArtifactsRequest) -> None:
        """Artifacts for explicit nonces, between engine steps (the direct API: no round, no callbacks)."""
        def done(artifacts, error) -> None:
            self._send(identity, PocArtifactsReply(rid=msg.rid, artifacts=artifacts, error=error))

        spec = PocSpec(msg.block_hash, msg.public_key, msg.seq_len, msg.k_dim, msg.stronger_rng)
        job = ArtifactJob(spec, tuple(msg.nonces))
        try:
            self.artifacts.check(job)
        except PocInputError as e:
            done([], RequestError(e.message, param=e.field).info())
            return
        self.artifacts.submit(ArtifactTask(job=job, done=done))

    def on_status(self, identity: bytes, msg: PowStatusRequest) -> None:
        status, config, stats = self._status()
        self._send(identity, PowStatusReply(rid=msg.rid, status=status, config=config, stats=stats))

    def on_stop(self, identity: bytes, msg: PowStopRequest) -> None:
        was = self.round
        self.round = None
        self._chat.ungate()
        self.artifacts.discard(lambda task: task.tag == MINING)
        self._num_mining_queued = 0
        num_cancelled = self.jobs.cancel_queued()
        self._accepted.clear()  # every job not yet fed was queued, and is cancelled now
        if was is not None:
            log.info("poc_round_stopped", total_processed=was.total_processed, num_artifacts=was.num_artifacts,
                     num_jobs_cancelled=num_cancelled)

        def flush() -> None:
            delivered, remaining = self.callbacks.flush(self.stop_flush_timeout_s)
            log.info("poc_stop_flushed", num_delivered=delivered, num_remaining=remaining)
            self._send(identity, PowStatusReply(rid=msg.rid, status="STOPPED"))

        threading.Thread(target=flush, name="pow-stop-flush", daemon=True).start()

    # --- loop hooks ---

    def stats(self) -> PocStats:
        return PocStats(is_mining=self.round is not None, num_nonces=self.num_nonces,
                        num_validations=self.num_validations, num_queued_job_nonces=self.jobs.queued_nonces)

    def has_pending(self) -> bool:
        """Work that feed() could turn into artifact tasks."""
        return (bool(self._waiting) or (self.round is not None and self._num_mining_queued < MINING_QUEUED)
                or (self._num_running_jobs < MAX_RUNNING_JOBS and self.jobs.peek_next() is not None))

    def feed(self) -> None:
        """Jobs go to the artifact queue as they come, beside a round's next batch (the queue runs jobs first)."""
        while self._waiting:
            call = self._waiting.popleft()
            self._submit_job(call.msg, call.work, self._answer_to(call), job=None)
        while self._num_running_jobs < MAX_RUNNING_JOBS and (job := self.jobs.peek_next()) is not None:
            self.jobs.mark_running(job)
            work = self._accepted.pop(job.id, None)
            if work is None:  # loaded from the store: accepted by an engine that may have had other limits
                try:
                    work = self._checked_job(job.request)
                except RequestError as e:
                    log.error("poc_job_refused_after_restart", job_id=job.id, error=e.message)
                    self.jobs.fail(job, e.message)
                    continue
            self._num_running_jobs += 1
            self._submit_job(job.request, work, None, job=job)
        while self.round is not None and self._num_mining_queued < MINING_QUEUED:
            self._submit_mining_batch()

    def _answer_to(self, call: _WaitingCall) -> Callable:
        def answer(view, error) -> None:
            self._send(call.identity, PowJobReply(rid=call.msg.rid, job=view, error=error))
        return answer

    # --- internals ---

    def _check_params(self, params: PowParams) -> None:
        if params.model not in self.model_names:
            raise pow_error(409, f"params mismatch: requested model {params.model!r}, deployed {self.model_names}",
                            param="params.model")

    def _checked_job(self, msg: PowGenerateRequest) -> ArtifactJob:
        """The request's work, checked against this engine (RequestError naming the field otherwise)."""
        _check_node(msg.node.node_id, msg.node.node_count)
        if msg.validation is not None and {a.nonce for a in msg.validation} != set(msg.nonces):
            raise pow_error(400, "validation.artifacts nonces must match nonces field", param="validation.artifacts")
        work = ArtifactJob(PocSpec.of(msg.node, msg.params, msg.stronger_rng), tuple(msg.nonces))
        try:
            self.artifacts.check(work)
        except PocInputError as e:
            raise pow_error(400, e.message, param=_param_path(e.field)) from e
        return work

    def _start_round(self, spec: RoundSpec) -> None:
        try:
            self.artifacts.check(ArtifactJob(spec.poc, (0,)))
        except PocInputError as e:
            raise pow_error(400, e.message, param=_param_path(e.field)) from e
        # Each mining batch is materialised as a list of nonces: a client's batch_size of billions would exhaust
        # memory. One forward takes at most max_batch nonces anyway, so taking more per batch gains nothing.
        spec = replace(spec, batch_size=min(spec.batch_size, self.artifacts.max_batch(spec.poc.seq_len)))
        mining = MiningRound(spec)
        if self.mode == "exclusive":
            # Gate on (no new chat), abort what is in flight, then start; a failure turns the gate off again.
            num_aborted = self._chat.gate(gate_error().info())
            log.info("chat_gated_for_poc", num_aborted=num_aborted)
        self.round = mining
        log.info("poc_round_started", block_height=spec.node.block_height, node_id=spec.node.node_id,
                 batch_size=spec.batch_size, seq_len=spec.poc.seq_len, mode=self.mode)

    def _status(self) -> tuple[str, RoundConfig | None, RoundStats | None]:
        r = self.round
        if r is None:
            return "IDLE", None, None
        s = r.spec
        config = RoundConfig(node=s.node, group_id=s.group_id, n_groups=s.n_groups, seq_len=s.poc.seq_len,
                             k_dim=s.poc.k_dim)
        return "GENERATING", config, RoundStats(total_processed=r.total_processed,
                                                nonces_per_second=r.nonces_per_second)

    def _submit_mining_batch(self) -> None:
        r = self.round
        assert r is not None, "fed only while a round is active"
        s = r.spec
        nonces = r.next_batch()

        def done(artifacts: list[Artifact], error: ErrorInfo | None) -> None:
            self._num_mining_queued -= 1
            if self.round is not r:
                return  # stopped meanwhile
            if error is not None:
                log.warning("poc_mining_batch_failed", error=error.message)
                return
            r.record(len(nonces), len(artifacts))
            self.num_nonces += len(nonces)
            if s.url and artifacts:
                batch = MinedBody(artifacts=artifacts, encoding=s.poc.encoding, **echo(s.node))
                self.callbacks.add_generated(s.url, batch)

        self.artifacts.submit(ArtifactTask(job=ArtifactJob(s.poc, tuple(nonces)), done=done, tag=MINING))
        self._num_mining_queued += 1

    def _submit_job(self, msg: PowGenerateRequest, work: ArtifactJob, answer, job: Job | None) -> None:
        def done(artifacts: list[Artifact], error: ErrorInfo | None) -> None:
            if job is not None:
                self._num_running_jobs -= 1
            self.num_nonces += len(msg.nonces)
            result, error = job_result(msg, artifacts, error)
            if msg.validation is not None and error is None:
                self.num_validations += 1
            if job is not None:
                if result is None:
                    message = error.message if error is not None else "no result"
                    log.error("poc_job_failed", job_id=job.id, error=message)
                    self.jobs.fail(job, message)
                    return
                if msg.url:  # the callback first: a crash in between re-runs the job instead of losing it
                    self.callbacks.enqueue(msg.url, *callback_body(job.id, msg, result))
                self.jobs.complete(job, result)
                return
            # wait=true answers carry a fresh request id that is not stored (as in the fork).
            answer(None if error else job_view(str(uuid.uuid4()), "completed", result), error)

        timeout = None
        if self.chunk_timeout_s is not None:
            timeout = ChunkTimeout(self.chunk_timeout_s, msg.batch_size or self.default_batch_size,
                                   _job_timeout if job is not None else _wait_timeout)
        self.artifacts.submit(ArtifactTask(job=work, done=done, tag="job", timeout=timeout))


def _check_node(node_id: int, node_count: int, group_id: int = 0, n_groups: int = 1) -> None:
    try:
        check_node(node_id, node_count, group_id, n_groups)
    except PocInputError as e:
        raise pow_error(400, f"{e.field} {e.message}", param=e.field) from e


# The fork's texts for a chunk that waited POC_GENERATE_CHUNK_TIMEOUT_SEC: a queued job fails with the first (its
# queue worker's), a wait=true request answers 503 with the second (its route's).
def _job_timeout(chunk: int, waited_s: float) -> ErrorInfo:
    return pow_error(503, f"Timeout waiting for engine: chunk {chunk}").info()


def _wait_timeout(chunk: int, waited_s: float) -> ErrorInfo:
    return pow_error(503, f"Timeout after {waited_s:.1f}s").info()


def _param_path(field: str) -> str:
    return f"params.{field}" if field in ("seq_len", "k_dim") else field


def build_pow_service(settings: BackendSettings, artifacts: ArtifactQueue, chat, send: Callable, store: Store,
                      model_names: list[str]) -> PowService:
    """The PoC API with its queue and callback sender, restored from the store (queued jobs, undelivered
    callbacks)."""
    jobs = GenerateQueue(store, max_queued_nonces=settings.max_queued_nonces, result_ttl_s=settings.result_ttl_s)
    jobs.load()
    callbacks = CallbackSender(store, interval_s=settings.callback_interval_s,
                               max_retries=settings.callback_max_retries, max_job_rows=settings.callback_queue_size,
                               max_artifacts=settings.callback_max_artifacts,
                               max_concurrent=settings.callback_max_concurrent)
    log.info("pow_state_loaded", num_queued_jobs=jobs.num_queued, num_undelivered_callbacks=callbacks.backlog)
    return PowService(artifacts=artifacts, jobs=jobs, callbacks=callbacks, send=send, chat=chat,
                      model_names=model_names, mode=settings.scheduling_mode,
                      default_batch_size=settings.batch_size_default,
                      stop_flush_timeout_s=settings.stop_flush_timeout_s,
                      chunk_timeout_s=settings.generate_chunk_timeout_s)
