"""Chat and completions through the official openai client against the real stack (CPU vLLM engine)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from backend.processor.cost import INLINE_CHARS
from tests.integration.pow_util import metric
from tests.stack import MAX_MODEL_LEN

MESSAGES = [{"role": "user", "content": "Tell me about the weather today."}]


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_non_stream_returns_text_and_usage(client, stack):
    # Seeded: the random model's text is empty where every token is a reserved special one or a byte still waiting
    # for the rest of its UTF-8 character (tests/integration/test_responses.py, the framing test).
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=12, seed=7,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_stream_matches_non_stream_for_same_seed(client, stack):
    kw = dict(model=stack.model, messages=MESSAGES, max_tokens=16, seed=7, temperature=0.8,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 16


def test_completions_non_stream_and_stream(client, stack):
    r = client.completions.create(model=stack.model, prompt="Once upon a time", max_tokens=8, seed=3,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=stack.model, prompt="Once upon a time", max_tokens=8, seed=3, stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == r.choices[0].text


def test_chat_seed_is_deterministic_and_seeds_differ(client, stack):
    def run(seed: int) -> str:
        return client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=20,
                                              temperature=1.0, seed=seed,
                                              extra_body={"ignore_eos": True}).choices[0].message.content
    assert run(1234) == run(1234)
    assert run(1234) != run(4321)


def test_chat_stop_string_ends_output_before_it(client, stack):
    kw = dict(model=stack.model, messages=MESSAGES, max_tokens=40, temperature=0.0,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), f"unlucky greedy output {full!r}"
    r = client.chat.completions.create(stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index(stop)]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_chat_top_logprobs_has_k_entries_per_position(client, stack, k):
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=6, logprobs=True,
                                       top_logprobs=k, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for pos in content:
        assert len(pos.top_logprobs) == k
        assert pos.token.isdigit()  # the network's format: token ids as strings
        assert pos.top_logprobs[0].token == pos.token  # the sampled token comes first
        assert pos.logprob <= 0.0


def test_chat_json_schema_output_parses(client, stack):
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                               "count": {"type": "integer"}},
              "required": ["fruit", "count"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "Give me a fruit as JSON."}], max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "fruit", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"fruit", "count"} and isinstance(data["count"], int)


def test_models_lists_served_model(client, stack):
    assert [m.id for m in client.models.list().data] == [stack.model]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 1000}, "n"),  # past --max-num-seqs
    ({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
    ({"messages": [{"role": "user", "content": "x " * 3000}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format"),
    # Found by the schemathesis sweep (test_http_sweep.py) or next to it; each was a 500 before.
    ({"messages": [{"role": "user", "content": "hi"}], "stop_token_ids": [2**64]}, "stop_token_ids.0"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_k": 2**64}, "top_k"),
    ({"messages": [{"role": "user", "content": "hi"}], "min_tokens": 2**64}, "min_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "min_tokens": 5}, "min_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}], "enforced_str": "\ud800"}, "enforced_str"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "\udfff"}, "model"),
])
def test_chat_bad_input_is_400_naming_param(stack, body, param):
    # json.dumps, not httpx's encoder: the body may carry Infinity or an escaped lone surrogate ("\ud800").
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", content=json.dumps({"model": stack.model, **body}),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["code"] == 400 and err["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 1_000_000}]}, "messages"),
    ("/v1/completions", {"prompt": "x " * 1_000_000}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "enforced_str": "x " * 1_000_000},
     "enforced_str"),
])
def test_text_that_cannot_fit_is_refused_before_tokenizing(stack, path, body, param):
    # 2 MB against a MAX_MODEL_LEN-token context: refused by the size bound (its message says "far longer"), not by
    # tokenizing it on the engine thread first.
    r = httpx.post(f"{stack.base_url}{path}", json={"model": stack.model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "far longer" in err["message"], err


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 50_000}]}, "messages"),
    ("/v1/completions", {"prompt": "x " * 50_000}, "prompt"),
])
def test_long_text_is_tokenized_off_the_engine_thread_while_streams_go_on(client, stack, path, body, param):
    # 100k characters: past INLINE_CHARS, within the size bound (MAX_MODEL_LEN tokens x 116 bytes), so the prepare
    # thread tokenizes it and its token count refuses it. A stream started before it runs to its end.
    assert INLINE_CHARS < 100_000 < MAX_MODEL_LEN * 116
    stream = client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=24, stream=True, extra_body={"ignore_eos": True})
    first = next(stream)
    r = httpx.post(f"{stack.base_url}{path}", json={"model": stack.model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "input tokens" in err["message"], err
    rest = list(stream)
    assert [first, *rest][-1].choices[0].finish_reason == "length"


def test_chat_invalid_json_body_is_400(stack):
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == 400


def test_chat_unknown_model_is_404(stack):
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=10,
                   json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


def test_chat_after_bad_requests_still_serves(client, stack):
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=3)
    assert r.choices[0].message.content is not None


def test_streams_come_on_the_frontends_second_connection_from_the_processor(client, stack):
    """backend/processor/direct.py: the frontend connects a second DEALER to the processor's own socket and says
    Hello there at each pong; requests prepared from then on get their deltas on it, not through the engine
    process. Retried until the Hello has landed (a fresh stack's first pong may come after the first chat)."""
    assert metric(stack.base_url, "pocserve_frontend_direct_connected") == 1
    deadline = time.monotonic() + 60
    name = "pocserve_frontend_direct_messages_total"
    while True:
        # A scrape's own reply (vLLM's families, from the processor) comes that way too, after the scrape has
        # read the counter: counted here between two scrapes without a chat, and taken off.
        first = metric(stack.base_url, name)
        before = metric(stack.base_url, name)
        chunks = list(client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=8, seed=7,
                                                     stream=True, extra_body={"ignore_eos": True}))
        got = metric(stack.base_url, name) - before - (before - first)
        if got > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got >= 1, "no message came on the direct connection"
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason == "length") == 1
