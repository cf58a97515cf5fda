"""Wire structs between the backend's engine process and its processor process. Wire structs only, no logic.

The processor turns GenerateRequests into vLLM EngineCoreRequests (chat template, tokenizer, input checks) and
the engine's EngineCoreOutputs into DeltasEvents (detokenizer, stop strings, logprobs), which it sends to the
frontends on a socket of its own (a frontend's second connection) or through the engine process's io thread.
vLLM's own structs travel as the frames that follow one of these headers, encoded by vLLM's MsgpackEncoder (as
between vLLM's API server and its engine core).

Frames on the link: [header] or [header, *vllm_frames] for the structs below, and [FORWARD, identity,
payload, identity, payload, ...] for encoded ToFrontend messages the io thread passes on unread.
Both ends are one build of this repository, started together: no version handshake.
"""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo, ProcessorStats
from protocol.generate import GenerateRequest
from protocol.tokenize import DetokenizeRequest, TokenizeRequest

# First frame of a batch of encoded messages for frontends (never a msgspec header: those are maps).
FORWARD = b"fwd"


class PrepareRequest(msgspec.Struct, tag="p.prepare", kw_only=True):
    """Engine → processor: turn this request into engine requests (answered by Prepared or PrepareFailed)."""

    engine_rid: str
    # The frontend that sent it: the processor addresses that request's deltas to it.
    identity: bytes
    request: GenerateRequest


class TokenizeJob(msgspec.Struct, tag="p.tokenize", kw_only=True):
    """Engine → processor: answer this /tokenize or /detokenize request (the reply goes to the frontend as a
    FORWARD frame, like deltas)."""

    identity: bytes
    request: TokenizeRequest | DetokenizeRequest


class EngineOutputs(msgspec.Struct, tag="p.outputs", kw_only=True):
    """Engine → processor: one engine step's EngineCoreOutputs follow as vLLM frames."""


class MetricsJob(msgspec.Struct, tag="p.metrics", kw_only=True):
    """io thread → processor: answer this frontend's MetricsRequest (the reply goes to it as a FORWARD frame)."""

    identity: bytes
    rid: str


class EngineBuilt(msgspec.Struct, tag="p.engine", kw_only=True):
    """Engine → processor, once both are up: what only the built engine knows (vLLM's API server learns it in
    its handshake with the engine core)."""

    num_gpu_blocks: int
    # The context the engine serves: vLLM's auto-fit (max_model_len -1, the CPU engine's default) sizes it to the
    # KV cache, which the processor's own config cannot know; 0 keeps the processor's own.
    max_model_len: int = 0


class ForgetRequest(msgspec.Struct, tag="p.forget", kw_only=True):
    """Engine → processor: these requests were aborted (or refused after preparing): drop their state."""

    engine_rids: list[str]


class Prepared(msgspec.Struct, tag="p.prepared", kw_only=True):
    """Processor → engine: the engine requests for `engine_rid` (one per choice) follow as vLLM frames."""

    engine_rid: str
    internal_ids: list[str]


class PrepareFailed(msgspec.Struct, tag="p.failed", kw_only=True):
    """Processor → engine: the request was refused (a client mistake) or could not be prepared."""

    engine_rid: str
    error: ErrorInfo


class StopStringsHit(msgspec.Struct, tag="p.stopped", kw_only=True):
    """Processor → engine: these engine requests (vLLM's internal ids: one choice each) finished on a stop string
    (their final delta is sent); the engine aborts them without a reply."""

    internal_ids: list[str]


class ProcessorReady(msgspec.Struct, tag="p.ready", kw_only=True):
    """Processor → engine, once: the tokenizer and vLLM's processors are loaded."""

    pid: int
    vocab_size: int
    # Where the processor sends frontends their deltas itself (backend/processor/direct.py), as bound; None: off.
    deltas_endpoint: str | None = None


ToProcessor = PrepareRequest | EngineOutputs | ForgetRequest | TokenizeJob | MetricsJob | EngineBuilt
FromProcessor = Prepared | PrepareFailed | StopStringsHit | ProcessorReady | ProcessorStats
