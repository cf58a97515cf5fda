"""bench.serving's warm-up rule (the load starts once two warm-up rounds in a row agree on TTFT p99), and bench.load's
spread of output lengths, open load's arrival schedule and its count of requests in decode."""

import itertools
import math

import pytest

from bench.serving import parse_args, settled


@pytest.mark.parametrize(("p99s", "expected"), [
    ([], False),
    ([900.0], False),                   # one round says nothing about the next
    ([2500.0, 1100.0], False),          # a first-start stall: the second round is far below
    ([1342.0, 1111.0], False),          # 1.21x: just outside 20% (4xH200, 94 layers, eager)
    ([2500.0, 1100.0, 1000.0], True),   # the last two agree
    ([1000.0, 1200.0], True),           # exactly 20% apart
    ([1000.0, 800.0, 1300.0], False),   # only the last two count
])
def test_settled(p99s: list[float], expected: bool) -> None:
    assert settled(p99s) is expected


def test_warmup_defaults_to_two_rounds_of_the_load_s_concurrency() -> None:
    args = parse_args(["--concurrency", "16"])
    assert args.num_warmup == 32
    assert args.max_warmup_rounds == 8
    assert parse_args(["--engine-arg=--load-format", "--engine-arg=dummy"]).engine_arg == ["--load-format", "dummy"]


def test_spread_output_lengths_cover_the_range_evenly():
    from bench.load import tokens_for
    assert {tokens_for(i, 64, None) for i in range(100)} == {64}  # the default: one length
    assert tokens_for(5, 64, 64) == 64
    lengths = [tokens_for(i, 64, 16) for i in range(49 * 20)]
    assert min(lengths) == 16 and max(lengths) == 64
    counts = {n: lengths.count(n) for n in set(lengths)}
    assert set(counts) == set(range(16, 65)) and set(counts.values()) == {20}  # each length equally often
    assert lengths == [tokens_for(i, 64, 16) for i in range(49 * 20)]  # by index: the same for both systems


def test_an_open_load_arrives_on_one_seeded_poisson_schedule():
    from bench.load import arrival_offsets
    offsets = arrival_offsets(4000, 50.0, seed=7)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets == arrival_offsets(4000, 50.0, seed=7)  # the same schedule for both systems of a pair
    assert offsets != arrival_offsets(4000, 50.0, seed=8)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50.0, rel=0.05)  # 4000 exponential gaps: within ~1.6% (1 sd)
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(math.log(2) / 50.0, rel=0.1)  # an exponential's median
    with pytest.raises(SystemExit):
        parse_args(["--request-rate", "-1"])


def test_in_decode_is_the_mean_number_of_requests_past_their_first_token():
    from bench.load import Result, summarize
    results = [Result(ok=True, ttft_s=0.5, e2e_s=2.5, num_output_tokens=5),  # 2 s in decode
               Result(ok=True, ttft_s=0.0, e2e_s=4.0, num_output_tokens=9),  # 4 s
               Result(ok=False, error="HTTP 500")]
    figures = summarize(results, duration_s=4.0)
    assert figures["decoding_mean"] == pytest.approx(6.0 / 4.0)
    assert figures["tpot_p50_ms"] == pytest.approx(500.0)  # 2 s over 4 tokens and 4 s over 8: both 0.5 s
    assert figures["num_ok"] == 2 and figures["errors"] == ["HTTP 500"]
