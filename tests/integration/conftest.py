"""Fixtures shared by the integration modules."""

from __future__ import annotations

import pytest

from tests.integration.pow_util import Receiver


@pytest.fixture(scope="module")
def receiver():
    """A loopback callback receiver for the whole module (test_callbacks.py overrides it with a per-test one)."""
    r = Receiver()
    yield r
    r.close()
