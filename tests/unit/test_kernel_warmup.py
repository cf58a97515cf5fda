"""The kernel warm-up's sizes and when it runs (backend/engine/warmup.py)."""

import pytest

from backend.engine.warmup import TUNING_SIZES, wanted, warmup_sizes


def test_sizes_cover_every_tuning_size_and_its_odd_neighbour_up_to_the_step():
    sizes = warmup_sizes(32768)
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    for base in (*TUNING_SIZES, 8192, 16384, 32768):
        assert base in sizes
        assert base + 1 in sizes or base == 32768
    assert max(sizes) == 32768


@pytest.mark.parametrize("max_tokens, expected", [
    (1, [1]),
    (2, [2, 1]),
    (6, [6, 5, 4, 3, 2, 1]),
    (100, [100, 97, 96, 65, 64, 49, 48, 33, 32, 25, 24, 17, 16, 9, 8, 5, 4, 3, 2, 1]),
])
def test_sizes_stop_at_the_step_and_include_it(max_tokens, expected):
    assert warmup_sizes(max_tokens) == expected


def test_sizes_above_the_tuning_table_double():
    assert warmup_sizes(20000)[:5] == [20000, 16385, 16384, 8193, 8192]


def test_sizes_refuse_an_empty_step():
    with pytest.raises(ValueError, match="at least 1"):
        warmup_sizes(0)


@pytest.mark.parametrize("mode, device, moe, runs", [
    ("auto", "cuda", True, True),
    ("auto", "cuda", False, False),
    ("auto", "cpu", True, False),
    ("on", "cpu", False, True),
    ("on", "cuda", True, True),
    ("off", "cuda", True, False),
])
def test_wanted(mode, device, moe, runs):
    assert wanted(mode, device, moe) is runs
