"""Unit tests for frontend.backend_client's two speeds of down: a backend whose connection stays up but whose pings go
unanswered (its Python held up, e.g. the GIL in a JIT compile) keeps its streams and takes new requests until
backend_busy_s; a lost connection fails the streams at once. Uses the fake backend of test_backend_client."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frontend.backend_client import BackendUnavailable
from frontend.metrics import FrontendMetrics
from protocol.generate import DeltasEvent, GenerateRequest
from tests.unit.fake_backend import (
    BACKEND_TIMEOUT_S,
    WAIT_S,
    FakeBackend,
    collect,
    delta,
    make_client,
    request,
    start_stream,
    wait_until,
)

# Far longer than any wait below: the busy backend must not be given up on within these tests.
LONG_BUSY_S = 60.0


def _scrape(metrics: FrontendMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("pocserve_backend_")}


@pytest.fixture
async def patient_client(address, backend):
    c = make_client(address, busy_s=LONG_BUSY_S)
    await c.start()
    await wait_until(lambda: c.is_alive, what="handshake")
    yield c
    await c.close()


async def test_a_connected_backend_that_stops_answering_keeps_its_streams(patient_client, backend):
    client = patient_client
    metrics = FrontendMetrics(client)
    req, task = await start_stream(client, backend)
    assert _scrape(metrics)["pocserve_backend_busy"] == 0
    backend.is_answering = False
    await wait_until(lambda: client.is_busy, what="busy")
    # Busy, not down: an alert can tell the two apart.
    scraped = _scrape(metrics)
    assert scraped["pocserve_backend_up"] == 1 and scraped["pocserve_backend_busy"] == 1
    assert scraped["pocserve_backend_busy_spells_total"] == 1
    silent_from = time.monotonic()
    # Several ping timeouts pass: before this change each was a miss, and the first one failed the stream.
    await wait_until(lambda: time.monotonic() - silent_from > 3 * BACKEND_TIMEOUT_S, what="pings missed")
    assert client.is_alive and not client.is_breaker_open and not task.done()

    second = request(client)  # a new request is sent, not refused: it waits in the backend's queue
    second_task = asyncio.create_task(collect(client, second))
    assert await backend.expect(GenerateRequest) == second

    backend.is_answering = True
    await wait_until(lambda: not client.is_busy, what="answering again")
    scraped = _scrape(metrics)
    assert scraped["pocserve_backend_busy"] == 0 and scraped["pocserve_backend_busy_spells_total"] == 1
    assert scraped["pocserve_backend_busy_seconds_total"] > 3 * BACKEND_TIMEOUT_S  # the silence waited above
    await backend.send(DeltasEvent(deltas=[delta(req.rid, "late", "stop"), delta(second.rid, "too", "stop")]))
    assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["late"]
    assert [d.text for d in await asyncio.wait_for(second_task, WAIT_S)] == ["too"]


async def test_a_lost_connection_fails_the_streams_at_once(address, patient_client, backend):
    client = patient_client
    _, task = await start_stream(client, backend)
    closed_at = time.monotonic()
    await backend.close()  # the process is gone: its socket closes
    with pytest.raises(BackendUnavailable, match="disconnected"):
        await asyncio.wait_for(task, WAIT_S)
    assert time.monotonic() - closed_at < LONG_BUSY_S / 2  # not the busy window's wait
    assert not client.is_alive

    again = FakeBackend(address, instance_id="inst-2")  # a restarted process: a new instance
    try:
        await wait_until(lambda: client.is_alive, what="reconnect")
        req, task = await start_stream(client, again)
        await again.send(DeltasEvent(deltas=[delta(req.rid, "back", "stop")]))
        assert [d.text for d in await asyncio.wait_for(task, WAIT_S)] == ["back"]
    finally:
        await again.close()


async def test_a_backend_silent_past_the_busy_window_is_down(address, backend):
    client = make_client(address)  # busy_s: fake_backend.BUSY_S
    await client.start()
    try:
        await wait_until(lambda: client.is_alive, what="handshake")
        _, task = await start_stream(client, backend)
        backend.is_answering = False
        await wait_until(lambda: client.is_busy, what="busy")
        with pytest.raises(BackendUnavailable, match="unreachable"):
            await asyncio.wait_for(task, WAIT_S)
        assert not client.is_alive and not client.is_busy
    finally:
        await client.close()

