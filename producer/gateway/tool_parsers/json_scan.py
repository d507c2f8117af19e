"""Scanning JSON that may still be arriving: where a value ends, or that the text
so far is a valid beginning (``Partial``) or cannot be JSON (``Invalid``).

The tool-call parsers read a call's JSON while the model is still writing it, so
they need to know the raw span of a value (its exact characters, which become the
call's ``arguments``) before and after it is complete. ``json`` cannot say that.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

WS = " \t\r\n"
_NUMBER_CHARS = set("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
# Keys a call object may carry its arguments under: OpenAI/Hermes/Mistral say
# "arguments", Llama 3.x's JSON tool format says "parameters".
ARG_KEYS = ("arguments", "parameters")


class Partial(Exception):
    """The text ends before the value does."""


class Invalid(Exception):
    def __init__(self, at: int):
        self.at = at
        super().__init__(f"not JSON at offset {at}")


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WS:
        i += 1
    return i


def need(s: str, i: int) -> None:
    if i >= len(s):
        raise Partial


def scan_string(s: str, i: int) -> int:
    """``s[i]`` is '"': the index after the closing quote."""
    j = i + 1
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":  # raw control characters are not allowed in JSON strings
            raise Invalid(j)
        j += 1
    raise Partial


def scan_value(s: str, i: int) -> int:
    """The index after the JSON value starting at ``s[i]``."""
    need(s, i)
    c = s[i]
    if c == '"':
        return scan_string(s, i)
    if c == "{":
        return _scan_container(s, i, "}", keyed=True)
    if c == "[":
        return _scan_container(s, i, "]", keyed=False)
    if c in _NUMBER_CHARS:
        j = i
        while j < len(s) and s[j] in _NUMBER_CHARS:
            j += 1
        if j == len(s):
            raise Partial  # more digits may follow
        try:
            json.loads(s[i:j])
        except ValueError:
            raise Invalid(i) from None
        return j
    if c.isalpha():
        j = i
        while j < len(s) and s[j].isalpha():
            j += 1
        word = s[i:j]
        if word in _LITERALS and j < len(s):
            return j
        if j == len(s) and any(lit.startswith(word) for lit in _LITERALS):
            raise Partial
        raise Invalid(i)
    raise Invalid(i)


def _scan_container(s: str, i: int, close: str, keyed: bool) -> int:
    j = skip_ws(s, i + 1)
    need(s, j)
    if s[j] == close:
        return j + 1
    while True:
        if keyed:
            need(s, j)
            if s[j] != '"':
                raise Invalid(j)
            j = skip_ws(s, scan_string(s, j))
            need(s, j)
            if s[j] != ":":
                raise Invalid(j)
            j = skip_ws(s, j + 1)
        j = skip_ws(s, scan_value(s, j))
        need(s, j)
        if s[j] == ",":
            j = skip_ws(s, j + 1)
            continue
        if s[j] == close:
            return j + 1
        raise Invalid(j)


@dataclass
class CallScan:
    """One call as far as the text goes. Offsets index the scanned text.

    ``name`` is known once its string is complete; the arguments span is
    ``[args_start, args_end)``, ``args_end`` None while the value is still open.
    ``end`` is set when the call is complete, ``invalid_at`` when the text
    stopped being a call there."""

    name: Optional[str] = None
    args_start: Optional[int] = None
    args_end: Optional[int] = None
    end: Optional[int] = None
    invalid_at: Optional[int] = None

    @property
    def partial(self) -> bool:
        return self.end is None and self.invalid_at is None

    def arguments(self, s: str) -> str:
        if self.args_start is None:
            return ""
        return s[self.args_start:self.args_end if self.args_end is not None else len(s)]


def scan_call(s: str, i: int) -> CallScan:
    """A call object ``{"name": "...", "arguments": {...}}`` starting at ``s[i]``
    (which is '{'), keys in any order; other keys are skipped."""
    call = CallScan()
    try:
        j = skip_ws(s, i + 1)
        need(s, j)
        if s[j] == "}":
            call.end = j + 1
            return call
        while True:
            need(s, j)
            if s[j] != '"':
                raise Invalid(j)
            key_end = scan_string(s, j)
            key = json.loads(s[j:key_end])
            j = skip_ws(s, key_end)
            need(s, j)
            if s[j] != ":":
                raise Invalid(j)
            start = j = skip_ws(s, j + 1)
            need(s, j)
            is_args = key in ARG_KEYS and call.args_start is None
            if is_args:
                call.args_start = start
            end = scan_value(s, start)
            if is_args:
                call.args_end = end
            if key == "name" and call.name is None:
                name = json.loads(s[start:end])
                if not isinstance(name, str) or not name:
                    raise Invalid(start)
                call.name = name
            j = skip_ws(s, end)
            need(s, j)
            if s[j] == ",":
                j = skip_ws(s, j + 1)
                continue
            if s[j] == "}":
                call.end = j + 1
                return call
            raise Invalid(j)
    except Partial:
        return call
    except Invalid as e:
        call.invalid_at = e.at
        if call.args_start is not None and call.args_end is None:
            call.args_end = max(call.args_start, e.at)
        return call
