"""Server-sent events framing."""
from __future__ import annotations

import json
from typing import Callable, Optional

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    # Tell nginx-style proxies not to buffer the stream.
    "X-Accel-Buffering": "no",
}

KEEPALIVE = ": keepalive\n\n"
DONE = "data: [DONE]\n\n"

# json.dumps with these options builds a new encoder on every call; one is enough.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def data(obj) -> str:
    """One OpenAI-style event: just a data line with compact JSON."""
    return f"data: {_encode(obj)}\n\n"


class TextEvents:
    """``data(body(text))`` for a stream whose chunks differ only in one string
    (the token text): the JSON around it is encoded once per stream, the text
    per chunk, giving the same bytes as ``data``."""

    _MARK = "\x00inferq-text\x00"

    def __init__(self, body: Callable[[str], dict]):
        self.body = body
        whole, mark = data(body(self._MARK)), _encode(self._MARK)
        self.parts = whole.split(mark) if whole.count(mark) == 1 else None

    def __call__(self, text: str) -> str:
        if self.parts is None:  # the mark also occurs elsewhere (never in practice)
            return data(self.body(text))
        head, tail = self.parts
        return head + _encode(text) + tail


def event(obj, event_id: Optional[str] = None, name: Optional[str] = None) -> str:
    """A full event with id (used for Last-Event-ID resume) and event name."""
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if name is not None:
        lines.append(f"event: {name}")
    lines.append(f"data: {_encode(obj)}")
    return "\n".join(lines) + "\n\n"
