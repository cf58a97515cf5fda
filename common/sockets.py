"""The one ZMQ socket factory of every process: buffering, linger and, for clients, reconnect and heartbeats."""

from __future__ import annotations

import zmq


def make_socket(ctx: zmq.Context, kind: int, *, linger_ms: int = 0) -> zmq.Socket:
    """Unbounded HWM (backpressure is the backend loop's job, never a silently dropped frame), explicit linger."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, linger_ms)
    return sock


def make_client_socket(ctx: zmq.Context, routing_id: bytes, *, heartbeat_ivl_ms: int, timeout_ms: int) -> zmq.Socket:
    """A frontend's DEALER to the backend.

    IMMEDIATE: no queueing for a peer that isn't connected, so a down backend means a fast 503. A stable routing
    id, so the backend's ROUTER (ROUTER_HANDOVER) keeps routing replies and aborts to us across reconnects. A
    network that drops packets silently (no RST) leaves TCP retransmitting with exponential backoff, so recovery
    after the link returns grew with the outage (14 s after a 45 s cut, up to minutes): ZMTP heartbeats drop a
    connection silent for `timeout_ms` (TTL: the backend drops its end too) and reconnect, and the connect timeout
    stops each SYN into the void from waiting for the kernel's ~2 min."""
    sock = make_socket(ctx, zmq.DEALER)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ivl_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, timeout_ms)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, timeout_ms)
    return sock
