"""Chat requests on the engine thread: who owns each one, its trip through the processor process, admission to
the engine, aborts, the PoC gate, and where engine outputs go.

A request's life: GenerateRequest → `preparing` (the processor tokenizes it) → Prepared → `owners` (in the
engine) → its last output (or an abort). The processor sends the deltas to the frontend itself; this table only
tracks what the engine runs, so that aborts (by the frontend, a lost frontend, the PoC gate) find it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from backend.engine import EngineApi
from backend.errors import BackendError, RequestError, RequestFailed, gate_error
from backend.processor import PreparedRequests
from backend.transport.peers import FrontendLost
from protocol.common import ErrorInfo
from protocol.generate import AbortRequest, GenerateErrorReply, GenerateRequest
from protocol.processor import (
    ForgetRequest,
    PrepareFailed,
    PrepareRequest,
    ProcessorReady,
    StopStringsHit,
    TokenizeJob,
)
from protocol.tokenize import DetokenizeReply, DetokenizeRequest, TokenizeReply, TokenizeRequest

log = structlog.get_logger(__name__)

# What the streams of a frontend the io thread gave up on end with (if it was only stalled, it reads this).
FRONTEND_LOST_ERROR = RequestError("frontend timed out", status=503).info()
_NOT_READY_ERROR = RequestError("the backend is still starting", status=503)


@dataclass
class Owner:
    identity: bytes
    rid: str
    # vLLM's ids of the engine requests (one per choice); empty while the processor prepares it.
    internal_ids: list[str]


class ChatRequests:
    """The chat request table; engine thread only. `send(identity, msg)` queues a message for a frontend,
    `to_processor(msg)` sends one to the processor."""

    def __init__(self, engine: EngineApi, send: Callable[[bytes, object], None],
                 to_processor: Callable[[object], None], *, on_ready: Callable[[], None] = lambda: None) -> None:
        self._engine = engine
        self._send = send
        self._to_processor = to_processor
        self._on_ready = on_ready
        self.is_ready = False
        # True while a mining round holds the engine in exclusive mode: chat answers the fork's 503 (`gate_error`).
        self.is_gated = False
        # engine request id ("<frontend identity hex>-<rid>", vLLM's external id) → owner.
        self.preparing: dict[str, Owner] = {}
        self.owners: dict[str, Owner] = {}
        self._by_internal: dict[str, str] = {}
        self.num_aborted = 0

    def handlers(self) -> dict[type, Callable]:
        return {GenerateRequest: self.on_generate, AbortRequest: self.on_abort, FrontendLost: self.on_frontend_lost,
                PreparedRequests: self.on_prepared, PrepareFailed: self.on_prepare_failed,
                StopStringsHit: self.on_stop_strings, ProcessorReady: self.on_processor_ready,
                TokenizeRequest: self.on_tokenize, DetokenizeRequest: self.on_tokenize}

    def has_work(self) -> bool:
        return self._engine.has_work()

    def is_preparing(self) -> bool:
        """Requests are on their way to the engine (the processor is tokenizing them)."""
        return bool(self.preparing)

    # --- the PoC gate (exclusive mode) ---

    def gate(self, reason: ErrorInfo) -> int:
        """Gate on, then abort everything in flight (in that order, so nothing slips in); returns how many."""
        self.is_gated = True
        try:
            return self.abort([*self.owners, *self.preparing], reason)
        except Exception:
            self.is_gated = False
            raise

    def ungate(self) -> None:
        self.is_gated = False

    # --- engine outputs ---

    def route(self, outputs) -> None:
        """One step's EngineCoreOutputs (or None): finished requests leave the table, the outputs go to the
        processor, which turns them into deltas for the frontends and counts the scheduler's stats (a step
        without outputs, a chunk of a long prefill, still has prefix-cache queries)."""
        if outputs is None or not (outputs.outputs or outputs.scheduler_stats is not None):
            return
        for out in outputs.outputs:
            if out.finish_reason is not None:
                self._finished(out.request_id)
        self._to_processor(outputs)

    def _finished(self, internal_id: str) -> None:
        engine_rid = self._by_internal.pop(internal_id, None)
        owner = self.owners.get(engine_rid) if engine_rid is not None else None
        if engine_rid is not None and owner is not None:
            owner.internal_ids.remove(internal_id)
            if not owner.internal_ids:
                del self.owners[engine_rid]

    # --- aborts ---

    def abort(self, engine_rids: list[str], reason: ErrorInfo | None = None) -> int:
        """The one abort path: drops the owners, aborts in the engine, tells the processor, counts; sends `reason`
        to each frontend. A request still being prepared is only forgotten: its Prepared finds no owner."""
        owned = [(r, self.owners.pop(r)) for r in engine_rids if r in self.owners]
        internal_ids = [i for _, owner in owned for i in owner.internal_ids]
        for i in internal_ids:
            self._by_internal.pop(i, None)
        self._engine.abort(internal_ids)
        owned += [(r, self.preparing.pop(r)) for r in engine_rids if r in self.preparing]
        if not owned:
            return 0
        self.num_aborted += len(owned)
        self._to_processor(ForgetRequest(engine_rids=[r for r, _ in owned]))
        if reason is not None:
            for _, owner in owned:
                self._send(owner.identity, GenerateErrorReply(rid=owner.rid, error=reason))
        return len(owned)

    # --- handlers: state changes only, no engine steps ---

    def on_generate(self, identity: bytes, msg: GenerateRequest) -> None:
        engine_rid = f"{identity.hex()}-{msg.rid}"
        if engine_rid in self.owners or engine_rid in self.preparing:
            self._refuse(identity, msg.rid, RequestError(f"request id {msg.rid!r} is already in use", param="rid"))
        elif self.is_gated:
            self._refuse(identity, msg.rid, gate_error())
        elif not self.is_ready:
            self._refuse(identity, msg.rid, _NOT_READY_ERROR)
        else:
            self.preparing[engine_rid] = Owner(identity, msg.rid, [])
            self._to_processor(PrepareRequest(engine_rid=engine_rid, identity=identity, request=msg))

    def on_prepared(self, _identity: bytes, item: PreparedRequests) -> None:
        engine_rid = item.header.engine_rid
        owner = self.preparing.pop(engine_rid, None)
        if owner is None:  # aborted while the processor prepared it
            self._to_processor(ForgetRequest(engine_rids=[engine_rid]))
            return
        if self.is_gated:
            self._to_processor(ForgetRequest(engine_rids=[engine_rid]))
            self._refuse(owner.identity, owner.rid, gate_error())
            return
        added: list[str] = []
        try:
            for request in item.requests:
                self._engine.add(request)
                added.append(request.request_id)
        except Exception as e:  # one request failed to enter the engine; the loop goes on
            log.exception("request_add_failed", rid=owner.rid)
            self._engine.abort(added)
            self._to_processor(ForgetRequest(engine_rids=[engine_rid]))
            self._refuse(owner.identity, owner.rid, RequestFailed(f"internal error: {e}"))
            return
        owner.internal_ids = added
        self.owners[engine_rid] = owner
        for internal_id in added:
            self._by_internal[internal_id] = engine_rid

    def on_prepare_failed(self, _identity: bytes, msg: PrepareFailed) -> None:
        owner = self.preparing.pop(msg.engine_rid, None)
        if owner is not None:
            self._send(owner.identity, GenerateErrorReply(rid=owner.rid, error=msg.error))

    def on_stop_strings(self, _identity: bytes, msg: StopStringsHit) -> None:
        """The processor sent these choices' final deltas already: stop them in the engine, no reply (the other
        choices of the same request run on)."""
        internal_ids = [i for i in msg.internal_ids if i in self._by_internal]
        for internal_id in internal_ids:
            self._finished(internal_id)
        self._engine.abort(internal_ids)

    def on_tokenize(self, identity: bytes, msg: TokenizeRequest | DetokenizeRequest) -> None:
        """/tokenize and /detokenize: the processor holds the tokenizer and answers the frontend itself."""
        if not self.is_ready:
            error = _NOT_READY_ERROR.info()
            reply = TokenizeReply if isinstance(msg, TokenizeRequest) else DetokenizeReply
            self._send(identity, reply(rid=msg.rid, error=error))
            return
        self._to_processor(TokenizeJob(identity=identity, request=msg))

    def on_abort(self, identity: bytes, msg: AbortRequest) -> None:
        if num := self.abort([f"{identity.hex()}-{rid}" for rid in msg.rids]):
            log.info("requests_aborted", num=num)

    def on_frontend_lost(self, identity: bytes, msg: FrontendLost) -> None:
        # Nobody reads these streams any more (or, if the frontend was only stalled, they end with a 503).
        mine = [r for table in (self.owners, self.preparing) for r, o in table.items() if o.identity == identity]
        num = self.abort(mine, FRONTEND_LOST_ERROR)
        # Probes and test clients go silent by design; only a frontend or a peer that had work is news.
        level = log.info if msg.frontend_id or num else log.debug
        level("frontend_lost", identity=identity.decode("ascii", "backslashreplace"), frontend_id=msg.frontend_id,
              silent_s=round(msg.silent_s, 2), num_aborted=num)

    def on_processor_ready(self, _identity: bytes, msg: ProcessorReady) -> None:
        log.info("processor_connected", pid=msg.pid)
        self.is_ready = True
        self._on_ready()

    def _refuse(self, identity: bytes, rid: str, error: BackendError) -> None:
        self._send(identity, GenerateErrorReply(rid=rid, error=error.info()))
