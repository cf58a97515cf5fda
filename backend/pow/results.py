"""Pure conversions for PoC jobs: results, stored records → wire views, callback payloads."""

from __future__ import annotations

import msgspec

from poc.validation import StatTest, validate_artifacts
from backend.errors import pow_error
from protocol.common import ErrorInfo
from protocol.poc import Artifact
from protocol.pow import JobView, PowGenerateRequest, ValidationOutcome

ENCODING = {"dtype": "f16", "endian": "le"}


def job_request(msg: PowGenerateRequest) -> dict:
    """What is persisted for a queued job: the whole request, as plain data."""
    return msgspec.to_builtins(msg)


def job_message(request: dict) -> PowGenerateRequest:
    return msgspec.convert(request, PowGenerateRequest)


def job_result(msg: PowGenerateRequest, artifacts: list[Artifact],
               error: ErrorInfo | None) -> tuple[dict | None, ErrorInfo | None]:
    """The stored result of a finished job, or the error that failed it.

    A validation that could not compute every requested nonce fails loudly (503): counting the missing ones
    as matches would let a node pass on artifacts nobody recomputed."""
    if error is not None:
        return None, error
    k_dim = msg.params.k_dim
    if msg.validation is None:
        return {"artifacts": [artifact_dict(a) for a in artifacts], "encoding": {**ENCODING, "k_dim": k_dim}}, None
    missing = set(msg.nonces) - {a.nonce for a in artifacts}
    if missing:
        return None, pow_error(503, f"could not compute {len(missing)} of {len(set(msg.nonces))} nonces "
                                    f"(non-finite hidden states), e.g. {sorted(missing)[:5]}").info()
    spec = msg.stat_test
    stat = StatTest() if spec is None else StatTest(spec.dist_threshold, spec.p_mismatch, spec.fraud_threshold)
    outcome = validate_artifacts([(a.nonce, a.vector_b64) for a in artifacts],
                                 {a.nonce: a.vector_b64 for a in msg.validation}, msg.nonces, k_dim, stat)
    return dict(outcome), None


def artifact_dict(a: Artifact) -> dict:
    return {"nonce": a.nonce, "vector_b64": a.vector_b64}


def view_from_result(job_id: str, status: str, k_dim: int, result: dict | None, error: str | None) -> JobView:
    view = JobView(job_id=job_id, status=status, k_dim=k_dim, error=error)
    if result is None:
        return view
    if "artifacts" in result:
        view.artifacts = [Artifact(nonce=a["nonce"], vector_b64=a["vector_b64"]) for a in result["artifacts"]]
    else:
        view.validation = msgspec.convert(result, ValidationOutcome)
    return view


def job_view(job) -> JobView:
    k_dim = job.request.get("params", {}).get("k_dim", 12)
    return view_from_result(job.id, job.status, k_dim, job.result, job.error)


def job_view_queued(job_id: str, num_nonces: int) -> JobView:
    return JobView(job_id=job_id, status="queued", num_queued=num_nonces)


def _identity(job_id: str, msg: PowGenerateRequest) -> dict:
    n = msg.node
    return {"request_id": job_id, "block_hash": n.block_hash, "block_height": n.block_height,
            "public_key": n.public_key, "node_id": n.node_id}


def generated_payload(job_id: str, msg: PowGenerateRequest, result: dict) -> dict:
    return {**_identity(job_id, msg), "artifacts": result["artifacts"], "encoding": result["encoding"]}


def validated_payload(job_id: str, msg: PowGenerateRequest, result: dict) -> dict:
    keys = ("n_total", "n_mismatch", "mismatch_nonces", "p_value", "fraud_detected")
    return {**_identity(job_id, msg), **{k: result[k] for k in keys}}
