"""Wire sampling specs and prompts → vLLM SamplingParams and prompt token ids, with 400s for bad input."""

from __future__ import annotations

import json

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from backend.engine import compat
from backend.errors import RequestError
from backend.processor import chat_template
from common.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from protocol.generate import GenerateRequest, SamplingSpec
from sampling.enforced import ENFORCED_KEY, MODE_KEY
from sampling.enforced_input import (
    EnforcedSequence,
    SamplingFieldError,
    decode_enforced_str,
    decode_enforced_tokens,
    resolve_logprobs_mode,
)

MAX_TOP_LOGPROBS = 20

# What SamplingParams raises for out-of-range arguments: ValueError on 0.26, VLLMValidationError (not a
# ValueError) on 0.29.
_ARGUMENT_ERRORS = compat.input_error_types()


# A raw vocabulary string is never shorter, in UTF-8 bytes, than the text its token stands for (byte-level BPE
# writes one character per byte, SentencePiece "▁" for a space, byte fallback "<0x0A>" for one byte); the slack
# covers Unicode normalisation, which can shorten text before it is split.
_NORMALISATION_SLACK = 4


def max_token_bytes(tokenizer) -> int:
    """An upper bound on the UTF-8 bytes of text that one token can stand for."""
    return _NORMALISATION_SLACK * max(len(t.encode("utf-8")) for t in tokenizer.get_vocab())


def render_prompt(vocab: Vocab, req: GenerateRequest, tools: list[dict] | None = None) -> list[int]:
    """Prompt token ids: chat messages (and tools) through the model's chat template, or a raw completion prompt.

    Text that cannot fit in the context is refused before the tokenizer runs."""
    tokenizer = vocab.tokenizer
    if req.messages is not None:
        if not req.messages:
            raise RequestError("messages must not be empty", param="messages")
        vocab.check_fits("".join(m.content for m in req.messages), "messages")
        text = chat_template.render(tokenizer, req.messages, tools, template=vocab.chat_template,
                                    template_kwargs=vocab.chat_template_kwargs)
        return list(tokenizer.encode(text, add_special_tokens=False))
    if req.prompt is None:
        raise RequestError("either messages or prompt is required", param="prompt")
    vocab.check_fits(req.prompt, "prompt")
    return list(tokenizer.encode(req.prompt, add_special_tokens=True))


def check_lengths(num_prompt_tokens: int, spec: SamplingSpec, max_model_len: int, prompt_param: str,
                  defaults: SamplingDefaults = NO_DEFAULTS) -> int:
    """Returns the effective max_tokens (the request's or the model's default, within the room and the model's
    cap, as vLLM's get_max_tokens); raises a 400 naming the field at fault."""
    if num_prompt_tokens == 0:
        raise RequestError("the prompt is empty", param=prompt_param)
    if num_prompt_tokens >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{num_prompt_tokens} input tokens.", param=prompt_param)
    room = max_model_len - num_prompt_tokens
    if spec.max_tokens is None:
        return defaults.max_tokens_for(None, room)
    if spec.max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    if spec.max_tokens > room:
        raise RequestError(
            f"max_tokens={spec.max_tokens} is too large: the prompt has {num_prompt_tokens} tokens and "
            f"the maximum context length is {max_model_len}", param="max_tokens")
    return defaults.max_tokens_for(spec.max_tokens, room)


def _structured(spec: SamplingSpec) -> StructuredOutputsParams | None:
    fmt = spec.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.type == "json_schema":
        try:
            schema = json.loads(fmt.json_schema)
        except json.JSONDecodeError as e:
            raise RequestError(f"json_schema is not valid JSON: {e}", param="response_format") from e
        if not isinstance(schema, dict):
            raise RequestError("json_schema.schema must be a JSON object", param="response_format")
        return StructuredOutputsParams(json=schema)
    raise RequestError(f"unsupported response_format type {fmt.type!r}", param="response_format")


