"""What a request will cost the processor, counted before any work, and the limits it is held to (issue 33).

The processor's main thread produces every stream's deltas, so whatever it does for one request delays all the
others. Characters of text alone do not tell the cost: a chat of 500,000 empty messages has none, yet the chat
template renders each one (15 s of Jinja here). So a request is counted in what the work grows with:

- `messages`: chat messages and the tool calls in them, which the template renders (each costs its markup
  whatever its content);
- `chars`: characters of every string the template or the tokenizer reads: contents, names, reasoning, tool
  calls' names and arguments, tool specs, a completion prompt, `enforced_str`;
- `ids`: token ids the request carries: /detokenize's `tokens`, `stop_token_ids`, enforced tokens.

Limits, all derived from the served context (`max_model_len`), refused with a 400 naming the field before the
template or the tokenizer runs (`check`):

- messages ≤ max_model_len: no chat template renders a turn in less than one token (Qwen3's wraps each in
  `<|im_start|>role\\n…<|im_end|>\\n`), so more turns than the context has tokens can never fit;
- chars ≤ `Vocab.max_text_bytes` (max_model_len × the most bytes one token stands for; the existing bound on a
  prompt's text, backend/processor/params.py), now over every string the template reads, not only contents;
- /detokenize ids ≤ max_model_len: no prompt or output of this model is longer;
- so a /tokenize answer has at most max_text_bytes + (markup per turn × messages) tokens.

What passes is bounded, but not always small: a request is done inline only while it is small on every count
(`inline`: ≤ 64 messages and tool calls, ≤ 64k characters, ≤ 4k ids: ~0.1 s at most here); the rest goes to the
processor's `tokenize` thread (backend/processor/main.py), where it delays only requests queued behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.errors import RequestError
from protocol.generate import ChatMessage, GenerateRequest, ToolSpec
from protocol.tokenize import DetokenizeRequest, TokenizeRequest

INLINE_MESSAGES = 64
INLINE_CHARS = 64 * 1024
INLINE_IDS = 4 * 1024


@dataclass(frozen=True)
class Cost:
    messages: int = 0
    chars: int = 0
    ids: int = 0
    # The field a refusal names for chars: "messages", "prompt" or "enforced_str".
    text_param: str = "messages"


def _message_chars(m: ChatMessage) -> int:
    n = len(m.role) + len(m.content) + len(m.name or "") + len(m.tool_call_id or "") + len(m.reasoning or "")
    return n + sum(len(c.id) + len(c.name) + len(c.arguments) for c in m.tool_calls or ())


def _tool_chars(tools: list[ToolSpec] | None) -> int:
    return sum(len(t.name) + len(t.description or "") + len(t.parameters) for t in tools or ())


def _chat(messages: list[ChatMessage] | None, tools: list[ToolSpec] | None, prompt: str | None) -> Cost:
    if messages is not None:
        turns = len(messages) + sum(len(m.tool_calls or ()) for m in messages)
        return Cost(messages=turns, chars=sum(map(_message_chars, messages)) + _tool_chars(tools))
    return Cost(chars=len(prompt or ""), text_param="prompt")


def few(req: GenerateRequest | TokenizeRequest | DetokenizeRequest) -> bool:
    """Whether counting the request's cost is itself small: its lists are short (len() only, no loop over them).
    A request that is not few is counted, checked and done on the tokenize thread."""
    if isinstance(req, DetokenizeRequest):
        return len(req.tokens) <= INLINE_IDS
    lists = len(req.messages or ()) <= INLINE_MESSAGES and len(req.tools or ()) <= INLINE_MESSAGES
    # Then over at most INLINE_MESSAGES messages: their tool calls, which the count loops over too.
    lists = lists and sum(len(m.tool_calls or ()) for m in req.messages or ()) <= INLINE_MESSAGES
    if isinstance(req, TokenizeRequest):
        return lists
    s = req.sampling
    return lists and len(s.stop_token_ids) + len(s.enforced_tokens or ()) <= INLINE_IDS


def of_generate(req: GenerateRequest) -> Cost:
    base = _chat(req.messages, req.tools, req.prompt)
    s = req.sampling
    enforced = sum(1 + len(t.top_tokens) for t in s.enforced_tokens or ())
    enforced_chars = len(s.enforced_str or "")
    # A refusal names the field that holds most of the text: the one the client must shorten.
    text_param = "enforced_str" if enforced_chars > base.chars else base.text_param
    return Cost(messages=base.messages, chars=base.chars + enforced_chars,
                ids=len(s.stop_token_ids) + enforced, text_param=text_param)


def of_tokenize(req: TokenizeRequest | DetokenizeRequest) -> Cost:
    if isinstance(req, DetokenizeRequest):
        return Cost(ids=len(req.tokens))
    return _chat(req.messages, req.tools, req.prompt)


def inline(req: GenerateRequest | TokenizeRequest | DetokenizeRequest) -> bool:
    """Whether the work is small enough to do on the thread that sends every stream's deltas: counted only when
    counting is itself small (`few`)."""
    if not few(req):
        return False
    cost = of_generate(req) if isinstance(req, GenerateRequest) else of_tokenize(req)
    return cost.messages <= INLINE_MESSAGES and cost.chars <= INLINE_CHARS and cost.ids <= INLINE_IDS


def check(cost: Cost, max_model_len: int, max_text_bytes: int, *, detokenize: bool = False) -> None:
    """A 400 naming the field for a request that can never fit; nothing rendered or tokenized yet."""
    if cost.messages > max_model_len:
        raise RequestError(f"{cost.messages} messages and tool calls: more than this model's maximum context "
                           f"length ({max_model_len} tokens) can hold", param="messages")
    if cost.chars > max_text_bytes:
        raise RequestError(f"This model's maximum context length is {max_model_len} tokens; "
                           f"{cost.text_param} is far longer ({cost.chars} characters)", param=cost.text_param)
    if detokenize and cost.ids > max_model_len:
        raise RequestError(f"{cost.ids} tokens: more than this model's maximum context length ({max_model_len})",
                           param="tokens")
