"""Fixtures of the frontend BackendClient tests (test_backend_client*.py): a fake backend and a connected client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from frontend.backend_client import BackendClient
from tests.unit.fake_backend import FakeBackend, make_client, wait_until


@pytest.fixture
def address(tmp_path) -> str:
    return f"ipc://{tmp_path}/backend.ipc"


@pytest.fixture
async def backend(address) -> AsyncIterator[FakeBackend]:
    fake = FakeBackend(address)
    yield fake
    await fake.close()


@pytest.fixture
async def client(address, backend) -> AsyncIterator[BackendClient]:
    """A client that finished its handshake with `backend`."""
    c = make_client(address)
    await c.start()
    await wait_until(lambda: c.is_alive, what="handshake")
    yield c
    await c.close()
