"""Connection-level answers given by the io thread itself: handshake and liveness.

Pings are answered here, not by the engine thread, so a long engine step or PoC batch never looks like a dead
backend. The engine thread publishes its immutable parts of the stats after its steps; pongs carry the latest ones,
the processor's last report and this thread's own part, with how old the engine's is, which is how a hung engine
shows (and a dead one sends DeadEvent and exits).
The registry of frontends (identity → frontend id) lives here too: Hello adds, `forget` drops a silent one.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import structlog

from protocol.common import BackendStats, CallbackStats, EngineStats, Fingerprint, LinkStats, PocStats, ProcessorStats
from protocol.control import HelloRequest, PingRequest, PongReply, ReadyReply
from protocol.version import PROTOCOL_VERSION

log = structlog.get_logger(__name__)

# Names of forgotten frontends kept so that one coming back is counted again on its next ping (no new Hello).
_MAX_REMEMBERED_LOST = 256


class ControlPlane:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.started = time.monotonic()
        # Set by the main thread once the engine is built; Hello is answered only from then on.
        self.fingerprint: Fingerprint | None = None
        # Replaced whole (never mutated) by the engine thread: its part, the PoC service's and the callback
        # sender's, as one tuple so that a pong never mixes two publishes.
        self.snapshot: tuple[EngineStats, PocStats, CallbackStats] | None = None
        # Replaced (never mutated) by the io thread: what the processor process counted of chat.
        self.chat_stats: ProcessorStats | None = None
        # Set by the io thread from ProcessorReady (before the engine's fingerprint): where the processor sends
        # deltas itself (backend/processor/direct.py), told to each frontend in its ReadyReply.
        self.deltas_endpoint: str | None = None
        self.snapshot_at = time.monotonic()
        self.frontends: dict[bytes, str] = {}
        self._lost: OrderedDict[bytes, str] = OrderedDict()

    def publish(self, engine: EngineStats, poc: PocStats, callbacks: CallbackStats) -> None:
        self.snapshot, self.snapshot_at = (engine, poc, callbacks), time.monotonic()

    def on_hello(self, identity: bytes, msg: HelloRequest) -> ReadyReply | None:
        if msg.protocol_version != PROTOCOL_VERSION:
            log.error("frontend_refused", frontend_id=msg.frontend_id, their_version=msg.protocol_version,
                      our_version=PROTOCOL_VERSION)
            return ReadyReply(refusal=f"protocol version {msg.protocol_version} != backend's {PROTOCOL_VERSION}")
        if self.fingerprint is None:
            return None  # engine still loading: the frontend retries after its next pong
        if identity not in self.frontends:
            log.info("frontend_connected", frontend_id=msg.frontend_id)
        self._lost.pop(identity, None)
        self.frontends[identity] = msg.frontend_id
        return ReadyReply(fingerprint=self.fingerprint, deltas_endpoint=self.deltas_endpoint)

    def forget(self, identity: bytes) -> str:
        """Drops a peer the io thread found silent; returns its frontend id ("" if it never said Hello)."""
        frontend_id = self.frontends.pop(identity, "")
        if frontend_id:
            # A frontend only says Hello once per backend instance: after a partition or a stall it just pings.
            self._lost[identity] = frontend_id
            if len(self._lost) > _MAX_REMEMBERED_LOST:
                self._lost.popitem(last=False)
        return frontend_id

    def on_ping(self, identity: bytes, msg: PingRequest, *, num_rejected_frames: int, outbox_depth: int,
                num_curve_refusals: int = 0) -> PongReply:
        if (frontend_id := self._lost.pop(identity, None)) is not None:
            self.frontends[identity] = frontend_id
            log.info("frontend_returned", frontend_id=frontend_id)
        now = time.monotonic()
        link = LinkStats(instance_id=self.instance_id, uptime_s=now - self.started, num_frontends=len(self.frontends),
                         num_rejected_frames=num_rejected_frames, outbox_depth=outbox_depth,
                         num_curve_refusals=num_curve_refusals, is_engine_ready=self.fingerprint is not None,
                         engine_heartbeat_age_s=now - self.snapshot_at)
        engine, poc, callbacks = self.snapshot or (None, None, None)
        stats = BackendStats(link=link, engine=engine, poc=poc, callbacks=callbacks, chat=self.chat_stats)
        return PongReply(ping_id=msg.ping_id, stats=stats)
