"""Slow and idle HTTP clients: connections reaped after a timeout, and a cap on open connections (issue 33).

uvicorn (0.54) closes a keep-alive connection idle after a response (`timeout_keep_alive`, 5 s), but nothing
else: a connection that never sends a request, or sends half a header, or stops in the middle of a body, stays
open for as long as the client likes, and each holds a file descriptor. With the default limit of 1,024
descriptors, a few hundred such sockets made `/health` fail (accept() fails with EMFILE).

So the frontend runs uvicorn's own HTTP protocol with a guard around it (`guarded_protocol`):
- **header timeout**: a connection waiting for a request (new, or between keep-alive requests, a partial header
  included) for `--header-timeout-s` is closed;
- **body timeout**: a request whose body has not grown for `--body-timeout-s` is closed (the route sees the
  client gone); not while uvicorn itself has paused reading because the app has not taken the body yet;
- **cap**: at most `--max-connections` open (default: the descriptor limit less 128 for the process's own
  sockets and files). A connection past the cap closes the one that has waited longest for a request instead;
  when every open connection has a request under way, the new one is answered `503` with the error body
  ("too many open connections") and closed. A request under way (a stream of any length) is never closed by
  the guard.

One timer a second sweeps the open connections; it and the bookkeeping run on the event loop, a few
microseconds per connection.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from typing import Any

import structlog

from common.error_types import error_type

log = structlog.get_logger(__name__)

# Descriptors the frontend keeps for itself beside its HTTP connections: ZMQ sockets and their signalling pipes,
# the body worker's pipes, logs, the listening socket (about 40 measured; the rest is margin).
RESERVED_FDS = 128
_SWEEP_S = 1.0
# How long a refused connection stays half-closed for its client to read the 503.
_REFUSED_LINGER_S = 1.0


def default_max_connections() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(16, soft - RESERVED_FDS)


def _refusal() -> bytes:
    body = json.dumps({"error": {"message": "too many open connections; try again later", "type": error_type(503),
                                 "param": None, "code": 503}}, separators=(",", ":")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


class ConnectionGuard:
    """The open connections of one frontend, their timeouts and the cap (one per process)."""

    def __init__(self, max_connections: int, header_timeout_s: float, body_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.open: dict[Any, None] = {}  # insertion-ordered: the oldest first
        self.num_refused = self.num_evicted = self.num_header_timeouts = self.num_body_timeouts = 0
        self._sweeping = False

    def opened(self, conn) -> bool:
        """False: the connection was refused (answered 503 and closed)."""
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep)
        if len(self.open) >= self.max_connections:
            waiting = [c for c in self.open if c.guard_waiting()]
            if not waiting:
                self.num_refused += 1
                log.warning("connection_refused", open=len(self.open), max_connections=self.max_connections)
                return False
            oldest = min(waiting, key=lambda c: c.guard_since)
            self.num_evicted += 1
            self._close(oldest)
        self.open[conn] = None
        return True

    def closed(self, conn) -> None:
        self.open.pop(conn, None)

    def _close(self, conn) -> None:
        self.open.pop(conn, None)
        if not conn.transport.is_closing():
            conn.transport.close()

    def _sweep(self) -> None:
        now = time.monotonic()
        header, body = self.num_header_timeouts, self.num_body_timeouts
        for conn in list(self.open):
            if conn.guard_waiting():
                if now - conn.guard_since > self.header_timeout_s:
                    self.num_header_timeouts += 1
                    self._close(conn)
            elif conn.guard_body_stalled(now, self.body_timeout_s):
                self.num_body_timeouts += 1
                self._close(conn)
        if (header, body) != (self.num_header_timeouts, self.num_body_timeouts):  # one line a second at most
            log.info("connections_reaped", header_timeouts=self.num_header_timeouts - header,
                     body_timeouts=self.num_body_timeouts - body, open=len(self.open),
                     evicted_total=self.num_evicted, refused_total=self.num_refused)
        asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep)


def guarded_protocol(base: type, guard: ConnectionGuard) -> type:
    """uvicorn's HTTP protocol class `base` (httptools' or h11's), with the guard's bookkeeping."""

    class Guarded(base):
        guard_since = 0.0  # when it began to wait for a request
        guard_data_at = 0.0  # when data last came in

        guard_refused = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.guard_since = self.guard_data_at = time.monotonic()
            if not guard.opened(self):
                # Answered, then half-closed: closing at once with the client's request unread would send a reset
                # that can reach the client before the answer. Closed when the client closes, or in 1 s.
                self.guard_refused = True
                self.connections.discard(self)
                transport.write(_refusal())
                if transport.can_write_eof():
                    transport.write_eof()
                self.loop.call_later(_REFUSED_LINGER_S, transport.close)

        def connection_lost(self, exc) -> None:
            guard.closed(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.guard_refused:
                return  # the request of a refused connection, read and dropped
            self.guard_data_at = time.monotonic()
            super().data_received(data)

        def eof_received(self) -> None:
            if self.guard_refused:
                self.transport.close()
                return
            super().eof_received()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.guard_since = time.monotonic()  # waiting for the next request on a keep-alive connection

        def guard_waiting(self) -> bool:
            """No request under way: none yet, or the last one answered (a partial header counts as none)."""
            return self.cycle is None or self.cycle.response_complete

        def guard_body_stalled(self, now: float, timeout_s: float) -> bool:
            cycle = self.cycle
            return (cycle is not None and not cycle.response_complete and cycle.more_body
                    and not self.flow.read_paused and now - self.guard_data_at > timeout_s)

    Guarded.__name__ = f"Guarded{base.__name__}"
    return Guarded


def http_protocol(guard: ConnectionGuard) -> type:
    """The protocol class uvicorn would pick ("auto": httptools when installed, else h11), guarded."""
    base: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        base = HttpToolsProtocol
    except ImportError:  # httptools is optional
        from uvicorn.protocols.http.h11_impl import H11Protocol
        base = H11Protocol
    return guarded_protocol(base, guard)
