"""Validator replay on the embedded engine: our versions of the fork's live tests (tests/gonka/test_live_validation.py),
plus the enforced-token input rules of sampling/enforced_input.py (vocabulary check, EOS append, text fallback,
enforced_str) and batch isolation (sampling/enforced.py keys enforced ids by request).

Inference bodies use ignore_eos so the random tiny model gives a fixed length. Replays re-send the original
body (as the Go validator does), so they keep ignore_eos and max_tokens: with the same max_tokens the
appended EOS is never reached, and keeping ignore_eos means an EOS the inference happened to sample
mid-sequence does not end the replay early.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from sampling.distance import distance2, positions_from_openai
from tests.integration.replay_util import (
    HONEST,
    assert_serving,
    body,
    chat,
    choice,
    dist,
    enforced,
    positions,
    replay_body,
    tokens,
)

GRAVITY = "Explain gravity in two sentences."
EOS_ID = "464"  # <|im_end|> of the generated tiny model


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def gravity(stack):
    """(body, response) of the fork's tests/gonka/test_live_validation.py test 01 inference: 40 tokens."""
    b = body(stack.model, GRAVITY, max_tokens=40, ignore_eos=True)
    return b, chat(stack.base_url, b)


@pytest.fixture(scope="module")
def gravity_replay(stack, client, gravity):
    """The replay of `gravity` through the official openai client, validator fields via extra_body."""
    b, inf = gravity
    r = client.chat.completions.create(
        model=stack.model, messages=b["messages"], max_tokens=40, temperature=0.99, seed=42, logprobs=True,
        top_logprobs=5,
        extra_body={"enforced_tokens": enforced(inf), "ignore_eos": True, "skip_special_tokens": False})
    return r.model_dump()


@pytest.fixture(scope="module")
def short(stack):
    """A 24-token inference for the corruption, input-rule and batch tests."""
    b = body(stack.model, "Tell me a joke.", max_tokens=24, ignore_eos=True)
    return b, chat(stack.base_url, b)


def test_01_honest_replay_distance_below_threshold(gravity, gravity_replay):
    # Not exactly 0 (≈1e-4): the inference ran in the default processed mode, but its top ids hold no
    # padding (no grammar, no top-k), so the classifier (sampling/classifier.py) replays it in raw mode, without the
    # 1/0.99.
    _, inf = gravity
    assert tokens(gravity_replay) == tokens(inf)
    d = dist(inf, gravity_replay)
    print(f"\n[distance] gravity 40 tokens, openai client: {d:.3g}")
    assert 0 <= d < HONEST


def test_06_top_logprobs_5_has_five_entries_and_enforced_first(gravity, gravity_replay):
    for pos in positions(gravity_replay):
        assert len(pos["top_logprobs"]) == 5
        assert pos["top_logprobs"][0]["token"] == pos["token"]  # as the fork: the enforced token comes first
        assert pos["logprob"] == pos["top_logprobs"][0]["logprob"]


def test_09_replay_message_content_is_identical(gravity, gravity_replay):
    _, inf = gravity
    assert choice(gravity_replay)["message"]["content"] == choice(inf)["message"]["content"]
    assert choice(gravity_replay)["finish_reason"] == choice(inf)["finish_reason"] == "length"


def test_02_replay_at_other_temperature_gives_identical_tokens(stack):
    b = body(stack.model, "Describe the sea.", max_tokens=20, ignore_eos=True, temperature=0.5)
    inf = chat(stack.base_url, b)
    val = chat(stack.base_url, replay_body(b, inf, temperature=1.5))
    assert tokens(val) == tokens(inf)
    assert dist(inf, val) >= 0


def test_03_replay_with_other_seed_gives_identical_tokens(stack):
    b = body(stack.model, "Name a city.", max_tokens=15, ignore_eos=True, seed=111)
    inf = chat(stack.base_url, b)
    val = chat(stack.base_url, replay_body(b, inf, seed=999))
    assert tokens(val) == tokens(inf)
    # Sanity: seed 999 alone would have sampled something else, so the equality above is enforcement.
    assert tokens(chat(stack.base_url, {**b, "seed": 999})) != tokens(inf)


