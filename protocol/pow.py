"""Wire structs for the Gonka PoC API (/api/v1/pow/*). Wire structs only, no logic.

The frontend validates the HTTP body and translates it into one of these requests; the backend decides
(params check, gating, queue cap, round state) and answers with a reply carrying either the result or an
ErrorInfo with the HTTP status to use.
"""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo
from protocol.poc import DEFAULT_K_DIM, Artifact, Encoding


class PowParams(msgspec.Struct, kw_only=True):
    model: str
    seq_len: int
    k_dim: int = DEFAULT_K_DIM


class NodeIdentity(msgspec.Struct, kw_only=True):
    """The node a PoC request is for (the fork's request fields): the one declaration of these fields on the wire."""

    block_hash: str
    # Only echoed (in /status and callbacks).
    block_height: int
    public_key: str
    node_id: int
    node_count: int


class StatTestSpec(msgspec.Struct, kw_only=True):
    dist_threshold: float = 0.02
    p_mismatch: float = 0.001
    fraud_threshold: float = 0.01


class PowInitRequest(msgspec.Struct, tag="pow.init", kw_only=True):
    """Start a mining round (POST /init/generate)."""

    rid: str
    node: NodeIdentity
    params: PowParams
    group_id: int = 0
    n_groups: int = 1
    # None: the backend's default (POC_BATCH_SIZE_DEFAULT).
    batch_size: int | None = None
    # Callback base URL; None: artifacts are computed and counted but not delivered.
    url: str | None = None
    stronger_rng: bool = False


class PowGenerateRequest(msgspec.Struct, tag="pow.generate", kw_only=True):
    """Compute (and optionally validate) explicit nonces (POST /generate)."""

    rid: str
    node: NodeIdentity
    params: PowParams
    nonces: list[int]
    # Accepted for the fork's API; a job runs in forwards as large as the engine allows.
    batch_size: int | None = None
    # True: answer with the result; False: queue the job and answer with its id.
    wait: bool = False
    url: str | None = None
    # Received artifacts to validate against; None: compute only.
    validation: list[Artifact] | None = None
    stat_test: StatTestSpec | None = None
    stronger_rng: bool = False


class PowJobRequest(msgspec.Struct, tag="pow.job", kw_only=True):
    """Poll a queued job (GET /generate/{job_id})."""

    rid: str
    job_id: str


class PowStatusRequest(msgspec.Struct, tag="pow.status", kw_only=True):
    rid: str


class PowStopRequest(msgspec.Struct, tag="pow.stop", kw_only=True):
    rid: str


class ValidationOutcome(msgspec.Struct, kw_only=True):
    n_total: int
    n_mismatch: int
    mismatch_nonces: list[int]
    p_value: float
    fraud_detected: bool
    # Requested nonces the validator could not score, left out of n_total (poc/validation.py max_unscored).
    n_excluded: int = 0
    excluded_nonces: list[int] = msgspec.field(default_factory=list)


class JobView(msgspec.Struct, kw_only=True):
    job_id: str
    # "queued", "running", "completed", "failed", "cancelled".
    status: str
    num_queued: int = 0
    # A completed compute job: its artifacts and how they are encoded.
    artifacts: list[Artifact] | None = None
    encoding: Encoding | None = None
    validation: ValidationOutcome | None = None
    error: str | None = None


class PowJobReply(msgspec.Struct, tag="pow.job_done", kw_only=True):
    """Answer to PowGenerateRequest and PowJobRequest."""

    rid: str
    job: JobView | None = None
    error: ErrorInfo | None = None


class RoundConfig(msgspec.Struct, kw_only=True):
    """The running round, for /status (the frontend answers its fields flat, as the fork does)."""

    node: NodeIdentity
    group_id: int
    n_groups: int
    seq_len: int
    k_dim: int


class RoundStats(msgspec.Struct, kw_only=True):
    total_processed: int
    nonces_per_second: float


class PowStatusReply(msgspec.Struct, tag="pow.status_done", kw_only=True):
    """Answer to PowInitRequest, PowStatusRequest and PowStopRequest."""

    rid: str
    # "IDLE", "GENERATING" or "STOPPED" (only right after /stop).
    status: str = "IDLE"
    config: RoundConfig | None = None
    stats: RoundStats | None = None
    error: ErrorInfo | None = None
