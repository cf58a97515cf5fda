"""The frontend's own Python work per request, without sockets: our FastAPI app beside a bare one, called in-process.

Both apps get the same non-streaming chat body through ASGI directly (no HTTP server, no ZMQ). Ours runs every
middleware, the route, validation, conversion and shaping, with a backend client stand-in that answers at once;
the bare app is bench.zmq_overhead's (`await request.json()`, return a dict). What ours costs beyond the bare app
here is what the frontend's code adds; the rest of bench.zmq_overhead's figure is sockets and thread wake-ups.

    .venv/bin/python -m bench.frontend_cost [--requests 500] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from fastapi import FastAPI

from bench.zmq_overhead import BODY, bare_app, fingerprint, one_token_delta


class InstantBackend:
    """What the routes use of BackendClient; every generation is one finishing delta, at once."""

    is_alive = True
    stats = None
    handshakes = None
    num_malformed_replies = 0
    fingerprint = fingerprint()

    def __init__(self) -> None:
        self._num = 0

    def new_rid(self) -> str:
        self._num += 1
        return f"r-{self._num}"

    async def generate(self, req):
        yield one_token_delta(req.rid)


def our_app() -> FastAPI:
    from frontend.app import create_app
    from frontend.convert import TokenFormat
    from frontend.metrics import FrontendMetrics
    from frontend.settings import load_settings

    app = create_app(load_settings([], {}))
    backend = InstantBackend()  # what the lifespan would set up, without connecting anywhere
    app.state.client = backend
    app.state.metrics = FrontendMetrics(backend)
    app.state.token_format = TokenFormat(as_ids=True)
    return app


async def call(app: FastAPI) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(BODY)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)  # the client never leaves
        return {"type": "http.disconnect"}

    status = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"answered {status}")


async def measure(args) -> dict[str, list[float]]:
    apps = {"bare": bare_app(), "ours": our_app()}
    for app in apps.values():
        for _ in range(args.requests):
            await call(app)
    per_request_us: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(args.rounds):  # alternating rounds, so drift hits both alike
        for name, app in apps.items():
            started = time.perf_counter()
            for _ in range(args.requests):
                await call(app)
            per_request_us[name].append((time.perf_counter() - started) / args.requests * 1e6)
    return per_request_us


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=500, help="requests per round and app")
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    figures = asyncio.run(measure(args))
    for name, xs in figures.items():
        print(f"{name:5} µs/request: median {statistics.median(xs):7.1f}  min {min(xs):7.1f}")
    extra = statistics.median(figures["ours"]) - statistics.median(figures["bare"])
    print(f"ours - bare: {extra:.1f} µs/request of the frontend's own Python work (no sockets)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
