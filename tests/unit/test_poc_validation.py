"""Validation math of poc/validation.py: mismatch rules, the binomial fraud test, thresholds and StatTest's bounds
(the frontend parses the wire's stat_test: test_frontend_pow_models.py)."""

import numpy as np
import pytest
import torch

from poc.artifacts import decode_vector, encode_vectors
from poc.errors import PocInputError
from poc.validation import (
    StatTest,
    find_mismatches,
    fraud_test,
    is_mismatch,
    max_unscored,
    unscored_nonces,
    validate_artifacts,
    validation_result,
)

K = 4
BASE = np.array([0.5, -0.25, 0.125, 0.75], dtype=np.float32)


def _b64(values):
    return encode_vectors(torch.as_tensor(np.asarray(values, dtype=np.float32)).reshape(1, -1))[0]


def _shifted(distance):
    out = BASE.copy()
    out[0] += distance
    return out


def test_is_mismatch_identical_vectors():
    assert is_mismatch(BASE, _b64(BASE), K, 0.02) is False


def test_is_mismatch_distance_0_01_below_threshold_0_02():
    assert is_mismatch(BASE, _b64(_shifted(0.01)), K, 0.02) is False


def test_is_mismatch_distance_0_02_at_threshold_0_02():
    received = _b64(_shifted(0.02))
    # fp16 rounds 0.52 to 0.52001953, so the wire distance is just above 0.02: a mismatch under strict ">".
    assert float(np.linalg.norm(BASE - decode_vector(received))) == pytest.approx(0.0200195, abs=1e-7)
    assert is_mismatch(BASE, received, K, 0.02) is True
    assert is_mismatch(BASE, _b64(_shifted(0.03)), K, 0.02) is True


def test_is_mismatch_exact_threshold_is_not_mismatch():
    # 0.5 -> 0.515625 is exact in fp16, so L2 is exactly 2^-6.
    received = _b64(_shifted(2.0**-6))
    assert is_mismatch(BASE, received, K, 2.0**-6) is False
    assert is_mismatch(BASE, received, K, np.nextafter(2.0**-6, 0.0)) is True


@pytest.mark.parametrize(
    "received",
    [
        _b64([0.5, -0.25, 0.125]),
        _b64([0.5, -0.25, 0.125, 0.75, 0.0]),
        _b64([np.nan, -0.25, 0.125, 0.75]),
        _b64([np.inf, -0.25, 0.125, 0.75]),
        "%%%",
        "AA==",
    ],
)
def test_is_mismatch_bad_received_vectors(received):
    assert is_mismatch(BASE, received, K, 1e9) is True


def test_find_mismatches_skips_missing_and_empty_keeps_order():
    computed = [(5, _b64(BASE)), (3, _b64(BASE)), (9, _b64(BASE)), (1, _b64(BASE))]
    received = {5: _b64(_shifted(0.5)), 3: "", 1: _b64(_shifted(0.5))}
    assert find_mismatches(computed, received, K, 0.02) == [5, 1]


def test_find_mismatches_duplicates_count_each_time():
    computed = [(7, _b64(BASE)), (7, _b64(BASE))]
    assert find_mismatches(computed, {7: _b64(_shifted(1.0))}, K, 0.02) == [7, 7]


def test_fraud_test_empty_gives_p_one():
    assert fraud_test(0, 0, 0.001, 0.01) == (1.0, False)


def test_fraud_test_zero_mismatches_gives_p_one():
    p, fraud = fraud_test(0, 100, 0.1, 0.05)
    assert p == pytest.approx(1.0) and fraud is False


@pytest.mark.parametrize(
    ("n", "p", "alpha", "min_mismatches"),
    [(200, 0.1, 0.01, 31), (200, 0.1, 0.05, 28), (200, 0.001, 0.01, 3), (32, 0.001, 0.01, 2), (4, 0.001, 0.01, 1)],
)
def test_fraud_test_worked_thresholds(n, p, alpha, min_mismatches):
    assert fraud_test(min_mismatches, n, p, alpha)[1] is True
    assert fraud_test(min_mismatches - 1, n, p, alpha)[1] is False


def test_fraud_test_report_check_35_of_2000():
    p_value, fraud = fraud_test(35, 2000, 0.02, 0.01)
    assert round(p_value, 3) == 0.809 and fraud is False


def test_fraud_test_threshold_is_strict():
    p_value, _ = fraud_test(3, 200, 0.001, 0.01)
    assert fraud_test(3, 200, 0.001, p_value) == (p_value, False)


def test_fraud_test_rejects_more_mismatches_than_total():
    with pytest.raises(PocInputError):
        fraud_test(5, 4, 0.1, 0.05)


def test_validation_result_shape():
    result = validation_result(4, [9], StatTest())
    assert set(result) == {"n_total", "n_mismatch", "mismatch_nonces", "p_value", "fraud_detected"}
    assert result["n_total"] == 4 and result["n_mismatch"] == 1 and result["mismatch_nonces"] == [9]
    assert isinstance(result["p_value"], float) and result["fraud_detected"] is True


def test_validate_artifacts_n_total_counts_request_duplicates_and_leaves_out_the_unscored():
    # Nonce 2 was dropped by NaN filtering: it leaves the sample (the network's validator), reported as excluded.
    computed = [(1, _b64(BASE)), (1, _b64(BASE))]
    result = validate_artifacts(computed, {1: _b64(BASE), 2: _b64(BASE)}, [1, 1, 2], K, StatTest())
    assert result["n_total"] == 2 and result["n_mismatch"] == 0 and result["p_value"] == pytest.approx(1.0)
    assert (result["n_excluded"], result["excluded_nonces"]) == (1, [2])


def test_an_unscored_nonce_is_no_evidence_either_way():
    # 10 requested, nonce 9 unscored: 3 mismatches are judged out of 9, not 10, and none is invented for nonce 9.
    computed = [(n, _b64(_shifted(0.5 if n < 3 else 0.0))) for n in range(9)]
    received = {n: _b64(BASE) for n in range(10)}
    result = validate_artifacts(computed, received, list(range(10)), K, StatTest(0.02, 0.1, 0.05))
    assert (result["n_total"], result["n_mismatch"], result["excluded_nonces"]) == (9, 3, [9])
    assert result["p_value"] == pytest.approx(fraud_test(3, 9, 0.1, 0.05)[0])


def test_unscored_nonces_each_occurrence_in_request_order():
    assert unscored_nonces([5, 3, 5, 1], [1]) == [5, 3, 5]
    assert unscored_nonces([1, 2], [2, 1, 7]) == []


@pytest.mark.parametrize(("requested", "allowed"), [(1, 1), (8, 1), (19, 1), (20, 2), (64, 6), (200, 20)])
def test_at_most_a_tenth_may_go_unscored_and_never_fewer_than_one(requested, allowed):
    assert max_unscored(requested) == allowed


def test_validate_artifacts_empty_request():
    assert validate_artifacts([], {}, [], K, StatTest())["p_value"] == 1.0


def test_stat_test_defaults():
    assert StatTest() == StatTest(dist_threshold=0.02, p_mismatch=0.001, fraud_threshold=0.01)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("dist_threshold", {"dist_threshold": -1.0}),
        ("p_mismatch", {"p_mismatch": 1.5}),
        ("fraud_threshold", {"fraud_threshold": float("nan")}),
        ("p_mismatch", {"p_mismatch": True}),
    ],
)
def test_stat_test_rejects_out_of_range(field, kwargs):
    with pytest.raises(PocInputError) as info:
        StatTest(**kwargs)
    assert info.value.field == field
