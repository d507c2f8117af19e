"""The Redis records of a job besides its streams, each with one writer and one reader.

- job-info hash ``inferq:job:{id}``: status, model, tenant, attempt, timestamps,
  usage or error. Admission creates it (its fields come from ``info_queued``;
  the Lua script adds ``entry_id``); after that only the fenced scripts of
  ``inferq.schemas.transitions`` change it (attempt, ``info_running``, ``info_done``,
  ``info_error``); ``parse_info`` reads it.
- DLQ entry on ``inferq:dlq:{model}``: ``DeadLetter``; ``transitions.fail``
  writes it, ``DeadLetter.from_fields`` reads it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from inferq.schemas.text import as_str

# Statuses of the job-info hash.
QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINAL_STATUSES = frozenset({DONE, ERROR, CANCELLED})

STATUS = "status"
ATTEMPT = "attempt"  # incremented by the worker at each delivery (HINCRBY)
ENTRY_ID = "entry_id"  # set by the admission script: the id XADD returned

_INT_FIELDS = ("attempt", "prompt_tokens", "completion_tokens")
_TIME_FIELDS = ("created_at", "started_at", "finished_at", "deadline")


def info_queued(model: str, tenant: Optional[str], created_at: float, deadline: Optional[float],
                seed: Optional[int] = None) -> dict[str, str]:
    return {STATUS: QUEUED, "model": model, "tenant": tenant or "", ATTEMPT: "0",
            "created_at": repr(created_at), "deadline": "" if deadline is None else repr(deadline),
            "seed": "" if seed is None else str(seed)}


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
        elif k == "seed":  # the sampling seed fixed at admission (None for greedy jobs)
            out[k] = int(v) if v else None
        else:
            out[k] = v
    return out


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

    def redacted(self) -> "DeadLetter":
        """The same entry without the payload (prompts can be private and large)."""
        size = len(self.job) if isinstance(self.job, (bytes, str)) else 0
        return DeadLetter(job=f'{{"redacted": true, "bytes": {size}}}', job_id=self.job_id, entry_id=self.entry_id,
                          code=self.code, reason=self.reason, attempts=self.attempts, worker=self.worker,
                          failed_at=self.failed_at)

    @classmethod
    def from_fields(cls, fields: dict) -> "DeadLetter":
        f = {as_str(k): as_str(v) for k, v in fields.items()}
        return cls(job=f.get("job", ""), job_id=f.get("job_id", ""), entry_id=f.get("entry_id", ""),
                   code=f.get("code", ""), reason=f.get("reason", ""), attempts=int(f.get("attempts") or 0),
                   worker=f.get("worker", ""), failed_at=float(f.get("failed_at") or 0.0))
