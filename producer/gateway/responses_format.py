"""Response objects and stream events in the shapes of OpenAI's Responses API
(the ``openai`` package's ``types/responses``).

A response's state is a function of durable records only: its spec (request echo),
the job's reply stream and its job-info hash. ``ResponseEvents`` turns the reply
stream, read from its start, into the response's stream events, numbering them as
it goes: the same stream gives the same events with the same ``sequence_number``
in any gateway process, at any time, so ``starting_after=N`` resumes without a gap
or a repeat.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from inferq.schemas.fold import Assembly
from inferq.producer.gateway.responses_output import OutputBuilder
from inferq.producer.gateway.responses_spec import ResponseSpec

# Final states, as OpenAI names them.
FINAL = frozenset({"completed", "failed", "cancelled", "incomplete"})
_TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "failed": "response.failed", "cancelled": "response.failed"}


@dataclass
class Outcome:
    status: str  # queued | in_progress | completed | incomplete | failed | cancelled
    error: Optional[dict] = None
    incomplete_details: Optional[dict] = None

    @property
    def item_status(self) -> str:
        if self.status in ("queued", "in_progress"):
            return "in_progress"
        return "incomplete" if self.status in ("incomplete", "cancelled", "failed") else "completed"


def outcome_of(asm: Assembly, info_status: Optional[str] = None, cancel_requested: bool = False) -> Outcome:
    """The response's status from its folded reply stream (and, for a job not yet
    ended, its job-info status and whether a cancel is pending)."""
    if asm.error_code is not None:
        return Outcome("failed", error={"code": asm.error_code, "message": asm.error_message or asm.error_code})
    if asm.finished:
        reason = asm.finish_reason
        if reason == "length":
            return Outcome("incomplete", incomplete_details={"reason": "max_output_tokens"})
        if reason == "abort":
            return Outcome("cancelled")
        if reason == "deadline":
            return Outcome("failed", error={"code": "timeout", "message": "the response did not finish before its "
                                                                           "deadline"})
        return Outcome("completed")
    if info_status == "cancelled" or cancel_requested:
        return Outcome("cancelled")
    if asm.worker is not None or info_status == "running":
        return Outcome("in_progress")
    return Outcome("queued")


def usage_body(usage: Optional[dict]) -> Optional[dict]:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response_body(spec: ResponseSpec, outcome: Outcome, output: list[dict], usage: Optional[dict],
                  completed_at: Optional[float] = None) -> dict:
    return {
        "id": spec.id, "object": "response", "created_at": spec.created_at, "status": outcome.status,
        "background": spec.background, "error": outcome.error, "incomplete_details": outcome.incomplete_details,
        "instructions": spec.instructions, "max_output_tokens": spec.max_output_tokens, "model": spec.model,
        "output": output, "parallel_tool_calls": spec.parallel_tool_calls,
        "previous_response_id": spec.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "store": spec.store, "temperature": spec.temperature, "text": {"format": spec.text_format},
        "tool_choice": spec.tool_choice, "tools": spec.tools, "top_p": spec.top_p, "truncation": "disabled",
        "usage": usage_body(usage), "user": spec.user, "metadata": spec.metadata,
        "service_tier": spec.service_tier or "default",
        "completed_at": int(completed_at) if completed_at and outcome.status == "completed" else None,
    }


def folded_body(spec: ResponseSpec, asm: Assembly, info: Optional[dict], cancel_requested: bool = False) -> dict:
    """The response object of a job from its whole reply stream (and job-info hash)."""
    from inferq.producer.gateway.responses_output import output_items

    info = info or {}
    outcome = outcome_of(asm, info.get("status"), cancel_requested)
    output = output_items(spec.job_id, spec.tool_plan(), asm, outcome.item_status, spec.reasoning_format())
    return response_body(spec, outcome, output, asm.usage, completed_at=info.get("finished_at"))


class ResponseEvents:
    """The response's stream events from its reply events, numbered from 0."""

    def __init__(self, spec: ResponseSpec):
        self.spec = spec
        self.asm = Assembly(check_shown=True)  # what was streamed stays streamed (a diverging attempt is an error)
        self.builder = OutputBuilder(spec.job_id, spec.tool_plan(), spec.reasoning_format())
        self.seq = 0
        self.started = False
        self.ended = False

    def _numbered(self, events: list[dict]) -> list[dict]:
        for ev in events:
            ev["sequence_number"] = self.seq
            self.seq += 1
        return events

    def _snapshot(self, status: str) -> dict:
        return response_body(self.spec, Outcome(status), [], None)

    def opening(self) -> list[dict]:
        status = "queued" if self.spec.background else "in_progress"
        events = [{"type": "response.created", "response": self._snapshot(status)}]
        if self.spec.background:
            events.append({"type": "response.queued", "response": self._snapshot("queued")})
        return self._numbered(events)

    def feed(self, event) -> list[dict]:
        """Events one reply event adds (raises ReplyDiverged / ReplyGap as the fold does)."""
        piece = self.asm.feed(event)
        out: list[dict] = []
        if not self.started and self.asm.worker is not None:
            self.started = True
            out.append({"type": "response.in_progress", "response": self._snapshot("in_progress")})
        if piece is not None and piece.index == 0:
            out += self.builder.feed(piece.text)
        if self.asm.finished:
            out += self._finish()
        return self._numbered(out)

    def _finish(self) -> list[dict]:
        self.ended = True
        outcome = outcome_of(self.asm)
        out = self.builder.finish(outcome.item_status)
        body = response_body(self.spec, outcome, self.builder.items, self.asm.usage)
        out.append({"type": _TERMINAL_EVENT[outcome.status], "response": body})
        return out

    def failure(self, code: str, message: str) -> list[dict]:
        """The stream cannot go on (the job's records expired, its stream lost events...)."""
        self.ended = True
        return self._numbered([{"type": "error", "code": code, "message": message, "param": None}])