class Vocab:
    """The tokenizer facts requests are checked against (enforced tokens, prompt size)."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, chat_template: str | None = None,
                 chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template  # vllm serve's --chat-template (None: the model's)
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.size = vocab_size
        self.eos_id = int(tokenizer.eos_token_id)
        self.set_max_model_len(max_model_len)

    def set_max_model_len(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.max_text_bytes = max_model_len * max_token_bytes(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def check_fits(self, text: str, param: str) -> None:
        """Refuses, without tokenizing, text that cannot fit in max_model_len tokens (tokenizing tens of MB
        takes seconds on the engine thread, which everything else waits for)."""
        limit = self.max_text_bytes
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            raise RequestError(f"This model's maximum context length is {self.max_model_len} tokens; {param} is "
                               f"far longer ({len(text)} characters)", param=param)


def _enforced(spec: SamplingSpec, vocab: Vocab) -> EnforcedSequence | None:
    """enforced_str wins over enforced_tokens when a request gives both (tests/unit/test_processor_params.py)."""
    if spec.enforced_str is not None:
        vocab.check_fits(spec.enforced_str, "enforced_str")  # it becomes at most max_model_len tokens
        return decode_enforced_str(spec.enforced_str, vocab.encode, vocab.eos_id)
    if spec.enforced_tokens is not None:
        tokens = [{"token": t.token, "top_tokens": list(t.top_tokens)} for t in spec.enforced_tokens]
        return decode_enforced_tokens(tokens, encode=vocab.encode, eos_id=vocab.eos_id, vocab_size=vocab.size)
    return None


def extra_args(spec: SamplingSpec, vocab: Vocab, default_mode: str) -> dict | None:
    """Per-request state for the worker's enforced-sampling hooks (sampling/enforced.py)."""
    try:
        enforced = _enforced(spec, vocab)
        mode = resolve_logprobs_mode(spec.logprobs_mode, enforced) or default_mode
    except SamplingFieldError as e:
        raise RequestError(e.message, param=e.param) from e
    extra: dict = {}
    if enforced is not None:
        extra[ENFORCED_KEY] = list(enforced.token_ids)
    if mode == "raw_logprobs" and spec.logprobs is not None:
        extra[MODE_KEY] = mode
    return extra or None


def sampling_params(spec: SamplingSpec, max_tokens: int, stream: bool, vocab: Vocab, default_mode: str, *,
                    tool_grammar: StructuredOutputsParams | None = None,
                    skip_special_tokens: bool | None = None,
                    defaults: SamplingDefaults = NO_DEFAULTS) -> SamplingParams:
    """`tool_grammar` (tool_choice required or named) replaces response_format, as in vLLM; the tool parser may
    need special tokens kept in the text (`skip_special_tokens`); `defaults` fill what the request left out."""
    if spec.logprobs is not None and not 0 <= spec.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")
    extra = extra_args(spec, vocab, default_mode)
    if extra and ENFORCED_KEY in extra and spec.n != 1:
        raise RequestError("validator replay (enforced tokens) takes n = 1", param="n")
    if skip_special_tokens is None:
        skip_special_tokens = spec.skip_special_tokens
    try:
        return SamplingParams(
            n=spec.n, max_tokens=max_tokens, min_tokens=spec.min_tokens,
            temperature=defaults.value("temperature", spec.temperature), top_p=defaults.value("top_p", spec.top_p),
            top_k=int(defaults.value("top_k", spec.top_k)), min_p=defaults.value("min_p", spec.min_p),
            presence_penalty=spec.presence_penalty, frequency_penalty=spec.frequency_penalty,
            repetition_penalty=defaults.value("repetition_penalty", spec.repetition_penalty),
            seed=spec.seed, stop=list(spec.stop), stop_token_ids=list(spec.stop_token_ids),
            ignore_eos=spec.ignore_eos, include_stop_str_in_output=spec.include_stop_str_in_output,
            skip_special_tokens=skip_special_tokens, logprobs=spec.logprobs,
            structured_outputs=tool_grammar if tool_grammar is not None else _structured(spec), extra_args=extra,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            skip_clone=True,  # made for this request only, as vLLM's OpenAI layer makes it: no deep copy
        )
    except _ARGUMENT_ERRORS as e:  # vLLM's own argument checks (ranges of temperature, top_p, min_tokens, ...)
        raise RequestError(str(e), param=getattr(e, "parameter", None) or _guess_param(str(e))) from e


def _guess_param(message: str) -> str | None:
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "min_tokens", "max_tokens", "seed", "stop", "logprobs"):
        if name in message:
            return name
    return None
