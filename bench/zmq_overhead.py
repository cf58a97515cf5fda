"""Microbenchmark: what the frontend + ZMQ hop add to one request, against a trivial engine stand-in.

Four processes besides this one:
- a fake backend: the real `backend.transport.server.SocketServer` and `backend.transport.control.ControlPlane`,
  plus a thread that answers every GenerateRequest at once with one finishing 1-token DeltasEvent (no vLLM import);
- the real frontend (`python -m frontend`) connected to it;
- a bare FastAPI app (same uvicorn settings) with one route returning the same JSON without ZMQ: the baseline;
- a "floor" app: the bare app whose route also makes one round trip to the fake backend through the frontend's
  own BackendClient (no validation, conversion or shaping): what HTTP plus one ZMQ round trip costs with none of
  our route code, so ours − floor is that code and floor − bare the process boundary the architecture puts there.
The client sends N sequential non-streaming /v1/chat/completions over one kept-alive HTTP connection to each
(alternating blocks, so drift hits all alike) and reports p50/p90/p99; overhead = ours − bare. A fourth
series times the backend hop alone (a DEALER sending GenerateRequest to the fake backend, no HTTP), which
splits the overhead into backend + ZMQ and the frontend's own share. With --curve the ZMQ link (frontend and
the hop series) is CURVE-authenticated and encrypted, as the compose file runs it.

    .venv/bin/python -m bench.zmq_overhead [--num-requests 2000] [--curve] [--json OUT]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import shlex
import signal
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

from bench.load import percentile
from bench.procs import Proc, free_port, raise_on_signals, stop_all, wait_http_ok
from protocol.common import Fingerprint
from protocol.generate import Delta
from protocol.version import PROTOCOL_VERSION

MODEL = "bench"
# p50 of ours - bare that the frontend + ZMQ hop should stay under (issue 13).
TARGET_MS = 0.35
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                   "temperature": 0.0}).encode()


def completion(model: str) -> dict:
    """The JSON both servers answer: our chat route's non-streaming shape for a 1-token completion."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                         "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def fingerprint() -> Fingerprint:
    """What the fake backend says it serves."""
    return Fingerprint(protocol_version=PROTOCOL_VERSION, served_model_name=MODEL, model_path="/bench",
                       max_model_len=1024, block_size=16, dtype="bfloat16", vllm_version="none",
                       engine_device="none", poc_code_version="none")


def one_token_delta(rid: str) -> Delta:
    """The fake engine's whole answer to any generation."""
    return Delta(rid=rid, text="x", token_ids=[1], finish_reason="length", num_prompt_tokens=3,
                 num_generated_tokens=1)


def bare_app() -> FastAPI:
    """The baseline: the same route returning the same JSON, with no ZMQ and no validation."""
    app = FastAPI(title="bare")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        return completion(body["model"])

    @app.get("/health")
    async def health() -> dict:
        return {}

    return app


def floor_app(address: str, keys_dir: Path | None) -> FastAPI:
    """The bare app plus one backend round trip per request, through the frontend's BackendClient."""
    from contextlib import asynccontextmanager

    from frontend import settings as frontend_settings
    from frontend.backend_client import BackendClient
    from protocol.generate import ChatMessage, GenerateRequest, SamplingSpec

    s = frontend_settings.load_settings(curve_client_flags(keys_dir) if keys_dir else [], {})

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = BackendClient(address, "floor", curve_keys=s.curve_client_secret_key_file,
                               curve_server_key=s.curve_server_public_key_file)
        await client.start()
        app.state.client = client
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="floor", lifespan=lifespan)
    messages = [ChatMessage(role="user", content="hi")]

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        client = request.app.state.client
        req = GenerateRequest(rid=client.new_rid(), sampling=SamplingSpec(max_tokens=1), messages=messages)
        async for _ in client.generate(req):
            pass
        return completion(body["model"])

    @app.get("/health")
    async def health(request: Request) -> Response:
        return Response(status_code=200 if request.app.state.client.is_alive else 503)

    return app


def make_curve_keys(keys_dir: Path) -> None:
    """keys_dir/backend (its pair), keys_dir/frontend (one pair for the frontend and the hop timer), clients/."""
    from common.curve_keys import create_key_pair

    create_key_pair(keys_dir / "backend", "backend")
    frontend_public, _ = create_key_pair(keys_dir / "frontend", "frontend")
    (keys_dir / "clients").mkdir()
    (keys_dir / "clients" / "frontend.key").write_bytes(frontend_public.read_bytes())


