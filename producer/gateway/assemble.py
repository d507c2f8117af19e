"""Fold a job's reply events into its result, attempt by attempt.

A redelivered job starts over (`restarted`); its new output replaces the old
one. For clients that already received text (an OpenAI stream cannot take text
back) ``feed`` returns only what goes beyond what was already shown.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from schemas.events import TERMINAL_TYPES
from producer.client import ReplyFilter


@dataclass
class Piece:
    """New visible output from one event."""

    text: str
    token_ids: list[int]
    logprobs: Optional[list[dict[int, float]]]


@dataclass
class Assembly:
    attempt: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_token_ids: Optional[list[int]] = None  # with prompt_logprobs, from the first delta
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    timings: Optional[dict] = None
    error_code: Optional[str] = None
    error_message: Optional[str] = None
    worker: Optional[str] = None
    restarts: int = 0
    finished: bool = False
    # What a streaming client has already been sent (characters / tokens).
    shown_chars: int = 0
    shown_tokens: int = 0
    _filter: ReplyFilter = field(default_factory=ReplyFilter, repr=False)

    def feed(self, event) -> Optional[Piece]:
        if not self._filter.accept(event):
            return None  # a repeat, or a late write from a superseded attempt
        if event.attempt > self.attempt:
            self._restart(event.attempt)
        kind = event.type
        if kind == "restarted":
            self._restart(event.attempt, force=True)
        elif kind == "started":
            self.worker = event.worker
        elif kind == "delta":
            self.text += event.text
            self.token_ids += event.token_ids
            if event.logprobs:
                self.logprobs += event.logprobs
            if event.prompt_logprobs is not None:
                self.prompt_token_ids, self.prompt_logprobs = event.prompt_token_ids, event.prompt_logprobs
            return self._unshown()
        elif kind == "done":
            self.finish_reason = event.finish_reason
            self.usage = event.usage.model_dump()
            self.timings = event.timings.model_dump()
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
        self.text, self.token_ids, self.logprobs = "", [], []
        self.prompt_token_ids = self.prompt_logprobs = None

    def _unshown(self) -> Optional[Piece]:
        if len(self.text) <= self.shown_chars and len(self.token_ids) <= self.shown_tokens:
            return None
        piece = Piece(
            text=self.text[self.shown_chars:],
            token_ids=self.token_ids[self.shown_tokens:],
            logprobs=self.logprobs[self.shown_tokens:] if self.logprobs else None,
        )
        self.shown_chars = max(self.shown_chars, len(self.text))
        self.shown_tokens = max(self.shown_tokens, len(self.token_ids))
        return piece
