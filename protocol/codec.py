"""Encode/decode helpers and the two tagged unions, one per direction."""

from __future__ import annotations

import msgspec

from protocol.control import (
    DeadEvent,
    ErrorReply,
    HelloRequest,
    MetricsReply,
    MetricsRequest,
    PingRequest,
    PongReply,
    ReadyReply,
)
from protocol.generate import AbortRequest, DeltasEvent, GenerateErrorReply, GenerateRequest
from protocol.poc import PocArtifactsReply, PocArtifactsRequest
from protocol.pow import (
    PowGenerateRequest,
    PowInitRequest,
    PowJobReply,
    PowJobRequest,
    PowStatusReply,
    PowStatusRequest,
    PowStopRequest,
)
from protocol.tokenize import DetokenizeReply, DetokenizeRequest, TokenizeReply, TokenizeRequest

ToBackend = (
    HelloRequest | PingRequest | GenerateRequest | AbortRequest | PocArtifactsRequest
    | PowInitRequest | PowGenerateRequest | PowJobRequest | PowStatusRequest | PowStopRequest
    | TokenizeRequest | DetokenizeRequest | MetricsRequest
)
ToFrontend = (
    ReadyReply | PongReply | DeltasEvent | GenerateErrorReply | ErrorReply | DeadEvent | PocArtifactsReply
    | PowJobReply | PowStatusReply | TokenizeReply | DetokenizeReply | MetricsReply
)


class Codec:
    """Encoder plus a decoder for one direction; one instance per thread (encoders reuse buffers)."""

    def __init__(self, decode_type: object) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(decode_type)

    def encode(self, msg: msgspec.Struct) -> bytes:
        return self._encoder.encode(msg)

    def decode(self, frame: bytes | memoryview):
        """Raises msgspec.DecodeError (ValidationError is a subclass) on a malformed frame."""
        try:
            return self._decoder.decode(frame)
        except (UnicodeDecodeError, RecursionError) as e:
            # msgspec lets these escape for invalid UTF-8 in a str and for nesting past the recursion limit
            # (even inside an ignored field); callers handle malformed frames by catching DecodeError only.
            raise msgspec.DecodeError(f"{type(e).__name__}: {e}") from None


def backend_codec() -> Codec:
    """Decodes what frontends send, encodes what the backend sends."""
    return Codec(ToBackend)


def frontend_codec() -> Codec:
    """Decodes what the backend sends, encodes what frontends send."""
    return Codec(ToFrontend)
