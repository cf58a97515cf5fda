"""Operational routes: /health, /version, /metrics."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from frontend.backend_errors import BackendRequestError, BackendUnavailable
from protocol.control import MetricsRequest
from protocol.version import PROTOCOL_VERSION

router = APIRouter()

FRONTEND_VERSION = "0.1.0"


class Unhealthy(BaseModel):
    status: str
    reason: str


@router.get("/health", response_class=Response, responses={
    200: {"description": "The backend answers pings and its handshake holds; empty body."},
    503: {"model": Unhealthy, "description": "The backend is unreachable, not ready or incompatible."}})
async def health(request: Request) -> Response:
    """200 only while the backend handshake is alive (mlnode polls this every 2 s)."""
    client = request.app.state.client
    if client.is_alive:
        return Response(status_code=200)
    reason = client.incompatible or "backend unavailable"
    return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)


@router.get("/version")
async def version(request: Request) -> dict:
    fp = request.app.state.client.fingerprint
    return {"version": FRONTEND_VERSION, "protocol_version": PROTOCOL_VERSION,
            "backend": msgspec.structs.asdict(fp) if fp is not None else None}


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text format."}})
async def metrics(request: Request) -> Response:
    """This frontend's series, the engine thread's (heartbeat) series, then vLLM's own families from the
    backend's processor process (frontend/metrics.py says which come from where)."""
    ours = generate_latest(request.app.state.metrics.registry)
    return Response(ours + await _vllm_metrics(request.app.state.client), media_type=CONTENT_TYPE_LATEST)


async def _vllm_metrics(client) -> bytes:
    """The vllm:* families vLLM's stat logger keeps in the backend's processor, as Prometheus text; empty when the
    backend is down or does not answer within the backend timeout (the scrape goes on without them)."""
    if not client.is_alive:
        return b""
    try:
        reply = await client.call(MetricsRequest(rid=client.new_rid()), client.backend_timeout_s)
    except (BackendUnavailable, BackendRequestError):
        return b""
    return reply.text
