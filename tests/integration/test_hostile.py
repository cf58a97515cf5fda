"""A hostile client against the real stack (issue 33): the requests that used to freeze every stream for seconds,
idle and half-sent connections by the thousand, and error bodies that listed everything sent.

Bounded in time: each test takes seconds. Nothing here asserts a speed: where a stall is checked, the bound is
derived from what the test itself observes (the hostile request's own duration), so a busy machine slows both
sides alike, and a stall must show in each of ATTEMPTS measurements to count. The figures against the target (a
normal chat's TTFT within 2 x idle + 50 ms) are bench/stall.py's.
Schema-driven fuzzing of every route is tests/integration/test_http_sweep.py (schemathesis, in `make test`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import resource
import socket
import threading
import time

import httpx
import pytest

from bench.stall import post_raw
from tests.stack import LONG_MAX_TOKENS, MAX_MODEL_LEN, Proc, free_port, frontend_args, wait_healthy

EMPTY = {"role": "user", "content": ""}


class Stream:
    """A long chat stream read on a thread, recording when each event came, until closed (which aborts it)."""

    def __init__(self, base_url: str, model: str) -> None:
        self.times: list[float] = []
        self._stop = threading.Event()
        self._started = threading.Event()
        body = {"model": model, "stream": True, "ignore_eos": True, "max_tokens": LONG_MAX_TOKENS,
                "messages": [{"role": "user", "content": "Tell me a long story."}]}
        self._thread = threading.Thread(target=self._read, args=(base_url, body), daemon=True)
        self._thread.start()
        assert self._started.wait(60), "the stream never started"

    def _read(self, base_url: str, body: dict) -> None:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    self.times.append(time.monotonic())
                    self._started.set()
                if self._stop.is_set():
                    return

    def largest_gap(self, start: float, end: float) -> float:
        during = [t for t in self.times if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(during)), default=end - start)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _probe_ttft(http: httpx.Client, base_url: str, model: str) -> float:
    started = time.monotonic()
    body = {"model": model, "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with http.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                return time.monotonic() - started
    raise AssertionError("no event")


# How many times a stall is measured before it counts. Work done inline on the loop that serves the streams holds
# their output for most of every attempt; a machine shared with other work (2 cores in CI) also makes stalls of
# half a short request now and then (233 ms of 463 ms seen, with every chat beside it as slow: the whole stack was
# starved for that moment, and the stream's gaps right after were 26 ms). Those pass on the next attempt.
ATTEMPTS = 3


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"max_tokens": 4, "messages": [EMPTY] * 500_000}, "messages"),
    ("/tokenize", {"messages": [EMPTY] * 900_000}, "messages"),
    ("/detokenize", {"tokens": [1] * 10_000_000}, "tokens"),
    # Within every count limit (as many messages as the context, 426k characters of the 475k the text bound
    # allows), so templated and tokenized on the processor's tokenize thread, then refused by its token count:
    # the bounded work that still goes off the streams' path (a second or so here).
    ("/v1/chat/completions", {"max_tokens": 4, "messages": [{"role": "user", "content": "ab " * 33 + "c"}]
                              * MAX_MODEL_LEN}, "messages"),
], ids=["chat 500k empty messages", "tokenize 900k empty messages", "detokenize 10M ids", "chat at the limit"])
def test_a_huge_request_is_refused_by_count_while_streams_go_on(stack, path, body, param):
    content = httpx.Request("POST", "http://x", json={"model": stack.model, **body}).read()
    stalls = []
    for _ in range(ATTEMPTS):
        outcome, gap, took, gap_after = _hostile_beside_a_stream(stack, path, content)
        assert outcome["status"] == 400 and outcome["error"]["param"] == param, outcome
        assert outcome["size"] < 1000  # an error body, not a listing of what was sent
        # Done inline on the loop that serves the streams, the request held their output for most of its own
        # duration (15-35 s before issue 33); off it, the stream's events keep coming, with no gap much past what
        # the machine's load alone makes right after.
        if gap < max(took / 2, 3 * gap_after):
            return
        stalls.append((round(gap, 3), round(took, 3), round(gap_after, 3)))
    raise AssertionError(f"the stream stalled in every attempt (gap, request, gap after, in s): {stalls}")


def _hostile_beside_a_stream(stack, path: str, content: bytes) -> tuple[dict, float, float, float]:
    """The hostile request, with chats probed beside it, during a long stream: its answer, the stream's largest
    gap during it, its duration, and the stream's largest gap over as long a window right after."""
    http = httpx.Client()  # one for every probe (a client per probe costs this process an SSL context each)
    stream = Stream(stack.base_url, stack.model)
    # Beside the stream, before the hostile request (the first chat of a fresh stack also warms the engine up).
    before = min(_probe_ttft(http, stack.base_url, stack.model) for _ in range(3))
    probes: list[float] = []
    outcome: dict = {}

    def hostile() -> None:
        status, answer = post_raw(stack.base_url, path, content)
        outcome.update(status=status, error=json.loads(answer).get("error", {}), size=len(answer))

    try:
        started = time.monotonic()
        thread = threading.Thread(target=hostile)
        thread.start()
        while thread.is_alive():
            probes.append(_probe_ttft(http, stack.base_url, stack.model))
        thread.join()
        took = time.monotonic() - started
        gap = stream.largest_gap(started, started + took)
        # The same stream over as long a window right after: what this machine's load alone does to its gaps.
        time.sleep(took)
        gap_after = stream.largest_gap(started + took, started + 2 * took)
    finally:
        stream.close()
        http.close()
    print(f"\n{path} ({len(content) / 1e6:.1f} MB): {outcome.get('status')} in {took:.2f} s; the stream's largest "
          f"gap {1000 * gap:.0f} ms (after it: {1000 * gap_after:.0f} ms); {len(probes)} chats beside it, TTFT max "
          f"{1000 * max(probes, default=0):.0f} ms (before it: {1000 * before:.0f} ms)")
    return outcome, gap, took, gap_after


