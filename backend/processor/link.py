"""Frames on the link between the engine process and the processor process (protocol/processor.py).

A header struct, then, for the messages that carry them, vLLM's own structs encoded by vLLM's MsgpackEncoder
(numpy logprob arrays travel as extra frames, uncopied). One instance per thread: the encoders reuse buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from backend.processor import PreparedRequests
from protocol.processor import EngineOutputs, FromProcessor, Prepared, ToProcessor

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
