"""Mistral tool calls after ``[TOOL_CALLS]``: a JSON array of
``{"name", "arguments"}`` (v3 tokenizers, e.g. Mistral-7B-Instruct-v0.3), or
``name[ARGS]{...}`` (v11+ tokenizers). ``[TOOL_CALLS]`` is a special token, so
tool requests are detokenized with special tokens kept."""
from __future__ import annotations

import re

from inferq.producer.gateway.tool_parsers.base import Opener, RegionScan
from inferq.producer.gateway.tool_parsers.json_scan import CallScan, Invalid, Partial, scan_value, skip_ws
from inferq.producer.gateway.tool_parsers.regions import INVALID, read_array, read_one_call

OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _read(r: str, names):
    j = skip_ws(r, 0)
    if j == len(r):
        return RegionScan()
    if r[j] == "[":
        return read_array(r, j, names)
    if r[j] == "{":
        return read_one_call(r, j, names)
    return _read_named(r, j)


def _read_named(r: str, j: int) -> RegionScan:
    """``name[ARGS]{...}``: the name is known once ``[ARGS]`` follows it."""
    m = _NAME.match(r, j)
    if m is None:
        return INVALID
    k = m.end()
    if not r.startswith(ARGS, k):
        # the name or "[ARGS]" is still coming; anything else is not a call
        return RegionScan() if ARGS.startswith(r[k:]) else INVALID
    call = CallScan(name=m.group(), args_start=skip_ws(r, k + len(ARGS)))
    try:
        call.args_end = call.end = scan_value(r, call.args_start)
    except Partial:
        pass
    except Invalid as e:
        call.invalid_at = call.args_end = max(call.args_start, e.at)
        return RegionScan([call], end=call.invalid_at)
    return RegionScan([call], end=call.end)


OPENERS = [Opener(_read, marker=OPEN)]
