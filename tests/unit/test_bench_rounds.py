"""bench.serving --rounds: the run order A,B,B,A,..., the pairs' ratios, their spread and their interval, and the
`vllm serve`-only flags merged with the all-reduce fusion decision."""

import json
import math
import statistics

import pytest

from bench.rounds import interval, median_interval, pair_ratios, round_order, stray_rounds, summarize_pairs
from bench.serving import parse_args, vllm_extra_flags
from bench.step_log import NO_STEPS


def test_each_system_runs_first_in_every_other_pair() -> None:
    order = round_order("ours", "vllm", 3)
    assert [name for _, name in order] == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    assert [pair for pair, _ in order] == [0, 0, 1, 1, 2, 2]
    assert [name for _, name in round_order("vllm", "ours", 2)] == ["vllm", "ours", "ours", "vllm"]


def _round(system: str, pair: int, req_per_s: float, tpot_ms: float) -> dict:
    return {"system": system, "pair": pair, "foreign_cpu_pct": 1.0, "req_per_s": req_per_s,
            "output_tok_per_s": 64 * req_per_s, "tpot_p50_ms": tpot_ms, "ttft_p50_ms": 100.0, "e2e_p50_ms": 500.0,
            "decoding_mean": 32.0, "tpot_mean_ms": tpot_ms, "engine_itl_mean_ms": 0.8 * tpot_ms, **NO_STEPS}


def test_pairs_give_ratios_ours_over_vllm_with_who_ran_first() -> None:
    rounds = [_round("ours", 0, 9.0, 4.0), _round("vllm", 0, 10.0, 5.0),
              _round("vllm", 1, 10.0, 4.0), _round("ours", 1, 11.0, 4.0),
              _round("ours", 2, 10.0, 4.0)]  # an interrupted run: pair 2 has no vllm round
    pairs = pair_ratios(rounds)
    assert [(p["pair"], p["first"]) for p in pairs] == [(0, "ours"), (1, "vllm")]
    assert [p["req_per_s"] for p in pairs] == pytest.approx([0.9, 1.1])
    assert [p["tpot_p50_ms"] for p in pairs] == pytest.approx([0.8, 1.0])
    summary = summarize_pairs(rounds)
    assert summary["ratios"]["req_per_s"] == pytest.approx({"median": 1.0, "min": 0.9, "max": 1.1, "q1": 0.95,
                                                            "q3": 1.05})
    assert summary["req_per_s_ratio_by_first"] == pytest.approx({"ours": 0.9, "vllm": 1.1})
    assert summary["req_per_s_by_system"]["ours"]["min"] == 9.0  # every round of ours, the unpaired one too
    assert summary["req_per_s_by_system"]["ours"]["max"] == 11.0
    # ours after its own round (the last) 10.0; after vllm's 11.0; vllm's after ours: 10.0, after its own: 10.0
    assert summary["req_per_s_by_previous"] == {"ours": {"after_own": 10.0, "after_other": 11.0},
                                                "vllm": {"after_own": 10.0, "after_other": 10.0}}
    assert summarize_pairs(rounds[:1]) == {}


