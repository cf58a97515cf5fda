"""The PoC API's results, typed: what a finished job stores, how the frontend sees it, and the callback bodies
(the fork's; docs/decisions.md, "Callback bodies are three structs"). All msgspec structs: the job store and the
callback outbox persist them as JSON with msgspec."""

from __future__ import annotations

import msgspec

from backend.errors import pow_error
from poc.validation import StatTest, max_unscored, validate_artifacts
from protocol.common import ErrorInfo
from protocol.poc import Artifact, Encoding
from protocol.pow import JobView, NodeIdentity, PowGenerateRequest, ValidationOutcome


class ArtifactsResult(msgspec.Struct, kw_only=True):
    """A compute job's stored result (and the body of GET /generate/{id} for it)."""

    artifacts: list[Artifact]
    encoding: Encoding


# A finished job's result: which of the two, its request says (validation or not).
JobResult = ArtifactsResult | ValidationOutcome


# The callback bodies, field for field in the fork's order (pinned by tests/integration/pow_util.py): three
# JSON shapes that share the node fields the bodies echo (NodeIdentity without node_count).
_ECHOED = ("public_key", "block_hash", "block_height", "node_id")


class MinedBody(msgspec.Struct, kw_only=True):
    """POST {url}/generated from a mining round: one or more batches, no request_id (as the fork's)."""

    public_key: str
    block_hash: str
    block_height: int
    node_id: int
    artifacts: list[Artifact]
    encoding: Encoding


class GeneratedBody(msgspec.Struct, kw_only=True):
    """POST {url}/generated: a compute job's artifacts."""

    request_id: str
    block_hash: str
    block_height: int
    public_key: str
    node_id: int
    artifacts: list[Artifact]
    encoding: Encoding


class ValidatedBody(msgspec.Struct, kw_only=True):
    """POST {url}/validated: a validation job's verdict."""

    request_id: str
    block_hash: str
    block_height: int
    public_key: str
    node_id: int
    n_total: int
    n_mismatch: int
    mismatch_nonces: list[int]
    p_value: float
    fraud_detected: bool
    # The requested nonces this validator could not score, left out of n_total (the plugin's fields; the newest
    # dapi abstains from voting where any was). Defaults: rows queued before these fields existed.
    n_excluded: int = 0
    excluded_nonces: list[int] = msgspec.field(default_factory=list)


def echo(node: NodeIdentity) -> dict:
    """The node fields a callback body repeats, as keyword arguments."""
    return {name: getattr(node, name) for name in _ECHOED}


def job_result(msg: PowGenerateRequest, artifacts: list[Artifact],
               error: ErrorInfo | None) -> tuple[JobResult | None, ErrorInfo | None]:
    """The stored result of a finished job, or the error that failed it.

    A validation's nonces it could not compute leave the sample, up to poc/validation.py's max_unscored; past that,
    or with none scored, it fails loudly (503) and gives no verdict: a vote on too few recomputed artifacts would
    judge the prover by the validator's own fault (an empty sample would even count against it: dapi votes -1
    on n_total 0)."""
    if error is not None:
        return None, error
    k_dim = msg.params.k_dim
    if msg.validation is None:
        return ArtifactsResult(artifacts=artifacts, encoding=Encoding(k_dim=k_dim)), None
    spec = msg.stat_test
    stat = StatTest() if spec is None else StatTest(spec.dist_threshold, spec.p_mismatch, spec.fraud_threshold)
    outcome = validate_artifacts([(a.nonce, a.vector_b64) for a in artifacts],
                                 {a.nonce: a.vector_b64 for a in msg.validation}, msg.nonces, k_dim, stat)
    excluded, cap = outcome["excluded_nonces"], max_unscored(len(msg.nonces))
    if len(excluded) > cap or (excluded and outcome["n_total"] == 0):
        return None, pow_error(503, f"could not compute {len(excluded)} of {len(msg.nonces)} nonces (non-finite "
                                    f"hidden states; at most {cap} may go unscored), "
                                    f"e.g. {sorted(set(excluded))[:5]}").info()
    return msgspec.convert(dict(outcome), ValidationOutcome), None


def job_view(job_id: str, status: str, result: JobResult | None = None, error: str | None = None,
             num_queued: int = 0) -> JobView:
    view = JobView(job_id=job_id, status=status, error=error, num_queued=num_queued)
    if isinstance(result, ArtifactsResult):
        view.artifacts, view.encoding = result.artifacts, result.encoding
    elif isinstance(result, ValidationOutcome):
        view.validation = result
    return view


def callback_body(job_id: str, msg: PowGenerateRequest, result: JobResult) -> tuple[str, msgspec.Struct]:
    """(path, body) of a finished job's callback."""
    if isinstance(result, ValidationOutcome):
        return "validated", ValidatedBody(request_id=job_id, **echo(msg.node), **msgspec.structs.asdict(result))
    return "generated", GeneratedBody(request_id=job_id, artifacts=result.artifacts, encoding=result.encoding,
                                      **echo(msg.node))
