"""NonceIterator examples and the argument checks that poc/nonces.py's docstring states."""

import pytest

from poc.errors import PocInputError
from poc.nonces import NonceIterator


def test_nonce_iterator_three_nodes():
    assert NonceIterator(0, 3).take(3) == [0, 3, 6]
    assert NonceIterator(1, 3).take(3) == [1, 4, 7]


@pytest.mark.parametrize(
    ("node_id", "group_id", "expected"),
    [(0, 0, [0, 4, 8, 12]), (1, 0, [1, 5, 9, 13]), (0, 1, [2, 6, 10, 14]), (1, 1, [3, 7, 11, 15])],
)
def test_nonce_iterator_two_nodes_two_groups(node_id, group_id, expected):
    assert NonceIterator(node_id, 2, group_id, 2).take(4) == expected


def test_nonce_iterator_take_advances():
    it = NonceIterator(1, 3)
    assert it.take(2) == [1, 4]
    assert it.take(2) == [7, 10]
    assert it.take(0) == []
    assert next(it) == 13


def test_nonce_iterator_ranges_disjoint():
    seen = set()
    for g in range(3):
        for n in range(4):
            chunk = set(NonceIterator(n, 4, g, 3).take(50))
            assert not chunk & seen
            seen |= chunk
    assert seen == set(range(600))


@pytest.mark.parametrize(
    ("field", "args"),
    [
        ("node_count", (0, 0, 0, 1)),
        ("n_groups", (0, 1, 0, 0)),
        ("n_groups", (0, 1, 0, -1)),
        ("node_id", (-1, 3, 0, 1)),
        ("group_id", (0, 3, -1, 2)),
    ],
)
def test_nonce_iterator_rejects_bad_args(field, args):
    with pytest.raises(ValueError) as info:
        NonceIterator(*args)
    assert isinstance(info.value, PocInputError) and info.value.field == field
    assert field in str(info.value)


def test_nonce_iterator_accepts_any_node_id_and_group_id():
    # dapi sends node_id = NodeNum (1-based, only grows) and node_count = its node count: a host with one node
    # sends (1, 1), one whose nodes were removed and re-added (5, 3). The fork's formula applies unchanged
    # (tests/unit/test_poc_nonces_fork.py compares it over a table).
    assert NonceIterator(1, 1).take(4) == [1, 2, 3, 4]
    assert NonceIterator(0, 1).take(4) == [0, 1, 2, 3]
    assert NonceIterator(2, 2).take(3) == [2, 4, 6]
    assert NonceIterator(1, 1, 1, 2).take(3) == [2, 4, 6]
    assert NonceIterator(3, 2).take(3) == [3, 5, 7]  # node 1's range from its second nonce on, as in the fork
    assert NonceIterator(5, 3, 1, 2).take(3) == [8, 14, 20]
    assert NonceIterator(0, 1, 2, 2).take(3) == [2, 4, 6]  # group_id >= n_groups: the fork computes it too


@pytest.mark.parametrize("base", [0, 1])
def test_nonce_iterator_ranges_disjoint_within_either_numbering(base):
    n, g = 3, 2
    seen: set[int] = set()
    for group in range(g):
        for node in range(base, base + n):
            taken = set(NonceIterator(node, n, group, g).take(50))
            assert not taken & seen
            seen |= taken


def test_nonce_iterator_rejects_negative_take():
    with pytest.raises(PocInputError):
        NonceIterator(0, 1).take(-1)
