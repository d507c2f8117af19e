"""Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}`` as the whole
answer (several separated by ``;``), or after ``<|python_tag|>``. Without the tag,
a JSON answer is a call only when it names one of the request's tools."""
from __future__ import annotations

from inferq.producer.gateway.tool_parsers.base import Opener
from inferq.producer.gateway.tool_parsers.regions import read_calls

PYTHON_TAG = "<|python_tag|>"


def _read(r: str, names):
    return read_calls(r, 0, names, sep=";")


OPENERS = [Opener(_read, marker=PYTHON_TAG), Opener(_read, lookahead="{")]
