"""Tool calls and reasoning in chat output, with vLLM's own parsers: the ToolParser named by --tool-call-parser and
the ReasoningParser named by --reasoning-parser, composed by vLLM's ParserManager and run as `vllm serve`'s chat
handler runs them: `adjust_request` before sampling (tool_choice required or named becomes a JSON-schema
grammar), `parse` over a whole answer, `parse_delta` per streamed step, one parser per choice.

Requests without tools skip all of it unless a reasoning parser is configured: their output is passed on as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pydantic
from vllm.entrypoints.chat_utils import make_tool_call_id
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam, ChatCompletionRequest
from vllm.parser import ParserManager

from backend.engine import compat
from backend.errors import RequestError
from common.config import SettingsError
from protocol.generate import GenerateRequest, ToolCallDelta, ToolSpec


def check_parser_names(tool_call_parser: str, reasoning_parser: str) -> None:
    """SettingsError (at start) for a parser name vLLM does not know."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for flag, name, known in (("--tool-call-parser", tool_call_parser, ToolParserManager.list_registered()),
                              ("--reasoning-parser", reasoning_parser, ReasoningParserManager.list_registered())):
        if name and name not in known:
            raise SettingsError(f"{flag}: unknown parser {name!r}; vLLM has: {', '.join(sorted(known))}")


def tool_dicts(tools: list[ToolSpec]) -> list[dict]:
    """The tools as OpenAI (and the chat templates) spell them."""
    out = []
    for t in tools:
        function: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            function["description"] = t.description
        if t.parameters:
            function["parameters"] = json.loads(t.parameters)
        if t.strict is not None:
            function["strict"] = t.strict
        out.append({"type": "function", "function": function})
    return out


def check_tool_schemas(tools: list[ToolSpec]) -> None:
    """A 400 naming the tool whose parameters are not a JSON schema (vLLM would only find out when compiling a
    grammar, for tool_choice required or named, or never)."""
    for i, t in enumerate(tools):
        if not t.parameters:
            continue
        param = f"tools.{i}.function.parameters"
        try:
            schema = json.loads(t.parameters)
        except json.JSONDecodeError as e:
            raise RequestError(f"{param} is not valid JSON: {e}", param=param) from e
        if not isinstance(schema, dict):
            raise RequestError(f"{param} must be a JSON schema object", param=param)
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise RequestError(f"{param} is not a valid JSON schema: {e.message}", param=param) from e


def _vllm_tool_choice(req: GenerateRequest) -> Any:
    if req.named_tool is not None:
        return {"type": "function", "function": {"name": req.named_tool}}
    if req.tool_choice is not None:
        return req.tool_choice
    return "auto" if req.tools else "none"


def _vllm_messages(req: GenerateRequest) -> list[dict]:
    out = []
    for m in req.messages or ():
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


@dataclass
class ChoiceOutput:
    """One choice's output after parsing: what the client sees."""

    text: str
    reasoning: str | None
    tool_calls: list[ToolCallDelta] | None
    finish_reason: str | None