def curve_client_flags(keys_dir: Path) -> list[str]:
    return ["--curve-client-secret-key-file", str(keys_dir / "frontend" / "frontend.key_secret"),
            "--curve-server-public-key-file", str(keys_dir / "backend" / "backend.key")]


def curve_server_flags(keys_dir: Path) -> list[str]:
    return ["--curve-server-secret-key-file", str(keys_dir / "backend" / "backend.key_secret"),
            "--curve-clients-dir", str(keys_dir / "clients")]


def serve_fake_backend(address: str, keys_dir: Path | None) -> None:
    import zmq

    from backend.startup import settings as backend_settings
    from backend.transport.control import ControlPlane
    from backend.transport.curve import CurveGate
    from backend.transport.server import SocketServer
    from common.logs import configure_logging
    from protocol.generate import DeltasEvent, GenerateRequest

    configure_logging("console", "warning")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    inbox: queue.Queue = queue.Queue()
    control = ControlPlane(instance_id=uuid.uuid4().hex)
    gate = None
    if keys_dir is not None:
        s = backend_settings.load_settings(curve_server_flags(keys_dir), {})
        gate = CurveGate(s.curve_server_secret_key_file, s.curve_clients_dir)
    server = SocketServer(zmq.Context.instance(), address, inbox, control, gate=gate)
    server.start()
    control.fingerprint = fingerprint()

    def answer() -> None:
        while not stopping.is_set():
            try:
                identity, msg = inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(msg, GenerateRequest):  # aborts and the rest need no answer here
                server.send(identity, DeltasEvent(deltas=[one_token_delta(msg.rid)]))

    worker = threading.Thread(target=answer, name="fake-engine", daemon=True)
    worker.start()
    while not stopping.wait(0.5):
        pass
    worker.join(1.0)
    server.stop()


def serve_app(app: FastAPI, port: int) -> None:
    import uvicorn

    from common.logs import configure_logging

    configure_logging("console", "info")  # as the frontend does (access log at WARNING)
    # The same uvicorn call as frontend/__main__.py.
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=5)


def time_block(conn: http.client.HTTPConnection, n: int, out: list[float]) -> None:
    headers = {"Content-Type": "application/json"}
    for _ in range(n):
        started = time.perf_counter()
        try:
            conn.request("POST", "/v1/chat/completions", BODY, headers)
            resp = conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # uvicorn drops a connection idle for 5 s (long blocks): reconnect, and time the retry instead.
            conn.close()
            started = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", BODY, headers)
            resp = conn.getresponse()
        data = resp.read()
        out.append(time.perf_counter() - started)
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")


def zmq_timer(address: str, keys_dir: Path | None):
    """Times the backend hop alone: a DEALER sends GenerateRequest and waits for the DeltasEvent (no HTTP)."""
    import zmq

    from common.curve import set_client_keys
    from common.sockets import make_socket
    from frontend import settings as frontend_settings
    from protocol.codec import frontend_codec
    from protocol.generate import ChatMessage, DeltasEvent, GenerateRequest, SamplingSpec

    sock = make_socket(zmq.Context.instance(), zmq.DEALER)
    if keys_dir is not None:
        s = frontend_settings.load_settings(curve_client_flags(keys_dir), {})
        set_client_keys(sock, s.curve_client_secret_key_file, s.curve_server_public_key_file)
    sock.connect(address)
    codec, rids = frontend_codec(), iter(range(1 << 62))
    messages = [ChatMessage(role="user", content="hi")]

    def time_zmq_block(n: int, out: list[float]) -> None:
        for _ in range(n):
            req = GenerateRequest(rid=f"z-{next(rids)}", sampling=SamplingSpec(max_tokens=1), messages=messages)
            started = time.perf_counter()
            sock.send(codec.encode(req))
            reply = codec.decode(sock.recv())
            out.append(time.perf_counter() - started)
            if not isinstance(reply, DeltasEvent):
                raise RuntimeError(f"unexpected reply {reply!r}")

    return time_zmq_block, sock.close


