"""Fixtures shared by the integration modules."""

from __future__ import annotations

import pytest

from tests.integration.pow_util import TOPOLOGY_NONCES, TOPOLOGY_SEQ_LEN, Receiver, artifacts_of, greedy_tokens


@pytest.fixture(scope="module")
def receiver():
    """A loopback callback receiver for the whole module (test_callbacks.py overrides it with a per-test one)."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="session")
def single_rank_reference(stack) -> tuple[dict[int, str], list[str]]:
    """The shared PP=TP=1 stack's artifacts of TOPOLOGY_NONCES and its greedy chat tokens, once per session."""
    artifacts = artifacts_of(f"{stack.base_url}/api/v1/pow", TOPOLOGY_NONCES, seq_len=TOPOLOGY_SEQ_LEN)
    return artifacts, greedy_tokens(stack.base_url)
