"""Golden seeds and the exact seed-string formats of poc/seeds.py, the fork's (docs/architecture.md, "The network's
contract")."""

import numpy as np
import pytest

from poc.seeds import (
    haar_seed_string,
    haar_seeds,
    householder_seed_string,
    input_seed_string,
    input_seeds,
    input_sub_seeds,
    pick_seed_string,
    pick_seeds,
    string_seed,
    sub_seeds,
)

BH, PK = "TEST_BLOCK", "test_pub_keys"


def test_seed_strings_exact_formats():
    assert input_seed_string(BH, PK, 0) == "TEST_BLOCK_test_pub_keys_nonce0"
    assert householder_seed_string(BH, 0) == "TEST_BLOCK_layer_0_householder"
    assert pick_seed_string(BH, PK, 0, 12) == "TEST_BLOCK_test_pub_keys_nonce_0_pick_12"
    assert haar_seed_string(BH, PK, 0, 12, 0) == "TEST_BLOCK_test_pub_keys_nonce_0_haar_hh_12_0"


def test_seed_strings_negative_and_numpy_nonces():
    assert input_seed_string("b", "k", -7) == "b_k_nonce-7"
    assert pick_seed_string("b", "k", np.int64(5), 3) == "b_k_nonce_5_pick_3"


def test_seed_strings_reject_float_nonce():
    with pytest.raises(ValueError):
        input_seed_string("b", "k", 5.0)


@pytest.mark.parametrize(
    ("seed_string", "expected"),
    [
        ("TEST_BLOCK_test_pub_keys_nonce0", 1589641989),
        ("TEST_BLOCK_layer_0_householder", 2284659359),
        ("TEST_BLOCK_test_pub_keys_nonce_0_pick_12", 2826662626),
        ("TEST_BLOCK_test_pub_keys_nonce_0_haar_hh_12_0", 1775486364),
        ("TEST_BLOCK_test_pub_keys_target", 3424823091),
    ],
)
def test_string_seed_golden(seed_string, expected):
    assert string_seed(seed_string) == expected


def test_sub_seeds_golden():
    assert sub_seeds("TEST_BLOCK_test_pub_keys_nonce0") == (
        1589641989, 1811054632, 2092028337, 1372497962, 2845890790, 282738888, 1675009164, 1960591446,
    )


def test_sub_seeds_first_equals_string_seed():
    for s in ("", "x", "TEST_BLOCK_test_pub_keys_nonce17", "ünïcode"):
        assert sub_seeds(s)[0] == string_seed(s)


def test_batch_seed_helpers_follow_nonce_order():
    assert input_seeds(BH, PK, [0, 0]) == [1589641989, 1589641989]
    assert input_sub_seeds(BH, PK, [0])[0][1] == 1811054632
    assert pick_seeds(BH, PK, [0], 12) == [2826662626]
    by_step = haar_seeds(BH, PK, [0, 1], 12)
    assert len(by_step) == 11 and all(len(row) == 2 for row in by_step)
    assert by_step[0][0] == 1775486364