def test_04_honest_replay_with_json_schema_grammar(stack):
    schema = {"type": "object", "properties": {"fruit": {"type": "string"}, "count": {"type": "integer"}},
              "required": ["fruit", "count"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "fruit", "schema": schema}}
    b = body(stack.model, "Give me a fruit as JSON.", max_tokens=40, response_format=fmt)
    inf = chat(stack.base_url, b)
    assert choice(inf)["message"]["content"].startswith("{")
    val = chat(stack.base_url, replay_body(b, inf))
    d = dist(inf, val)
    print(f"\n[distance] json_schema fruit/count, {len(tokens(inf))} tokens: {d:.3g}")
    assert d < HONEST


@pytest.mark.parametrize(("prompt", "n"), [
    ("Hi", 10),
    ("Write a short paragraph about the history of the printing press in Europe.", 30),
    ("You are a helpful assistant. Summarise the plot of a long novel about a sailor who travels around "
     "the world, meets many people, loses his ship in a storm and finally returns home years later.", 60),
])
def test_05_honest_replay_across_prompt_lengths(stack, prompt, n):
    b = body(stack.model, prompt, max_tokens=n, ignore_eos=True)
    inf = chat(stack.base_url, b)
    val = chat(stack.base_url, replay_body(b, inf))
    assert len(tokens(val)) == n
    d = dist(inf, val)
    print(f"\n[distance] prompt {len(prompt)} chars, {n} tokens: {d:.3g}")
    assert d < HONEST


def test_10_honest_replay_of_100_tokens(stack):
    b = body(stack.model, GRAVITY, max_tokens=100, ignore_eos=True)
    inf = chat(stack.base_url, b)
    val = chat(stack.base_url, replay_body(b, inf))
    d = dist(inf, val)
    print(f"\n[distance] 100 tokens: {d:.3g}")
    assert d < HONEST
    assert choice(val)["message"]["content"] == choice(inf)["message"]["content"]


def test_07_out_of_vocab_token_is_400_naming_enforced_tokens(stack, short, client):
    """"99999" is inside Qwen's vocabulary (the fork's 200) but outside our 512 tokens: like the
    gonka-poc plugin we reject it, with the param the Go validator reads as "invalid" (not autopass)."""
    b, inf = short
    bad = replay_body(b, inf)
    bad["enforced_tokens"]["tokens"][1]["token"] = "99999"
    err = chat(stack.base_url, bad, status=400)["error"]
    assert err["param"] == "enforced_tokens" and "99999" in err["message"]
    # Same through the official client; and an out-of-vocab top token is refused too.
    bad["enforced_tokens"]["tokens"][1]["token"] = inf["choices"][0]["logprobs"]["content"][1]["token"]
    bad["enforced_tokens"]["tokens"][2]["top_tokens"][-1] = "88888"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack.model, messages=b["messages"], max_tokens=24,
                                       extra_body={"enforced_tokens": bad["enforced_tokens"]})
    assert e.value.body["param"] == "enforced_tokens"
    assert_serving(stack.base_url, stack.model)


@pytest.mark.parametrize("where", ["position_1", "every_3rd"])
def test_07_08_in_vocab_corruption_is_followed_and_engine_survives(stack, short, where):
    """The fork's tests 07/08 with an in-vocabulary corrupt id: the replay succeeds, pins the corrupt tokens,
    and the distance shows the mismatch (different token lists are not comparable)."""
    b, inf = short
    bad = replay_body(b, inf)
    picks = [1] if where == "position_1" else range(0, len(tokens(inf)), 3)
    for i in picks:
        bad["enforced_tokens"]["tokens"][i]["token"] = "300"
    want = [t["token"] for t in bad["enforced_tokens"]["tokens"]]
    assert want != tokens(inf)
    val = chat(stack.base_url, bad)
    assert tokens(val) == want
    assert choice(val)["finish_reason"] == "length"
    assert distance2(positions_from_openai(positions(inf)), positions_from_openai(positions(val))) == (-1, -1)
    assert_serving(stack.base_url, stack.model)


