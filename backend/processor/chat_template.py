"""Wire chat messages → the model's chat template, as vLLM renders them for HF tokenizers (tool calls with their
arguments as objects, reasoning under both names, the tools given to the template)."""

from __future__ import annotations

import json
from typing import Any

from backend.errors import RequestError
from protocol.generate import ChatMessage, ToolCall


def _arguments(call: ToolCall) -> dict:
    """Templates expect a mapping; like vLLM, arguments that are not a JSON object become {} (failing would make
    every later turn of the conversation fail too)."""
    try:
        parsed = json.loads(call.arguments) if call.arguments else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": _arguments(c)}} for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.reasoning is not None:
            msg["reasoning"] = msg["reasoning_content"] = m.reasoning
        out.append(msg)
    return out


def render(tokenizer, messages: list[ChatMessage], tools: list[dict] | None, *, add_generation_prompt: bool = True,
           continue_final_message: bool = False, template: str | None = None,
           template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text; a template that does not use `tools` ignores them. RequestError if the template fails.
    `template` and `template_kwargs` are vllm serve's --chat-template and --default-chat-template-kwargs (None:
    the model's own template)."""
    kwargs: dict[str, Any] = dict(template_kwargs or {})
    if template is not None:
        kwargs["chat_template"] = template
    if tools:
        kwargs["tools"] = tools
    if continue_final_message:
        kwargs["continue_final_message"] = True
    try:
        return tokenizer.apply_chat_template(conversation(messages), tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:  # jinja raises its own types for templates that reject a conversation
        raise RequestError(f"chat template failed: {e}", param="messages") from e
