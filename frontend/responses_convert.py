"""/v1/responses request → the chat GenerateRequest the frontend already sends (pure).

The input becomes chat messages as vLLM builds them (construct_input_messages in
vllm/entrypoints/openai/responses/utils.py): `instructions` first as a system message, a string input as one user
message, and items in order, where a function call, a reasoning item or an assistant text joins the assistant
message just before it when that one lacks that part. Text parts join with "\n", as vLLM's renderer joins them
for a template that takes string content (Qwen3's).

vLLM's checks after validation are made here too, with its messages: tool_choice against tools
(ResponsesRequest.check_tool_usage), `prompt`, and `background` / `previous_response_id`, which need the response
store that vLLM keeps off unless VLLM_ENABLE_RESPONSES_API_STORE is set; pocserve has none, so they answer as
`vllm serve` does by default (400 and 404). `store` is ignored, as vLLM ignores it then.
"""

from __future__ import annotations

import json

from frontend.errors import ApiError
from frontend.responses_models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    NamedToolChoice,
    ReasoningItem,
    RefusalPart,
    ResponsesRequest,
    TextPart,
)
from protocol.generate import ChatMessage, GenerateRequest, ResponseFormat, SamplingSpec, ToolCall, ToolSpec


def check(body: ResponsesRequest) -> None:
    """What vLLM refuses after validation, and what the chat path cannot do; raises ApiError."""
    if body.prompt is not None:
        raise ApiError(400, "prompt template is not supported", param="prompt")
    if body.background:
        if body.store is False:
            raise ApiError(400, "background can only be used when `store` is true", param="background")
        raise ApiError(400, "This server does not support `store=True` and therefore does not support the "
                            "background mode.", param="background")
    if body.previous_response_id is not None:
        # Nothing is stored, so no id is found (vLLM's answer without its store).
        raise ApiError(404, f"Response with id '{body.previous_response_id}' not found.",
                       param="response_id", type="invalid_request_error")
    choice = body.tool_choice
    if not body.tools and choice == "required":
        raise ApiError(400, "Tool choice 'required' must be specified with 'tools' parameter.", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.name not in {t.name for t in body.tools}:
        raise ApiError(400, "Tool choice 'function' not found in 'tools' parameter.", param="tool_choice")
    # The chat path has no prompt truncation and passes no reasoning_effort to the chat template.
    if body.truncation == "auto":
        raise ApiError(400, "truncation 'auto' is not supported: the prompt is never truncated; use 'disabled'",
                       param="truncation")
    if body.reasoning is not None and body.reasoning.effort is not None:
        raise ApiError(400, "reasoning.effort is not supported: the chat template gets no reasoning effort",
                       param="reasoning.effort")


def tool_choice(body: ResponsesRequest) -> str | NamedToolChoice:
    """vLLM's normalisation: without tools, "auto" means "none" (and is echoed so)."""
    if not body.tools and body.tool_choice == "auto":
        return "none"
    return body.tool_choice


def generate_request(rid: str, body: ResponsesRequest) -> GenerateRequest:
    check(body)
    spec = SamplingSpec(
        n=1, max_tokens=body.max_output_tokens,
        # Left out stays None: the model's defaults apply (common/sampling_defaults.py); vLLM's Responses API
        # takes no min_p, so the model's is not applied here either.
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=0.0,
        presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed, stop=list(body.stop or []), ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output, skip_special_tokens=body.skip_special_tokens,
        logprobs=(body.top_logprobs or 0) if body.is_logprobs() else None,
        response_format=response_format(body))
    choice = tool_choice(body)
    tools = [ToolSpec(name=t.name, description=t.description,
                      parameters=json.dumps(t.parameters) if t.parameters is not None else "", strict=t.strict)
             for t in body.tools]
    return GenerateRequest(
        rid=rid, sampling=spec, messages=messages(body), stream=bool(body.stream), tools=tools or None,
        tool_choice=None if isinstance(choice, NamedToolChoice) else choice,
        named_tool=choice.name if isinstance(choice, NamedToolChoice) else None,
        parallel_tool_calls=body.parallel_tool_calls is not False, priority=body.priority)


def response_format(body: ResponsesRequest) -> ResponseFormat | None:
    """`text.format` as chat's response_format (vLLM's extract_structured_outputs)."""
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.schema_ is None:
        raise ApiError(400, "text.format.schema is required for type json_schema", param="text.format.schema")
    return ResponseFormat(type="json_schema", json_schema=json.dumps(fmt.schema_))


def _text(content: str | list[TextPart | RefusalPart]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


def _first_text(content: str | list[TextPart | RefusalPart]) -> str:
    """An assistant message's text: vLLM reads only its first part."""
    if isinstance(content, str):
        return content
    return _text(content[:1])


def messages(body: ResponsesRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if body.instructions:
        out.append(ChatMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        out.append(ChatMessage(role="user", content=body.input))
        return out
    last = body.input[-1]
    if isinstance(last, MessageItem | ReasoningItem) and last.status in ("in_progress", "incomplete") and (
            isinstance(last, ReasoningItem) or last.role == "assistant"):
        # vLLM continues such a message (continue_final_message); the chat path always adds a generation prompt.
        raise ApiError(400, "continuing a partial assistant message (status in_progress or incomplete) is not "
                            "supported", param=f"input.{len(body.input) - 1}.status")
    # Assistant messages whose content was not set by a message item yet (a function call or reasoning made them).
    open_content: set[int] = set()
    for i, item in enumerate(body.input):
        prev = out[-1] if out and out[-1].role == "assistant" else None
        if isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, name=item.name, arguments=item.arguments)
            if prev is not None:
                prev.tool_calls = [*(prev.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
                open_content.add(len(out) - 1)
        elif isinstance(item, ReasoningItem):
            if item.encrypted_content:
                raise ApiError(400, "Encrypted content is not supported.", param=f"input.{i}.encrypted_content")
            parts = item.content or item.summary
            reasoning = parts[0].text if parts else ""
            if prev is not None and prev.reasoning is None:
                prev.reasoning = reasoning
            else:
                out.append(ChatMessage(role="assistant", content="", reasoning=reasoning))
                open_content.add(len(out) - 1)
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage(role="tool", content=_text(item.output), tool_call_id=item.call_id))
        elif item.role == "assistant":
            text = _first_text(item.content)
            if prev is not None and len(out) - 1 in open_content:
                prev.content = text
                open_content.discard(len(out) - 1)
            else:
                out.append(ChatMessage(role="assistant", content=text))
        else:
            out.append(ChatMessage(role=item.role, content=_text(item.content)))
    return out
