"""Frames on the link between the engine process and the processor process (protocol/processor.py).

A header struct, then, for the messages that carry them, vLLM's own structs encoded by vLLM's MsgpackEncoder
(numpy logprob arrays travel as extra frames, uncopied). One instance per thread: the encoders reuse buffers.

The engine process has two sockets to the processor: the link, the io thread's (backend/transport/server.py), and
`EngineOut`, the engine thread's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import structlog
import zmq
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from backend.processor import PreparedRequests
from common.sockets import make_socket
from protocol.processor import EngineOutputs, FromProcessor, Prepared, ToProcessor

log = structlog.get_logger(__name__)

Frames = Sequence[Any]  # bytes, memoryviews or zmq.Frames


class EngineSide:
    """The engine process's end: encodes ToProcessor, decodes FromProcessor (with its EngineCoreRequests)."""

    def __init__(self) -> None:
        self._header = msgspec.msgpack.Encoder()
        self._headers = msgspec.msgpack.Decoder(FromProcessor)
        self._vllm = MsgpackEncoder()
        self._requests = MsgpackDecoder(list[EngineCoreRequest])

    def encode(self, msg) -> list:
        """`msg`: a ToProcessor struct, or vLLM's EngineCoreOutputs (sent as EngineOutputs + its frames)."""
        if isinstance(msg, EngineCoreOutputs):
            return [self._header.encode(EngineOutputs()), *self._vllm.encode(msg)]
        return [self._header.encode(msg)]

    def decode(self, frames: Frames):
        """A FromProcessor struct; a Prepared one comes as PreparedRequests."""
        header = self._headers.decode(frames[0])
        if isinstance(header, Prepared):
            return PreparedRequests(header, self._requests.decode(frames[1:]))
        return header


class EngineOut:
    """The engine thread's own socket to the processor: what that thread has for it (each step's outputs, prepare,
    forget and tokenize jobs, EngineBuilt) is encoded and sent on that thread, in the order sent.

    Through the io thread, each step's outputs woke it, and its GIL acquisitions (the wake-up, the encode, the
    send, the poll around them) each made the engine thread wait for the GIL at its next release, in every torch
    call: ~10 waits a step against 2.8 in `vllm serve`'s engine thread on an H100 at an open load, where both are
    host-bound (docs/decisions.md, "The engine thread sends to the processor itself"). Encoding here costs the
    engine thread what the io thread's encoding cost it anyway under the one GIL."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self._sock = make_socket(ctx, zmq.PAIR)
        self._sock.bind(address)
        self._codec = EngineSide()

    def send(self, msg) -> None:
        """Engine thread only. Never blocks: a processor that is gone is the engine loop's to notice."""
        try:
            self._sock.send_multipart(self._codec.encode(msg), copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("processor_link_unwritable")

    def close(self) -> None:
        self._sock.close()


class ProcessorSide:
    """The processor's end: decodes ToProcessor (EngineOutputs with its EngineCoreOutputs), encodes the rest."""

    def __init__(self) -> None:
        self._header = msgspec.msgpack.Encoder()
        self._headers = msgspec.msgpack.Decoder(ToProcessor)
        self._vllm = MsgpackEncoder()
        self._outputs = MsgpackDecoder(EngineCoreOutputs)

    def decode(self, frames: Frames):
        """A ToProcessor struct, or the EngineCoreOutputs an EngineOutputs header announced."""
        header = self._headers.decode(frames[0])
        if isinstance(header, EngineOutputs):
            return self._outputs.decode(frames[1:])
        return header

    def encode(self, msg: msgspec.Struct, requests: list[EngineCoreRequest] | None = None) -> list:
        frames = [self._header.encode(msg)]
        if requests is not None:
            frames.extend(self._vllm.encode(requests))
        return frames
