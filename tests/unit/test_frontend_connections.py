"""Slow and idle clients (frontend/connections.py): a real uvicorn server with the guarded protocol on loopback,
and raw sockets as the clients. Timeouts are short (0.5 s) so each test takes seconds; waits for a close are
bounded by a generous deadline, never asserted as speeds."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from frontend.connections import ConnectionGuard, guarded_protocol, http_protocol
from tests.stack import free_port

TIMEOUT_S = 0.5
# Long enough for a sweep (1 s) past the timeout on a loaded machine; only reached if the guard fails.
DEADLINE_S = 20.0


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @app.get("/slow")
    async def slow(seconds: float) -> StreamingResponse:
        async def chunks():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                yield b"."
                await asyncio.sleep(0.1)

        return StreamingResponse(chunks())

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return body

    return app


@contextmanager
def serving(max_connections: int = 100, base: type | None = None) -> Iterator[tuple[int, ConnectionGuard]]:
    guard = ConnectionGuard(max_connections, TIMEOUT_S, TIMEOUT_S)
    port = free_port()
    protocol = http_protocol(guard) if base is None else guarded_protocol(base, guard)
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_config=None,
                                           lifespan="off", http=protocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield port, guard
    finally:
        server.should_exit = True
        thread.join(10)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes the connection (a timeout here means it never did)."""
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def get(port: int, path: str) -> bytes:
    with connect(port) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        return read_all(s)


@pytest.mark.parametrize("base", [None, H11Protocol], ids=["auto", "h11"])
@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nhost: x\r\n"], ids=["nothing", "half a header"])
def test_a_connection_without_a_complete_request_is_closed(sent, base):
    with serving(base=base) as (port, guard), connect(port) as s:
        s.sendall(sent)
        assert read_all(s) == b""  # closed, no answer
        assert guard.num_header_timeouts == 1 and not guard.open


def test_a_keep_alive_connection_that_sends_half_a_header_after_a_request_is_closed():
    with serving() as (port, guard), connect(port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert b'{"ok":true}' in s.recv(65536)
        s.sendall(b"GET /health HTT")  # uvicorn's keep-alive timer stops at the first byte; the guard's does not
        assert read_all(s) == b""
        assert guard.num_header_timeouts == 1


@pytest.mark.parametrize("base", [None, H11Protocol], ids=["auto", "h11"])
def test_a_stalled_body_is_closed(base):
    with serving(base=base) as (port, guard), connect(port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
        read_all(s)
        assert guard.num_body_timeouts == 1 and not guard.open


def test_a_request_under_way_is_never_closed():
    """A stream four times the timeouts long runs to its end."""
    with serving() as (port, guard):
        answer = get(port, f"/slow?seconds={4 * TIMEOUT_S}")
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b".") >= 4 * TIMEOUT_S / 0.1 - 2
        assert guard.num_header_timeouts == guard.num_body_timeouts == 0


def test_past_the_cap_the_longest_idle_connection_makes_room():
    with serving(max_connections=5) as (port, guard):
        idle = [connect(port) for _ in range(5)]
        time.sleep(0.05)  # let the server accept them in this order
        assert get(port, "/health").startswith(b"HTTP/1.1 200")
        assert guard.num_evicted == 1
        assert read_all(idle[0]) == b""  # the oldest was closed
        for s in idle:
            s.close()


def test_past_the_cap_with_every_connection_busy_the_new_one_is_refused_clearly():
    with serving(max_connections=3) as (port, guard):
        busy = [connect(port) for _ in range(3)]
        for s in busy:
            s.sendall(f"GET /slow?seconds={8 * TIMEOUT_S} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        for s in busy:
            assert s.recv(12) == b"HTTP/1.1 200"  # each is under way
        refused = get(port, "/health")
        assert refused.startswith(b"HTTP/1.1 503")
        assert b'"message":"too many open connections; try again later"' in refused
        assert guard.num_refused == 1 and guard.num_evicted == 0
        for s in busy:
            assert read_all(s).endswith(b".\r\n0\r\n\r\n")  # the streams ran to their end, untouched
            s.close()
