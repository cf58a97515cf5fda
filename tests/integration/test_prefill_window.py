"""The prefill window (backend/engine/prefill_window.py) on the real engine: a backend of its own with a window far
longer than any step, so that only the hold can explain a late first token. A request arriving while another
decodes gets its first token about the window later; one arriving to an idle engine is not held."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.stack import Stack, running_stack

WINDOW_S = 2.0
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def held(model_dir, tmp_path_factory) -> Iterator[Stack]:
    with running_stack(model_dir, tmp_path_factory.mktemp("window"), "--prefill-window-ms",
                       str(int(WINDOW_S * 1000))) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(held) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{held.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    _, stream = _first_token_s(client, held.model)  # a fresh backend's first chat takes ~2 s on this CPU
    list(stream)
    return client


def _first_token_s(client, model: str) -> tuple[float, object]:
    """Seconds to the first text. The random model's tokens may be bytes of an unfinished UTF-8 character, which
    the detokenizer holds (~1 in 3): 16 tokens, so some text comes, a few decode steps after the first token."""
    sent = time.monotonic()
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, stream=True,
                                            extra_body={"ignore_eos": True})
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    return time.monotonic() - sent, stream


def test_prefill_window_idle_engine_does_not_hold_a_request(client, held):
    waited, stream = _first_token_s(client, held.model)
    list(stream)
    assert waited < WINDOW_S  # nothing decoding: vLLM ignores the deferral and prefills it in the next step


def test_prefill_window_holds_a_prefill_while_another_request_decodes(client, held):
    decoding = client.chat.completions.create(model=held.model, messages=MESSAGES, max_tokens=4000,
                                              stream=True, extra_body={"ignore_eos": True})
    next(c for c in decoding if c.choices and c.choices[0].delta.content)  # it is decoding from here on
    token_times: list[float] = []
    stop = threading.Event()

    def read() -> None:  # the stream is read as it comes, so each chunk's time is when it was produced
        for _ in decoding:
            token_times.append(time.monotonic())
            if stop.is_set():
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        waited, stream = _first_token_s(client, held.model)
        first_token_at = time.monotonic()
        list(stream)
        # The first request was still decoding after the second one's first token: the hold applied throughout.
        deadline = time.monotonic() + 60
        while not (token_times and token_times[-1] > first_token_at) and reader.is_alive():
            assert time.monotonic() < deadline, "the decoding request produced nothing for 60 s"
            time.sleep(0.05)
        assert token_times[-1] > first_token_at, "the decoding request ended before the held one started"
    finally:
        stop.set()
        reader.join(60)
        decoding.close()  # the backend aborts it when the stream closes
    # Released at the last step that ends within the window: a few ms before it, unless steps take ~1 s here.
    assert waited >= WINDOW_S / 2
