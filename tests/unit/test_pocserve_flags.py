"""pocserve.flags and pocserve.cli: the ML node's command lines parsed by vLLM's own parser, the server flags
decided by the one table, the engine flags handed to the backend as given (no engine, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontend.settings import OPTIONS as FRONTEND_OPTIONS
from pocserve.cli import UsageError, early_options, parse
from pocserve.flags import TABLE, Refusal, flag_name, markdown_table, translate, without_api_key

pytest.importorskip("vllm")  # vLLM's own parser

# What the ML node's VLLMRunner builds: its own flags, the node's model config, the worker extension last.
ML_NODE = ["--model", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "--dtype", "float16", "--port", "5001", "--host",
           "0.0.0.0", "--enable-prompt-tokens-details"]
WORKER_EXTENSION = ["--worker-extension-cls", "gonka_poc.worker.PoCWorkerExtension"]


def plan_of(*args: str, vllm_api_key: str = ""):
    argv = [*ML_NODE, *args, *WORKER_EXTENSION]
    return translate(parse(argv), argv, vllm_api_key)


def test_flags_engine_flags_reach_the_backend_as_given():
    engine = ["--tensor-parallel-size", "4", "--max-model-len", "240000", "--quantization", "fp8",
              "--scheduling-policy", "priority", "--enable-expert-parallel", "--max-num-batched-tokens", "32768",
              "--gpu-memory-utilization", "0.88", "--load-format", "dummy", "--trust-remote-code",
              "--kv-cache-dtype", "fp8", "--logprobs-mode", "processed_logprobs", "--revision", "abc"]
    plan = plan_of(*engine)
    assert plan.backend_args == (*ML_NODE, *engine, *WORKER_EXTENSION)
    assert (plan.host, plan.port, plan.api_key) == ("0.0.0.0", 5001, "")
    assert plan.frontend_args == ("--enable-prompt-tokens-details",)
    assert plan.ignored == ()


def test_flags_absent_flags_keep_vllm_semantics():
    plan = translate(parse(["--model", "/models/m"]), ["--model", "/models/m"])
    assert plan.backend_args == ("--model", "/models/m")
    assert (plan.host, plan.port) == ("0.0.0.0", 8000)  # vLLM's: every interface, port 8000
    assert plan.frontend_args == ()


def test_flags_positional_model_and_model_required():
    plan = translate(parse(["/models/m", "--port", "5002"]), ["/models/m", "--port", "5002"])
    assert plan.model == "/models/m" and plan.backend_args == ("/models/m", "--port", "5002")
    with pytest.raises(Refusal, match=r"^--model: required"):
        translate(parse(["--port", "5002"]), ["--port", "5002"])


def test_flags_unknown_flag_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as e:
        parse([*ML_NODE, "--no-such-flag"])
    assert str(e.value) == "unrecognized arguments: --no-such-flag"
    with pytest.raises(UsageError, match="--max-model-len"):
        parse([*ML_NODE, "--max-model-len", "lots"])


@pytest.mark.parametrize(("args", "flag"), [
    (["--ssl-keyfile", "k.pem"], "--ssl-keyfile"),
    (["--lora-modules", "a=/x"], "--lora-modules"),
    (["--response-role", "bot"], "--response-role"),
    (["--api-server-count", "2"], "--api-server-count"),
    (["--chat-template-content-format", "openai"], "--chat-template-content-format"),
    (["--enable-force-include-usage"], "--enable-force-include-usage"),  # not in the table: refused
])
def test_flags_refused_server_flag_names_itself(args, flag):
    with pytest.raises(Refusal) as e:
        plan_of(*args)
    assert e.value.flag == flag and str(e.value).startswith(f"{flag}: ")


def test_flags_refused_flag_given_with_vllm_default_asks_for_nothing():
    plan = plan_of("--api-server-count", "1", "--response-role", "assistant")
    assert plan.ignored == ()


def test_flags_processor_flags_go_to_the_backend():
    plan = plan_of("--chat-template", "t.jinja", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                   "--chat-template-content-format", "string")
    assert "--tool-call-parser" in plan.backend_args and plan.frontend_args == ("--enable-prompt-tokens-details",)


def test_flags_harmless_flags_are_logged_as_ignored():
    plan = plan_of("--disable-log-stats", "--uvicorn-log-level", "warning", "--allowed-origins", '["*"]')
    # --disable-log-stats is an engine flag: the backend's, passed as given.
    assert {flag for flag, _why in plan.ignored} == {"--uvicorn-log-level", "--allowed-origins"}


def test_flags_api_key_from_the_flag_or_vllm_api_key_never_on_the_backend_line():
    plan = plan_of("--api-key", "k1")
    assert plan.api_key == "k1" and "k1" not in plan.backend_args and "--api-key" not in plan.backend_args
    assert plan_of(vllm_api_key="k2").api_key == "k2"
    assert plan_of("--api-key", "k1", vllm_api_key="k2").api_key == "k1"
    with pytest.raises(Refusal, match=r"^--api-key: "):
        plan_of("--api-key", "k1", "k3")
    assert without_api_key(["--api-key=k", "--port", "1", "--api-key", "a", "b", "--seed", "2"]) == (
        "--port", "1", "--seed", "2")


def test_flags_table_names_real_vllm_server_options_and_real_frontend_settings():
    from pocserve.flags import engine_dests

    dests = set(parse(["--model", "m"]).values)
    engine = engine_dests()
    assert not [d for d in TABLE if d in engine], "engine flags pass through; the table is for server flags"
    kept = [d for d, rule in TABLE.items() if rule.target is not None]
    assert kept and not [d for d in kept if d not in dests]
    frontend_flags = {o.flag for o in FRONTEND_OPTIONS}
    assert not [r.target for r in TABLE.values() if r.target is not None and r.target not in frontend_flags]


def test_flags_markdown_table_lists_every_flag():
    table = markdown_table()
    assert all(f"`{flag_name(dest)}`" in table for dest in TABLE)
    assert "`--dtype`" in table and "`--max-num-batched-tokens`" in table


def test_cli_early_options_read_without_vllm():
    early = early_options(["--model=/m", "--port", "5003", "--host", "::", "--tensor-parallel-size", "2"])
    assert (early.model, early.port, early.host) == ("/m", 5003, "::")
    assert early_options(["--port", "x"]).port is None
    assert early_options(["--model"]).model is None  # vLLM's parser reports it


def test_flags_readme_table_is_the_generated_one():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start, end = readme.index("<!-- flags:start"), readme.index("<!-- flags:end -->")
    assert readme[start:end].split("\n", 1)[1].rstrip("\n") == markdown_table(), "run: python -m pocserve.flags"
