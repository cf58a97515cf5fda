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
    # Extra names the model is served under (besides served_model_name and model_path).
    model_aliases: list[str] = []
    # The model's vocabulary size: token ids go up to one below it (the frontend's /openapi.json states it on
    # /detokenize). 0: not sent (an older backend).
    vocab_size: int = 0
    # The model's default sampling values, applied where a request leaves a field out: vLLM's
    # `get_diff_sampling_param` (temperature, top_p, top_k, min_p, repetition_penalty, max_tokens), from the model's
    # generation_config and --override-generation-config; empty with --generation-config vllm.
    sampling_defaults: dict[str, float] = {}
    # What caps every request's max_tokens, as vLLM's `override_max_tokens`: the max_new_tokens of a
    # `--generation-config DIR` or of --override-generation-config; 0: none.
    max_tokens_cap: int = 0


class ProcessorStats(msgspec.Struct, tag="p.stats", kw_only=True):
    """Processor → engine (protocol/processor.py), a few times a second, and passed on in BackendStats: what vLLM's
    output processor counted (chat only)."""

    num_prompt_tokens: int
    num_generation_tokens: int
    num_finished_requests: int
    # Histogram of tokens per engine step that produced outputs: counts per upper bound (+Inf last).
    iteration_tokens_counts: list[int]
    iteration_tokens_sum: float
    iteration_tokens_count: int


class TokenHistogram(msgspec.Struct, kw_only=True):
    """Tokens per engine step: `counts[i]` steps of at most `bounds[i]` tokens (not cumulative), +Inf last."""

    bounds: list[float]
    counts: list[int]
    sum: float
    count: int


class LinkStats(msgspec.Struct, kw_only=True):
    """The io thread's part, made for each pong: the process and its peers."""

    # New on every backend start: a change tells a frontend that requests in flight were lost.
    instance_id: str
    uptime_s: float
    num_frontends: int
    # Frames that could not be decoded or had no handler (dropped, counted).
    num_rejected_frames: int
    outbox_depth: int
    # CURVE refusals: handshakes (unknown key, plaintext peer) and frames from revoked keys; 0 without CURVE.
    num_curve_refusals: int
    # False while the engine is still loading (pings are answered from the first second).
    is_engine_ready: bool
    # Seconds since the engine thread last published its part; grows only if the engine loop is stuck.
    engine_heartbeat_age_s: float


class EngineStats(msgspec.Struct, kw_only=True):
    """The engine thread's part, published between steps (backend/core/loop.py)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_engine_steps: int
    num_aborted_requests: int
    inbox_depth: int
    # PoC forwards' tokens (they move vllm:iteration_tokens_total too); chat's steps are the processor's part.
    poc_iteration_tokens: TokenHistogram


class PocStats(msgspec.Struct, kw_only=True):
    """The PoC service's part (engine thread): a round is active; nonces computed (mining and jobs); validations
    done; nonces of queued jobs."""

    is_mining: bool
    num_nonces: int
    num_validations: int
    num_queued_job_nonces: int


class CallbackStats(msgspec.Struct, kw_only=True):
    """The callback sender's part (its thread counts): delivered, dropped (retries exhausted or outbox cap),
    attempts retried, waiting now."""

    num_delivered: int
    num_dropped: int
    num_retries: int
    backlog: int


class BackendStats(msgspec.Struct, kw_only=True):
    """A snapshot of the backend, sent in PongReply: health, metrics and the probe read it. Each part is made
    whole by the one thread that owns its numbers; a part is None until its owner first reports."""

    link: LinkStats
    engine: EngineStats | None = None
    poc: PocStats | None = None
    callbacks: CallbackStats | None = None
    # What the processor process counted of chat (prompt and generated tokens, chat's steps).
    chat: ProcessorStats | None = None
