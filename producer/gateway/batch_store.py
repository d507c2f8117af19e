"""Batch records in Redis: the OpenAI batch object, its job map and the driver lease.

``inferq:batch:{id}`` (hash) holds every field of the batch object plus its
tenant; ``inferq:batch:{id}:jobs`` maps custom_id -> job id of each enqueued
line; ``inferq:batches`` (sorted set by creation time) lists batches. Status
changes go through one script that checks the current status, so a cancel and
the driver's own transitions never overwrite each other.
"""
from __future__ import annotations

import json
import secrets
import time
from typing import Optional

from inferq.schemas import keys
from inferq.schemas.text import as_str
from inferq.producer.gateway.webhooks import batch_events

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("completed", "failed", "expired", "cancelled")
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
          "cancelling_at", "cancelled_at")
_COUNTS = ("total", "completed", "failed")

# KEYS[1] batch hash. ARGV: allowed current statuses (comma-separated), new status, then field/value pairs.
# Returns the status before (the change happened only if it was among the allowed), or false if no batch.
_TRANSITION = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return false end
for s in string.gmatch(ARGV[1], '[^,]+') do
  if s == cur then
    redis.call('HSET', KEYS[1], 'status', ARGV[2], unpack(ARGV, 3))
    return cur
  end
end
return cur
"""


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


class BatchStore:
    def __init__(self, redis):
        self.redis = redis
        self._transition = redis.register_script(_TRANSITION)

    async def create(self, batch_id: str, *, endpoint: str, input_file_id: str, completion_window: str,
                     metadata: Optional[dict], tenant: Optional[str], expires_in_s: float) -> dict:
        now = int(time.time())
        fields = {"id": batch_id, "endpoint": endpoint, "input_file_id": input_file_id,
                  "completion_window": completion_window, "status": "validating", "created_at": now,
                  "expires_at": int(now + expires_in_s), "metadata": json.dumps(metadata),
                  "tenant": tenant or "", "total": 0, "completed": 0, "failed": 0}
        # The record first, then the listing: two slots on a Cluster, so no MULTI;
        # a batch is listed (and so resumed) only once its record exists.
        await self.redis.hset(keys.batch(batch_id), mapping=fields)
        await self.redis.zadd(keys.batches(), {batch_id: now})
        return await self.get(batch_id)

    async def get(self, batch_id: str) -> Optional[dict]:
        raw = await self.redis.hgetall(keys.batch(batch_id))
        if not raw:
            return None
        return {as_str(k): as_str(v) for k, v in raw.items()}

    async def update(self, batch_id: str, **fields) -> None:
        await self.redis.hset(keys.batch(batch_id), mapping={k: _enc(v) for k, v in fields.items()})

    async def transition(self, batch_id: str, allowed: tuple[str, ...], new: str, **fields) -> Optional[str]:
        """Move to ``new`` (setting ``<new>_at`` and ``fields``) if the status is in ``allowed``;
        returns the status found (so the caller knows whether it moved)."""
        fields.setdefault(f"{new}_at", int(time.time()))
        if new in FINAL:  # marked in the same step; the webhook record follows (webhooks/batch_events.py)
            fields[batch_events.PENDING] = repr(time.time())
        flat = [x for k, v in fields.items() for x in (k, _enc(v))]
        cur = await self._transition(keys=[keys.batch(batch_id)], args=[",".join(allowed), new, *flat])
        cur = as_str(cur) if cur else None
        if new in FINAL and cur in allowed:
            await batch_events.record(self.redis, batch_id)
        return cur

    # -- the lines' jobs ------------------------------------------------------
    async def job_map(self, batch_id: str) -> dict[str, str]:
        raw = await self.redis.hgetall(keys.batch_jobs(batch_id))
        return {as_str(k): as_str(v) for k, v in raw.items()}

    async def record_job(self, batch_id: str, custom_id: str, job_id: str) -> None:
        await self.redis.hset(keys.batch_jobs(batch_id), custom_id, job_id)

    # -- listing, leases, retention --------------------------------------------
    async def ids(self, newest_first: bool = True) -> list[str]:
        raw = await (self.redis.zrevrange if newest_first else self.redis.zrange)(keys.batches(), 0, -1)
        return [as_str(x) for x in raw]

    async def acquire(self, batch_id: str, owner: str, ttl_s: int) -> bool:
        """Take or renew the driver lease (only the one process driving a batch holds it)."""
        key = keys.batch_lease(batch_id)
        if await self.redis.set(key, owner, nx=True, ex=ttl_s):
            return True
        if as_str(await self.redis.get(key) or b"") == owner:
            await self.redis.expire(key, ttl_s)
            return True
        return False

    async def release(self, batch_id: str, owner: str) -> None:
        key = keys.batch_lease(batch_id)
        if as_str(await self.redis.get(key) or b"") == owner:
            await self.redis.delete(key)

    async def delete(self, batch_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in (keys.batch(batch_id), keys.batch_jobs(batch_id), keys.batch_lease(batch_id)):
            pipe.delete(key)  # one key per command: a Cluster pipeline refuses multi-key DEL
        pipe.zrem(keys.batches(), batch_id)
        await pipe.execute()


def _enc(v) -> str:
    if isinstance(v, (dict, list)) or v is None:
        return json.dumps(v)
    return str(v)


def _int(v) -> Optional[int]:
    return int(v) if v not in (None, "", "None", "null") else None


def batch_object(rec: dict) -> dict:
    """The OpenAI batch object from a stored record."""
    def js(name):
        raw = rec.get(name)
        return json.loads(raw) if raw not in (None, "") else None

    obj = {"id": rec["id"], "object": "batch", "endpoint": rec["endpoint"], "errors": js("errors"),
           "input_file_id": rec["input_file_id"], "completion_window": rec["completion_window"],
           "status": rec["status"], "output_file_id": rec.get("output_file_id") or None,
           "error_file_id": rec.get("error_file_id") or None}
    for t in _TIMES:
        obj[t] = _int(rec.get(t))
    obj["request_counts"] = {c: int(rec.get(c) or 0) for c in _COUNTS}
    obj["metadata"] = js("metadata")
    return obj
