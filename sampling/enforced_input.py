"""Decoding of the `enforced_tokens` / `enforced_str` request fields into token ids
(docs/architecture.md, "The network's contract").

Pure: the tokenizer comes in as an `encode(text) -> list[int]` callable (the caller binds
add_special_tokens=False), so the frontend can validate requests without torch or vLLM. Also resolves
the effective per-request `logprobs_mode`, which depends on how the enforced sequence was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sampling.classifier import LOGPROBS_MODES, classify_logprobs_mode

Encode = Callable[[str], list[int]]

# Token id used for a position whose text encodes to nothing (the fork's choice).
EMPTY_TEXT_TOKEN_ID = 0


class SamplingFieldError(ValueError):
    """A sampling-related request field is invalid; maps to HTTP 400 with OpenAI `error.param`."""

    def __init__(self, *, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class EnforcedTokensError(SamplingFieldError):
    """`enforced_tokens` is unusable; the Go validator reads a 400 naming it as invalid, not autopass."""

    def __init__(self, *, message: str, param: str = "enforced_tokens") -> None:
        super().__init__(param=param, message=message)


@dataclass(frozen=True)
class EnforcedSequence:
    """The ids the sampler pins, ending in EOS.

    Invariant: len(top_token_ids) == len(token_ids); positions without top tokens (the appended EOS,
    every position of an enforced_str) hold (). top_token_ids only feed the mode classifier.
    """

    token_ids: tuple[int, ...]
    top_token_ids: tuple[tuple[int, ...], ...]
    from_str: bool


def decode_enforced_tokens(
    tokens: Sequence[Mapping[str, Any]], *, encode: Encode, eos_id: int, vocab_size: int
) -> EnforcedSequence:
    """Decode `enforced_tokens.tokens` ([{"token": str, "top_tokens": [str, ...]}, ...]).

    Raises EnforcedTokensError for an empty list, a missing token, or an id outside [0, vocab_size).
    The fork skips the vocabulary check; we reject like the later gonka-poc plugin, since an
    out-of-range id would otherwise fail inside the engine.
    """
    if not tokens:
        raise EnforcedTokensError(message="enforced_tokens.tokens must contain at least one token")
    token_ids: list[int] = []
    top_token_ids: list[tuple[int, ...]] = []
    for index, position in enumerate(tokens):
        if "token" not in position:
            raise EnforcedTokensError(message=f"enforced_tokens.tokens[{index}] has no 'token'")
        token_id, top_ids = _decode_position(position["token"], position.get("top_tokens") or [], encode)
        labelled = [("token", token_id), *((f"top_tokens[{j}]", top) for j, top in enumerate(top_ids))]
        for label, candidate in labelled:
            if not 0 <= candidate < vocab_size:
                raise EnforcedTokensError(
                    message=f"enforced_tokens.tokens[{index}].{label}: id {candidate} is outside the "
                    f"vocabulary [0, {vocab_size})"
                )
        token_ids.append(token_id)
        top_token_ids.append(top_ids)
    return _with_eos(token_ids, top_token_ids, eos_id, from_str=False)


def decode_enforced_str(text: str, encode: Encode, eos_id: int) -> EnforcedSequence:
    """Tokenise `enforced_str` (the caller's encode must not add special tokens) and append EOS.

    An empty text pins EOS alone, so the reply is empty rather than an error.
    """
    ids = list(encode(text))
    return _with_eos(ids, [() for _ in ids], eos_id, from_str=True)


def resolve_logprobs_mode(requested: str | None, enforced: EnforcedSequence | None) -> str | None:
    """The per-request logprobs mode: explicit wins, else the classifier for enforced_tokens, else None.

    None means the deployment default. enforced_str carries no top tokens, so it never triggers the
    classifier.
    """
    if requested is not None:
        if requested not in LOGPROBS_MODES:
            raise SamplingFieldError(
                param="logprobs_mode",
                message=f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {requested!r}",
            )
        return requested
    if enforced is not None and not enforced.from_str:
        return classify_logprobs_mode(enforced.top_token_ids)
    return None


def _decode_position(token: str, top_tokens: Sequence[str], encode: Encode) -> tuple[int, tuple[int, ...]]:
    numeric = _as_ids(token, top_tokens)
    if numeric is not None:
        return numeric
    token_encoding = encode(token)
    token_id = token_encoding[0] if token_encoding else EMPTY_TEXT_TOKEN_ID
    top_ids = tuple(encoding[0] for encoding in map(encode, top_tokens) if encoding)
    return token_id, top_ids


def _as_ids(token: str, top_tokens: Sequence[str]) -> tuple[int, tuple[int, ...]] | None:
    # All-or-nothing per position, as in the fork: one non-numeric string sends the whole position,
    # numeric-looking members included, through the tokenizer. int() accepts what the fork accepts
    # (surrounding spaces, a sign, underscores).
    try:
        return int(token), tuple(int(top) for top in top_tokens)
    except ValueError:
        return None


def _with_eos(
    token_ids: list[int], top_token_ids: list[tuple[int, ...]], eos_id: int, *, from_str: bool
) -> EnforcedSequence:
    # The sampler repeats the last id once the list runs out, so it must be EOS for generation to stop.
    if not token_ids or token_ids[-1] != eos_id:
        token_ids = [*token_ids, eos_id]
        top_token_ids = [*top_token_ids, ()]
    return EnforcedSequence(tuple(token_ids), tuple(top_token_ids), from_str)
