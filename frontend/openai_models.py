"""Pydantic models of the OpenAI request bodies we accept (validation at the HTTP edge only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.json_schema import JsonDict

from frontend.fields import Count, Index, Int64, Text, TopK, TopLogprobs

TokenId = Index  # never negative


class _Strict(BaseModel):
    # Unknown fields are a client mistake: 400 naming the field, never silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: "1" is not an integer, 0 not a boolean


class ContentPart(_Strict):
    type: Literal["text"]
    text: Text


class FunctionCall(_Strict):
    name: Text
    # JSON-encoded, as OpenAI carries them.
    arguments: Text


class ToolCallParam(_Strict):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    # An assistant turn's function calls, and a tool turn's answer to one (agent loops send both back).
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: Text | None = None
    # An assistant turn's reasoning, as vllm serve returned it (either name).
    reasoning_content: Text | None = None
    reasoning: Text | None = None
    # What the openai client sends back when a response message object is appended to the history as is.
    refusal: Text | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDefinition(_Strict):
    name: Text = Field(min_length=1)
    description: Text | None = None
    # The JSON schema of the arguments (checked as a schema by the backend).
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: Text


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(_Strict):
    name: Text = "response"
    description: Text | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class EnforcedTokenItem(_Strict):
    token: Text
    top_tokens: list[Text] = []


class EnforcedTokens(_Strict):
    tokens: list[EnforcedTokenItem]


# `stop` as the schema states it: one string or up to 16, none empty. stop_list below refuses the rest with one
# clear message (constraints on the union's members would report the member that failed, e.g. "should be a valid
# string" for [""]), so the bounds are stated here for the schema only.
_StopString = Annotated[Text, Field(json_schema_extra={"minLength": 1})]
Stop = _StopString | Annotated[list[_StopString], Field(json_schema_extra={"maxItems": 16})] | None


def stop_list(v: str | list[str] | None) -> list[str]:
    """`stop` as a list (vLLM's limit: up to 16 non-empty strings); chat, completions and responses share it."""
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if len(stops) > 16 or any(not s for s in stops):
        raise ValueError("stop takes up to 16 non-empty strings")
    return stops


class _Sampling(_Strict):
    model: Text
    # Bounded by the backend's --max-num-seqs (a 400 naming `n` beyond it).
    n: Count = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    # Bounded above only by finiteness: JSON bodies may carry Infinity, which vLLM refuses.
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    seed: Int64 | None = None
    stop: Stop = None
    stop_token_ids: list[TokenId] = []
    ignore_eos: bool = False
    min_tokens: Index = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: Text | None = None
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] | None = None
    # vLLM's: lower runs first under --scheduling-policy priority; fcfs takes it and ignores it.
    priority: Int64 = 0

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        return stop_list(v)


# Any tool_choice but "none" (or null) needs `tools`, as the schema states it (the validator below refuses the rest).
_CHOICE_NEEDS_TOOLS: JsonDict = {
    "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"enum": ["none", None]}}}},
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array"}}}}


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra=_CHOICE_NEEDS_TOOLS)

    messages: list[Message] = Field(min_length=1)
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    response_format: ResponseFormat | None = None
    enforced_tokens: EnforcedTokens | None = None
    enforced_str: Text | None = None
    # The schema says what the validator below refuses (an empty array), as OpenAI's API does.
    tools: list[ToolParam] | None = Field(None, json_schema_extra={"minItems": 1}, description=(
        "Two tools may share a function name, as vLLM serves them (a tool call names only the function)."))
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(None, description=(
        "Any choice but \"none\" needs `tools` (stated), and a named function must be one of `tools`: a 400 "
        "naming `tool_choice` otherwise (JSON Schema cannot compare the name with the array's names)."))
    parallel_tool_calls: bool | None = None

    @field_validator("tools")
    @classmethod
    def _some_tools(cls, v: list[ToolParam] | None) -> list[ToolParam] | None:
        if v is not None and not v:
            raise ValueError("must not be an empty array; give at least one tool or leave the field out")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_matches_tools(cls, v, info: ValidationInfo):
        if v is None or v == "none":
            return v
        tools = info.data.get("tools")
        if not tools:
            raise ValueError("needs `tools` (only \"none\" goes without them)")
        if isinstance(v, NamedToolChoice) and v.function.name not in {t.function.name for t in tools}:
            raise ValueError(f"names the function {v.function.name!r}, which is not in `tools`")
        return v


# A completion prompt that is not empty (the backend refuses a prompt of no tokens), alone or in a list of one.
_Prompt = Annotated[Text, Field(min_length=1)]


class CompletionRequest(_Sampling):
    prompt: _Prompt | Annotated[list[_Prompt], Field(min_length=1, max_length=1)]
    max_tokens: Count | None = 16
    logprobs: TopLogprobs | None = None
    echo: Literal[False] = False
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt is supported")
            return v[0]
        return v


class TokenizeRequest(_Strict):
    """vllm serve's /tokenize: a prompt, or chat messages rendered with the chat template (exactly one).

    The schema states the two rules across fields that frontend/convert.py applies (400s): exactly one of `prompt`
    and `messages` (null counts as left out), and with messages, `continue_final_message` true needs
    `add_generation_prompt` false, sent (it defaults to true): vLLM refuses both true.
    """

    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"oneOf": [{"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                   {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]},
        {"not": {"required": ["messages", "continue_final_message"],
                 "properties": {"messages": {"type": "array"}, "continue_final_message": {"const": True},
                                "add_generation_prompt": {"const": True}}}},
    ]})

    model: Text | None = None
    prompt: Text | None = Field(None, description="Exactly one of `prompt` and `messages` (a 400 otherwise).")
    # The chat template needs a message: an empty list is refused here, naming the field, as the schema says.
    messages: Annotated[list[Message], Field(min_length=1)] | None = Field(
        None, description="Exactly one of `prompt` and `messages` (a 400 otherwise).")
    tools: list[ToolParam] | None = None
    # vllm serve's defaults: True for a prompt, False for messages (the chat template adds what the model needs).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = Field(True, description=(
        "With `messages`: false when `continue_final_message` is true (a 400 naming `continue_final_message` "
        "otherwise)."))
    continue_final_message: bool = False
    return_token_strs: bool | None = False


class DetokenizeRequest(_Strict):
    model: Text | None = None
    tokens: list[TokenId] = Field(description=(
        "Token ids below the served model's vocabulary size: a larger id is a 400 naming it (`tokens.<i>`). The "
        "items' `maximum` states it once the backend is connected (it depends on the model)."))
