"""CURVE on the ZMQ link: an authorised frontend is served; an unknown key and a plaintext frontend are refused,
logged and counted, and neither crashes anything.

The socket-level tests run a SocketServer with its CurveGate and no engine (fast); the process tests share ONE
CURVE backend on tcp loopback with three frontends started beside it: authorised, unknown key, no CURVE.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import zmq
import zmq.auth

from backend.startup import settings as backend_settings
from backend.transport.control import ControlPlane
from backend.transport.curve import CurveGate
from backend.transport.server import SocketServer, is_exposed
from common.curve import set_client_keys
from common.curve_keys import create_key_pair
from frontend import settings as frontend_settings
from frontend.backend_client import BackendClient
from protocol.codec import frontend_codec
from protocol.control import PingRequest, PongReply
from tests.integration.pow_util import metric
from tests.stack import REPO, Proc, backend_args, free_port, frontend_args, wait_healthy, wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass(frozen=True)
class Keys:
    backend_secret: Path
    backend_public: Path
    clients_dir: Path
    good_secret: Path
    rogue_secret: Path

    def public_key(self, secret_file: Path) -> str:
        return zmq.auth.load_certificate(secret_file)[0].decode()

    def backend_flags(self) -> list[str]:
        return ["--curve-server-secret-key-file", str(self.backend_secret),
                "--curve-clients-dir", str(self.clients_dir)]

    def frontend_flags(self, secret: Path) -> list[str]:
        return ["--curve-client-secret-key-file", str(secret),
                "--curve-server-public-key-file", str(self.backend_public)]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Keys:
    root = tmp_path_factory.mktemp("curve-keys")
    backend_public, backend_secret = create_key_pair(root / "backend", "backend")
    good_public, good_secret = create_key_pair(root / "good", "good")
    _, rogue_secret = create_key_pair(root / "rogue", "rogue")
    clients = root / "clients"
    clients.mkdir()
    (clients / "good.key").write_bytes(good_public.read_bytes())
    return Keys(backend_secret, backend_public, clients, good_secret, rogue_secret)


# --- SocketServer + CurveGate, no engine ---

def _server(address: str, keys: Keys, clients_dir: Path | None = None,
            reload_interval_s: float = 5.0) -> tuple[zmq.Context, SocketServer, CurveGate]:
    flags = keys.backend_flags() if clients_dir is None else [
        "--curve-server-secret-key-file", str(keys.backend_secret), "--curve-clients-dir", str(clients_dir)]
    s = backend_settings.load_settings(["--address", address, *flags], {})
    ctx = zmq.Context()
    gate = CurveGate(s.curve_server_secret_key_file, s.curve_clients_dir, reload_interval_s=reload_interval_s)
    server = SocketServer(ctx, address, queue.Queue(), ControlPlane("inst-curve"), gate=gate)
    server.start()
    return ctx, server, gate


def _dealer(ctx: zmq.Context, address: str, keys: Keys, secret: Path | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if secret is not None:
        s = frontend_settings.load_settings(keys.frontend_flags(secret), {})
        set_client_keys(sock, s.curve_client_secret_key_file, s.curve_server_public_key_file)
    sock.connect(address)
    return sock


def _is_answered(sock: zmq.Socket, timeout_ms: int) -> bool:
    try:
        sock.send(frontend_codec().encode(PingRequest(ping_id=1)), zmq.NOBLOCK)
    except zmq.Again:
        return False  # a refused connection is dropped: the DEALER has no peer to queue for
    return sock.poll(timeout_ms) != 0 and isinstance(frontend_codec().decode(sock.recv()), PongReply)


@pytest.mark.parametrize("scheme", ["ipc", "tcp"])
def test_curve_socket_server_admits_only_authorised_keys(keys, tmp_path, scheme):
    # ipc:// is allowed with CURVE on purpose: the handshake is the same ZMTP one as on tcp://.
    address = f"ipc://{tmp_path}/b.ipc" if scheme == "ipc" else f"tcp://127.0.0.1:{free_port()}"
    ctx, server, gate = _server(address, keys)
    socks = [_dealer(ctx, address, keys, keys.good_secret)]
    try:
        assert _is_answered(socks[0], 3000)
        # One at a time: a plaintext peer may be refused more than once (libzmq retries it after some failures).
        for secret in (keys.rogue_secret, None):
            before = gate.num_curve_refusals
            socks.append(_dealer(ctx, address, keys, secret))
            wait_until(lambda n=before: gate.num_curve_refusals > n, what=f"the peer with {secret} refused")
            assert not _is_answered(socks[-1], 300)
        assert server.num_rejected_frames == 0  # refused at the handshake: no frame of theirs got in
        assert _is_answered(socks[0], 3000)
    finally:
        for sock in socks:
            sock.close()
        server.stop()
        ctx.term()


def _own_clients_dir(keys: Keys, tmp_path: Path) -> Path:
    clients = tmp_path / "clients"
    clients.mkdir()
    (clients / "good.key").write_bytes((keys.clients_dir / "good.key").read_bytes())
    return clients


def _public_file(secret: Path) -> Path:
    return secret.with_name(secret.name.removesuffix("_secret"))


def test_curve_clients_dir_is_reloaded_key_added_then_revoked(keys, tmp_path):
    address = f"ipc://{tmp_path}/b.ipc"
    clients = _own_clients_dir(keys, tmp_path)
    ctx, server, gate = _server(address, keys, clients, reload_interval_s=0.1)
    socks = []
    try:
        socks.append(_dealer(ctx, address, keys, keys.rogue_secret))
        wait_until(lambda: gate.num_curve_refusals >= 1, what="the unknown key refused")
        (clients / "rogue.key").write_bytes(_public_file(keys.rogue_secret).read_bytes())
        wait_until(lambda: gate.num_client_keys == 2, what="the added key loaded")
        socks.append(_dealer(ctx, address, keys, keys.rogue_secret))
        assert _is_answered(socks[-1], 3000), "an added key is admitted without a restart"
        (clients / "rogue.key").unlink()
        wait_until(lambda: gate.num_client_keys == 1, what="the removed key dropped")
        before = gate.num_curve_refusals
        socks.append(_dealer(ctx, address, keys, keys.rogue_secret))
        wait_until(lambda: gate.num_curve_refusals > before, what="a new connection with the removed key refused")
        # The connection admitted before the removal is refused frame by frame (its ZAP user id is the key).
        before = gate.num_curve_refusals
        assert not _is_answered(socks[1], 500), "a revoked key's open connection is no longer served"
        assert gate.num_curve_refusals == before + 1 and server.num_rejected_frames == 0
        socks.append(_dealer(ctx, address, keys, keys.good_secret))
        assert _is_answered(socks[-1], 3000), "other keys are unaffected"
    finally:
        for sock in socks:
            sock.close()
        server.stop()
        ctx.term()


def test_curve_clients_dir_with_a_bad_file_keeps_the_last_good_keys(keys, tmp_path):
    address = f"ipc://{tmp_path}/b.ipc"
    clients = _own_clients_dir(keys, tmp_path)
    ctx, server, gate = _server(address, keys, clients, reload_interval_s=0.1)
    try:
        (clients / "half-written.key").write_text("not a key file")
        time.sleep(0.5)  # several reloads, each failing on that file
        (clients / "rogue.key").write_bytes(_public_file(keys.rogue_secret).read_bytes())
        time.sleep(0.3)
        assert gate.num_client_keys == 1, "a directory with a bad file changes nothing"
        sock = _dealer(ctx, address, keys, keys.good_secret)
        assert _is_answered(sock, 3000)
        sock.close()
        (clients / "half-written.key").unlink()
        wait_until(lambda: gate.num_client_keys == 2, what="the directory usable again")
    finally:
        server.stop()
        ctx.term()


def _rogue_client(address: str, keys: Keys) -> BackendClient:
    """A frontend's client holding the key the backend does not know (yet); fast timings, retries every 0.2 s."""
    s = frontend_settings.load_settings(keys.frontend_flags(keys.rogue_secret), {})
    return BackendClient(address, "fe-rogue", ping_interval_s=0.05, backend_timeout_s=0.2, backend_wait_s=0.2,
                         curve_keys=s.curve_client_secret_key_file, curve_server_key=s.curve_server_public_key_file,
                         refused_retry_s=0.2)


