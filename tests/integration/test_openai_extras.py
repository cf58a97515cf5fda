"""n > 1, stream usage (include_usage, continuous_usage_stats), /tokenize and /detokenize, through the official
openai client and plain HTTP, as `vllm serve` answers them (issue 13, items 3 to 5)."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.integration.replay_util import HONEST, body, chat, dist, replay_body

MESSAGES = [{"role": "user", "content": "Tell me about the weather today."}]


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(stack):
    return AutoTokenizer.from_pretrained(stack.model_dir)


# --- n ---

def test_n_choices_non_stream_each_with_logprobs_and_summed_usage(client, stack):
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, n=3, max_tokens=6, seed=5,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.finish_reason == "length" and len(c.logprobs.content) == 6
        assert all(len(p.top_logprobs) == 2 for p in c.logprobs.content)
    # vLLM seeds choice i with seed + i: the choices differ.
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.completion_tokens == 18


def test_n_choices_stream_match_non_stream(client, stack):
    kw = dict(model=stack.model, messages=MESSAGES, n=2, max_tokens=8, seed=9, extra_body={"ignore_eos": True})
    whole = [c.message.content for c in client.chat.completions.create(**kw).choices]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", "assistant"]
    assert sorted(c.choices[0].index for c in chunks[:2]) == [0, 1]
    texts = ["", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == whole
    finishes = sorted((c.choices[0].index, c.choices[0].finish_reason) for c in chunks
                      if c.choices and c.choices[0].finish_reason)
    assert finishes == [(0, "length"), (1, "length")]
    assert chunks[-1].usage.completion_tokens == 16


def test_n_choices_completions(client, stack):
    r = client.completions.create(model=stack.model, prompt="Once upon a time", n=2, max_tokens=5, seed=4,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 10
    streamed = ["", ""]
    for c in client.completions.create(model=stack.model, prompt="Once upon a time", n=2, max_tokens=5, seed=4,
                                       stream=True, extra_body={"ignore_eos": True}):
        for choice in c.choices:
            streamed[choice.index] += choice.text
    assert streamed == [c.text for c in r.choices]


def test_n_one_validator_replay_still_matches(stack):
    original = body(stack.model, "hello", max_tokens=24, ignore_eos=True)
    inference = chat(stack.base_url, original)
    replay = chat(stack.base_url, replay_body(original, inference))
    assert dist(inference, replay) < HONEST


@pytest.mark.parametrize(("change", "param"), [
    ({"n": 1000}, "n"),  # beyond the test backend's --max-num-seqs (64, tests/stack.py)
    ({"n": 0}, "n"),
    ({"n": 2, "enforced_str": "hello"}, "n"),
])
def test_n_bad_input_is_400_naming_n(stack, change, param):
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=30,
                   json={"model": stack.model, "messages": MESSAGES, **change})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# --- stream usage ---

def test_stream_include_usage_closes_with_a_usage_chunk_only(client, stack):
    chunks = list(client.chat.completions.create(
        model=stack.model, messages=MESSAGES, max_tokens=5, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_stream_continuous_usage_stats_put_usage_on_every_chunk(client, stack, route):
    options = {"include_usage": True, "continuous_usage_stats": True}
    if route == "chat":
        chunks = list(client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=5, stream=True,
                                                     stream_options=options, extra_body={"ignore_eos": True}))
    else:
        chunks = list(client.completions.create(model=stack.model, prompt="Once upon a time", max_tokens=5,
                                                stream=True, stream_options=options, extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chunks)
    prompt = chunks[-1].usage.prompt_tokens
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 5
    assert all(c.usage.prompt_tokens == prompt and c.usage.total_tokens == prompt + c.usage.completion_tokens
               for c in chunks)


def test_stream_continuous_usage_stats_without_include_usage_is_off(client, stack):
    chunks = list(client.chat.completions.create(
        model=stack.model, messages=MESSAGES, max_tokens=3, stream=True,
        stream_options={"include_usage": False, "continuous_usage_stats": True}))
    assert all(c.usage is None for c in chunks)


# --- /tokenize, /detokenize ---

def test_tokenize_prompt_as_vllm_serve(stack, tokenizer):
    r = httpx.post(f"{stack.base_url}/tokenize", json={"model": stack.model, "prompt": "Hello world",
                                                        "return_token_strs": True}, timeout=30)
    assert r.status_code == 200, r.text
    ids = tokenizer.encode("Hello world", add_special_tokens=True)
    assert r.json() == {"count": len(ids), "max_model_len": 4096, "tokens": ids,
                        "token_strs": tokenizer.convert_ids_to_tokens(ids)}


def test_tokenize_messages_match_the_chat_prompt(client, stack, tokenizer):
    r = httpx.post(f"{stack.base_url}/tokenize", json={"messages": MESSAGES}, timeout=30).json()
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert r["tokens"] == tokenizer.encode(text, add_special_tokens=False) and r["token_strs"] is None
    # The same count the chat route bills as prompt tokens.
    usage = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=1).usage
    assert r["count"] == usage.prompt_tokens
    no_prompt = httpx.post(f"{stack.base_url}/tokenize", timeout=30,
                           json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert no_prompt["count"] < r["count"]


def test_detokenize_round_trips_tokenize(stack):
    text = "The weather today is sunny."
    ids = httpx.post(f"{stack.base_url}/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
    r = httpx.post(f"{stack.base_url}/detokenize", json={"model": stack.model, "tokens": ids}, timeout=30)
    assert r.status_code == 200 and r.json() == {"prompt": text}


@pytest.mark.parametrize(("path", "payload", "status", "param"), [
    ("/tokenize", {"model": "nope", "prompt": "hi"}, 404, "model"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, 400, "prompt"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"prompt": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens.1"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "model"),
])
def test_tokenize_bad_input(stack, path, payload, status, param):
    r = httpx.post(f"{stack.base_url}{path}", json=payload, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


# --- priority: vLLM's scheduler field ---

@pytest.mark.parametrize("route", ["chat", "completions"])
def test_priority_is_taken_under_fcfs_as_vllm_takes_it(stack, route):
    """The shared test backend runs vLLM's default policy (fcfs), which takes a request's priority and ignores it
    (vLLM 0.29's input processor checks nothing), as `vllm serve` does; under --scheduling-policy priority it
    orders requests (tests/integration/test_api_server.py). A priority that is not an integer is a 400."""
    path, field = ("chat/completions", {"messages": MESSAGES}) if route == "chat" else ("completions",
                                                                                       {"prompt": "Hello"})
    url = f"{stack.base_url}/v1/{path}"
    for priority in (1, -3, 0):
        r = httpx.post(url, timeout=60, json={"model": stack.model, **field, "max_tokens": 2, "priority": priority})
        assert r.status_code == 200, r.text
    r = httpx.post(url, timeout=30, json={"model": stack.model, **field, "max_tokens": 2, "priority": "high"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
