"""Wire structs for text generation (chat and completions). Wire structs only, no logic.

A frontend sends one GenerateRequest per HTTP request. The backend answers with DeltasEvent batches: one
event per frontend per engine step, holding the new text of every request of that frontend that advanced.
A request that fails before or during generation gets a GenerateErrorReply instead of (or after) deltas.
"""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo


class ToolCall(msgspec.Struct, kw_only=True):
    """A function call an assistant message made (in the history a client sends back)."""

    id: str
    name: str
    # The arguments as the client holds them: JSON-encoded (OpenAI's shape).
    arguments: str


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    # Text content; the frontend flattens OpenAI content parts to text before sending ("" for none).
    content: str
    name: str | None = None
    # An assistant message's function calls.
    tool_calls: list[ToolCall] | None = None
    # A tool message: the call it answers.
    tool_call_id: str | None = None
    # An assistant message's reasoning, for templates that render it (Qwen3's reasoning_content).
    reasoning: str | None = None


class ToolSpec(msgspec.Struct, kw_only=True):
    """A function the model may call (OpenAI `tools[i].function`)."""

    name: str
    description: str | None = None
    # The JSON schema of its parameters, JSON-encoded (the wire has no `Any`); empty: none given.
    parameters: str = ""
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    # "text", "json_object" or "json_schema".
    type: str
    # The JSON schema, JSON-encoded (the wire has no `Any`); empty unless type == "json_schema".
    json_schema: str = ""


class EnforcedToken(msgspec.Struct, kw_only=True):
    token: str
    top_tokens: list[str] = []


class SamplingSpec(msgspec.Struct, kw_only=True):
    # Choices to generate from one prompt (vLLM fans them out as separate engine requests).
    n: int = 1
    # None: up to max_model_len - prompt_len.
    max_tokens: int | None = None
    min_tokens: int = 0
    # These five: None where the request leaves them out, and the backend applies the model's defaults
    # (its generation_config, as `vllm serve` does; common/sampling_defaults.py), else vLLM's neutral values.
    temperature: float | None = None
    top_p: float | None = None
    # 0 or -1: disabled.
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
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
    # Chat only: the functions the model may call, given to the chat template and to the tool parser.
    tools: list[ToolSpec] | None = None
    # "none", "auto" or "required"; None: OpenAI's default ("auto" with tools, "none" without).
    tool_choice: str | None = None
    # A named tool choice (the model must call this function); tool_choice is then ignored.
    named_tool: str | None = None
    # False: at most one tool call per choice.
    parallel_tool_calls: bool = True


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


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A tool call parsed from the output, whole (in a non-streamed answer) or a piece of one (streaming)."""

    # Position of the call in the choice's tool_calls.
    index: int
    # Set on a call's first piece (and in a whole call).
    id: str | None = None
    name: str | None = None
    # A fragment of the JSON-encoded arguments when streaming; all of them in a whole call.
    arguments: str | None = None


class Delta(msgspec.Struct, kw_only=True):
    rid: str
    # With a tool or reasoning parser at work: the content only (no tool-call markup, no reasoning).
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    # "stop", "length", "tool_calls", "abort", "error" once finished; None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the request, if any.
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    # Cumulative number of generated tokens so far (of this choice).
    num_generated_tokens: int = 0
    # The choice this delta belongs to (0 .. n-1).
    index: int = 0
    # Reasoning text (a reasoning parser split it from the content); None: none in this delta.
    reasoning: str | None = None
    # Tool calls the tool parser found; None: none in this delta.
    tool_calls: list[ToolCallDelta] | None = None
    # vLLM's RequestOutput counts of the engine output this delta came from: prompt tokens found in the prefix
    # cache, and prompt tokens this request added to it. The frontend shows them as usage.prompt_tokens_details
    # when --enable-prompt-tokens-details is on. None: a backend that does not send them.
    num_cached_tokens: int | None = None
    num_cache_creation_tokens: int | None = None


class DeltasEvent(msgspec.Struct, tag="deltas", kw_only=True):
    deltas: list[Delta]


class GenerateErrorReply(msgspec.Struct, tag="gen_error", kw_only=True):
    rid: str
    error: ErrorInfo
