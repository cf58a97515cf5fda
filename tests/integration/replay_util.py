"""Helpers shared by the validator-replay integration tests (test_validation_replay.py, test_logprobs_mode.py,
test_grammar_degradation.py: our versions of the fork's live tests in tests/gonka/).

A replay is what the Go validator does: re-send the original request body, plus `enforced_tokens` built
from the inference's logprobs (`build_enforced_tokens` of the fork's tests/gonka/live_conftest.py), and compare
with distance2 (sampling/distance.py).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx

from sampling.distance import distance2, positions_from_openai

# The default chat body of the fork's live tests (tests/gonka/live_conftest.py `chat_request`).
DEFAULT_CHAT = {"temperature": 0.99, "seed": 42, "logprobs": True, "top_logprobs": 5, "n": 1,
                "skip_special_tokens": False, "stream": False}
# The −9999 clamp of masked (−inf) logprobs; anything at or below this counts as masked.
MASKED = -9990.0
# The distance2 bound of an honest replay (the fork's tests/gonka/test_live_validation.py).
HONEST = 0.05


def body(model: str, content: str, **overrides: Any) -> dict[str, Any]:
    """A chat body with the harness defaults; overrides win (None values are dropped)."""
    b = {"model": model, "messages": [{"role": "user", "content": content}], **DEFAULT_CHAT, **overrides}
    return {k: v for k, v in b.items() if v is not None}


def chat(base_url: str, payload: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = httpx.post(f"{base_url}/v1/chat/completions", json=payload, timeout=180)
    assert r.status_code == status, r.text
    return r.json()


def choice(resp: dict[str, Any]) -> dict[str, Any]:
    return resp["choices"][0]


def positions(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """choices[0].logprobs.content."""
    return choice(resp)["logprobs"]["content"]


def tokens(resp: dict[str, Any]) -> list[str]:
    return [p["token"] for p in positions(resp)]


def top_values(resp: dict[str, Any]) -> list[float]:
    return [e["logprob"] for p in positions(resp) for e in p["top_logprobs"]]


def build_enforced_tokens(content: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The `enforced_tokens` payload that replays a chat response (`choices[0].logprobs.content`), as the fork's
    tests/gonka/live_conftest.py builds it: each position's token, then its top tokens (none where top_logprobs is
    empty or null)."""
    tokens = [{"token": str(p["token"]), "top_tokens": [str(e["token"]) for e in p.get("top_logprobs") or []]}
              for p in content]
    return {"tokens": tokens}


def enforced(resp: dict[str, Any]) -> dict[str, Any]:
    return build_enforced_tokens(positions(resp))


def replay_body(original: dict[str, Any], resp: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The original body (same max_tokens, ignore_eos, grammar, sampling) plus enforced_tokens."""
    b = {**copy.deepcopy(original), "enforced_tokens": enforced(resp), **overrides}
    return {k: v for k, v in b.items() if v is not None}


def dist(inf: dict[str, Any], val: dict[str, Any]) -> float:
    """distance2 of two chat responses; asserts the token sequences are comparable (dist ≥ 0)."""
    d, _ = distance2(positions_from_openai(positions(inf)), positions_from_openai(positions(val)))
    assert d >= 0, f"not comparable: {tokens(inf)} vs {tokens(val)}"
    return d


def assert_serving(base_url: str, model: str) -> None:
    """The engine survived: health is 200 and an ordinary chat request returns 200 with text."""
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200
    resp = chat(base_url, body(model, "Are you still there?", max_tokens=3, ignore_eos=True))
    assert len(positions(resp)) == 3
