"""The other decoders vLLM serves, on the CPU engine: each generated tiny model (backend/tools/model_archs.py) serves
chat and PoC with pocserve's generic hooks, no code per model.

One backend per architecture for the module (pytest runs each architecture's tests together): first in shared
scheduling with forwards launched beside chat (`--poc-overlap on`: LayerwiseForward, layer by layer where the stack is
one of forward.LAYERWISE_MODELS), then restarted in exclusive mode (the model's own forward, whole). The artifacts of
the two starts must be the same bytes, and within L2 0.02 of an independent HF-transformers forward
(tests/reference_poc.py). MiniMax-M2 is not here: vLLM 0.29's CPU build cannot route its experts (sigmoid scores
without grouped top-k fail an assertion in its CPU MoE), chat as well as PoC; README, "Models and topologies".
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from backend.tools.modelgen import ensure_model
from tests.integration.pow_util import (
    MODEL,
    Server,
    artifacts_of,
    generate,
    l2,
    negated,
    validation,
    wait_healthy,
    wait_until,
)
from tests.reference_poc import HFReference

ARCHITECTURES = {"tiny-llama": "LlamaForCausalLM", "tiny-deepseek-v3": "DeepseekV3ForCausalLM",
                 "tiny-glm4-moe": "Glm4MoeForCausalLM", "tiny-gpt-oss": "GptOssForCausalLM"}
# An explicit KV size and context: a memory share would follow this machine's reported memory, which changes.
ENGINE = ("--kv-cache-memory-bytes", "256M", "--max-model-len", "1024")
NONCES = list(range(16))
SEQ_LEN = 64  # past gpt-oss's 32-token sliding window
BOUND = 0.02


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request, tmp_path_factory):
    shape = request.param
    model_dir = ensure_model(tmp_path_factory.mktemp("model") / shape, shape)
    server = Server.start(model_dir, tmp_path_factory.mktemp(shape), *ENGINE, "--scheduling-mode", "shared",
                          "--poc-overlap", "on")
    yield shape, server
    server.stop()


@pytest.fixture(scope="module")
def served(arch) -> dict[int, str]:
    """The first start's artifacts of NONCES."""
    return artifacts_of(arch[1].pow, NONCES, seq_len=SEQ_LEN, batch_size=8)


def test_the_model_is_the_architecture(arch):
    shape, server = arch
    config = json.loads((server.model_dir / "config.json").read_text())
    tokenizer = json.loads((server.model_dir / "tokenizer.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[shape]]
    assert config["vocab_size"] == len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])


def test_chat_through_the_openai_client(arch):
    client = openai.OpenAI(base_url=f"{arch[1].base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=24, temperature=0.0,
              extra_body={"ignore_eos": True})
    first = client.chat.completions.create(**kw)
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 24
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == first.choices[0].message.content and streamed


def test_artifacts_match_the_hf_reference(arch, served, record_property):
    shape, server = arch
    reference = HFReference(server.model_dir).artifacts("TEST_BLOCK", "test_pub_keys", NONCES, SEQ_LEN)
    assert sorted(served) == NONCES
    distances = [l2(served[n], reference[n]) for n in NONCES]
    record_property("l2_per_nonce", distances)
    print(f"L2 {shape} vLLM vs HF:", [round(d, 5) for d in distances])
    assert max(distances) < BOUND, distances


def test_a_validation_job_passes_its_artifacts_and_catches_forged_ones(arch, served):
    pow_url = arch[1].pow
    forged = {n: negated(v) if n % 2 else v for n, v in served.items()}
    for arts, mismatched in ((served, []), (forged, NONCES[1::2])):
        r = generate(pow_url, NONCES, seq_len=SEQ_LEN, batch_size=8, validation=validation(arts))
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["status"], body["n_total"], body["mismatch_nonces"]) == ("completed", 16, mismatched), body
        assert body["fraud_detected"] is bool(mismatched)


def test_artifacts_are_the_same_bytes_after_a_restart_running_the_model_whole(arch, served):
    server = arch[1]
    server.restart_backend(*ENGINE, "--scheduling-mode", "exclusive")
    wait_until(lambda: httpx.get(f"{server.base_url}/health", timeout=2).status_code != 200, timeout_s=10,
               what="backend seen down")
    wait_healthy(server.base_url, server.frontend, server.backend)
    assert artifacts_of(server.pow, NONCES, seq_len=SEQ_LEN, batch_size=8) == served
