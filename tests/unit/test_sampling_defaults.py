"""Unit tests for common/sampling_defaults.py: what a request leaves out is filled as `vllm serve` fills it.

The reference is vLLM's own OpenAI layer: its request classes' `to_sampling_params` and `get_max_tokens`, given the
same defaults; and vLLM's ModelConfig reads the model's generation_config and the command line's override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VllmResponsesRequest
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

from backend.engine.args import engine_args
from backend.processor.params import check_lengths, sampling_params
from backend.startup.settings import load_settings
from common.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from frontend import convert
from frontend.openai_models import ChatCompletionRequest as OurChatRequest
from frontend.openai_models import CompletionRequest as OurCompletionRequest
from frontend.responses_convert import generate_request
from frontend.responses_models import ResponsesRequest
from frontend.responses_shape import ResponseShape
from protocol.generate import SamplingSpec

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Qwen3-235B-A22B-Instruct-2507's generation_config, one with every field, and none.
MODEL_DEFAULTS = ({"temperature": 0.7, "top_p": 0.8, "top_k": 20},
                  {"temperature": 0.6, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.05},
                  {})
BODIES = ({}, {"temperature": 0.0}, {"temperature": 1.0, "top_k": 0}, {"top_p": 0.5, "min_p": 0.1},
          {"repetition_penalty": 1.2, "top_k": -1}, {"temperature": 1.3, "top_p": 0.9, "top_k": 5, "min_p": 0.2,
                                                     "repetition_penalty": 0.9})
MESSAGES = [{"role": "user", "content": "hi"}]


class Vocab:
    size = 100
    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return [1] * len(text)


def _ours(spec: SamplingSpec, defaults: dict) -> tuple:
    params = sampling_params(spec, 16, False, Vocab(), "processed_logprobs",  # type: ignore[arg-type]
                             defaults=SamplingDefaults(values=defaults))
    return tuple(getattr(params, f) for f in FIELDS)


def _theirs(params) -> tuple:
    return tuple(getattr(params, f) for f in FIELDS)


@pytest.mark.parametrize("defaults", MODEL_DEFAULTS)
@pytest.mark.parametrize("body", BODIES)
def test_chat_and_completions_fill_what_the_request_leaves_out_as_vllm_does(defaults, body):
    chat = {"model": "m", "messages": MESSAGES, **body}
    ours = _ours(convert.chat_request("r", OurChatRequest.model_validate(chat)).sampling, defaults)
    assert ours == _theirs(ChatCompletionRequest.model_validate(chat).to_sampling_params(16, defaults))
    completion = {"model": "m", "prompt": "hi", **body}
    ours = _ours(convert.completion_request("r", OurCompletionRequest.model_validate(completion)).sampling, defaults)
    assert ours == _theirs(CompletionRequest.model_validate(completion).to_sampling_params(16, defaults))


@pytest.mark.parametrize("body", [
    {}, {"n": 2, "seed": 3, "stop": ["x"], "logprobs": True, "top_logprobs": 5, "presence_penalty": 0.5,
         "frequency_penalty": 0.2, "min_tokens": 2, "max_tokens": 16},
    {"stream": True, "stop_token_ids": [5], "ignore_eos": True, "skip_special_tokens": False,
     "include_stop_str_in_output": True, "max_tokens": 16}])
def test_every_field_of_a_chat_s_sampling_params_is_vllm_s(body):
    chat = {"model": "m", "messages": MESSAGES, **body}
    request = convert.chat_request("r", OurChatRequest.model_validate(chat))
    ours = sampling_params(request.sampling, 16, request.stream, Vocab(), "processed_logprobs",  # type: ignore[arg-type]
                           defaults=SamplingDefaults(values=MODEL_DEFAULTS[1]))
    theirs = ChatCompletionRequest.model_validate(chat).to_sampling_params(16, MODEL_DEFAULTS[1])
    assert {f: getattr(ours, f) for f in ours.__struct_fields__} == {f: getattr(theirs, f)
                                                                      for f in theirs.__struct_fields__}


@pytest.mark.parametrize("defaults", MODEL_DEFAULTS)
@pytest.mark.parametrize("body", [b for b in BODIES if "min_p" not in b])  # the Responses API takes no min_p
def test_responses_fill_what_the_request_leaves_out_as_vllm_does(defaults, body):
    request = {"model": "m", "input": "hi", **body}
    ours = _ours(generate_request("r", ResponsesRequest.model_validate(request)).sampling, defaults)
    assert ours == _theirs(VllmResponsesRequest.model_validate(request).to_sampling_params(16, defaults))


@pytest.mark.parametrize("given", [None, 5, 40])
@pytest.mark.parametrize("default, cap", [(None, None), (8, None), (None, 10), (8, 10), (30, 6)])
def test_max_tokens_is_vllm_s_within_the_room(given, default, cap):
    """The request's, else the model's default, within the room (prompt 60 of 100) and the cap."""
    defaults = SamplingDefaults(max_tokens=default, max_tokens_cap=cap)
    theirs = get_max_tokens(100, given, 60, {} if default is None else {"max_tokens": default}, cap)
    assert check_lengths(60, SamplingSpec(max_tokens=given), 100, "messages", defaults) == theirs


def test_the_model_s_generation_config_and_the_override_reach_the_defaults(model_dir, tmp_path):
    """Through the backend's own settings and vLLM's ModelConfig, as the processor and the fingerprint read them."""
    model = tmp_path / "model"
    model.mkdir()
    for f in Path(model_dir).iterdir():
        (model / f.name).symlink_to(f)
    (model / "generation_config.json").unlink()
    config = json.loads((Path(model_dir) / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.7, "top_p": 0.8,
                                                             "top_k": 20, "max_new_tokens": 64}))

    def defaults(*flags: str) -> SamplingDefaults:
        settings = load_settings(["--model", str(model), *flags], {})
        return SamplingDefaults.from_model_config(engine_args(settings).create_model_config())

    assert defaults() == SamplingDefaults(values={"temperature": 0.7, "top_p": 0.8, "top_k": 20}, max_tokens=64)
    overridden = defaults("--override-generation-config", '{"temperature": 0.2, "max_new_tokens": 9}')
    assert overridden == SamplingDefaults(values={"temperature": 0.2, "top_p": 0.8, "top_k": 20}, max_tokens=9,
                                          max_tokens_cap=9)
    assert defaults("--generation-config", "vllm") == NO_DEFAULTS
    wire = overridden.wire()
    assert wire == ({"temperature": 0.2, "top_p": 0.8, "top_k": 20.0, "max_tokens": 9.0}, 9)
    assert SamplingDefaults.from_wire(*wire) == overridden


def test_a_response_object_echoes_the_values_sampled_with():
    """vLLM's Responses API echoes its SamplingParams: the model's defaults where the request gave none."""
    defaults = SamplingDefaults(values={"temperature": 0.7, "top_p": 0.8}, max_tokens=16)
    fmt = convert.TokenFormat(as_ids=False)

    def echo(**body) -> dict:
        shape = ResponseShape(ResponsesRequest.model_validate({"input": "hi", **body}), model="m",
                              max_model_len=100, fmt=fmt, defaults=defaults)
        return shape.response("completed", [], num_prompt_tokens=60)

    left_out = echo()
    assert (left_out["temperature"], left_out["top_p"], left_out["max_output_tokens"]) == (0.7, 0.8, 16)
    given = echo(temperature=0.1, top_p=0.3, max_output_tokens=30)
    assert (given["temperature"], given["top_p"], given["max_output_tokens"]) == (0.1, 0.3, 30)