async def test_curve_refused_frontend_gets_in_once_its_key_is_authorised(keys, tmp_path):
    address = f"ipc://{tmp_path}/b.ipc"
    clients = _own_clients_dir(keys, tmp_path)
    ctx, server, _gate = _server(address, keys, clients, reload_interval_s=0.1)
    client = _rogue_client(address, keys)
    await client.start()
    try:
        deadline = time.monotonic() + 10
        while client.handshakes.num_refused < 1:
            assert time.monotonic() < deadline, "never refused"
            await asyncio.sleep(0.05)
        (clients / "rogue.key").write_bytes(_public_file(keys.rogue_secret).read_bytes())
        while client.stats is None:  # pongs: the backend answers it now, neither side restarted
            assert time.monotonic() < deadline, "the authorised frontend never got in"
            await asyncio.sleep(0.05)
    finally:
        await client.close()
        server.stop()
        ctx.term()


async def test_curve_refused_client_logs_and_retries(keys, tmp_path):
    address = f"ipc://{tmp_path}/b.ipc"
    ctx, server, gate = _server(address, keys)
    client = _rogue_client(address, keys)
    await client.start()
    try:
        deadline = time.monotonic() + 10
        while client.handshakes.num_refused < 3 or gate.num_curve_refusals < 3:
            assert time.monotonic() < deadline, "refused handshakes were not retried"
            await asyncio.sleep(0.05)
        assert not client.is_alive and client.fingerprint is None
    finally:
        await client.close()
        server.stop()
        ctx.term()


