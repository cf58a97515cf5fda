"""usage.prompt_tokens_details.cached_tokens with --enable-prompt-tokens-details, from the real engine's prefix
cache: the same long prompt twice, the second finds all its full KV blocks cached (issue 28, item 2).

The flag is a frontend setting: a second frontend with it on shares the session's backend; the session's own
frontend (flag off) shows usage without the details, as vllm serve does by default.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.stack import Proc, free_port, frontend_args, wait_healthy

ROUTES = ["chat", "completions"]
# The keys vllm serve gives: chat adds created_cache_tokens; a whole response is dumped with its nulls, the
# closing usage chunk of a stream without them (frontend/shape.py).
DETAIL_KEYS = {("chat", False): {"cached_tokens", "created_cache_tokens", "multimodal_tokens"},
               ("chat", True): {"cached_tokens", "created_cache_tokens"},
               ("completions", False): {"cached_tokens", "created_cache_tokens", "multimodal_tokens"},
               ("completions", True): {"cached_tokens"}}


@pytest.fixture(scope="module")
def details_url(stack, tmp_path_factory) -> str:
    port = free_port()
    proc = Proc(frontend_args(stack.address, port, "--enable-prompt-tokens-details"),
                tmp_path_factory.mktemp("details-frontend") / "frontend.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=60)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def block_size(stack) -> int:
    return httpx.get(f"{stack.base_url}/version", timeout=10).json()["backend"]["block_size"]


def _long_text() -> str:
    """Several KV blocks' worth, opening with a fresh id: no earlier request shares even its first block."""
    return uuid.uuid4().hex + " " + " ".join(f"item {i} of the list," for i in range(60))


def _usage(base_url: str, route: str, text: str, *, stream: bool) -> tuple[dict, list[dict]]:
    """(the request's usage, the usage of every other stream chunk)."""
    if route == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}
    else:
        path, body = "/v1/completions", {"prompt": text}
    body.update(model="tiny", max_tokens=4, ignore_eos=True)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    r = httpx.post(f"{base_url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["usage"], []
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == []
    return chunks[-1]["usage"], [c["usage"] for c in chunks[:-1]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ROUTES)
def test_second_identical_prompt_reports_its_cached_blocks(details_url, block_size, route, stream):
    text = _long_text()
    first, _ = _usage(details_url, route, text, stream=stream)
    second, chunks = _usage(details_url, route, text, stream=stream)
    assert first["prompt_tokens"] == second["prompt_tokens"] > 2 * block_size
    for usage in (first, second):
        assert set(usage["prompt_tokens_details"]) == DETAIL_KEYS[route, stream]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    # vLLM hits whole blocks only, and never the prompt's last token (it must be computed to sample from).
    assert cached > 0 and cached % block_size == 0
    assert cached == (second["prompt_tokens"] - 1) // block_size * block_size
    if route == "chat":
        # The first request wrote the prompt's full blocks to the cache; the second found them there.
        assert first["prompt_tokens_details"]["created_cache_tokens"] >= cached
    # Continuous usage chunks never carry the details (vllm serve's).
    assert bool(chunks) == stream and all("prompt_tokens_details" not in u for u in chunks)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ROUTES)
def test_flag_off_usage_has_no_details_even_on_a_cache_hit(stack, route, stream):
    text = _long_text()
    for _ in range(2):
        usage, chunks = _usage(stack.base_url, route, text, stream=stream)
        assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert all("prompt_tokens_details" not in u for u in chunks)
