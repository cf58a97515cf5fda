"""pocserve.flags and pocserve.cli: the ML node's command lines parsed by vLLM's own parser and translated through
the one table (no engine, no processes)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from backend.settings import OPTIONS as BACKEND_OPTIONS
from frontend.settings import OPTIONS as FRONTEND_OPTIONS
from pocserve.cli import UsageError, early_options, parse
from pocserve.flags import OWN_WORKER_EXTENSION, TABLE, Launcher, Refusal, flag_name, markdown_table, translate

pytest.importorskip("vllm")  # vLLM's own parser

# What the ML node's VLLMRunner builds: its own flags, the node's model config, the worker extension last.
ML_NODE = ["--model", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "--dtype", "auto", "--port", "5001", "--host",
           "0.0.0.0"]
WORKER_EXTENSION = ["--worker-extension-cls", "gonka_poc.worker.PoCWorkerExtension"]


def plan_of(*args: str, vllm_api_key: str = ""):
    return translate(parse([*ML_NODE, *args, *WORKER_EXTENSION]), vllm_api_key)


def test_flags_ml_node_command_line_maps_onto_backend_and_frontend_settings():
    plan = plan_of("--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--max-model-len", "32k",
                   "--max-num-seqs", "128", "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "fp8",
                   "--quantization", "fp8", "--enable-prefix-caching", "--enforce-eager", "--seed", "7",
                   "--max-num-batched-tokens", "8192", "--logprobs-mode", "processed_logprobs",
                   "--return-tokens-as-token-ids")
    assert plan.model == plan.served_model_name == "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
    assert (plan.host, plan.port, plan.api_key) == ("0.0.0.0", 5001, "")
    args = plan.backend_args
    pairs = dict(itertools.pairwise(args))
    assert pairs["--tensor-parallel-size"] == "4" and pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--max-model-len"] == "32000" and pairs["--max-num-seqs"] == "128"
    assert pairs["--gpu-memory-utilization"] == "0.9" and pairs["--kv-cache-dtype"] == "fp8"
    assert pairs["--quantization"] == "fp8" and pairs["--seed"] == "7" and pairs["--dtype"] == "auto"
    assert pairs["--max-num-batched-tokens"] == "8192" and pairs["--logprobs-mode"] == "processed_logprobs"
    assert "--enforce-eager" in args
    assert plan.frontend_args == ("--logprob-token-format", "ids")
    assert plan.ignored == ()
    assert plan.foreign_worker_extension == "gonka_poc.worker.PoCWorkerExtension"


def test_flags_absent_flags_keep_pocserve_defaults_except_vllm_semantics():
    plan = translate(parse(["--model", "/models/m"]))
    assert plan.backend_args == ("--gpu-memory-utilization", str(parse([]).defaults["gpu_memory_utilization"]))
    assert (plan.host, plan.port) == ("0.0.0.0", 8000)  # vLLM's: every interface, port 8000
    assert plan.frontend_args == () and plan.foreign_worker_extension == ""


def test_flags_served_model_name_and_positional_model():
    assert plan_of("--served-model-name", "tiny").served_model_name == "tiny"
    plan = translate(parse(["/models/m", "--port", "5002"]))
    assert plan.model == plan.served_model_name == "/models/m"
    with pytest.raises(Refusal, match=r"^--served-model-name: "):
        plan_of("--served-model-name", "a", "b")
    with pytest.raises(Refusal, match=r"^--model: required"):
        translate(parse(["--port", "5002"]))


def test_flags_unknown_flag_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as e:
        parse([*ML_NODE, "--no-such-flag"])
    assert str(e.value) == "unrecognized arguments: --no-such-flag"
    with pytest.raises(UsageError, match="--max-model-len"):
        parse([*ML_NODE, "--max-model-len", "lots"])


@pytest.mark.parametrize(("args", "flag"), [
    (["--enable-expert-parallel"], "--enable-expert-parallel"),  # not in the table: refused
    (["--data-parallel-size", "2"], "--data-parallel-size"),  # refused with its reason
    (["--chat-template", "x.jinja"], "--chat-template"),
    (["--logprobs-mode", "raw_logits"], "--logprobs-mode"),  # a value pocserve cannot honour
    (["--distributed-executor-backend", "ray"], "--distributed-executor-backend"),
    (["--max-model-len", "auto"], "--max-model-len"),
])
def test_flags_refused_flag_names_itself(args, flag):
    with pytest.raises(Refusal) as e:
        plan_of(*args)
    assert e.value.flag == flag and str(e.value).startswith(f"{flag}: ")


def test_flags_refused_flag_given_with_vllm_default_asks_for_nothing():
    plan = plan_of("--no-enable-expert-parallel", "--data-parallel-size", "1", "--distributed-executor-backend",
                   "mp")
    assert plan.ignored == (("--distributed-executor-backend",
                             "pocserve runs the ranks with vLLM's multiprocessing executor"),)


def test_flags_harmless_flags_are_logged_as_ignored():
    plan = plan_of("--trust-remote-code", "--disable-log-stats", "--no-enable-prefix-caching",
                   "--compilation-config", '{"mode": 0}', "--uvicorn-log-level", "warning")
    assert {flag for flag, _why in plan.ignored} == {"--trust-remote-code", "--uvicorn-log-level",
                                                     "--enable-prefix-caching", "--compilation-config",
                                                     "--disable-log-stats"}
    assert plan.backend_args == ("--dtype", "auto", "--gpu-memory-utilization",
                                 str(parse([]).defaults["gpu_memory_utilization"]))


def test_flags_worker_extension_is_replaced_never_refused():
    assert translate(parse(ML_NODE)).foreign_worker_extension == ""
    own = translate(parse([*ML_NODE, "--worker-extension-cls", OWN_WORKER_EXTENSION]))
    assert own.foreign_worker_extension == ""
    assert plan_of().foreign_worker_extension == "gonka_poc.worker.PoCWorkerExtension"


def test_flags_api_key_from_the_flag_or_vllm_api_key():
    assert plan_of("--api-key", "k1").api_key == "k1"
    assert plan_of(vllm_api_key="k2").api_key == "k2"
    assert plan_of("--api-key", "k1", vllm_api_key="k2").api_key == "k1"
    with pytest.raises(Refusal, match=r"^--api-key: "):
        plan_of("--api-key", "k1", "k3")


def test_flags_table_names_real_vllm_options_and_real_pocserve_settings():
    dests = set(parse([]).values)
    # Ignored and refused entries may name flags of the other supported vLLM version; mapped ones must exist.
    mapped = [d for d, r in TABLE.items() if r.target is not None or r.decide(None) == Launcher()]
    assert not [d for d in mapped if d not in dests]
    flags = {"backend": {o.flag for o in BACKEND_OPTIONS}, "frontend": {o.flag for o in FRONTEND_OPTIONS}}
    targets = [rule.target for rule in TABLE.values() if rule.target is not None]
    assert targets and not [t for t in targets if t[1] not in flags[t[0]]]


def test_flags_markdown_table_lists_every_flag():
    table = markdown_table()
    assert all(f"`{flag_name(dest)}`" in table for dest in TABLE)


def test_cli_early_options_read_without_vllm():
    early = early_options(["--model=/m", "--port", "5003", "--host", "::", "--tensor-parallel-size", "2"])
    assert (early.model, early.port, early.host) == ("/m", 5003, "::")
    assert early_options(["--port", "x"]).port is None
    assert early_options(["--model"]).model is None  # vLLM's parser reports it


def test_flags_readme_table_is_the_generated_one():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start, end = readme.index("<!-- flags:start"), readme.index("<!-- flags:end -->")
    assert readme[start:end].split("\n", 1)[1].rstrip("\n") == markdown_table(), "run: python -m pocserve.flags"
