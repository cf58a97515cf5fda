"""The JSON of OpenAI answers, pure: a whole response, stream chunks, usage. One class per route (chat,
completions); both take wire Deltas, one per choice (`index`) and step.

Tool calls and reasoning arrive parsed (the backend runs vLLM's parsers): a chat message gets `tool_calls`
(content null when the choice only called tools, as OpenAI) and, when a reasoning parser is set, the reasoning under
both the names vllm serve has used (`reasoning_content`, `reasoning`).

usage.prompt_tokens_details (with --enable-prompt-tokens-details) is vllm serve's: in a whole response and in the
closing usage chunk of a stream, never in continuous usage chunks; counted from the engine output a stream began
with, or the one a whole response ended with (vllm/entrypoints/openai/chat_completion/serving.py and
vllm/entrypoints/openai/completion/serving.py, 0.26 and 0.29 alike).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from frontend import convert
from frontend.convert import TokenFormat
from protocol.generate import Delta, ToolCallDelta


def _tool_call(c: ToolCallDelta) -> dict:
    """A whole call, as in a non-streamed message."""
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or ""}}


def _tool_call_piece(c: ToolCallDelta) -> dict:
    """A streamed piece: id, type and name on a call's first piece, argument fragments after (vLLM's shape)."""
    piece: dict[str, Any] = {"index": c.index}
    if c.id is not None:
        piece["id"] = c.id
        piece["type"] = "function"
    function = {k: v for k, v in (("name", c.name), ("arguments", c.arguments)) if v is not None}
    if function:
        piece["function"] = function
    return piece


class Shape:
    """What both routes share: the envelope, and usage per chunk when continuous usage stats are asked for."""

    route = ""
    chunk_object = ""

    def __init__(self, kind: str, model: str, fmt: TokenFormat, *, is_continuous_usage: bool = False,
                 is_prompt_details: bool = False) -> None:
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.fmt = fmt
        self.is_continuous_usage = is_continuous_usage
        self.is_prompt_details = is_prompt_details

    def envelope(self, obj: str, choices: list[dict], **extra: Any) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, choice: dict, d: Delta | None = None, num_prompt_tokens: int = 0) -> dict:
        """A stream chunk of one choice; with continuous usage stats, that choice's usage so far (vllm serve's)."""
        if not self.is_continuous_usage:
            return self.envelope(self.chunk_object, [choice])
        prompt = d.num_prompt_tokens if d is not None else num_prompt_tokens
        return self.envelope(self.chunk_object, [choice],
                             usage=convert.usage(prompt, d.num_generated_tokens if d is not None else 0))

    def usage_chunk(self, last: dict[int, Delta], first: Delta | None = None) -> dict:
        """The closing chunk of stream_options.include_usage: every choice's tokens; the prompt's cached tokens as
        the stream's `first` delta counted them."""
        details = self.prompt_details(first, is_whole=False) if first is not None else None
        return self.envelope(self.chunk_object, [], usage=convert.choices_usage(list(last.values()), details))

    def prompt_details(self, d: Delta, *, is_whole: bool) -> dict | None:
        """usage.prompt_tokens_details from the counts `d` carries; None when off or not sent."""
        if not self.is_prompt_details or d.num_cached_tokens is None:
            return None
        details = self._details(d)
        # vLLM dumps a whole response with its null fields, the closing stream chunk without them.
        return details if is_whole else {k: v for k, v in details.items() if v is not None}

    def _details(self, d: Delta) -> dict:
        raise NotImplementedError


class ChatShape(Shape):
    route = "chat"
    chunk_object = "chat.completion.chunk"

    def response(self, choices: list[Delta], last: Delta | None = None) -> dict:
        """`last`: the request's last delta (its cached-token counts are the final engine output's)."""
        details = self.prompt_details(last, is_whole=True) if last is not None else None
        return self.envelope("chat.completion", [self._choice(d) for d in choices],
                             usage=convert.choices_usage(choices, details))

    def _details(self, d: Delta) -> dict:
        # vLLM's chat adds the tokens this request wrote to the prefix cache (its completions do not).
        return {"cached_tokens": d.num_cached_tokens, "created_cache_tokens": d.num_cache_creation_tokens,
                "multimodal_tokens": None}

    def _choice(self, d: Delta) -> dict:
        logprobs = {"content": self.fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
        is_parsed = bool(d.tool_calls) or d.reasoning is not None
        message: dict[str, Any] = {"role": "assistant", "content": d.text if d.text or not is_parsed else None}
        if d.reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = d.reasoning
        if d.tool_calls:
            message["tool_calls"] = [_tool_call(c) for c in d.tool_calls]
        return {"index": d.index, "message": message, "logprobs": logprobs, "finish_reason": d.finish_reason,
                "stop_reason": d.stop_reason}

    def preamble(self, n: int, num_prompt_tokens: int) -> list[dict]:
        """The first chunk of each choice gives the role, as OpenAI's does."""
        return [self.chunk(self._delta_choice(i, {"role": "assistant", "content": ""}), None, num_prompt_tokens)
                for i in range(n)]

    def chunks(self, d: Delta) -> list[dict]:
        lp = {"content": self.fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = delta["reasoning"] = d.reasoning
        if d.text:
            delta["content"] = d.text
        if d.tool_calls:
            delta["tool_calls"] = [_tool_call_piece(c) for c in d.tool_calls]
        if not (delta or lp or d.finish_reason):
            return []
        return [self.chunk(self._delta_choice(d.index, delta, d.finish_reason, lp), d)]

    @staticmethod
    def _delta_choice(index: int, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


class CompletionShape(Shape):
    route = "completions"
    chunk_object = "text_completion"

    def __init__(self, kind: str, model: str, fmt: TokenFormat, *, is_continuous_usage: bool = False,
                 is_prompt_details: bool = False) -> None:
        super().__init__(kind, model, fmt, is_continuous_usage=is_continuous_usage,
                         is_prompt_details=is_prompt_details)
        # Characters streamed so far per choice: logprobs text_offset continues from here.
        self._offsets: dict[int, int] = {}

    def response(self, choices: list[Delta], last: Delta | None = None) -> dict:
        """`last`: the request's last delta (its cached-token counts are the final engine output's)."""
        details = self.prompt_details(last, is_whole=True) if last is not None else None
        return self.envelope("text_completion", [self._choice(d, 0) for d in choices],
                             usage=convert.choices_usage(choices, details))

    def _details(self, d: Delta) -> dict:
        return {"cached_tokens": d.num_cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}

    def preamble(self, n: int, num_prompt_tokens: int) -> list[dict]:
        return []

    def chunks(self, d: Delta) -> list[dict]:
        offset = self._offsets.get(d.index, 0)
        self._offsets[d.index] = offset + len(d.text)
        return [self.chunk(self._choice(d, offset), d)]

    def _choice(self, d: Delta, offset: int) -> dict:
        lp = self.fmt.completion_logprobs(d.logprobs, offset) if d.logprobs is not None else None
        return {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason,
                "stop_reason": d.stop_reason}
