"""Pure conversions: OpenAI request models → wire GenerateRequest; wire deltas → OpenAI JSON shapes."""

from __future__ import annotations

import json
from typing import cast

from frontend.errors import ApiError
from frontend.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    Message,
    NamedToolChoice,
    TokenizeRequest,
    ToolParam,
)
from protocol import tokenize
from protocol.generate import (
    ChatMessage,
    Delta,
    EnforcedToken,
    GenerateRequest,
    ResponseFormat,
    SamplingSpec,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)


def _spec(body, max_tokens: int | None, logprobs: int | None) -> SamplingSpec:
    return SamplingSpec(
        n=body.n, max_tokens=max_tokens, min_tokens=body.min_tokens,
        # Left out stays None: the backend applies the model's defaults (common/sampling_defaults.py).
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed, stop=list(body.stop or []), stop_token_ids=list(body.stop_token_ids),
        ignore_eos=body.ignore_eos, include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens, logprobs=logprobs, logprobs_mode=body.logprobs_mode,
    )


def chat_request(rid: str, body: ChatCompletionRequest) -> GenerateRequest:
    max_tokens = body.max_completion_tokens or body.max_tokens
    spec = _spec(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
    fmt = body.response_format
    if fmt is not None:
        schema = json.dumps(fmt.json_schema.schema_) if fmt.type == "json_schema" and fmt.json_schema else ""
        if fmt.type == "json_schema" and not schema:
            raise ApiError(400, "response_format.json_schema is required for type json_schema",
                           param="response_format.json_schema")
        spec.response_format = ResponseFormat(type=fmt.type, json_schema=schema)
    if body.enforced_str is not None:
        spec.enforced_str = body.enforced_str
    elif body.enforced_tokens is not None:
        spec.enforced_tokens = [EnforcedToken(token=t.token, top_tokens=list(t.top_tokens))
                                for t in body.enforced_tokens.tokens]
    choice = body.tool_choice
    return GenerateRequest(
        rid=rid, sampling=spec, messages=messages(body.messages), stream=body.stream, tools=tools(body.tools),
        tool_choice=None if isinstance(choice, NamedToolChoice) else choice,
        named_tool=choice.function.name if isinstance(choice, NamedToolChoice) else None,
        parallel_tool_calls=body.parallel_tool_calls is not False, priority=body.priority)


def messages(body_messages: list[Message]) -> list[ChatMessage]:
    out = []
    for m in body_messages:
        calls = [ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                 for c in m.tool_calls] if m.tool_calls else None
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        out.append(ChatMessage(role=m.role, content=m.text(), name=m.name, tool_calls=calls,
                               tool_call_id=m.tool_call_id, reasoning=reasoning))
    return out


def tools(body_tools: list[ToolParam] | None) -> list[ToolSpec] | None:
    if body_tools is None:
        return None
    return [ToolSpec(name=t.function.name, description=t.function.description,
                     parameters=json.dumps(t.function.parameters) if t.function.parameters is not None else "",
                     strict=t.function.strict) for t in body_tools]


def tokenize_request(rid: str, body: TokenizeRequest) -> tokenize.TokenizeRequest:
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "give exactly one of `prompt` and `messages`", param="prompt")
    if body.messages is not None and body.add_generation_prompt and body.continue_final_message:
        raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                       param="continue_final_message")
    add_special = body.add_special_tokens if body.add_special_tokens is not None else body.messages is None
    return tokenize.TokenizeRequest(
        rid=rid, prompt=body.prompt, messages=messages(body.messages) if body.messages is not None else None,
        tools=tools(body.tools), add_special_tokens=add_special, add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message, return_token_strs=bool(body.return_token_strs))


def detokenize_request(rid: str, body: DetokenizeRequest) -> tokenize.DetokenizeRequest:
    return tokenize.DetokenizeRequest(rid=rid, tokens=list(body.tokens))


def completion_request(rid: str, body: CompletionRequest) -> GenerateRequest:
    spec = _spec(body, body.max_tokens, body.logprobs)
    # The model's validator turns a one-element prompt list into its string.
    return GenerateRequest(rid=rid, sampling=spec, prompt=cast(str, body.prompt), stream=body.stream,
                           priority=body.priority)


class TokenFormat:
    """How logprob token strings look: the token id as a string (Gonka's format) or its text (OpenAI's)."""

    def __init__(self, as_ids: bool) -> None:
        self.as_ids = as_ids

    def name(self, token_id: int, text: str) -> str:
        return str(token_id) if self.as_ids else text

    def chat_logprobs(self, lps: list[TokenLogprob]) -> list[dict]:
        out = []
        for lp in lps:
            name = self.name(lp.token_id, lp.token)
            top = []
            for t in lp.top:
                tname = self.name(t.token_id, t.token)
                top.append({"token": tname, "logprob": t.logprob, "bytes": list(tname.encode())})
            out.append({"token": name, "logprob": lp.logprob, "bytes": list(lp.token.encode()),
                        "top_logprobs": top})
        return out

    def completion_logprobs(self, lps: list[TokenLogprob], text_offset: int) -> dict:
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for lp in lps:
            tokens.append(self.name(lp.token_id, lp.token))
            token_logprobs.append(lp.logprob)
            top_logprobs.append({self.name(t.token_id, t.token): t.logprob for t in lp.top})
            offsets.append(text_offset)
            text_offset += len(lp.token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}


def usage(num_prompt_tokens: int, num_completion_tokens: int, prompt_details: dict | None = None) -> dict:
    """`prompt_details`: usage.prompt_tokens_details, left out when None (vllm serve's null)."""
    result: dict = {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
                    "total_tokens": num_prompt_tokens + num_completion_tokens}
    if prompt_details is not None:
        result["prompt_tokens_details"] = prompt_details
    return result


def choices_usage(choices: list[Delta], prompt_details: dict | None = None) -> dict:
    """Usage of a whole request: its prompt once, the tokens of every choice."""
    return usage(choices[0].num_prompt_tokens, sum(d.num_generated_tokens for d in choices), prompt_details)


def merge(deltas: list[Delta]) -> Delta:
    """Joins the deltas of one choice (non-streaming answers are built from the merged deltas)."""
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
    reasoning = None
    if any(d.reasoning is not None for d in deltas):
        reasoning = "".join(d.reasoning or "" for d in deltas)
    calls: list[ToolCallDelta] = [c for d in deltas for c in (d.tool_calls or [])]
    return Delta(rid=last.rid, text="".join(d.text for d in deltas),
                 token_ids=[t for d in deltas for t in d.token_ids], logprobs=logprobs,
                 finish_reason=last.finish_reason, stop_reason=last.stop_reason,
                 num_prompt_tokens=last.num_prompt_tokens, num_generated_tokens=last.num_generated_tokens,
                 index=last.index, reasoning=reasoning, tool_calls=calls or None,
                 num_cached_tokens=last.num_cached_tokens, num_cache_creation_tokens=last.num_cache_creation_tokens)


def merge_choices(deltas: list[Delta]) -> list[Delta]:
    """The deltas of one request, merged per choice, in choice order."""
    by_index: dict[int, list[Delta]] = {}
    for d in deltas:
        by_index.setdefault(d.index, []).append(d)
    return [merge(by_index[i]) for i in sorted(by_index)]
