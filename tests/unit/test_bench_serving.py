"""bench.serving's warm-up rule: the load starts once two warm-up rounds in a row agree on TTFT p99."""

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
