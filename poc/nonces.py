"""The nonce range of one node in a PoC round (spec §2.4): the x-th nonce is node_id + g·N + x·(G·N).

Nodes (node_id < N) within groups (g < G) interleave with stride G·N, so their ranges are disjoint. Larger
node_id / group_id values are accepted, as in the fork: the network client sends node_id = its NodeNum, a
1-based counter that only grows as nodes are registered, and node_count = the number of nodes it has now, so a
host with one node sends node_id 1, node_count 1 (nonces 1, 2, 3, …). Refusing that would stop the host mining.
Only values that make no sense at all (counts < 1, negative ids) are refused.
"""

from __future__ import annotations

import operator

from poc.errors import PocInputError


class NonceIterator:
    """Infinite iterator over one node's nonces; `take(n)` hands out the next n and advances."""

    def __init__(self, node_id: int, node_count: int, group_id: int = 0, n_groups: int = 1) -> None:
        node_id, node_count = operator.index(node_id), operator.index(node_count)
        group_id, n_groups = operator.index(group_id), operator.index(n_groups)
        if node_count < 1:
            raise PocInputError("node_count", f"must be >= 1, got {node_count}")
        if n_groups < 1:
            raise PocInputError("n_groups", f"must be >= 1, got {n_groups}")
        if node_id < 0:
            raise PocInputError("node_id", f"must be >= 0, got {node_id}")
        if group_id < 0:
            raise PocInputError("group_id", f"must be >= 0, got {group_id}")
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
