"""The engine thread's loop: ingest → choose → execute → route. The only code that steps the engine."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import structlog

from backend.core import policy
from backend.core.chat import ChatRequests
from backend.core.share import ChatShare
from backend.engine import EngineApi
from backend.errors import RequestFailed
from backend.pow.artifact_queue import ArtifactQueue
from backend.pow.service import PowService
from backend.transport.control import ControlPlane
from protocol.common import EngineStats
from protocol.control import ErrorReply

log = structlog.get_logger(__name__)

_IDLE_WAIT_S = 0.1
# With a PoC forward running beside chat and nothing else to do, the loop checks on it this often.
_POLL_S = 0.001
# Host time the engine thread spends queueing a PoC forward's layers between two chat steps: below an H100 decode
# step (2-3 ms), so that the step queued ahead (async scheduling) keeps chat's GPU busy meanwhile.
POC_LAUNCH_SLICE_S = 0.0015
# After chat's last request ends the loop counts chat as running this much longer: a client's next request (the
# next turn of a conversation, a stream restarted) usually comes within it, and a PoC forward started as for an
# idle engine (up to IDLE_FORWARD_S on the CPU engine, a whole forward on every SM of a GPU) would hold it back.
# PoC gives up at most this much per quiet spell.
CHAT_LINGER_S = 0.1
# Stats are published at most this often while busy (and on every idle wake-up).
_PUBLISH_INTERVAL_S = 0.05
# Timers (expired job results, the processor's liveness) run at most this often.
_TIMER_INTERVAL_S = 0.5


class BackendLoop:
    """Every collaborator comes in the constructor; each says whether it has work, and owns its messages."""

    def __init__(self, engine: EngineApi, inbox: queue.Queue, control: ControlPlane, *, chat: ChatRequests,
                 pow: PowService, artifacts: ArtifactQueue, send: Callable, share: ChatShare,
                 timers: tuple[Callable[[], None], ...] = ()) -> None:
        self.engine = engine
        self.inbox = inbox
        self.control = control
        self.chat = chat
        self.pow = pow
        # PoC's batches, run by this loop between engine steps; the PoC API (pow) feeds it.
        self.artifacts = artifacts
        self._send = send
        self._timers = timers
        self.is_running = True
        self.num_steps = 0
        self.share = share
        self._published_at = 0.0
        self._timers_at = time.monotonic()
        self._chat_seen_at = float("-inf")  # chat has not run yet
        self.handlers: dict[type, Callable] = {**chat.handlers(), **pow.handlers()}

    def run(self) -> None:
        while self.is_running:
            self.run_once()

    def run_once(self) -> None:
        if self.engine.poc.overlaps:
            self.run_once_overlapped()
            return
        # A forward in flight is finished even once its task is gone (a /stop): its blocks stay leased until then.
        self.ingest(block=not (self.chat.has_work() or self.pow.has_work() or self.artifacts.is_in_flight))
        self.pow.feed()
        if self._has_poc_work():
            self.execute(policy.choose(self.snapshot()))
        else:
            self.linger_s()  # keeps when chat last ran, which the snapshot's linger and quiet read once PoC comes
            self.execute(policy.without_poc(self.chat.has_work()))
        self.publish()
        self.on_timer()

    def run_once_overlapped(self) -> None:
        """PoC forwards run beside engine steps: launch one (and the next behind it), step chat meanwhile, collect
        each when it is done."""
        in_flight = self.artifacts.is_in_flight
        can_act = self.chat.has_work() or (self.pow.has_work() and (not in_flight or self.artifacts.has_slot))
        self.ingest(block=not can_act, timeout_s=_POLL_S if in_flight else _IDLE_WAIT_S)
        # A forward launched in chat's linger goes beside chat (PoC's SMs, slices): the next request is coming. Not
        # while chat is gated (an exclusive round): none can come.
        is_chat_running = self.linger_s() > 0 and not self.chat.is_gated
        budget_s = POC_LAUNCH_SLICE_S if is_chat_running else float("inf")
        if in_flight:
            # Nothing can arrive for PoC to make room for while chat is gated (an exclusive round).
            self.artifacts.poll_batch(wait=self.chat.is_gated and not is_chat_running, budget_s=budget_s,
                                      is_chat_running=is_chat_running)
        self.pow.feed()
        if self._has_poc_work():
            work = policy.choose_overlapped(self.snapshot())
        else:
            work = policy.overlapped_without_poc(self.chat.has_work())
        if work.launch_poc:
            started = time.perf_counter()
            self.artifacts.launch_batch(is_chat_running, budget_s, paced=work.paced)
            log.debug("poc_launched", beside_chat=is_chat_running, chat_gated=self.chat.is_gated, paced=work.paced,
                      host_ms=round((time.perf_counter() - started) * 1000, 2))
        if work.step_chat:
            self.step_engine()
        else:
            self.engine.poc.release()  # a no-op while a forward is in flight
        self.publish()
        self.on_timer()

    def _has_poc_work(self) -> bool:
        """PoC has batches queued or a forward in flight: only then does the policy need its snapshot."""
        return len(self.artifacts) > 0 or self.artifacts.is_in_flight

    def linger_s(self) -> float:
        """Seconds chat still counts as running: CHAT_LINGER_S while it has work (or a request is being
        prepared), then what is left of it."""
        now = time.monotonic()
        if self.chat.has_work() or self.chat.is_preparing():
            self._chat_seen_at = now
        return max(0.0, self._chat_seen_at + CHAT_LINGER_S - now)

    def snapshot(self) -> policy.Snapshot:
        cost, max_batch = self.artifacts.next_forward()
        return policy.Snapshot(
            has_engine_work=self.chat.has_work(), is_chat_preparing=self.chat.is_preparing(),
            is_chat_recent=self.linger_s() > 0,
            is_chat_quiet=time.monotonic() - self._chat_seen_at > policy.CHAT_QUIET_S, is_chat_gated=self.chat.is_gated,
            has_poc_work=len(self.artifacts) > 0, is_poc_blocked=self.artifacts.is_blocked,
            poc_credit_s=self.share.credit_s, poc_cost=cost, poc_max_batch=max_batch,
            is_poc_in_flight=self.artifacts.is_in_flight, has_poc_slot=self.artifacts.has_slot,
            chat_share=self.share.share, can_park_poc=self.engine.poc.parks,
            poc_num_layers=self.engine.poc.num_own_layers, can_pipeline_poc=self.engine.poc.pipelines,
            is_poc_pipelined=self.artifacts.is_pipelined)

    def ingest(self, block: bool, timeout_s: float = _IDLE_WAIT_S) -> None:
        try:
            item = self.inbox.get(timeout=timeout_s) if block else self.inbox.get_nowait()
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
            log.exception("handler_failed", message=type(msg).__name__)
            error = RequestFailed(f"{type(msg).__name__} failed: {e}").info()
            self._send(identity, ErrorReply(rid=getattr(msg, "rid", None), error=error))

    def execute(self, work: policy.Work) -> None:
        match work:
            case policy.EngineStep():
                started = time.perf_counter()
                self.step_engine()
                cost, max_batch = self.artifacts.next_forward()
                min_forward_s = cost.seconds(policy.smallest_forward(cost, max_batch)) if cost is not None else 0.0
                self.share.after_step(time.perf_counter() - started, is_poc_waiting=len(self.artifacts) > 0,
                                      min_forward_s=min_forward_s)
            case policy.PocBatch(limit=limit, parked=parked):
                started = time.perf_counter()
                if parked:
                    self.artifacts.launch_batch(False, policy.PARKED_WAIT_S, limit=limit, timed=True)
                else:
                    self.artifacts.run_batch(limit)
                self._after_poc(started, "poc_forward", limit=limit, parked=parked)
            case policy.PocChunk():
                started = time.perf_counter()
                self.artifacts.poll_batch(wait=False, budget_s=policy.PARKED_WAIT_S, timed=True)
                self._after_poc(started, "poc_chunk")
            case policy.PocLaunch():
                started = time.perf_counter()
                self.artifacts.launch_batch(False, float("inf"), pipelined=True)
                self._after_poc(started, "poc_launched")
            case policy.PocCollect():
                started = time.perf_counter()
                self.artifacts.poll_batch(wait=True)
                self._after_poc(started, "poc_collected")
            case policy.Idle():
                self.engine.poc.release()  # PoC keeps its KV blocks between forwards; no forward is coming
                if len(self.artifacts) > 0:  # PoC waits for chat: out its linger, or for a request being prepared
                    self.ingest(block=True, timeout_s=self.linger_s() or _POLL_S)

    def _after_poc(self, started: float, event: str, **fields) -> None:
        elapsed_s = time.perf_counter() - started
        self.share.after_poc(elapsed_s, is_chat_waiting=self.chat.has_work() or self.chat.is_preparing())
        log.debug(event, elapsed_ms=round(elapsed_s * 1000, 2), credit_ms=round(self.share.credit_s * 1000, 2),
                  **fields)

    def step_engine(self) -> None:
        self.chat.route(self.engine.step())
        self.num_steps += 1
        self.artifacts.unblock()  # the step may have freed KV blocks

    def publish(self) -> None:
        now = time.monotonic()
        if now - self._published_at >= _PUBLISH_INTERVAL_S:
            self._published_at = now
            self.control.publish(self.stats(), self.pow.stats(), self.pow.callbacks.stats())

    def on_timer(self) -> None:
        now = time.monotonic()
        # Not once stopping: a SIGTERM to the process group also ends the processor, which is expected then.
        if self.is_running and now - self._timers_at >= _TIMER_INTERVAL_S:
            self._timers_at = now
            for timer in self._timers:
                timer()

    def work_counts(self) -> dict[str, int]:
        """Work done so far, for the heap profile's per-step and per-forward figures (backend/core/heap_profile.py)."""
        return {"engine_steps": self.num_steps, "poc_forwards": self.engine.poc.num_forwards}

    def stats(self) -> EngineStats:
        """The engine thread's part of BackendStats (backend/transport/control.py puts the parts together)."""
        running, waiting, kv_usage = self.engine.load()
        return EngineStats(num_running=running, num_waiting=waiting, kv_cache_usage=kv_usage,
                           num_engine_steps=self.num_steps, num_aborted_requests=self.chat.num_aborted,
                           inbox_depth=self.inbox.qsize(), poc_iteration_tokens=self.artifacts.iterations.snapshot())
