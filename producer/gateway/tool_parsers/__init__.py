"""Tool-call parsers: the model's text to OpenAI ``tool_calls``, whole or streamed.

Pure text, no tokenizer. One module per format; ``auto`` tries them all (the
first opener in the text decides). The gateway picks one with
INFERQ_GATEWAY_TOOL_PARSER; forced calls (tool_choice "required" or a named
function) are JSON whatever the family, and parse with ``forced_stream``.
"""
from __future__ import annotations

from typing import Optional

from inferq.producer.gateway.tool_parsers import forced, hermes, llama3, mistral
from inferq.producer.gateway.tool_parsers.base import (
    ArgsDelta, CallStart, Content, Event, ToolCall, ToolCallStream, new_call_id, parse,
)

FORMATS = {
    "hermes": hermes.OPENERS,
    "llama3": llama3.OPENERS,
    "mistral": mistral.OPENERS,
    "auto": hermes.OPENERS + mistral.OPENERS + llama3.OPENERS,
}
PARSER_NAMES = tuple(FORMATS)
# Formats whose opener is a special token the detokenizer would otherwise drop.
NEEDS_SPECIAL_TOKENS = frozenset({"llama3", "mistral", "auto"})


def tool_stream(parser: str, tool_names: Optional[list[str]] = None) -> ToolCallStream:
    try:
        openers = FORMATS[parser]
    except KeyError:
        raise ValueError(f"unknown tool parser {parser!r}; choose from {', '.join(PARSER_NAMES)}") from None
    return ToolCallStream(openers, tool_names)


def forced_stream(required: bool, tool_names: Optional[list[str]] = None) -> ToolCallStream:
    return ToolCallStream(forced.REQUIRED if required else forced.NAMED, tool_names)


__all__ = ["ArgsDelta", "CallStart", "Content", "Event", "ToolCall", "ToolCallStream", "FORMATS",
           "PARSER_NAMES", "NEEDS_SPECIAL_TOKENS", "forced_stream", "new_call_id", "parse", "tool_stream"]
