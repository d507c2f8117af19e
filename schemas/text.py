"""Redis replies arrive as bytes (clients run without decode_responses); every
reader turns them into text with this one helper."""
from __future__ import annotations


def as_str(v) -> str:
    # "replace": a damaged field must not crash a reader that only displays it.
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
