"""Unit tests for sampling.distance and the `python -m sampling compare` CLI."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sampling.compare_cli import main
from sampling.distance import distance2, positions_from_openai, token_distance2
from tests.integration.replay_util import build_enforced_tokens

REPO_ROOT = Path(__file__).resolve().parents[2]


def _term(v: float, a: float) -> float:
    return abs(v - a) / (1e-6 + abs(v) + abs(a)) / 2


def _pos(token: str, logprobs: dict[str, float]) -> dict:
    return {"token": token, "logprobs": logprobs}


# --- token_distance2 -------------------------------------------------------------------------


def test_token_distance2_identical_dicts_are_zero_with_all_matches():
    assert token_distance2({"1": -0.5, "2": -1.5}, {"1": -0.5, "2": -1.5}) == (0.0, 2)


def test_token_distance2_matched_token_uses_relative_difference():
    dist, matches = token_distance2({"1": -1.0}, {"1": -2.0})
    assert matches == 1
    assert dist == pytest.approx(1 / 3.000001 / 2)  # |-2 - -1| / (1e-6 + 2 + 1) / 2


def test_token_distance2_unmatched_token_uses_fallback_below_two_smallest():
    # m1 = -2, m2 = -1 -> fallback = -2 - (-1 - -2) = -3
    dist, matches = token_distance2({"1": -1.0, "2": -2.0}, {"1": -1.0, "3": -4.0})
    assert matches == 1
    assert dist == pytest.approx(_term(-4.0, -3.0))
    assert dist == pytest.approx(1 / 7.000001 / 2)


def test_token_distance2_fallback_equal_to_validation_value_gives_zero():
    assert token_distance2({"1": -1.0, "2": -2.0}, {"3": -3.0}) == (0.0, 0)


def test_token_distance2_single_entry_fallback_is_m1_plus_100():
    # m1 = -1, m2 = m1 - 100 = -101 -> fallback = -1 - (-101 - -1) = 99
    dist, matches = token_distance2({"5": -1.0}, {"7": -2.0})
    assert matches == 0
    assert dist == pytest.approx(101 / 101.000001 / 2)


def test_token_distance2_iterates_validation_tokens_only():
    # Inference tokens absent from validation contribute nothing.
    assert token_distance2({"1": -1.0, "2": -2.0, "3": -9.0}, {"1": -1.0}) == (0.0, 1)


def test_token_distance2_skips_nan_terms_but_counts_the_match():
    dist, matches = token_distance2({"1": -1.0, "2": -2.0}, {"1": math.nan, "2": -2.5})
    assert matches == 2
    assert dist == pytest.approx(_term(-2.5, -2.0))


def test_token_distance2_skips_infinite_terms():
    # |-inf - a| / inf is NaN, so the term is skipped as in the reference.
    assert token_distance2({"1": -1.0, "2": -2.0}, {"1": -math.inf}) == (0.0, 1)


@pytest.mark.parametrize("inf, val", [({}, {"1": -1.0}), ({"1": -1.0}, {}), ({}, {})])
def test_token_distance2_empty_dict_gives_100_and_no_matches(inf, val):
    assert token_distance2(inf, val) == (100.0, 0)


_logprob = st.floats(min_value=-9999.0, max_value=0.0)
_lp_dict = st.dictionaries(st.sampled_from([str(i) for i in range(8)]), _logprob, min_size=1, max_size=6)


@given(_lp_dict, _lp_dict)
def test_token_distance2_terms_are_bounded_by_half(inf, val):
    dist, matches = token_distance2(inf, val)
    assert 0.0 <= dist <= len(val) / 2 + 1e-9
    assert matches == len(inf.keys() & val.keys())


@given(_lp_dict)
def test_token_distance2_self_distance_is_zero(lp):
    assert token_distance2(lp, lp) == (0.0, len(lp))


# --- distance2 -------------------------------------------------------------------------------


def test_distance2_identical_sequences_are_zero_with_full_matches():
    seq = [_pos("11", {"11": -0.1, "12": -2.5}), _pos("13", {"13": -0.2, "14": -3.0})]
    assert distance2(seq, [dict(p) for p in seq]) == (0.0, 1.0)


def test_distance2_differing_tokens_are_not_comparable():
    inf = [_pos("11", {"11": -0.1}), _pos("13", {"13": -0.2})]
    val = [_pos("11", {"11": -0.1}), _pos("99", {"13": -0.2})]
    assert distance2(inf, val) == (-1, -1)


def test_distance2_differing_lengths_are_not_comparable():
    inf = [_pos("11", {"11": -0.1}), _pos("13", {"13": -0.2})]
    assert distance2(inf, inf[:1]) == (-1, -1)
    assert distance2(inf[:1], inf) == (-1, -1)


@pytest.mark.parametrize("num_positions, denominator_positions", [(3, 100), (100, 100), (150, 150)])
def test_distance2_divides_by_at_least_100_positions(num_positions, denominator_positions):
    # One position differs by a known term; every position has 2 logprobs.
    inf = [_pos("1", {"1": -1.0, "2": -2.0}) for _ in range(num_positions)]
    val = [_pos("1", {"1": -1.0, "2": -2.0}) for _ in range(num_positions)]
    val[0] = _pos("1", {"1": -1.5, "2": -2.0})
    dist, matches_ratio = distance2(inf, val)
    assert dist == pytest.approx(_term(-1.5, -1.0) / (denominator_positions * 2))
    assert matches_ratio == 1.0


def test_distance2_matches_ratio_uses_first_inference_dict_size():
    # n_logprobs = 2 from position 0, although position 1 reports 3 entries.
    inf = [_pos("1", {"1": -1.0, "2": -2.0}), _pos("1", {"1": -1.0, "2": -2.0, "3": -3.0})]
    val = [_pos("1", {"1": -1.0, "9": -2.0}), _pos("1", {"1": -1.0, "2": -2.0, "3": -3.0})]
    dist, matches_ratio = distance2(inf, val)
    assert matches_ratio == pytest.approx(4 / (2 * 2))
    # fallback at position 0 is -2 - (-1 - -2) = -3
    assert dist == pytest.approx(_term(-2.0, -3.0) / (100 * 2))


def test_distance2_empty_first_dict_counts_as_one_logprob():
    inf = [_pos("1", {}), _pos("2", {"2": -1.0})]
    val = [_pos("1", {"1": -1.0}), _pos("2", {"2": -1.0})]
    assert distance2(inf, val) == (pytest.approx(100.0 / 100), pytest.approx(1 / 2))


def test_distance2_empty_sequences_are_zero():
    assert distance2([], []) == (0.0, 0.0)


# --- OpenAI helpers --------------------------------------------------------------------------

CONTENT = [
    {
        "token": "40",
        "logprob": -0.1,
        "top_logprobs": [{"token": "40", "logprob": -0.1}, {"token": "7", "logprob": -2.4}],
    },
    {"token": "151645", "logprob": -0.0, "top_logprobs": [{"token": "151645", "logprob": -0.0}]},
]


def test_positions_from_openai_keys_top_logprobs_by_token_string():
    assert positions_from_openai(CONTENT) == [
        {"token": "40", "logprobs": {"40": -0.1, "7": -2.4}},
        {"token": "151645", "logprobs": {"151645": -0.0}},
    ]


def test_positions_from_openai_missing_top_logprobs_gives_empty_dict():
    assert positions_from_openai([{"token": 5, "logprob": -1.0, "top_logprobs": None}]) == [
        {"token": "5", "logprobs": {}}
    ]


def test_build_enforced_tokens_lists_token_then_top_tokens_as_strings():
    assert build_enforced_tokens(CONTENT) == {
        "tokens": [{"token": "40", "top_tokens": ["40", "7"]}, {"token": "151645", "top_tokens": ["151645"]}]
    }


# --- compare CLI -----------------------------------------------------------------------------


def _response(content: list[dict]) -> dict:
    return {"choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": content}}]}


def _write(tmp_path: Path, name: str, payload: object) -> str:
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return str(path)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_compare_cli_identical_responses_exit_0(tmp_path):
    a = _write(tmp_path, "a.json", _response(CONTENT))
    b = _write(tmp_path, "b.json", _response(CONTENT))
    code, out, err = _run(["compare", a, b])
    assert code == 0, err
    assert "distance2: 0.0" in out
    # 3 matches / (2 positions * 2 logprobs of position 0): the second position has only 1 entry.
    assert "matches_ratio: 0.75" in out
    assert "num_positions_inference: 2" in out
    assert "tokens_identical: True" in out


def test_compare_cli_json_output(tmp_path):
    a = _write(tmp_path, "a.json", _response(CONTENT))
    replay = json.loads(json.dumps(CONTENT))
    replay[0]["top_logprobs"][1]["logprob"] = -2.0
    b = _write(tmp_path, "b.json", _response(replay))
    code, out, _ = _run(["compare", "--json", a, b])
    report = json.loads(out)
    assert code == 0
    assert report["distance2"] == pytest.approx(_term(-2.0, -2.4) / (100 * 2))
    assert report["tokens_identical"] is True


def test_compare_cli_differing_tokens_exit_2(tmp_path):
    replay = json.loads(json.dumps(CONTENT))
    replay[1]["token"] = "13"
    a = _write(tmp_path, "a.json", _response(CONTENT))
    b = _write(tmp_path, "b.json", _response(replay))
    code, out, err = _run(["compare", a, b])
    assert code == 2
    assert "tokens_identical: False" in out
    assert "position 1" in err


def test_compare_cli_differing_lengths_exit_2(tmp_path):
    a = _write(tmp_path, "a.json", _response(CONTENT))
    b = _write(tmp_path, "b.json", _response(CONTENT[:1]))
    code, _, err = _run(["compare", a, b])
    assert code == 2
    assert "lengths 2 (inference) and 1 (validation)" in err


@pytest.mark.parametrize(
    "payload, reason",
    [
        ("{not json", "not JSON"),
        ({"choices": []}, "no choices[0].logprobs.content"),
        ({"choices": [{"logprobs": None}]}, "logprobs=true"),
        (_response([]), "is empty"),
        (_response([{"logprob": -1.0, "top_logprobs": []}]), "malformed"),
        (_response([{"token": "1", "top_logprobs": [{"token": "1", "logprob": "x"}]}]), "malformed"),
    ],
)
def test_compare_cli_invalid_input_exit_2(tmp_path, payload, reason):
    good = _write(tmp_path, "good.json", _response(CONTENT))
    bad = _write(tmp_path, "bad.json", payload)
    code, out, err = _run(["compare", good, bad])
    assert code == 2
    assert out == ""
    assert reason in err and "bad.json" in err


def test_compare_cli_missing_file_exit_2(tmp_path):
    good = _write(tmp_path, "good.json", _response(CONTENT))
    code, _, err = _run(["compare", str(tmp_path / "absent.json"), good])
    assert code == 2
    assert "absent.json" in err


def test_compare_cli_runs_as_module(tmp_path):
    a = _write(tmp_path, "a.json", _response(CONTENT))
    done = subprocess.run(
        [sys.executable, "-m", "sampling", "compare", a, a], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "tokens_identical: True" in done.stdout


def test_sampling_pure_modules_import_only_the_stdlib():
    # The frontend image has no torch or vLLM; these modules must stay importable there.
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import sampling.distance, sampling.classifier, sampling.enforced_input, sampling.compare_cli\n"
        "roots = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(roots - set(sys.stdlib_module_names) - {'sampling'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
