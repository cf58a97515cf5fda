"""Tool calls through the official openai client (issue 13, item 1), parsed by vLLM's hermes tool parser (the test
backends run with --tool-call-parser hermes --enable-auto-tool-choice; off by default, as in vLLM).

The random tiny model never calls a tool by itself: validator replay (`enforced_str`) makes it emit exactly a tool
call in Qwen3's own format, and the tests check what the client parses from it, streamed and not streamed.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Qwen3's (Hermes') format, as the model would write it.
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _create(client, stack, output: str, **kw):
    extra = {"enforced_str": output, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=stack.model, messages=kw.pop("messages", MESSAGES),
                                          tools=kw.pop("tools", TOOLS), max_tokens=200, extra_body=extra, **kw)


def _streamed_calls(chunks) -> dict[int, dict]:
    """Tool calls joined from stream deltas as OpenAI clients join them: by index, arguments concatenated."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or ():
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or tc.id
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
    return calls


def test_tool_call_auto_non_stream_is_parsed_by_the_client(client, stack):
    r = _create(client, stack, CALL)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_tool_call_auto_stream_joins_to_the_same_call(client, stack):
    chunks = list(_create(client, stack, CALL, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    [call] = _streamed_calls(chunks).values()
    assert call["id"] and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_tool_call_text_before_the_call_stays_content(client, stack):
    r = _create(client, stack, "Let me check. " + CALL)
    assert r.choices[0].message.content.strip() == "Let me check."
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = list(_create(client, stack, "Let me check. " + CALL, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "Let me check."


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_call_parallel_calls_and_parallel_tool_calls_false(client, stack, parallel):
    r = _create(client, stack, TWO_CALLS, parallel_tool_calls=parallel)
    names = [c.function.name for c in r.choices[0].message.tool_calls]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])
    streamed = _streamed_calls(_create(client, stack, TWO_CALLS, parallel_tool_calls=parallel, stream=True))
    assert [c["name"] for c in streamed.values()] == names
    assert [json.loads(c["arguments"]) for c in streamed.values()][-1] == ({"tz": "CET"} if parallel else
                                                                           {"city": "Paris"})


def test_tool_call_plain_answer_with_tools_is_content(client, stack):
    r = _create(client, stack, "It is sunny.")
    assert r.choices[0].message.content == "It is sunny."
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_tool_choice_none_leaves_the_output_unparsed(client, stack):
    r = _create(client, stack, CALL, tool_choice="none")
    assert r.choices[0].message.content == CALL
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_tool_choice_required_finishes_with_tool_calls(client, stack):
    r = _create(client, stack, CALL, tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_tool_choice_required_constrains_free_generation_to_a_tool_call(client, stack):
    # Not enforced: vLLM's grammar for tool_choice=required (a structural tag in the tool parser's format) steers
    # the random model into a call.
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, tools=[TIME], tool_choice="required",
                                       max_tokens=60, seed=1)
    text = r.choices[0].message.content or ""
    assert r.choices[0].message.tool_calls or text.startswith('<tool_call>\n{"name": "get_time", "arguments": {')


def test_tool_choice_named_calls_that_function_and_finishes_with_stop(client, stack):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _create(client, stack, CALL, tool_choice=named)
    assert r.choices[0].finish_reason == "stop"  # OpenAI: "stop" for a named choice
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(_create(client, stack, CALL, tool_choice=named, stream=True))
    assert [c["name"] for c in _streamed_calls(chunks).values()] == ["get_weather"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_tool_call_history_round_trip_is_accepted(client, stack):
    """An agent loop: the assistant message object goes back as is, then the tool's answer, then the next turn."""
    first = _create(client, stack, CALL)
    message = first.choices[0].message
    history = [*MESSAGES, message,
               {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": '{"sky": "sunny"}'}]
    r = _create(client, stack, "It is sunny in Paris.", messages=history)
    assert r.choices[0].message.content == "It is sunny in Paris."
    assert r.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}]},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": []}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
])
def test_tool_bad_input_is_400_naming_the_field(stack, change, param):
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=30,
                   json={"model": stack.model, "messages": MESSAGES, **change})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
