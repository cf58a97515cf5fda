"""Server-sent events framing for OpenAI streaming."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
