"""The JSON of /v1/responses answers, pure: the response object and its output items, as vLLM 0.29 writes them
(ResponsesResponse.from_request in vllm/entrypoints/openai/responses/protocol.py, _make_response_output_items and
responses_full_generator in .../responses/serving.py, build_response_output_items in .../responses/utils.py).
The stream's events are in frontend/responses_stream.py.

Output items: a reasoning item ("rs_"), then the assistant message ("msg_", one output_text part), then one
function_call item ("fc_") per tool call. As vLLM does with a parser, an answer that only reasoned or called tools
has no message; one with no text at all has a message with no content parts (vLLM without a parser).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from common.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from frontend.convert import TokenFormat
from frontend.responses_convert import tool_choice
from frontend.responses_models import ResponsesRequest
from protocol.generate import Delta, TokenLogprob, ToolCallDelta


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str, logprobs: list[dict] | None) -> dict:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, parts: list[dict], status: str) -> dict:
    return {"id": item_id, "content": parts, "role": "assistant", "status": status, "type": "message"}


def reasoning_item(item_id: str, content: list[dict] | None, status: str | None) -> dict:
    return {"id": item_id, "summary": [], "type": "reasoning", "content": content, "encrypted_content": None,
            "status": status}


def reasoning_part(text: str) -> dict:
    return {"text": text, "type": "reasoning_text"}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"arguments": arguments, "call_id": call_id, "name": name, "type": "function_call", "id": item_id,
            "namespace": None, "status": status}


def logprobs(fmt: TokenFormat, lps: list[TokenLogprob]) -> list[dict]:
    """output_text.logprobs: token, logprob, bytes and top_logprobs, the same entries as chat's."""
    return fmt.chat_logprobs(lps)


def stream_logprobs(fmt: TokenFormat, lps: list[TokenLogprob]) -> list[dict]:
    """A text delta's logprobs: as output_text's without bytes (OpenAI's response_text_delta_event.Logprob)."""
    return [{"token": lp["token"], "logprob": lp["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in lp["top_logprobs"]]}
            for lp in logprobs(fmt, lps)]


def call_id(c: ToolCallDelta) -> str:
    """The tool parser's call id (vLLM's "chatcmpl-tool-..."); one of ours where it gave none."""
    return c.id or new_id("call")


def usage(d: Delta) -> dict:
    # The prefix-cache hits of the last engine output, as vLLM's SimpleContext keeps them (always, not only with
    # --enable-prompt-tokens-details); 0 from a backend that does not send the count.
    cached = d.num_cached_tokens or 0
    # vLLM counts reasoning tokens with its reasoning parser; the wire carries no such count, so 0.
    return {"input_tokens": d.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": d.num_generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": d.num_prompt_tokens + d.num_generated_tokens}


class ResponseShape:
    """One response's envelope: what the request asked for, echoed as vLLM echoes its sampling parameters."""

    def __init__(self, body: ResponsesRequest, *, model: str, max_model_len: int, fmt: TokenFormat,
                 defaults: SamplingDefaults = NO_DEFAULTS) -> None:
        self.body = body
        # The model's sampling defaults (the backend's Fingerprint): vLLM echoes the values it sampled with.
        self.defaults = defaults
        self.id = body.request_id or new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.max_model_len = max_model_len
        self.fmt = fmt

    def response(self, status: str, output: list[dict], num_prompt_tokens: int, usage: dict | None = None) -> dict:
        b = self.body
        room = self.max_model_len - num_prompt_tokens
        text = b.text.model_dump(by_alias=True) if b.text is not None else None
        return {
            "id": self.id, "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions, "metadata": b.metadata, "model": self.model, "object": "response",
            "output": output, "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": self.defaults.value("temperature", b.temperature),
            "tool_choice": _dump(tool_choice(b)), "tools": [t.model_dump() for t in b.tools],
            "top_p": self.defaults.value("top_p", b.top_p), "background": bool(b.background),
            # The effective max_tokens (vLLM's sampling_params.max_tokens): the request's or the model's default,
            # within the context's room and the model's cap.
            "max_output_tokens": self.defaults.max_tokens_for(b.max_output_tokens, room),
            "max_tool_calls": b.max_tool_calls, "previous_response_id": b.previous_response_id, "prompt": None,
            "reasoning": _dump(b.reasoning), "service_tier": b.service_tier, "status": status, "text": text,
            "top_logprobs": (b.top_logprobs or 0) if b.is_logprobs() else None,
            "truncation": b.truncation or "disabled", "usage": usage, "user": b.user,
            "presence_penalty": b.presence_penalty or 0.0, "frequency_penalty": b.frequency_penalty or 0.0,
            "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
        }

    def whole(self, d: Delta, output: list[dict] | None = None) -> dict:
        """The finished response from the request's merged delta; `output`: items a stream already built."""
        status = "incomplete" if d.finish_reason == "length" else "completed"
        return self.response(status, self.output(d) if output is None else output, d.num_prompt_tokens, usage(d))

    def output(self, d: Delta) -> list[dict]:
        items: list[dict] = []
        if d.reasoning and self.body.include_reasoning:
            items.append(reasoning_item(new_id("rs"), [reasoning_part(d.reasoning)], None))
        if d.text or not (items or d.tool_calls):
            lps = logprobs(self.fmt, d.logprobs) if self.with_logprobs and d.logprobs is not None else None
            parts = [text_part(d.text, lps)] if d.text else []
            items.append(message_item(new_id("msg"), parts, "completed"))
        for c in d.tool_calls or ():
            items.append(function_call_item(new_id("fc"), call_id(c), c.name or "", c.arguments or "",
                                            "completed"))
        return items

    @property
    def with_logprobs(self) -> bool:
        # Asked for in `include`; vLLM leaves them out when reasoning is hidden (they would cover its tokens).
        return self.body.is_logprobs() and self.body.include_reasoning


def _dump(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else value
