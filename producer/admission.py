"""The admission script: idempotency, backlog bound and rate limit checked and
the job enqueued in one atomic Redis step (see admission.lua)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from typing import Optional

from schemas import QueuedEvent, encode_event, keys, records
from schemas.job import Job
from schemas.redis_errors import REFUSING_WRITES, UNAVAILABLE
from schemas.text import as_str

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
    # For a duplicate: the earlier job's current status (queued, running, done, ...).
    status: str = records.QUEUED
    # With INFERQ_ADMISSION_REPLICAS > 0: how many replicas acknowledged the
    # admission write (WAIT) before we returned; None when WAIT is off or for a
    # duplicate (nothing new was written).
    replicas: Optional[int] = None
    replicas_wanted: int = 0

    @property
    def replicated(self) -> bool:
        """False only when WAIT was asked for and fewer replicas acknowledged:
        the job is accepted, but a failover right now could lose it."""
        return self.replicas is None or self.replicas >= self.replicas_wanted


def script_keys(job: Job, idempotency_key: Optional[str]) -> list[str]:
    # Unused keys still need a name: a script must declare every key it may touch.
    return [
        keys.jobs(job.model),
        keys.reply(job.id),
        keys.job_info(job.id),
        idempotency_key_name(job, idempotency_key),
        keys.rate(job.tenant or "-"),
        keys.cancel(job.id),
    ]


def idempotency_key_name(job: Job, key: Optional[str]) -> str:
    """Scoped by tenant, encoded so no (tenant, key) pair can spell another's:
    the tenant's length is part of the name, and callers without a tenant have
    their own prefix (an unrestricted "t5:acme:x" is not tenant acme's "x")."""
    if not key:
        return keys.idempotency(job.model, "-")
    scope = f"t{len(job.tenant)}:{job.tenant}:" if job.tenant else "u:"
    return keys.idempotency(job.model, scope + key)


def _counted(fields: dict) -> list:
    flat = [x for kv in fields.items() for x in kv]
    return [len(flat), *flat]


def script_args(job: Job, idempotency_key: Optional[str], s: ProducerSettings, reset: bool = False) -> list:
    queued = encode_event(QueuedEvent(attempt=0, seq=0, model=job.model))
    info = records.info_queued(job.model, job.tenant, job.created_at, job.deadline)
    rate = s.rate_limit if job.tenant else 0.0
    return [
        job.id,
        s.max_backlog,
        s.live_ttl,
        s.idempotency_ttl,
        repr(float(rate)),
        s.rate_burst or max(1, int(rate)),
        s.reply_maxlen,
        "1" if idempotency_key else "0",
        records.ENTRY_ID,
        "1" if reset else "0",
        *_counted(job.to_fields()),
        *_counted(queued),
        *_counted(info),
    ]


# Redis up but not writing (OOM under noeviction, a read-only replica; the
# shared REFUSING_WRITES): the job was not enqueued, which the caller hears as a
# full queue, not as a crash.


def refused(job: Job, e: Exception) -> QueueUnavailable:
    return QueueUnavailable(job.model, "out of memory" if isinstance(e, redis.exceptions.OutOfMemoryError)
                            else "read-only replica")


# Forget an idempotency key only while it still names the job we found gone.
_FORGET_KEY = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"""


log = logging.getLogger("inferq.admission")

# WAIT itself failing (the master died right after the script ran) says nothing
# about the job: it is returned as accepted, with no replica confirmed.
_WAIT_LOST = UNAVAILABLE


def _unreplicated(adm: Admitted, s: ProducerSettings, why: str) -> None:
    log.warning("job %s accepted but only %s of %s replicas acknowledged it within %s ms (%s): a failover now "
                "could lose it", adm.job_id, adm.replicas, s.admission_replicas, s.admission_wait_ms, why)


def _run_script(r, script, job: Job, idempotency_key: Optional[str], s: ProducerSettings, reset: bool) -> Admitted:
    """The admission script, then (with INFERQ_ADMISSION_REPLICAS) WAIT on the
    same connection: WAIT counts the replicas that have this connection's writes."""
    kw = dict(keys=script_keys(job, idempotency_key), args=script_args(job, idempotency_key, s, reset))
    if not s.admission_replicas:
        return interpret(script(**kw), job, s)
    pinned = r.client()  # one connection for the script and its WAIT
    try:
        adm = interpret(script(client=pinned, **kw), job, s)
        if adm.duplicate:
            return adm
        adm.replicas_wanted = s.admission_replicas
        try:
            adm.replicas = int(pinned.wait(s.admission_replicas, s.admission_wait_ms))
            why = "timeout"
        except _WAIT_LOST as e:
            adm.replicas, why = 0, f"WAIT failed: {e}"
        if not adm.replicated:
            _unreplicated(adm, s, why)
        return adm
    finally:
        pinned.close()


async def _arun_script(r, script, job: Job, idempotency_key: Optional[str], s: ProducerSettings) -> Admitted:
    kw = dict(keys=script_keys(job, idempotency_key), args=script_args(job, idempotency_key, s))
    if not s.admission_replicas:
        return interpret(await script(**kw), job, s)
    pinned = r.client()
    try:
        adm = interpret(await script(client=pinned, **kw), job, s)
        if adm.duplicate:
            return adm
        adm.replicas_wanted = s.admission_replicas
        try:
            adm.replicas = int(await pinned.wait(s.admission_replicas, s.admission_wait_ms))
            why = "timeout"
        except _WAIT_LOST as e:
            adm.replicas, why = 0, f"WAIT failed: {e}"
        if not adm.replicated:
            _unreplicated(adm, s, why)
        return adm
    finally:
        await pinned.aclose()


def admit(r, script, job: Job, idempotency_key: Optional[str], s: ProducerSettings, reset: bool = False) -> Admitted:
    """Admission as every producer runs it (sync): the script, then for a
    duplicate the earlier job's real status. A key that outlived its job's
    records (they expired) is forgotten and the job admitted anew."""
    for _ in range(2):
        try:
            adm = _run_script(r, script, job, idempotency_key, s, reset)
        except REFUSING_WRITES as e:
            raise refused(job, e) from None
        if not adm.duplicate:
            return adm
        status = r.hget(keys.job_info(adm.job_id), records.STATUS)
        if status is not None:
            adm.status = as_str(status)
            return adm
        r.eval(_FORGET_KEY, 1, idempotency_key_name(job, idempotency_key), adm.job_id)
    return adm


async def aadmit(r, script, job: Job, idempotency_key: Optional[str], s: ProducerSettings) -> Admitted:
    """Async twin of ``admit`` (redis.asyncio client and script)."""
    for _ in range(2):
        try:
            adm = await _arun_script(r, script, job, idempotency_key, s)
        except REFUSING_WRITES as e:
            raise refused(job, e) from None
        if not adm.duplicate:
            return adm
        status = await r.hget(keys.job_info(adm.job_id), records.STATUS)
        if status is not None:
            adm.status = as_str(status)
            return adm
        await r.eval(_FORGET_KEY, 1, idempotency_key_name(job, idempotency_key), adm.job_id)
    return adm


def interpret(reply: list, job: Job, s: ProducerSettings) -> Admitted:
    """Turn the script's reply into an Admitted or the matching error."""
    status = as_str(reply[0])
    if status == "ok":
        return Admitted(job.id, as_str(reply[1]), int(as_str(reply[2])), duplicate=False)
    if status == "dup":
        return Admitted(as_str(reply[1]), None, None, duplicate=True)
    if status == "full":
        raise QueueFull(job.model, int(as_str(reply[1])), s.max_backlog)
    if status == "rate":
        raise RateLimited(job.tenant or "", float(as_str(reply[1])))
    raise RuntimeError(f"unexpected admission reply: {reply!r}")
