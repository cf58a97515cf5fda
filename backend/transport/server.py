"""The backend's ROUTER socket, its link to the processor process, and the I/O thread that owns them.

Threads and ownership (a zmq socket is used by exactly one thread):
- io thread: owns the ROUTER and the link's PAIR. It decodes incoming frames into typed messages and puts
  `(identity, msg)` on the inbox; it encodes what other threads put on the outbox and sends it to the ROUTER or the
  link; and it forwards the processor's encoded deltas from the link to the ROUTER, unread.
- any other thread (the engine thread, the store writer, ...) only appends to the outbox and writes a byte to a
  wake-up socket pair that the io thread polls with its sockets. So a reply is one thread hop from the engine thread to
  the wire (a separate encode thread cost a second wake-up on every message: ~0.1 ms a hop on a loaded machine),
  and the engine thread never touches a socket and never encodes.
With CURVE on, the io thread also runs the ROUTER's CurveGate (ZAP handler and handshake monitor,
backend/transport/curve.py). The io thread also keeps every peer's last-seen time (backend/transport/peers.py): a peer
silent past the timeout is forgotten and a FrontendLost event goes to the loop, which aborts that peer's requests.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
import zmq

from backend.errors import RequestError
from backend.transport.control import ControlPlane
from backend.transport.curve import CurveGate
from backend.transport.peers import FrontendLost, PeerTable
from common.sockets import make_socket
from protocol.codec import backend_codec
from protocol.control import DeadEvent, ErrorReply, HelloRequest, MetricsReply, MetricsRequest, PingRequest
from protocol.processor import FORWARD, MetricsJob, ProcessorReady, ProcessorStats

log = structlog.get_logger(__name__)

# An outbox item addressed to this identity goes to every frontend seen so far.
BROADCAST = b""
# The identity of the processor process (outbox items for it, inbox items from it). ZMQ's own routing ids are
# 5 bytes, frontends' start with "fe-": no peer of the ROUTER can have it.
LINK = b"\x00pocserve-processor-link"
_POLL_MS = 100
# Frames read before a sweep, at most (see _sweep).
_MAX_DRAIN_FRAMES = 1000


def is_exposed(address: str) -> bool:
    """True for a tcp:// address other hosts may reach (anything but loopback)."""
    if not address.startswith("tcp://"):
        return False
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    return not (host == "localhost" or host == "::1" or host.startswith("127."))