# --- real processes: one CURVE backend on tcp loopback, three frontends ---

@dataclass
class Frontend:
    proc: Proc
    url: str


@dataclass
class CurveStack:
    backend: Proc
    good: Frontend
    rogue: Frontend
    plain: Frontend


def _events(proc: Proc, event: str) -> list[dict]:
    """The backend's or a frontend's JSON log records of one event."""
    out = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line not written by structlog (C libraries, warnings)
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


@pytest.fixture(scope="module")
def curve(model_dir, keys, tmp_path_factory) -> Iterator[CurveStack]:
    work = tmp_path_factory.mktemp("curve")
    address = f"tcp://127.0.0.1:{free_port()}"
    backend = Proc(backend_args(model_dir, address, "--state-dir", str(work / "state"), "--log-format", "json",
                                *keys.backend_flags()), work / "backend.log").start()
    frontends = {}
    # Started with the backend so that their start-up overlaps its engine load.
    for name, flags in (("good", keys.frontend_flags(keys.good_secret)),
                        ("rogue", keys.frontend_flags(keys.rogue_secret)), ("plain", [])):
        port = free_port()
        proc = Proc(frontend_args(address, port, "--log-format", "json", *flags), work / f"{name}.log").start()
        frontends[name] = Frontend(proc, f"http://127.0.0.1:{port}")
    try:
        wait_healthy(frontends["good"].url, frontends["good"].proc, backend)
        yield CurveStack(backend, **frontends)
    finally:
        for fe in frontends.values():
            fe.proc.stop()
        backend.stop()


