"""The processor's own ROUTER: frontends' second connection, on which the processor sends them their deltas itself.

Through the engine process, every step's deltas cost its io thread a wake-up, a receive and a send, each a GIL
hand-off that stops the engine thread at its next torch call (docs/decisions.md, "The processor sends the
frontends their deltas itself"; `vllm serve`'s engine process has one such thread, ours had two). Sent from here,
the engine process's io thread wakes only for requests, replies and pings, and its engine thread steps as
`vllm serve`'s does.

A frontend connects a second DEALER here with its routing id (the endpoint comes in its ReadyReply) and says Hello
on it at each pong. A request goes this way for its whole life if its frontend had said Hello when it was
prepared, otherwise through the engine process, so no stream's deltas take two paths at once. A send that finds
the frontend gone (ROUTER_MANDATORY) goes through the engine process instead and forgets the frontend until its
next Hello; the frontend failed that connection's streams when it dropped (frontend/direct.py), as it does when
its main connection drops. Raw clients (the probe) never say Hello here: theirs all come through the engine
process. With CURVE, this ROUTER admits the keys the backend's does (backend/transport/curve.py).
"""

from __future__ import annotations

import time

import msgspec
import structlog
import zmq

from backend.transport.curve import CurveGate
from common.sockets import make_socket
from protocol.codec import backend_codec
from protocol.control import HelloRequest

log = structlog.get_logger(__name__)

# A frontend that has not said Hello for this long is forgotten (it says one every ping, 0.5 s by default); its
# requests already going this way keep going this way.
FORGET_AFTER_S = 30.0
_SUFFIX = ".deltas"


def bind_address(deltas_address: str, backend_address: str) -> str | None:
    """What the processor binds for `--deltas-address` beside `--address`; None: off."""
    if deltas_address == "off":
        return None
    if deltas_address != "auto":
        return deltas_address
    scheme, _, rest = backend_address.partition("://")
    if scheme == "ipc":
        return f"{backend_address}{_SUFFIX}"
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        return f"tcp://{host}:{int(port) + 1}" if port.isdigit() and int(port) < 65535 else None
    return None  # inproc: a frontend in another process could not reach it anyway


class DirectDeltas:
    """Owns the ROUTER (and its CURVE gate's sockets); used by the processor's main thread alone."""

    def __init__(self, ctx: zmq.Context, address: str, gate: CurveGate | None = None) -> None:
        self._gate = gate
        self._codec = backend_codec()
        self._router = make_socket(ctx, zmq.ROUTER, linger_ms=1000)
        # A send to a frontend that is not connected raises instead of vanishing: that stream falls back.
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._gate_sockets = gate.open(ctx, self._router) if gate is not None else []
        try:
            self._router.bind(address)
        except zmq.ZMQError:
            self.close()
            raise
        self.endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        # identity → when it last said Hello
        self._frontends: dict[bytes, float] = {}
        self._swept_at = time.monotonic()
        self.num_sent = 0
        self.num_fallbacks = 0
        self.num_ignored = 0

    @classmethod
    def open(cls, ctx: zmq.Context, address: str | None, gate: CurveGate | None = None) -> DirectDeltas | None:
        """None when off or when `address` cannot be bound (logged: every delta then goes through the engine
        process, as before this socket existed)."""
        if address is None:
            return None
        try:
            direct = cls(ctx, address, gate)
        except zmq.ZMQError as e:
            log.error("deltas_socket_unbound", address=address, error=str(e),
                      hint="every delta goes through the engine process; see --deltas-address")
            return None
        log.info("deltas_socket_bound", endpoint=direct.endpoint, curve=gate is not None)
        return direct

    @property
    def sockets(self) -> list[zmq.Socket]:
        """To poll; pass what fired to on_events."""
        return [self._router, *self._gate_sockets]

    def on_events(self, events: dict) -> None:
        if self._router in events:
            for _ in range(100):  # what is there now; the rest at the next poll
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._on_frames(frames)
        if self._gate is not None:
            self._gate.on_events(events)
        now = time.monotonic()
        if now - self._swept_at >= 1.0:
            self._swept_at = now
            self._forget_silent(now)

    def _on_frames(self, frames: list) -> None:
        identity = frames[0].bytes
        if self._gate is not None and not self._gate.admits(frames[-1]):
            return  # a revoked key: counted and logged by the gate
        try:
            msg = self._codec.decode(frames[1].buffer) if len(frames) == 2 else None
        except msgspec.DecodeError:
            msg = None
        if not isinstance(msg, HelloRequest):
            # Only Hello comes here; requests go to the backend's own socket. Read and dropped, never queued.
            self.num_ignored += 1
            if self.num_ignored <= 10 or self.num_ignored % 1000 == 0:
                log.warning("deltas_socket_frame_ignored", num_ignored=self.num_ignored)
            return
        if identity not in self._frontends:
            log.info("frontend_direct", frontend_id=msg.frontend_id)
        self._frontends[identity] = time.monotonic()

    def _forget_silent(self, now: float) -> None:
        silent = [i for i, at in self._frontends.items() if now - at > FORGET_AFTER_S]
        for identity in silent:
            del self._frontends[identity]

    def is_direct(self, identity: bytes) -> bool:
        """Whether a request from `identity` prepared now goes this way for its whole life."""
        return identity in self._frontends

    def send(self, identity: bytes, payload) -> bool:
        """False when the frontend is not connected here (then forgotten until its next Hello)."""
        try:
            self._router.send_multipart([identity, payload], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:  # EHOSTUNREACH: its connection is gone
            self.num_fallbacks += 1
            if self._frontends.pop(identity, None) is not None:
                log.warning("frontend_direct_lost", error=str(e), num_fallbacks=self.num_fallbacks)
            return False
        self.num_sent += 1
        return True

    def close(self) -> None:
        self._router.close()
        if self._gate is not None:
            self._gate.close()
