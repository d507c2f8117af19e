"""Hermes-style calls (Qwen2.5, Qwen3, Hermes, and our fallback prompt):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one per tag."""
from __future__ import annotations

from inferq.producer.gateway.tool_parsers.base import Opener
from inferq.producer.gateway.tool_parsers.regions import read_one_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _read(r: str, names):
    return read_one_call(r, 0, names, close=CLOSE)


OPENERS = [Opener(_read, marker=OPEN)]
