"""The admission script: idempotency, backlog bound and rate limit checked and
the job enqueued in one atomic Redis step (see admission.lua)."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Optional

from schemas import QueuedEvent, encode_event, keys
from schemas.job import Job

import redis.exceptions

from producer.errors import QueueFull, QueueUnavailable, RateLimited
from producer.settings import ProducerSettings

ADMISSION_LUA = resources.files("producer").joinpath("admission.lua").read_text(encoding="utf-8")


@dataclass
class Admitted:
    job_id: str
    entry_id: Optional[str]  # None when an idempotency key matched an earlier job
    depth: Optional[int]
    duplicate: bool


def script_keys(job: Job, idempotency_key: Optional[str]) -> list[str]:
    # Unused keys still need a name: a script must declare every key it may touch.
    return [
        keys.jobs(job.model),
        keys.reply(job.id),
        keys.job_info(job.id),
        # Scoped by tenant: one tenant's key must never return another tenant's job.
        keys.idempotency(job.model, f"tenant={job.tenant}/{idempotency_key}" if idempotency_key and job.tenant
                         else idempotency_key or "-"),
        keys.rate(job.tenant or "-"),
    ]


def script_args(job: Job, idempotency_key: Optional[str], s: ProducerSettings) -> list:
    queued = encode_event(QueuedEvent(attempt=0, seq=0, model=job.model))["data"]
    rate = s.rate_limit if job.tenant else 0.0
    return [
        job.id,
        job.model_dump_json(exclude_none=True),
        s.max_backlog,
        s.reply_ttl,
        queued,
        s.idempotency_ttl,
        repr(float(rate)),
        s.rate_burst or max(1, int(rate)),
        job.model,
        job.tenant or "",
        repr(job.created_at),
        s.reply_maxlen,
        "1" if idempotency_key else "0",
        "" if job.deadline is None else repr(job.deadline),
    ]


# Redis up but not writing (OOM under noeviction, a read-only replica): the job
# was not enqueued, which the caller hears as a full queue, not as a crash.
REFUSING_WRITES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


def refused(job: Job, e: Exception) -> QueueUnavailable:
    return QueueUnavailable(job.model, "out of memory" if isinstance(e, redis.exceptions.OutOfMemoryError)
                            else "read-only replica")


def _s(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def interpret(reply: list, job: Job, s: ProducerSettings) -> Admitted:
    """Turn the script's reply into an Admitted or the matching error."""
    status = _s(reply[0])
    if status == "ok":
        return Admitted(job.id, _s(reply[1]), int(_s(reply[2])), duplicate=False)
    if status == "dup":
        return Admitted(_s(reply[1]), None, None, duplicate=True)
    if status == "full":
        raise QueueFull(job.model, int(_s(reply[1])), s.max_backlog)
    if status == "rate":
        raise RateLimited(job.tenant or "", float(_s(reply[1])))
    raise RuntimeError(f"unexpected admission reply: {reply!r}")
