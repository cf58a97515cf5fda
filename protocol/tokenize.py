"""Wire structs for /tokenize and /detokenize (answered by the processor process). Wire structs only, no logic.

Each request has exactly one reply with the same rid; a refused request gets its reply with `error` set.
"""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo
from protocol.generate import ChatMessage, ToolSpec


class TokenizeRequest(msgspec.Struct, tag="tokenize", kw_only=True):
    rid: str
    # Exactly one is set: a raw prompt, or chat messages rendered with the model's chat template.
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # Chat only: the tools the template renders.
    tools: list[ToolSpec] | None = None
    # vllm serve's defaults: True for a prompt, False for messages (the template adds what the model needs).
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class TokenizeReply(msgspec.Struct, tag="tokenize_done", kw_only=True):
    rid: str
    tokens: list[int] = []
    # The tokens' vocabulary strings, when asked for.
    token_strs: list[str] | None = None
    max_model_len: int = 0
    error: ErrorInfo | None = None


class DetokenizeRequest(msgspec.Struct, tag="detokenize", kw_only=True):
    rid: str
    tokens: list[int]


class DetokenizeReply(msgspec.Struct, tag="detokenize_done", kw_only=True):
    rid: str
    prompt: str = ""
    error: ErrorInfo | None = None
