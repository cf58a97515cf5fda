"""Helpers for the /api/v1/pow integration tests: a real callback receiver, request bodies, polling, vectors."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np

from bench.prom import totals
from tests.stack import (  # noqa: F401
    LONG_MAX_TOKENS,
    Proc,
    backend_args,
    free_port,
    frontend_args,
    wait_healthy,
    wait_until,
)

MODEL = "tiny"
CALLBACK_BASE = f"/v2/poc-batches/{MODEL}"
ENCODING = {"dtype": "f16", "k_dim": 12, "endian": "le"}
GATE_BODY = {"error": {"message": "PoC generation is active. Inference requests are temporarily unavailable.",
                       "type": "service_unavailable", "param": None, "code": 503}}
GENERATED_KEYS = ["public_key", "block_hash", "block_height", "node_id", "artifacts", "encoding"]
JOB_GENERATED_KEYS = ["request_id", "block_hash", "block_height", "public_key", "node_id", "artifacts", "encoding"]
# The fork's fields, then the two the network's validator (the gonka_poc plugin) adds for nonces it could not score.
VALIDATED_KEYS = ["request_id", "block_hash", "block_height", "public_key", "node_id", "n_total", "n_mismatch",
                  "mismatch_nonces", "p_value", "fraud_detected", "n_excluded", "excluded_nonces"]


class Receiver:
    """The node's callback endpoint on loopback: records (path, body) of every POST it answered 200.

    `status` is what it answers (200, or 500 to simulate an outage); `num_failed` counts the POSTs refused."""

    def __init__(self) -> None:
        self.status = 200
        self.received: list[tuple[str, dict]] = []
        self.num_failed = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = receiver.status
                with receiver._lock:
                    if status < 400:
                        receiver.received.append((self.path, body))
                    else:
                        receiver.num_failed += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.root + CALLBACK_BASE
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def bodies(self, suffix: str) -> list[dict]:
        with self._lock:
            return [b for p, b in self.received if p == f"{CALLBACK_BASE}/{suffix}"]

    def by_request_id(self, request_id: str) -> list[tuple[str, dict]]:
        with self._lock:
            return [(p, b) for p, b in self.received if b.get("request_id") == request_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Server:
    """A backend + frontend pair of our own (not the shared `stack`)."""

    model_dir: Path
    work: Path
    address: str
    base_url: str
    backend_extra: tuple[str, ...]
    backend: Proc
    frontend: Proc
    num_backend_starts: int = 1

    @classmethod
    def start(cls, model_dir: Path, work: Path, *backend_extra: str, frontend_extra: tuple[str, ...] = ()) -> Server:
        address = f"ipc://{work}/backend.ipc"
        extra = ("--state-dir", str(work / "state"), *backend_extra)
        backend = Proc(backend_args(model_dir, address, *extra), work / "backend1.log").start()
        port = free_port()
        frontend = Proc(frontend_args(address, port, *frontend_extra), work / "frontend.log").start()
        server = cls(model_dir, work, address, f"http://127.0.0.1:{port}", extra, backend, frontend)
        try:
            wait_healthy(server.base_url, frontend, backend)
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def pow(self) -> str:
        return f"{self.base_url}/api/v1/pow"

    def restart_backend(self, *backend_extra: str) -> None:
        """SIGKILL the backend, then start a new one on the same address and state dir (with `backend_extra` in
        place of the first one's flags, where given)."""
        self.backend.kill()
        if backend_extra:
            self.backend_extra = ("--state-dir", str(self.work / "state"), *backend_extra)
        self.num_backend_starts += 1
        self.backend = Proc(backend_args(self.model_dir, self.address, *self.backend_extra),
                            self.work / f"backend{self.num_backend_starts}.log").start()

    def stop(self) -> None:
        self.frontend.stop()
        self.backend.stop()


def node(block_hash: str = "TEST_BLOCK", block_height: int = 100, public_key: str = "test_pub_keys",
         node_id: int = 0, node_count: int = 1) -> dict:
    return {"block_hash": block_hash, "block_height": block_height, "public_key": public_key,
            "node_id": node_id, "node_count": node_count}


def echoed(**kw) -> dict:
    """The identity fields a job callback echoes (node_count is not among them)."""
    fields = node(**kw)
    del fields["node_count"]
    return fields


def params(seq_len: int = 32, k_dim: int | None = None, model: str = MODEL) -> dict:
    p = {"model": model, "seq_len": seq_len}
    if k_dim is not None:
        p["k_dim"] = k_dim
    return p


def generate(pow_url: str, nonces: list[int], *, seq_len: int = 32, wait: bool = True, timeout_s: float = 120.0,
             headers: dict | None = None, **fields) -> httpx.Response:
    body = {**node(), "nonces": nonces, "params": params(seq_len), "batch_size": 4, "wait": wait}
    body.update(fields)
    return httpx.post(f"{pow_url}/generate", json=body, timeout=timeout_s, headers=headers)


def artifacts_of(pow_url: str, nonces: list[int], **kw) -> dict[int, str]:
    r = generate(pow_url, nonces, **kw)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed" and body["encoding"] == ENCODING, body
    return {a["nonce"]: a["vector_b64"] for a in body["artifacts"]}


def poll_job(pow_url: str, request_id: str, timeout_s: float = 90.0) -> dict:
    """GET /generate/{id} until the job is completed (or failed); returns the last body."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{pow_url}/generate/{request_id}", timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["request_id"] == request_id
        if body["status"] in ("completed", "failed"):
            return body
        assert time.monotonic() < deadline, f"job {request_id} still {body['status']}"
        time.sleep(0.1)


def status(pow_url: str, headers: dict | None = None) -> dict:
    r = httpx.get(f"{pow_url}/status", timeout=10, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def stop(pow_url: str, headers: dict | None = None) -> dict:
    r = httpx.post(f"{pow_url}/stop", timeout=60, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def metric(base_url: str, name: str) -> float:
    """One sample's value summed over its label sets."""
    values = totals(httpx.get(f"{base_url}/metrics", timeout=10).text)
    if name not in values:
        raise AssertionError(f"metric {name} not exported")
    return values[name]


# What every topology is held against the single-rank stack with (test_parallel.py, test_multinode.py): these
# nonces' artifacts at this seq_len, and the tokens of a greedy chat.
TOPOLOGY_NONCES = list(range(16))
TOPOLOGY_SEQ_LEN = 32
GREEDY_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 32,
               "temperature": 0.0, "ignore_eos": True, "logprobs": True}


