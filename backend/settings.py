"""The backend's settings: every one a CLI flag and an environment variable, read once at start."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol.config import Option, SettingsError, parse_options
from protocol.curve import KeyFile, PublicKeys, load_public_keys, load_secret_key_file

DEFAULT_ADDRESS = "ipc:///tmp/pocserve/backend.ipc"
# Frontends ping every 0.5 s by default: a timeout of two such periods is the least that is not a hair trigger.
MIN_FRONTEND_TIMEOUT_S = 1.0

OPTIONS: tuple[Option, ...] = (
    Option("address", "POCSERVE_BACKEND_ADDRESS", DEFAULT_ADDRESS,
           "ZMQ address the backend binds (ipc:// or tcp://host:port; no wildcard unless bind_any)"),
    Option("bind_any", "POCSERVE_BACKEND_BIND_ANY", False,
           "allow binding tcp://0.0.0.0 / tcp://* (containers)", bool),
    Option("curve_server_secret_key_file", "POCSERVE_CURVE_SERVER_SECRET_KEY_FILE", "",
           "CURVE: this backend's secret key file (NAME.key_secret); with --curve-clients-dir the ZMQ link is "
           "authenticated and encrypted (empty: plaintext)"),
    Option("curve_clients_dir", "POCSERVE_CURVE_CLIENTS_DIR", "",
           "CURVE: directory of the authorised frontends' public key files (*.key), or one such file; any "
           "other peer is refused and logged"),
    Option("frontend_timeout_s", "POCSERVE_FRONTEND_TIMEOUT_S", 5.0,
           "a frontend (any peer) silent this long is forgotten and its generations are aborted; 0 = never. "
           f"At least {MIN_FRONTEND_TIMEOUT_S:g} s; keep it several times the frontends' --ping-interval-s",
           float),
    Option("model", "POCSERVE_MODEL", "models/tiny-qwen3", "local model directory"),
    Option("served_model_name", "POCSERVE_SERVED_MODEL_NAME", "",
           "model name clients use (default: the model path)"),
    Option("generate_model", "POCSERVE_GENERATE_MODEL", "tiny",
           "generate the seeded model into --model if missing: tiny, qwen3-0.6b or none",
           choices=("tiny", "qwen3-0.6b", "none")),
    Option("max_model_len", "POCSERVE_MAX_MODEL_LEN", 2048, "max prompt + output tokens", int),
    Option("max_num_seqs", "POCSERVE_MAX_NUM_SEQS", 64, "max sequences per engine step", int),
    Option("max_num_batched_tokens", "POCSERVE_MAX_NUM_BATCHED_TOKENS", 4096, "max tokens per engine step", int),
    Option("gpu_memory_utilization", "POCSERVE_GPU_MEMORY_UTILIZATION", 0.3,
           "fraction of device memory (of RAM on CPU) vLLM may reserve", float),
    Option("dtype", "POCSERVE_DTYPE", "auto", "model dtype (auto = the checkpoint's)"),
    Option("block_size", "POCSERVE_BLOCK_SIZE", 0, "KV block size (0 = the backend's default)", int),
    Option("tensor_parallel_size", "POCSERVE_TENSOR_PARALLEL_SIZE", 1, "tensor-parallel ranks", int),
    Option("enforce_eager", "POCSERVE_ENFORCE_EAGER", False, "disable CUDA graphs / compilation", bool),
    Option("logprobs_mode", "POCSERVE_LOGPROBS_MODE", "processed_logprobs",
           "default logprobs mode (the network validates with processed)",
           choices=("raw_logprobs", "processed_logprobs")),
    Option("seed", "POCSERVE_SEED", 0, "engine seed", int),
    Option("enforced_sampling", "POCSERVE_ENFORCED_SAMPLING", True,
           "install the validator replay hooks (enforced tokens, per-request logprobs mode)", bool),
    Option("json_whitespace", "POCSERVE_JSON_WHITESPACE", True,
           "let structured JSON output contain free whitespace (off: compact JSON)", bool),
    Option("scheduling_mode", "POCSERVE_SCHEDULING_MODE", "exclusive",
           "exclusive: chat answers 503 while mining (the network's expectation); shared: chat keeps running",
           choices=("exclusive", "shared")),
    Option("state_dir", "POCSERVE_STATE_DIR", "state",
           "directory of the SQLite file holding queued jobs, results and undelivered callbacks"),
    Option("batch_size_default", "POC_BATCH_SIZE_DEFAULT", 32, "PoC nonces per batch when a request omits it", int),
    Option("max_queued_nonces", "POC_MAX_QUEUED_NONCES", 100000, "cap on nonces in queued /generate jobs", int),
    Option("result_ttl_s", "POC_GENERATE_RESULT_TTL_SEC", 300.0, "how long finished job results are kept", float),
    Option("callback_interval_s", "POC_CALLBACK_INTERVAL_SEC", 5.0, "streamed /generated batching interval", float),
    Option("callback_max_retries", "POC_CALLBACK_MAX_RETRIES", 10, "attempts per callback before it is dropped",
           int),
    Option("callback_max_concurrent", "POC_CALLBACK_MAX_CONCURRENT", 10, "callbacks in flight at once", int),
    Option("callback_queue_size", "POC_CALLBACK_QUEUE_SIZE", 10000,
           "undelivered callbacks kept (oldest dropped and counted beyond)", int),
    Option("stop_flush_timeout_s", "POCSERVE_STOP_FLUSH_TIMEOUT_S", 5.0,
           "how long /stop waits to deliver computed artifacts before answering", float),
    Option("poc_batches_per_step", "POCSERVE_POC_BATCHES_PER_STEP", 1,
           "PoC forwards run per engine step while chat and PoC compete (the PoC share)", int),
    Option("fault_fail_on_step", "POCSERVE_FAULT_FAIL_ON_STEP", 0,
           "fault injection for tests: the engine raises on this step (0 = never)", int),
    Option("log_format", "POCSERVE_LOG_FORMAT", "console", "log output", choices=("console", "json")),
    Option("log_level", "POCSERVE_LOG_LEVEL", "info", "log level",
           choices=("debug", "info", "warning", "error")),
)

_OPTIONS = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class BackendSettings:
    address: str
    bind_any: bool
    # Loaded and checked at start; both set or both None (CURVE off).
    curve_server_secret_key_file: KeyFile | None
    curve_clients_dir: PublicKeys | None
    frontend_timeout_s: float
    model: Path
    served_model_name: str
    generate_model: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    dtype: str
    block_size: int
    tensor_parallel_size: int
    enforce_eager: bool
    logprobs_mode: str
    seed: int
    enforced_sampling: bool
    json_whitespace: bool
    scheduling_mode: str
    state_dir: Path
    batch_size_default: int
    max_queued_nonces: int
    result_ttl_s: float
    callback_interval_s: float
    callback_max_retries: int
    callback_max_concurrent: int
    callback_queue_size: int
    stop_flush_timeout_s: float
    poc_batches_per_step: int
    fault_fail_on_step: int
    log_format: str
    log_level: str

    @property
    def model_name(self) -> str:
        return self.served_model_name or str(self.model)


def _check(s: BackendSettings) -> None:
    scheme = s.address.split("://", 1)[0]
    if scheme not in ("ipc", "tcp", "inproc"):
        raise SettingsError(f"--address / POCSERVE_BACKEND_ADDRESS: unsupported scheme in {s.address!r}")
    if scheme == "tcp" and not s.bind_any and any(h in s.address for h in ("://*", "://0.0.0.0", "://[::]")):
        raise SettingsError("--address binds every interface; set --bind-any / POCSERVE_BACKEND_BIND_ANY=1 "
                            "if that is intended")
    if (s.curve_server_secret_key_file is None) != (s.curve_clients_dir is None):
        raise SettingsError("--curve-server-secret-key-file / POCSERVE_CURVE_SERVER_SECRET_KEY_FILE and "
                            "--curve-clients-dir / POCSERVE_CURVE_CLIENTS_DIR must be set together")
    if s.curve_server_secret_key_file is not None and scheme == "inproc":
        # inproc has no ZMTP handshake, so CURVE would silently do nothing there.
        raise SettingsError("--address / POCSERVE_BACKEND_ADDRESS: CURVE needs an ipc:// or tcp:// address")
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                 "poc_batches_per_step", "batch_size_default", "max_queued_nonces", "callback_max_retries",
                 "callback_max_concurrent", "callback_queue_size"):
        if getattr(s, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if not 0.0 < s.gpu_memory_utilization <= 1.0:
        raise SettingsError("--gpu-memory-utilization must be in (0, 1]")
    if s.block_size < 0:
        raise SettingsError("--block-size must be >= 0")
    for name in ("result_ttl_s", "callback_interval_s", "stop_flush_timeout_s"):
        if getattr(s, name) < 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 0")
    if s.frontend_timeout_s != 0 and not s.frontend_timeout_s >= MIN_FRONTEND_TIMEOUT_S:
        raise SettingsError(f"--frontend-timeout-s / POCSERVE_FRONTEND_TIMEOUT_S must be 0 (off) or at least "
                            f"{MIN_FRONTEND_TIMEOUT_S:g} s (two of the frontends' default 0.5 s ping periods)")


def reload_curve_clients(clients: PublicKeys) -> PublicKeys:
    """The clients directory (or file) read again, checked as at start; SettingsError if it is unusable now."""
    return load_public_keys(_OPTIONS["curve_clients_dir"], str(clients.path))


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> BackendSettings:
    values = parse_options("pocserve-backend", "pocserve backend: owns the vLLM engine", OPTIONS, argv, environ)
    values["model"] = Path(os.path.expanduser(values["model"]))
    values["state_dir"] = Path(os.path.expanduser(values["state_dir"]))
    values["curve_server_secret_key_file"] = load_secret_key_file(
        _OPTIONS["curve_server_secret_key_file"], values["curve_server_secret_key_file"])
    values["curve_clients_dir"] = load_public_keys(_OPTIONS["curve_clients_dir"], values["curve_clients_dir"])
    settings = BackendSettings(**values)
    _check(settings)
    return settings
