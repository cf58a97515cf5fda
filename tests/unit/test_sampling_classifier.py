"""Unit tests for sampling.classifier: the on-validation logprobs-mode rule as a decision table."""

from __future__ import annotations

import pytest

from sampling.classifier import (
    LOGPROBS_MODES,
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    classify_logprobs_mode,
)

TYPICAL_RAW = [[151643, 1234, 872, 2130, 99], [40, 358, 2130, 13, 11], [576, 1879, 315, 279, 14]]


def _ids(num_padding: int, num_other: int) -> list[list[int]]:
    # One position per id keeps the table readable; the rule only counts ids.
    return [[0]] * num_padding + [[1000]] * num_other


@pytest.mark.parametrize(
    "case, top_ids, expected",
    [
        ("no positions", [], None),
        ("positions without top ids", [[], [], []], None),
        ("9 ids, all padding", _ids(9, 0), None),
        ("9 ids, none padding", _ids(0, 9), None),
        ("10 ids, 1 padding: exactly 10%", _ids(1, 9), RAW_LOGPROBS),
        ("100 ids, 10 padding: exactly 10%", _ids(10, 90), RAW_LOGPROBS),
        ("100 ids, 11 padding: just above", _ids(11, 89), PROCESSED_LOGPROBS),
        ("10 ids, 2 padding", _ids(2, 8), PROCESSED_LOGPROBS),
        ("all zeros", [[0, 0, 0, 0, 0]] * 2, PROCESSED_LOGPROBS),
        ("typical processed (-inf padding 0..3)", [[872, 0, 1, 2, 3]] * 4, PROCESSED_LOGPROBS),
        ("typical raw", TYPICAL_RAW, RAW_LOGPROBS),
        ("id 3 is padding", [[3] * 10], PROCESSED_LOGPROBS),
        ("id 4 is not padding", [[4] * 10], RAW_LOGPROBS),
        ("ragged positions are pooled", [[0, 0], [500] * 8], PROCESSED_LOGPROBS),
    ],
)
def test_classify_logprobs_mode_decision_table(case, top_ids, expected):
    assert classify_logprobs_mode(top_ids) == expected, case


def test_classify_logprobs_mode_accepts_tuples():
    assert classify_logprobs_mode(tuple(tuple(ids) for ids in TYPICAL_RAW)) == RAW_LOGPROBS


def test_classify_logprobs_mode_modes_are_the_accepted_names():
    assert LOGPROBS_MODES == ("raw_logprobs", "processed_logprobs")
