"""Request migration at the worker: a redelivered job continues where its reply
stream stopped instead of starting over.

A new attempt reads the job's reply stream, folds it the way every reader does
(inferq.schemas.fold), and continues each choice from the tokens the attempts
before it published: the engine takes them as output the request already has
(gpuworker/engine/continuation.py) and the ``restarted`` event tells readers how
much of each choice stays (``resume`` points). Before any of that is published,
the continuation is replayed here on a request built exactly as the engine will
build it, and kept only if it shows the very text that was published: a job whose
output cannot be continued (a stop already reached, a gap in the stream, text
that would not match) regenerates from the start, which readers see as a plain
``restarted``, never as a splice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from inferq.schemas import decode_event
from inferq.schemas.events import ResumePoint
from inferq.schemas.fold import Assembly, ReplyGap

from inferq.gpuworker.engine.continuation import CannotContinue, continue_from
from inferq.gpuworker.engine.detokenizer import IncrementalDetokenizer
from inferq.gpuworker.engine.request import Request
from inferq.gpuworker.service.choices import choice_params, choice_request_id
from inferq.gpuworker.service.state import JobState


@dataclass
class Continued:
    """One choice's published output, which the new attempt keeps."""

    token_ids: list[int]
    chars: int
    finish_reason: Optional[str] = None  # the choice had already ended (n > 1)

    def point(self, index: int) -> ResumePoint:
        return ResumePoint(index=index, tokens=len(self.token_ids), chars=self.chars, finish_reason=self.finish_reason)


def published(entries: list) -> Optional[Assembly]:
    """The reply stream's entries folded as a reader folds them (None when events are missing)."""
    asm = Assembly()
    try:
        for _, fields in entries:
            asm.feed(decode_event(fields))
    except ReplyGap:
        return None
    return asm


def plan(st: JobState, entries: list, tokenizer, vocab_size: int, max_model_len: int,
         eos_token_ids: tuple[int, ...]) -> Optional[dict[int, Continued]]:
    """What each choice of ``st``'s new attempt continues from, or None to regenerate."""
    job = st.job
    if job.sampling.ranks_choices:
        return None  # best_of > n publishes nothing before the end: nothing to continue
    asm = published(entries)
    if asm is None or asm.finished:
        return None
    out: dict[int, Continued] = {}
    for c in asm.choices():
        if not c.token_ids:
            continue
        if c.finish_reason is not None:
            out[c.index] = Continued(list(c.token_ids), len(c.text), c.finish_reason)
            continue
        params = choice_params(job.sampling, c.index)
        req = Request(choice_request_id(st.id, c.index), st.prompt_ids, params, eos_token_ids=eos_token_ids)
        req.detokenizer = IncrementalDetokenizer(tokenizer, st.prompt_ids, params)
        req.matcher = None if st.matcher is None else st.matcher.deep_copy()
        try:
            shown = continue_from(req, c.token_ids, vocab_size, max_model_len)
        except CannotContinue:
            return None
        if shown != c.text:
            return None
        out[c.index] = Continued(list(c.token_ids), len(c.text))
    if sum(c.finish_reason is not None for c in out.values()) >= job.sampling.n:
        return None  # every choice had ended (its done was never written): regenerate
    return out or None


def resume_points(st: JobState) -> Optional[list[ResumePoint]]:
    if st.continued is None:
        return None
    return [cont.point(i) for i, cont in sorted(st.continued.items())]
