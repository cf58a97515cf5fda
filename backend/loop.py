"""The engine thread's loop: ingest → choose → execute → route. The only code that calls the engine."""

from __future__ import annotations

import queue
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import structlog

from backend import policy
from backend.artifact_queue import ArtifactQueue, ArtifactTask
from backend.control import ControlPlane
from backend.engine.poc import ArtifactJob
from backend.errors import POC_GATE_MESSAGE, RequestError
from backend.ipc import SocketServer
from backend.peers import FrontendLost
from protocol.common import BackendStats, ErrorInfo
from poc.errors import PocInputError
from protocol.control import ErrorReply
from protocol.generate import AbortRequest, Delta, DeltasEvent, GenerateErrorReply, GenerateRequest
from protocol.poc import PocArtifactsReply, PocArtifactsRequest
from protocol.pow import PowGenerateRequest, PowInitRequest, PowJobRequest, PowStatusRequest, PowStopRequest

log = structlog.get_logger(__name__)

_IDLE_WAIT_S = 0.1
# Stats are published at most this often while busy (and on every idle wake-up).
_PUBLISH_INTERVAL_S = 0.05
# Expired job results are pruned on this timer (not only when another job finishes).
_PRUNE_INTERVAL_S = 5.0
# What the streams of a frontend the io thread gave up on end with (if it was only stalled, it reads this).
FRONTEND_LOST_ERROR = RequestError("frontend timed out", status=503).info()
# Requests with more text than this are tokenized on the `prepare` thread. The tokenizer takes ~1.3 s per MB
# here (a 10 MB prompt: 14 s), and on the engine thread every stream would wait for it; 64k characters take
# about 0.1 s. The size check before tokenizing (Vocab.check_fits) still bounds what that thread is given.
INLINE_TEXT_CHARS = 64 * 1024


@dataclass
class PreparedRequest:
    """Inbox item from the prepare thread: a long request, tokenized (`result`) or refused (an exception)."""

    engine_rid: str
    msg: GenerateRequest
    result: object


def text_chars(msg: GenerateRequest) -> int:
    """Characters the tokenizer will read for this request."""
    n = len(msg.prompt or "") + len(msg.sampling.enforced_str or "")
    return n + sum(len(m.content) for m in msg.messages or ())


