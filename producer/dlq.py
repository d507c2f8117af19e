"""The dead-letter queue as operators act on it: read a page, requeue one entry,
delete one entry. Shared by `inferq dlq` and the gateway's dashboard.

A model has one DLQ stream per partition (keys.dlq). Requeueing goes through
admission (the one Lua script: backlog bound, fenced replacement of the old
records, ``reset``), so a refusal leaves the dead letter and records intact;
only after admission took the job is the entry deleted.
"""
from __future__ import annotations

from typing import Optional

from inferq.schemas import Job, keys
from inferq.schemas.records import DeadLetter
from inferq.schemas.text import as_str
from inferq.producer.errors import InferqError


class NotRequeued(Exception):
    """Why one DLQ entry could not be run again (a message an operator can act on)."""


def streams(model: str) -> list[str]:
    """A model's dead-letter streams: one per partition (each beside its jobs' slot)."""
    return [keys.dlq(model, part) for part in range(keys.partitions())]


def page(r, model: str, count: int, after: Optional[tuple[int, Optional[str]]] = None) -> tuple[list[dict], Optional[list]]:
    """Up to ``count`` dead letters oldest first, partition by partition, after
    the cursor ``(partition, entry id)``; returns (rows, next cursor or None).
    Each row is the entry's fields as strings plus ``dlq_id`` and ``partition``.
    Bounded: at most ``count`` + 1 entries are read per partition visited."""
    rows: list[dict] = []
    start_part, start_id = after if after else (0, None)
    for part in range(start_part, keys.partitions()):
        lo = f"({start_id}" if part == start_part and start_id else "-"
        need = count - len(rows)
        got = r.xrange(keys.dlq(model, part), min=lo, max="+", count=need + 1)
        for eid, f in got[:need]:
            rows.append({"dlq_id": as_str(eid), "partition": part, **DeadLetter.from_fields(f).to_fields()})
        if len(got) > need:  # more on this partition
            return rows, [part, rows[-1]["dlq_id"]]
        if len(rows) == count:  # full: go on with the next partition, if any
            return rows, ([part + 1, None] if part + 1 < keys.partitions() else None)
    return rows, None


def entry(r, model: str, partition: int, dlq_id: str) -> Optional[DeadLetter]:
    got = r.xrange(keys.dlq(model, partition), min=dlq_id, max=dlq_id)
    return DeadLetter.from_fields(got[0][1]) if got else None


def requeue(r, script, settings, stream: str, dlq_id: str, fields: dict) -> str:
    """Run one dead letter again under its job id (a fresh reply stream, so
    clients polling the job see it queued again); returns the job id or raises
    NotRequeued with the reason."""
    from inferq.producer.admission import admit

    payload = fields.get("job", "")
    if '"redacted": true' in payload:
        raise NotRequeued("its payload was redacted (INFERQ_DLQ_PAYLOAD=redact), so it cannot be run again")
    try:
        job = Job.model_validate_json(payload)
    except Exception as e:
        raise NotRequeued(f"the payload is not a valid job ({str(e)[:200]})") from None
    try:
        admit(r, script, job, None, settings, reset=True)
    except InferqError as e:
        raise NotRequeued(str(e)) from None
    r.xdel(stream, dlq_id)
    return job.id


def delete(r, model: str, partition: int, dlq_id: str) -> bool:
    return bool(r.xdel(keys.dlq(model, partition), dlq_id))
