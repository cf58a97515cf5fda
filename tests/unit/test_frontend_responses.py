"""/v1/responses, pure parts: the request → chat GenerateRequest conversion (frontend/responses_convert.py), the
response object (frontend/responses_shape.py) and the stream's events (frontend/responses_stream.py), checked
against the openai client's types and against what vLLM's own code builds (when vLLM is installed)."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from frontend.backend_client import BackendRequestError
from frontend.convert import TokenFormat, merge
from frontend.errors import ApiError
from frontend.responses_convert import generate_request
from frontend.responses_models import ResponsesRequest
from frontend.responses_shape import ResponseShape
from frontend.responses_stream import ResponseEvents, frame
from frontend.routes.responses import relaxed
from protocol.common import ErrorInfo
from protocol.generate import ChatMessage, Delta, TokenLogprob, ToolCall, ToolCallDelta, TopLogprob

FMT = TokenFormat(as_ids=False)
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
EVENTS = TypeAdapter(ResponseStreamEvent)
# vLLM's own reasoning part events (vllm/entrypoints/openai/responses/protocol.py: openai-python has none of that
# name).
VLLM_ONLY_EVENTS = {"response.reasoning_part.added", "response.reasoning_part.done"}


def _openai_response(r: dict) -> Response:
    """The whole response as the openai client's type. Its usage is left out: openai 3.54 requires
    input_tokens_details.cache_write_tokens, which vLLM's usage does not have either (the client does not
    validate what it receives, so clients still read it)."""
    return Response.model_validate({**r, "usage": None})


def _req(**kw) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "tiny", "input": "hi", **kw})


def _delta(**kw) -> Delta:
    return Delta(**{"rid": "r", "text": "", "token_ids": [], "num_prompt_tokens": 10, **kw})


def _shape(**kw) -> ResponseShape:
    return ResponseShape(_req(**kw), model="tiny", max_model_len=100, fmt=FMT)


# --- conversion ---

def test_responses_string_input_and_instructions_are_system_then_user():
    gen = generate_request("r1", _req(instructions="Be brief.", max_output_tokens=7, temperature=0.5))
    assert gen.messages == [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi")]
    assert gen.sampling.max_tokens == 7 and gen.sampling.temperature == 0.5 and gen.sampling.n == 1
    assert gen.sampling.logprobs is None and gen.tools is None and gen.tool_choice == "none"


def test_responses_items_join_the_assistant_turn_as_vllm_builds_it():
    """Reasoning, the assistant's text and its function call are one assistant message (vLLM's
    construct_chat_messages_with_tool_call); text parts join with a newline."""
    gen = generate_request("r1", _req(tools=[TOOL], input=[
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "th"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": None}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "assistant", "content": "done"},
        {"role": "developer", "content": "more"}]))
    assert gen.messages == [
        ChatMessage(role="user", content="a\nb"),
        ChatMessage(role="assistant", content="ok", reasoning="th",
                    tool_calls=[ToolCall(id="c1", name="f", arguments="{}")]),
        ChatMessage(role="tool", content="42", tool_call_id="c1"),
        ChatMessage(role="assistant", content="done"),
        ChatMessage(role="developer", content="more")]
    assert gen.tool_choice == "auto" and gen.tools[0].name == "f" and gen.tools[0].parameters == '{"type": "object"}'


def test_responses_a_call_first_then_its_text_fill_one_message():
    gen = generate_request("r1", _req(input=[
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "x"}]}]))
    assert gen.messages == [ChatMessage(role="assistant", content="x",
                                        tool_calls=[ToolCall(id="c1", name="f", arguments="{}")])]


def test_responses_sampling_logprobs_tools_and_format():
    gen = generate_request("r1", _req(
        include=["message.output_text.logprobs"], top_logprobs=4, top_k=5, seed=3, stop="x", ignore_eos=True,
        tools=[TOOL], tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}, priority=-2))
    s = gen.sampling
    assert gen.priority == -2
    assert (s.logprobs, s.top_k, s.seed, s.stop, s.ignore_eos) == (4, 5, 3, ["x"], True)
    assert gen.named_tool == "f" and gen.tool_choice is None and gen.parallel_tool_calls is False
    assert s.response_format.type == "json_schema" and json.loads(s.response_format.json_schema) == {"type": "object"}
    assert generate_request("r", _req(include=["message.output_text.logprobs"])).sampling.logprobs == 0


@pytest.mark.parametrize("kw,status,param", [
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}}, 400, "tool_choice"),
    ({"background": True}, 400, "background"),
    ({"background": True, "store": False}, 400, "background"),
    ({"previous_response_id": "resp_x"}, 404, "response_id"),
    ({"prompt": {"id": "p"}}, 400, "prompt"),
    ({"truncation": "auto"}, 400, "truncation"),
    ({"reasoning": {"effort": "low"}}, 400, "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "n"}}}, 400, "text.format.schema"),
    ({"input": [{"role": "assistant", "content": "par", "status": "incomplete"}]}, 400, "input.0.status"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "zz"}]}, 400, "input.0.encrypted_content"),
], ids=lambda v: str(v))
def test_responses_what_vllm_refuses_after_validation(kw, status, param):
    with pytest.raises(ApiError) as info:
        generate_request("r1", _req(**kw))
    assert (info.value.status, info.value.param) == (status, param)


@pytest.mark.parametrize("kw", [
    {"input": []}, {"input": [{"type": "item_reference", "id": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"tools": [{"type": "web_search_preview"}]}, {"logit_bias": {"1": 1}},
    {"max_output_tokens": 0}, {"top_logprobs": 21}, {"stop": [""]}, {"input": "\ud800"},
    # Echoed in the answer: a lone surrogate anywhere inside would fail its encoding (a key would even fail the
    # error body, were it named in the error's location).
    {"metadata": {"\ud800": "x"}}, {"tools": [{**TOOL, "parameters": {"a": ["\udc00"]}}]},
    {"text": {"format": {"type": "json_schema", "schema": {"\ud800": 1}}}},
], ids=lambda v: ascii(v))
def test_responses_model_rejects(kw):
    with pytest.raises(ValidationError):
        _req(**kw)


# --- the response object ---

def test_responses_whole_response_is_an_openai_response():
    lp = TokenLogprob(token_id=1, token="a", logprob=-0.5, top=[TopLogprob(token_id=1, token="a", logprob=-0.5)])
    shape = _shape(include=["message.output_text.logprobs"], top_logprobs=1, max_output_tokens=500)
    r = shape.whole(_delta(text="ab", logprobs=[lp], finish_reason="length", num_generated_tokens=2))
    parsed = _openai_response(r)
    assert parsed.status == "incomplete" and parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.output_text == "ab" and parsed.output[0].content[0].logprobs[0].token == "a"
    assert r["max_output_tokens"] == 90 and r["top_logprobs"] == 1  # the context's room: 100 - 10 prompt tokens
    assert r["usage"]["total_tokens"] == 12 and r["usage"]["input_tokens_details"]["cached_tokens"] == 0


def test_responses_output_items_reasoning_message_calls():
    r = _shape(tools=[TOOL]).whole(_delta(text="x", reasoning="th", finish_reason="tool_calls", tool_calls=[
        ToolCallDelta(index=0, id="chatcmpl-tool-1", name="f", arguments="{}")]))
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call"]
    assert r["output"][2]["call_id"] == "chatcmpl-tool-1" and r["output"][2]["id"].startswith("fc_")
    assert r["status"] == "completed" and r["tool_choice"] == "auto" and r["tools"][0]["name"] == "f"
    _openai_response(r)
    only_call = _shape(tools=[TOOL]).whole(_delta(tool_calls=[ToolCallDelta(index=0, name="f", arguments="{}")]))
    assert [i["type"] for i in only_call["output"]] == ["function_call"]
    empty = _shape().whole(_delta(finish_reason="stop"))
    assert empty["output"][0]["content"] == []
    hidden = _shape(include_reasoning=False).whole(_delta(text="x", reasoning="th"))
    assert [i["type"] for i in hidden["output"]] == ["message"]


def test_responses_whole_response_has_vllms_fields():
    vllm_protocol = pytest.importorskip("vllm.entrypoints.openai.responses.protocol")
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 5, "metadata": {"k": "v"}, "tools": [TOOL],
            "text": {"format": {"type": "json_object"}}}
    ours = ResponseShape(ResponsesRequest.model_validate(body), model="tiny", max_model_len=100, fmt=FMT).whole(
        _delta(text="x", finish_reason="stop", num_generated_tokens=1))
    request = vllm_protocol.ResponsesRequest.model_validate(body)
    usage = vllm_protocol.ResponseUsage(
        input_tokens=10, output_tokens=1, total_tokens=11,
        input_tokens_details=vllm_protocol.InputTokensDetails(cached_tokens=0),
        output_tokens_details=vllm_protocol.OutputTokensDetails())
    theirs = vllm_protocol.ResponsesResponse.from_request(
        request, request.to_sampling_params(5, {}), model_name="tiny", created_time=1, output=[],
        status="completed", usage=usage).model_dump(mode="json", by_alias=True)
    assert set(ours) == set(theirs)
    same = set(ours) - {"id", "created_at", "output", "tools", "text"}
    assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
    vllm_protocol.ResponsesResponse.model_validate(ours)


# --- the stream ---

def _stream(*deltas: Delta, with_logprobs: bool = False) -> tuple[ResponseEvents, list[dict]]:
    events = ResponseEvents(FMT, with_logprobs=with_logprobs, include_reasoning=True)
    out = [e for d in deltas for e in events.feed(d)]
    return events, out + events.close()


def test_responses_stream_events_per_item_as_vllms_processor():
    events, out = _stream(_delta(reasoning="th"), _delta(reasoning="ink"), _delta(text="an"), _delta(text="swer"),
                          _delta(tool_calls=[ToolCallDelta(index=0, id="c0", name="f")]),
                          _delta(tool_calls=[ToolCallDelta(index=0, arguments="{}")]),
                          _delta(tool_calls=[ToolCallDelta(index=1, id="c1", name="f", arguments="{}")]))
    assert [e["type"] for e in out] == [
        "response.output_item.added", "response.reasoning_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.reasoning_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["output_index"] for e in out if e["type"] == "response.output_item.done"] == [0, 1, 2, 3]
    assert [i["type"] for i in events.items] == ["reasoning", "message", "function_call", "function_call"]
    assert events.items[1]["content"][0]["text"] == "answer" and events.items[3]["call_id"] == "c1"
    for e in out:
        if e["type"] not in VLLM_ONLY_EVENTS:
            EVENTS.validate_python(e)


def test_responses_stream_logprobs_on_deltas_and_in_the_final_item():
    lp = TokenLogprob(token_id=1, token="a", logprob=-0.5, top=[TopLogprob(token_id=2, token="b", logprob=-1.0)])
    events, out = _stream(_delta(text="a", logprobs=[lp]), with_logprobs=True)
    delta = next(e for e in out if e["type"] == "response.output_text.delta")
    assert delta["logprobs"] == [{"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "b", "logprob": -1.0}]}]
    assert events.items[0]["content"][0]["logprobs"][0]["bytes"] == [97]


def test_responses_stream_framing_names_each_event():
    data = frame({"type": "response.output_text.delta", "delta": "a\u2028b"})
    assert data.startswith(b"event: response.output_text.delta\ndata: {") and data.endswith(b"}\n\n")
    assert data.count(b"\n") == 3


def test_responses_stream_events_have_vllms_fields():
    streaming = pytest.importorskip("vllm.entrypoints.openai.responses.streaming_events")
    state = streaming.SimpleStreamingState()
    theirs = (streaming.emit_simple_reasoning_open(state) + streaming.emit_simple_reasoning_delta(state, "t")
              + streaming.emit_simple_reasoning_done(state) + streaming.emit_simple_content_open(state)
              + streaming.emit_simple_content_delta(state, "a") + streaming.emit_simple_content_done(state)
              + streaming.emit_simple_tool_call_open(state, "f", 0)
              + streaming.emit_simple_tool_call_delta(state, "{}") + streaming.emit_simple_tool_call_done(state))
    _, ours = _stream(_delta(reasoning="t"), _delta(text="a"),
                      _delta(tool_calls=[ToolCallDelta(index=0, id="c", name="f", arguments="{}")]))
    assert [e["type"] for e in ours] == [e.type for e in theirs]
    for mine, vllm_event in zip(ours, theirs, strict=True):
        dumped = json.loads(vllm_event.model_dump_json(by_alias=True))
        assert set(mine) == set(dumped), mine["type"]
        for key in ("item", "part"):
            if key in mine:
                # vLLM's openai version adds null fields ("phase", "async", "caller") and a stray "summary".
                extra = {"phase", "async", "caller", "summary"} if mine[key].get("type") != "reasoning" else set()
                assert set(mine[key]) == set(dumped[key]) - extra, (mine["type"], key)


def test_responses_stream_whole_response_keeps_the_stream_ids():
    d = _delta(text="hi", finish_reason="stop", num_generated_tokens=1)
    events, out = _stream(d)
    whole = _shape().whole(merge([d]), events.items)
    assert whole["output"][0]["id"] == out[0]["item"]["id"]
    _openai_response(whole)


# --- what the route sends again (frontend/routes/responses.py) ---

def _refusal(message: str, param: str) -> BackendRequestError:
    return BackendRequestError(ErrorInfo(status=400, message=message, param=param))


def test_responses_route_sends_again_what_vllms_responses_lets_through():
    gen = generate_request("r1", _req(tools=[TOOL], max_output_tokens=10**6))
    over = relaxed(_refusal("max_tokens=1000000 is too large: ...", "max_tokens"), gen)
    assert over is not None and over.sampling.max_tokens is None and over.tool_choice == "auto"
    no_parser = relaxed(_refusal('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                 "to be set", "tool_choice"), over)
    assert no_parser is not None and no_parser.tool_choice == "none" and no_parser.tools == gen.tools
    # The second refusal of the same kind stands, as does any other.
    assert relaxed(_refusal("max_tokens=1 is too large", "max_tokens"), over) is None
    assert relaxed(_refusal("invalid tools or tool_choice: ...", "tool_choice"), gen) is None
    assert relaxed(BackendRequestError(ErrorInfo(status=503, message="gate", param="max_tokens")), gen) is None