def test_the_interval_is_students_on_the_log_ratios() -> None:
    ratios = [1.03, 0.98, 1.06, 1.01, 0.99, 1.04]
    logs = [math.log(r) for r in ratios]
    half = 2.571 * statistics.stdev(logs) / math.sqrt(6)  # t at 0.975, 5 degrees of freedom
    i = interval(ratios)
    assert i is not None
    assert i["geomean"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (i["low"], i["high"]) == pytest.approx((i["geomean"] * math.exp(-half), i["geomean"] * math.exp(half)))
    assert i["half_width_pct"] == pytest.approx(100 * math.expm1(half))
    assert i["half_width_pct"] < 5 and i["pairs_needed"] <= 6  # this scatter tells 5% in 6 pairs
    # a ratio and its inverse weigh alike: the geometric mean of 0.8 and 1.25 is 1
    assert interval([0.8, 1.25])["geomean"] == pytest.approx(1.0)  # type: ignore[index]
    assert interval([1.0]) is None


def test_a_wide_scatter_says_how_many_pairs_would_tell() -> None:
    wide = [0.85, 1.2, 0.95, 1.1, 0.9, 1.15]
    i = interval(wide)
    assert i is not None and i["half_width_pct"] > 5
    sd = statistics.stdev(math.log(r) for r in wide)
    n = i["pairs_needed"]
    assert 1.96 * sd / math.sqrt(n) <= math.log(1.05)  # enough, even at the normal's quantile
    assert 2.0 * sd / math.sqrt(n - 1) > math.log(1.05)  # and one fewer is not (t above 2.0 only below 60 pairs)
    assert summarize_pairs([_round(s, p, 10.0 * r if s == "ours" else 10.0, 4.0) for p, r in enumerate(wide)
                            for s in ("ours", "vllm")])["intervals"]["req_per_s"] == pytest.approx(i)


def test_the_medians_interval_is_the_sign_tests_order_statistics() -> None:
    # the CPU engine's ten pairs at 65127f0 (docs/benchmarks-history.md, 2026-12-06): pair 8's 3.918 is a stray
    # `vllm serve` round, which widened Student's interval to ±31%
    ratios = [1.448, 1.163, 1.272, 1.239, 1.182, 1.148, 1.473, 3.918, 1.101, 1.090]
    m = median_interval(ratios)
    assert m is not None
    # n = 10: P(B <= 1) = 11/1024 <= 2.5% < P(B <= 2) = 56/1024, so k = 2: the 2nd smallest and the 2nd largest
    assert (m["low"], m["high"]) == (1.101, 1.473)
    assert m["median"] == pytest.approx((1.182 + 1.239) / 2)
    assert m["coverage"] == pytest.approx(1 - 2 * 11 / 1024)
    assert m["low"] > 1.0  # one stray pair does not hide that ours is ahead here
    # n = 12: k = 3 (P(B <= 2) = 79/4096); n = 6: [min, max] (coverage 1 - 2/64); n = 5: none reaches 95%
    twelve = median_interval([float(v) for v in range(12, 0, -1)])
    assert twelve is not None and (twelve["low"], twelve["high"]) == (3.0, 10.0)
    six = median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    assert six is not None and (six["low"], six["high"], six["coverage"]) == (1.0, 6.0, pytest.approx(1 - 2 / 64))
    assert median_interval([1.0] * 5) is None


def test_a_round_far_from_its_systems_others_is_named() -> None:
    rates = {"ours": [97.7, 95.7, 93.9, 95.6, 93.4, 97.3], "vllm": [84.4, 84.7, 65.0, 23.98, 86.9, 85.7]}
    rounds = [_round(s, p, rates[s][p], 4.0) for p in range(6) for s in ("ours", "vllm")]
    stray = stray_rounds(rounds)
    # vllm's 23.98 is ~23 scaled MADs from its median 84.55, its 65.0 ~7.5 (MAD 1.75 × 1.4826); none of ours
    assert [(r["round"], r["system"], r["req_per_s"]) for r in stray] == [(6, "vllm", 65.0), (8, "vllm", 23.98)]
    assert stray[0]["system_median"] == pytest.approx(84.55)
    assert summarize_pairs(rounds)["stray_rounds"] == stray
    assert stray_rounds([_round(s, p, 10.0, 4.0) for p in range(6) for s in ("ours", "vllm")]) == []  # no scatter
    assert stray_rounds(rounds[:6]) == []  # three rounds a system: too few to call one stray


def test_rounds_need_both_systems() -> None:
    assert parse_args(["--rounds", "3"]).rounds == 3
    assert parse_args([]).rounds == 0  # the single pass stays the default
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "3", "--systems", "ours"])
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "-1"])


