"""The Redis records of a job besides its streams, each with one writer and one reader.

- job-info hash ``inferq:job:{id}``: status, model, tenant, attempt, timestamps,
  usage or error. Admission creates it (its fields come from ``info_queued``;
  the Lua script adds ``entry_id``), the worker's intake bumps ``attempt``,
  ``info_running`` / ``close_job`` change it; ``parse_info`` reads it.
- DLQ entry on ``inferq:dlq:{model}``: ``DeadLetter``; ``fail_job`` writes it,
  ``DeadLetter.from_fields`` reads it.

The writers take anything with redis-py's pipeline methods (a pipeline, or the
worker's recorded Batch), so each state change stays one round trip.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

from schemas import keys
from schemas.events import ErrorEvent, encode_event
from schemas.text import as_str

# Statuses of the job-info hash.
QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINAL_STATUSES = frozenset({DONE, ERROR, CANCELLED})

STATUS = "status"
ATTEMPT = "attempt"  # incremented by the worker at each delivery (HINCRBY)
ENTRY_ID = "entry_id"  # set by the admission script: the id XADD returned

_INT_FIELDS = ("attempt", "prompt_tokens", "completion_tokens")
_TIME_FIELDS = ("created_at", "started_at", "finished_at", "deadline")


def info_queued(model: str, tenant: Optional[str], created_at: float, deadline: Optional[float]) -> dict[str, str]:
    return {STATUS: QUEUED, "model": model, "tenant": tenant or "", ATTEMPT: "0",
            "created_at": repr(created_at), "deadline": "" if deadline is None else repr(deadline)}


def info_running(worker: str, attempt: int, started_at: float, model: str, tenant: Optional[str]) -> dict[str, Any]:
    return {STATUS: RUNNING, "worker": worker, ATTEMPT: attempt, "started_at": repr(started_at),
            "model": model, "tenant": tenant or ""}


def info_done(status: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {STATUS: status, "finish_reason": finish_reason,
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}


def info_error(code: str, message: str) -> dict[str, Any]:
    return {STATUS: ERROR, "error_code": code, "error_message": message[:1000]}


def parse_info(raw: dict) -> dict[str, Any]:
    """The job-info hash as typed values (ints, floats or None, tenant None when empty)."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        k, v = as_str(k), as_str(v)
        if k in _INT_FIELDS:
            out[k] = int(v or 0)
        elif k in _TIME_FIELDS:
            out[k] = float(v) if v else None
        elif k == "tenant":
            out[k] = v or None
        else:
            out[k] = v
    return out


def mark_running(p, job_id: str, fields: dict, ttl: int) -> None:
    """Running jobs keep their keys for ``ttl`` (the live-job TTL)."""
    p.hset(keys.job_info(job_id), mapping=fields)
    p.expire(keys.reply(job_id), ttl)
    p.expire(keys.job_info(job_id), ttl)


def close_job(p, job_id: str, fields: dict, ttl_after_done: int, now: Optional[float] = None) -> None:
    """Final status; the job's keys expire ``ttl_after_done`` seconds from now."""
    p.hset(keys.job_info(job_id), mapping={**fields, "finished_at": repr(time.time() if now is None else now)})
    p.expire(keys.job_info(job_id), ttl_after_done)
    p.expire(keys.reply(job_id), ttl_after_done)
    p.delete(keys.cancel(job_id))


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ entry. ``job`` is the payload exactly as it was on the job stream;
    ``job_id`` may be empty for an unparseable payload."""

    job: Any
    job_id: str
    entry_id: str
    code: str
    reason: str
    attempts: int
    worker: str
    failed_at: float

    def to_fields(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(job_id=self.job_id or "", attempts=str(self.attempts), failed_at=repr(self.failed_at))
        return d

    @classmethod
    def from_fields(cls, fields: dict) -> "DeadLetter":
        f = {as_str(k): as_str(v) for k, v in fields.items()}
        return cls(job=f.get("job", ""), job_id=f.get("job_id", ""), entry_id=f.get("entry_id", ""),
                   code=f.get("code", ""), reason=f.get("reason", ""), attempts=int(f.get("attempts") or 0),
                   worker=f.get("worker", ""), failed_at=float(f.get("failed_at") or 0.0))


def fail_job(p, *, model: str, entry_id: str, raw, job_id: Optional[str], attempt: int, seq: int, code: str,
             message: str, worker: str, ttl_after_done: int, reply_maxlen: int,
             deliveries: Optional[int] = None) -> None:
    """A job that will never finish: ``error`` event of ``attempt`` and final status
    (when its id is known), DLQ copy (``deliveries`` attempts, default ``attempt``),
    then ack + delete of the job entry. Run it in one MULTI so a crash loses nothing."""
    if job_id:
        ev = ErrorEvent(attempt=attempt, seq=seq, code=code, message=message)
        p.xadd(keys.reply(job_id), encode_event(ev), maxlen=reply_maxlen, approximate=True)
        close_job(p, job_id, info_error(code, message), ttl_after_done)
    dead = DeadLetter(job=raw, job_id=job_id or "", entry_id=entry_id, code=code, reason=message,
                      attempts=attempt if deliveries is None else deliveries, worker=worker,
                      failed_at=time.time())
    p.xadd(keys.dlq(model), dead.to_fields())
    p.xack(keys.jobs(model), keys.JOBS_GROUP, entry_id)
    p.xdel(keys.jobs(model), entry_id)
