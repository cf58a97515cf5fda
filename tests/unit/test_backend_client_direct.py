"""frontend/direct.py through the BackendClient: the second connection, to the backend processor's own socket,
against the fake backend and a fake processor (a ROUTER where the ReadyReply says)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from frontend.backend_client import BackendClient, BackendUnavailable
from frontend.direct import connect_address
from protocol.codec import backend_codec
from protocol.control import HelloRequest
from protocol.generate import AbortRequest, DeltasEvent
from tests.unit.fake_backend import WAIT_S, FakeBackend, delta, make_client, start_stream, wait_until


@pytest.mark.parametrize("backend,endpoint,address", [
    ("tcp://10.1.2.3:5555", "tcp://0.0.0.0:5556", "tcp://10.1.2.3:5556"),  # our host for it, its port
    ("tcp://backend.local:5555", "tcp://127.0.0.1:7000", "tcp://backend.local:7000"),
    ("tcp://[::1]:5555", "tcp://[::1]:5556", "tcp://[::1]:5556"),
    ("ipc:///tmp/p/backend.ipc", "ipc:///tmp/p/backend.ipc.deltas", "ipc:///tmp/p/backend.ipc.deltas"),
])
def test_where_the_frontend_reaches_the_processor(backend, endpoint, address):
    assert connect_address(backend, endpoint) == address


class FakeProcessor:
    """The processor's ROUTER: counts the Hellos, sends to whoever said one."""

    def __init__(self, endpoint: str) -> None:
        self.hellos: list[bytes] = []
        self._codec = backend_codec()
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            assert isinstance(self._codec.decode(payload), HelloRequest)
            self.hellos.append(identity)

    async def send(self, msg) -> None:
        await self._sock.send_multipart([self.hellos[-1], self._codec.encode(msg)])

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
async def pair(tmp_path) -> AsyncIterator[tuple[BackendClient, FakeBackend, FakeProcessor]]:
    address, endpoint = f"ipc://{tmp_path}/backend.ipc", f"ipc://{tmp_path}/backend.ipc.deltas"
    backend, processor = FakeBackend(address, deltas_endpoint=endpoint), FakeProcessor(endpoint)
    client = make_client(address)
    await client.start()
    try:
        await wait_until(lambda: client.is_alive and len(processor.hellos) >= 2, what="handshake and two Hellos")
        yield client, backend, processor
    finally:
        await client.close()
        await processor.close()
        await backend.close()


async def test_the_client_says_hello_at_each_pong_and_reads_its_deltas_there(pair):
    client, backend, processor = pair
    assert set(processor.hellos) == {backend.peer}  # its one routing id on both connections
    assert client.direct is not None and client.direct.is_connected
    req, task = await start_stream(client, backend)
    await processor.send(DeltasEvent(deltas=[delta(req.rid, "a"), delta(req.rid, "b", "length")]))
    assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["a", "b"]
    assert client.direct.num_messages == 1


async def test_a_lost_second_connection_fails_the_streams_and_aborts_them_on_return(pair):
    client, backend, processor = pair
    req, task = await start_stream(client, backend)
    await processor.close()  # the processor is gone: what it had in flight for us with it
    with pytest.raises(BackendUnavailable, match="disconnected"):
        await asyncio.wait_for(task, WAIT_S)
    await wait_until(lambda: client.is_alive, what="up again on the next pong")
    assert await backend.expect(AbortRequest) == AbortRequest(rids=[req.rid])


async def test_the_client_keeps_one_connection_while_the_endpoint_stays(pair):
    client, backend, _ = pair
    first = client.direct
    backend.instance_id = "inst-2"  # a restarted backend: a new handshake, the same endpoint
    await wait_until(lambda: backend.num_hellos >= 2 and client.is_alive, what="second handshake")
    assert client.direct is first
