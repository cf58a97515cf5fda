"""The distance2 metric that compares an inference with its validation replay.

Mirrors `token_distance2`/`distance2` of the fork's `tests/gonka/live_conftest.py` (itself a copy of the Go
`customDistance`/`positionDistance`), plus the helper that turns an OpenAI chat response into the per-position
result format. Stdlib only: the frontend and CLI tools use it too.

Result format, one dict per generated position: {"token": str(id), "logprobs": {str(id): logprob}}.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


class PositionResult(TypedDict):
    """One generated position: the token id as a string and its top logprobs keyed by id string."""

    token: str
    logprobs: dict[str, float]


# Returned for a position when either side has no logprobs: large enough that one such position
# pushes the sequence well past any acceptance threshold.
EMPTY_POSITION_DISTANCE = 100.0
# Stand-in for the second-smallest inference logprob when the inference side has a single entry. It sits
# *below* m1, so the fallback m1 - (m2 - m1) becomes m1 + 100: far from any real logprob. Kept as in the
# reference for parity, although it is not an extrapolation downwards like the two-entry case.
SINGLE_ENTRY_GAP = 100.0
# Keeps the relative difference finite when both logprobs are 0.0.
DENOMINATOR_EPS = 1e-6
# The reference divides by at least this many positions, so a short answer's few noisy positions weigh
# less; the published thresholds (< 0.05 honest) were measured with this denominator.
MIN_NORMALISING_POSITIONS = 100
# distance2's answer when the two sequences are not comparable (different lengths or tokens).
NOT_COMPARABLE = (-1.0, -1.0)


def token_distance2(inf: Mapping[str, float], val: Mapping[str, float]) -> tuple[float, int]:
    """Distance between the inference and validation top-logprob dicts of one position.

    Iterates over the validation tokens; a token the inference side did not report is compared with a
    fallback m1 - (m2 - m1) built from the two smallest inference logprobs. Returns (sum, num_matches),
    or (100.0, 0) when either dict is empty.
    """
    if not inf or not val:
        return EMPTY_POSITION_DISTANCE, 0
    smallest = sorted(inf.values())
    m1 = smallest[0]
    m2 = smallest[1] if len(smallest) >= 2 else m1 - SINGLE_ENTRY_GAP
    fallback = m1 - (m2 - m1)

    total = 0.0
    num_matches = 0
    for token, v in val.items():
        if token in inf:
            a = inf[token]
            num_matches += 1
        else:
            a = fallback
        term = abs(v - a) / (DENOMINATOR_EPS + abs(v) + abs(a)) / 2.0
        # NaN terms come from NaN or same-signed infinite logprobs; the reference skips them.
        if not math.isnan(term):
            total += term
    return total, num_matches


def distance2(inf_seq: Sequence[PositionResult], val_seq: Sequence[PositionResult]) -> tuple[float, float]:
    """Sequence distance and matches ratio, or (-1, -1) when lengths or token sequences differ.

    dist = Σ token_distance2 / (max(100, n_positions) · n_logprobs) and
    matches_ratio = Σ matches / (n_positions · n_logprobs), where n_logprobs is the size of the first
    inference position's dict (1 if that dict is empty, as in the reference).
    """
    if len(inf_seq) != len(val_seq):
        return NOT_COMPARABLE
    if [p["token"] for p in inf_seq] != [p["token"] for p in val_seq]:
        return NOT_COMPARABLE
    if not inf_seq:
        # The reference indexes position 0 and would crash; nothing differs, so report zero.
        return 0.0, 0.0

    total = 0.0
    total_matches = 0
    for inf_pos, val_pos in zip(inf_seq, val_seq, strict=False):
        d, m = token_distance2(inf_pos["logprobs"], val_pos["logprobs"])
        total += d
        total_matches += m
    n_positions = len(inf_seq)
    n_logprobs = len(inf_seq[0]["logprobs"]) or 1
    dist = total / (max(MIN_NORMALISING_POSITIONS, n_positions) * n_logprobs)
    matches_ratio = total_matches / (n_positions * n_logprobs)
    return dist, matches_ratio


def positions_from_openai(content: Sequence[Mapping[str, Any]]) -> list[PositionResult]:
    """Turn `choices[0].logprobs.content` of a chat response into the per-position result format.

    Only `top_logprobs` feed the dict (the position's own logprob is already its first entry).
    Raises KeyError/TypeError/ValueError on a malformed entry; the caller validates its input.
    """
    positions: list[PositionResult] = []
    for position in content:
        logprobs = {str(entry["token"]): float(entry["logprob"]) for entry in _top(position)}
        positions.append({"token": str(position["token"]), "logprobs": logprobs})
    return positions


def _top(position: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    # OpenAI sends [] (some servers null) when top_logprobs was 0.
    return position.get("top_logprobs") or []