def test_vllm_flags_merge_one_compilation_config() -> None:
    assert vllm_extra_flags([], fusion_on=True) == []
    assert vllm_extra_flags(["--enforce-eager"], fusion_on=True) == ["--enforce-eager"]
    fusion_off = vllm_extra_flags([], fusion_on=False)
    assert fusion_off[0] == "--compilation-config"
    assert json.loads(fusion_off[1]) == {"pass_config": {"fuse_allreduce_rms": False}}
    ops = '{"custom_ops": ["all"]}'
    for given in (["--compilation-config", ops], [f"--compilation-config={ops}"]):
        flags = vllm_extra_flags(["--max-logprobs", "5", *given], fusion_on=False)
        assert flags[:3] == ["--max-logprobs", "5", "--compilation-config"] and len(flags) == 4
        assert json.loads(flags[3]) == {"custom_ops": ["all"], "pass_config": {"fuse_allreduce_rms": False}}
    with pytest.raises(SystemExit, match="not JSON"):
        vllm_extra_flags(["--compilation-config", "{custom_ops"], fusion_on=True)
    with pytest.raises(SystemExit, match="spell it"):
        vllm_extra_flags(["-O3"], fusion_on=True)


def test_a_figure_one_system_lacks_is_left_out_of_the_summary() -> None:
    rounds = [_round("ours", 0, 9.0, 4.0), _round("vllm", 0, 10.0, 5.0),
              _round("vllm", 1, 10.0, 4.0), _round("ours", 1, 11.0, 4.0)]
    rounds[1]["engine_itl_mean_ms"] = float("nan")  # that server's /metrics had no histogram that round
    summary = summarize_pairs(rounds)
    assert summary["ratios"]["engine_itl_mean_ms"]["median"] == pytest.approx(1.0)  # pair 1's only
    assert summary["intervals"]["engine_itl_mean_ms"] is None  # one pair: no interval
    assert summary["ratios"]["tpot_mean_ms"]["min"] == pytest.approx(0.8)


def test_the_step_logs_give_each_pair_its_ratios_at_equal_batch() -> None:
    rounds = [_round("ours", 0, 9.0, 4.0), _round("vllm", 0, 10.0, 5.0)]
    rounds[0].update(step_decode_ms=2.2, step_mixed_ms=5.0, step_prefill_count=300,
                     step_decode_by_batch={"4": [2.2, 50, 1.2, 0.33], "5": [2.6, 60, 1.4, 0.4]})
    rounds[1].update(step_decode_ms=2.0, step_mixed_ms=4.0, step_prefill_count=200,
                     step_decode_by_batch={"4": [2.0, 80, 1.0, 0.3], "6": [3.0, 60, 1.6, 0.5]})
    pair = pair_ratios(rounds)[0]
    assert pair["step_decode_ms"] == pytest.approx(1.1)
    assert pair["step_mixed_ms"] == pytest.approx(1.25)
    assert pair["step_decode_equal_batch"] == pytest.approx(1.1)  # bucket 4, the only one both have
    assert pair["step_host_equal_batch"] == pytest.approx(1.2)
    assert pair["step_sched_equal_batch"] == pytest.approx(1.1)  # the scheduler's phases alone
    assert pair["step_prefill_count"] == pytest.approx(1.5)  # the same arrivals in 1.5x the prefill steps
    rounds[1].update(step_prefill_count=0)
    assert math.isnan(pair_ratios(rounds)[0]["step_prefill_count"])
    no_log = pair_ratios([_round("ours", 0, 9.0, 4.0), _round("vllm", 0, 10.0, 5.0)])[0]
    assert math.isnan(no_log["step_decode_equal_batch"]) and math.isnan(no_log["step_decode_ms"])
    assert "step_decode_ms" not in summarize_pairs([_round("ours", 0, 9.0, 4.0), _round("vllm", 0, 10.0, 5.0)])[
        "ratios"]


def test_the_step_log_needs_rounds() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--step-log"])
    assert parse_args(["--step-log", "--rounds", "2"]).step_log
