"""A job's state changes, each one fenced Lua script (see schemas/lua).

The caller names who it is (consumer) and, once it has one, the attempt it
holds; the script refuses unless the group's pending list still gives the
entry to that consumer and the job record still names that attempt. So a
worker that lost its lease (a partition, a long stall, a duplicate worker id)
can never ack, finish, dead-letter or publish a final event for the attempt
another worker now runs.

The writers take a redis-py pipeline or the worker's recorded Batch and
return the index of their result in it: 1 done, 0 refused, 2 already done by
this very caller (a pipeline re-sent after a dropped connection).
``claim_attempt`` answers [attempt, cancelled] or [-1, 0].
"""
from __future__ import annotations

from typing import Any, Optional

from inferq.schemas import keys
from inferq.schemas.lua import source
from inferq.schemas.records import DeadLetter

DONE, REFUSED, ALREADY_DONE = 1, 0, 2


def _flat(pairs: dict[str, Any]) -> list:
    out: list = [len(pairs)]
    for k, v in pairs.items():
        out += [k, v]
    return out


def _run(p, name: str, keys_: list[str], args: list):
    return p.eval(source(name), len(keys_), *keys_, *args)


def _job_keys(stream: str, job_id: Optional[str]) -> list[str]:
    # A script must declare every key it may touch, used or not; all of them in
    # the stream's partition, so the script runs on one cluster slot (the intake
    # refuses a job whose id belongs to another partition, see ``in_partition``).
    jid, tag = job_id or "-", keys.tag_of(stream)
    return [stream, keys.job_info(jid, tag), keys.reply(jid, tag), keys.cancel(jid, tag)]


def in_partition(stream: str, job_id: str) -> bool:
    """Whether a job's keys live in the slot of the stream its entry is on."""
    return keys.job_tag(job_id) == keys.tag_of(stream)


def claim_attempt(p, *, stream: str, entry_id: str, consumer: str, job_id: str, live_ttl: int):
    """Start a new attempt of an entry this consumer holds: [attempt, cancelled]."""
    stream, info, _, cancel = _job_keys(stream, job_id)
    return _run(p, "claim_attempt", [stream, info, cancel], [keys.JOBS_GROUP, entry_id, consumer, live_ttl])


def start(p, *, stream: str, entry_id: str, consumer: str, attempt: int, job_id: str,
          events: list[dict[str, str]], fields: dict[str, Any], live_ttl: int, reply_maxlen: int):
    """The attempt's first events (``encode_event`` dicts) and its running status."""
    stream, info, reply, _ = _job_keys(stream, job_id)
    flat_events: list = [len(events)]
    for ev in events:
        flat_events += [ev["type"], ev["data"]]
    return _run(p, "start", [stream, info, reply],
                [keys.JOBS_GROUP, entry_id, consumer, attempt, live_ttl, reply_maxlen, *flat_events, *_flat(fields)])


def finish(p, *, stream: str, entry_id: str, consumer: str, attempt: int, job_id: str, event: dict[str, str],
           fields: dict[str, Any], ttl_after_done: int, reply_maxlen: int,
           completion: Optional[dict[str, str]] = None):
    """The final ``done`` event and status, the job's completion record
    (``completion_events.job_record``, for webhooks), then ack + delete of the entry."""
    return _run(p, "finish", [*_job_keys(stream, job_id), keys.completion_events(keys.tag_of(stream))],
                [keys.JOBS_GROUP, entry_id, consumer, attempt, ttl_after_done, reply_maxlen,
                 event["type"], event["data"], *_flat(fields), *_flat(completion or {})])


def fail(p, *, stream: str, dlq: str, entry_id: str, consumer: str, attempt: int, job_id: Optional[str],
         error_data: str, fields: dict[str, Any], dead: DeadLetter, dlq_maxlen: int, ttl_after_done: int,
         reply_maxlen: int, completion: Optional[dict[str, str]] = None):
    """``error`` event and status (when ``job_id`` is known and ``error_data`` given),
    the job's completion record (likewise), the dead letter, then ack + delete.
    ``attempt`` 0: the caller holds no attempt yet (an unreadable payload), so
    only its ownership of the entry is checked."""
    return _run(p, "fail", [*_job_keys(stream, job_id), dlq, keys.completion_events(keys.tag_of(stream))],
                [keys.JOBS_GROUP, entry_id, consumer, attempt, ttl_after_done, reply_maxlen,
                 error_data if job_id else "", dlq_maxlen, *_flat(fields if job_id else {}),
                 *_flat(dead.to_fields()), *_flat((completion or {}) if job_id else {})])


def request_cancel(r, *, job_id: str, ttl: int):
    """Set the job's cancel flag unless it already ended: 1 set, 0 ended.
    With an asyncio client, await the result."""
    return _run(r, "request_cancel", [keys.job_info(job_id), keys.cancel(job_id)], [ttl])


def renew(r, *, stream: str, consumer: str, entry_ids: list[str]) -> list[str]:
    """Reset the idle time of the entries this consumer still owns; returns the
    ones it lost (another consumer claimed them)."""
    if not entry_ids:
        return []
    lost = _run(r, "renew", [stream], [keys.JOBS_GROUP, consumer, *entry_ids])
    return [x.decode() if isinstance(x, bytes) else str(x) for x in lost]


def hand_back(r, *, stream: str, consumer: str, entry_ids: list[str], idle_ms: int) -> int:
    """Mark the entries this consumer still owns idle past the reapers' threshold."""
    if not entry_ids:
        return 0
    return int(_run(r, "handback", [stream], [keys.JOBS_GROUP, consumer, idle_ms, *entry_ids]))