def test_enforced_list_ends_with_appended_eos(stack, short):
    """As the fork: EOS is appended and then repeated, so a replay allowed more tokens (and without ignore_eos)
    stops right after the enforced list, at EOS."""
    b, inf = short
    val = chat(stack.base_url, replay_body(b, inf, max_tokens=30, ignore_eos=None))
    assert tokens(val) == [*tokens(inf), EOS_ID]
    assert choice(val)["finish_reason"] == "stop"
    assert choice(val)["message"]["content"] == choice(inf)["message"]["content"]


def test_text_tokens_fall_back_to_the_tokenizer(stack):
    """As the fork: a position with any non-numeric string is tokenised (first id of each encoding); a fully
    numeric position is taken as ids. 'a' and 'b' are single byte tokens 97/98 in the tiny vocabulary."""
    payload = body(stack.model, "Hi", max_tokens=3, enforced_tokens={"tokens": [
        {"token": "a", "top_tokens": ["b", "7"]},      # mixed → whole position tokenised: 97
        {"token": "98", "top_tokens": ["97"]},         # numeric → id 98
        {"token": "abc", "top_tokens": []},            # first id of the encoding [97, 98, 99]
    ]})
    assert tokens(chat(stack.base_url, payload)) == ["97", "98", "97"]


def test_enforced_str_wins_over_enforced_tokens(stack, short):
    b, inf = short
    payload = replay_body(b, inf, max_tokens=30, ignore_eos=None, enforced_str="hello world")
    resp = chat(stack.base_url, payload)
    assert choice(resp)["message"]["content"] == "hello world"
    assert tokens(resp)[-1] == EOS_ID and choice(resp)["finish_reason"] == "stop"


async def _stream(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[list[str], float, float]:
    """Streams one chat; returns its token ids and the times of its first and last token chunks."""
    got: list[str] = []
    first = last = 0.0
    async with client.stream("POST", url, json={**payload, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk["choices"]:
                for pos in (c.get("logprobs") or {}).get("content") or []:
                    got.append(pos["token"])
                    last = time.monotonic()
                    first = first or last
    return got, first, last


async def test_batch_isolation_of_concurrent_replays_and_greedy_requests(stack, short, gravity):
    """The fork's "batch mixing" hazard: enforced ids are keyed by request. Two replays of different inferences and two
    ordinary greedy requests share the engine's batches; each replay must get exactly its own tokens and
    each greedy request the same tokens as when it ran alone."""
    n = 24
    (b1, inf1), (b2, inf2) = short, gravity
    replays = [replay_body(b1, inf1), replay_body({**b2, "max_tokens": n}, inf2)]
    greedy = [body(stack.model, p, max_tokens=n, ignore_eos=True, temperature=0.0)
              for p in ("Count to five.", "What is the capital of France?")]
    solo = [tokens(chat(stack.base_url, g)) for g in greedy]
    # A sampled chat 8x as long as the others, sent with them: each of them must run while it runs, so none can
    # have had the engine's batches to itself. (Asking all four to overlap each other failed on a busy 2-core
    # machine: the first one sent ended 23 ms before the last one's first token reached this client.)
    carrier = body(stack.model, "Tell a very long story.", max_tokens=8 * n, ignore_eos=True)
    url = f"{stack.base_url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=180) as client:
        # Open the connections first, so the chats leave together rather than one connect apart.
        await asyncio.gather(*(client.get(f"{stack.base_url}/health") for _ in range(5)))
        (_, carrier_first, carrier_last), *results = await asyncio.gather(
            *(_stream(client, url, p) for p in (carrier, greedy[0], replays[0], greedy[1], replays[1])))
    (g1, *_), (r1, *_), (g2, *_), (r2, *_) = results
    assert all(first < carrier_last and carrier_first < last for _, first, last in results)
    assert r1 == tokens(inf1)
    assert r2 == tokens(inf2)[:n]
    assert [g1, g2] == solo
    assert_serving(stack.base_url, stack.model)
