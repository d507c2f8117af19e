"""The one incremental tool-call parser every format plugs into.

A format is a list of ``Opener``s: text that opens a tool-call region (Hermes'
``<tool_call>``, Mistral's ``[TOOL_CALLS]``), or a character that does so only at
the very start of the output (Llama 3.x's bare JSON, a forced call's JSON). Its
``read`` function says, for the region text so far, which calls it holds, whether
the region has ended, or that it is not a tool call after all.

Text is fed as it arrives; out come ``Content``, ``CallStart`` and ``ArgsDelta``
events. Text that may still turn into a call (a half-written opener, a region
whose call has no name yet) is held back. A call is committed once its name is
known; its arguments then stream as raw text, exactly the characters the model
wrote. The non-streamed result is this same machine fed the whole text at once,
so a streamed response always assembles to the non-streamed one.
"""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Callable, Optional

from inferq.producer.gateway.tool_parsers.json_scan import WS, CallScan


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class ArgsDelta:
    index: int
    text: str


Event = Content | CallStart | ArgsDelta


@dataclass
class RegionScan:
    """What a region's text holds so far: its calls (a call without a name yet
    may be last), ``end`` (offset where plain text resumes) once the region is
    over, ``invalid`` when the text turned out not to be a tool call."""

    calls: list[CallScan] = field(default_factory=list)
    end: Optional[int] = None
    invalid: bool = False


Reader = Callable[[str, Optional[frozenset]], RegionScan]


@dataclass(frozen=True)
class Opener:
    read: Reader
    marker: str = ""      # consumed text that opens a region
    lookahead: str = ""   # or: this character, at the start of the output, opens one (and is part of it)


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_ID_CHARS = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


class ToolCallStream:
    """Feed text with ``feed``, end with ``finish``; ``tool_names`` (the request's
    tools) lets formats without a marker tell a call from a JSON answer."""

    def __init__(self, openers: list[Opener], tool_names: Optional[list[str]] = None):
        self.openers = openers
        self.markers = [o for o in openers if o.marker]
        self.names = frozenset(tool_names) if tool_names else None
        self.buf = ""
        self.pos = 0                 # start of the text not yet handled
        self.region: Optional[tuple[int, int, Opener]] = None  # (opener start, body start, opener)
        self.region_calls: list[ToolCall] = []
        self.calls: list[ToolCall] = []
        self.content: list[str] = []
        self.held_ws = ""            # trailing whitespace of the content, sent once more content follows
        self.started = False         # content other than whitespace went out: no start-of-output opener now
        self.finished = False

    # -- public -------------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._run(out, final=True)
        if self.held_ws and not self.calls:  # whitespace around calls is not content
            self._send(out, self.held_ws)
        self.held_ws = ""
        self.finished = True
        return out

    @property
    def text(self) -> str:
        return "".join(self.content)

    # -- the machine -----------------------------------------------------------
    def _run(self, out: list[Event], final: bool) -> None:
        while self._region_step(out, final) if self.region else self._content_step(out, final):
            pass

    def _content_step(self, out: list[Event], final: bool) -> bool:
        s = self.buf[self.pos:]
        if not self.started and not self.calls:
            k = len(s) - len(s.lstrip(WS))
            if k == len(s):  # only whitespace so far: it may precede a call
                if final:
                    self._emit(out, s)
                    self.pos = len(self.buf)
                return False
            for op in self.openers:
                if op.lookahead and s[k] == op.lookahead:
                    self.region = (self.pos, self.pos + k, op)
                    return True
        hit = self._first_marker(s)
        if hit is not None:
            k, op = hit
            self._emit(out, s[:k])
            start = self.pos + k
            self.region = (start, start + len(op.marker), op)
            return True
        hold = 0 if final else self._marker_prefix_len(s)
        self._emit(out, s[:len(s) - hold])
        self.pos += len(s) - hold
        return False

    def _region_step(self, out: list[Event], final: bool) -> bool:
        start, body, op = self.region
        r = self.buf[body:]
        scan = op.read(r, self.names if op.lookahead else None)
        named = [c for c in scan.calls if c.name is not None]
        for i, c in enumerate(named):
            if i == len(self.region_calls):
                self.held_ws = ""
                call = ToolCall(len(self.calls), new_call_id(), c.name)
                self.calls.append(call)
                self.region_calls.append(call)
                out.append(CallStart(call.index, call.id, call.name))
            self._stream_args(out, self.region_calls[i], c.arguments(r))
        if scan.invalid and not self.region_calls:
            return self._release(out)
        if scan.end is not None or scan.invalid:
            for call, c in zip(self.region_calls, named):
                if c.end is not None and c.args_start is None:
                    self._stream_args(out, call, "{}")  # a call without arguments takes none
            self._close_region(body + (scan.end if scan.end is not None else len(r)))
            return True
        if final:
            if not self.region_calls:
                return self._release(out)
            self._close_region(len(self.buf))  # cut off mid-call: it ends as it is
        return False

    # -- helpers --------------------------------------------------------------
    def _stream_args(self, out: list[Event], call: ToolCall, args: str) -> None:
        if len(args) > len(call.arguments) and args.startswith(call.arguments):
            out.append(ArgsDelta(call.index, args[len(call.arguments):]))
            call.arguments = args

    def _release(self, out: list[Event]) -> bool:
        """The region is not a call: its opener is plain text; go on after it."""
        start, body, op = self.region
        self.region = None
        self._emit(out, self.buf[start:body])
        if op.lookahead:
            self.started = True  # the lookahead character is content now
            self._emit(out, self.buf[body:body + 1])
            body += 1
        self.pos = body
        return True

    def _close_region(self, pos: int) -> None:
        self.region = None
        self.region_calls = []
        self.pos = pos

    def _emit(self, out: list[Event], text: str) -> None:
        if not text:
            return
        body = text.rstrip(WS)
        if body:
            self._send(out, self.held_ws + body)
            self.held_ws = text[len(body):]
            self.started = True
        else:
            self.held_ws += text

    def _send(self, out: list[Event], text: str) -> None:
        self.content.append(text)
        out.append(Content(text))

    def _first_marker(self, s: str) -> Optional[tuple[int, Opener]]:
        best = None
        for op in self.markers:
            k = s.find(op.marker)
            if k >= 0 and (best is None or k < best[0]):
                best = (k, op)
        return best

    def _marker_prefix_len(self, s: str) -> int:
        """Length of the longest end of ``s`` that could begin a marker."""
        longest = 0
        for op in self.markers:
            for n in range(min(len(op.marker) - 1, len(s)), longest, -1):
                if op.marker.startswith(s[-n:]):
                    longest = n
                    break
        return longest


def parse(stream: ToolCallStream, text: str) -> tuple[str, list[ToolCall]]:
    """The whole output at once: (content, calls)."""
    stream.feed(text)
    stream.finish()
    return stream.text, stream.calls
