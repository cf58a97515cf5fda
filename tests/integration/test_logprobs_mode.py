"""Logprobs modes on the embedded engine: our versions of the fork's live tests
(tests/gonka/test_live_logprobs_mode.py), plus the on-validation classifier (sampling/classifier.py) as a decision
table driven through the API.

How a mode is observed: with top_k=2 and top_logprobs=5, processed logprobs (after top-k masking) have 3 of
the 5 entries at the −9999 clamp on a position (fewer when bf16 logits tie at the k-th value: top-k keeps
ties), raw logprobs (before any processing) have none.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.replay_util import (
    HONEST,
    MASKED,
    body,
    chat,
    dist,
    positions,
    replay_body,
    tokens,
    top_values,
)

SCHEMA_X_INT = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
RAW, PROCESSED = "raw_logprobs", "processed_logprobs"


def _mode_seen(resp: dict) -> str:
    """Which mode produced a top_k=2, top_logprobs=5 response (see the module docstring)."""
    masked = [sum(e["logprob"] <= MASKED for e in p["top_logprobs"]) for p in positions(resp)]
    if all(m >= 1 for m in masked):
        return PROCESSED
    assert not any(masked), f"neither mode: masked entries per position {masked}"
    return RAW


@pytest.fixture(scope="module")
def processed_inference(stack):
    """The fork's tests 06/07: an inference in processed mode (explicit, same as the deployment default)."""
    b = body(stack.model, "Explain gravity in two sentences.", max_tokens=20, ignore_eos=True,
             logprobs_mode=PROCESSED)
    return b, chat(stack.base_url, b)


def test_01_default_token_format_is_digit_strings(stack):
    resp = chat(stack.base_url, body(stack.model, "Hello there", max_tokens=5, ignore_eos=True))
    for pos in positions(resp)[:3]:
        assert pos["token"].isdigit() and int(pos["token"]) < 512
        for entry in pos["top_logprobs"]:
            assert entry["token"].isdigit() and int(entry["token"]) < 512
            assert bytes(entry["bytes"]) == entry["token"].encode()  # as the fork: UTF-8 of the numeric string


def test_02_raw_and_processed_relate_by_temperature(stack):
    """processed = log_softmax(logits / T), raw = log_softmax(logits). Same seed → same tokens (the mode
    changes what is reported, never what is sampled); same top-5 ranking; and for any two tokens the
    processed logprob gap is the raw gap divided by T."""
    t = 0.5
    raw, proc = (chat(stack.base_url, body(stack.model, "Describe a forest.", max_tokens=6, ignore_eos=True,
                                            temperature=t, logprobs_mode=mode)) for mode in (RAW, PROCESSED))
    assert tokens(raw) == tokens(proc)
    for rp, pp in zip(positions(raw), positions(proc), strict=False):
        r = {e["token"]: e["logprob"] for e in rp["top_logprobs"]}
        p = {e["token"]: e["logprob"] for e in pp["top_logprobs"]}
        # The same tokens rank top in both (bf16 ties at the 5th place could swap one, hence ≥ 4).
        common = sorted(set(r) & set(p))
        assert len(common) >= 4, (r, p)
        first, *others = common
        for other in others:
            assert p[first] - p[other] == pytest.approx((r[first] - r[other]) / t, abs=2e-3)
        assert rp["logprob"] != pytest.approx(pp["logprob"], abs=1e-3)


def test_03_processed_with_json_schema_has_masked_top_logprobs(stack):
    resp = chat(stack.base_url, body(stack.model, "Give me x as JSON.", max_tokens=30,
                                     response_format=SCHEMA_X_INT, logprobs_mode=PROCESSED))
    assert min(top_values(resp)) <= MASKED


def test_04_raw_without_grammar_has_almost_no_masked_top_logprobs(stack):
    resp = chat(stack.base_url, body(stack.model, "Say something.", max_tokens=10, ignore_eos=True,
                                     logprobs_mode=RAW))
    values = top_values(resp)
    assert sum(v <= MASKED for v in values) / len(values) < 0.5
    # The principled version: raw logprobs come before every mask, so with no grammar none is masked.
    assert min(values) > MASKED


@pytest.mark.parametrize(("mode", "seen"), [(RAW, RAW), (PROCESSED, PROCESSED), (None, PROCESSED)])
def test_05_per_request_override_and_deployment_default(stack, mode, seen):
    resp = chat(stack.base_url, body(stack.model, "Name a river.", max_tokens=4, ignore_eos=True, top_k=2,
                                     logprobs_mode=mode))
    assert _mode_seen(resp) == seen


