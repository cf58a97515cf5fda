"""Unit tests for the PoC request models: what each body accepts and rejects, and its wire conversion."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from frontend.pow_models import GenerateRequest, InitGenerateRequest, StatTestModel
from protocol.pow import StatTestSpec

NODE = {"block_hash": "0xabc", "block_height": 1234, "public_key": "02deadbeef", "node_id": 1, "node_count": 3}
PARAMS = {"model": "tiny", "seq_len": 256}


def _loc_of_rejection(model, body: dict) -> tuple:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return info.value.errors()[0]["loc"]


@pytest.mark.parametrize("change,loc", [
    ({"node_id": -1}, ("node_id",)),
    ({"node_count": 0}, ("node_count",)),
    ({"group_id": -1}, ("group_id",)),
    ({"n_groups": 0}, ("n_groups",)),
    ({"batch_size": 0}, ("batch_size",)),
    ({"params": {"model": "tiny", "seq_len": 0}}, ("params", "seq_len")),
    ({"params": {"model": "tiny", "seq_len": 8, "k_dim": 0}}, ("params", "k_dim")),
    ({"params": {"seq_len": 8}}, ("params", "model")),
    ({"params": {**PARAMS, "batch_size": 4}}, ("params", "batch_size")),
    ({"url": "ftp://dapi/x"}, ("url",)),
    ({"url": "dapi:9100"}, ("url",)),
    ({"url": "http://"}, ("url",)),
    ({"url": "http://dapi:99999/x"}, ("url",)),  # a port that cannot be (it was accepted, the callback then failed)
    ({"url": "http://dapi:port/x"}, ("url",)),
    ({"url": "http://:9100/x"}, ("url",)),
    ({"block_height": 2**64}, ("block_height",)),
    ({"block_hash": None}, ("block_hash",)),
    # A lone UTF-16 surrogate ("\ud800" in JSON) cannot be encoded as UTF-8 for the backend (was a 500).
    ({"block_hash": "\ud800"}, ("block_hash",)),
    ({"public_key": "02\udfff"}, ("public_key",)),
    ({"params": {"model": "\ud800", "seq_len": 8}}, ("params", "model")),
    ({"url": "http://dapi/\ud800"}, ("url",)),
], ids=lambda v: str(v))
def test_pow_models_init_rejects(change, loc):
    assert _loc_of_rejection(InitGenerateRequest, {**NODE, "params": PARAMS, **change}) == loc


@pytest.mark.parametrize("change,loc", [
    ({"nonces": []}, ("nonces",)),
    ({"nonces": [2**63]}, ("nonces", 0)),
    ({"nonces": None}, ("nonces",)),
    ({"batch_size": 0}, ("batch_size",)),
    ({"stat_test": {"p_mismatch": 1.5}}, ("stat_test", "p_mismatch")),
    ({"stat_test": {"fraud_threshold": -0.1}}, ("stat_test", "fraud_threshold")),
    ({"stat_test": {"p_value_threshold": 2}}, ("stat_test", "p_value_threshold")),
    ({"stat_test": {"dist_threshold": -0.1}}, ("stat_test", "dist_threshold")),
    ({"stat_test": {"dist_threshold": float("nan")}}, ("stat_test", "dist_threshold")),
    ({"stat_test": {"fraud_threshold": 0.01, "p_value_threshold": 0.05}}, ("stat_test",)),
    # One setting under two names: one of them per body, even if equal (what the schema states).
    ({"stat_test": {"fraud_threshold": 0.05, "p_value_threshold": 0.05}}, ("stat_test",)),
    ({"validation": {"artifacts": [{"nonce": 5}]}}, ("validation", "artifacts", 0, "vector_b64")),
    ({"validation": {}}, ("validation", "artifacts")),
    ({"url": "file:///etc/passwd"}, ("url",)),
    ({"validation": {"artifacts": [{"nonce": 5, "vector_b64": "\ud800"}]}},
     ("validation", "artifacts", 0, "vector_b64")),
], ids=lambda v: str(v))
def test_pow_models_generate_rejects(change, loc):
    assert _loc_of_rejection(GenerateRequest, {**NODE, "params": PARAMS, "nonces": [5], **change}) == loc


def test_pow_models_init_defaults_leave_batch_size_to_the_backend():
    body = InitGenerateRequest.model_validate({**NODE, "params": PARAMS, "unknown": 1})
    msg = body.to_wire("r1")
    assert (msg.group_id, msg.n_groups, msg.batch_size, msg.url, msg.stronger_rng) == (0, 1, None, None, False)
    assert msg.params.k_dim == 12
    assert body.model_copy(update={"batch_size": 3}).to_wire("r2").batch_size == 3


def test_pow_models_init_accepts_the_last_node_and_group():
    msg = InitGenerateRequest.model_validate({**NODE, "node_id": 2, "group_id": 3, "n_groups": 4, "params": PARAMS,
                                              "url": "HTTPS://dapi:9100/v2/poc-batches/m"}).to_wire("r")
    assert (msg.node.node_id, msg.node.node_count, msg.group_id, msg.n_groups) == (2, 3, 3, 4)
    assert msg.url == "HTTPS://dapi:9100/v2/poc-batches/m"


def test_pow_models_init_accepts_node_ids_past_node_count():
    # dapi sends node_id = NodeNum (1-based) and node_count = its node count: one node is (1, 1).
    msg = InitGenerateRequest.model_validate({**NODE, "node_id": 1, "node_count": 1, "params": PARAMS}).to_wire("r")
    assert (msg.node.node_id, msg.node.node_count) == (1, 1)
    msg = InitGenerateRequest.model_validate({**NODE, "group_id": 2, "n_groups": 2, "params": PARAMS}).to_wire("r")
    assert (msg.group_id, msg.n_groups) == (2, 2)


def test_pow_models_generate_node_id_need_not_be_below_node_count():
    # Only echoed for /generate: the validator's node number is independent of the serving node count.
    body = GenerateRequest.model_validate({**NODE, "node_id": 7, "node_count": 2, "params": PARAMS, "nonces": [5]})
    msg = body.to_wire("r")
    assert (msg.node.node_id, msg.node.node_count, msg.wait, msg.batch_size) == (7, 2, False, None)


@pytest.mark.parametrize("stat_test,expected", [
    ({}, StatTestSpec()),
    ({"dist_threshold": 0.4}, StatTestSpec(dist_threshold=0.4)),
    # What the network client sends: p_value_threshold means fraud_threshold.
    ({"dist_threshold": 0.4, "p_mismatch": 0.1, "p_value_threshold": 0.05},
     StatTestSpec(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.05)),
    ({"fraud_threshold": 0.05, "p_value_threshold": None}, StatTestSpec(fraud_threshold=0.05)),
    ({"fraud_threshold": 0.2}, StatTestSpec(fraud_threshold=0.2)),
    ({"p_mismatch": 0, "fraud_threshold": 1}, StatTestSpec(p_mismatch=0.0, fraud_threshold=1.0)),
    ({"dist_threshold": None, "p_value_threshold": None}, StatTestSpec()),
], ids=["empty", "dist-only", "p_value_threshold-alias", "other-null", "fraud_threshold", "bounds", "nulls"])
def test_pow_models_stat_test_to_wire(stat_test, expected):
    assert StatTestModel.model_validate(stat_test).to_wire() == expected


def test_pow_models_stat_test_null_means_all_defaults_in_the_backend():
    body = GenerateRequest.model_validate({**NODE, "params": PARAMS, "nonces": [5], "stat_test": None})
    assert body.to_wire("r").stat_test is None
