"""backend/pow/results.py: a validation's verdict over the nonces it could score, the nonces it could not left out
up to the network's cap, and the validated callback's body (the gonka_poc plugin's fields, in its order)."""

from __future__ import annotations

import msgspec
import numpy as np
import torch

from backend.pow.results import ValidatedBody, callback_body, job_result
from poc.artifacts import encode_vectors
from protocol.poc import Artifact
from protocol.pow import NodeIdentity, PowGenerateRequest, PowParams, StatTestSpec, ValidationOutcome

NODE = NodeIdentity(block_hash="h", block_height=100, public_key="pk", node_id=1, node_count=2)
VECTOR = encode_vectors(torch.as_tensor(np.linspace(-1, 1, 12, dtype=np.float32)).reshape(1, -1))[0]


def _validation(n: int) -> PowGenerateRequest:
    """A validation of nonces 0..n-1 whose received artifacts are all VECTOR, at the chain's thresholds."""
    return PowGenerateRequest(rid="r", node=NODE, params=PowParams(model="m", seq_len=8, k_dim=12),
                              nonces=list(range(n)), validation=[Artifact(nonce=i, vector_b64=VECTOR)
                                                                 for i in range(n)],
                              stat_test=StatTestSpec(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.05))


def _computed(*nonces: int) -> list[Artifact]:
    return [Artifact(nonce=n, vector_b64=VECTOR) for n in nonces]


def test_a_validation_scoring_every_nonce_excludes_none():
    result, error = job_result(_validation(20), _computed(*range(20)), None)
    assert error is None and isinstance(result, ValidationOutcome)
    assert (result.n_total, result.n_mismatch, result.n_excluded, result.excluded_nonces) == (20, 0, 0, [])
    assert not result.fraud_detected


def test_unscored_nonces_up_to_a_tenth_leave_the_sample():
    # 2 of 20 nonces came back without an artifact (non-finite hidden states): the verdict is over the other 18.
    result, error = job_result(_validation(20), _computed(*range(2, 20)), None)
    assert error is None and isinstance(result, ValidationOutcome)
    assert (result.n_total, result.n_excluded, result.excluded_nonces) == (18, 2, [0, 1])
    # One may always go unscored, however small the request.
    result, error = job_result(_validation(4), _computed(0, 1, 3), None)
    assert error is None and (result.n_total, result.excluded_nonces) == (3, [2])


def test_past_the_cap_or_with_none_scored_there_is_no_verdict():
    result, error = job_result(_validation(20), _computed(*range(3, 20)), None)
    assert result is None and error is not None and error.status == 503
    assert "could not compute 3 of 20 nonces" in error.message and "at most 2" in error.message
    # A lone nonce unscored would leave an empty sample, which dapi would count as a failed vote.
    result, error = job_result(_validation(1), [], None)
    assert result is None and error is not None and error.status == 503


def test_the_validated_callback_carries_the_exclusions_after_the_verdict():
    msg = _validation(20)
    result, _ = job_result(msg, _computed(*range(1, 20)), None)
    path, body = callback_body("job-1", msg, result)
    assert path == "validated" and isinstance(body, ValidatedBody)
    fields = msgspec.json.decode(msgspec.json.encode(body))
    assert list(fields) == ["request_id", "block_hash", "block_height", "public_key", "node_id", "n_total",
                            "n_mismatch", "mismatch_nonces", "p_value", "fraud_detected", "n_excluded",
                            "excluded_nonces"]
    assert (fields["n_total"], fields["n_excluded"], fields["excluded_nonces"]) == (19, 1, [0])


def test_a_result_stored_before_the_exclusions_reads_back_with_none():
    stored = b'{"n_total":4,"n_mismatch":0,"mismatch_nonces":[],"p_value":1.0,"fraud_detected":false}'
    outcome = msgspec.json.decode(stored, type=ValidationOutcome)
    assert (outcome.n_total, outcome.n_excluded, outcome.excluded_nonces) == (4, 0, [])
