"""/v1/responses on the shared stack (CPU vLLM engine), through the official openai client and raw HTTP: the
response object, the stream's events, input items, logprobs, errors as chat's, and the PoC gate as chat's.

Every test leaves the engine idle; the mining tests stop their round in `finally`.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.integration.pow_util import GATE_BODY, node, params, stop, wait_until
from tests.stack import LONG_MAX_TOKENS, MAX_MODEL_LEN

QUESTION = "Tell me about the weather today."
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
STREAM_TYPES = ["response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                "response.content_part.done", "response.output_item.done", "response.completed"]


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _post(stack, **body) -> httpx.Response:
    return httpx.post(f"{stack.base_url}/v1/responses", json={"model": stack.model, **body}, timeout=120)


def _sse(stack, **body) -> list[tuple[str, dict]]:
    """(event name, data) of a raw stream, checking vLLM's framing: an `event:` line names each data line's type."""
    events, name = [], None
    with httpx.stream("POST", f"{stack.base_url}/v1/responses", timeout=120,
                      json={"model": stack.model, "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name, line
                events.append((name, data))
    return events


def test_responses_non_stream_through_the_openai_client(client, stack):
    r = client.responses.create(model=stack.model, input=QUESTION, max_output_tokens=12,
                                extra_body={"ignore_eos": True})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == stack.model
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    [part] = message.content
    assert part.type == "output_text" and part.annotations == [] and part.text == r.output_text
    assert r.usage.output_tokens == 12 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 12
    assert r.usage.input_tokens_details.cached_tokens >= 0 and r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 12 and r.temperature == 1.0 and r.top_p == 1.0 and r.tool_choice == "none"


def test_responses_is_the_chat_path(client, stack):
    """instructions + input give the answer chat gives for the same system and user messages (greedy)."""
    r = client.responses.create(model=stack.model, instructions="Be brief.", input=QUESTION, max_output_tokens=20,
                                temperature=0.0)
    chat = client.chat.completions.create(model=stack.model, max_tokens=20, temperature=0.0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}])
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.instructions == "Be brief."


def test_responses_stream_through_the_openai_client(client, stack):
    kw = dict(model=stack.model, input=QUESTION, max_output_tokens=16, temperature=0.8,
              extra_body={"ignore_eos": True, "seed": 7})
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]] == STREAM_TYPES
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = events[-1].response
    assert done.status == "incomplete" and done.output_text == text and done.usage.output_tokens == 16
    item_ids = {getattr(e, "item_id", None) or e.item.id for e in events[2:-1]}
    assert item_ids == {done.output[0].id}


def test_responses_stream_framing_is_vllms(stack):
    # Seeded, 16 tokens: a text delta must come. Unseeded, 4 random tokens once gave none (a fresh clone beside a
    # busy loop, 2026-12-06): reserved special tokens detokenize to nothing and lone high bytes wait for the rest
    # of their UTF-8 character, so the random model's text can stay empty to the end.
    events = _sse(stack, input=QUESTION, max_output_tokens=16, ignore_eos=True, seed=7)
    assert [name for name, _ in events][:2] == ["response.created", "response.in_progress"]
    created = events[0][1]["response"]
    assert created["object"] == "response" and created["usage"] is None
    assert created["max_output_tokens"] == 16
    delta = next(data for name, data in events if name == "response.output_text.delta")
    assert set(delta) == {"content_index", "delta", "item_id", "logprobs", "output_index", "sequence_number", "type"}
    assert events[-1][0] == "response.completed"


def test_responses_max_output_tokens_past_the_context_is_clamped_as_vllm_does(stack):
    """The chat path refuses max_tokens past the context's room; vLLM's Responses takes the room instead."""
    room = MAX_MODEL_LEN - _post(stack, input=QUESTION, max_output_tokens=1).json()["usage"]["input_tokens"]
    with httpx.stream("POST", f"{stack.base_url}/v1/responses", timeout=120, json={
            "model": stack.model, "input": QUESTION, "stream": True, "max_output_tokens": 10**9}) as r:
        assert r.status_code == 200, r.read()
        created = json.loads(next(line for line in r.iter_lines() if line.startswith("data: "))[6:])
    assert created["type"] == "response.created" and created["response"]["max_output_tokens"] == room
    # Not streamed too; stop strings the random model soon writes keep the answer short.
    r = _post(stack, input=QUESTION, max_output_tokens=10**9, stop=list("etaoinsrhl"))
    assert r.status_code == 200, r.text
    assert r.json()["max_output_tokens"] == room


def test_responses_input_items_carry_a_conversation_with_tool_calls(client, stack):
    first = client.responses.create(model=stack.model, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}],
        tools=[TOOL], max_output_tokens=8)
    assert first.tools[0].name == "get_weather" and first.tool_choice == "auto"
    history = [{"role": "user", "content": "What is the weather in Paris?"}, *first.output,
               {"type": "function_call", "call_id": "call-1", "name": "get_weather",
                "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call-1", "output": "Sunny, 21 C"},
               {"role": "user", "content": "And tomorrow?"}]
    r = client.responses.create(model=stack.model, input=history, tools=[TOOL], max_output_tokens=8)
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens > first.usage.input_tokens


def test_responses_logprobs_when_included(client, stack):
    # Seeded, without EOS: the random model's text must not be empty (EOS first, or only reserved special tokens,
    # which detokenize to nothing: CI once got no content in the last request below, unseeded).
    kw = dict(model=stack.model, input=QUESTION, max_output_tokens=6, top_logprobs=3,
              include=["message.output_text.logprobs"], extra_body={"ignore_eos": True, "seed": 7})
    r = client.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == 6 and all(len(lp.top_logprobs) == 3 for lp in lps)
    assert r.top_logprobs == 3
    events = list(client.responses.create(stream=True, **kw))
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    # A token that adds no text yet waits for the next delta; those after the last one are only in the message.
    whole = [lp.token for lp in events[-1].response.output[0].content[0].logprobs]
    assert len(whole) == 6 and streamed and whole[:len(streamed)] == streamed
    plain = client.responses.create(model=stack.model, input=QUESTION, max_output_tokens=6,
                                    extra_body={"ignore_eos": True, "seed": 7})
    assert plain.output[0].content[0].text  # the seeded tokens above, without logprobs asked
    assert plain.output[0].content[0].logprobs is None


@pytest.mark.parametrize("body,status,param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, 400,
     "input.0.message.content.0"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input.0"),
    ({"input": []}, 400, "input"),
    ({"input": "hi", "logit_bias": {"1": 2}}, 400, "logit_bias"),
    ({"input": "hi", "tools": [{"type": "web_search_preview"}]}, 400, "tools.0.type"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ({"input": "hi", "temperature": 3}, 400, "temperature"),
    ({"input": "hi", "previous_response_id": "resp_1"}, 404, "response_id"),
    ({"input": "hi", "model": "no-such-model"}, 404, "model"),
], ids=lambda v: str(v))
def test_responses_bad_input_is_a_clear_error_in_chats_shape(stack, body, status, param):
    r = httpx.post(f"{stack.base_url}/v1/responses", json={"model": stack.model, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    assert error["param"] == param, error


def test_responses_openai_client_raises_its_errors(client, stack):
    with pytest.raises(openai.BadRequestError, match="Tool choice 'required'"):
        client.responses.create(model=stack.model, input="hi", tool_choice="required")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")


def test_responses_model_may_be_left_out(stack):
    r = httpx.post(f"{stack.base_url}/v1/responses", json={"input": "hi", "max_output_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == stack.model


# --- the PoC gate (exclusive mode), as chat's (tests/integration/test_pow_api.py) ---

def _init(stack) -> None:
    body = {**node(block_height=900), "batch_size": 4, "params": params(64, 12)}
    r = httpx.post(f"{stack.base_url}/api/v1/pow/init/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_responses_are_503_during_mining_as_chat(stack):
    pow_url = f"{stack.base_url}/api/v1/pow"
    stop(pow_url)
    try:
        _init(stack)
        time.sleep(0.3)
        for stream in (False, True):
            r = _post(stack, input="hi", max_output_tokens=4, stream=stream)
            assert r.status_code == 503 and r.json() == GATE_BODY, r.text
        assert _post(stack, input=[]).status_code == 400  # validation first, as chat
    finally:
        stop(pow_url)
    assert _post(stack, input="hi", max_output_tokens=4).status_code == 200


def test_responses_stream_in_flight_ends_with_an_error_event_when_mining_starts(stack):
    pow_url = f"{stack.base_url}/api/v1/pow"
    stop(pow_url)
    started = threading.Event()
    seen: dict = {"events": []}

    def long_stream() -> None:
        try:
            with httpx.stream("POST", f"{stack.base_url}/v1/responses", timeout=120, json={
                    "model": stack.model, "input": QUESTION, "stream": True, "max_output_tokens": LONG_MAX_TOKENS,
                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        seen["events"].append(json.loads(line[6:]))
                        if len(seen["events"]) >= 8:
                            started.set()
        except httpx.HTTPError as e:
            seen["exception"] = repr(e)
        finally:
            started.set()

    thread = threading.Thread(target=long_stream)
    thread.start()
    try:
        assert started.wait(60), "the response never started streaming"
        _init(stack)
        thread.join(30)
        assert not thread.is_alive(), "the stream in flight was not ended"
    finally:
        stop(pow_url)
        thread.join(60)
    last = seen["events"][-1]
    assert last["type"] == "error" and last["code"] == "service_unavailable", (seen.get("exception"), last)
    assert "PoC generation is active" in last["message"]
    assert [e["sequence_number"] for e in seen["events"]] == list(range(len(seen["events"])))
    wait_until(lambda: _post(stack, input="hi", max_output_tokens=2).status_code == 200, timeout_s=30,
               what="responses served again")
