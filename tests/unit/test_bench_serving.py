"""bench.serving's warm-up rule (the load starts once two warm-up rounds in a row agree on TTFT p99), and bench.load's
spread of output lengths."""

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
