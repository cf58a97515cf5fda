"""pocserve's nonce sequence against the fork's, over a table of (node_id, node_count, group_id, n_groups).

The network's validators check a node's artifacts at the nonces the fork would have mined for the same numbers,
and dapi sends node_id = its NodeNum (a counter that starts at 1 and only grows) with node_count = its current
number of nodes, so node_id ≥ node_count occurs (docs/decisions.md). Every row here must give the fork's nonces.
"""

from __future__ import annotations

import itertools

import pytest

from poc.manager import MiningRound, RoundSpec
from poc.nonces import NonceIterator
from poc.spec import PocSpec
from protocol.pow import NodeIdentity


def fork_nonces(node_id: int, n_nodes: int, group_id: int, n_groups: int, count: int) -> list[int]:
    """A transcription of the fork's `NonceIterator.__next__` (gonka-ai/vllm, vllm/poc/routes.py, commit
    2b0febc2d2b13bb75f51b45892013121e169d1a1): a dataclass with a counter _current_x from 0; each call computes
    offset = node_id + group_id * n_nodes and step = n_groups * n_nodes, returns offset + _current_x * step and
    adds 1 to _current_x. Its `take(n)` is n such calls. The fork checks none of the four numbers."""
    values = []
    for current_x in range(count):
        offset = node_id + group_id * n_nodes
        step = n_groups * n_nodes
        values.append(offset + current_x * step)
    return values


# (node_id, node_count, group_id, n_groups)
TABLE = [
    (0, 1, 0, 1),
    (1, 1, 0, 1),  # dapi, one node: NodeNum 1 of 1
    (0, 3, 0, 1),
    (2, 3, 0, 1),
    (3, 3, 0, 1),  # dapi, the last of three nodes
    (3, 2, 0, 1),  # node_id > node_count: refused before, accepted by the fork
    (5, 3, 0, 1),  # dapi after nodes were removed and re-added
    (7, 2, 1, 2),
    (5, 3, 1, 2),
    (1, 1, 1, 2),  # one node, the second vLLM backend of the ML node (group_id from its proxy)
    (4, 4, 3, 4),
    (10, 1, 0, 3),
    (0, 2, 2, 2),  # group_id >= n_groups: no sender makes it, but the fork computes it
    (1000, 7, 5, 8),
    (2**40, 3, 1, 2),
]


@pytest.mark.parametrize(("node_id", "node_count", "group_id", "n_groups"), TABLE)
def test_nonce_sequence_equals_the_forks(node_id, node_count, group_id, n_groups):
    expected = fork_nonces(node_id, node_count, group_id, n_groups, 50)
    assert NonceIterator(node_id, node_count, group_id, n_groups).take(50) == expected


@pytest.mark.parametrize(("node_id", "node_count", "group_id", "n_groups"), TABLE)
@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_mining_round_batches_are_the_forks_takes(node_id, node_count, group_id, n_groups, batch_size):
    # The round hands out batch_size nonces at a time, as the fork's generation loop calls take(batch_size).
    node = NodeIdentity(block_hash="h", block_height=1, public_key="pk", node_id=node_id, node_count=node_count)
    spec = RoundSpec(node, PocSpec("h", "pk", 8), group_id, n_groups, batch_size, url=None)
    mining = MiningRound(spec)
    batches = [mining.next_batch() for _ in range(4)]
    assert list(itertools.chain(*batches)) == fork_nonces(node_id, node_count, group_id, n_groups, 4 * batch_size)
    assert all(len(b) == batch_size for b in batches)
