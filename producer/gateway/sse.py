"""Server-sent events framing."""
from __future__ import annotations

import json
from typing import Optional

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    # Tell nginx-style proxies not to buffer the stream.
    "X-Accel-Buffering": "no",
}

KEEPALIVE = ": keepalive\n\n"
DONE = "data: [DONE]\n\n"


def data(obj) -> str:
    """One OpenAI-style event: just a data line with compact JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def event(obj, event_id: Optional[str] = None, name: Optional[str] = None) -> str:
    """A full event with id (used for Last-Event-ID resume) and event name."""
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if name is not None:
        lines.append(f"event: {name}")
    lines.append(f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}")
    return "\n".join(lines) + "\n\n"