class BackendLoop:
    """Owns the request → frontend routing table; engine, server and inbox are passed in."""

    def __init__(self, engine, server: SocketServer, inbox: queue.Queue, control: ControlPlane, *,
                 poc_batches_per_step: int = 1) -> None:
        self.engine = engine
        self.server = server
        self.inbox = inbox
        self.control = control
        self.is_running = True
        # engine request id → (frontend identity, frontend request id)
        self.owners: dict[str, tuple[bytes, str]] = {}
        # The same, for long requests being tokenized on the prepare thread (not in the engine yet).
        self.preparing: dict[str, tuple[bytes, str]] = {}
        # One thread: the tokenizer is shared, and one long prompt at a time is plenty for two cores.
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare")
        self.num_steps = 0
        self.num_aborted = 0
        self.num_handler_errors = 0
        self._published_at = 0.0
        self.artifacts = ArtifactQueue(engine.poc)
        self.poc_batches_per_step = poc_batches_per_step
        self.num_poc_since_step = 0
        self._pruned_at = time.monotonic()
        self.pow = None
        self.handlers = {GenerateRequest: self._on_generate, AbortRequest: self._on_abort,
                         PocArtifactsRequest: self._on_poc_artifacts, FrontendLost: self._on_frontend_lost,
                         PreparedRequest: self._on_prepared}

    def use_pow(self, pow_service) -> None:
        """Attaches the PoC API service (it needs this loop's abort_all_chat, so it comes second)."""
        self.pow = pow_service
        self.handlers.update({PowInitRequest: pow_service.on_init, PowGenerateRequest: pow_service.on_generate,
                              PowJobRequest: pow_service.on_job, PowStatusRequest: pow_service.on_status,
                              PowStopRequest: pow_service.on_stop})

    def run(self) -> None:
        while self.is_running:
            self.ingest(block=not (self.engine.has_work() or self.artifacts or self._pow_pending()))
            if self.pow is not None:
                self.pow.feed()
            self.execute(policy.choose(self.snapshot()))
            self.publish()
            self.on_timer()
        self._preparer.shutdown(wait=False, cancel_futures=True)

    def _pow_pending(self) -> bool:
        return self.pow is not None and self.pow.has_pending()

    def on_timer(self) -> None:
        now = time.monotonic()
        if self.pow is not None and now - self._pruned_at >= _PRUNE_INTERVAL_S:
            self._pruned_at = now
            self.pow.jobs.prune_expired()

    def abort_all_chat(self, reason: ErrorInfo) -> int:
        """Aborts every generation in flight; their frontends get `reason` as the error reply."""
        return self._abort([*self.owners, *self.preparing], reason)

    def _abort(self, engine_rids: list[str], reason: ErrorInfo | None = None) -> int:
        """The one abort path: drops the owners, aborts in the engine, counts; sends `reason` to each frontend.
        A request still being prepared is only forgotten: its PreparedRequest finds no owner and is dropped."""
        owned = [(r, self.owners.pop(r)) for r in engine_rids if r in self.owners]
        if owned:
            self.engine.abort([r for r, _ in owned])
        owned += [(r, self.preparing.pop(r)) for r in engine_rids if r in self.preparing]
        self.num_aborted += len(owned)
        if reason is not None:
            for _, (identity, rid) in owned:
                self.server.send(identity, GenerateErrorReply(rid=rid, error=reason))
        return len(owned)

    def snapshot(self) -> policy.Snapshot:
        return policy.Snapshot(
            has_engine_work=self.engine.has_work(), has_poc_work=len(self.artifacts) > 0,
            num_poc_since_step=self.num_poc_since_step, poc_batches_per_step=self.poc_batches_per_step,
            is_poc_blocked=self.artifacts.is_blocked)

    def ingest(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=_IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, identity: bytes, msg) -> None:
        handler = self.handlers.get(type(msg))
        try:
            if handler is None:
                raise TypeError(f"no handler for {type(msg).__name__}")
            handler(identity, msg)
        except Exception as e:
            # A handler bug fails that one message, not the engine; an engine fault shows at its next step.
            self.num_handler_errors += 1
            log.exception("handler_failed", message=type(msg).__name__)
            self.server.send(identity, ErrorReply(rid=getattr(msg, "rid", None), error=ErrorInfo(
                status=500, message=f"{type(msg).__name__} failed: {e}", type="InternalServerError")))

    def execute(self, work: policy.Work) -> None:
        match work:
            case policy.EngineStep():
                self.route(self.engine.step())
                self.num_steps += 1
                self.num_poc_since_step = 0
                self.artifacts.unblock()
            case policy.PocBatch():
                self.artifacts.run_batch()
                self.num_poc_since_step += 1
            case policy.Idle():
                pass

    def route(self, deltas: list[tuple[str, Delta]]) -> None:
        """One DeltasEvent per frontend per step."""
        by_frontend: dict[bytes, list[Delta]] = defaultdict(list)
        for engine_rid, delta in deltas:
            owner = self.owners.get(engine_rid)
            if owner is None:
                continue
            identity, rid = owner
            delta.rid = rid
            by_frontend[identity].append(delta)
            if delta.finish_reason is not None:
                del self.owners[engine_rid]
        for identity, batch in by_frontend.items():
            self.server.send(identity, DeltasEvent(deltas=batch))

    def publish(self) -> None:
        now = time.monotonic()
        if now - self._published_at >= _PUBLISH_INTERVAL_S:
            self._published_at = now
            self.control.publish(self.stats())

    def stats(self) -> BackendStats:
        """The engine's side of the stats; the io thread fills in the connection side per pong."""
        rec = self.engine.stats
        running, waiting, kv_usage = self.engine.load()
        return BackendStats(
            instance_id=self.control.instance_id, uptime_s=0.0, num_frontends=0, num_running=running,
            num_waiting=waiting, kv_cache_usage=kv_usage, num_engine_steps=self.num_steps,
            num_prompt_tokens=rec.num_prompt_tokens, num_generation_tokens=rec.num_generation_tokens,
            num_finished_requests=rec.num_finished, num_aborted_requests=self.num_aborted,
            num_rejected_frames=0,
            iteration_tokens_bounds=[float(b) for b in rec.bounds],
            iteration_tokens_counts=list(rec.iteration_counts), iteration_tokens_sum=float(rec.iteration_sum),
            iteration_tokens_count=rec.iteration_count, inbox_depth=self.inbox.qsize(),
            **(self.pow.stats() if self.pow is not None else {}),
        )

    # --- handlers: state changes only, no engine steps ---

    def _on_generate(self, identity: bytes, msg: GenerateRequest) -> None:
        engine_rid = f"{identity.hex()}-{msg.rid}"
        if engine_rid in self.owners or engine_rid in self.preparing:
            error = RequestError(f"request id {msg.rid!r} is already in use", param="rid")
            self.server.send(identity, GenerateErrorReply(rid=msg.rid, error=error.info()))
        elif text_chars(msg) > INLINE_TEXT_CHARS and not self._is_gating_chat():
            self.preparing[engine_rid] = (identity, msg.rid)
            self._preparer.submit(self._prepare, engine_rid, identity, msg)
        else:
            self._admit(engine_rid, identity, msg, None)

    def _prepare(self, engine_rid: str, identity: bytes, msg: GenerateRequest) -> None:
        """On the prepare thread: tokenizes, then hands the outcome to the engine thread through the inbox."""
        try:
            result = self.engine.prepare(msg)
        except Exception as e:  # reported by _admit on the engine thread, like an inline failure
            result = e
        self.inbox.put((identity, PreparedRequest(engine_rid, msg, result)))

    def _on_prepared(self, identity: bytes, ev: PreparedRequest) -> None:
        if self.preparing.pop(ev.engine_rid, None) is not None:  # else aborted meanwhile: nobody waits
            self._admit(ev.engine_rid, identity, ev.msg, ev.result)

    def _is_gating_chat(self) -> bool:
        return self.pow is not None and self.pow.is_gating_chat

    def _admit(self, engine_rid: str, identity: bytes, msg: GenerateRequest, prepared) -> None:
        """Adds the request to the engine (`prepared`: its prepare thread's outcome, None: prepare it here)."""
        try:
            if self._is_gating_chat():
                raise RequestError(POC_GATE_MESSAGE, status=503, type="service_unavailable")
            if isinstance(prepared, Exception):
                raise prepared
            self.engine.add(engine_rid, msg, prepared)
        except RequestError as e:
            self.server.send(identity, GenerateErrorReply(rid=msg.rid, error=e.info()))
            return
        except Exception as e:  # one request failed before reaching the engine; the loop goes on
            log.exception("request_add_failed", rid=msg.rid)
            info = ErrorInfo(status=500, message=f"internal error: {e}", type="InternalServerError")
            self.server.send(identity, GenerateErrorReply(rid=msg.rid, error=info))
            return
        self.owners[engine_rid] = (identity, msg.rid)

    def _on_abort(self, identity: bytes, msg: AbortRequest) -> None:
        if num := self._abort([f"{identity.hex()}-{rid}" for rid in msg.rids]):
            log.info("requests_aborted", num=num)

    def _on_frontend_lost(self, identity: bytes, msg: FrontendLost) -> None:
        # Nobody reads these streams any more (or, if the frontend was only stalled, they end with a 503).
        mine = [r for table in (self.owners, self.preparing) for r, (owner, _) in table.items() if owner == identity]
        num = self._abort(mine, FRONTEND_LOST_ERROR)
        # Probes and test clients go silent by design; only a frontend or a peer that had work is news.
        level = log.info if msg.frontend_id or num else log.debug
        level("frontend_lost", identity=identity.decode("ascii", "backslashreplace"), frontend_id=msg.frontend_id,
              silent_s=round(msg.silent_s, 2), num_aborted=num)

    def _on_poc_artifacts(self, identity: bytes, msg: PocArtifactsRequest) -> None:
        def done(artifacts, error) -> None:
            self.server.send(identity, PocArtifactsReply(rid=msg.rid, artifacts=artifacts, error=error))

        job = ArtifactJob(block_hash=msg.block_hash, public_key=msg.public_key, nonces=tuple(msg.nonces),
                          seq_len=msg.seq_len, k_dim=msg.k_dim, stronger_rng=msg.stronger_rng)
        try:
            self.artifacts.submit(ArtifactTask(job=job, done=done))
        except PocInputError as e:
            done([], ErrorInfo(status=400, message=e.message, param=e.field, type="BadRequestError"))