def test_06_processed_inference_processed_replay_is_honest(stack, processed_inference):
    b, inf = processed_inference
    d = dist(inf, chat(stack.base_url, replay_body(b, inf)))
    print(f"\n[distance] processed inference, processed replay: {d:.3g}")
    assert d < HONEST


def test_07_processed_inference_raw_replay_is_not_closer(stack, processed_inference):
    b, inf = processed_inference
    d_proc = dist(inf, chat(stack.base_url, replay_body(b, inf)))
    d_raw = dist(inf, chat(stack.base_url, replay_body(b, inf, logprobs_mode=RAW)))
    print(f"\n[distance] processed inference: processed replay {d_proc:.3g}, raw replay {d_raw:.3g}")
    assert d_raw >= d_proc
    # At temperature 0.99 the two differ by the 1/T scaling, so raw is strictly farther.
    assert d_raw > d_proc


def _table_tokens(n_positions: int, n_low: int, per_position: int = 5) -> dict:
    """enforced_tokens with n_positions × per_position top ids, n_low of them < 4, the rest ≥ 300."""
    tops = [str(i % 4) if i < n_low else str(300 + i % 200) for i in range(n_positions * per_position)]
    return {"tokens": [{"token": str(100 + p), "top_tokens": tops[p * per_position:(p + 1) * per_position]}
                       for p in range(n_positions)]}


# (enforced_tokens, explicit logprobs_mode, enforced_str, mode the replay must run in)
CLASSIFIER_TABLE = {
    "mostly_padding_ids_is_processed": (_table_tokens(4, 15), None, None, PROCESSED),
    "mostly_high_ids_is_raw": (_table_tokens(4, 0), None, None, RAW),
    "ratio_exactly_0.10_is_raw": (_table_tokens(20, 10), None, None, RAW),
    "ratio_0.11_is_processed": (_table_tokens(20, 11), None, None, PROCESSED),
    "fewer_than_10_ids_keeps_default": (_table_tokens(3, 0, per_position=3), None, None, PROCESSED),
    "explicit_raw_wins": (_table_tokens(4, 15), RAW, None, RAW),
    "explicit_processed_wins": (_table_tokens(4, 0), PROCESSED, None, PROCESSED),
    "enforced_str_skips_classifier": (_table_tokens(4, 0), None, "hello world", PROCESSED),
}


@pytest.mark.parametrize("case", CLASSIFIER_TABLE)
def test_classifier_decision_table(stack, case):
    enforced_tokens, mode, text, seen = CLASSIFIER_TABLE[case]
    resp = chat(stack.base_url, body(stack.model, "Hi", max_tokens=3, top_k=2, enforced_tokens=enforced_tokens,
                                     logprobs_mode=mode, enforced_str=text))
    want = (["104", "101", "108"] if text else [t["token"] for t in enforced_tokens["tokens"][:3]])
    assert tokens(resp) == want  # "hello world" starts with the byte tokens h, e, l
    assert _mode_seen(resp) == seen


@pytest.mark.parametrize(("extra", "param"), [
    ({"logprobs_mode": "bogus_logprobs"}, "logprobs_mode"),
    ({"enforced_tokens": {"tokens": []}}, "enforced_tokens"),
    ({"enforced_tokens": {"tokens": [{"top_tokens": ["1"]}]}}, "enforced_tokens"),
])
def test_invalid_fields_are_400_naming_the_param(stack, extra, param):
    err = chat(stack.base_url, body(stack.model, "Hi", max_tokens=3, **extra), status=400)["error"]
    assert err["param"] is not None and err["param"].startswith(param), err


def test_completions_accept_logprobs_mode_but_not_enforced_tokens(stack):
    """As the fork: logprobs_mode is accepted on /v1/completions; enforced tokens are chat-only."""
    url = f"{stack.base_url}/v1/completions"
    base = {"model": stack.model, "prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True, "top_k": 2,
            "logprobs": 5, "seed": 1}
    raw = httpx.post(url, json={**base, "logprobs_mode": RAW}, timeout=60)
    assert raw.status_code == 200, raw.text
    tops = raw.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert all(v > MASKED for top in tops for v in top.values())
    r = httpx.post(url, json={**base, "enforced_tokens": {"tokens": [{"token": "1"}]}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "enforced_tokens", r.text