def test_out_of_vocabulary_stop_token_ids_get_a_short_error(stack):
    """vLLM's message lists every offending id: 100,000 of them made a 1.37 MB error body."""
    ids = list(range(10**6, 10**6 + 100_000))
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=120,
                   json={"model": stack.model, "max_tokens": 2, "stop_token_ids": ids, "messages": [EMPTY]})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "stop_token_ids" and len(r.content) < 2000, r.text[:300]
    assert "1000000" in err["message"] and "characters left out" in err["message"]


@pytest.fixture
def guarded_frontend(stack, tmp_path):
    """A frontend of its own on the shared backend, at the default descriptor limit (1,024), with a short
    header timeout so that reaping shows within the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # This process opens the 1,100 client sockets: it needs the room (raised, never lowered).
    if soft < 4096 and (hard == resource.RLIM_INFINITY or hard >= 4096):
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    elif soft < 4096:
        pytest.skip(f"the test process cannot open 1,100 sockets (descriptor limit {soft}/{hard})")
    port = free_port()

    proc = Proc(frontend_args(stack.address, port, "--header-timeout-s", "3"), tmp_path / "frontend.log")
    proc.args = ["-c", "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, "
                 "resource.getrlimit(resource.RLIMIT_NOFILE)[1])); sys.argv = ['frontend', *sys.argv[1:]]; "
                 "runpy.run_module('frontend', run_name='__main__')", *proc.args[2:]]
    proc.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, proc)
        yield base_url, port, proc
    finally:
        proc.stop()


def test_a_thousand_idle_connections_do_not_stop_health(stack, guarded_frontend):
    base_url, port, proc = guarded_frontend
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(1000)]
    half = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        half.append(s)
    try:
        # 1,100 open, past the cap at this limit (1,024 less 128): the longest idle made room for each newcomer.
        r = httpx.get(f"{base_url}/health", timeout=30)
        assert r.status_code == 200, r.text
        chat = httpx.post(f"{base_url}/v1/chat/completions", timeout=60,
                          json={"model": stack.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        # Then every one of them is closed by the header timeout: each read ends (EOF or reset), none hangs.
        for s in idle + half:
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1024) == b""
    finally:
        for s in idle + half:
            s.close()
    assert "Too many open files" not in proc.tail(200)
