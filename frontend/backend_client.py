"""The frontend's connection to the backend: a DEALER socket and a second one to the backend's processor, on which
its deltas come (frontend/direct.py), their readers, liveness and a breaker. Owns all cross-request state: request
id → stream queue, ping id → future, the backend fingerprint and its liveness. Created in the app lifespan and
stored on app.state; routes only call its methods. With CURVE keys the DEALERs are CURVE clients; a HandshakeWatch
logs and retries a handshake the backend refuses. When the backend counts as down, and when only as busy:
frontend/liveness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import cast

import msgspec
import structlog
import zmq

from common.curve import KeyFile, set_client_keys
from common.sockets import make_client_socket
from frontend.backend_errors import BackendRequestError, BackendUnavailable
from frontend.direct import DirectConnection, connect_address
from frontend.handshakes import HandshakeWatch
from frontend.liveness import Liveness
from protocol.codec import frontend_codec
from protocol.common import BackendStats, ErrorInfo, Fingerprint
from protocol.control import (
    DeadEvent,
    ErrorReply,
    HelloRequest,
    MetricsReply,
    PingRequest,
    PongReply,
    ReadyReply,
)
from protocol.generate import (
    AbortRequest,
    Delta,
    DeltasEvent,
    GenerateErrorReply,
    GenerateRequest,
)
from protocol.poc import PocArtifactsReply
from protocol.pow import PowJobReply, PowStatusReply
from protocol.tokenize import DetokenizeReply, TokenizeReply
from protocol.version import PROTOCOL_VERSION

log = structlog.get_logger(__name__)


class BackendClient:
    def __init__(self, address: str, frontend_id: str, *, ping_interval_s: float = 0.5,
                 backend_timeout_s: float = 1.5, backend_wait_s: float = 1.0, breaker_misses: int = 3,
                 backend_busy_s: float = 30.0, curve_keys: KeyFile | None = None,
                 curve_server_key: KeyFile | None = None, refused_retry_s: float = 5.0) -> None:
        self.address = address
        self.frontend_id = frontend_id
        self.ping_interval_s = ping_interval_s
        self.backend_timeout_s = backend_timeout_s
        self.backend_wait_s = backend_wait_s
        self._liveness = Liveness(address, backend_timeout_s, backend_busy_s, breaker_misses)
        # Both or neither (the settings check it): this frontend's key pair, the backend's public key.
        self.curve_keys = curve_keys
        self.curve_server_key = curve_server_key
        self.refused_retry_s = refused_retry_s
        self.handshakes: HandshakeWatch | None = None
        # The second connection, to the backend's processor, once a ReadyReply names it (frontend/direct.py).
        self.direct: DirectConnection | None = None
        self.fingerprint: Fingerprint | None = None
        self.stats: BackendStats | None = None
        self.incompatible: str | None = None
        self.num_malformed_replies = 0
        # A plain socket read from the event loop's reader callback: zmq.asyncio costs a future per message.
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._codec = frontend_codec()
        self._streams: dict[str, asyncio.Queue] = {}
        self._pings: dict[int, asyncio.Future] = {}
        # rid → future of a correlated reply (one request, one answer)
        self._calls: dict[str, asyncio.Future] = {}
        self._ping_ids = itertools.count(1)
        self._rids = itertools.count(1)
        self._rid_prefix = uuid.uuid4().hex[:8]
        # Stable across reconnects, so the backend's ROUTER (ROUTER_HANDOVER) keeps routing our requests' replies
        # and aborts to us; a fresh random id per connection would orphan them.
        self._routing_id = f"fe-{uuid.uuid4().hex}".encode()
        # Requests failed here because the backend became unreachable; they may still run there, so they are
        # aborted once it answers again (or forgotten if it restarted).
        self._orphans: set[str] = set()
        self._instance_id: str | None = None
        self._alive = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._is_closing = False
        self._hello = HelloRequest(protocol_version=PROTOCOL_VERSION, frontend_id=frontend_id)

    # --- lifecycle ---

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock, self.handshakes = self._connect(self.address, self._on_connection)
        self._loop.add_reader(self._sock, self._drain)
        self._tasks = [asyncio.create_task(self._pinger(), name="backend-pinger")]

    def _connect(self, address: str, on_change: Callable[[bool], None]) -> tuple[zmq.Socket, HandshakeWatch]:
        """A DEALER to `address` with our routing id, heartbeats and CURVE keys, its handshakes watched."""
        sock = make_client_socket(self._ctx, self._routing_id, timeout_ms=max(100, int(self.backend_timeout_s * 1000)),
                                  heartbeat_ivl_ms=max(10, int(self.ping_interval_s * 1000)))
        if self.curve_keys is not None and self.curve_server_key is not None:
            # The backend answers nothing until its ZAP handler admits our public key.
            set_client_keys(sock, self.curve_keys, self.curve_server_key)
        watch = HandshakeWatch(sock, address, self._loop, retry_s=self.refused_retry_s,
                               public_key=self.curve_keys.public_key if self.curve_keys else None, on_change=on_change)
        sock.connect(address)
        return sock, watch

    async def close(self) -> None:
        # The flag as well as the cancel: on Python 3.11 asyncio.wait_for swallows a cancel that comes in the
        # iteration its future completes (a pong, or the failure a lost connection sets), and the pinger went on
        # pinging, so a frontend's shutdown hung until its supervisor killed it (seen in a busy test run).
        self._is_closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_all("frontend shutting down")
        if self.direct is not None:
            self.direct.close()
        if self._sock is not None:
            self._loop.remove_reader(self._sock)
            if self.handshakes is not None:
                self.handshakes.close()
            self._sock.close(linger=0)
        self._ctx.term()

    @property
    def is_alive(self) -> bool:
        return self._alive.is_set()

    @property
    def is_busy(self) -> bool:
        """Connected, but pings unanswered for now: its streams wait (up to backend_busy_s)."""
        return self._liveness.is_busy

    @property
    def is_breaker_open(self) -> bool:
        return self._liveness.is_breaker_open

    @property
    def liveness(self) -> Liveness:
        """The verdict's state, read by /metrics (busy spells)."""
        return self._liveness

    # --- requests ---

    def new_rid(self) -> str:
        return f"{self._rid_prefix}-{next(self._rids)}"

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[Delta, None]:
        """Yields deltas until each choice has had its finishing one; aborts in the backend if the caller stops
        early."""
        await self._ensure_alive()
        q: asyncio.Queue = asyncio.Queue()
        self._streams[req.rid] = q
        num_running = req.sampling.n
        finished = False
        try:
            await self._send(req)
            while True:
                item = await q.get()
                if isinstance(item, Delta):
                    if item.finish_reason is not None:
                        num_running -= 1
                    finished = num_running == 0
                    yield item
                    if finished:
                        return
                elif isinstance(item, ErrorInfo):
                    finished = True
                    raise BackendRequestError(item)
                else:
                    finished = True
                    raise BackendUnavailable(item)
        finally:
            self._streams.pop(req.rid, None)
            if not finished and self.is_alive:
                try:
                    await self._send(AbortRequest(rids=[req.rid]))
                except BackendUnavailable:
                    self._orphans.add(req.rid)  # aborted after the next pong, unless the backend restarted

    async def call(self, req, timeout_s: float | None = None):
        """Sends a request that has exactly one reply with the same rid and awaits that reply."""
        await self._ensure_alive()
        fut = asyncio.get_running_loop().create_future()
        self._calls[req.rid] = fut
        try:
            await self._send(req)
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as e:
            raise BackendUnavailable(f"no answer within {timeout_s} s") from e
        finally:
            self._calls.pop(req.rid, None)

    async def ping(self, timeout_s: float | None = None) -> BackendStats:
        """Round trip to the backend; raises BackendUnavailable on timeout."""
        ping_id = next(self._ping_ids)
        fut = asyncio.get_running_loop().create_future()
        self._pings[ping_id] = fut
        try:
            await self._send(PingRequest(ping_id=ping_id))
            return await asyncio.wait_for(fut, timeout_s or self.backend_timeout_s)
        except (TimeoutError, zmq.Again) as e:
            raise BackendUnavailable("backend did not answer") from e
        finally:
            self._pings.pop(ping_id, None)

    async def _ensure_alive(self) -> None:
        if self.incompatible:
            raise BackendUnavailable(self.incompatible)
        if self.is_alive:
            return
        if self.is_breaker_open:
            raise BackendUnavailable("backend unavailable")
        try:
            await asyncio.wait_for(self._alive.wait(), self.backend_wait_s)
        except TimeoutError:
            raise BackendUnavailable("backend unavailable") from None

    async def _send(self, msg: msgspec.Struct) -> None:
        if self._sock is None:
            raise BackendUnavailable("frontend not started")
        try:
            self._sock.send(self._codec.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again as e:  # IMMEDIATE: no connected backend
            raise BackendUnavailable("backend not connected") from e
        # zmq's FD is edge-triggered and a send can consume the edge of a reply that already arrived.
        self._loop.call_soon(self._drain)

    # --- background tasks ---

    async def _pinger(self) -> None:
        while not self._is_closing:
            try:
                self._on_stats(await self.ping(self.backend_timeout_s))
            except BackendUnavailable:
                self._on_miss()
            await asyncio.sleep(self.ping_interval_s)

    def _on_stats(self, stats: BackendStats) -> None:
        instance_id = stats.link.instance_id
        if self._instance_id != instance_id:
            if self._instance_id is not None:
                log.warning("backend_restarted", old=self._instance_id, new=instance_id)
                self._mark_down("backend restarted")
            self._instance_id = instance_id
            self.fingerprint = None
            self._orphans.clear()  # a new backend instance never had them
        if self._orphans:
            asyncio.get_running_loop().create_task(self._abort_orphans())
        if self.direct is not None:
            self.direct.hello(self._codec.encode(self._hello))
        if self.fingerprint is None and not self.incompatible:
            # Answered once the backend's engine is up; until then every pong retries it.
            asyncio.get_running_loop().create_task(self._send_hello())
        self.stats = stats
        self._liveness.on_pong(time.monotonic())
        if self.fingerprint is not None:
            self._alive.set()

    def _on_miss(self) -> None:
        if self._liveness.on_miss(time.monotonic(), is_alive=self.is_alive, is_connected=self._is_connected(),
                                  num_streams=len(self._streams)):
            self._orphans.update(self._streams)  # failed here, maybe still running there
            self._mark_down("backend unreachable")

    def _is_connected(self) -> bool:
        return self.handshakes is not None and self.handshakes.is_connected

    def _on_connection(self, is_connected: bool, address: str | None = None) -> None:
        """Either HandshakeWatch's callback: a lost connection fails the streams at once, answered pings or not."""
        if is_connected or not self.is_alive:
            return
        log.warning("backend_disconnected", address=address or self.address, streams=len(self._streams))
        self._orphans.update(self._streams)  # failed here, maybe still running there
        self._mark_down("backend disconnected")

    async def _send_hello(self) -> None:
        with contextlib.suppress(BackendUnavailable):  # retried on the next pong
            await self._send(self._hello)

    async def _abort_orphans(self) -> None:
        rids = sorted(self._orphans)
        try:
            await self._send(AbortRequest(rids=rids))
        except BackendUnavailable:
            return  # retried after the next pong
        self._orphans.difference_update(rids)
        log.info("orphaned_requests_aborted", num=len(rids))

    def _mark_down(self, reason: str) -> None:
        self._liveness.end_busy(time.monotonic())
        self._alive.clear()
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        for q in self._streams.values():
            q.put_nowait(reason)
        for fut in [*self._pings.values(), *self._calls.values()]:
            if not fut.done():
                fut.set_exception(BackendUnavailable(reason))

    def _drain(self) -> None:
        """Reader callback: handles every reply that is ready (the FD only signals edges)."""
        sock = self._sock
        if sock is None or sock.closed:
            return
        while cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            self._on_frame(sock.recv(zmq.NOBLOCK))

    def _on_frame(self, frame: bytes) -> None:
        """A message from either connection."""
        try:
            msg = self._codec.decode(frame)
        except msgspec.DecodeError as e:
            # A malformed reply is counted and dropped; it must never kill the frontend.
            self.num_malformed_replies += 1
            log.warning("backend_reply_malformed", error=str(e)[:200], num=self.num_malformed_replies)
            return
        self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        match msg:
            case DeltasEvent(deltas=deltas):
                for d in deltas:
                    if (q := self._streams.get(d.rid)) is not None:
                        q.put_nowait(d)
            case GenerateErrorReply(rid=rid, error=error):
                if (q := self._streams.get(rid)) is not None:
                    q.put_nowait(error)
            case (PocArtifactsReply(rid=rid) | PowJobReply(rid=rid) | PowStatusReply(rid=rid) | TokenizeReply(rid=rid)
                  | DetokenizeReply(rid=rid) | MetricsReply(rid=rid)):
                fut = self._calls.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            case PongReply(ping_id=ping_id, stats=stats):
                fut = self._pings.get(ping_id)
                if fut is not None and not fut.done():
                    fut.set_result(stats)
            case ReadyReply(fingerprint=fp, refusal=refusal, deltas_endpoint=endpoint):
                self._on_ready(fp, refusal)
                if fp is not None:
                    self._open_direct(endpoint)
            case DeadEvent(reason=reason):
                # A dying backend answers every ping with this for a moment (SocketServer.send_dead): log once.
                if self._instance_id is not None or self.fingerprint is not None:
                    log.error("backend_dead", reason=reason)
                self._instance_id = None
                self.fingerprint = None
                self._mark_down(f"backend engine died: {reason}")
            case ErrorReply(error=error, rid=rid):
                log.warning("backend_rejected_frame", message=error.message, rid=rid)
                if rid is not None and (q := self._streams.get(rid)) is not None:
                    q.put_nowait(error)
                fut = self._calls.get(rid) if rid is not None else None
                if fut is not None and not fut.done():
                    fut.set_exception(BackendRequestError(error))

    def _on_ready(self, fp: Fingerprint | None, refusal: str | None) -> None:
        if refusal is not None:
            self.incompatible = f"incompatible backend: {refusal}"
            log.error("backend_incompatible", refusal=refusal)
            self._mark_down(self.incompatible)
            return
        if fp is None:
            # Neither field set breaks the contract; counted like an undecodable reply so the reader lives on.
            self.num_malformed_replies += 1
            log.warning("backend_reply_malformed", error="ready without fingerprint or refusal",
                        num=self.num_malformed_replies)
            return
        self.fingerprint = fp
        log.info("backend_handshake", **msgspec.structs.asdict(fp))
        self._alive.set()

    def _open_direct(self, endpoint: str | None) -> None:
        """The second connection to where the backend's processor sends deltas itself; kept across backend
        restarts while the endpoint stays (it reconnects by itself), replaced when it moves."""
        address = connect_address(self.address, endpoint) if endpoint is not None else None
        if self.direct is not None:
            if self.direct.address == address:
                return
            self.direct.close()
            self.direct = None
        if address is not None:
            sock, watch = self._connect(address, lambda is_up: self._on_connection(is_up, address))
            self.direct = DirectConnection(sock, watch, self._loop, self._on_frame)
            self.direct.hello(self._codec.encode(self._hello))
