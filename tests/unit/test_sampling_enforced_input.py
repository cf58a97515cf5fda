"""Unit tests for sampling.enforced_input: enforced_tokens/enforced_str decoding and the mode resolution."""

from __future__ import annotations

import dataclasses

import pytest

from sampling.enforced_input import (
    EnforcedSequence,
    EnforcedTokensError,
    SamplingFieldError,
    decode_enforced_str,
    decode_enforced_tokens,
    resolve_logprobs_mode,
)

EOS = 999
VOCAB = 1000


def encode(text: str) -> list[int]:
    """A fake byte-level tokenizer: one id per character, so the first id is ord(text[0])."""
    return [ord(ch) for ch in text]


def decode(tokens: list[dict]) -> EnforcedSequence:
    return decode_enforced_tokens(tokens, encode=encode, eos_id=EOS, vocab_size=VOCAB)


def test_decode_enforced_tokens_numeric_strings_are_ids():
    seq = decode([{"token": "5", "top_tokens": ["5", "7"]}, {"token": "9", "top_tokens": ["9", "0"]}])
    assert seq == EnforcedSequence(token_ids=(5, 9, EOS), top_token_ids=((5, 7), (9, 0), ()), from_str=False)


def test_decode_enforced_tokens_top_tokens_default_to_empty():
    assert decode([{"token": "5"}]).top_token_ids == ((), ())


def test_decode_enforced_tokens_text_position_is_tokenised():
    seq = decode([{"token": "ab", "top_tokens": ["b", "cd"]}])
    assert seq.token_ids == (ord("a"), EOS)
    assert seq.top_token_ids == ((ord("b"), ord("c")), ())


def test_decode_enforced_tokens_falls_back_per_position_only():
    seq = decode([{"token": "hi", "top_tokens": []}, {"token": "42", "top_tokens": ["43"]}])
    assert seq.token_ids == (ord("h"), 42, EOS)
    assert seq.top_token_ids == ((), (43,), ())


def test_decode_enforced_tokens_one_text_top_token_falls_back_whole_position():
    # "12" is numeric, but "x" is not, so "12" and "7" are tokenised as text too.
    seq = decode([{"token": "12", "top_tokens": ["7", "x"]}])
    assert seq.token_ids == (ord("1"), EOS)
    assert seq.top_token_ids == ((ord("7"), ord("x")), ())


def test_decode_enforced_tokens_empty_text_gives_id_0_and_empty_top_tokens_are_skipped():
    seq = decode([{"token": "", "top_tokens": ["", "z", ""]}])
    assert seq.token_ids == (0, EOS)
    assert seq.top_token_ids == ((ord("z"),), ())


def test_decode_enforced_tokens_uses_python_int_semantics():
    # The fork calls int(): surrounding spaces and a plus sign still parse as ids.
    assert decode([{"token": " 12 ", "top_tokens": ["+3"]}]).token_ids == (12, EOS)


def test_decode_enforced_tokens_appends_eos():
    assert decode([{"token": "5"}]).token_ids == (5, EOS)


def test_decode_enforced_tokens_does_not_duplicate_final_eos():
    seq = decode([{"token": "5"}, {"token": str(EOS), "top_tokens": [str(EOS), "4"]}])
    assert seq.token_ids == (5, EOS)
    assert seq.top_token_ids == ((), (EOS, 4))


def test_decode_enforced_tokens_eos_in_the_middle_still_appends_eos():
    assert decode([{"token": str(EOS)}, {"token": "5"}]).token_ids == (EOS, 5, EOS)


def test_decode_enforced_tokens_empty_list_is_error_with_param():
    with pytest.raises(EnforcedTokensError) as info:
        decode([])
    assert info.value.param == "enforced_tokens"
    assert "at least one" in info.value.message
    assert isinstance(info.value, ValueError)


def test_decode_enforced_tokens_missing_token_is_error():
    with pytest.raises(EnforcedTokensError, match=r"tokens\[1\]"):
        decode([{"token": "5"}, {"top_tokens": ["5"]}])


@pytest.mark.parametrize(
    "tokens, where",
    [
        ([{"token": "5"}, {"token": str(VOCAB)}], r"tokens\[1\]\.token: id 1000"),
        ([{"token": "-1"}], r"tokens\[0\]\.token: id -1"),
        (
            [{"token": "5"}, {"token": "6"}, {"token": "7", "top_tokens": ["8", "99999"]}],
            r"tokens\[2\]\.top_tokens\[1\]",
        ),
        ([{"token": "5", "top_tokens": ["-3"]}], r"tokens\[0\]\.top_tokens\[0\]"),
    ],
)
def test_decode_enforced_tokens_out_of_vocab_is_error_naming_position(tokens, where):
    with pytest.raises(EnforcedTokensError, match=where) as info:
        decode(tokens)
    assert info.value.param == "enforced_tokens"


def test_decode_enforced_tokens_last_vocab_id_is_accepted():
    assert decode([{"token": str(VOCAB - 1)}]).token_ids == (VOCAB - 1,)


def test_decode_enforced_str_tokenises_and_appends_eos():
    seq = decode_enforced_str("hi", encode, EOS)
    assert seq.token_ids == (ord("h"), ord("i"), EOS)
    assert seq.top_token_ids == ((), (), ())
    assert seq.from_str is True


def test_decode_enforced_str_does_not_duplicate_eos():
    assert decode_enforced_str("ab", lambda text: [1, EOS], EOS).token_ids == (1, EOS)


def test_decode_enforced_str_empty_text_pins_eos_only():
    assert decode_enforced_str("", encode, EOS).token_ids == (EOS,)


def test_enforced_sequence_is_frozen():
    seq = decode([{"token": "5"}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        seq.token_ids = ()  # type: ignore[misc]


RAW_LOOKING = decode([{"token": "5", "top_tokens": ["5", "500", "600", "700", "800"]}] * 2)
PROCESSED_LOOKING = decode([{"token": "5", "top_tokens": ["5", "0", "1", "2", "3"]}] * 2)
TOO_FEW_TOP_IDS = decode([{"token": "5", "top_tokens": ["0", "1", "2"]}] * 3)
FROM_STR = decode_enforced_str("\x00\x01\x02" * 5, encode, EOS)


@pytest.mark.parametrize(
    "requested, enforced, expected",
    [
        ("raw_logprobs", None, "raw_logprobs"),
        ("processed_logprobs", None, "processed_logprobs"),
        ("processed_logprobs", RAW_LOOKING, "processed_logprobs"),
        ("raw_logprobs", PROCESSED_LOOKING, "raw_logprobs"),
        (None, None, None),
        (None, RAW_LOOKING, "raw_logprobs"),
        (None, PROCESSED_LOOKING, "processed_logprobs"),
        (None, TOO_FEW_TOP_IDS, None),
        (None, FROM_STR, None),
    ],
)
def test_resolve_logprobs_mode_table(requested, enforced, expected):
    assert resolve_logprobs_mode(requested, enforced) == expected


@pytest.mark.parametrize("requested", ["", "processed", "RAW_LOGPROBS", "raw_logits"])
def test_resolve_logprobs_mode_unknown_mode_is_error_naming_field(requested):
    with pytest.raises(SamplingFieldError, match="logprobs_mode") as info:
        resolve_logprobs_mode(requested, RAW_LOOKING)
    assert info.value.param == "logprobs_mode"
    assert isinstance(info.value, ValueError)
