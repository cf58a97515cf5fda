"""The nonce range of one node in a PoC round: the x-th nonce is node_id + group_id·N + x·(n_groups·N).

This is the fork's arithmetic, unchanged (gonka-ai/vllm, vllm/poc/routes.py, `NonceIterator`: offset = node_id +
group_id * n_nodes, step = n_groups * n_nodes), and, as there, any node_id and group_id ≥ 0 are accepted: the network's
dapi sends node_id = its NodeNum, a counter that starts at 1 and only grows, with node_count = its current number
of nodes (gonka-ai/gonka, decentralized-api/broker), so node_id ≥ node_count is normal after nodes were removed and
re-added. Whether two nodes' ranges overlap is the network's business; a node that computes other nonces than the
fork for the same numbers would be judged invalid. Refused, with the field named, only what no sender means:
negative node_id or group_id (NodeNum starts at 1; the ML node's proxy sends group_id = the backend's index in
range(n_groups)) and counts below 1 (a step of 0 would repeat one nonce forever). See docs/decisions.md.
"""

from __future__ import annotations

import operator

from poc.errors import PocInputError


def check_node(node_id: int, node_count: int, group_id: int = 0, n_groups: int = 1) -> None:
    """Raises PocInputError naming the field when these numbers give no nonce sequence (see the module docstring)."""
    if node_count < 1:
        raise PocInputError("node_count", f"must be >= 1, got {node_count}")
    if n_groups < 1:
        raise PocInputError("n_groups", f"must be >= 1, got {n_groups}")
    if node_id < 0:
        raise PocInputError("node_id", f"must be >= 0, got {node_id}")
    if group_id < 0:
        raise PocInputError("group_id", f"must be >= 0, got {group_id}")


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
