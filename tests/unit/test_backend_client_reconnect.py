"""Unit tests for frontend.backend_client across a lost and regained backend: orphaned requests are aborted,
the DEALER keeps one identity over reconnects. Uses the fake backend of test_backend_client."""

from __future__ import annotations

import asyncio

import pytest

from frontend.backend_client import BackendUnavailable
from protocol.generate import AbortRequest
from tests.unit.fake_backend import WAIT_S, FakeBackend, make_client, start_stream, wait_until


async def _lose_backend(client, backend, task: asyncio.Task) -> None:
    """The backend stops answering with its connection up (hung): past the busy window the stream in flight fails
    with 503's exception."""
    backend.is_answering = False
    with pytest.raises(BackendUnavailable, match="unreachable"):
        await asyncio.wait_for(task, WAIT_S)
    assert not client.is_alive


async def test_backend_client_request_failed_while_unreachable_is_aborted_on_return(client, backend):
    req, task = await start_stream(client, backend)
    await _lose_backend(client, backend, task)
    assert backend.received.empty(), "nothing can be sent while the backend is unreachable"
    backend.is_answering = True
    await wait_until(lambda: client.is_alive, what="recovery")
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_backend_client_orphans_forgotten_when_backend_restarted(client, backend):
    _, task = await start_stream(client, backend)
    await _lose_backend(client, backend, task)
    backend.instance_id = "inst-2"  # what comes back is a new backend: it never had the request
    backend.is_answering = True
    await wait_until(lambda: client.is_alive and backend.num_hellos == 2, what="second handshake")
    await asyncio.sleep(0.2)  # a few pongs: time enough for an abort that must not come
    assert backend.received.empty()


async def test_backend_client_keeps_its_identity_across_reconnects(address):
    first_backend = FakeBackend(address)
    c = make_client(address)
    await c.start()
    try:
        await wait_until(lambda: c.is_alive, what="handshake")
        first = first_backend.peer
        await first_backend.close()
        await wait_until(lambda: not c.is_alive, what="marked down")
        again = FakeBackend(address)
        try:
            await wait_until(lambda: c.is_alive, what="reconnect")
            assert first is not None and again.peer == first
            await start_stream(c, again)
        finally:
            await again.close()
    finally:
        await c.close()
