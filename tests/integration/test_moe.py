"""Qwen3-MoE on the CPU engine: the generated tiny-moe (8 experts, top-2) serves PoC and chat as dense does.

One backend of our own for the module, in shared scheduling mode so that chat runs during a mining round, with the
kernel warm-up on (off by default on the CPU engine): the artifacts and greedy chat below are checked after it ran.
Artifacts are checked against an independent HF-transformers forward (tests/reference_poc.py).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from backend.engine.warmup import warmup_sizes
from backend.tools.modelgen import ensure_model
from tests.integration.pow_util import MODEL, Server, artifacts_of, l2, node, params, status, stop, wait_until
from tests.reference_poc import HFReference


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return ensure_model(tmp_path_factory.mktemp("model") / "tiny-moe", "tiny-moe")


@pytest.fixture(scope="module")
def moe(moe_dir, tmp_path_factory):
    server = Server.start(moe_dir, tmp_path_factory.mktemp("moe"), "--scheduling-mode", "shared",
                          "--kernel-warmup", "on", "--max-num-batched-tokens", "4096", "--log-format", "json")
    yield server
    server.stop()


def test_moe_served_config_is_the_sparse_model(moe_dir):
    reference = HFReference(moe_dir)
    assert type(reference.model).__name__ == "Qwen3MoeForCausalLM"
    assert reference.model.config.num_experts == 8 and reference.model.config.num_experts_per_tok == 2


def test_moe_kernel_warmup_ran_every_size_before_ready(moe):
    lines = [json.loads(line) for line in (moe.work / "backend1.log").read_text().splitlines()
             if line.startswith("{") and json.loads(line).get("event") == "kernel_warmup"]
    assert len(lines) == 1, lines
    warm = lines[0]
    assert warm["largest"] == 4096 and warm["sizes"] == len(warmup_sizes(4096))
    assert warm["triton_builds"] == 0  # the CPU engine builds no Triton kernels
    assert httpx.get(f"{moe.base_url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("stronger_rng", [False, True])
def test_moe_poc_artifacts_match_hf_reference(moe, moe_dir, stronger_rng, record_property):
    nonces = list(range(24)) if not stronger_rng else list(range(1000, 1016))
    served = artifacts_of(moe.pow, nonces, seq_len=64, batch_size=8, poc_stronger_rng=stronger_rng)
    reference = HFReference(moe_dir).artifacts("TEST_BLOCK", "test_pub_keys", nonces, 64, stronger_rng=stronger_rng)
    assert sorted(served) == nonces
    distances = [l2(served[n], reference[n]) for n in nonces]
    record_property("l2_per_nonce", distances)
    print(f"L2 vLLM MoE vs HF (stronger_rng={stronger_rng}):", [round(d, 5) for d in distances])
    assert max(distances) < 0.02, distances


def test_moe_greedy_chat_unchanged_by_an_interleaved_mining_round(moe, receiver):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": 200, "temperature": 0.0, "ignore_eos": True, "logprobs": True}

    def tokens() -> list[str]:
        r = httpx.post(f"{moe.base_url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return [p["token"] for p in r.json()["choices"][0]["logprobs"]["content"]]

    alone = tokens()
    init = {**node(block_hash="MOE_BLOCK"), "batch_size": 8, "params": params(64), "url": receiver.url}
    try:
        r = httpx.post(f"{moe.pow}/init/generate", json=init, timeout=60)
        assert r.status_code == 200, r.text
        wait_until(lambda: status(moe.pow)["stats"]["total_processed"] > 0, what="mining progress")
        result: dict[str, list[str]] = {}
        chat = threading.Thread(target=lambda: result.setdefault("tokens", tokens()))
        before = status(moe.pow)["stats"]["total_processed"]
        chat.start()
        during = [before]
        while chat.is_alive():
            during.append(status(moe.pow)["stats"]["total_processed"])
            chat.join(0.2)
        assert max(during) > before, "no PoC batch ran while the chat decoded"
        assert status(moe.pow)["status"] == "GENERATING"
    finally:
        stop(moe.pow)
    assert result["tokens"] == alone
    assert tokens() == alone  # and after the round
