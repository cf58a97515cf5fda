"""Every vLLM api_server flag pocserve honours, ignores or refuses: the one table, and the translation it drives.

A flag in TABLE is mapped onto a backend or frontend setting, handled by the launcher itself (model, port, ...),
ignored with a log line (harmless: logging, CORS, compilation knobs pocserve decides itself), or refused. A flag
not in the table is refused when it is given with a value other than vLLM's default: pocserve cannot honour it,
and silently serving something else than the operator asked for is worse than not starting. Mapped flags carry
vLLM's value when given; when absent, pocserve's own default applies (README: Settings), except where
`when_absent` says vLLM's default does (vLLM semantics for a command line that relies on it).

`python -m pocserve.flags` prints the table as the README shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pocserve.cli import Parsed

OWN_WORKER_EXTENSION = "backend.engine.worker_extension.WorkerExtension"
DEFAULT_HOST = "0.0.0.0"  # vLLM binds every interface when --host is absent
_REFUSED = "pocserve cannot honour this vLLM flag (README: Drop-in for the Gonka ML node)"


class Refusal(Exception):
    """A flag pocserve cannot honour; str() is the one line the launcher prints."""

    def __init__(self, flag: str, why: str) -> None:
        super().__init__(f"{flag}: {why}")
        self.flag = flag


@dataclass(frozen=True)
class Mapped:
    process: str  # "backend" or "frontend"
    args: tuple[str, ...]


@dataclass(frozen=True)
class Ignored:
    why: str


@dataclass(frozen=True)
class Refused:
    why: str


@dataclass(frozen=True)
class Launcher:
    """Used by the launcher itself (translate reads the value)."""


Decision = Mapped | Ignored | Refused | Launcher | None  # None: nothing to do (pocserve's default applies)


@dataclass(frozen=True)
class Rule:
    does: str  # what pocserve does with the flag (README, logs)
    decide: Callable[[Any], Decision]
    when_absent: bool = False  # decided with vLLM's default value when the flag is not given
    target: tuple[str, str] | None = None  # (process, flag) a mapped value lands on


def _setting(process: str, flag: str, does: str = "", check: Callable[[Any], str | None] | None = None,
             when_absent: bool = False) -> Rule:
    def decide(value: Any) -> Decision:
        if value is None:
            return None
        if check is not None and (why := check(value)) is not None:
            return Refused(why)
        if isinstance(value, bool):
            return Mapped(process, (flag if value else "--no-" + flag.removeprefix("--"),))
        return Mapped(process, (flag, str(value)))

    return Rule(does or f"{process} `{flag}`", decide, when_absent, (process, flag))


def backend(flag: str, does: str = "", check: Callable[[Any], str | None] | None = None,
            when_absent: bool = False) -> Rule:
    return _setting("backend", flag, does, check, when_absent)


def launcher(does: str, check: Callable[[Any], str | None] | None = None, when_absent: bool = False) -> Rule:
    def decide(value: Any) -> Decision:
        if check is not None and value is not None and (why := check(value)) is not None:
            return Refused(why)
        return Launcher()

    return Rule(does, decide, when_absent)


def ignored(why: str) -> Rule:
    return Rule(f"ignored: {why}", lambda _value: Ignored(why))


def refused(why: str) -> Rule:
    return Rule(f"refused: {why}", lambda _value: Refused(why))


def _positive(value: Any) -> str | None:
    return None if isinstance(value, int) and value > 0 else f"must be a positive number here, not {value!r}"


def _one_name(value: Any) -> str | None:
    return None if len(value) == 1 else "pocserve serves one model name (the --model path is accepted as well)"


def _one_key(value: Any) -> str | None:
    return None if isinstance(value, str) or len(value) <= 1 else "pocserve takes one API key"


def _logprobs_mode(value: Any) -> str | None:
    ok = ("raw_logprobs", "processed_logprobs")
    return None if value in ok else f"pocserve computes {' or '.join(ok)}, not {value!r}"


def _prefix_caching(value: Any) -> Decision:
    return Ignored("pocserve always caches prefixes") if value is False else None


def _executor(value: Any) -> Decision:
    if value in (None, "mp"):
        return Ignored("pocserve runs the ranks with vLLM's multiprocessing executor")
    return Refused("pocserve runs tensor/pipeline ranks with vLLM's multiprocessing executor (across hosts too: "
                   "--nnodes)")


_WORKER_NODE = "this instance serves node 0; run the other hosts with `python -m backend --node-rank N` (README: " \
    "Multi-node)"


def _node_zero(value: Any) -> str | None:
    return None if value == 0 else _WORKER_NODE


_LOGS = "pocserve logs through structlog (POCSERVE_LOG_FORMAT, POCSERVE_LOG_LEVEL)"
_COMPILE = "pocserve sets vLLM's compilation itself (the PoC forward's numerics depend on it); --enforce-eager works"
_CORS = "pocserve sends no CORS headers (the ML node calls it server to server)"

TABLE: dict[str, Rule] = {
    # The launcher's own.
    "model": launcher("the model: a local directory, or a repo id found in the local Hugging Face cache "
                      "(pocserve is offline)"),
    "model_tag": launcher("the model, as `vllm serve MODEL` gives it (wins over --model)"),
    "revision": launcher("the cached revision a repo id resolves to"),
    "download_dir": launcher("the Hugging Face cache a repo id is looked up in"),
    "served_model_name": launcher("backend `--served-model-name` (absent: the --model value, as in vLLM)",
                                  check=_one_name),
    "host": launcher("frontend `--host` (absent: 0.0.0.0, as in vLLM)", when_absent=True),
    "port": launcher("frontend `--port`; also names the instance (state dir port-PORT, ZMQ ipc path)",
                     when_absent=True),
    "api_key": launcher("frontend POCSERVE_API_KEY: bearer token on /v1/* (VLLM_API_KEY when absent)",
                        check=_one_key),
    "worker_extension_cls": launcher("replaced by pocserve's own (another class is logged, never fatal)"),
    "config": launcher("vLLM reads the YAML; each flag in it is decided here like the others"),
    # Onto the backend.
    "dtype": backend("--dtype"),
    "max_model_len": backend("--max-model-len", check=_positive),
    "max_num_seqs": backend("--max-num-seqs", check=_positive),
    "max_num_batched_tokens": backend("--max-num-batched-tokens", check=_positive),
    "gpu_memory_utilization": backend("--gpu-memory-utilization",
                                      "backend `--gpu-memory-utilization` (absent: vLLM's default)",
                                      when_absent=True),
    "tensor_parallel_size": backend("--tensor-parallel-size", check=_positive),
    "pipeline_parallel_size": backend("--pipeline-parallel-size", check=_positive),
    "nnodes": backend("--nnodes", check=_positive),
    "node_rank": backend("--node-rank", "backend `--node-rank`: 0 only", check=_node_zero),
    "master_addr": backend("--master-addr"),
    "master_port": backend("--master-port"),
    "enforce_eager": backend("--enforce-eager"),
    "seed": backend("--seed"),
    "block_size": backend("--block-size", check=_positive),
    "kv_cache_dtype": backend("--kv-cache-dtype"),
    "quantization": backend("--quantization"),
    "logprobs_mode": backend("--logprobs-mode", "backend `--logprobs-mode`, raw_logprobs or processed_logprobs "
                             "(absent: processed, what the network validates with)", _logprobs_mode),
    "enable_prefix_caching": Rule("always on (`--no-enable-prefix-caching` is ignored)", _prefix_caching),
    "tool_call_parser": backend("--tool-call-parser"),
    "enable_auto_tool_choice": backend("--enable-auto-tool-choice"),
    "reasoning_parser": backend("--reasoning-parser"),
    # Onto the frontend.
    "return_tokens_as_token_ids": Rule(
        "frontend `--logprob-token-format` ids / text (absent: ids, the network's format)",
        lambda v: Mapped("frontend", ("--logprob-token-format", "ids" if v else "text")),
        target=("frontend", "--logprob-token-format")),
    # Harmless: logged as ignored.
    "distributed_executor_backend": Rule("ignored when `mp`, refused otherwise", _executor),
    "trust_remote_code": ignored("pocserve never runs a model's own code (a model that needs it fails at load)"),
    "hf_token": ignored("pocserve is offline: nothing is downloaded"),
    "enable_chunked_prefill": ignored("vLLM V1 schedules prefills in chunks by itself"),
    "compilation_config": ignored(_COMPILE),
    "optimization_level": ignored(_COMPILE),
    "cudagraph_capture_sizes": ignored(_COMPILE),
    "max_cudagraph_capture_size": ignored(_COMPILE),
    "use_tqdm_on_load": ignored("a loading progress bar"),
    "max_parallel_loading_workers": ignored("a loading detail"),
    "shutdown_timeout": ignored("pocserve stops within POCSERVE_STOP_TIMEOUT_S"),
    "disable_log_stats": ignored(_LOGS),
    "disable_log_requests": ignored(_LOGS),
    "enable_log_requests": ignored(_LOGS),
    "enable_log_outputs": ignored(_LOGS),
    "enable_log_deltas": ignored(_LOGS),
    "aggregate_engine_logging": ignored(_LOGS),
    "max_log_len": ignored(_LOGS),
    "log_error_stack": ignored(_LOGS),
    "log_config_file": ignored(_LOGS),
    "uvicorn_log_level": ignored(_LOGS),
    "disable_uvicorn_access_log": ignored(_LOGS),
    "disable_access_log_for_endpoints": ignored(_LOGS),
    "show_hidden_metrics_for_version": ignored("pocserve's /metrics has no hidden series"),
    "enable_server_load_tracking": ignored("pocserve's /metrics reports the engine's load"),
    "enable_request_id_headers": ignored("a response header"),
    "disable_fastapi_docs": ignored("API docs pages"),
    "enable_offline_docs": ignored("API docs pages"),
    "disable_frontend_multiprocessing": ignored("pocserve's frontend is its own process anyway"),
    "allowed_origins": ignored(_CORS),
    "allowed_methods": ignored(_CORS),
    "allowed_headers": ignored(_CORS),
    "allow_credentials": ignored(_CORS),
    # Refused, with the reason (any other flag given with a non-default value is refused too).
    "chat_template": refused("pocserve renders the model's own chat template"),
    "data_parallel_size": refused("one engine per instance: the ML node starts one instance per GPU group"),
    "speculative_config": refused("no speculative decoding (validation replays the plain model)"),
    "enable_lora": refused("no LoRA adapters"),
    "lora_modules": refused("no LoRA adapters"),
    "headless": refused(_WORKER_NODE),
    "api_server_count": refused("one frontend per instance (more: run `python -m frontend` beside it)"),
}


@dataclass(frozen=True)
class Plan:
    """What one instance runs, decided from the command line before anything starts."""

    model: str  # as given: a directory or a repo id (resolved by the launcher)
    revision: str | None
    download_dir: str | None
    served_model_name: str
    host: str
    port: int
    api_key: str
    backend_args: tuple[str, ...]  # settings flags for `python -m backend`, beside the launcher's own
    frontend_args: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...]  # (flag, why), logged at start
    foreign_worker_extension: str  # another project's class the command line named ('' when none)


def flag_name(dest: str) -> str:
    return "MODEL (positional)" if dest == "model_tag" else "--" + dest.replace("_", "-")


def translate(parsed: Parsed, vllm_api_key: str = "") -> Plan:
    """The instance plan for a parsed command line; Refusal names the first flag pocserve cannot honour."""
    args: dict[str, list[str]] = {"backend": [], "frontend": []}
    ignored_flags: list[tuple[str, str]] = []
    for dest, value in parsed.values.items():
        rule = TABLE.get(dest)
        is_given = dest in parsed.given
        if not is_given and not (rule is not None and rule.when_absent):
            continue
        if rule is None:
            if value != parsed.defaults.get(dest):
                raise Refusal(flag_name(dest), _REFUSED)
            continue
        match rule.decide(value):
            case Mapped(process=process, args=more):
                args[process].extend(more)
            case Ignored(why=why):
                ignored_flags.append((flag_name(dest), why))
            case Refused(why=why):
                if value != parsed.defaults.get(dest):  # given with vLLM's default, it asks for nothing
                    raise Refusal(flag_name(dest), why)
            case Launcher() | None:
                pass
    v = parsed.values
    model = v.get("model_tag") or v["model"]
    if not (parsed.given & {"model", "model_tag"}):
        raise Refusal("--model", "required (pocserve serves a local model; it never picks vLLM's default)")
    extension = v.get("worker_extension_cls") or ""
    return Plan(
        model=model, revision=v.get("revision"), download_dir=v.get("download_dir"),
        served_model_name=(v.get("served_model_name") or [model])[0],
        host=v.get("host") or DEFAULT_HOST, port=int(v["port"]),
        api_key=_first(v.get("api_key")) or vllm_api_key,
        backend_args=tuple(args["backend"]), frontend_args=tuple(args["frontend"]), ignored=tuple(ignored_flags),
        foreign_worker_extension="" if extension in ("", OWN_WORKER_EXTENSION) else extension)


def _first(value: str | list[str] | None) -> str:
    """vLLM 0.29 takes a list of API keys (one is all pocserve takes), earlier versions one string."""
    if isinstance(value, list):
        return value[0] if value else ""
    return value or ""


def markdown_table() -> str:
    """The README's table: one row per rule, flags that share their reason in one row."""
    by_does: dict[str, list[str]] = {}
    for dest, rule in TABLE.items():
        by_does.setdefault(rule.does, []).append(f"`{flag_name(dest)}`")
    rows = ["| vLLM flag | pocserve |", "|---|---|"]
    rows += [f"| {', '.join(flags)} | {does} |" for does, flags in by_does.items()]
    rows.append(f"| any other flag | refused when given with a value other than vLLM's default: {_REFUSED} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
