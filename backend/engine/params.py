"""Wire sampling specs and prompts → vLLM SamplingParams and prompt token ids, with 400s for bad input."""

from __future__ import annotations

import json

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from backend.errors import RequestError
from protocol.generate import GenerateRequest, SamplingSpec

MAX_TOP_LOGPROBS = 20


def render_prompt(tokenizer, req: GenerateRequest) -> list[int]:
    """Prompt token ids: chat messages through the model's chat template, or a raw completion prompt."""
    if req.messages is not None:
        if not req.messages:
            raise RequestError("messages must not be empty", param="messages")
        conversation = [{"role": m.role, "content": m.content} for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # jinja raises its own types for templates that reject a conversation
            raise RequestError(f"chat template failed: {e}", param="messages") from e
        return list(tokenizer.encode(text, add_special_tokens=False))
    if req.prompt is None:
        raise RequestError("either messages or prompt is required", param="prompt")
    return list(tokenizer.encode(req.prompt, add_special_tokens=True))


def check_lengths(num_prompt_tokens: int, spec: SamplingSpec, max_model_len: int, prompt_param: str) -> int:
    """Returns the effective max_tokens; raises a 400 naming the field at fault."""
    if num_prompt_tokens == 0:
        raise RequestError("the prompt is empty", param=prompt_param)
    if num_prompt_tokens >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{num_prompt_tokens} input tokens.", param=prompt_param)
    room = max_model_len - num_prompt_tokens
    if spec.max_tokens is None:
        return room
    if spec.max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    if spec.max_tokens > room:
        raise RequestError(
            f"max_tokens={spec.max_tokens} is too large: the prompt has {num_prompt_tokens} tokens and "
            f"the maximum context length is {max_model_len}", param="max_tokens")
    return spec.max_tokens


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


def sampling_params(spec: SamplingSpec, max_tokens: int, stream: bool) -> SamplingParams:
    if spec.logprobs is not None and not 0 <= spec.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")
    try:
        return SamplingParams(
            n=1, max_tokens=max_tokens, min_tokens=spec.min_tokens, temperature=spec.temperature,
            top_p=spec.top_p, top_k=spec.top_k, min_p=spec.min_p, presence_penalty=spec.presence_penalty,
            frequency_penalty=spec.frequency_penalty, repetition_penalty=spec.repetition_penalty,
            seed=spec.seed, stop=list(spec.stop), stop_token_ids=list(spec.stop_token_ids),
            ignore_eos=spec.ignore_eos, include_stop_str_in_output=spec.include_stop_str_in_output,
            skip_special_tokens=spec.skip_special_tokens, logprobs=spec.logprobs,
            structured_outputs=_structured(spec),
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except ValueError as e:  # vLLM's own argument checks (ranges of temperature, top_p, ...)
        raise RequestError(str(e), param=_guess_param(str(e))) from e


def _guess_param(message: str) -> str | None:
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "min_tokens", "max_tokens", "seed", "stop", "logprobs"):
        if name in message:
            return name
    return None
