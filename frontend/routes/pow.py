"""Gonka PoC routes (/api/v1/pow/*): validate → convert → await the backend → shape the fork's response.

The backend decides everything (params check, gating, queue cap, round state); its ErrorInfo keeps its status
(409, 400, 404, 429, 503) through BackendRequestError. Shapes are the fork's (docs/architecture.md, "The network's
contract"; pinned by tests/unit/test_frontend_pow.py and tests/integration/test_pow_api.py).
"""

from __future__ import annotations

import asyncio

import msgspec
import structlog
from fastapi import APIRouter, Request

from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.body import OffloadRoute
from frontend.errors import ApiError
from frontend.openapi import errors
from frontend.pow_models import GenerateRequest, InitGenerateRequest
from frontend.settings import FrontendSettings
from protocol.common import Fingerprint
from protocol.pow import (
    JobView,
    PowJobReply,
    PowJobRequest,
    PowStatusReply,
    PowStatusRequest,
    PowStopRequest,
)

log = structlog.get_logger(__name__)

# Control calls are answered between engine steps; /stop may first flush callbacks for a few seconds.
CONTROL_TIMEOUT_S = 30.0

def job_result_fields(job: JobView) -> dict:
    """The stored result of a completed job: artifacts + encoding, or the validation outcome."""
    if job.validation is not None:
        v = job.validation
        return {"n_total": v.n_total, "n_mismatch": v.n_mismatch, "mismatch_nonces": v.mismatch_nonces,
                "p_value": v.p_value, "fraud_detected": v.fraud_detected, "n_excluded": v.n_excluded,
                "excluded_nonces": v.excluded_nonces}
    if job.artifacts is not None and job.encoding is not None:
        return {"artifacts": [{"nonce": a.nonce, "vector_b64": a.vector_b64} for a in job.artifacts],
                "encoding": msgspec.structs.asdict(job.encoding)}
    return {}


def job_body(job: JobView) -> dict:
    body = {"status": job.status, "request_id": job.job_id}
    if job.status == "completed":
        body.update(job_result_fields(job))
    elif job.status == "failed":
        body["error"] = job.error or ""
    return body


def status_body(reply: PowStatusReply) -> dict:
    config = None
    if reply.config is not None:  # flat, as the fork answers it
        c = reply.config
        config = {**msgspec.structs.asdict(c.node), "group_id": c.group_id, "n_groups": c.n_groups,
                  "seq_len": c.seq_len, "k_dim": c.k_dim}
    return {"status": reply.status, "config": config,
            "stats": msgspec.structs.asdict(reply.stats) if reply.stats is not None else None}


def versions_body(fp: Fingerprint) -> dict:
    """vllm_version and poc_validation_inference, the fields the ML node reads (gonka-ai/gonka's
    mlnode/packages/api/src/api/routes.py; dapi gets the latter from the ML node's /state), plus the backend's
    scheduling mode and protocol version. No feature list: a backend talks only to frontends of its own protocol version
    (backend/transport/control.py refuses the others), so every feature would always read true."""
    return {"vllm_version": fp.vllm_version, "poc_validation_inference": True,
            "scheduling_mode": fp.scheduling_mode, "protocol_version": fp.protocol_version}


async def _call(request: Request, msg, timeout_s: float | None = CONTROL_TIMEOUT_S):
    reply = await request.app.state.client.call(msg, timeout_s)
    if reply.error is not None:
        raise BackendRequestError(reply.error)
    return reply


def _job_of(reply: PowJobReply) -> JobView:
    if reply.job is None:
        raise ApiError(500, "backend answered without a job or an error")
    return reply.job


def make_pow_router(settings: FrontendSettings) -> APIRouter:
    # 401: the token (POCSERVE_POW_API_TOKEN) is checked by frontend/auth.py, before the route is chosen.
    router = APIRouter(prefix="/api/v1/pow", tags=["pow"], responses=errors(401, 503), route_class=OffloadRoute)
    wait_timeout_s = settings.pow_wait_timeout_s

    @router.post("/init/generate", responses=errors(400, 409, 413))
    async def init_generate(body: InitGenerateRequest, request: Request) -> dict:
        msg = body.to_wire(request.app.state.client.new_rid())
        reply: PowStatusReply = await _call(request, msg)
        return {"status": "OK", "pow_status": {"status": reply.status}}

    @router.post("/generate", responses=errors(400, 409, 413, 429))
    async def generate(body: GenerateRequest, request: Request) -> dict:
        msg = body.to_wire(request.app.state.client.new_rid())
        if not body.wait:
            job = _job_of(await _call(request, msg))
            return {"status": job.status, "request_id": job.job_id, "queued_count": job.num_queued}
        # The job runs to the end in the backend even if this times out or the client leaves: nothing to abort.
        try:
            async with asyncio.timeout(wait_timeout_s):
                reply: PowJobReply = await _call(request, msg, None)
        except TimeoutError:
            log.warning("pow_generate_wait_timeout", rid=msg.rid, num_nonces=len(msg.nonces),
                        timeout_s=wait_timeout_s)
            raise ApiError(503, f"Timeout after {wait_timeout_s:g}s") from None
        return job_body(_job_of(reply))

    @router.get("/generate/{request_id}", responses=errors(404))
    async def generate_result(request_id: str, request: Request) -> dict:
        msg = PowJobRequest(rid=request.app.state.client.new_rid(), job_id=request_id)
        return job_body(_job_of(await _call(request, msg)))

    @router.get("/status")
    async def status(request: Request) -> dict:
        reply = await _call(request, PowStatusRequest(rid=request.app.state.client.new_rid()))
        return status_body(reply)

    @router.post("/stop")
    async def stop(request: Request) -> dict:
        reply = await _call(request, PowStopRequest(rid=request.app.state.client.new_rid()))
        return {"status": "OK", "pow_status": {"status": reply.status}}

    @router.get("/versions")
    async def versions(request: Request) -> dict:
        fp = request.app.state.client.fingerprint
        if fp is None:
            raise BackendUnavailable("backend not ready")
        return versions_body(fp)

    return router
