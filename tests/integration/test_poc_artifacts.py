"""PoC v2 artifacts through the served model inside vLLM's workers, between engine steps."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pytest

from poc.artifacts import decode_vector
from tests.backend_client import RawBackend
from tests.reference_poc import HFReference


@pytest.fixture(scope="module")
def raw(stack):
    client = RawBackend(stack.address)
    yield client
    client.close()


def _l2(a: str, b: str) -> float:
    return float(np.linalg.norm(decode_vector(a) - decode_vector(b)))


def _as_dict(reply) -> dict[int, str]:
    assert reply.error is None, reply.error
    return {a.nonce: a.vector_b64 for a in reply.artifacts}


@pytest.mark.parametrize("stronger_rng", [False, True])
def test_poc_artifacts_match_hf_reference(raw, model_dir, stronger_rng, record_property):
    nonces = list(range(8))
    served = _as_dict(raw.artifacts(nonces, seq_len=64, stronger_rng=stronger_rng))
    reference = HFReference(model_dir).artifacts("TEST_BLOCK", "test_pub_keys", nonces, 64,
                                                 stronger_rng=stronger_rng)
    assert sorted(served) == nonces
    distances = [_l2(served[n], reference[n]) for n in nonces]
    record_property("l2_per_nonce", distances)
    print(f"L2 vLLM vs HF (stronger_rng={stronger_rng}):", [round(d, 5) for d in distances])
    assert max(distances) < 0.02, distances


def test_poc_artifacts_are_reproducible_and_batch_invariant(raw):
    whole = _as_dict(raw.artifacts(list(range(6)), seq_len=48))
    again = _as_dict(raw.artifacts(list(range(6)), seq_len=48))
    split = {**_as_dict(raw.artifacts([0, 1, 2], seq_len=48)), **_as_dict(raw.artifacts([3, 4, 5], seq_len=48))}
    assert whole == again
    assert max(_l2(whole[n], split[n]) for n in whole) < 0.02


def test_poc_artifacts_depend_on_block_hash_and_public_key(raw):
    base = _as_dict(raw.artifacts([0], seq_len=32))[0]
    assert _l2(base, _as_dict(raw.artifacts([0], seq_len=32, block_hash="OTHER"))[0]) > 0.01
    assert _l2(base, _as_dict(raw.artifacts([0], seq_len=32, public_key="other"))[0]) > 0.01


def test_poc_large_job_is_split_into_engine_sized_batches(raw):
    # 100 nonces > max_num_seqs (64): several forwards, whatever the policy's sizes.
    arts = _as_dict(raw.artifacts(list(range(100, 200)), seq_len=200))
    assert sorted(arts) == list(range(100, 200))


@pytest.mark.parametrize(("kw", "field"), [
    ({"k_dim": 0}, "k_dim"), ({"k_dim": 100000}, "k_dim"), ({"seq_len": 0}, "seq_len"),
    ({"seq_len": 10**6}, "seq_len"), ({"nonces": []}, "nonces"),
])
def test_poc_bad_input_is_a_typed_error_naming_the_field(raw, kw, field):
    nonces = kw.pop("nonces", [1, 2])
    reply = raw.artifacts(nonces, **kw)
    assert reply.error is not None and reply.error.status == 400
    assert reply.error.param == field
    assert _as_dict(raw.artifacts([1], seq_len=16))  # the engine keeps serving


def test_greedy_chat_unchanged_by_poc_batches_between_its_steps(stack, raw):
    """PoC batches go in one after another for as long as the chat streams, so some of them land between its
    steps however fast or slow the machine is (which ones is observed, not assumed)."""
    body = {"model": stack.model, "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": 300, "temperature": 0.0, "ignore_eos": True, "logprobs": True, "stream": True}

    def tokens(progress: list[int]) -> list[str]:
        out: list[str] = []
        with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        out += [p["token"] for p in (choice.get("logprobs") or {}).get("content") or ()]
                        progress[0] = len(out)
        return out

    alone = tokens([0])
    progress = [0]
    result: dict[str, list[str]] = {}
    chat = threading.Thread(target=lambda: result.setdefault("tokens", tokens(progress)))
    chat.start()
    seen_at = []  # the chat's tokens so far when each PoC batch answered
    while chat.is_alive():
        first = len(seen_at) * 16
        reply = raw.artifacts(range(first, first + 16), seq_len=128)
        assert reply.error is None and len(reply.artifacts) == 16
        seen_at.append(progress[0])
    chat.join(120)
    assert any(0 < n < len(alone) for n in seen_at), f"no PoC batch answered mid-chat: {seen_at}"
    assert result["tokens"] == alone
