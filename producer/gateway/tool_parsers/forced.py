"""A forced call's output (tool_choice "required" or a named function): the
grammar makes the whole answer JSON, so it needs no family format: one call
object (named) or an array of them (required)."""
from __future__ import annotations

from inferq.producer.gateway.tool_parsers.base import Opener
from inferq.producer.gateway.tool_parsers.regions import read_array, read_one_call

NAMED = [Opener(lambda r, names: read_one_call(r, 0, names), lookahead="{")]
REQUIRED = [Opener(lambda r, names: read_array(r, 0, names), lookahead="[")]