class RequestParsing:
    """One chat request's parsing: vLLM's view of the request (after adjust_request), and a parser per choice."""

    def __init__(self, parsers: ChatParsers, request: ChatCompletionRequest, prompt_ids: list[int] | None = None):
        self._parsers = parsers
        self.request = request
        # The prompt's token ids: the reasoning parser checks whether the prompt already closed the reasoning.
        self.prompt_ids = prompt_ids
        self._streams: dict[int, Any] = {}
        # Choices that streamed a tool call: they finish with "tool_calls" (not for a named choice, as OpenAI).
        self._tools_streamed: set[int] = set()

    @property
    def is_named(self) -> bool:
        return isinstance(self.request.tool_choice, ChatCompletionNamedToolChoiceParam)

    def whole(self, text: str, token_ids: list[int], finish_reason: str | None) -> ChoiceOutput:
        """A whole answer (vllm serve's chat_completion_full_generator)."""
        request = self.request
        reasoning, content, calls = self._parsers.new(request).parse(
            text, request, enable_auto_tools=self._parsers.auto_tools, model_output_token_ids=token_ids)
        is_required = request.tool_choice == "required"
        uses_tools = self.is_named or is_required or (self._parsers.auto_tools and self._parsers.has_tool_parser
                                                      and request.tools and request.tool_choice == "auto")
        calls = list(calls or []) if uses_tools else []
        if not request.parallel_tool_calls:
            calls = calls[:1]
        deltas = [ToolCallDelta(index=i, id=c.id or make_tool_call_id(), name=c.name, arguments=c.arguments)
                  for i, c in enumerate(calls)]
        # OpenAI: "tool_calls" when the model chose to call (auto) or had to (required); "stop" for a named choice.
        if (calls and not self.is_named and request.tool_choice == "auto") or (is_required and finish_reason == "stop"):
            finish_reason = "tool_calls"
        return ChoiceOutput(content or "", reasoning, deltas or None, finish_reason)

    def delta(self, index: int, text: str, token_ids: list[int], finish_reason: str | None) -> ChoiceOutput | None:
        """One streamed step of choice `index` (vllm serve's chat_completion_stream_generator); None: nothing to
        send for it now."""
        parser = self._streams.get(index)
        first = parser is None
        if parser is None:
            parser = self._streams[index] = self._parsers.new(self.request)
        msg = parser.parse_delta(text, list(token_ids), self.request,
                                 prompt_token_ids=(self.prompt_ids or []) if first else None,
                                 finished=finish_reason is not None)
        calls = None
        if msg is not None and msg.tool_calls:
            self._tools_streamed.add(index)
            calls = [ToolCallDelta(index=c.index, id=c.id, name=c.function.name if c.function else None,
                                   arguments=c.function.arguments if c.function else None)
                     for c in msg.tool_calls if self.request.parallel_tool_calls is not False or c.index == 0]
        if finish_reason is not None:
            self._streams.pop(index, None)
            if index in self._tools_streamed and not self.is_named:
                finish_reason = "tool_calls"
        if msg is None:
            return ChoiceOutput("", None, None, finish_reason) if finish_reason is not None else None
        return ChoiceOutput(msg.content or "", msg.reasoning, calls or None, finish_reason)


class ChatParsers:
    """The configured parsers (built once per processor) and the per-request checks `vllm serve` makes."""

    def __init__(self, tool_call_parser: str, reasoning_parser: str, auto_tools: bool, tokenizer,
                 model_config=None) -> None:
        self._cls = ParserManager.get_parser(tool_parser_name=tool_call_parser or None,
                                             reasoning_parser_name=reasoning_parser or None,
                                             enable_auto_tools=auto_tools)
        self.auto_tools = auto_tools
        self.has_tool_parser = self._cls is not None and self._cls.tool_parser_cls is not None
        self.has_reasoning_parser = self._cls is not None and self._cls.reasoning_parser_cls is not None
        self._tokenizer = tokenizer
        self._model_config = model_config
        self._input_errors: tuple[type[Exception], ...] = (pydantic.ValidationError, *compat.input_error_types())
        if self._cls is not None:
            self._cls(tokenizer, None, model_config=model_config)  # a tokenizer the parser cannot use fails at start

    def new(self, request: ChatCompletionRequest):
        assert self._cls is not None, "a request is parsed only when a parser is configured"
        return self._cls(self._tokenizer, request.tools, model_config=self._model_config)

    def prepare(self, req: GenerateRequest) -> RequestParsing | None:
        """vLLM's view of a chat request, checked and adjusted (a JSON-schema grammar for tool_choice required
        or named); None when its output needs no parsing. RequestError for what the client got wrong."""
        if req.messages is None or (not req.tools and not self.has_reasoning_parser):
            return None
        if req.tools:
            check_tool_schemas(req.tools)
        choice = _vllm_tool_choice(req)
        if choice not in ("none", "auto") and not self.has_tool_parser:
            what = f'function "{req.named_tool}"' if req.named_tool is not None else f'"{choice}"'
            raise RequestError(f"tool_choice={what} requires --tool-call-parser to be set", param="tool_choice")
        if choice == "auto" and not self.has_tool_parser:
            raise RequestError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                               "set", param="tool_choice")
        try:
            request = ChatCompletionRequest.model_validate({
                "messages": _vllm_messages(req), "tools": tool_dicts(req.tools) if req.tools else None,
                "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls,
                "skip_special_tokens": req.sampling.skip_special_tokens, "n": req.sampling.n})
        except self._input_errors as e:
            raise RequestError(f"invalid tools or tool_choice: {e}", param="tool_choice" if req.tools else None) \
                from e
        if self._cls is None:
            return None
        if self.has_reasoning_parser or choice != "none":
            request = self.new(request).adjust_request(request)
        return RequestParsing(self, request)
