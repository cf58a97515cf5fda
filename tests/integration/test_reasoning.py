"""Reasoning (issue 13, item 2): a backend of its own with `--reasoning-parser qwen3` (vLLM's parser), output forced
to `<think>...</think>...` by validator replay; `reasoning_content` (and vllm serve's newer `reasoning`) in whole
responses and stream deltas, through the official openai client. Also: a parser name vLLM does not know is a
settings error at start."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from tests.stack import REPO, Stack, backend_args, running_stack

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
THOUGHT = "<think>Two and two make four.</think>The answer is 4."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
THOUGHT_THEN_CALL = ('<think>I need the weather.</think>\n'
                     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture(scope="module")
def thinking(model_dir, tmp_path_factory) -> Iterator[Stack]:
    with running_stack(model_dir, tmp_path_factory.mktemp("thinking"), "--reasoning-parser", "qwen3") as stack:
        yield stack


@pytest.fixture(scope="module")
def client(thinking) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{thinking.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _create(client, stack, output: str, **kw):
    return client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=200,
                                          extra_body={"enforced_str": output}, **kw)


def test_reasoning_non_stream_splits_reasoning_from_content(client, thinking):
    r = _create(client, thinking, THOUGHT)
    message = r.choices[0].message
    assert message.content == "The answer is 4."
    assert message.model_extra["reasoning_content"] == "Two and two make four."
    assert message.model_extra["reasoning"] == "Two and two make four."
    assert r.choices[0].finish_reason == "stop"


def test_reasoning_stream_deltas_carry_reasoning_content(client, thinking):
    chunks = [c for c in _create(client, thinking, THOUGHT, stream=True) if c.choices]
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (reasoning, content) == ("Two and two make four.", "The answer is 4.")
    # Reasoning comes first, then content; no delta carries both names with different text.
    for c in chunks:
        extra = c.choices[0].delta.model_extra or {}
        assert extra.get("reasoning_content") == extra.get("reasoning")


def test_reasoning_then_tool_call(client, thinking):
    r = _create(client, thinking, THOUGHT_THEN_CALL, tools=TOOLS)
    message = r.choices[0].message
    assert message.model_extra["reasoning_content"] == "I need the weather."
    [call] = message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls"
    chunks = [c for c in _create(client, thinking, THOUGHT_THEN_CALL, tools=TOOLS, stream=True) if c.choices]
    arguments = "".join(tc.function.arguments or "" for c in chunks for tc in c.choices[0].delta.tool_calls or ())
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_reasoning_history_with_reasoning_content_is_accepted(client, thinking):
    first = _create(client, thinking, THOUGHT)
    history = [*MESSAGES, first.choices[0].message, {"role": "user", "content": "And 3 + 3?"}]
    r = client.chat.completions.create(model=thinking.model, messages=history, max_tokens=40,
                                       extra_body={"enforced_str": "<think>Six.</think>6"})
    assert r.choices[0].message.content == "6"


@pytest.mark.parametrize("flag", ["--reasoning-parser", "--tool-call-parser"])
def test_unknown_parser_is_a_settings_error_at_start(model_dir, tmp_path, flag):
    args = backend_args(model_dir, f"ipc://{tmp_path}/b.ipc", "--state-dir", str(tmp_path / "state"), flag, "nope")
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert flag in done.stderr and "'nope'" in done.stderr