def stats_ms(xs: list[float]) -> dict:
    ms = [x * 1e3 for x in xs]
    return {"n": len(ms), "mean_ms": sum(ms) / len(ms), "p50_ms": percentile(ms, 50),
            "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99)}


def run(args: argparse.Namespace) -> dict:
    log_dir = args.log_dir
    address = f"ipc://{log_dir}/fake-backend.ipc"
    ours_port, bare_port, floor_port = free_port(), free_port(), free_port()
    me = ["-m", "bench.zmq_overhead"]
    keys_dir = log_dir / "keys" if args.curve else None
    if keys_dir is not None:
        make_curve_keys(keys_dir)
    backend_extra = ["--curve-keys-dir", str(keys_dir)] if keys_dir else []
    frontend_extra = curve_client_flags(keys_dir) if keys_dir else []
    procs: list[Proc] = []
    close_zmq = None
    try:
        procs.append(Proc("fake-backend", [*me, "--serve-fake-backend", address, *backend_extra],
                          log_dir / "fake-backend.log").start())
        procs.append(Proc("frontend", ["-m", "frontend", "--backend-address", address, "--port", str(ours_port),
                                       *frontend_extra], log_dir / "frontend.log").start())
        procs.append(Proc("bare", [*me, "--serve-bare", str(bare_port)], log_dir / "bare.log").start())
        procs.append(Proc("floor", [*me, "--serve-floor", str(floor_port), "--backend-address", address,
                                    *backend_extra], log_dir / "floor.log").start())
        ports = {"bare": bare_port, "floor": floor_port, "ours": ours_port}
        for port in ports.values():
            wait_http_ok(f"http://127.0.0.1:{port}/health", procs, 60.0)
        conns = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=10) for name, port in ports.items()}
        time_zmq_block, close_zmq = zmq_timer(address, keys_dir)
        timers = {name: (lambda n, out, conn=conn: time_block(conn, n, out)) for name, conn in conns.items()}
        timers["zmq"] = time_zmq_block
        samples: dict[str, list[float]] = {name: [] for name in timers}
        for timer in timers.values():
            timer(args.num_warmup, [])
        done = 0
        while done < args.num_requests:
            n = min(args.block, args.num_requests - done)
            for name, timer in timers.items():
                timer(n, samples[name])
            done += n
        for p in procs:
            p.check_running()
        return {name: stats_ms(xs) for name, xs in samples.items()}
    finally:
        if close_zmq is not None:
            close_zmq()
        stop_all(procs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=2000, help="timed requests per server")
    p.add_argument("--num-warmup", type=int, default=200)
    p.add_argument("--block", type=int, default=100, help="requests per alternating block")
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--device-note", default="")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--curve", action="store_true", help="CURVE on the ZMQ link, as in the compose file")
    p.add_argument("--serve-fake-backend", metavar="ADDRESS", help=argparse.SUPPRESS)
    p.add_argument("--curve-keys-dir", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-bare", metavar="PORT", type=int, help=argparse.SUPPRESS)
    p.add_argument("--serve-floor", metavar="PORT", type=int, help=argparse.SUPPRESS)
    p.add_argument("--backend-address", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_fake_backend:
        serve_fake_backend(args.serve_fake_backend, args.curve_keys_dir)
        return 0
    if args.serve_bare:
        serve_app(bare_app(), args.serve_bare)
        return 0
    if args.serve_floor:
        serve_app(floor_app(args.backend_address, args.curve_keys_dir), args.serve_floor)
        return 0
    raise_on_signals()
    args.log_dir = args.log_dir or Path(f"/tmp/pocserve-zmqbench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        figures = run(args)
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        return 130
    keys = ("mean_ms", "p50_ms", "p90_ms", "p99_ms")
    differences = {f"{a}-{b}": {k: figures[a][k] - figures[b][k] for k in keys}
                   for a, b in (("ours", "bare"), ("floor", "bare"), ("ours", "floor"))}
    overhead = differences["ours-bare"]
    print(f"{'':12}{'n':>7}{'mean ms':>10}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
    for name in ("bare", "floor", "ours", "zmq"):
        f = figures[name]
        print(f"{name:12}{f['n']:>7}" + "".join(f"{f[k]:>10.3f}" for k in keys))
    for name, d in differences.items():
        print(f"{name:12}{'':>7}" + "".join(f"{d[k]:>10.3f}" for k in keys))
    print("(floor: the bare app plus one BackendClient round trip; zmq: the backend hop alone, GenerateRequest ->"
          " DeltasEvent over a DEALER, no HTTP)" + ("; CURVE on" if args.curve else ""))
    verdict = "meets" if overhead["p50_ms"] < TARGET_MS else "MISSES"
    print(f"overhead p50 {overhead['p50_ms']:.3f} ms: {verdict} the < {TARGET_MS} ms target")
    if args.json is not None:
        out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device_note": args.device_note,
               "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version()},
               "command": shlex.join(["python", "-m", "bench.zmq_overhead", *(argv or sys.argv[1:])]),
               "config": {"num_requests": args.num_requests, "num_warmup": args.num_warmup, "block": args.block,
                          "curve": args.curve},
               "figures": figures, "overhead_ms": overhead, "differences_ms": differences}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
