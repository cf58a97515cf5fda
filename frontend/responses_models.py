"""Pydantic models of the /v1/responses request body: the fields of vLLM's ResponsesRequest
(vllm/entrypoints/openai/responses/protocol.py) that a text chat model served through the chat path can honour.

The body itself is strict, as the chat body is (frontend/openai_models.py): an unknown field is a 400 naming it.
Input items are not: clients send a response's output items back as they got them, with ids, statuses, annotations
and whatever fields their openai version adds, so what the conversion does not read is ignored there.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, WithJsonSchema, field_validator

from frontend.fields import Count, Index, Int64, Text, TopK, TopLogprobs
from frontend.openai_models import Stop, stop_list


def _encodable(value: dict[str, Any]) -> dict[str, Any]:
    # Echoed in the response and sent to the backend as JSON: a lone surrogate anywhere inside (JSON may escape one,
    # see frontend/fields.py) must be a 400 here, not a failed encoding after the answer began.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone UTF-16 surrogate; text must be valid Unicode") from None
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_encodable)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: "1" is not an integer, 0 not a boolean


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def _kind(default: str):
    """A discriminator reading `type`, with `default` where an item leaves it out (OpenAI's easy input message)."""
    def kind(value: Any) -> str:
        if isinstance(value, dict):
            return value.get("type", default)
        return getattr(value, "type", default)
    return kind


class TextPart(_Item):
    type: Literal["input_text", "output_text", "text"]
    text: Text


class RefusalPart(_Item):
    type: Literal["refusal"]
    refusal: Text


ContentPart = Annotated[
    Annotated[TextPart, Tag("input_text")] | Annotated[TextPart, Tag("output_text")]
    | Annotated[TextPart, Tag("text")] | Annotated[RefusalPart, Tag("refusal")],
    Discriminator(_kind("input_text"), custom_error_type="unsupported_content",
                  custom_error_message="only text content parts (input_text, output_text, refusal) are supported: "
                                       "the model takes no images, files or audio")]


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: list[ContentPart] | Text
    # An assistant message "in_progress" or "incomplete" asks vLLM to continue it (refused: see convert).
    status: str | None = None


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: Text
    output: list[ContentPart] | Text


class ReasoningText(_Item):
    text: Text


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None
    summary: list[ReasoningText] = []
    encrypted_content: str | None = None
    status: str | None = None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_kind("message"), custom_error_type="unsupported_item",
                  custom_error_message="supported input items: message, function_call, function_call_output, "
                                       "reasoning (item_reference needs a response store, which this server does "
                                       "not keep)")]


class FunctionTool(_Strict):
    """A Responses function tool: flat, not nested under `function` as in chat."""

    type: Literal["function"]
    name: Text = Field(min_length=1)
    description: Text | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class NamedToolChoice(_Strict):
    type: Literal["function"]
    name: Text


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    # json_schema only.
    name: Text | None = None
    description: Text | None = None
    schema_: JsonObject | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


# Fields vLLM takes but this server serves only one value of (frontend/responses_convert.py refuses the others with
# a 400 naming the field, or the 404 for an id): the schema states the value served, the type keeps vLLM's values
# so that the refusal is that clear message rather than pydantic's.
def _only(value: Any, why: str) -> Any:
    served = {"type": "null"} if value is None else {"anyOf": [{"const": value}, {"type": "null"}]}
    return WithJsonSchema({**served, "description": why})


class ReasoningConfig(_Strict):
    effort: Annotated[Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None, _only(
        None, "Not supported (a 400): the chat template gets no reasoning effort.")] = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


Include = Literal["code_interpreter_call.outputs", "computer_call_output.output.image_url",
                  "file_search_call.results", "message.input_image.image_url", "message.output_text.logprobs",
                  "reasoning.encrypted_content"]


class ResponsesRequest(_Strict):
    # tool_choice "required" needs tools, as the schema states it.
    model_config = ConfigDict(json_schema_extra={
        "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"const": "required"}}},
        "then": {"required": ["tools"], "properties": {"tools": {"minItems": 1}}}})
    # vLLM's names and defaults; checks it makes after validation (tool_choice, background, ...) are in
    # frontend/responses_convert.py.
    model: Text | None = None
    # An empty list is refused by _some_input (its message); the schema states it.
    input: Annotated[list[InputItem], Field(json_schema_extra={"minItems": 1})] | Text
    instructions: Text | None = None
    max_output_tokens: Count | None = None
    max_tool_calls: Index | None = None
    # Checked whole, so that a bad key is not put in the error's location (and message) as is.
    metadata: Annotated[dict[str, str], AfterValidator(_encodable)] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: Annotated[Text | None, _only(
        None, "Not supported: no response is stored, so any id is a 404.")] = None
    prompt: Annotated[dict[str, Any] | None, _only(None, "Prompt templates are not supported (a 400).")] = None
    reasoning: ReasoningConfig | None = None
    include_reasoning: bool = True
    include: list[Include] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = Field(True, description=(
        "Accepted, as by `vllm serve` without its response store: nothing is stored, whatever the value, so a "
        "response cannot be retrieved or cancelled later (this server has no such routes)."))
    background: Annotated[bool | None, _only(
        False, "Background mode needs a response store, which this server does not have (a 400).")] = False
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    text: TextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice = Field("auto", description=(
        "\"required\" needs `tools` (stated), and a named function must be one of `tools`: a 400 naming "
        "`tool_choice` otherwise (JSON Schema cannot compare the name with the array's names)."))
    tools: list[FunctionTool] = Field([], description=(
        "Two tools may share a function name, as vLLM serves them (a tool call names only the function)."))
    top_logprobs: TopLogprobs | None = 0
    truncation: Annotated[Literal["auto", "disabled"] | None, _only(
        "disabled", "Only \"disabled\": the prompt is never truncated (\"auto\" is a 400).")] = "disabled"
    user: Text | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # Accepted and ignored, as vLLM does (its own field description says so).
    prompt_cache_key: Text | None = None
    # vLLM's extensions: the response's id when given; the scheduling priority (lower runs first under
    # --scheduling-policy priority; fcfs takes it and ignores it), as chat's.
    request_id: Text | None = None
    priority: Int64 = 0
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    seed: Int64 | None = None
    stop: Stop = None
    ignore_eos: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        return stop_list(v)

    @field_validator("input")
    @classmethod
    def _some_input(cls, v: str | list) -> str | list:
        if isinstance(v, list) and not v:
            raise ValueError("must not be an empty list")
        return v

    def is_logprobs(self) -> bool:
        """vLLM's is_include_output_logprobs: logprobs only when `include` asks for them."""
        return self.include is not None and "message.output_text.logprobs" in self.include
