"""Unit tests for backend/processor/parsing.py: vLLM's tool and reasoning parsers as the processor runs them
(the tiny model's tokenizer; no engine)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from backend.errors import RequestError
from backend.processor.parsing import ChatParsers, check_parser_names, check_tool_schemas
from common.config import SettingsError
from protocol.generate import ChatMessage, GenerateRequest, SamplingSpec, ToolSpec

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = ToolSpec(name="get_weather", parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _request(**kw) -> GenerateRequest:
    return GenerateRequest(rid="r", sampling=SamplingSpec(), messages=[ChatMessage(role="user", content="hi")], **kw)


def test_parsing_is_skipped_without_tools_or_reasoning_parser(tokenizer):
    assert ChatParsers("hermes", "", True, tokenizer).prepare(_request()) is None
    assert ChatParsers("hermes", "", True, tokenizer).prepare(GenerateRequest(rid="r", sampling=SamplingSpec(),
                                                                              prompt="hi")) is None


def test_parsing_auto_whole_and_streamed(tokenizer):
    parsing = ChatParsers("hermes", "", True, tokenizer).prepare(_request(tools=[WEATHER]))
    assert parsing is not None and parsing.request.tool_choice == "auto"
    whole = parsing.whole("Sure. " + CALL, [], "stop")
    assert (whole.text, whole.finish_reason) == ("Sure. ", "tool_calls")
    [call] = whole.tool_calls or []
    assert call.id and call.name == "get_weather" and json.loads(call.arguments or "") == {"city": "Paris"}
    pieces = [parsing.delta(0, ch, [], "stop" if i == len(CALL) - 1 else None) for i, ch in enumerate(CALL)]
    calls = [c for p in pieces if p is not None for c in p.tool_calls or ()]
    assert calls[0].name == "get_weather" and calls[0].id
    assert json.loads("".join(c.arguments or "" for c in calls)) == {"city": "Paris"}
    assert pieces[-1] is not None and pieces[-1].finish_reason == "tool_calls"


def test_parsing_required_and_named_get_a_grammar_and_their_finish_reasons(tokenizer):
    parsers = ChatParsers("hermes", "", True, tokenizer)
    required = parsers.prepare(_request(tools=[WEATHER], tool_choice="required"))
    named = parsers.prepare(_request(tools=[WEATHER], named_tool="get_weather"))
    assert required is not None and named is not None
    assert required.request.structured_outputs is not None and named.request.structured_outputs is not None
    assert required.whole(CALL, [], "stop").finish_reason == "tool_calls"
    named_out = named.whole(CALL, [], "stop")
    assert named_out.finish_reason == "stop" and [c.name for c in named_out.tool_calls or ()] == ["get_weather"]


def test_parsing_tool_choice_needs_a_tool_parser(tokenizer):
    with pytest.raises(RequestError) as e:
        ChatParsers("", "", False, tokenizer).prepare(_request(tools=[WEATHER]))
    assert e.value.info().param == "tool_choice" and "--enable-auto-tool-choice" in e.value.info().message
    with pytest.raises(RequestError) as e:
        ChatParsers("hermes", "", False, tokenizer).prepare(_request(tools=[WEATHER], tool_choice="required"))
    assert "--tool-call-parser" in e.value.info().message
    assert ChatParsers("", "", False, tokenizer).prepare(_request(tools=[WEATHER], tool_choice="none")) is None


def test_parsing_reasoning_splits_think(tokenizer):
    parsing = ChatParsers("hermes", "qwen3", True, tokenizer).prepare(_request())
    assert parsing is not None
    out = parsing.whole("<think>hmm</think>4", [], "stop")
    assert (out.reasoning, out.text, out.tool_calls) == ("hmm", "4", None)


@pytest.mark.parametrize(("parameters", "message"), [
    ("{", "not valid JSON"), ("[]", "JSON schema object"), ('{"type": "objekt"}', "not a valid JSON schema")])
def test_parsing_tool_schemas_are_checked(parameters, message):
    with pytest.raises(RequestError) as e:
        check_tool_schemas([WEATHER, ToolSpec(name="f", parameters=parameters)])
    assert e.value.info().param == "tools.1.function.parameters" and message in e.value.info().message


def test_parsing_unknown_parser_names_are_settings_errors():
    check_parser_names("hermes", "qwen3")
    with pytest.raises(SettingsError, match="--tool-call-parser"):
        check_parser_names("nope", "")
    with pytest.raises(SettingsError, match="--reasoning-parser"):
        check_parser_names("", "nope")
