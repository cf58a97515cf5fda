"""Unit tests for backend/processor/prepare.py: a request tokenized and checked, then turned into vLLM engine requests
(one per choice), with the tiny model's tokenizer and a stand-in for vLLM's InputProcessor (no engine)."""

from __future__ import annotations

import dataclasses
import types

import pytest
from transformers import AutoTokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.input_processor import InputProcessor

from backend.errors import RequestError
from backend.processor.params import Vocab, render_prompt
from backend.processor.parsing import ChatParsers
from backend.processor.prepare import Preparer, shorten
from backend.startup.settings import load_settings
from protocol.generate import ChatMessage, EnforcedToken, GenerateRequest, ResponseFormat, SamplingSpec, ToolSpec

MAX_MODEL_LEN = 128
MAX_NUM_SEQS = 4
WEATHER = ToolSpec(name="get_weather", parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')


class FakeInputs:
    """vLLM's InputProcessor as the Preparer uses it: records each call, fails with `error` when set."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.error: Exception | None = None
        self.model_config = types.SimpleNamespace(max_model_len=MAX_MODEL_LEN)

    def process_inputs(self, request_id, prompt, params, supported_tasks, priority=0) -> EngineCoreRequest:
        self.calls.append((request_id, prompt, params, supported_tasks, priority))
        if self.error is not None:
            raise self.error
        return EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt["prompt_token_ids"], mm_features=None,
                                 sampling_params=params, pooling_params=None, arrival_time=0.0, lora_request=None,
                                 cache_salt=None, data_parallel_rank=None, priority=priority)

    assign_request_id = staticmethod(InputProcessor.assign_request_id)  # vLLM's own: "<id>-<8 random chars>"


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _preparer(tokenizer, enforced_sampling: bool = True, tool_parser: str = "",
              inputs: FakeInputs | None = None) -> Preparer:
    settings = dataclasses.replace(load_settings([], {}), enforced_sampling=enforced_sampling)
    return Preparer(settings, inputs or FakeInputs(), Vocab(tokenizer, len(tokenizer), MAX_MODEL_LEN), MAX_MODEL_LEN,
                    ChatParsers(tool_parser, "", bool(tool_parser), tokenizer), MAX_NUM_SEQS)


def _chat(sampling: SamplingSpec | None = None, **kw) -> GenerateRequest:
    return GenerateRequest(rid="r", sampling=sampling or SamplingSpec(),
                           messages=[ChatMessage(role="user", content="hi")], **kw)


# --- tokenize ---

def test_tokenize_renders_the_prompt_and_fills_the_context(tokenizer):
    preparer = _preparer(tokenizer)
    req = _chat()
    tokenized = preparer.tokenize(req)
    assert tokenized.prompt_ids == render_prompt(preparer.vocab, req)
    assert tokenized.params.max_tokens == MAX_MODEL_LEN - len(tokenized.prompt_ids)
    assert tokenized.parsing is None  # no tools, no reasoning parser


def test_the_engines_fitted_context_bounds_every_request_from_then_on(tokenizer):
    inputs = FakeInputs()
    preparer = _preparer(tokenizer, inputs=inputs)
    preparer.engine_built(MAX_MODEL_LEN // 2)  # vLLM's auto-fit gave the engine less than the config said
    tokenized = preparer.tokenize(_chat())
    assert tokenized.params.max_tokens == MAX_MODEL_LEN // 2 - len(tokenized.prompt_ids)
    assert inputs.model_config.max_model_len == preparer.vocab.max_model_len == MAX_MODEL_LEN // 2
    with pytest.raises(RequestError, match=f"maximum context length is {MAX_MODEL_LEN // 2} tokens"):
        preparer.tokenize(GenerateRequest(rid="r", sampling=SamplingSpec(), prompt="hi " * (MAX_MODEL_LEN // 2)))
    preparer.engine_built(0)  # an engine that reports none keeps what the processor has
    assert preparer.max_model_len == MAX_MODEL_LEN // 2


def test_tokenize_completion_prompt_param_is_prompt(tokenizer):
    preparer = _preparer(tokenizer)
    with pytest.raises(RequestError) as info:
        preparer.tokenize(GenerateRequest(rid="r", sampling=SamplingSpec(max_tokens=MAX_MODEL_LEN), prompt="hi"))
    assert info.value.param == "max_tokens"
    with pytest.raises(RequestError) as info:
        preparer.tokenize(GenerateRequest(rid="r", sampling=SamplingSpec(), prompt="hi " * MAX_MODEL_LEN))
    assert info.value.param == "prompt"


@pytest.mark.parametrize("n", [0, MAX_NUM_SEQS + 1])
def test_tokenize_n_within_max_num_seqs(tokenizer, n):
    with pytest.raises(RequestError) as info:
        _preparer(tokenizer).tokenize(_chat(SamplingSpec(n=n)))
    assert info.value.param == "n" and f"between 1 and {MAX_NUM_SEQS}" in info.value.message
    assert _preparer(tokenizer).tokenize(_chat(SamplingSpec(n=MAX_NUM_SEQS))).params.n == MAX_NUM_SEQS


def test_tokenize_hands_the_tool_grammar_and_prompt_to_the_parsing(tokenizer):
    tokenized = _preparer(tokenizer, tool_parser="hermes").tokenize(_chat(tools=[WEATHER], tool_choice="required"))
    parsing = tokenized.parsing
    assert parsing is not None and parsing.prompt_ids == tokenized.prompt_ids
    assert tokenized.params.structured_outputs is not None
    assert tokenized.params.structured_outputs == parsing.request.structured_outputs


@pytest.mark.parametrize(("sampling", "param"), [
    (SamplingSpec(enforced_tokens=[EnforcedToken(token="5")]), "enforced_tokens"),
    (SamplingSpec(enforced_str="hi"), "enforced_tokens"),
    (SamplingSpec(logprobs=1, logprobs_mode="raw_logprobs"), "logprobs_mode"),
])
def test_tokenize_refuses_validator_replay_when_enforced_sampling_is_off(tokenizer, sampling, param):
    with pytest.raises(RequestError) as info:
        _preparer(tokenizer, enforced_sampling=False).tokenize(_chat(sampling))
    assert info.value.param == param and "disabled on this backend" in info.value.message
    assert _preparer(tokenizer).tokenize(_chat(sampling)).params.extra_args


# --- to_engine ---

def test_to_engine_one_choice_is_one_request_with_an_internal_id(tokenizer):
    inputs = FakeInputs()
    preparer = _preparer(tokenizer, inputs=inputs)
    req = _chat(priority=3)
    tokenized = preparer.tokenize(req)
    engine = preparer.to_engine("e1", req, tokenized)
    [request] = engine.requests
    assert engine.parent is None
    assert request.external_req_id == "e1" and request.request_id.startswith("e1-") and request.request_id != "e1"
    [(rid, prompt, params, tasks, priority)] = inputs.calls
    assert (rid, prompt["prompt_token_ids"], params, tasks, priority) == (
        "e1", tokenized.prompt_ids, tokenized.params, ("generate",), 3)


def test_to_engine_fans_n_choices_out_as_vllm_does(tokenizer):
    preparer = _preparer(tokenizer)
    req = _chat(SamplingSpec(n=3, seed=10))
    engine = preparer.to_engine("e1", req, preparer.tokenize(req))
    assert engine.parent is not None and engine.parent.external_req_id == "e1"
    internal = engine.parent.request_id
    assert [r.request_id for r in engine.requests] == [f"{i}_{internal}" for i in range(3)]
    assert [r.sampling_params.seed for r in engine.requests] == [10, 11, 12]
    assert all(r.sampling_params.n == 1 and r.external_req_id == "e1" for r in engine.requests)
    assert len({id(r) for r in engine.requests}) == 3  # each child its own request object


def _fails_in_vllm(tokenizer, req: GenerateRequest, error: Exception, tool_parser: str = ""):
    """to_engine of `req`, with vLLM's input processing raising `error`."""
    inputs = FakeInputs()
    preparer = _preparer(tokenizer, tool_parser=tool_parser, inputs=inputs)
    tokenized = preparer.tokenize(req)
    inputs.error = error
    return lambda: preparer.to_engine("e1", req, tokenized)


@pytest.mark.parametrize(("req", "param"), [
    (_chat(), None),
    (_chat(SamplingSpec(response_format=ResponseFormat(type="json_object"))), "response_format"),
    (_chat(tools=[WEATHER], tool_choice="required"), "tools"),
])
def test_to_engine_vllm_input_errors_are_400s(tokenizer, req, param):
    to_engine = _fails_in_vllm(tokenizer, req, ValueError("too many logprobs"), tool_parser="hermes")
    with pytest.raises(RequestError) as info:
        to_engine()
    assert (info.value.message, info.value.param) == ("too many logprobs", param)


def test_to_engine_grammar_compile_errors_are_400s_naming_the_field(tokenizer):
    req = _chat(SamplingSpec(response_format=ResponseFormat(type="json_schema", json_schema='{"type": "object"}')))
    with pytest.raises(RequestError) as info:
        _fails_in_vllm(tokenizer, req, RuntimeError("bad schema"))()
    assert (info.value.param, info.value.message) == ("response_format", "invalid response_format: bad schema")


def test_to_engine_other_runtime_errors_are_not_client_mistakes(tokenizer):
    with pytest.raises(RuntimeError, match="engine bug"):
        _fails_in_vllm(tokenizer, _chat(), RuntimeError("engine bug"))()



def test_a_long_vllm_message_is_shortened_in_the_middle():
    """vLLM lists every offending value: 100,000 out-of-vocabulary stop_token_ids made a 1.4 MB error body."""
    message = f"token_id(s) {list(range(151_000, 251_000))} in stop_token_ids contain out-of-vocab token ids. " \
              f"Vocabulary size: 151936"
    short = shorten(message)
    assert len(short) < 1100
    assert short.startswith("token_id(s) [151000, 151001") and short.endswith("Vocabulary size: 151936")
    assert f"({len(message) - 900} characters left out)" in short
    assert shorten("n must be at least 1") == "n must be at least 1"
