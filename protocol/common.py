"""Wire structs shared by several message groups. Wire structs only, no logic."""

from __future__ import annotations

import msgspec


class ErrorInfo(msgspec.Struct, kw_only=True):
    # HTTP status the frontend should answer with (400, 404, 409, 429, 503, 500 ...).
    status: int
    message: str
    # OpenAI-style error type; the frontend derives one from `status` when empty.
    type: str = ""
    # Name of the request field at fault, when there is one (OpenAI `error.param`).
    param: str | None = None


class Fingerprint(msgspec.Struct, kw_only=True):
    """What a backend serves; logged by both sides at handshake."""

    protocol_version: int
    served_model_name: str
    model_path: str
    max_model_len: int
    block_size: int
    dtype: str
    vllm_version: str
    engine_device: str
    poc_code_version: str
    # "exclusive" or "shared": how PoC mining and chat share the engine.
    scheduling_mode: str = "exclusive"
    # PYTHONHASHSEED and prefix-cache hash algorithm: prefix-cache keys are reproducible only if these match.
    python_hash_seed: str = ""
    prefix_caching_hash_algo: str = ""
    # Pins of the PoC parameters this backend accepts (0 = not pinned).
    poc_seq_len: int = 0
    poc_k_dim: int = 0
    # Extra names the model is served under (besides served_model_name and model_path).
    model_aliases: list[str] = []


class BackendStats(msgspec.Struct, kw_only=True):
    """A snapshot of the backend, sent in PongReply: health, metrics and the probe read it."""

    # New on every backend start: a change tells a frontend that requests in flight were lost.
    instance_id: str
    uptime_s: float
    num_frontends: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_engine_steps: int
    num_prompt_tokens: int
    num_generation_tokens: int
    num_finished_requests: int
    num_aborted_requests: int
    # Frames that could not be decoded or had no handler (dropped, counted).
    num_rejected_frames: int
    # Histogram of tokens scheduled per engine step: counts per upper bound (cumulative is the frontend's job).
    iteration_tokens_bounds: list[float] = []
    iteration_tokens_counts: list[int] = []
    iteration_tokens_sum: float = 0.0
    iteration_tokens_count: int = 0
    inbox_depth: int = 0
    outbox_depth: int = 0
    # PoC: a mining round is active; nonces computed (mining + jobs); validations done; queued job nonces.
    is_mining: bool = False
    num_poc_nonces: int = 0
    num_validations: int = 0
    num_queued_job_nonces: int = 0
    # Callbacks: delivered, dropped (retries exhausted or outbox cap), retried attempts, waiting now.
    num_callbacks_delivered: int = 0
    num_callbacks_dropped: int = 0
    num_callback_retries: int = 0
    callback_backlog: int = 0
    # False while the engine is still loading (pings are answered from the first second).
    is_engine_ready: bool = False
    # Seconds since the engine thread last published stats; grows only if the engine loop is stuck.
    engine_heartbeat_age_s: float = 0.0
    # CURVE refusals: handshakes (unknown key, plaintext peer) and frames from revoked keys; 0 without CURVE.
    num_curve_refusals: int = 0