class SocketServer:
    """Owns the ROUTER socket; feeds `inbox` with decoded messages and drains `outbox` to peers."""

    def __init__(
        self, ctx: zmq.Context, address: str, inbox: queue.Queue, control: ControlPlane, *,
        configure: Callable[[zmq.Socket], None] | None = None, gate: CurveGate | None = None,
        peers: PeerTable | None = None, link_address: str | None = None,
    ) -> None:
        self._ctx = ctx
        self.control = control
        self._address = address
        self._inbox = inbox
        self._configure = configure
        self._gate = gate
        # Bound by the io thread for the processor process; its codec comes with attach_link (it imports vLLM).
        self._link_address = link_address
        self._link_codec: Any = None
        # Set by the io thread when the processor says it is ready: from then on it answers MetricsRequests.
        self._is_processor_ready = False
        # (identity, msg) for the io thread to encode and send; deque appends and pops are thread-safe.
        self._outbox: deque = deque()
        # Written (one byte) after each append: the io thread polls the read end with its sockets. Socket objects
        # rather than raw fds, so that a send after stop() fails instead of writing into a reused fd number.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        # Every identity heard from (BROADCAST targets), with its last-seen time; default: never expires.
        self.peers = peers if peers is not None else PeerTable(timeout_s=0.0)
        self.num_rejected_frames = 0
        self.dead: DeadEvent | None = None
        self._thread = threading.Thread(target=self._io_loop, name="zmq-io", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def attach_link(self, codec) -> None:
        """The link's codec (backend/processor/link.py EngineSide). The link is read from then on (within one poll
        interval); frames the processor sent earlier wait in the socket."""
        self._link_codec = codec

    def send(self, identity: bytes, msg) -> None:
        """Thread-safe; BROADCAST sends to every peer seen so far, LINK to the processor process."""
        self._outbox.append((identity, msg))
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # full of wake-ups the io thread has not read yet: it drains the outbox anyway
        except OSError:
            pass  # stopped: nothing is sent any more

    @property
    def outbox_depth(self) -> int:
        return len(self._outbox)

    def send_dead(self, event: DeadEvent) -> None:
        """Broadcasts the dead sentinel and from now on answers every frame with it. libzmq discards what a
        frontend has not read yet when the connection closes (its DEALER is IMMEDIATE), so a sentinel sent just
        before the exit could vanish; frontends ping every 0.5 s, and the answers reach them while we linger."""
        self.dead = event
        self.send(BROADCAST, event)

    def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Sends what is queued (the io thread drains the outbox before it closes the sockets), then closes them."""
        self._stop.set()
        self.send(BROADCAST, None)  # only wakes the io thread; None is never sent
        self._thread.join(flush_timeout_s)
        self._wake_w.close()
        self._wake_r.close()

    def _io_loop(self) -> None:
        codec = backend_codec()
        try:
            router = make_socket(self._ctx, zmq.ROUTER, linger_ms=1000)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if self._configure is not None:
                self._configure(router)
            # Before the bind: no peer may reach the ROUTER before its ZAP handler exists.
            gate_sockets = self._gate.open(self._ctx, router) if self._gate is not None else []
            router.bind(self._address)
            link = None
            if self._link_address is not None:
                link = make_socket(self._ctx, zmq.PAIR)
                link.bind(self._link_address)
        except BaseException as e:  # reported to start() in the caller's thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        log.info("backend_socket_bound", address=self._address, curve=self._gate is not None,
                 num_client_keys=self._gate.num_client_keys if self._gate is not None else 0)
        if self._gate is None and is_exposed(self._address):
            log.warning("backend_socket_plaintext", address=self._address,
                        hint="whoever reaches this address can drive the backend; see CURVE in the README")
        poller = zmq.Poller()
        for sock in (router, *gate_sockets):
            poller.register(sock, zmq.POLLIN)
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        link_polled = False
        try:
            while not self._stop.is_set():
                if link is not None and not link_polled and self._link_codec is not None:
                    # Read the link only once its codec is attached: the processor may start (and connect) first.
                    poller.register(link, zmq.POLLIN)
                    link_polled = True
                events = dict(poller.poll(_POLL_MS))
                if router in events:
                    self._on_frames(router, codec, router.recv_multipart(copy=False))
                if wake_fd in events:
                    self._drain_outbox(router, link, codec)
                if link is not None and link in events:
                    self._on_link(router, link.recv_multipart(copy=False))
                if self._gate is not None:
                    self._gate.on_events(events)
                if self.peers.is_sweep_due():
                    self._sweep(router, codec)
            self._drain_outbox(router, link, codec)  # replies queued before stop
        finally:
            router.close()
            if link is not None:
                link.close()
            if self._gate is not None:
                self._gate.close()

    def _drain_outbox(self, router: zmq.Socket, link: zmq.Socket | None, codec) -> None:
        """Encodes and sends everything queued, in order (wake-up bytes first: an append after this read wakes us
        again)."""
        try:
            while self._wake_r.recv(65536):
                pass
        except BlockingIOError:
            pass
        while self._outbox:
            identity, msg = self._outbox.popleft()
            if msg is not None:
                self._deliver(router, link, codec, identity, msg)

    def _deliver(self, router: zmq.Socket, link: zmq.Socket | None, codec, identity: bytes, msg) -> None:
        if identity == LINK:
            if link is not None:
                try:
                    # Never blocks the io thread: a processor that is gone is the engine loop's to notice.
                    link.send_multipart(self._link_codec.encode(msg), copy=False, flags=zmq.NOBLOCK)
                except zmq.Again:
                    log.warning("processor_link_unwritable")
            return
        payload = codec.encode(msg)
        targets = list(self.peers) if identity == BROADCAST else [identity]
        for peer in targets:
            router.send_multipart([peer, payload], copy=False)

    def _on_link(self, router: zmq.Socket, frames: list) -> None:
        if frames[0].bytes == FORWARD:
            if self.dead is None:
                for i in range(1, len(frames) - 1, 2):
                    router.send_multipart(frames[i:i + 2], copy=False)
            return
        msg = self._link_codec.decode(frames)
        if isinstance(msg, ProcessorStats):
            self.control.chat_stats = msg  # replaced, never mutated: pongs read it as they are built
            return
        if isinstance(msg, ProcessorReady):
            self._is_processor_ready = True
            self.control.deltas_endpoint = msg.deltas_endpoint
        self._inbox.put((LINK, msg))

    def _on_frames(self, router: zmq.Socket, codec, frames: list) -> None:
        identity = frames[0].bytes
        self.peers.seen(identity)
        if self.dead is not None:
            router.send_multipart([identity, codec.encode(self.dead)])
            return
        if self._gate is not None and not self._gate.admits(frames[-1]):
            return  # dropped, counted and logged by the gate; an answer per ping would flood the peer's log
        if len(frames) != 2:
            self._reject(router, codec, identity, f"expected 1 payload frame, got {len(frames) - 1}")
            return
        try:
            msg = codec.decode(frames[1].buffer)
        except msgspec.DecodeError as e:
            self._reject(router, codec, identity, f"malformed frame: {e}")
            return
        if isinstance(msg, PingRequest):
            pong = self.control.on_ping(
                identity, msg, num_rejected_frames=self.num_rejected_frames, outbox_depth=self.outbox_depth,
                num_curve_refusals=self._gate.num_curve_refusals if self._gate is not None else 0)
            router.send_multipart([identity, codec.encode(pong)])
        elif isinstance(msg, HelloRequest):
            if (ready := self.control.on_hello(identity, msg)) is not None:
                router.send_multipart([identity, codec.encode(ready)])
        elif isinstance(msg, MetricsRequest):
            # Straight to the processor, which keeps vLLM's stat logger: a scrape never waits for the engine
            # thread (a PoC forward can take seconds). Until the processor is up there is nothing to render.
            if self._is_processor_ready:
                self.send(LINK, MetricsJob(identity=identity, rid=msg.rid))
            else:
                router.send_multipart([identity, codec.encode(MetricsReply(rid=msg.rid))])
        else:
            self._inbox.put((identity, msg))

    def _sweep(self, router: zmq.Socket, codec) -> None:
        # Frames libzmq already holds are read first: an io thread starved of the GIL for a while must not
        # expire peers whose pings are waiting in the socket.
        for _ in range(_MAX_DRAIN_FRAMES):
            if not router.poll(0):
                break
            self._on_frames(router, codec, router.recv_multipart(copy=False))
        for identity, silent_s in self.peers.sweep():
            frontend_id = self.control.forget(identity)
            self._inbox.put((identity, FrontendLost(frontend_id=frontend_id, silent_s=silent_s)))

    def _reject(self, router: zmq.Socket, codec, identity: bytes, reason: str) -> None:
        # Counted and answered, never raised: a bad peer must not take the backend down.
        self.num_rejected_frames += 1
        if self.num_rejected_frames <= 10 or self.num_rejected_frames % 1000 == 0:
            log.warning("frame_rejected", reason=reason[:200], num_rejected=self.num_rejected_frames)
        reply = ErrorReply(error=RequestError(reason[:500]).info())
        router.send_multipart([identity, codec.encode(reply)])


def shut_down(server: SocketServer, ctx: zmq.Context) -> None:
    """Stops `server`, then terminates `ctx`, which must be its own: term() blocks (up to the ROUTER's linger)
    until queued frames are on the wire. Closing a socket only hands them to libzmq's I/O thread, so a process
    that exits right after (os._exit) lost its last frames, the dead sentinel among them, now and then."""
    server.stop()
    ctx.term()
