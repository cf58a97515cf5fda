"""`python -m sampling compare A.json B.json`: distance2 between an inference and its validation replay.

Each file is a saved OpenAI chat completion response (with logprobs and top_logprobs). Exit codes: 0 when
the two are comparable, 2 when the token sequences differ or an input is unusable (reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from sampling.distance import PositionResult, distance2, positions_from_openai

EXIT_OK = 0
EXIT_NOT_COMPARABLE = 2


class CompareInputError(Exception):
    """An input file cannot be turned into logprob positions."""


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(argv)
    try:
        inference = load_positions(args.inference)
        validation = load_positions(args.validation)
    except CompareInputError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_NOT_COMPARABLE

    dist, matches_ratio = distance2(inference, validation)
    is_identical = dist >= 0
    report = {
        "distance2": dist,
        "matches_ratio": matches_ratio,
        "num_positions_inference": len(inference),
        "num_positions_validation": len(validation),
        "tokens_identical": is_identical,
    }
    if args.json:
        print(json.dumps(report), file=out)
    else:
        for key, value in report.items():
            print(f"{key}: {value}", file=out)
    if not is_identical:
        print(f"error: token sequences differ: {_first_difference(inference, validation)}", file=err)
        return EXIT_NOT_COMPARABLE
    return EXIT_OK


def load_positions(path: str) -> list[PositionResult]:
    """Read a chat completion response and return its first choice's logprob positions."""
    try:
        with open(path, encoding="utf-8") as f:
            response = json.load(f)
    except OSError as exc:
        raise CompareInputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise CompareInputError(f"{path}: not JSON: {exc}") from exc
    content = _logprobs_content(response)
    if content is None:
        raise CompareInputError(
            f"{path}: no choices[0].logprobs.content list (was the request sent with logprobs=true?)"
        )
    if not content:
        raise CompareInputError(f"{path}: choices[0].logprobs.content is empty")
    try:
        return positions_from_openai(content)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CompareInputError(f"{path}: malformed logprobs entry: {exc!r}") from exc


def _logprobs_content(response: Any) -> list[Any] | None:
    # Walk the optional chain by hand so that every missing level gives the same clear message.
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    logprobs = first.get("logprobs") if isinstance(first, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else None


def _first_difference(inference: list[PositionResult], validation: list[PositionResult]) -> str:
    for index, (a, b) in enumerate(zip(inference, validation, strict=False)):
        if a["token"] != b["token"]:
            return f"position {index}: inference token {a['token']!r}, validation token {b['token']!r}"
    return f"lengths {len(inference)} (inference) and {len(validation)} (validation)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sampling", description="Offline tools for enforced sampling."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compare = commands.add_parser("compare", help="distance2 between an inference and its replay")
    compare.add_argument("inference", help="chat completion response JSON of the inference")
    compare.add_argument("validation", help="chat completion response JSON of the validation replay")
    compare.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    return parser
