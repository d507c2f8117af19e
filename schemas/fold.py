"""The pure core of reading a reply stream: which events count, and what they add up to.

``ReplyFilter`` accepts the events of the attempt a reader follows: a higher
attempt (or its ``restarted`` event) raises the accepted attempt, and events of
lower attempts or repeated ``(attempt, seq)`` pairs are dropped. ``Assembly``
folds accepted events into the job's output, starting over on each new attempt;
for readers that already showed text (an OpenAI stream cannot take text back)
``feed`` returns only what goes beyond what was shown. A ``restarted`` event
with ``resume`` points continues the attempt before it (request migration): each
choice keeps its first tokens and characters, and the new deltas extend them.

A reader that cannot take text back (``Assembly(check_shown=True)``) also checks
that a new attempt's text agrees with what it already showed, and raises
``ReplyDiverged`` otherwise: a client never receives two generations spliced. No I/O here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from inferq.schemas.events import TERMINAL_TYPES, DoneEvent


class ReplyGap(Exception):
    """Events a reader needs are missing from the reply stream (trimmed, or lost
    with a Redis that kept no data): the output would be silently incomplete."""

    def __init__(self, attempt: int, expected: int, got: int):
        self.attempt, self.expected, self.got = attempt, expected, got
        super().__init__(f"the reply stream lost events of attempt {attempt}: expected seq {expected}, got {got}; "
                         "the output cannot be trusted (was the stream trimmed?)")


class ReplyFilter:
    """Drops entries of superseded attempts and repeated (attempt, seq) pairs,
    which a retried publish or a worker that lost its lease may leave behind,
    and raises ReplyGap when an accepted attempt skips a ``seq``: every attempt
    numbers its events 0, 1, 2, ... A reader that resumes mid-stream
    (``from_start`` False) takes its first event's seq as given."""

    def __init__(self, from_start: bool = True) -> None:
        self.attempt = 0
        self.last_seq = -1
        self.from_start = from_start

    def accept(self, ev) -> bool:
        if ev.attempt < self.attempt:
            return False
        if ev.attempt > self.attempt or (not self.from_start and self.last_seq < 0):
            # A new attempt starts at seq 0, unless we joined in its middle.
            if ev.seq != 0 and (self.from_start or self.last_seq >= 0):
                raise ReplyGap(ev.attempt, 0, ev.seq)
            self.attempt, self.last_seq = ev.attempt, ev.seq
            return True
        if ev.seq <= self.last_seq:
            return False
        if ev.seq != self.last_seq + 1:
            raise ReplyGap(ev.attempt, self.last_seq + 1, ev.seq)
        self.last_seq = ev.seq
        return True


class ReplyDiverged(Exception):
    """A new attempt's text contradicts text a reader already showed (the attempt
    regenerated differently): continuing would splice two generations."""

    def __init__(self, attempt: int, index: int, at: int):
        self.attempt, self.index, self.at = attempt, index, at
        super().__init__(f"attempt {attempt} of the job generated text that differs, at character {at} of choice "
                         f"{index}, from what this stream already showed; the stream ends here rather than "
                         "splice two generations")


def is_final(ev) -> bool:
    return ev.type in TERMINAL_TYPES


@dataclass
class Piece:
    """New visible output from one event."""

    text: str
    token_ids: list[int]
    logprobs: Optional[list[dict[int, float]]]
    index: int = 0  # the choice (sampling.n > 1)


