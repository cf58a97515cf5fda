"""Watches the DEALER's connection to the backend: whether it is up, and handshakes the backend refused.

Up means a ZMTP handshake succeeded and no disconnect followed. libzmq's own I/O threads keep the connection: they
answer ZMTP heartbeats without Python, so a backend whose Python threads are stalled (its engine thread holding the
GIL in a native call for seconds: a kernel's JIT compile) stays connected, while one whose process died, or whose
network went silent past the heartbeat timeout, is disconnected at once (backend_client.py tells the two apart by it).

libzmq reports a refused handshake (our CURVE key is not authorised, or CURVE is on at one side only) only on a
socket monitor, and never retries such a connection by itself. Meanwhile nothing answers our pings, so /health
stays red and requests answer 503 (the breaker's usual path). We reconnect after `retry_s`: the backend may have
been given our key by then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, cast

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

log = structlog.get_logger(__name__)

_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_EVENTS = _REFUSED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class HandshakeWatch:
    """Owns the monitor socket of `sock`; create it before `sock` connects, close it before `sock` closes.
    `on_change(is_connected)` is called on the event loop when the connection comes up or goes down."""

    def __init__(self, sock: zmq.Socket, address: str, loop: asyncio.AbstractEventLoop, *, retry_s: float,
                 public_key: bytes | None, on_change: Callable[[bool], None] = lambda _: None) -> None:
        self.address = address
        self.retry_s = retry_s
        self.num_refused = 0
        self.is_connected = False
        self._on_change = on_change
        self._sock = sock
        self._loop = loop
        # Logged with each refusal so the operator knows which key to authorise (None: no CURVE here).
        self._public_key = public_key.decode() if public_key is not None else None
        self._retry: asyncio.TimerHandle | None = None
        self._monitor = sock.get_monitor_socket(_EVENTS)
        loop.add_reader(self._monitor, self._drain)
        # A zmq FD signals edges, and a new socket's first message raises none until EVENTS has been read once.
        loop.call_soon(self._drain)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        self._loop.remove_reader(self._monitor)
        self._sock.disable_monitor()
        self._monitor.close(linger=0)

    def _drain(self) -> None:
        """Reader callback: the monitor's FD, like any zmq FD, only signals edges, so read all that is ready."""
        mon = self._monitor
        while not mon.closed and cast(int, mon.get(zmq.EVENTS)) & zmq.POLLIN:
            event = recv_monitor_message(mon, zmq.NOBLOCK)
            if event["event"] in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):
                is_connected = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
                if is_connected != self.is_connected:
                    self.is_connected = is_connected
                    self._on_change(is_connected)
                continue
            self.num_refused += 1
            if self.num_refused <= 10 or self.num_refused % 100 == 0:
                log.error("backend_handshake_refused", address=self.address, reason=refusal_reason(event),
                          public_key=self._public_key, retry_in_s=self.retry_s, num_refused=self.num_refused)
            if self._retry is None:
                self._retry = self._loop.call_later(self.retry_s, self._reconnect)

    def _reconnect(self) -> None:
        self._retry = None
        if self._sock.closed:
            return
        # libzmq may have dropped the endpoint already: connecting again is all that is needed then.
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disconnect(self.address)
        self._sock.connect(self.address)


def refusal_reason(event: Mapping[str, Any]) -> str:
    value = int(event["value"])
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the backend does not authorise this frontend's CURVE public key (ZAP status {value})"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "CURVE is on at one side only: the backend's and this frontend's CURVE settings differ"
    return f"ZMTP handshake error {value:#x}"
