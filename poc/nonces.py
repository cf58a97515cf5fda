"""The nonce range of one node in a PoC round (spec §2.4): the x-th nonce is node_id + g·N + x·(G·N).

Nodes within groups (g < G) interleave with stride G·N, so their ranges are disjoint when their node_id values
differ modulo N. Both numberings in use are accepted: 0-based (0..N-1, the fork's tests and the spec's examples)
and 1-based (1..N: the network's dapi sends node_id = its NodeNum, a counter that starts at 1, and node_count =
its number of nodes, so a host with one node sends (1, 1)). Within either numbering the ranges are disjoint. A
node_id above N cannot be either, and would mine the nonces of another node (3 with N = 2 is node 1's range): it is
refused, as are group_id ≥ G, negative ids and counts below 1 (see docs/decisions.md).
"""

from __future__ import annotations

import operator

from poc.errors import PocInputError


def check_node(node_id: int, node_count: int, group_id: int = 0, n_groups: int = 1) -> None:
    """Raises PocInputError naming the field when these numbers cannot describe one node of one group."""
    if node_count < 1:
        raise PocInputError("node_count", f"must be >= 1, got {node_count}")
    if n_groups < 1:
        raise PocInputError("n_groups", f"must be >= 1, got {n_groups}")
    if not 0 <= node_id <= node_count:
        raise PocInputError("node_id", f"must be in [0, node_count={node_count}] (0- or 1-based numbering), "
                                       f"got {node_id}")
    if not 0 <= group_id < n_groups:
        raise PocInputError("group_id", f"must be in [0, n_groups={n_groups}), got {group_id}")


class NonceIterator:
    """Infinite iterator over one node's nonces; `take(n)` hands out the next n and advances."""

    def __init__(self, node_id: int, node_count: int, group_id: int = 0, n_groups: int = 1) -> None:
        node_id, node_count = operator.index(node_id), operator.index(node_count)
        group_id, n_groups = operator.index(group_id), operator.index(n_groups)
        check_node(node_id, node_count, group_id, n_groups)
        self.node_id = node_id
        self.node_count = node_count
        self.group_id = group_id
        self.n_groups = n_groups
        self._offset = node_id + group_id * node_count
        self._stride = n_groups * node_count
        self._next_index = 0

    @property
    def position(self) -> int:
        """How many nonces have been handed out so far."""
        return self._next_index

    def nonce_at(self, index: int) -> int:
        """The index-th nonce of this node (0-based), independent of the iteration state."""
        return self._offset + index * self._stride

    def take(self, n: int) -> list[int]:
        """The next n nonces, in order."""
        if n < 0:
            raise PocInputError("n", f"must be >= 0, got {n}")
        start = self._next_index
        self._next_index += n
        return [self._offset + x * self._stride for x in range(start, start + n)]

    def __iter__(self) -> NonceIterator:
        return self

    def __next__(self) -> int:
        return self.take(1)[0]
