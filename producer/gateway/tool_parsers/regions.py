"""Region readers the formats share: one call object, calls separated by a
character, a JSON array of calls. Offsets are relative to the region text."""
from __future__ import annotations

from typing import Optional

from inferq.producer.gateway.tool_parsers.base import RegionScan
from inferq.producer.gateway.tool_parsers.json_scan import CallScan, scan_call, skip_ws

INVALID = RegionScan(invalid=True)


def known(call: CallScan, names: Optional[frozenset]) -> CallScan:
    """With a list of tool names (formats without a marker), a call to any other
    name is not a call: ``{"name": "Bob", "age": 3}`` is an answer."""
    if names is not None and call.name is not None and call.name not in names:
        return CallScan(invalid_at=0)
    return call


def read_calls(r: str, i: int, names: Optional[frozenset], sep: str, close: str = "") -> RegionScan:
    """Call objects from ``r[i]`` on, separated by ``sep``; the region ends after
    ``close`` (when given) or at the first text that is not another call."""
    calls: list[CallScan] = []
    j = skip_ws(r, i)
    while True:
        if j == len(r):
            return RegionScan(calls)
        if r[j] != "{":
            if not calls:
                return INVALID
            return RegionScan(calls, end=j + len(close) if close and r.startswith(close, j) else j)
        call = known(scan_call(r, j), names)
        if call.partial:
            return RegionScan(calls + [call])
        if call.name is None:
            return RegionScan(calls, end=j) if calls else INVALID
        calls.append(call)
        if call.invalid_at is not None:
            return RegionScan(calls, end=call.invalid_at)
        k = skip_ws(r, call.end)
        if k == len(r):
            return RegionScan(calls)
        if r[k] == sep:
            j = skip_ws(r, k + 1)
            continue
        if close and r[k] == close:
            return RegionScan(calls, end=k + 1)
        return RegionScan(calls, end=k)


def read_one_call(r: str, i: int, names: Optional[frozenset], close: str = "") -> RegionScan:
    """One call object at ``r[i]`` (after whitespace), then optionally the text ``close``."""
    j = skip_ws(r, i)
    if j == len(r):
        return RegionScan()
    if r[j] != "{":
        return INVALID
    call = known(scan_call(r, j), names)
    if call.partial:
        return RegionScan([call])
    if call.name is None:
        return INVALID
    if call.invalid_at is not None:
        return RegionScan([call], end=call.invalid_at)
    k = skip_ws(r, call.end) if close else call.end
    if close:
        if r.startswith(close, k):
            return RegionScan([call], end=k + len(close))
        if close.startswith(r[k:]):  # the closer is still coming (or was left out at the end)
            return RegionScan([call])
    return RegionScan([call], end=k)


def read_array(r: str, i: int, names: Optional[frozenset]) -> RegionScan:
    """A JSON array of call objects at ``r[i]`` (after whitespace)."""
    j = skip_ws(r, i)
    if j == len(r):
        return RegionScan()
    if r[j] != "[":
        return INVALID
    return read_calls(r, j + 1, names, sep=",", close="]")
