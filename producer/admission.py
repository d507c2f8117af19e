"""The admission script: idempotency, backlog bound and rate limit checked and
the job enqueued in one atomic Redis step (see admission.lua)."""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Optional

from inferq.schemas import QueuedEvent, encode_event, keys, records
from inferq.schemas.job import Job, new_job_id
from inferq.schemas.queues import Lane, lane_of
from inferq.schemas.redis_errors import REFUSING_WRITES, UNAVAILABLE, is_cluster_client
from inferq.schemas.text import as_str

import redis.exceptions

from inferq.producer import affinity
from inferq.producer.errors import QueueFull, QueueUnavailable, RateLimited
from inferq.producer.settings import ProducerSettings

ADMISSION_LUA = resources.files("inferq.producer").joinpath("admission.lua").read_text(encoding="utf-8")


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


def lane_for(job: Job, s: ProducerSettings, owner: str = "") -> Lane:
    """The stream a job waits on: its id's partition, its priority class, (with
    fair share on) its tenant's own lane, and the worker its session prefers."""
    tenant = job.tenant if (s.fair_share and job.tenant) else ""
    return lane_of(job.model, job.id, job.priority_class, tenant, owner)


def seeded(job: Job) -> Job:
    """A sampled job carries a seed from admission on (drawn here when the client
    gave none): every attempt of it draws the same tokens, so a redelivered job
    continues or regenerates exactly what its stream already showed."""
    s = job.sampling
    if s.seed is not None or s.greedy or job.task != "generate":
        return job
    return job.model_copy(update={"sampling": s.model_copy(update={"seed": secrets.randbits(63)})})


def aligned(job: Job, idempotency_key: Optional[str]) -> Job:
    """With several partitions, a keyed job whose id we generate gets an id in
    the key's partition, so every retry of that key meets the same idempotency
    record (which lives in the job's partition). An id the caller chose is kept:
    retries that reuse it meet the record too."""
    if not idempotency_key or keys.partitions() == 1 or "id" in job.model_fields_set:
        return job
    want = keys.partition_of(_idempotency_scope(job, idempotency_key))
    while True:
        jid = new_job_id()
        if keys.partition_of(jid) == want:
            return job.model_copy(update={"id": jid})


def script_keys(job: Job, idempotency_key: Optional[str], lane: Lane) -> list[str]:
    # Unused keys still need a name: a script must declare every key it may touch.
    return [
        lane.stream,
        keys.reply(job.id),
        keys.job_info(job.id),
        idempotency_key_name(job, idempotency_key),
        keys.rate(job.tenant or "-", lane.partition),
        keys.cancel(job.id),
        keys.lanes(job.model, lane.partition),
    ]


def _idempotency_scope(job: Job, key: str) -> str:
    """Scoped by tenant, encoded so no (tenant, key) pair can spell another's:
    the tenant's length is part of the name, and callers without a tenant have
    their own prefix (an unrestricted "t5:acme:x" is not tenant acme's "x")."""
    return (f"t{len(job.tenant)}:{job.tenant}:" if job.tenant else "u:") + key


def idempotency_key_name(job: Job, key: Optional[str]) -> str:
    """The idempotency record, in the job's partition (see ``aligned``)."""
    return keys.idempotency(job.model, _idempotency_scope(job, key) if key else "-", keys.partition_of(job.id))


def _counted(fields: dict) -> list:
    flat = [x for kv in fields.items() for x in kv]
    return [len(flat), *flat]


def script_args(job: Job, idempotency_key: Optional[str], s: ProducerSettings, lane: Lane,
                reset: bool = False) -> list:
    queued = encode_event(QueuedEvent(attempt=0, seq=0, model=job.model))
    info = records.info_queued(job.model, job.tenant, job.created_at, job.deadline, job.sampling.seed)
    # Each partition keeps its own bucket (one slot per script), with its share of the rate.
    n = keys.partitions()
    rate = s.rate_limit / n if job.tenant else 0.0
    burst = max(1, -(-(s.rate_burst or max(1, int(s.rate_limit))) // n))
    return [
        job.id,
        s.max_backlog,
        s.live_ttl,
        s.idempotency_ttl,
        repr(float(rate)),
        burst,
        s.reply_maxlen,
        "1" if idempotency_key else "0",
        records.ENTRY_ID,
        "1" if reset else "0",
        "" if lane.is_default else lane.member(),
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
    lane = lane_for(job, s, affinity.preferred_worker(r, job))
    kw = dict(keys=script_keys(job, idempotency_key, lane), args=script_args(job, idempotency_key, s, lane, reset))
    if not s.admission_replicas:
        return interpret(script(**kw), job, s)
    pinned = _pinned(r, lane.stream)  # one connection for the script and its WAIT
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


def _pinned(r, key: str):
    """A client on one connection: to the node that owns ``key`` on a Cluster."""
    if is_cluster_client(r):
        return r.get_redis_connection(r.get_node_from_key(key)).client()
    return r.client()


async def _acluster_run_and_wait(r, job: Job, kw: dict, s: ProducerSettings) -> Admitted:
    """Async Cluster: the script and its WAIT on one connection of the node that
    owns the job's slot (the asyncio cluster client has no pinned clients)."""
    await r.initialize()  # the slot map (a no-op once loaded)
    node = r.get_node_from_key(kw["keys"][0])
    conn = node.acquire_connection()
    try:
        await conn.send_command("EVAL", ADMISSION_LUA, len(kw["keys"]), *kw["keys"], *kw["args"])
        adm = interpret(await conn.read_response(), job, s)
        if adm.duplicate:
            return adm
        adm.replicas_wanted = s.admission_replicas
        try:
            await conn.send_command("WAIT", s.admission_replicas, s.admission_wait_ms)
            adm.replicas, why = int(await conn.read_response()), "timeout"
        except _WAIT_LOST as e:
            adm.replicas, why = 0, f"WAIT failed: {e}"
        if not adm.replicated:
            _unreplicated(adm, s, why)
        return adm
    finally:
        node.release(conn)


async def _arun_script(r, script, job: Job, idempotency_key: Optional[str], s: ProducerSettings) -> Admitted:
    lane = lane_for(job, s, await affinity.apreferred_worker(r, job))
    kw = dict(keys=script_keys(job, idempotency_key, lane), args=script_args(job, idempotency_key, s, lane))
    if not s.admission_replicas:
        return interpret(await script(**kw), job, s)
    if is_cluster_client(r):
        return await _acluster_run_and_wait(r, job, kw, s)
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
    job = affinity.with_session(aligned(seeded(job), idempotency_key), s)
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
    job = affinity.with_session(aligned(seeded(job), idempotency_key), s)
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
