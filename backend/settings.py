"""The backend's settings, declared once: every one a CLI flag and an environment variable, read once at start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.config import SettingsError, load, option, options, path, setting
from common.curve import KeyFile, PublicKeys, load_public_keys, load_secret_key_file
from common.logs import log_format_setting, log_level_setting

DEFAULT_ADDRESS = "ipc:///tmp/pocserve/backend.ipc"
# Frontends ping every 0.5 s by default: a timeout of two such periods is the least that is not a hair trigger.
MIN_FRONTEND_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class BackendSettings:
    address: str = setting("POCSERVE_BACKEND_ADDRESS", DEFAULT_ADDRESS,
                           "ZMQ address the backend binds (ipc:// or tcp://host:port; no wildcard unless bind_any)")
    bind_any: bool = setting("POCSERVE_BACKEND_BIND_ANY", False, "allow binding tcp://0.0.0.0 / tcp://* (containers)")
    # Loaded and checked at start; both set or both None (CURVE off).
    curve_server_secret_key_file: KeyFile | None = setting(
        "POCSERVE_CURVE_SERVER_SECRET_KEY_FILE", "",
        "CURVE: this backend's secret key file (NAME.key_secret); with --curve-clients-dir the ZMQ link is "
        "authenticated and encrypted (empty: plaintext)", type=str, convert=load_secret_key_file)
    curve_clients_dir: PublicKeys | None = setting(
        "POCSERVE_CURVE_CLIENTS_DIR", "",
        "CURVE: directory of the authorised frontends' public key files (*.key), or one such file; any other peer "
        "is refused and logged", type=str, convert=load_public_keys)
    frontend_timeout_s: float = setting(
        "POCSERVE_FRONTEND_TIMEOUT_S", 5.0,
        "a frontend (any peer) silent this long is forgotten and its generations are aborted; 0 = never. "
        f"At least {MIN_FRONTEND_TIMEOUT_S:g} s; keep it several times the frontends' --ping-interval-s")
    model: Path = setting("POCSERVE_MODEL", "models/tiny-qwen3", "local model directory", type=str, convert=path)
    served_model_name: str = setting("POCSERVE_SERVED_MODEL_NAME", "",
                                     "model name clients use (default: the model path)")
    generate_model: str = setting("POCSERVE_GENERATE_MODEL", "tiny",
                                  "generate the seeded model into --model if missing: tiny, qwen3-0.6b or none",
                                  choices=("tiny", "qwen3-0.6b", "none"))
    max_model_len: int = setting("POCSERVE_MAX_MODEL_LEN", 0,
                                 "max prompt + output tokens (0 = the model's own context)")
    max_num_seqs: int = setting("POCSERVE_MAX_NUM_SEQS", 64, "max sequences per engine step")
    max_num_batched_tokens: int = setting("POCSERVE_MAX_NUM_BATCHED_TOKENS", 0,
                                          "max tokens per engine step (0 = --poc-max-batch-tokens, so vLLM's "
                                          "memory profile covers the largest PoC forward)")
    poc_max_batch_tokens: int = setting("POCSERVE_POC_MAX_BATCH_TOKENS", 32768,
                                        "most sequences x seq_len in one PoC forward (default: the network's batch "
                                        "32 x seq_len 1024); at most --max-num-batched-tokens")
    gpu_memory_utilization: float = setting("POCSERVE_GPU_MEMORY_UTILIZATION", 0.3,
                                            "fraction of device memory (of RAM on CPU) vLLM may reserve")
    dtype: str = setting("POCSERVE_DTYPE", "auto", "model dtype (auto = the checkpoint's)")
    kv_cache_dtype: str = setting("POCSERVE_KV_CACHE_DTYPE", "auto",
                                  "KV cache dtype, as vLLM's --kv-cache-dtype (auto = the model dtype); PoC forwards "
                                  "use the same cache")
    quantization: str = setting("POCSERVE_QUANTIZATION", "",
                                "weight quantization method, as vLLM's --quantization (empty: what the checkpoint "
                                "declares)")
    block_size: int = setting("POCSERVE_BLOCK_SIZE", 0, "KV block size (0 = the backend's default)")
    tensor_parallel_size: int = setting("POCSERVE_TENSOR_PARALLEL_SIZE", 1, "tensor-parallel ranks")
    pipeline_parallel_size: int = setting("POCSERVE_PIPELINE_PARALLEL_SIZE", 1,
                                          "pipeline-parallel stages (each holds a contiguous share of the decoder "
                                          "layers; the engine runs tensor x pipeline ranks)")
    nnodes: int = setting("POCSERVE_NNODES", 1,
                          "hosts the engine's tensor x pipeline ranks span, each running an equal share (vLLM's "
                          "multiprocessing executor across nodes)")
    node_rank: int = setting("POCSERVE_NODE_RANK", 0,
                             "this host's rank among --nnodes: 0 serves (engine core, sockets, PoC API, its share "
                             "of the ranks); the others only run their share of the ranks (vLLM's headless mode)")
    master_addr: str = setting("POCSERVE_MASTER_ADDR", "127.0.0.1",
                               "with --nnodes > 1: node 0's address, reachable from every node (torch.distributed "
                               "rendezvous)")
    master_port: int = setting("POCSERVE_MASTER_PORT", 29501,
                               "with --nnodes > 1: node 0's torch.distributed rendezvous port")
    enforce_eager: bool = setting("POCSERVE_ENFORCE_EAGER", False, "disable CUDA graphs / compilation")
    allreduce_fusion: str = setting("POCSERVE_ALLREDUCE_FUSION", "auto",
                                    "vLLM's fused all-reduce + RMSNorm at TP > 1 (compiled engines): on = vLLM's "
                                    "default, off, or auto = off where NVLink multicast is switched off "
                                    "(NCCL_NVLS_ENABLE=0 or TORCH_SYMM_MEM_DISABLE_MULTICAST=1), where vLLM 0.26's "
                                    "fused kernel crashes the engine at start", choices=("auto", "on", "off"))
    logprobs_mode: str = setting("POCSERVE_LOGPROBS_MODE", "processed_logprobs",
                                 "default logprobs mode (the network validates with processed)",
                                 choices=("raw_logprobs", "processed_logprobs"))
    seed: int = setting("POCSERVE_SEED", 0, "engine seed")
    enforced_sampling: bool = setting("POCSERVE_ENFORCED_SAMPLING", True,
                                      "install the validator replay hooks (enforced tokens, per-request logprobs "
                                      "mode)")
    json_whitespace: bool = setting("POCSERVE_JSON_WHITESPACE", True,
                                    "let structured JSON output contain free whitespace (off: compact JSON)")
    tool_call_parser: str = setting("POCSERVE_TOOL_CALL_PARSER", "hermes",
                                    "vLLM tool parser that reads tool calls from chat output, as vLLM's "
                                    "--tool-call-parser (hermes: Qwen3's format; empty: no tool calls)")
    enable_auto_tool_choice: bool = setting("POCSERVE_ENABLE_AUTO_TOOL_CHOICE", True,
                                            "let the model decide when to call tools (tool_choice auto), as vLLM's "
                                            "--enable-auto-tool-choice; needs --tool-call-parser")
    reasoning_parser: str = setting("POCSERVE_REASONING_PARSER", "",
                                    "vLLM reasoning parser that splits reasoning_content from the content, as "
                                    "vLLM's --reasoning-parser (e.g. qwen3, deepseek_r1; empty: none)")
    scheduling_mode: str = setting("POCSERVE_SCHEDULING_MODE", "exclusive",
                                   "exclusive: chat answers 503 while mining (the network's expectation); shared: "
                                   "chat keeps running", choices=("exclusive", "shared"))
    state_dir: Path = setting("POCSERVE_STATE_DIR", "state",
                              "directory of the SQLite file holding queued jobs, results and undelivered callbacks",
                              type=str, convert=path)
    batch_size_default: int = setting("POC_BATCH_SIZE_DEFAULT", 32, "PoC nonces per batch when a request omits it")
    max_queued_nonces: int = setting("POC_MAX_QUEUED_NONCES", 100000, "cap on nonces in queued /generate jobs")
    result_ttl_s: float = setting("POC_GENERATE_RESULT_TTL_SEC", 300.0, "how long finished job results are kept")
    callback_interval_s: float = setting("POC_CALLBACK_INTERVAL_SEC", 5.0, "streamed /generated batching interval")
    callback_max_retries: int = setting("POC_CALLBACK_MAX_RETRIES", 10, "attempts per callback before it is dropped")
    callback_max_concurrent: int = setting("POC_CALLBACK_MAX_CONCURRENT", 10, "callbacks in flight at once")
    callback_queue_size: int = setting("POC_CALLBACK_QUEUE_SIZE", 10000,
                                       "undelivered callbacks kept (oldest dropped and counted beyond)")
    stop_flush_timeout_s: float = setting("POCSERVE_STOP_FLUSH_TIMEOUT_S", 5.0,
                                          "how long /stop waits to deliver computed artifacts before answering")
    chat_share: float = setting("POCSERVE_CHAT_SHARE", 0.6,
                                "fraction of the device chat keeps while chat and PoC work (mining in shared mode, "
                                "validation jobs always) compete, in [0, 1]: 1 = PoC only when chat is idle, 0 = "
                                "chat only when PoC is idle; time-sliced, PoC forwards are sized to it from measured "
                                "times; overlapped (--poc-overlap), a forward beside chat gets (1 - share) of the SMs")
    poc_overlap: str = setting("POCSERVE_POC_OVERLAP", "auto",
                               "PoC forwards run beside chat steps (a CUDA stream of their own, on their share of "
                               "the SMs, queued a few layers per chat step) instead of time-sliced between them: "
                               "auto = on a CUDA engine of one rank (TP x PP = 1), on = also on a CPU engine (each "
                               "layer then runs when queued, with no overlap: for tests), off = time-slicing",
                               choices=("auto", "on", "off"))
    poc_forwards_in_flight: int = setting("POCSERVE_POC_FORWARDS_IN_FLIGHT", 2,
                                          "overlapped (--poc-overlap), PoC forwards launched at once: 2 = the next "
                                          "queued behind the one running, so the device does not wait between them "
                                          "for the engine thread; 1 = one at a time", type=int)
    fault_fail_on_step: int = setting("POCSERVE_FAULT_FAIL_ON_STEP", 0,
                                      "fault injection for tests: the engine raises on this step (0 = never)")
    log_format: str = log_format_setting()
    log_level: str = log_level_setting()

    @property
    def model_name(self) -> str:
        return self.served_model_name or str(self.model)


OPTIONS = options(BackendSettings)


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
    for name in ("max_model_len", "max_num_batched_tokens"):
        if getattr(s, name) < 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 0 (0 = the default)")
    for name in ("max_num_seqs", "poc_max_batch_tokens", "tensor_parallel_size",
                 "pipeline_parallel_size", "nnodes", "batch_size_default", "max_queued_nonces", "callback_max_retries",
                 "callback_max_concurrent", "callback_queue_size"):
        if getattr(s, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if not 0 <= s.node_rank < s.nnodes:
        raise SettingsError(f"--node-rank / POCSERVE_NODE_RANK must be in [0, {s.nnodes}) for --nnodes {s.nnodes}, "
                            f"got {s.node_rank}")
    if not 0 < s.master_port < 65536:
        raise SettingsError(f"--master-port / POCSERVE_MASTER_PORT must be a port number, got {s.master_port}")
    if not 0.0 <= s.chat_share <= 1.0:
        raise SettingsError(f"--chat-share / POCSERVE_CHAT_SHARE must be in [0, 1], got {s.chat_share}")
    if s.poc_forwards_in_flight not in (1, 2):
        raise SettingsError(f"--poc-forwards-in-flight / POCSERVE_POC_FORWARDS_IN_FLIGHT must be 1 or 2, got "
                            f"{s.poc_forwards_in_flight}")
    if s.poc_overlap == "on" and s.tensor_parallel_size * s.pipeline_parallel_size > 1:
        # Both streams' collectives would share one communicator (and vLLM's custom all-reduce buffers).
        raise SettingsError("--poc-overlap / POCSERVE_POC_OVERLAP on needs one rank (tensor x pipeline parallel "
                            "size 1); auto and off time-slice across ranks")
    if not 0.0 < s.gpu_memory_utilization <= 1.0:
        raise SettingsError("--gpu-memory-utilization must be in (0, 1]")
    if s.block_size < 0:
        raise SettingsError("--block-size must be >= 0")
    for name in ("result_ttl_s", "callback_interval_s", "stop_flush_timeout_s"):
        if getattr(s, name) < 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 0")
    if s.enable_auto_tool_choice and not s.tool_call_parser:
        raise SettingsError("--enable-auto-tool-choice / POCSERVE_ENABLE_AUTO_TOOL_CHOICE needs --tool-call-parser "
                            "/ POCSERVE_TOOL_CALL_PARSER (or --no-enable-auto-tool-choice)")
    if s.frontend_timeout_s != 0 and not s.frontend_timeout_s >= MIN_FRONTEND_TIMEOUT_S:
        raise SettingsError(f"--frontend-timeout-s / POCSERVE_FRONTEND_TIMEOUT_S must be 0 (off) or at least "
                            f"{MIN_FRONTEND_TIMEOUT_S:g} s (two of the frontends' default 0.5 s ping periods)")


def reload_curve_clients(clients: PublicKeys) -> PublicKeys:
    """The clients directory (or file) read again, checked as at start; SettingsError if it is unusable now."""
    reloaded = load_public_keys(option(BackendSettings, "curve_clients_dir"), str(clients.path))
    assert reloaded is not None, "a non-empty path never loads as None"
    return reloaded


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> BackendSettings:
    settings = load(BackendSettings, "pocserve-backend", "pocserve backend: owns the vLLM engine", argv, environ)
    _check(settings)
    return settings