def _assert_refused_over_http(fe: Frontend) -> None:
    """Up and answering, but never healthy: /health is red and chat answers 503."""
    wait_until(lambda: _status(f"{fe.url}/health") is not None, what=f"{fe.url} answering")
    assert fe.proc.proc.poll() is None, fe.proc.tail()
    health = httpx.get(f"{fe.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["reason"] == "backend unavailable"
    r = httpx.post(f"{fe.url}/v1/chat/completions", json=CHAT, timeout=10)
    assert r.status_code == 503, r.text


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return None


def test_curve_authorised_frontend_serves_chat(curve, keys):
    bound = _events(curve.backend, "backend_socket_bound")
    assert bound and bound[0]["curve"] is True and bound[0]["num_client_keys"] == 1
    assert httpx.get(f"{curve.good.url}/health", timeout=5).status_code == 200
    r = httpx.post(f"{curve.good.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0
    accepted = [e["public_key"] for e in _events(curve.backend, "curve_peer_accepted")]
    assert keys.public_key(keys.good_secret) in accepted
    # Its second connection, to the processor's own socket (backend/processor/direct.py), through the same gate.
    direct = _events(curve.backend, "deltas_socket_bound")
    assert direct and direct[0]["curve"] is True
    wait_until(lambda: metric(curve.good.url, "pocserve_frontend_direct_connected") == 1,
               what="the good frontend's second connection up")
    assert metric(curve.rogue.url, "pocserve_frontend_direct_connected") == 0


def test_curve_unknown_key_is_refused_logged_and_counted(curve, keys):
    rogue_key = keys.public_key(keys.rogue_secret)
    _assert_refused_over_http(curve.rogue)
    refused = wait_until(lambda: [e for e in _events(curve.backend, "curve_peer_refused")
                                if e["public_key"] == rogue_key], what="the backend logging the refusal")
    assert refused[0]["address"] == "127.0.0.1" and refused[0]["num_refused"] >= 1
    said = wait_until(lambda: _events(curve.rogue.proc, "backend_handshake_refused"), what="the frontend's log")
    assert said[0]["public_key"] == rogue_key and "does not authorise" in said[0]["reason"]
    assert curve.rogue.proc.proc.poll() is None and curve.backend.proc.poll() is None
    # Counted in /metrics too: by the refused frontend itself, and by the backend (seen through a good frontend).
    assert metric(curve.rogue.url, "pocserve_frontend_curve_refusals_total") >= 1
    wait_until(lambda: metric(curve.good.url, "pocserve_backend_curve_refusals_total") >= 1,
             what="the backend's refusals in the good frontend's /metrics")


def test_curve_plaintext_frontend_is_refused_and_backend_keeps_serving(curve):
    _assert_refused_over_http(curve.plain)
    failed = wait_until(lambda: _events(curve.backend, "curve_handshake_failed"), what="the backend's log")
    assert "does not speak CURVE" in failed[0]["reason"] and failed[0]["num_refused"] >= 1
    said = wait_until(lambda: _events(curve.plain.proc, "backend_handshake_refused"), what="the frontend's log")
    assert "one side only" in said[0]["reason"] and said[0]["public_key"] is None
    assert curve.plain.proc.proc.poll() is None and curve.backend.proc.poll() is None
    r = httpx.post(f"{curve.good.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("module,flag", [("backend", "--curve-server-secret-key-file"),
                                         ("frontend", "--curve-client-secret-key-file")])
def test_curve_missing_key_file_exits_2_naming_setting_and_path(tmp_path, keys, module, flag):
    missing = tmp_path / "nope.key_secret"
    pair = (["--curve-clients-dir", str(keys.clients_dir)] if module == "backend"
            else ["--curve-server-public-key-file", str(keys.backend_public)])
    proc = subprocess.run([sys.executable, "-m", module, flag, str(missing), *pair], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and str(missing) in lines[0], proc.stderr


@pytest.mark.parametrize("address,expected", [
    ("tcp://127.0.0.1:5555", False), ("tcp://localhost:5555", False), ("tcp://[::1]:5555", False),
    ("ipc:///tmp/b.ipc", False), ("tcp://0.0.0.0:5555", True), ("tcp://10.0.0.5:5555", True),
    ("tcp://backend:5555", True), ("tcp://*:5555", True),
])
def test_curve_plaintext_warning_only_for_exposed_tcp(address, expected):
    assert is_exposed(address) is expected
