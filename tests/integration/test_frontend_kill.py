"""A frontend SIGKILLed mid-stream: the backend must abort that frontend's requests and free the engine.

Own backend and frontend (the frontend is killed, so not the shared stack). The backend is watched over its
own socket, like a frontend would (a ping answered by its io thread carries the engine's stats), because the
killed frontend's /metrics is gone with it.

"Well before the streams would have finished" is judged from what the test observes, not from fixed sizes: every
stream must end by an abort (none finished), and the tokens generated after the kill, divided by the rate measured
just before it, must fit in the detection window (timeout, one sweep, one ping interval) with slack for a busy
machine.

A SIGKILLed DEALER just disappears (libzmq tells the ROUTER nothing), so the backend infers the loss from silence:
frontends ping every 0.5 s, and a peer silent for --frontend-timeout-s is forgotten and its requests are aborted
(backend/transport/peers.py, ChatRequests.on_frontend_lost).
"""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import pytest

from protocol.common import BackendStats
from protocol.control import PingRequest, PongReply
from tests.backend_client import RawBackend
from tests.stack import LONG_MAX_TOKENS, Proc, backend_args, free_port, frontend_args, wait_healthy, wait_until

# Many streams, each as long as the test backend's context allows: the more streams
# share a step, the longer each takes to finish, so they outlast the detection window on fast machines too.
NUM_STREAMS = 16
MAX_TOKENS = LONG_MAX_TOKENS
# The least the backend accepts. Detection takes this, one sweep (a quarter of it) and up to one ping interval
# (the frontend's last ping may have come just before the kill).
FRONTEND_TIMEOUT_S = 1.0
PING_INTERVAL_S = 0.5
DETECTION_S = FRONTEND_TIMEOUT_S * 1.25 + PING_INTERVAL_S
# Generating after the kill is judged in seconds at the rate measured before it: the rate may double once the
# killed frontend's CPU is free, and the backend's chat counters come a quarter second late.
MAX_SECONDS_AFTER_KILL = 2 * DETECTION_S + 1.0
RATE_WINDOW_S = 1.0
# Only a bound for the polling below: on 2 shared cores a step may take long.
ABORT_WITHIN_S = DETECTION_S + 15.0

_ping_ids = itertools.count(1)


def engine_stats(raw: RawBackend, timeout_s: float = 10.0) -> BackendStats:
    ping_id = next(_ping_ids)
    raw.send(PingRequest(ping_id=ping_id))
    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not raw.sock.poll(left_ms):
            raise TimeoutError("backend did not answer the ping")
        msg = raw.codec.decode(raw.sock.recv())
        if isinstance(msg, PongReply) and msg.ping_id == ping_id:
            return msg.stats


def is_engine_ready(raw: RawBackend) -> bool:
    """Ready, and both the engine thread and the processor have reported: the test reads their parts."""
    try:
        stats = engine_stats(raw, timeout_s=2.0)
    except TimeoutError:
        return False  # still importing vLLM on a busy machine: the io thread may answer late
    return stats.link.is_engine_ready and stats.engine is not None and stats.chat is not None


def open_stream(base_url: str, num_events: list[int], i: int) -> None:
    """Reads one long stream until the connection breaks (the frontend is killed under it)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Write a long story, number {i}."}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    num_events[i] += 1
    except httpx.HTTPError:
        pass  # expected: the server died mid-stream


@pytest.fixture
def backend(model_dir, tmp_path):
    address = f"ipc://{tmp_path}/backend.ipc"
    proc = Proc(backend_args(model_dir, address, "--state-dir", str(tmp_path / "state"),
                             "--frontend-timeout-s", str(FRONTEND_TIMEOUT_S)), tmp_path / "backend.log").start()
    raw = RawBackend(address)
    try:
        wait_until(lambda: is_engine_ready(raw), 180.0, "engine ready")
        yield address, proc, raw
    finally:
        raw.close()
        proc.stop()


def test_frontend_kill_aborts_its_requests_and_frees_engine(backend, tmp_path):
    address, backend_proc, raw = backend
    port = free_port()
    frontend = Proc(frontend_args(address, port), tmp_path / "frontend1.log").start()
    base_url = f"http://127.0.0.1:{port}"
    wait_healthy(base_url, frontend, backend_proc)
    before = engine_stats(raw)
    num_events = [0] * NUM_STREAMS
    readers = [threading.Thread(target=open_stream, args=(base_url, num_events, i), daemon=True)
               for i in range(NUM_STREAMS)]
    for t in readers:
        t.start()
    wait_until(lambda: engine_stats(raw).engine.num_running == NUM_STREAMS and min(num_events) >= 3, 60.0,
             "all streams running")

    window_start, window_started_at = engine_stats(raw), time.monotonic()
    time.sleep(RATE_WINDOW_S)
    at_kill = engine_stats(raw)
    rate = (at_kill.chat.num_generation_tokens - window_start.chat.num_generation_tokens) / (
        time.monotonic() - window_started_at)
    tokens_left = NUM_STREAMS * MAX_TOKENS - (at_kill.chat.num_generation_tokens - before.chat.num_generation_tokens)
    frontend.kill()  # SIGKILL: no abort message, no socket close handshake, nothing flushed
    killed_at = time.monotonic()
    for t in readers:
        t.join(10)

    deadline = killed_at + ABORT_WITHIN_S
    stats = engine_stats(raw)
    while (stats.engine.num_running or stats.engine.num_waiting) and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = engine_stats(raw)
    idle_after_s = time.monotonic() - killed_at
    time.sleep(0.5)  # the processor's chat counters reach the pong within a quarter second
    generated_after_kill = engine_stats(raw).chat.num_generation_tokens - at_kill.chat.num_generation_tokens
    seconds_after_kill = generated_after_kill / rate
    figures = (f"idle after {idle_after_s:.1f} s; {generated_after_kill} of the {tokens_left} tokens left were "
               f"generated after the kill, {seconds_after_kill:.2f} s at the {rate:.0f} tokens/s measured before it; "
               f"running={stats.engine.num_running} waiting={stats.engine.num_waiting}, "
               f"aborted +{stats.engine.num_aborted_requests - before.engine.num_aborted_requests}")

    # A new frontend on the same backend serves a chat normally (checked first: it holds today as well).
    port2 = free_port()
    second = Proc(frontend_args(address, port2), tmp_path / "frontend2.log").start()
    try:
        url2 = f"http://127.0.0.1:{port2}"
        wait_healthy(url2, second, backend_proc, timeout_s=60)
        r = httpx.post(f"{url2}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
    finally:
        second.stop()

    assert stats.engine.num_running == 0 and stats.engine.num_waiting == 0, f"engine still busy: {figures}"
    # Every stream ended by an abort: none ran to max_tokens.
    assert stats.engine.num_aborted_requests - before.engine.num_aborted_requests == NUM_STREAMS, figures
    assert seconds_after_kill <= MAX_SECONDS_AFTER_KILL, f"aborted too late: {figures}"
    print(f"\nfrontend SIGKILL ({FRONTEND_TIMEOUT_S:g} s timeout): {figures}")
