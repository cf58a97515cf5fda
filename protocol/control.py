"""Wire structs for the connection itself: handshake, liveness, errors, death. Wire structs only, no logic."""

from __future__ import annotations

import msgspec

from protocol.common import BackendStats, ErrorInfo, Fingerprint


class HelloRequest(msgspec.Struct, tag="hello", kw_only=True):
    protocol_version: int
    frontend_id: str


class ReadyReply(msgspec.Struct, tag="ready", kw_only=True):
    # Set when the backend accepts the frontend.
    fingerprint: Fingerprint | None = None
    # Set when it refuses it (protocol version mismatch); the frontend must exit.
    refusal: str | None = None
    # Where the backend's processor sends deltas itself, as it bound it (tcp: the frontend keeps its own host for
    # the backend and takes this port); the frontend connects a second DEALER there. None: every delta comes on
    # this connection.
    deltas_endpoint: str | None = None


class PingRequest(msgspec.Struct, tag="ping", kw_only=True):
    ping_id: int


class PongReply(msgspec.Struct, tag="pong", kw_only=True):
    ping_id: int
    stats: BackendStats


class ErrorReply(msgspec.Struct, tag="error", kw_only=True):
    """Answer to a frame the backend could not decode, or whose handler failed."""

    error: ErrorInfo
    # The request id of the failed message when it had one (the frontend fails that request).
    rid: str | None = None


class DeadEvent(msgspec.Struct, tag="dead", kw_only=True):
    """Sent to every known frontend when the engine died; the backend exits right after."""

    reason: str


class MetricsRequest(msgspec.Struct, tag="metrics", kw_only=True):
    """For /metrics: the vllm:* families that vLLM's own stat logger keeps in the processor process."""

    rid: str


class MetricsReply(msgspec.Struct, tag="metrics_done", kw_only=True):
    rid: str
    # Prometheus text exposition; empty while the processor is not up.
    text: bytes = b""
