"""The frontend's second connection: a DEALER to the backend processor's own ROUTER, on which the processor sends
this frontend its streams' deltas itself rather than through the backend's engine process (backend/processor/
direct.py says why).

Opened when the backend's ReadyReply names the endpoint; the same routing id, CURVE keys, heartbeats and
reconnects as the main DEALER (frontend/backend_client.py `_connect`). Every pong, a Hello on it tells the
processor this frontend reads here, so the requests it prepares from then on come this way. Nothing but Hello
is ever sent on it. When it drops, its streams' deltas in flight are lost, so the client fails those streams, as
when the main connection drops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import structlog
import zmq

from frontend.handshakes import HandshakeWatch

log = structlog.get_logger(__name__)


def connect_address(backend_address: str, endpoint: str) -> str:
    """Where to reach the processor's `endpoint` (as it bound it): for tcp, the host this frontend reaches the
    backend at and the endpoint's port (the backend may have bound 0.0.0.0 or a name only it resolves)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "tcp" and backend_address.startswith("tcp://"):
        host = backend_address.removeprefix("tcp://").rpartition(":")[0]
        return f"tcp://{host}:{rest.rpartition(':')[2]}"
    return endpoint


class DirectConnection:
    """Owns `sock` (connected, its handshakes watched by `watch`, whose callback fails the streams on a drop) from
    here on; hands every message to `on_frame`."""

    def __init__(self, sock: zmq.Socket, watch: HandshakeWatch, loop: asyncio.AbstractEventLoop,
                 on_frame: Callable[[bytes], None]) -> None:
        self.address = watch.address
        self.handshakes = watch
        self.num_messages = 0
        self._sock = sock
        self._loop = loop
        self._on_frame = on_frame
        loop.add_reader(sock, self._drain)
        log.info("backend_direct_connecting", address=self.address)

    @property
    def is_connected(self) -> bool:
        return self.handshakes.is_connected

    def hello(self, payload: bytes) -> None:
        """Tells the processor we read here (again: it forgets a frontend silent for a while). Dropped while not
        connected (IMMEDIATE): the next pong sends another."""
        try:
            self._sock.send(payload, flags=zmq.NOBLOCK)
        except zmq.Again:
            return
        self._loop.call_soon(self._drain)  # a send can consume the FD's edge of a message already here

    def close(self) -> None:
        self._loop.remove_reader(self._sock)
        self.handshakes.close()
        self._sock.close(linger=0)

    def _drain(self) -> None:
        sock = self._sock
        while not sock.closed and cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            self.num_messages += 1
            self._on_frame(sock.recv(zmq.NOBLOCK))
