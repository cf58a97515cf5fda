"""The CPU engine's memory defaults: no start depends on how much RAM the host reports.

vLLM's CPU engine takes its KV cache as a share of the NUMA node's MemTotal less its own RSS, and a fresh VM's node
reads far less than it will (7.8 GiB, 23.5 GiB an hour later): the generated model's 262144-token context then
did not fit and the embedded default refused to start. Without --max-model-len the CPU engine now fits the context
to its KV cache (vLLM's auto-fit) and the processor, which checks every request's length, learns the fitted value
from the built engine (docs/reliability.md, "Memory the host reports").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.stack import Stack, serving

# The tiny model's KV per token: 4 layers x (K, V) x 2 KV heads x 64 x 2 bytes (bf16).
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2
SMALL_KV = 64 * 2**20  # holds 32768 tokens: far less than the model's context


def default_argv(model_dir: Path, work: Path, *extra: str) -> list[str]:
    """`python -m backend` as a user starts it on the embedded default: no memory or context flag but `extra`."""
    return ["-m", "backend", "--model", str(model_dir), "--generate-model", "none", "--address",
            f"ipc://{work}/backend.ipc", "--state-dir", str(work / "state"), "--served-model-name", "tiny",
            "--enforce-eager", *extra]


@pytest.fixture(scope="module")
def small_kv(model_dir, stack, tmp_path_factory) -> Iterator[Stack]:
    """A backend with a small explicit KV cache and no --max-model-len, beside the session's running stack."""
    work = tmp_path_factory.mktemp("small-kv")
    with serving(model_dir, work, default_argv(model_dir, work, "--kv-cache-memory-bytes", str(SMALL_KV))) as s:
        yield s


def _served_len(base_url: str) -> int:
    return httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"]


def _model_len(model_dir: Path) -> int:
    import json
    return json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]


def test_without_max_model_len_the_context_is_fitted_to_the_kv_cache(small_kv, model_dir):
    fitted = _served_len(small_kv.base_url)
    assert 0 < fitted <= SMALL_KV // KV_BYTES_PER_TOKEN < _model_len(model_dir)
    log = small_kv.backend.log_path.read_text(errors="replace")
    assert re.search(rf"max_model_len_fitted .*max_model_len={fitted} ", log), log[-3000:]


def test_the_processor_checks_lengths_against_the_fitted_context(small_kv):
    fitted = _served_len(small_kv.base_url)
    prompt = "ab " * fitted  # more tokens than the fitted context, far fewer than the model's
    counted = httpx.post(f"{small_kv.base_url}/tokenize", json={"model": "tiny", "prompt": prompt}, timeout=60)
    assert counted.status_code == 200, counted.text
    assert counted.json()["max_model_len"] == fitted and counted.json()["count"] > fitted
    too_long = httpx.post(f"{small_kv.base_url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]})
    assert too_long.status_code == 400, too_long.text
    assert f"maximum context length is {fitted} tokens" in too_long.json()["error"]["message"]
    served = httpx.post(f"{small_kv.base_url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
    assert served.status_code == 200, served.text


def test_the_embedded_default_starts_beside_running_stacks(small_kv, model_dir, tmp_path):
    """No flag at all (the CPU engine's share of RAM, the fitted context), beside two running stacks."""
    with serving(model_dir, tmp_path, default_argv(model_dir, tmp_path)) as default:
        assert 0 < _served_len(default.base_url) <= _model_len(model_dir)
        reply = httpx.post(f"{default.base_url}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
        assert reply.status_code == 200, reply.text
        assert "max_model_len_fitted" in default.backend.log_path.read_text(errors="replace")
