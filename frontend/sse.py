"""Server-sent events framing for OpenAI streaming."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"

# Characters that JSON leaves raw but str.splitlines() breaks lines at: clients that read the stream with
# httpx's iter_lines (splitlines rules) would get a chat's data line cut in two wherever the model wrote one.
_LINE_BREAKERS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def event(payload: dict) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    for raw, escaped in _LINE_BREAKERS:
        if raw in data:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"
