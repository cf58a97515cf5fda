"""The backend's settings, declared once: every one a CLI flag and an environment variable, read once at start.

Beside its own settings the backend takes vLLM's whole command line (backend/startup/vllm_args.py): the engine's
flags are vLLM's, parsed by vLLM, and reach vLLM's EngineArgs."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core.heap import TRIM_INTERVAL_S
from backend.startup.vllm_args import VllmArgs
from common.config import SettingsError, add_options, build, check_choices, option, options, path, setting
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
    deltas_address: str = setting(
        "POCSERVE_DELTAS_ADDRESS", "auto",
        "ZMQ address the processor process binds for the frontends' second connection, on which it sends them "
        "their streams' deltas itself instead of through the engine process (backend/processor/direct.py): "
        "auto = --address's port + 1 (tcp) or its path + '.deltas' (ipc), off = every delta through the engine "
        "process, or an ipc:// / tcp:// address; one that cannot be bound is logged and left off")
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
    honour_dtype: bool = setting("POCSERVE_HONOUR_DTYPE", False,
                                 "run the model in --dtype as given; off (the network's behaviour): the checkpoint's "
                                 "dtype whatever --dtype says, as the fork computes and its validators compare")
    generate_model: str = setting("POCSERVE_GENERATE_MODEL", "tiny",
                                  "generate the seeded model into --model if missing: tiny, qwen3-0.6b or none",
                                  choices=("tiny", "qwen3-0.6b", "none"))
    poc_max_batch_tokens: int = setting("POCSERVE_POC_MAX_BATCH_TOKENS", 32768,
                                        "most sequences x seq_len in one PoC forward (default: the network's batch "
                                        "32 x seq_len 1024); at most --max-num-batched-tokens")
    allreduce_fusion: str = setting("POCSERVE_ALLREDUCE_FUSION", "auto",
                                    "vLLM's fused all-reduce + RMSNorm at TP > 1 (compiled engines): on = vLLM's "
                                    "default, off, or auto = off where NVLink multicast is switched off "
                                    "(NCCL_NVLS_ENABLE=0 or TORCH_SYMM_MEM_DISABLE_MULTICAST=1), where vLLM 0.26's "
                                    "fused kernel crashes the engine at start", choices=("auto", "on", "off"))
    chat_ops: str = setting("POCSERVE_CHAT_OPS", "custom",
                            "what chat's compiled graph is traced from: custom = vLLM's custom kernels, the set the "
                            "PoC forward runs; inductor = their PyTorch forms, fused by Inductor as in `vllm serve`, "
                            "while every eager forward (PoC included) keeps the custom kernels: the same PoC bytes "
                            "(backend/engine/chat_ops.py)", choices=("custom", "inductor"))
    enforced_sampling: bool = setting("POCSERVE_ENFORCED_SAMPLING", True,
                                      "install the validator replay hooks (enforced tokens, per-request logprobs "
                                      "mode)")
    json_whitespace: bool = setting("POCSERVE_JSON_WHITESPACE", True,
                                    "let structured JSON output contain free whitespace (off: compact JSON)")
    scheduling_mode: str = setting("POCSERVE_SCHEDULING_MODE", "exclusive",
                                   "exclusive: chat answers 503 while mining (the network's expectation); shared: "
                                   "chat keeps running", choices=("exclusive", "shared"))
    state_dir: Path = setting("POCSERVE_STATE_DIR", "state",
                              "directory of the SQLite file holding queued jobs, results and undelivered callbacks",
                              type=str, convert=path)
    batch_size_default: int = setting("POC_BATCH_SIZE_DEFAULT", 32, "PoC nonces per batch when a request omits it")
    max_queued_nonces: int = setting("POC_MAX_QUEUED_NONCES", 100000, "cap on nonces in queued /generate jobs")
    result_ttl_s: float = setting("POC_GENERATE_RESULT_TTL_SEC", 300.0, "how long finished job results are kept")
    generate_chunk_timeout_s: float = setting(
        "POC_GENERATE_CHUNK_TIMEOUT_SEC", 60.0,
        "a /generate job whose next chunk (batch_size nonces) waits this long for the engine without progress "
        "fails (queued: 'Timeout waiting for engine: chunk i'; wait=true: 503 'Timeout after ...s'); mining is not "
        "affected")
    callback_interval_s: float = setting("POC_CALLBACK_INTERVAL_SEC", 5.0, "streamed /generated batching interval")
    callback_max_retries: int = setting("POC_CALLBACK_MAX_RETRIES", 10, "attempts per callback before it is dropped")
    callback_max_concurrent: int = setting("POC_CALLBACK_MAX_CONCURRENT", 10, "callbacks in flight at once")
    callback_queue_size: int = setting("POC_CALLBACK_QUEUE_SIZE", 10000,
                                       "undelivered /generate job callbacks kept (oldest dropped and counted "
                                       "beyond); mining artifacts are capped by --callback-max-artifacts")
    callback_max_artifacts: int = setting("POC_CALLBACK_MAX_ARTIFACTS", 1000000,
                                          "mining artifacts kept for POST {url}/generated while undelivered "
                                          "(oldest batches dropped and counted beyond)")
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
                                          "PoC forwards launched at once, overlapped (--poc-overlap) or in an "
                                          "exclusive round time-sliced: 2 = the next queued behind the one running, "
                                          "so the device does not wait between them for the engine thread; 1 = one "
                                          "at a time", type=int)
    prefill_window_ms: float = setting("POCSERVE_PREFILL_WINDOW_MS", 0.0,
                                       "while chat requests decode, a new prefill waits up to this long for others "
                                       "to join its step (each step with a prefill costs every decoding stream "
                                       "several decode steps' time on a fast GPU); 0 = each at once, the default: "
                                       "on an H100 20 ms gathered prefills but did not lower TPOT "
                                       "(backend/engine/prefill_window.py)")
    kernel_warmup: str = setting("POCSERVE_KERNEL_WARMUP", "auto",
                                 "before ready, run the model once at each step size whose kernels would otherwise "
                                 "compile at a first chat (the fused-MoE Triton kernel's tile sizes): auto = MoE "
                                 "models on CUDA, on, off", choices=("auto", "on", "off"))
    heap_trim_interval_s: float = setting("POCSERVE_HEAP_TRIM_INTERVAL_S", TRIM_INTERVAL_S,
                                          "seconds between two malloc_trim(0) calls that give the engine process's "
                                          "freed heap back to the OS (backend/core/heap.py); 0 = never")
    fault_fail_on_step: int = setting("POCSERVE_FAULT_FAIL_ON_STEP", 0,
                                      "fault injection for tests: the engine raises on this step (0 = never)")
    log_format: str = log_format_setting()
    log_level: str = log_level_setting()
    # vLLM's own flags as the backend takes them (backend/startup/vllm_args.py); set by load_settings.
    vllm: VllmArgs = None  # type: ignore[assignment]

    @property
    def model(self) -> Path:
        return self.vllm.model

    @property
    def engine(self) -> Any:
        """vLLM's EngineArgs, pocserve's overrides applied (read it; engine/args.engine_args builds from a copy)."""
        return self.vllm.engine


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
    if s.deltas_address not in ("auto", "off") and s.deltas_address.split("://", 1)[0] not in ("ipc", "tcp"):
        raise SettingsError(f"--deltas-address / POCSERVE_DELTAS_ADDRESS: auto, off, or an ipc:// or tcp:// address, "
                            f"got {s.deltas_address!r}")
    if s.curve_server_secret_key_file is not None and scheme == "inproc":
        # inproc has no ZMTP handshake, so CURVE would silently do nothing there.
        raise SettingsError("--address / POCSERVE_BACKEND_ADDRESS: CURVE needs an ipc:// or tcp:// address")
    for name in ("poc_max_batch_tokens", "batch_size_default", "max_queued_nonces", "callback_max_retries",
                 "callback_max_concurrent", "callback_queue_size", "callback_max_artifacts"):
        if getattr(s, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if not s.generate_chunk_timeout_s > 0:  # NaN too
        raise SettingsError(f"--generate-chunk-timeout-s / POC_GENERATE_CHUNK_TIMEOUT_SEC must be positive, got "
                            f"{s.generate_chunk_timeout_s}")
    if not 0.0 <= s.chat_share <= 1.0:
        raise SettingsError(f"--chat-share / POCSERVE_CHAT_SHARE must be in [0, 1], got {s.chat_share}")
    if s.poc_forwards_in_flight not in (1, 2):
        raise SettingsError(f"--poc-forwards-in-flight / POCSERVE_POC_FORWARDS_IN_FLIGHT must be 1 or 2, got "
                            f"{s.poc_forwards_in_flight}")
    for name in ("result_ttl_s", "callback_interval_s", "stop_flush_timeout_s", "heap_trim_interval_s",
                 "prefill_window_ms"):
        if not getattr(s, name) >= 0:  # nan included
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 0")
    if s.frontend_timeout_s != 0 and not s.frontend_timeout_s >= MIN_FRONTEND_TIMEOUT_S:
        raise SettingsError(f"--frontend-timeout-s / POCSERVE_FRONTEND_TIMEOUT_S must be 0 (off) or at least "
                            f"{MIN_FRONTEND_TIMEOUT_S:g} s (two of the frontends' default 0.5 s ping periods)")


def _check_engine(s: BackendSettings) -> None:
    """vLLM checks its own values when it builds its config; these are read before that (topology, PoC)."""
    e = s.engine
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "nnodes", "max_num_batched_tokens"):
        if getattr(e, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if e.max_num_seqs is not None and e.max_num_seqs <= 0:
        raise SettingsError("--max-num-seqs must be positive")
    if not 0 <= e.node_rank < e.nnodes:
        raise SettingsError(f"--node-rank / POCSERVE_NODE_RANK must be in [0, {e.nnodes}) for --nnodes {e.nnodes}, "
                            f"got {e.node_rank}")
    if not 0 < e.master_port < 65536:
        raise SettingsError(f"--master-port / POCSERVE_MASTER_PORT must be a port number, got {e.master_port}")
    if s.poc_overlap == "on" and s.vllm.world_size > 1:
        # Both streams' collectives would share one communicator (and vLLM's custom all-reduce buffers).
        raise SettingsError("--poc-overlap / POCSERVE_POC_OVERLAP on needs one rank (tensor x pipeline parallel "
                            "size 1); auto and off time-slice across ranks")
    if not 0.0 < e.gpu_memory_utilization <= 1.0:
        raise SettingsError("--gpu-memory-utilization must be in (0, 1]")


def reload_curve_clients(clients: PublicKeys) -> PublicKeys:
    """The clients directory (or file) read again, checked as at start; SettingsError if it is unusable now."""
    reloaded = load_public_keys(option(BackendSettings, "curve_clients_dir"), str(clients.path))
    assert reloaded is not None, "a non-empty path never loads as None"
    return reloaded


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> BackendSettings:
    """pocserve's own settings and vLLM's whole `vllm serve` command line, in one parser: every vLLM flag parses
    with vLLM's parser and its error texts; SettingsError for a bad value of either."""
    from backend.engine.compat import is_cpu_build
    from backend.startup.vllm_args import parse, serve_parser, vllm_actions, vllm_args

    environ = os.environ if environ is None else environ
    parser = serve_parser("pocserve-backend", "pocserve backend: owns the vLLM engine; takes vllm serve's flags")
    actions = vllm_actions(parser)
    add_options(parser, OPTIONS, environ)
    values, given = parse(parser, actions, sys.argv[1:] if argv is None else argv, environ)
    settings = build(BackendSettings, check_choices(values, OPTIONS))
    _check(settings)
    settings = dataclasses.replace(settings, vllm=vllm_args(values, given, settings, is_cpu_build()))
    _check_engine(settings)
    return settings
