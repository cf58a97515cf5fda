"""vLLM's api_server command line split between pocserve's two processes, with one table for the flags of vLLM's
HTTP server.

Every engine flag (a field of vLLM's EngineArgs) goes to the backend as given: the backend takes vLLM's whole
command line and builds EngineArgs from it (backend/startup/vllm_args.py, where its few overrides are listed). The
flags of vLLM's HTTP server are decided here: used by the launcher (host, port, key), honoured by the backend's
processor (chat template, tool parser), mapped onto a frontend setting, ignored with a log line (logging, CORS, docs
pages) or refused with the reason. A server flag not in the table is refused when it is given with a value other
than vLLM's default: silently serving something else than the operator asked for is worse than not starting.

`python -m pocserve.flags` prints the README's table: this one and the backend's overrides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pocserve.cli import Parsed

DEFAULT_HOST = "0.0.0.0"  # vLLM binds every interface when --host is absent
_REFUSED = "pocserve cannot honour this vLLM flag (README: vLLM's flags)"


class Refusal(Exception):
    """A flag pocserve cannot honour; str() is the one line the launcher prints."""

    def __init__(self, flag: str, why: str) -> None:
        super().__init__(f"{flag}: {why}")
        self.flag = flag


@dataclass(frozen=True)
class Mapped:
    args: tuple[str, ...]  # frontend flags


@dataclass(frozen=True)
class Ignored:
    why: str


@dataclass(frozen=True)
class Refused:
    why: str


@dataclass(frozen=True)
class Kept:
    """Used by the launcher itself, or by the backend, which gets the whole command line."""


Decision = Mapped | Ignored | Refused | Kept | None  # None: nothing to do


@dataclass(frozen=True)
class Rule:
    does: str  # what pocserve does with the flag (README, logs)
    decide: Callable[[Any], Decision]
    target: str | None = None  # the frontend flag a mapped value lands on


def kept(does: str, check: Callable[[Any], str | None] | None = None) -> Rule:
    def decide(value: Any) -> Decision:
        if check is not None and value is not None and (why := check(value)) is not None:
            return Refused(why)
        return Kept()

    return Rule(does, decide)


def frontend(flag: str, does: str, to_args: Callable[[Any], tuple[str, ...]]) -> Rule:
    return Rule(does, lambda value: Mapped(to_args(value)), target=flag)


def ignored(why: str) -> Rule:
    return Rule(f"ignored: {why}", lambda _value: Ignored(why))


def refused(why: str) -> Rule:
    return Rule(f"refused: {why}", lambda _value: Refused(why))


def _one_key(value: Any) -> str | None:
    return None if isinstance(value, str) or len(value) <= 1 else "pocserve takes one API key"


def _one_server(value: Any) -> str | None:
    return None if value in (None, 1) else "one frontend per instance (more: run `python -m frontend` beside it)"


def _text_content(value: Any) -> str | None:
    return None if value in ("auto", "string") else "pocserve's messages reach the chat template as text"


_LOGS = "pocserve logs through structlog (POCSERVE_LOG_FORMAT, POCSERVE_LOG_LEVEL)"
_CORS = "pocserve sends no CORS headers (the ML node calls it server to server)"
_TLS = "pocserve's frontend serves plain HTTP; terminate TLS in front of it (the ML node's proxy, nginx)"
_DP = "one engine per instance: the ML node starts one instance per GPU group"
_NOT_BUILT = "not built in pocserve's frontend"

TABLE: dict[str, Rule] = {
    # The launcher's own.
    "model_tag": kept("the model, as `vllm serve MODEL` gives it (wins over --model)"),
    "config": kept("vLLM reads the YAML in both processes; each flag in it is decided like the others"),
    "host": kept("frontend `--host` (absent: 0.0.0.0, as in vLLM)"),
    "port": kept("frontend `--port`; also names the instance (state dir port-PORT, ZMQ ipc path)"),
    "api_key": kept("frontend POCSERVE_API_KEY: bearer token on /v1/* (VLLM_API_KEY when absent)", _one_key),
    # The backend's processor renders and parses as vLLM's server does.
    "chat_template": kept("the backend's processor renders with it (a file or the template)"),
    "default_chat_template_kwargs": kept("the backend's processor passes them to the template"),
    "chat_template_content_format": kept("`auto` or `string` (pocserve's messages are text)", _text_content),
    "tool_call_parser": kept("the backend's processor parses tool calls with it (absent: none, as in vLLM)"),
    "enable_auto_tool_choice": kept("the backend's processor: `tool_choice: auto` (needs --tool-call-parser)"),
    "trust_request_chat_template": ignored("pocserve never renders a template a request sends"),
    # Onto the frontend.
    "return_tokens_as_token_ids": frontend(
        "--logprob-token-format", "frontend `--logprob-token-format` ids / text (absent: ids, the network's format)",
        lambda v: ("--logprob-token-format", "ids" if v else "text")),
    "enable_prompt_tokens_details": frontend(
        "--enable-prompt-tokens-details", "frontend `--enable-prompt-tokens-details`: usage's cached_tokens",
        lambda v: ("--enable-prompt-tokens-details" if v else "--no-enable-prompt-tokens-details",)),
    "api_server_count": kept("one frontend per instance", _one_server),
    # Harmless: logged as ignored.
    "enable_log_requests": ignored(_LOGS),
    "enable_log_outputs": ignored(_LOGS),
    "enable_log_deltas": ignored(_LOGS),
    "max_log_len": ignored(_LOGS),
    "log_error_stack": ignored(_LOGS),
    "log_config_file": ignored(_LOGS),
    "uvicorn_log_level": ignored(_LOGS),
    "disable_uvicorn_access_log": ignored(_LOGS),
    "disable_access_log_for_endpoints": ignored(_LOGS),
    "enable_server_load_tracking": ignored("pocserve's /metrics reports the engine's load"),
    "enable_per_request_metrics": ignored("pocserve's /metrics reports the engine's own series"),
    "enable_request_id_headers": ignored("a response header"),
    "disable_fastapi_docs": ignored("API docs pages"),
    "enable_offline_docs": ignored("API docs pages"),
    "disable_frontend_multiprocessing": ignored("pocserve's frontend is its own process anyway"),
    "h11_max_incomplete_event_size": ignored("pocserve's frontend sets its own HTTP limits"),
    "h11_max_header_count": ignored("pocserve's frontend sets its own HTTP limits"),
    "allowed_origins": ignored(_CORS),
    "allowed_methods": ignored(_CORS),
    "allowed_headers": ignored(_CORS),
    "allow_credentials": ignored(_CORS),
    # Refused, with the reason (any other server flag given with a non-default value is refused too).
    "headless": refused("run the other hosts as `python -m backend --node-rank N` (README: Multi-node)"),
    "data_parallel_supervisor_port": refused(_DP),
    "uds": refused("pocserve's frontend listens on --host/--port"),
    "ssl_keyfile": refused(_TLS),
    "ssl_certfile": refused(_TLS),
    "ssl_ca_certs": refused(_TLS),
    "ssl_cert_reqs": refused(_TLS),
    "enable_ssl_refresh": refused(_TLS),
    "root_path": refused("pocserve's routes are served at the root"),
    "middleware": refused("pocserve's frontend loads no code from the command line"),
    "lora_modules": refused("no LoRA adapters: no route selects one"),
    "tool_parser_plugin": refused("pocserve loads no code from the command line (vLLM's built-in parsers work)"),
    "tool_server": refused(_NOT_BUILT),
    "response_role": refused("pocserve answers as `assistant`"),
    "grpc": refused(_NOT_BUILT),
}


@dataclass(frozen=True)
class Plan:
    """What one instance runs, decided from the command line before anything starts."""

    model: str  # as given: a directory or a repo id (each process resolves it the same way)
    revision: str | None
    download_dir: str | None
    host: str
    port: int
    api_key: str
    backend_args: tuple[str, ...]  # vLLM's command line as given, less the API key
    frontend_args: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...]  # (flag, why), logged at start


def flag_name(dest: str) -> str:
    return "MODEL (positional)" if dest == "model_tag" else "--" + dest.replace("_", "-")


def engine_dests() -> frozenset[str]:
    """The flags that are vLLM engine arguments: they go to the backend, which builds EngineArgs from them."""
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


def translate(parsed: Parsed, argv: Sequence[str], vllm_api_key: str = "") -> Plan:
    """The instance plan for a command line (parsed is argv through vLLM's parser); Refusal names the first server
    flag pocserve cannot honour. Engine flags are the backend's to check (it refuses with the same one line)."""
    engine = engine_dests()
    frontend_args: list[str] = []
    ignored_flags: list[tuple[str, str]] = []
    for dest in sorted(parsed.given):
        if dest in engine:
            continue
        value, rule = parsed.values[dest], TABLE.get(dest)
        if rule is None:
            if value != parsed.defaults.get(dest):
                raise Refusal(flag_name(dest), _REFUSED)
            continue
        match rule.decide(value):
            case Mapped(args=more):
                frontend_args.extend(more)
            case Ignored(why=why):
                ignored_flags.append((flag_name(dest), why))
            case Refused(why=why):
                if value != parsed.defaults.get(dest):  # given with vLLM's default, it asks for nothing
                    raise Refusal(flag_name(dest), why)
    v = parsed.values
    if not (parsed.given & {"model", "model_tag"}):
        raise Refusal("--model", "required (pocserve serves a local model; it never picks vLLM's default)")
    return Plan(
        model=v.get("model_tag") or v["model"], revision=v.get("revision"), download_dir=v.get("download_dir"),
        host=v.get("host") or DEFAULT_HOST, port=int(v["port"]), api_key=_first(v.get("api_key")) or vllm_api_key,
        backend_args=without_api_key(argv), frontend_args=tuple(frontend_args), ignored=tuple(ignored_flags))


def without_api_key(argv: Sequence[str]) -> tuple[str, ...]:
    """argv less `--api-key` and its values: the key reaches the frontend through its environment, never another
    process's command line."""
    out: list[str] = []
    skipping = False
    for token in argv:
        if token == "--api-key":
            skipping = True
        elif token.startswith("--api-key="):
            skipping = False
        elif skipping and not token.startswith("-"):
            continue
        else:
            skipping = False
            out.append(token)
    return tuple(out)


def _first(value: str | list[str] | None) -> str:
    """vLLM 0.29 takes a list of API keys (one is all pocserve takes), earlier versions one string."""
    if isinstance(value, list):
        return value[0] if value else ""
    return value or ""


def markdown_table() -> str:
    """The README's tables: the server flags, one row per rule (flags that share their reason in one row), then
    the engine flags pocserve does not pass as given."""
    from backend.startup.vllm_args import OVERRIDES

    by_does: dict[str, list[str]] = {}
    for dest, rule in TABLE.items():
        by_does.setdefault(rule.does, []).append(f"`{flag_name(dest)}`")
    rows = ["| vLLM server flag | pocserve |", "|---|---|"]
    rows += [f"| {', '.join(flags)} | {does} |" for does, flags in by_does.items()]
    rows.append(f"| any other server flag | refused when given with a value other than vLLM's default: {_REFUSED} |")
    rows += ["", "| vLLM engine flag | pocserve | why |", "|---|---|---|"]
    rows += [f"| `{flag}` | {does} | {why} |" for flag, does, why in OVERRIDES]
    rows.append("| every other engine flag | passed to vLLM's EngineArgs as given (vLLM's default when absent) | |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
