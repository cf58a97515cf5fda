"""Pure conversions: OpenAI request models → wire GenerateRequest; wire deltas → OpenAI JSON shapes."""

from __future__ import annotations

import json
from typing import cast

from frontend.errors import ApiError
from frontend.openai_models import ChatCompletionRequest, CompletionRequest
from protocol.generate import (
    ChatMessage,
    Delta,
    EnforcedToken,
    GenerateRequest,
    ResponseFormat,
    SamplingSpec,
    TokenLogprob,
)


def _spec(body, max_tokens: int | None, logprobs: int | None) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=max_tokens, min_tokens=body.min_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
        min_p=body.min_p or 0.0, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty,
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
    messages = [ChatMessage(role=m.role, content=m.text(), name=m.name) for m in body.messages]
    return GenerateRequest(rid=rid, sampling=spec, messages=messages, stream=body.stream)


def completion_request(rid: str, body: CompletionRequest) -> GenerateRequest:
    spec = _spec(body, body.max_tokens, body.logprobs)
    # The model's validator turns a one-element prompt list into its string.
    return GenerateRequest(rid=rid, sampling=spec, prompt=cast(str, body.prompt), stream=body.stream)


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


def usage(last: Delta) -> dict:
    return {"prompt_tokens": last.num_prompt_tokens, "completion_tokens": last.num_generated_tokens,
            "total_tokens": last.num_prompt_tokens + last.num_generated_tokens}


def merge(deltas: list[Delta]) -> Delta:
    """Joins the deltas of one request (non-streaming answers are built from the merged delta)."""
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
    return Delta(rid=last.rid, text="".join(d.text for d in deltas),
                 token_ids=[t for d in deltas for t in d.token_ids], logprobs=logprobs,
                 finish_reason=last.finish_reason, stop_reason=last.stop_reason,
                 num_prompt_tokens=last.num_prompt_tokens, num_generated_tokens=last.num_generated_tokens)
