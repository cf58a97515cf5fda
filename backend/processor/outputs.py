"""vLLM CompletionOutput (one choice of a RequestOutput) → wire Delta (text, token ids, logprobs, finish state)."""

from __future__ import annotations

from protocol.generate import Delta, TokenLogprob, TopLogprob

# OpenAI clients choke on -inf; vLLM's server clamps the same way.
MIN_LOGPROB = -9999.0


def _clamp(lp: float) -> float:
    return lp if lp > MIN_LOGPROB else MIN_LOGPROB


def _token_text(entry, token_id: int, tokenizer) -> str:
    if entry.decoded_token is not None:
        return entry.decoded_token
    return tokenizer.decode([token_id])


def _logprobs(comp, num_top: int, tokenizer) -> list[TokenLogprob]:
    result = []
    for token_id, position in zip(comp.token_ids, comp.logprobs, strict=True):
        chosen = position[token_id]
        # vLLM builds {sampled token, top-1..top-k} deduplicated in insertion order; OpenAI shows the first k.
        top = [TopLogprob(token_id=tid, token=_token_text(lp, tid, tokenizer), logprob=_clamp(lp.logprob))
               for tid, lp in list(position.items())[:num_top]]
        result.append(TokenLogprob(token_id=token_id, token=_token_text(chosen, token_id, tokenizer),
                                   logprob=_clamp(chosen.logprob), rank=chosen.rank, top=top))
    return result


def to_delta(comp, num_prompt_tokens: int, num_generated_before: int, num_top: int, tokenizer) -> Delta:
    """`comp` is one choice's CompletionOutput of a DELTA or FINAL_ONLY RequestOutput, so its token ids are the
    new ones only; its finish_reason is set once that choice finished."""
    logprobs = _logprobs(comp, num_top, tokenizer) if comp.logprobs is not None else None
    return Delta(
        rid="", text=comp.text, token_ids=list(comp.token_ids), logprobs=logprobs,
        finish_reason=comp.finish_reason, stop_reason=comp.stop_reason if comp.finish_reason else None,
        num_prompt_tokens=num_prompt_tokens, num_generated_tokens=num_generated_before + len(comp.token_ids),
        index=comp.index,
    )
