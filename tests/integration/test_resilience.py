"""Disconnects, several frontends, and a backend that dies and comes back."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.prom import totals
from tests.stack import LONG_MAX_TOKENS, Proc, backend_args, free_port, frontend_args, wait_healthy

LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": LONG_MAX_TOKENS,
        "ignore_eos": True}


def _engine_stats(base_url: str) -> dict[str, float]:
    values = totals(httpx.get(f"{base_url}/metrics", timeout=5).text)
    return {name: values[name] for name in ("vllm:num_requests_running", "pocserve_backend_aborted_requests_total")
            if name in values}


def _wait_idle(base_url: str, timeout_s: float = 20.0) -> dict[str, float]:
    """Engine figures once idle; /metrics reflects the backend's last pong (0.5 s period), so an idle
    reading is confirmed by a second one a full period later before it counts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = _engine_stats(base_url)
        if stats.get("vllm:num_requests_running") == 0.0:
            time.sleep(0.6)
            again = _engine_stats(base_url)
            if again == stats:
                return stats
        time.sleep(0.1)
    raise AssertionError(f"engine still busy: {stats}")


def test_stream_disconnect_aborts_and_frees_engine(stack):
    before = _wait_idle(stack.base_url)["pocserve_backend_aborted_requests_total"]
    with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", timeout=30,
                      json={"model": stack.model, "stream": True, **LONG}) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream: closing the connection must abort in the backend
    after = _wait_idle(stack.base_url)
    assert after["pocserve_backend_aborted_requests_total"] == before + 1


def test_non_stream_disconnect_aborts_and_frees_engine(stack):
    before = _wait_idle(stack.base_url)["pocserve_backend_aborted_requests_total"]

    async def leave_early() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            task = asyncio.create_task(client.post(f"{stack.base_url}/v1/chat/completions",
                                                   json={"model": stack.model, **LONG}))
            deadline = time.monotonic() + 10
            while _engine_stats(stack.base_url).get("vllm:num_requests_running", 0) < 1:
                assert time.monotonic() < deadline, "request never started"
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(leave_early())
    after = _wait_idle(stack.base_url)
    assert after["pocserve_backend_aborted_requests_total"] == before + 1


def test_two_frontends_share_one_backend(stack, tmp_path):
    port = free_port()
    second = Proc(frontend_args(stack.address, port), tmp_path / "frontend2.log").start()
    try:
        url2 = f"http://127.0.0.1:{port}"
        wait_healthy(url2, second, timeout_s=60)
        body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "seed": 5, "temperature": 1.0, "ignore_eos": True}

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(*(c.post(f"{u}/v1/chat/completions", json=body)
                                              for u in (stack.base_url, url2) for _ in range(3)))

        responses = asyncio.run(both())
        assert [r.status_code for r in responses] == [200] * 6
        texts = {r.json()["choices"][0]["message"]["content"] for r in responses}
        assert len(texts) == 1  # same seed, same engine: every frontend gets the same answer
        fp1 = httpx.get(f"{stack.base_url}/version").json()["backend"]
        fp2 = httpx.get(f"{url2}/version").json()["backend"]
        assert fp1 == fp2
    finally:
        second.stop()


def test_backend_killed_then_restarted(model_dir, tmp_path):
    address = f"ipc://{tmp_path}/b.ipc"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    backend = Proc(backend_args(model_dir, address), tmp_path / "backend1.log").start()
    frontend = Proc(frontend_args(address, port), tmp_path / "frontend.log").start()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        wait_healthy(url, frontend, backend)
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200

        backend.kill()
        killed_at = time.monotonic()
        while httpx.get(f"{url}/health", timeout=2).status_code == 200:
            assert time.monotonic() - killed_at < 2.0, "/health still green 2 s after the backend died"
            time.sleep(0.05)
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5)
        assert r.status_code == 503 and time.monotonic() - killed_at < 2.0 + 1.5
        assert r.json()["error"]["code"] == 503
        time.sleep(2.0)  # let the breaker open: requests must now fail fast
        started = time.monotonic()
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).status_code == 503
        assert time.monotonic() - started < 0.5

        backend = Proc(backend_args(model_dir, address), tmp_path / "backend2.log").start()
        wait_healthy(url, frontend, backend)
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200
    finally:
        frontend.stop()
        backend.stop()


def test_engine_failure_sends_dead_sentinel_and_exits_nonzero(model_dir, tmp_path):
    """Fault injection: the engine raises on step 3 → frontends 503 and /health red, backend exits 1."""
    address = f"ipc://{tmp_path}/b.ipc"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    backend = Proc(backend_args(model_dir, address), tmp_path / "backend.log",
                   env={"POCSERVE_FAULT_FAIL_ON_STEP": "3"}).start()
    frontend = Proc(frontend_args(address, port), tmp_path / "frontend.log").start()
    try:
        wait_healthy(url, frontend, backend)
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 20, "ignore_eos": True})
        assert r.status_code == 503, r.text
        assert "died" in r.json()["error"]["message"]
        assert backend.proc.wait(30) == 1
        assert httpx.get(f"{url}/health", timeout=2).status_code == 503
        # The backend answered the pings of its last second with the sentinel too; the frontend says it once.
        assert frontend.log_path.read_text().count("backend_dead") == 1, frontend.tail()
    finally:
        frontend.stop()
        backend.stop()


def test_corrupt_state_file_is_a_clear_error_at_start(model_dir, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pocserve.db").write_bytes(b"this is not an sqlite database" * 10)
    backend = Proc(backend_args(model_dir, f"ipc://{tmp_path}/b.ipc", "--state-dir", str(tmp_path / "state")),
                   tmp_path / "backend.log").start()
    assert backend.proc.wait(60) == 2  # before the engine loads: no ~20 s wait
    assert "corrupt or not an SQLite database" in backend.tail()
