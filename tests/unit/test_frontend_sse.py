"""frontend/sse.py: one data line per event, whatever characters the model wrote."""

from __future__ import annotations

import json

from httpx._decoders import LineDecoder

from frontend import sse


def test_sse_event_is_one_line_for_splitlines_readers():
    text = "a\u2028b\u2029c\x85d\x1ce\r\nf é"
    data = sse.event({"choices": [{"delta": {"content": text}}]})
    lines = LineDecoder().decode(data.decode())  # httpx's iter_lines: str.splitlines() rules
    assert lines[0].startswith("data: {") and lines[1:] == [""]
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == text
    assert "é".encode() in data  # everything else stays raw UTF-8 (ensure_ascii off)
