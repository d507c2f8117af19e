"""The completion-events stream: one small record per job or batch that ended.

A job's record is written by the same fenced script that writes its final
state (``transitions.finish`` / ``transitions.fail``), so a job that ended has
its record and a job whose end was refused has none, whatever process dies
when. A batch's record follows its final status (``BatchStore``). The stream,
``keys.completion_events(tag)``, one per partition so the record shares the
job's slot, exists only once a webhook dispatcher created its consumer group:
without one nothing is written, and with one it holds only the records not yet
turned into deliveries (the dispatcher deletes each record in the same script
that writes its deliveries), so it is never trimmed and never loses a record.

This module is the one home of the record's fields and of the mapping from a
record to the OpenAI-style webhook events it produces.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Optional, Union

from inferq.schemas.text import as_str

JOB, BATCH = "job", "batch"
EVENTS_GROUP = "inferq-webhooks"

# Every event type an endpoint may subscribe to.
RESPONSE_EVENTS = ("response.completed", "response.failed", "response.cancelled", "response.incomplete")
BATCH_EVENTS = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")
JOB_EVENTS = ("job.completed", "job.failed", "job.cancelled")
EVENT_TYPES = RESPONSE_EVENTS + BATCH_EVENTS + JOB_EVENTS

# A Responses API response's status by the finish reason of a job that ended "done"
# (the statuses GET /v1/responses/{id} reports, producer/gateway/responses_format.py).
_RESPONSE_BY_REASON = {"length": "incomplete", "abort": "cancelled", "deadline": "failed"}


def job_record(job_id: str, tenant: Optional[str], status: str, reason: str, route: Optional[str],
               at: Optional[float] = None) -> dict[str, str]:
    """The record of a job that ended: status is the job record's final status
    (done | error | cancelled), reason its finish reason or error code, route
    the ``route`` of its metadata (``responses`` for a Responses API job)."""
    return {"kind": JOB, "id": job_id, "tenant": tenant or "", "status": status, "reason": reason or "",
            "route": route or "", "at": str(int(time.time() if at is None else at))}


def batch_record(batch_id: str, tenant: Optional[str], status: str, at: Optional[float] = None) -> dict[str, str]:
    """The record of a batch that reached a final status (completed | failed | cancelled | expired)."""
    return {"kind": BATCH, "id": batch_id, "tenant": tenant or "", "status": status, "reason": "", "route": "",
            "at": str(int(time.time() if at is None else at))}


def payload_facts(raw: Union[bytes, str, None]) -> tuple[Optional[str], Optional[str]]:
    """(tenant, route) from a job payload as read off the queue; (None, None) when unreadable."""
    try:
        job = json.loads(as_str(raw or ""))
    except (ValueError, TypeError):
        return None, None
    if not isinstance(job, dict):
        return None, None
    meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    tenant, route = job.get("tenant"), meta.get("route")
    return (tenant if isinstance(tenant, str) else None), (route if isinstance(route, str) else None)


def event_id(event_type: str, subject_id: str) -> str:
    """The event's id: the same for every record of the same ending (a re-sent
    record, a batch event written twice), so receivers can drop duplicates."""
    return "evt_" + hashlib.sha256(f"{event_type}|{subject_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CompletionEvent:
    kind: str
    id: str
    tenant: str
    status: str
    reason: str
    route: str
    at: int

    @classmethod
    def from_fields(cls, fields: dict) -> "CompletionEvent":
        f = {as_str(k): as_str(v) for k, v in fields.items()}
        return cls(kind=f.get("kind", ""), id=f.get("id", ""), tenant=f.get("tenant", ""),
                   status=f.get("status", ""), reason=f.get("reason", ""), route=f.get("route", ""),
                   at=int(float(f.get("at") or 0)))

    def webhook_events(self) -> list[tuple[str, str]]:
        """(event type, data.id) of each webhook event this ending produces."""
        if self.kind == BATCH:
            return [(f"batch.{self.status}", self.id)] if f"batch.{self.status}" in BATCH_EVENTS else []
        if self.kind != JOB:
            return []
        outcome = {"done": "completed", "error": "failed", "cancelled": "cancelled"}.get(self.status)
        if outcome is None:
            return []
        out = [(f"job.{outcome}", self.id)]
        if self.route == "responses":
            if outcome == "completed":
                outcome = _RESPONSE_BY_REASON.get(self.reason, "completed")
            out.append((f"response.{outcome}", "resp_" + self.id))
        return out

    def payload(self, event_type: str, subject_id: str) -> dict:
        """The body of one webhook event, in OpenAI's shape."""
        return {"id": event_id(event_type, subject_id), "object": "event", "type": event_type,
                "created_at": self.at, "data": {"id": subject_id}}
