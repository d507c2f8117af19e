"""Completion records of batches.

A batch's record lives in its own slot (``keys.batch``), apart from the
partition's completion-events stream, so the two cannot change in one step.
Instead the status script marks the batch ``event_pending`` (the time) in the
same step as its final status (batch_store.py); ``record`` then adds the record
and clears the mark, and the dispatcher's sweep re-adds the record of any batch
still marked a while later (its gateway died in between). A record added twice
carries the same event id, so receivers see a duplicate, never a loss.
"""
from __future__ import annotations

import time

from inferq.schemas import keys
from inferq.schemas.completion_events import batch_record
from inferq.schemas.text import as_str

PENDING = "event_pending"

# Add the record only while the stream exists (a dispatcher's group made it), as the job scripts do.
_ADD = """
if redis.call("EXISTS", KEYS[1]) == 1 then
  redis.call("XADD", KEYS[1], "*", unpack(ARGV))
  return 1
end
return 0
"""


async def record(redis, batch_id: str) -> None:
    """Add the completion record of a batch marked ``event_pending`` and clear the mark."""
    status, tenant, pending = (as_str(x) if x is not None else None
                               for x in await redis.hmget(keys.batch(batch_id), "status", "tenant", PENDING))
    if not pending or not status:  # the mark is set only with a final status
        return
    rec = batch_record(batch_id, tenant, status)
    stream = keys.completion_events(keys.job_tag(batch_id))
    await redis.eval(_ADD, 1, stream, *[x for kv in rec.items() for x in kv])
    await redis.hdel(keys.batch(batch_id), PENDING)


async def sweep(redis, older_than_s: float = 30.0) -> int:
    """Re-add the records of batches whose mark outlived the gateway that set it."""
    n = 0
    cutoff = time.time() - older_than_s
    for raw in await redis.zrange(keys.batches(), 0, -1):
        batch_id = as_str(raw)
        pending = await redis.hget(keys.batch(batch_id), PENDING)
        if pending is not None and float(as_str(pending) or 0) < cutoff:
            await record(redis, batch_id)
            n += 1
    return n
