"""backend/startup/vllm_args.py: the backend takes vLLM's whole serve command line. Engine flags reach EngineArgs as
vLLM parsed them (vLLM's defaults when absent), from the command line or POCSERVE_<NAME>, except the overrides in
OVERRIDES; what pocserve cannot honour is one line naming the flag (no engine is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import SettingsError

pytest.importorskip("vllm")

from backend.engine.compat import is_cpu_build
from backend.startup.settings import load_settings
from backend.startup.vllm_args import CPU_GPU_MEMORY_UTILIZATION, DEFAULT_MODEL, WORKER_EXTENSION

# The ML node's runner and the network's Qwen3-235B configs (gonka deploy/join/node-config*.json).
NETWORK = ["--model", "m", "--dtype", "float16", "--port", "5000", "--host", "0.0.0.0",
           "--enable-prompt-tokens-details", "--scheduling-policy", "priority", "--max-num-batched-tokens", "32768",
           "--tensor-parallel-size", "2", "--max-model-len", "240000", "--gpu-memory-utilization", "0.88",
           "--kv-cache-dtype", "fp8", "--logprobs-mode", "processed_logprobs", "--trust-remote-code",
           "--load-format", "dummy", "--quantization", "fp8",
           "--worker-extension-cls", "gonka_poc.worker.PoCWorkerExtension"]


def engine(*argv: str, environ: dict[str, str] | None = None):
    return load_settings(list(argv), environ or {}).engine


def test_network_command_line_reaches_engine_args_unchanged_but_dtype_and_extension():
    s = load_settings(NETWORK, {})
    e = s.engine
    assert (e.scheduling_policy, e.max_num_batched_tokens, e.tensor_parallel_size, e.max_model_len) == (
        "priority", 32768, 2, 240000)
    assert (e.gpu_memory_utilization, e.kv_cache_dtype, e.trust_remote_code) == (0.88, "fp8", True)
    assert (e.load_format, e.quantization) == ("dummy", "fp8")
    assert e.dtype == "auto" and e.worker_extension_cls == WORKER_EXTENSION
    assert [flag for flag, _note in s.vllm.notes] == ["--worker-extension-cls", "--dtype"]


def test_expert_parallel_reaches_vllm():
    assert engine("--model", "m", "--enable-expert-parallel").enable_expert_parallel is True
    if not is_cpu_build():  # the CPU engine refuses it above one rank (vLLM's CPU build crashes)
        assert engine("--model", "m", "-ep", "--tensor-parallel-size", "2").enable_expert_parallel is True


def test_absent_engine_flags_take_vllms_defaults_but_the_overridden_ones():
    from vllm.engine.arg_utils import EngineArgs

    e = engine("--model", "m")
    vllm = EngineArgs(model="m")
    for name in ("max_num_seqs", "seed", "scheduling_policy", "enable_prefix_caching", "block_size", "dtype",
                 "enable_expert_parallel", "load_format", "tokenizer", "trust_remote_code"):
        assert getattr(e, name) == getattr(vllm, name), name
    # The CPU engine fits the context to its KV cache (vLLM's auto-fit); a GPU takes vLLM's (the model's).
    assert e.max_model_len == (-1 if is_cpu_build() else vllm.max_model_len)
    assert engine("--model", "m", "--max-model-len", "2048").max_model_len == 2048
    assert e.max_num_batched_tokens == 32768  # --poc-max-batch-tokens: the PoC forward fits vLLM's profile
    assert e.logprobs_mode == "processed_logprobs"
    expected = CPU_GPU_MEMORY_UTILIZATION if is_cpu_build() else vllm.gpu_memory_utilization
    assert e.gpu_memory_utilization == expected
    assert e.compilation_config.custom_ops == ["all"]


def test_honour_dtype_passes_it():
    assert engine("--model", "m", "--dtype", "float16", "--honour-dtype").dtype == "float16"
    assert engine("--model", "m", "--dtype", "float16").dtype == "auto"


def test_model_defaults_to_the_generated_one_and_served_names_are_vllms():
    s = load_settings([], {})
    assert s.engine.model == DEFAULT_MODEL and s.vllm.served_names == (DEFAULT_MODEL,)
    s = load_settings(["--model", "m", "--served-model-name", "a", "b"], {})
    assert s.vllm.served_names == ("a", "b") and s.engine.served_model_name == ["a", "b"]
    assert load_settings(["pos", "--model", "m"], {}).engine.model == "pos"  # vllm serve MODEL wins


def test_environment_sets_an_absent_flag_and_the_command_line_wins():
    env = {"POCSERVE_TENSOR_PARALLEL_SIZE": "4", "POCSERVE_ENFORCE_EAGER": "1",
           "POCSERVE_SERVED_MODEL_NAME": "x y", "POCSERVE_SCHEDULING_POLICY": "priority"}
    s = load_settings(["--model", "m"], env)
    assert (s.engine.tensor_parallel_size, s.engine.enforce_eager, s.vllm.served_names) == (4, True, ("x", "y"))
    assert {"tensor_parallel_size", "enforce_eager", "served_model_name", "scheduling_policy"} <= s.vllm.given
    s = load_settings(["--model", "m", "--tensor-parallel-size", "2", "--no-enforce-eager"], env)
    assert (s.engine.tensor_parallel_size, s.engine.enforce_eager) == (2, False)
    assert engine("--model", "m", environ={"POCSERVE_ENFORCE_EAGER": "0"}).enforce_eager is False
    # A flag given through the environment counts as given: no override of an absent flag applies.
    assert engine("--model", "m", environ={"POCSERVE_MAX_NUM_BATCHED_TOKENS": "8192"}).max_num_batched_tokens == 8192


def test_processor_flags():
    s = load_settings(["--model", "m", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                       "--chat-template", "{{ messages[0]['content'] }}", "--default-chat-template-kwargs",
                       '{"enable_thinking": false}', "--logprobs-mode", "raw_logprobs"], {})
    v = s.vllm
    assert (v.tool_call_parser, v.enable_auto_tool_choice, v.logprobs_mode) == ("hermes", True, "raw_logprobs")
    assert v.chat_template == "{{ messages[0]['content'] }}" and v.chat_template_kwargs == {"enable_thinking": False}
    assert s.engine.logprobs_mode == "processed_logprobs"  # the engine's; raw rows come from the replay hooks
    v = load_settings(["--model", "m"], {}).vllm
    assert (v.tool_call_parser, v.enable_auto_tool_choice, v.logprobs_mode) == ("", False, "processed_logprobs")


def test_chat_template_from_a_file(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    assert load_settings(["--model", "m", "--chat-template", str(template)], {}).vllm.chat_template == "{{ messages }}"


@pytest.mark.parametrize(("argv", "environ", "names"), [
    (["--max-model-len", "lots"], {}, ["--max-model-len"]),  # vLLM's own parser and message
    ([], {"POCSERVE_MAX_MODEL_LEN": "lots"}, ["--max-model-len", "POCSERVE_MAX_MODEL_LEN"]),
    ([], {"POCSERVE_ENFORCE_EAGER": "maybe"}, ["POCSERVE_ENFORCE_EAGER"]),
    (["--logprobs-mode", "cooked"], {}, ["--logprobs-mode"]),
    (["--logprobs-mode", "raw_logits"], {}, ["--logprobs-mode", "raw_logprobs or processed_logprobs"]),
    (["--data-parallel-size", "2"], {}, ["--data-parallel-size", "one engine per backend"]),
    (["--speculative-config", '{"method": "ngram"}'], {}, ["--speculative-config"]),
    (["--headless"], {}, ["--headless", "--node-rank"]),
    *([(["--enable-expert-parallel", "--tensor-parallel-size", "2"], {}, ["--enable-expert-parallel", "GPUs"])]
      if is_cpu_build() else []),
    (["--enable-auto-tool-choice"], {}, ["--tool-call-parser"]),
    (["--chat-template", "no-such-file"], {}, ["--chat-template"]),
    (["--no-such-flag"], {}, ["--no-such-flag"]),
    (["--gpu-memory-utilization", "1.5"], {}, ["--gpu-memory-utilization"]),
    (["--nnodes", "0"], {}, ["--nnodes"]),
    (["--nnodes", "2", "--node-rank", "2"], {}, ["--node-rank", "[0, 2)"]),
    (["--master-port", "70000"], {}, ["--master-port"]),
    (["--poc-overlap", "on", "--tensor-parallel-size", "2"], {}, ["--poc-overlap", "one rank"]),
])
def test_what_cannot_be_honoured_is_one_line_naming_it(argv, environ, names):
    with pytest.raises(SettingsError) as info:
        load_settings(["--model", "m", *argv], environ)
    assert "\n" not in str(info.value)
    for name in names:
        assert name in str(info.value)


def test_absent_max_num_seqs_is_what_vllm_serve_picks_on_this_device(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    from backend.engine.args import USAGE_CONTEXT, engine_args

    ours = engine_args(load_settings(["--model", str(model_dir), "--max-model-len", "1024"], {}))
    vllm_serve = EngineArgs(model=str(model_dir), max_model_len=1024)
    picked = [a.create_engine_config(USAGE_CONTEXT).scheduler_config.max_num_seqs for a in (ours, vllm_serve)]
    assert picked[0] == picked[1], picked


@pytest.mark.parametrize(("config", "tp"), [("node-config", "4"), ("qwen235B-B200", "2"), ("release-candidate", "4")])
def test_every_network_qwen3_config_passes_launcher_and_backend(config, tp):
    """Each Qwen3-235B config of the network (gonka deploy/join/node-config*.json), after the runner's own flags:
    the launcher refuses none of its server flags and the backend takes every engine flag."""
    from bench.network_launch import CONFIGS, runner_command
    from pocserve.cli import parse
    from pocserve.flags import translate

    argv = runner_command(Path("m"), 5001, [*CONFIGS[config], "--tensor-parallel-size", tp])[3:]
    plan = translate(parse(argv), argv)
    e = load_settings([*plan.backend_args, "--generate-model", "tiny"], {}).engine
    assert (e.tensor_parallel_size, e.max_model_len, e.dtype) == (int(tp), 240000, "auto")


def test_a_model_still_to_be_generated_loads_with_the_hub_offline(monkeypatch, tmp_path):
    """make run: the embedded default is written at start (--generate-model), after the settings are read; vLLM's
    offline lookup must not take its path for a repo id meanwhile."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    path = tmp_path / "models" / "tiny-qwen3"
    assert load_settings(["--model", str(path)], {}).engine.model == str(path)
    assert hub.HF_HUB_OFFLINE is True
