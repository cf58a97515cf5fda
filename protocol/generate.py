"""Wire structs for text generation (chat and completions). Wire structs only, no logic.

A frontend sends one GenerateRequest per HTTP request. The backend answers with DeltasEvent batches: one
event per frontend per engine step, holding the new text of every request of that frontend that advanced.
A request that fails before or during generation gets a GenerateErrorReply instead of (or after) deltas.
"""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    # Text content; the frontend flattens OpenAI content parts to text before sending.
    content: str
    name: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    # "text", "json_object" or "json_schema".
    type: str
    # The JSON schema, JSON-encoded (the wire has no `Any`); empty unless type == "json_schema".
    json_schema: str = ""


class EnforcedToken(msgspec.Struct, kw_only=True):
    token: str
    top_tokens: list[str] = []


class SamplingSpec(msgspec.Struct, kw_only=True):
    # None: up to max_model_len - prompt_len.
    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    # 0 or -1: disabled.
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Number of top alternatives per position; None: no logprobs at all.
    logprobs: int | None = None
    # "raw_logprobs" / "processed_logprobs"; None: the engine default.
    logprobs_mode: str | None = None
    response_format: ResponseFormat | None = None
    # Validator replay (chat only): exactly one of these may be set; enforced_str wins at the frontend.
    enforced_tokens: list[EnforcedToken] | None = None
    enforced_str: str | None = None


class GenerateRequest(msgspec.Struct, tag="gen", kw_only=True):
    # Request id chosen by the frontend; unique per frontend, echoed in every reply.
    rid: str
    sampling: SamplingSpec
    # Chat requests carry messages (rendered with the model's chat template by the backend);
    # completion requests carry a prompt. Exactly one is set.
    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    # Stream: deltas every engine step; otherwise one final delta.
    stream: bool = False
    # Priority class: chat traffic is 0; lower runs first in vLLM's priority scheduling.
    priority: int = 0


class AbortRequest(msgspec.Struct, tag="abort", kw_only=True):
    rids: list[str]


class TopLogprob(msgspec.Struct, kw_only=True):
    token_id: int
    # Decoded text of the token (the frontend decides whether to show ids or text).
    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, kw_only=True):
    token_id: int
    token: str
    logprob: float
    rank: int | None = None
    top: list[TopLogprob] = []


class Delta(msgspec.Struct, kw_only=True):
    rid: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    # "stop", "length", "abort", "error" once finished; None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the request, if any.
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    # Cumulative number of generated tokens so far.
    num_generated_tokens: int = 0


class DeltasEvent(msgspec.Struct, tag="deltas", kw_only=True):
    deltas: list[Delta]


class GenerateErrorReply(msgspec.Struct, tag="gen_error", kw_only=True):
    rid: str
    error: ErrorInfo
