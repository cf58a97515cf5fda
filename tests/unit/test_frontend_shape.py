"""Unit tests for frontend/shape.py: the OpenAI JSON of tool calls, reasoning, n choices and usage."""

from __future__ import annotations

from frontend.convert import TokenFormat
from frontend.shape import ChatShape, CompletionShape
from protocol.generate import Delta, ToolCallDelta

FMT = TokenFormat(as_ids=False)


def _delta(**kw) -> Delta:
    return Delta(**{"rid": "r", "text": "", "token_ids": [], "num_prompt_tokens": 10, **kw})


def test_shape_tool_call_message_has_null_content_and_whole_calls():
    call = ToolCallDelta(index=0, id="call-1", name="f", arguments='{"x": 1}')
    r = ChatShape("chat", "m", FMT).response([_delta(tool_calls=[call], finish_reason="tool_calls",
                                                     num_generated_tokens=7)])
    [choice] = r["choices"]
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    assert choice["finish_reason"] == "tool_calls"
    assert r["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}


def test_shape_reasoning_under_both_names_and_plain_content():
    r = ChatShape("chat", "m", FMT).response([_delta(text="4", reasoning="2+2", finish_reason="stop")])
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "4", "reasoning_content": "2+2",
                                          "reasoning": "2+2"}
    plain = ChatShape("chat", "m", FMT).response([_delta(text="", finish_reason="stop")])
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": ""}


def test_shape_stream_tool_call_pieces_as_vllm_streams_them():
    shape = ChatShape("chat", "m", FMT)
    [first] = shape.chunks(_delta(tool_calls=[ToolCallDelta(index=0, id="call-1", name="f")]))
    [rest] = shape.chunks(_delta(tool_calls=[ToolCallDelta(index=0, arguments='{"x"')]))
    assert first["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "id": "call-1", "type": "function", "function": {"name": "f"}}]}
    assert rest["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"x"'}}]}
    assert shape.chunks(_delta()) == []  # nothing to say: no chunk


def test_shape_n_choices_usage_sums_every_choice():
    choices = [_delta(index=i, text=t, finish_reason="length", num_generated_tokens=3) for i, t in enumerate("ab")]
    r = CompletionShape("completions", "m", FMT).response(choices)
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["usage"]["completion_tokens"] == 6
    chat = ChatShape("chat", "m", FMT)
    assert [c["choices"][0]["index"] for c in chat.preamble(2, 10)] == [0, 1]
    assert chat.usage_chunk({0: choices[0], 1: choices[1]})["usage"]["completion_tokens"] == 6


def test_shape_continuous_usage_is_per_choice_on_every_chunk():
    shape = ChatShape("chat", "m", FMT, is_continuous_usage=True)
    [pre] = shape.preamble(1, 10)
    assert pre["usage"] == {"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10}
    [chunk] = shape.chunks(_delta(index=1, text="x", num_generated_tokens=4))
    assert chunk["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    assert "usage" not in ChatShape("chat", "m", FMT).chunks(_delta(text="x"))[0]