@dataclass
class Choice:
    """One choice's output; choice 0's lives on the Assembly itself."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: Optional[str] = None
    shown_chars: int = 0
    shown_tokens: int = 0


@dataclass
class Assembly:
    attempt: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    has_logprobs: bool = False  # the attempt sent logprobs (possibly none yet)
    prompt_token_ids: Optional[list[int]] = None  # with prompt_logprobs, from the first delta
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    timings: Optional[dict] = None
    done: Optional[DoneEvent] = None  # the accepted final event, when it is a ``done``
    error_code: Optional[str] = None
    error_message: Optional[str] = None
    worker: Optional[str] = None
    restarts: int = 0
    finished: bool = False
    # What a streaming client has already been sent (characters / tokens).
    shown_chars: int = 0
    shown_tokens: int = 0
    # Choices 1..n-1 of a several-choice job (n > 1), by index.
    others: dict[int, Choice] = field(default_factory=dict)
    # Readers that cannot take text back: the text each choice showed, and the choices
    # whose new attempt has not yet been checked against it.
    check_shown: bool = False
    _shown_text: dict[int, str] = field(default_factory=dict, repr=False)
    _unchecked: set[int] = field(default_factory=set, repr=False)
    _filter: ReplyFilter = field(default_factory=ReplyFilter, repr=False)

    def feed(self, event) -> Optional[Piece]:
        if not self._filter.accept(event):
            return None  # a repeat, or a late write from a superseded attempt
        kind = event.type
        if kind == "restarted" and event.resume is not None:
            self._resume(event.attempt, event.resume)
        elif event.attempt > self.attempt or kind == "restarted":
            self._restart(event.attempt, force=kind == "restarted")
        if kind == "restarted":
            pass
        elif kind == "started":
            self.worker = event.worker
        elif kind == "delta" and event.index:
            return self._feed_other(event)
        elif kind == "delta":
            self.text += event.text
            self.token_ids += event.token_ids
            if event.logprobs is not None:
                self.has_logprobs = True
                self.logprobs += event.logprobs
            if event.prompt_logprobs is not None:
                self.prompt_token_ids, self.prompt_logprobs = event.prompt_token_ids, event.prompt_logprobs
            return self._unshown()
        elif kind == "done":
            self.done = event
            self.finish_reason = event.finish_reason
            self.usage = event.usage.model_dump()
            self.timings = event.timings.model_dump()
            for end in event.choices or []:
                if end.index:
                    self.others.setdefault(end.index, Choice(end.index)).finish_reason = end.finish_reason
        elif kind == "error":
            self.error_code, self.error_message = event.code, event.message
        if kind in TERMINAL_TYPES:
            self.finished = True
        return None

    def _restart(self, attempt: int, force: bool = False) -> None:
        if attempt == self.attempt and not force:
            return
        if self.text or self.token_ids:
            self.restarts += 1
        self.attempt = attempt
        self.text, self.token_ids, self.logprobs, self.has_logprobs = "", [], [], False
        # What a stream already showed of each choice stays shown (it cannot be taken back).
        self.others = {i: Choice(i, shown_chars=c.shown_chars, shown_tokens=c.shown_tokens)
                       for i, c in self.others.items()}
        self.prompt_token_ids = self.prompt_logprobs = None
        self._unchecked = set(self._shown_text)

    def _resume(self, attempt: int, points) -> None:
        """The new attempt continues the old one: keep each listed choice's first
        tokens and characters (choices not listed start empty), and its prompt data."""
        self.restarts += 1
        self.attempt = attempt
        keep = {p.index: p for p in points}
        p = keep.get(0)
        if p is None:
            self.text, self.token_ids, self.logprobs, self.has_logprobs = "", [], [], False
        else:
            self.text, self.token_ids, self.logprobs = self.text[:p.chars], self.token_ids[:p.tokens], self.logprobs[:p.tokens]
        others = {}
        for i, c in self.others.items():
            q = keep.get(i)
            kept = Choice(i, shown_chars=c.shown_chars, shown_tokens=c.shown_tokens)
            if q is not None:
                kept.text, kept.token_ids, kept.logprobs = c.text[:q.chars], c.token_ids[:q.tokens], c.logprobs[:q.tokens]
                kept.finish_reason = q.finish_reason
            others[i] = kept
        self.others = others
        self._unchecked = set(self._shown_text)

    def _check(self, index: int, text: str) -> None:
        """After a new attempt: its text must agree with what this reader showed."""
        shown = self._shown_text.get(index, "")
        n = min(len(text), len(shown))
        if text[:n] != shown[:n]:
            at = next(k for k in range(n) if text[k] != shown[k])
            raise ReplyDiverged(self.attempt, index, at)
        if len(text) >= len(shown):
            self._unchecked.discard(index)

    def _showing(self, piece: "Piece") -> "Piece":
        if self.check_shown and piece.text:
            self._shown_text[piece.index] = self._shown_text.get(piece.index, "") + piece.text
        return piece

    @property
    def n_choices(self) -> int:
        return 1 + max(self.others, default=0)

    def choices(self) -> list[Choice]:
        """Every choice by index, choice 0 (the Assembly's own fields) first."""
        first = Choice(0, self.text, self.token_ids, self.logprobs, self.finish_reason)
        return [first] + [self.others.get(i) or Choice(i) for i in range(1, self.n_choices)]

    def _feed_other(self, event) -> Optional[Piece]:
        c = self.others.setdefault(event.index, Choice(event.index))
        c.text += event.text
        c.token_ids += event.token_ids
        if event.logprobs is not None:
            c.logprobs += event.logprobs
        if event.finish_reason is not None:
            c.finish_reason = event.finish_reason
        if c.index in self._unchecked:
            self._check(c.index, c.text)
        if len(c.text) <= c.shown_chars and len(c.token_ids) <= c.shown_tokens:
            return None
        piece = Piece(text=c.text[c.shown_chars:], token_ids=c.token_ids[c.shown_tokens:],
                      logprobs=c.logprobs[c.shown_tokens:] if c.logprobs else None, index=c.index)
        c.shown_chars, c.shown_tokens = max(c.shown_chars, len(c.text)), max(c.shown_tokens, len(c.token_ids))
        return self._showing(piece)

    def _unshown(self) -> Optional[Piece]:
        if 0 in self._unchecked:
            self._check(0, self.text)
        if len(self.text) <= self.shown_chars and len(self.token_ids) <= self.shown_tokens:
            return None
        piece = Piece(
            text=self.text[self.shown_chars:],
            token_ids=self.token_ids[self.shown_tokens:],
            logprobs=self.logprobs[self.shown_tokens:] if self.logprobs else None,
        )
        self.shown_chars = max(self.shown_chars, len(self.text))
        self.shown_tokens = max(self.shown_tokens, len(self.token_ids))
        return self._showing(piece)