def greedy_tokens(base_url: str) -> list[str]:
    """The logprob token strings (token ids in the default format) of GREEDY_CHAT."""
    r = httpx.post(f"{base_url}/v1/chat/completions", json=GREEDY_CHAT, timeout=120)
    assert r.status_code == 200, r.text
    return [p["token"] for p in r.json()["choices"][0]["logprobs"]["content"]]


def decode(vector_b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(vector_b64), dtype="<f2").astype(np.float32)


def encode(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f2").tobytes()).decode()


def l2(a: str, b: str) -> float:
    return float(np.linalg.norm(decode(a) - decode(b)))


def shifted(vector_b64: str, delta: float, index: int = 0) -> str:
    """The vector with `delta` added to one component: L2 to the original is |delta| (up to fp16 rounding)."""
    v = decode(vector_b64).copy()
    v[index] += delta
    return encode(v)


def negated(vector_b64: str) -> str:
    return encode(-decode(vector_b64))


def validation(arts: dict[int, str]) -> dict:
    return {"artifacts": [{"nonce": n, "vector_b64": v} for n, v in arts.items()]}


@contextmanager
def chat_holding_poc(base_url: str, model: str = MODEL, *, outlives_block: bool = True) -> Iterator[None]:
    """A long streaming chat for the duration: on a backend started with --chat-share 1, PoC work (jobs, a
    round's batches) runs only while chat is idle, so this holds every job where it is. The stream is closed
    (and so aborted) on exit; with `outlives_block` it must still have been running then (the hold held)."""
    started = threading.Event()
    closed = threading.Event()

    def run() -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "Tell a very long story."}],
                "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    started.set()
                if closed.is_set():
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60), "the holding chat did not start"
    try:
        yield
        assert not outlives_block or thread.is_alive(), "the holding chat ended before the test released it"
    finally:
        closed.set()
        thread.join(60)
