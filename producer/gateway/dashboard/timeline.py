"""A job's reply stream as a timeline: queued -> attempt N started -> first
token -> done / error, one row per attempt, and its text (the fold every
reader uses, schemas/fold.py). Pure: it takes the stream's entries."""
from __future__ import annotations

from typing import Any

from inferq.schemas import decode_event
from inferq.schemas.fold import Assembly, ReplyGap
from inferq.schemas.text import as_str


def _at(entry_id: str) -> float:
    return int(entry_id.split("-")[0]) / 1000.0


def build(entries: list) -> dict[str, Any]:
    """``entries``: XRANGE of the reply stream, oldest first."""
    timeline: list[dict] = []
    attempts: dict[int, dict] = {}
    asm = Assembly()
    gap = None
    for eid, fields in entries:
        eid = as_str(eid)
        try:
            ev = decode_event(fields)
        except Exception:
            continue  # not an event of ours: the page shows what it can
        at = _at(eid)
        row = attempts.get(ev.attempt)
        if ev.type == "queued":
            timeline.append({"at": at, "type": "queued", "attempt": ev.attempt})
        elif ev.type == "started":
            row = attempts[ev.attempt] = {"attempt": ev.attempt, "worker": ev.worker, "started_at": at,
                                          "first_token_at": None, "ended_at": None, "outcome": "running",
                                          "tokens": 0}
            timeline.append({"at": at, "type": "started", "attempt": ev.attempt, "worker": ev.worker})
        elif ev.type == "restarted":
            timeline.append({"at": at, "type": "restarted", "attempt": ev.attempt, "reason": ev.reason})
        elif ev.type == "delta" and row is not None:
            if row["first_token_at"] is None and ev.token_ids:
                row["first_token_at"] = at
                timeline.append({"at": at, "type": "first_token", "attempt": ev.attempt})
            row["tokens"] += len(ev.token_ids)
        elif ev.type == "done":
            timeline.append({"at": at, "type": "done", "attempt": ev.attempt, "finish_reason": ev.finish_reason,
                             "usage": ev.usage.model_dump(), "timings": ev.timings.model_dump()})
        elif ev.type == "error":
            timeline.append({"at": at, "type": "error", "attempt": ev.attempt, "code": ev.code,
                             "message": ev.message})
        if ev.type in ("done", "error") and row is not None:
            row["ended_at"], row["outcome"] = at, ev.type
        if gap is None:
            try:
                asm.feed(ev)
            except ReplyGap as e:
                gap = str(e)
    ordered = [attempts[a] for a in sorted(attempts)]
    for row in ordered[:-1]:
        if row["outcome"] == "running":
            row["outcome"] = "superseded"  # a later attempt took over (its worker died or lost the lease)
    return {"timeline": timeline, "attempts": ordered, "text": asm.text, "finished": asm.finished,
            "finish_reason": asm.finish_reason, "usage": asm.usage, "timings": asm.timings,
            "error": {"code": asm.error_code, "message": asm.error_message} if asm.error_code else None,
            "reply_gap": gap}
