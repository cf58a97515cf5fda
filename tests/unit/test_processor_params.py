"""Unit tests for backend/processor/params.py: prompts, length checks, the enforced-sampling extra args and vLLM
SamplingParams from the wire spec, with the tiny model's tokenizer (no engine)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from backend.errors import RequestError
from backend.processor.params import (
    MAX_TOP_LOGPROBS,
    Vocab,
    check_lengths,
    extra_args,
    max_token_bytes,
    render_prompt,
    sampling_params,
)
from protocol.generate import ChatMessage, EnforcedToken, GenerateRequest, ResponseFormat, SamplingSpec
from sampling.enforced import ENFORCED_KEY, MODE_KEY

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def vocab(tokenizer) -> Vocab:
    return Vocab(tokenizer, len(tokenizer), MAX_MODEL_LEN)


def _chat(*contents: str, **kw) -> GenerateRequest:
    return GenerateRequest(rid="r", sampling=SamplingSpec(),
                           messages=[ChatMessage(role="user", content=c) for c in contents], **kw)


def _refusal(call, *args, **kw) -> RequestError:
    with pytest.raises(RequestError) as info:
        call(*args, **kw)
    assert info.value.status == 400
    return info.value


# --- max_token_bytes, Vocab ---

class _Vocabulary:
    def __init__(self, *tokens: str) -> None:
        self.tokens = tokens

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}


def test_max_token_bytes_is_four_times_the_longest_raw_token():
    assert max_token_bytes(_Vocabulary("a", "abc", "▁é")) == 4 * len("▁é".encode())


def test_max_token_bytes_bounds_the_text_of_every_token(tokenizer):
    bound = max_token_bytes(tokenizer)
    assert all(len(tokenizer.decode([i]).encode("utf-8")) <= bound for i in range(len(tokenizer)))


def test_vocab_takes_the_tokenizer_facts(tokenizer, vocab):
    assert (vocab.size, vocab.eos_id, vocab.max_model_len) == (len(tokenizer), tokenizer.eos_token_id, MAX_MODEL_LEN)
    assert vocab.max_text_bytes == MAX_MODEL_LEN * max_token_bytes(tokenizer)
    assert vocab.encode("Hello world") == tokenizer.encode("Hello world", add_special_tokens=False)
    assert vocab.chat_template is None and vocab.chat_template_kwargs == {}


def test_vocab_check_fits_counts_characters_and_utf8_bytes(vocab):
    vocab.check_fits("x" * vocab.max_text_bytes, "prompt")
    assert _refusal(vocab.check_fits, "x" * (vocab.max_text_bytes + 1), "prompt").param == "prompt"
    # Fewer characters than the limit, more bytes; a lone surrogate counts its 3 bytes instead of failing.
    assert _refusal(vocab.check_fits, "é" * (vocab.max_text_bytes // 2 + 1), "messages").param == "messages"
    assert _refusal(vocab.check_fits, "\ud800" * (vocab.max_text_bytes // 3 + 1), "prompt").param == "prompt"


# --- render_prompt ---

def test_render_prompt_completion_keeps_the_tokenizers_special_tokens(tokenizer, vocab):
    req = GenerateRequest(rid="r", sampling=SamplingSpec(), prompt="Hello world")
    assert render_prompt(vocab, req) == tokenizer.encode("Hello world", add_special_tokens=True)


def test_render_prompt_chat_goes_through_the_chat_template(tokenizer, vocab):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert render_prompt(vocab, _chat("hi")) == tokenizer.encode(text, add_special_tokens=False)


def test_render_prompt_uses_the_configured_template_and_kwargs_and_gives_it_the_tools(tokenizer):
    template = ("{{ greeting }}{% for t in tools or [] %}<{{ t.function.name }}>{% endfor %}"
                "{% for m in messages %}[{{ m.content }}]{% endfor %}")
    vocab = Vocab(tokenizer, len(tokenizer), MAX_MODEL_LEN, template, {"greeting": "Hey"})
    assert render_prompt(vocab, _chat("a", "b")) == tokenizer.encode("Hey[a][b]", add_special_tokens=False)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert render_prompt(vocab, _chat("a"), tools) == tokenizer.encode("Hey<get_weather>[a]", add_special_tokens=False)


def test_render_prompt_refusals_name_the_field(vocab):
    assert _refusal(render_prompt, vocab, _chat()).param == "messages"
    assert _refusal(render_prompt, vocab, GenerateRequest(rid="r", sampling=SamplingSpec())).param == "prompt"
    long = "x" * (vocab.max_text_bytes + 1)
    assert _refusal(render_prompt, vocab, _chat(long[:10], long[10:])).param == "messages"
    assert _refusal(render_prompt, vocab, GenerateRequest(rid="r", sampling=SamplingSpec(), prompt=long)).param == \
        "prompt"


def test_render_prompt_refuses_long_text_before_the_tokenizer_sees_it(tokenizer):
    calls = []

    class Counting:
        """The tiny tokenizer, counting encode calls."""

        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, text, **kw):
            calls.append(len(text))
            return tokenizer.encode(text, **kw)

    vocab = Vocab(Counting(), len(tokenizer), MAX_MODEL_LEN)
    req = GenerateRequest(rid="r", sampling=SamplingSpec(), prompt="x" * (vocab.max_text_bytes + 1))
    _refusal(render_prompt, vocab, req)
    assert calls == []


# --- check_lengths ---

@pytest.mark.parametrize(("num_prompt", "max_tokens", "expected"), [
    (10, None, 54),  # None: up to the context length
    (10, 54, 54),
    (10, 1, 1),
    (63, None, 1),
])
def test_check_lengths_effective_max_tokens(num_prompt, max_tokens, expected):
    assert check_lengths(num_prompt, SamplingSpec(max_tokens=max_tokens), MAX_MODEL_LEN, "prompt") == expected


@pytest.mark.parametrize(("num_prompt", "max_tokens", "param", "words"), [
    (0, None, "messages", "the prompt is empty"),
    (64, None, "messages", "maximum context length is 64 tokens. However, your request has 64 input tokens"),
    (10, 0, "max_tokens", "at least 1"),
    (10, 55, "max_tokens", "max_tokens=55 is too large"),
])
def test_check_lengths_refusals(num_prompt, max_tokens, param, words):
    error = _refusal(check_lengths, num_prompt, SamplingSpec(max_tokens=max_tokens), MAX_MODEL_LEN, "messages")
    assert error.param == param and words in error.message


# --- extra_args: what the worker's enforced-sampling hooks get ---

def test_extra_args_none_for_an_ordinary_request(vocab):
    assert extra_args(SamplingSpec(), vocab, "processed_logprobs") is None
    assert extra_args(SamplingSpec(logprobs=2), vocab, "processed_logprobs") is None


def test_extra_args_enforced_str_is_tokenized_and_ends_in_eos(vocab):
    extra = extra_args(SamplingSpec(enforced_str="Hello world"), vocab, "processed_logprobs")
    assert extra == {ENFORCED_KEY: [*vocab.encode("Hello world"), vocab.eos_id]}


def test_extra_args_enforced_str_wins_over_enforced_tokens(vocab):
    spec = SamplingSpec(enforced_str="hi", enforced_tokens=[EnforcedToken(token="5")])
    assert extra_args(spec, vocab, "processed_logprobs") == {ENFORCED_KEY: [*vocab.encode("hi"), vocab.eos_id]}


def test_extra_args_enforced_tokens_by_id(vocab):
    spec = SamplingSpec(enforced_tokens=[EnforcedToken(token="5", top_tokens=["5", "7"]), EnforcedToken(token="9")])
    assert extra_args(spec, vocab, "processed_logprobs") == {ENFORCED_KEY: [5, 9, vocab.eos_id]}


@pytest.mark.parametrize(("mode", "default", "logprobs", "expected"), [
    ("raw_logprobs", "processed_logprobs", 1, {MODE_KEY: "raw_logprobs"}),
    (None, "raw_logprobs", 0, {MODE_KEY: "raw_logprobs"}),  # the deployment's default
    ("raw_logprobs", "processed_logprobs", None, None),  # no logprobs asked: nothing to make raw
    ("processed_logprobs", "raw_logprobs", 1, None),  # the engine's own mode
])
def test_extra_args_raw_logprobs_mode(vocab, mode, default, logprobs, expected):
    assert extra_args(SamplingSpec(logprobs_mode=mode, logprobs=logprobs), vocab, default) == expected


@pytest.mark.parametrize(("spec", "param"), [
    (SamplingSpec(logprobs_mode="sorted"), "logprobs_mode"),
    (SamplingSpec(enforced_tokens=[]), "enforced_tokens"),
    (SamplingSpec(enforced_tokens=[EnforcedToken(token="100000")]), "enforced_tokens"),
    (SamplingSpec(enforced_str="x" * 10**6), "enforced_str"),  # longer than max_model_len tokens can be
])
def test_extra_args_bad_fields_are_400s_naming_them(vocab, spec, param):
    assert _refusal(extra_args, spec, vocab, "processed_logprobs").param == param


# --- sampling_params ---

def _params(vocab, stream: bool = False, **spec):
    return sampling_params(SamplingSpec(**spec), 16, stream, vocab, "processed_logprobs")


def test_sampling_params_copy_the_spec(vocab):
    params = _params(vocab, n=2, min_tokens=3, temperature=0.5, top_p=0.9, top_k=7, min_p=0.1, presence_penalty=0.2,
                     frequency_penalty=0.3, repetition_penalty=1.1, seed=42, stop=["\n"], stop_token_ids=[5],
                     ignore_eos=True, include_stop_str_in_output=True, skip_special_tokens=False, logprobs=3)
    got = (params.n, params.max_tokens, params.min_tokens, params.temperature, params.top_p, params.top_k,
           params.min_p, params.presence_penalty, params.frequency_penalty, params.repetition_penalty, params.seed,
           params.stop, params.stop_token_ids, params.ignore_eos, params.include_stop_str_in_output,
           params.skip_special_tokens, params.logprobs)
    assert got == (2, 16, 3, 0.5, 0.9, 7, 0.1, 0.2, 0.3, 1.1, 42, ["\n"], [5], True, True, False, 3)
    assert params.extra_args is None and params.structured_outputs is None


def test_sampling_params_stream_takes_deltas_else_the_final_output(vocab):
    assert _params(vocab, stream=True).output_kind == RequestOutputKind.DELTA
    assert _params(vocab).output_kind == RequestOutputKind.FINAL_ONLY


def test_sampling_params_carry_the_enforced_ids(vocab):
    params = _params(vocab, enforced_tokens=[EnforcedToken(token="5")])
    assert params.extra_args == {ENFORCED_KEY: [5, vocab.eos_id]}


@pytest.mark.parametrize(("fmt", "expected"), [
    (None, None),
    (ResponseFormat(type="text"), None),
    (ResponseFormat(type="json_object"), StructuredOutputsParams(json_object=True)),
    (ResponseFormat(type="json_schema", json_schema=json.dumps({"type": "object"})),
     StructuredOutputsParams(json={"type": "object"})),
])
def test_sampling_params_response_format(vocab, fmt, expected):
    assert _params(vocab, response_format=fmt).structured_outputs == expected


@pytest.mark.parametrize(("fmt", "words"), [
    (ResponseFormat(type="json_schema", json_schema="{not json"), "not valid JSON"),
    (ResponseFormat(type="json_schema", json_schema="[1]"), "must be a JSON object"),
    (ResponseFormat(type="yaml"), "unsupported response_format type 'yaml'"),
])
def test_sampling_params_bad_response_format(vocab, fmt, words):
    error = _refusal(_params, vocab, response_format=fmt)
    assert error.param == "response_format" and words in error.message


def test_sampling_params_tool_grammar_replaces_response_format_and_may_keep_special_tokens(vocab):
    grammar = StructuredOutputsParams(json={"type": "array"})
    params = sampling_params(SamplingSpec(response_format=ResponseFormat(type="json_object")), 16, False, vocab,
                             "processed_logprobs", tool_grammar=grammar, skip_special_tokens=False)
    assert params.structured_outputs == grammar and params.skip_special_tokens is False


@pytest.mark.parametrize(("spec", "param"), [
    ({"logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
    ({"logprobs": -1}, "top_logprobs"),
    ({"n": 2, "enforced_str": "hi"}, "n"),  # a replay is one choice
    ({"temperature": -1.0}, "temperature"),  # vLLM's own checks, with the parameter it names
    ({"top_p": 2.0}, "top_p"),
    ({"min_tokens": 20}, "min_tokens"),  # above max_tokens: vLLM names no parameter, its message does
])
def test_sampling_params_refusals_name_the_field(vocab, spec, param):
    assert _refusal(_params, vocab, **spec).param == param


def test_sampling_params_accept_the_top_logprobs_bounds(vocab):
    assert _params(vocab, logprobs=0).logprobs == 0
    assert _params(vocab, logprobs=MAX_TOP_LOGPROBS).logprobs == MAX_TOP_LOGPROBS
