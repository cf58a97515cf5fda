"""The FastAPI application: lifespan owns the backend client; routes are thin."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI

from common.process import freeze_startup_heap
from frontend.auth import BearerGuard
from frontend.backend_client import BackendClient
from frontend.body import BodyWorker
from frontend.convert import TokenFormat
from frontend.errors import error_response, install_error_handlers
from frontend.metrics import FrontendMetrics
from frontend.openapi import install_openapi
from frontend.routes import health, openai, responses, tokenize
from frontend.routes.pow import make_pow_router
from frontend.settings import FrontendSettings


class RequestMetricsMiddleware:
    """Counts every HTTP response by route and status and times it (plain ASGI: no per-request task)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.monotonic(), 500

        async def send_wrapper(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = route.path if route is not None else "unmatched"
            metrics = scope["app"].state.metrics
            metrics.requests.labels(path, str(status)).inc()
            metrics.e2e_latency.labels(path).observe(time.monotonic() - started)
            if status == 503:
                metrics.backend_unavailable.inc()


class BodyLimitMiddleware:
    """Refuses request bodies over `max_bytes` with 413, by Content-Length or while streaming in."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        if length is not None:
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): read the body up to the limit, then hand it to the app in one piece.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away while sending
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        message = f"request body larger than {self.max_bytes} bytes"
        await error_response(413, message)(scope, receive, send)


def create_app(settings: FrontendSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = BackendClient(
            settings.backend_address, settings.frontend_id, ping_interval_s=settings.ping_interval_s,
            backend_timeout_s=settings.backend_timeout_s, backend_wait_s=settings.backend_wait_s,
            breaker_misses=settings.breaker_misses, backend_busy_s=settings.backend_busy_s,
            curve_keys=settings.curve_client_secret_key_file,
            curve_server_key=settings.curve_server_public_key_file)
        app.state.client = client
        app.state.metrics = FrontendMetrics(client)
        app.state.token_format = TokenFormat(as_ids=settings.logprob_token_format == "ids")
        app.state.body_worker.start()
        await client.start()
        structlog.get_logger(__name__).info("frontend_started", heap_frozen_objects=freeze_startup_heap())
        try:
            yield
        finally:
            await client.close()
            app.state.body_worker.close()

    app = FastAPI(title="pocserve", version="0.1.0", lifespan=lifespan)
    # Set here, not in the lifespan: the routes read it, and tests and benches drive the app without one.
    app.state.is_prompt_details = settings.enable_prompt_tokens_details
    app.state.body_worker = BodyWorker()  # started by the lifespan, or by the first large body without one
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(tokenize.router)
    app.include_router(health.router)
    app.include_router(make_pow_router(settings))

    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    # Outside the body limit, so a request without its token is refused before its body is read. The OpenAI
    # routes take vLLM's --api-key (as vLLM does, every /v1 path); the PoC routes have their own token.
    guards = [("/v1", settings.api_key), ("/api/v1/pow", settings.pow_api_token)]
    if any(token for _, token in guards):  # none set: no middleware, nothing to pay per request
        app.add_middleware(BearerGuard, guards=guards)
    app.add_middleware(RequestMetricsMiddleware)
    return app
