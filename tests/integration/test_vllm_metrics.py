"""/metrics against `vllm serve` on the same model after the same chat: the vllm:* families, their types, label
names and histogram buckets (dashboards and alerts written for vLLM must find them).

`vllm serve` runs here for real (its CPU build, eager, a small KV cache), so a vLLM upgrade that adds or renames
a family shows up as a failure of the diff below, never as a silently empty dashboard panel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.engine.compat import ENGINE_ENV_DEFAULTS
from tests.stack import MAX_MODEL_LEN, Proc, free_port, wait_until

pytestmark = pytest.mark.slow

MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": True,
        "temperature": 0}
# Families `vllm serve` exports that we do not, and why (docs/decisions.md repeats this list).
MISSING: dict[str, str] = {}


def _families(text: str) -> dict[str, object]:
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), f"a family appears twice: {sorted(n for n in names if names.count(n) > 1)}"
    # prometheus_client's creation timestamps (`*_created`) are not families of their own, though the parser makes
    # one of a histogram's whose name ends in _total.
    return {f.name: f for f in families if f.name.startswith("vllm:") and not f.name.endswith("_created")}


def _label_names(family) -> set[frozenset[str]]:
    return {frozenset(k for k in s.labels if k != "le") for s in family.samples}


def _buckets(family) -> list[str]:
    return sorted({s.labels["le"] for s in family.samples if "le" in s.labels}, key=float)


@pytest.fixture(scope="module")
def vllm_serve_scrape(model_dir, tmp_path_factory) -> Iterator[str]:
    """One chat on `vllm serve` (its context as our test backends': some buckets follow it), then its /metrics."""
    work = tmp_path_factory.mktemp("vllm-serve")
    port = free_port()
    env = {**ENGINE_ENV_DEFAULTS, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    server = Proc(["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
                   "--port", str(port), "--served-model-name", MODEL, "--enforce-eager",
                   "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16"],
                  work / "vllm-serve.log", env=env).start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert server.proc is not None and server.proc.poll() is None, f"vllm serve exited:\n{server.tail()}"
            try:
                return httpx.get(f"{base_url}/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout_s=600, what="vllm serve up")
        r = httpx.post(f"{base_url}/v1/chat/completions", json=CHAT, timeout=120)
        assert r.status_code == 200, r.text
        yield httpx.get(f"{base_url}/metrics", timeout=10).text
    finally:
        server.stop()


def _our_scrape(stack) -> str:
    before = _success(httpx.get(f"{stack.base_url}/metrics", timeout=10).text)
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200, r.text

    def counted() -> str | None:
        # The processor records the finished request as it presents it: normally before the frontend has the last
        # delta, but a scrape racing that step may read the count before it.
        text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
        return text if _success(text) > before else None

    return wait_until(counted, timeout_s=30, what="the chat counted in vllm:request_success")


def _success(text: str) -> float:
    family = _families(text).get("vllm:request_success")
    return sum(s.value for s in family.samples if s.name.endswith("_total")) if family is not None else 0.0


def test_vllm_families_match_vllm_serve(stack, vllm_serve_scrape):
    ours, theirs = _families(_our_scrape(stack)), _families(vllm_serve_scrape)
    assert set(ours) <= set(theirs), f"vllm:* families vllm serve does not have: {sorted(set(ours) - set(theirs))}"
    assert set(theirs) - set(ours) == set(MISSING), (
        f"missing and not listed: {sorted(set(theirs) - set(ours) - set(MISSING))}; "
        f"listed but exported: {sorted(set(MISSING) & set(ours))}")
    for name, family in ours.items():
        reference = theirs[name]
        assert family.type == reference.type, name
        assert _label_names(family) == _label_names(reference), name
        assert _buckets(family) == _buckets(reference), name


def test_vllm_families_count_our_chat(stack):
    families = _families(_our_scrape(stack))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    labels = (("engine", "0"), ("model_name", MODEL))
    assert samples[("vllm:request_success_total", (*labels[:1], ("finished_reason", "length"), *labels[1:]))] >= 1
    assert samples[("vllm:generation_tokens_total", labels)] >= CHAT["max_tokens"]
    assert samples[("vllm:time_to_first_token_seconds_count", labels)] >= 1
    assert samples[("vllm:e2e_request_latency_seconds_count", labels)] >= 1
    # The engine thread's families carry vLLM's labels too (their values trail by up to a ping period).
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:iteration_tokens_total_count"):
        assert (name, labels) in samples, name
    # The engine's KV cache size reaches the processor's logger once the engine is built.
    [info] = families["vllm:cache_config_info"].samples
    assert int(info.labels["num_gpu_blocks"]) > 0
